//! A closed TCP connection's socket is read, and what comes discarded,
//! for a moment after the broker's FIN (a lingering close).
//!
//! The broker often closes right after writing a DISCONNECT (a takeover's
//! 0x8E, a drain's 0x9D with its server reference, a protocol error). A
//! client that has not read it yet still writes (a PUBACK, a PINGREQ); if
//! the socket were gone, the kernel would answer that write with a reset,
//! the client's next write would fail, and many clients then report a lost
//! connection without reading the DISCONNECT waiting in their buffer. Read
//! on, the client's writes land, and it reads the DISCONNECT, then the FIN.
//!
//! Bounded three ways: a socket lingers until the client closes, for
//! [`LINGER`] at most, and for [`LINGER_BYTES`] read at most; at most
//! [`MAX_LINGERING`] sockets per thread linger at once (past it a socket
//! closes at once, counted in `zerofan_connection_lingers_skipped_total`).

use super::state::Shared;
use std::cell::Cell;
use std::time::Duration;
use tokio::net::TcpStream;

/// How long a socket may linger: a client reads a DISCONNECT within a
/// round trip or two; one that does not close by then is not waited for.
const LINGER: Duration = Duration::from_secs(2);
/// Bytes read and discarded before the socket closes anyway.
const LINGER_BYTES: usize = 64 * 1024;
/// Sockets lingering at once on one thread (each holds a descriptor).
const MAX_LINGERING: u32 = 1024;

thread_local! {
    static LINGERING: Cell<u32> = const { Cell::new(0) };
}

/// Read `stream` (whose write side is shut down) until its peer closes, or
/// a bound is reached; then close it.
pub(super) fn start(shared: &Shared, stream: TcpStream) {
    if LINGERING.get() >= MAX_LINGERING {
        shared.broker.borrow_mut().metrics_mut().lingers_skipped += 1;
        return;
    }
    LINGERING.set(LINGERING.get() + 1);
    tokio::task::spawn_local(async move {
        let _ = tokio::time::timeout(LINGER, discard(&stream)).await;
        LINGERING.set(LINGERING.get().saturating_sub(1));
    });
}

async fn discard(stream: &TcpStream) {
    let mut buf = [0u8; 512];
    let mut read = 0;
    while read < LINGER_BYTES {
        if stream.readable().await.is_err() {
            return;
        }
        match stream.try_read(&mut buf) {
            Ok(0) => return,
            Ok(n) => read += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}
