//! A sound server that stops answering (paused, wedged) must not hang
//! `Capture::stop`: the backend's stream waits for a reply that never
//! comes when it is dropped, so `stop` gives it `STOP_TIMEOUT` and then
//! returns, leaving the capture thread to end on its own.
//!
//! Its own test binary: it points this process's PulseAudio environment at
//! a server of its own, which it pauses with SIGSTOP. Needs what
//! tests/pulse.rs needs (scripts/install-audio-deps.sh).

mod common;

use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::own_pulse;
use zerofan_audio::{
    Capture, CaptureConfig, CaptureEvent, DeviceSelector, EndReason, SampleFormat, STOP_TIMEOUT,
};

/// Sends `signal` to the pulseaudio that listens on `sock`.
fn signal_server(signal: &str, sock: &std::path::Path) {
    let status = Command::new("pkill")
        .args([
            &format!("-{signal}"),
            "-f",
            &format!("socket={}", sock.display()),
        ])
        .status()
        .expect("pkill runs");
    assert!(status.success(), "pkill -{signal}: {status}");
}

#[test]
fn stopping_a_capture_of_a_paused_sound_server_returns() {
    let (sock, (mut server, lifeline)) = own_pulse("pause", "zf_pause");

    let config = CaptureConfig {
        device: DeviceSelector::Named("zf_pause.monitor".into()),
        sample_rate: Some(48_000),
        channels: Some(1),
        format: SampleFormat::I16,
        ..CaptureConfig::default()
    };
    let (events_tx, events) = mpsc::channel();
    let mut capture = Capture::start(config, move |ev| {
        let _ = events_tx.send(ev);
        true
    })
    .expect("start");
    let first = events
        .recv_timeout(Duration::from_secs(20))
        .expect("a first event within 20 s");
    assert!(matches!(first, CaptureEvent::Packet(_)), "{first:?}");

    signal_server("STOP", &sock);
    // The stream asks the server for its timing after each read and at
    // least every few hundred milliseconds: no event says when one such
    // request went out unanswered, so let 2 s pass, taking the last
    // packets meanwhile.
    let quiet = Instant::now();
    while quiet.elapsed() < Duration::from_secs(2) {
        let _ = events.recv_timeout(Duration::from_millis(500));
    }

    let (done_tx, done) = mpsc::channel();
    let stopper = std::thread::spawn(move || {
        let t0 = Instant::now();
        capture.stop();
        let _ = done_tx.send(t0.elapsed());
        capture
    });
    let took = done.recv_timeout(STOP_TIMEOUT + Duration::from_secs(20));
    // Let the server go on before asserting, so that a hung stop ends too.
    signal_server("CONT", &sock);
    let took = took.expect("stop returns while the sound server is paused");
    eprintln!("stop with the server paused took {took:?}");
    let capture = stopper.join().expect("stopper thread");
    assert!(capture.is_ended());
    assert_eq!(capture.end_reason(), Some(EndReason::Stopped));

    drop(lifeline);
    let _ = server.wait();
}
