//! The packets stay small enough to move cheaply. (Not in `alloc.rs`: its
//! global allocation counter needs that binary's one test to run alone.)

use zerofan_codec::*;

/// Why `Props` exists: a PUBLISH (and so every `Packet`) stays small enough
/// to move cheaply; with `Properties` inline both were over 500 bytes.
#[test]
fn packets_are_small() {
    use std::mem::size_of;
    assert_eq!(size_of::<Props>(), size_of::<usize>());
    assert!(
        size_of::<Publish>() <= 128,
        "Publish is {} bytes",
        size_of::<Publish>()
    );
    assert!(
        size_of::<Packet>() <= 128,
        "Packet is {} bytes",
        size_of::<Packet>()
    );
    assert!(size_of::<Ack>() <= 16, "Ack is {} bytes", size_of::<Ack>());
}
