//! Every sample packet round-trips in every version; `write_fuzz_seeds`
//! (ignored, run on demand) writes them as the fuzz seed corpus.

mod common;

use bytes::BytesMut;
use zerofan_codec::*;

const ALL: [Protocol; 3] = [Protocol::V31, Protocol::V311, Protocol::V5];

#[test]
fn samples_roundtrip() {
    for p in ALL {
        for (name, packet) in common::samples(p) {
            let mut out = BytesMut::new();
            encode(&packet, p, &mut out).unwrap_or_else(|e| panic!("{name} {p:?}: {e}"));
            assert_eq!(out.len(), encoded_len(&packet, p).unwrap());
            assert_eq!(frame(&out, u32::MAX), Frame::Complete(out.len()));
            let back = decode(out.freeze(), p).unwrap_or_else(|e| panic!("{name} {p:?}: {e}"));
            assert_eq!(back, packet, "{name} {p:?}");
        }
    }
}

/// `cargo test -p zerofan-codec --test samples -- --ignored write_fuzz_seeds`
#[test]
#[ignore]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/decode");
    std::fs::create_dir_all(&dir).unwrap();
    for (tag, p) in [
        ("v31", Protocol::V31),
        ("v311", Protocol::V311),
        ("v5", Protocol::V5),
    ] {
        let mut stream = BytesMut::new();
        for (name, packet) in common::samples(p) {
            let mut out = BytesMut::new();
            encode(&packet, p, &mut out).unwrap();
            std::fs::write(dir.join(format!("{tag}-{name}")), &out).unwrap();
            stream.extend_from_slice(&out);
        }
        std::fs::write(dir.join(format!("{tag}-stream")), &stream).unwrap();
    }
}
