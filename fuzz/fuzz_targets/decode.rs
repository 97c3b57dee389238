//! Feed arbitrary bytes through `frame` + `decode` for MQTT 3.1, 3.1.1 and
//! 5.0. Nothing may panic; every packet that decodes must encode again and
//! decode to the same packet.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use zerofan_codec::{decode, encode, encoded_len, frame, Frame, Packet, Protocol};

fn roundtrip(packet: &Packet, protocol: Protocol) {
    let mut out = BytesMut::new();
    let len = encoded_len(packet, protocol).expect("a decoded packet encodes");
    encode(packet, protocol, &mut out).expect("a decoded packet encodes");
    assert_eq!(out.len(), len, "encoded_len agrees with encode");
    let out = out.freeze();
    assert_eq!(frame(&out, u32::MAX), Frame::Complete(out.len()));
    let again = decode(out, protocol).expect("a re-encoded packet decodes");
    assert_eq!(&again, packet, "decode(encode(p)) == p");
}

fuzz_target!(|data: &[u8]| {
    for protocol in [Protocol::V31, Protocol::V311, Protocol::V5] {
        // A stream: frame packet after packet, as a connection would.
        let mut rest = data;
        let max = if data.first().is_some_and(|b| b & 1 == 1) {
            64
        } else {
            u32::MAX
        };
        while let Frame::Complete(n) = frame(rest, max) {
            let (one, tail) = rest.split_at(n);
            if let Ok(packet) = decode(Bytes::copy_from_slice(one), protocol) {
                roundtrip(&packet, protocol);
            }
            rest = tail;
        }
        // The whole input as one frame, whatever its length says.
        let _ = decode(Bytes::copy_from_slice(data), protocol);
    }
});
