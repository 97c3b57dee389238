//! Optional busy polling: for a short window after the last connection
//! activity the thread keeps polling the sockets (epoll with a zero
//! timeout) instead of sleeping, so the next packet of a conversation is
//! picked up without the wake-up of an idle CPU (tens of microseconds on a
//! virtual machine). `busy_poll_us` sets the window (0: off); it costs at
//! most one window of CPU time after each burst and nothing while idle.

use super::state::Shared;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Whether a shard busy-polls at all. One shard always does (when
/// `busy_poll_us` asks for it). Several do only while the machine has more
/// cores than shards: with none to spare, a spinning shard takes CPU time
/// from a sibling that has work. Measured 2026-11-25 on 2 cores, fan-in to
/// one subscriber over 2 shards: 681 ns of broker CPU per delivery with
/// spinning against 608 ns without, at the same rate.
pub(super) fn may_spin(shards: usize) -> bool {
    shards <= 1 || std::thread::available_parallelism().is_ok_and(|n| n.get() > shards)
}

/// Spin for `window` after each connection activity, sleep otherwise.
pub(super) async fn spin_loop(shared: Rc<Shared>, window: Duration) {
    loop {
        // Asleep until a connection's task runs.
        std::future::poll_fn(|cx| {
            if shared.activity.take() {
                Poll::Ready(())
            } else {
                shared.spinner.replace(Some(cx.waker().clone()));
                Poll::Pending
            }
        })
        .await;
        let mut until = Instant::now() + window;
        loop {
            // Deferred by tokio until it has polled the I/O driver without
            // blocking and run whatever that made ready.
            tokio::task::yield_now().await;
            let now = Instant::now();
            if shared.activity.take() {
                until = now + window;
            } else if now >= until {
                break;
            }
        }
    }
}
