//! The sound server going away mid-capture surfaces as events, not a panic
//! or a hang: an `Error` (fatal if cpal notices the dead connection, else
//! the stall watchdog's `Stalled`), and `stop()` still ends the capture.
//!
//! Its own test binary: it points this process's PulseAudio environment at
//! a server of its own, which it then kills. Needs what tests/pulse.rs
//! needs (scripts/install-audio-deps.sh).

mod common;

use std::time::Duration;

use common::own_pulse;
use zerofan_audio::{
    Capture, CaptureConfig, CaptureEvent, DeviceSelector, EndReason, SampleFormat,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_sound_server_is_an_error_event() {
    let (_, (mut server, lifeline)) = own_pulse("loss", "zf_loss");

    let config = CaptureConfig {
        device: DeviceSelector::Named("zf_loss.monitor".into()),
        sample_rate: Some(48_000),
        channels: Some(1),
        format: SampleFormat::I16,
        ..CaptureConfig::default()
    };
    let (mut capture, mut rx) = Capture::start_channel(config, 1024).expect("start");
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("a first event within 20 s");
    assert!(matches!(first, Some(CaptureEvent::Packet(_))), "{first:?}");

    // Closing the wrapper's stdin makes it kill the server.
    drop(lifeline);
    let _ = server.wait();

    let mut error = None;
    let mut ended = None;
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(ev) = rx.recv().await {
            match ev {
                CaptureEvent::Packet(_) => {}
                CaptureEvent::Error(e) => {
                    let fatal = e.fatal;
                    error = Some(e);
                    if !fatal {
                        return; // Stalled: the capture stays up until stopped
                    }
                }
                CaptureEvent::Ended(r) => {
                    ended = Some(r);
                    return;
                }
            }
        }
    })
    .await;
    eprintln!(
        "server loss: error {error:?}, ended {ended:?}, stats {:?}",
        capture.stats()
    );
    let error = error.expect("an error event within 20 s of the server's death");
    if error.fatal {
        assert!(matches!(ended, Some(EndReason::DeviceLost(_))), "{ended:?}");
    } else {
        assert_eq!(error.kind, "Stalled");
    }
    capture.stop();
    assert!(capture.is_ended());
}
