//! Arbitrary bytes as a new connection's stream into the sans-IO broker
//! core, the way the shell feeds it (frame, decode with the connection's
//! protocol, handle), with authentication, an ACL and every limit on. The
//! first byte picks the listener setup (anonymous or not, certificate
//! identity, rate limits). Nothing may panic, everything the core queues
//! for the client must encode, and a PUBLISH sent as received (`Wire`)
//! must be exactly what the encoder would write.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use zerofan_auth::{Acl, PasswordFile};
use zerofan_broker::config::Config;
use zerofan_broker::core::{Broker, ConnectionMeta, ListenerAuth, Outgoing, SecurityConfig, Wire};
use zerofan_codec::{frame, Frame, Packet};

fn files() -> &'static (Arc<PasswordFile>, Arc<Acl>) {
    static FILES: OnceLock<(Arc<PasswordFile>, Arc<Acl>)> = OnceLock::new();
    FILES.get_or_init(|| {
        let mut p = PasswordFile::new();
        p.set_with_iterations("alice", b"secret", 1).unwrap();
        p.set_with_iterations("bob", b"pw", 1).unwrap();
        let acl = Acl::parse(
            "topic read $SYS/#\ntopic read public/#\nuser alice\ntopic readwrite alice/#\n\
             topic deny alice/secret\npattern readwrite devices/%c/#\npattern read users/%u/#\n",
        )
        .unwrap();
        (Arc::new(p), Arc::new(acl))
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&setup, stream)) = data.split_first() else {
        return;
    };
    let (passwords, acl) = files().clone();
    let config = Config {
        max_connections: usize::from(setup & 0x80 != 0) * 2,
        max_connection_rate: u32::from(setup & 0x40 != 0),
        max_publish_rate: u32::from(setup & 0x20 != 0) * 2,
        max_publish_bytes_rate: u64::from(setup & 0x10 != 0) * 64,
        max_topic_length: if setup & 0x08 != 0 { 16 } else { 65535 },
        sys_interval: 0,
        ..Config::default()
    };
    let now = Instant::now();
    let mut broker = Broker::new(config, now);
    broker.set_security(SecurityConfig {
        listeners: vec![ListenerAuth {
            allow_anonymous: setup & 1 != 0,
            passwords: (setup & 2 != 0).then_some(passwords),
            acl: (setup & 4 != 0).then_some(acl),
            use_identity_as_username: setup & 0x30 == 0x30,
            max_connections: 1,
        }],
        throttle: Default::default(),
        ..Default::default()
    });
    let peer = "192.0.2.1:5000".parse().unwrap();
    // A second connection first when asked (the same bit that allows two
    // connections overall), so the listener's limit of one is reached.
    // Without it the stream's connection may connect and go on.
    let other = (setup & 0x80 != 0)
        .then(|| broker.connection_opened_with(now, peer, ConnectionMeta::default()));
    let conn = broker.connection_opened_with(
        now,
        peer,
        ConnectionMeta {
            listener: 0,
            identity: (setup & 0x40 != 0).then(|| "alice".to_string()),
        },
    );
    let bytes = Bytes::copy_from_slice(stream);
    let mut off = 0;
    let mut t = now;
    while let Frame::Complete(n) = frame(&bytes[off..], 1 << 20) {
        let packet = bytes.slice(off..off + n);
        let wire = Wire::candidate(&bytes, off, off + n);
        off += n;
        t += Duration::from_millis(100);
        let protocol = broker.protocol(conn);
        match zerofan_codec::decode(packet, protocol) {
            Ok(p @ Packet::Publish(_)) => broker.handle_publish(t, conn, p, wire),
            Ok(p) => broker.handle_packet(t, conn, p),
            Err(e) => broker.handle_decode_error(t, conn, e),
        }
        drain(&mut broker, t, conn);
        if broker.is_closing(conn) {
            break;
        }
    }
    broker.handle_timeout(t + Duration::from_secs(3600));
    drain(&mut broker, t, conn);
    broker.connection_lost(t, conn);
    if let Some(other) = other {
        broker.connection_lost(t, other);
    }
    let _ = broker.metrics().security.refusals_total();
});

fn drain(broker: &mut Broker, now: Instant, conn: zerofan_broker::core::ConnId) {
    let protocol = broker.protocol(conn);
    let mut out = Vec::new();
    loop {
        broker.poll_transmit(now, conn, &mut out, 64);
        if out.is_empty() {
            break;
        }
        let mut buf = BytesMut::new();
        for item in out.drain(..) {
            match item {
                Outgoing::Packet(p) => {
                    zerofan_codec::encode(&p, protocol, &mut buf).expect("core packet encodes")
                }
                ack @ Outgoing::Ack { .. } => {
                    if let Some(p) = ack.control_packet() {
                        zerofan_codec::encode(&p, protocol, &mut buf).expect("ack encodes")
                    }
                }
                Outgoing::Publish(d) => {
                    let start = buf.len();
                    zerofan_codec::encode_publish_header(&d.header(), protocol, &mut buf)
                        .expect("publish header encodes");
                    buf.extend_from_slice(&d.message.payload);
                    if let Some(w) = d.wire(protocol) {
                        assert_eq!(
                            w.bytes(),
                            &buf[start..],
                            "sent as received, but not identical"
                        );
                    }
                }
            }
        }
    }
}
