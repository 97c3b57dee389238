//! The `zerofan` broker binary; everything lives in the library.

/// jemalloc rather than the system's malloc: an idle connection's state is a
/// few small allocations made while its handshake's short-lived ones (task,
/// read buffer) come and go. glibc's malloc interleaves the two and keeps
/// the holes, jemalloc keeps size classes apart without per-chunk headers:
/// RSS per idle connection 1,241–1,318 against 1,021–1,024 bytes, and 4–7 %
/// fewer instructions per message (BENCHMARKS.md, "Memory per idle
/// connection"). Only the binary: programs embedding the library choose
/// their own.
///
/// Built with jemalloc's background threads on (the `background_threads`
/// feature): jemalloc returns freed pages to the system only when it next
/// allocates or frees, and a broker whose connections have all parked
/// hardly does, so what a connection storm freed stayed in RSS. At 19,000
/// idle connections settled RSS per connection went from 490–534 to 471–472
/// bytes (2026-11-29, f4c67ec, `bench/scale.sh`'s connections scenario).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    zerofan_broker::cli::main()
}
