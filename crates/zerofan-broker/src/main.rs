//! The `zerofan` broker binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    zerofan_broker::cli::main()
}
