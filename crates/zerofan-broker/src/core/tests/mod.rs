//! Unit tests of the sans-IO core: packets in, packets out, time jumped at
//! will. Every outgoing item is encoded with the codec and decoded again, so
//! these also check what a client would really see.

mod admin;
mod admission;
mod backpressure;
mod claims;
mod connect;
mod delivery;
mod drain;
mod durable;
mod http_auth;
mod nodes;
mod qos;
mod quota;
mod replicas;
mod retained;
mod scram;
mod security;
mod sessions;
mod shards;
mod shared;
mod token;
mod wills;

use super::{Broker, ConnId, Outgoing, Transmit};
use crate::config::Config;
use bytes::{Bytes, BytesMut};
use std::time::{Duration, Instant};
use zerofan_codec::{
    Ack, Connect, Disconnect, MqttStr, Packet, Properties, Protocol, Publish, QoS, ReasonCode,
    Subscribe, SubscriptionOptions, Will,
};

/// A broker and a clock.
pub(super) struct H {
    pub b: Broker,
    pub now: Instant,
}

/// What one connection received, decoded.
pub(super) struct Out {
    pub packets: Vec<Packet>,
    pub closed: bool,
    /// How many of the PUBLISH packets were sent as received (`Wire`).
    pub as_received: usize,
}

impl Out {
    pub(super) fn publishes(&self) -> Vec<&Publish> {
        self.packets
            .iter()
            .filter_map(|p| match p {
                Packet::Publish(p) => Some(p),
                _ => None,
            })
            .collect()
    }

    pub(super) fn payloads(&self) -> Vec<String> {
        self.publishes()
            .iter()
            .map(|p| String::from_utf8_lossy(&p.payload).into_owned())
            .collect()
    }

    pub(super) fn disconnect(&self) -> Option<ReasonCode> {
        self.packets.iter().find_map(|p| match p {
            Packet::Disconnect(d) => Some(d.reason),
            _ => None,
        })
    }

    pub(super) fn connack(&self) -> Option<&zerofan_codec::ConnAck> {
        self.packets.iter().find_map(|p| match p {
            Packet::ConnAck(c) => Some(c),
            _ => None,
        })
    }
}

pub(super) fn s(v: &str) -> MqttStr {
    MqttStr::try_from(v).unwrap()
}

pub(super) fn connect_packet(id: &str, protocol: Protocol, clean: bool) -> Connect {
    Connect {
        protocol,
        clean_start: clean,
        keep_alive: 60,
        properties: Default::default(),
        client_id: s(id),
        will: None,
        username: None,
        password: None,
        bridge: false,
    }
}

pub(super) fn will(topic: &str, payload: &str) -> Will {
    Will {
        topic: s(topic),
        payload: Bytes::copy_from_slice(payload.as_bytes()),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
    }
}

pub(super) fn publish(topic: &str, payload: &str, qos: QoS, pid: u16) -> Publish {
    Publish {
        dup: false,
        qos,
        retain: false,
        topic: s(topic),
        packet_id: if qos == QoS::AtMostOnce { 0 } else { pid },
        properties: Default::default(),
        payload: Bytes::copy_from_slice(payload.as_bytes()),
    }
}

pub(super) fn opts(qos: QoS) -> SubscriptionOptions {
    SubscriptionOptions {
        qos,
        ..Default::default()
    }
}

pub(super) fn ack(pid: u16) -> Ack {
    Ack {
        packet_id: pid,
        reason: ReasonCode::SUCCESS,
        properties: Default::default(),
    }
}

impl H {
    pub(super) fn new() -> Self {
        let cfg = Config {
            sys_interval: 0,
            ..Config::default()
        };
        H::with(cfg)
    }

    pub(super) fn with(cfg: Config) -> Self {
        let now = Instant::now();
        H {
            b: Broker::new(cfg, now),
            now,
        }
    }

    pub(super) fn open(&mut self) -> ConnId {
        self.b
            .connection_opened(self.now, "127.0.0.1:5000".parse().unwrap())
    }

    /// A packet from `c`. A PUBLISH goes in as the shell hands it over:
    /// decoded from its encoding in a read buffer, with where it lies there
    /// (`Wire::candidate`), so deliveries may be sent as received.
    pub(super) fn send(&mut self, c: ConnId, p: Packet) {
        if let Packet::Publish(_) = &p {
            let protocol = self.b.protocol(c);
            let mut buf = BytesMut::new();
            if zerofan_codec::encode(&p, protocol, &mut buf).is_ok() {
                let buf = buf.freeze();
                if let Ok(decoded) = zerofan_codec::decode(buf.clone(), protocol) {
                    let wire = super::Wire::candidate(&buf, 0, buf.len());
                    self.b.handle_publish(self.now, c, decoded, wire);
                    return;
                }
            }
        }
        self.b.handle_packet(self.now, c, p);
    }

    /// Open, CONNECT (edited by `f`), and return the connection and CONNACK.
    pub(super) fn connect_with(
        &mut self,
        id: &str,
        protocol: Protocol,
        clean: bool,
        f: impl FnOnce(&mut Connect),
    ) -> (ConnId, Out) {
        let c = self.open();
        let mut pkt = connect_packet(id, protocol, clean);
        f(&mut pkt);
        self.send(c, Packet::Connect(Box::new(pkt)));
        let out = self.out(c);
        (c, out)
    }

    /// A v5 client with a clean start and session expiry 0.
    pub(super) fn client(&mut self, id: &str) -> ConnId {
        let (c, out) = self.connect_with(id, Protocol::V5, true, |_| {});
        assert_eq!(out.connack().unwrap().reason, ReasonCode::SUCCESS);
        c
    }

    pub(super) fn subscribe(&mut self, c: ConnId, filter: &str, o: SubscriptionOptions) -> Out {
        self.subscribe_id(c, filter, o, None)
    }

    pub(super) fn subscribe_id(
        &mut self,
        c: ConnId,
        filter: &str,
        o: SubscriptionOptions,
        id: Option<u32>,
    ) -> Out {
        let mut properties = Properties::default();
        properties.subscription_identifiers.extend(id);
        self.send(
            c,
            Packet::Subscribe(Subscribe {
                packet_id: 1,
                properties: properties.into(),
                filters: vec![(s(filter), o)],
            }),
        );
        self.out(c)
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
        self.b.handle_timeout(self.now);
    }

    pub(super) fn secs(&mut self, n: u64) {
        self.advance(Duration::from_secs(n));
    }

    /// Drain everything the writer would send, round-tripped through the codec.
    pub(super) fn out(&mut self, c: ConnId) -> Out {
        let protocol = self.b.protocol(c);
        let mut packets = Vec::new();
        let mut closed = false;
        let mut as_received = 0;
        loop {
            let mut batch = Vec::new();
            let t = self.b.poll_transmit(self.now, c, &mut batch, 16);
            for item in &batch {
                packets.push(roundtrip(item, protocol));
                if matches!(item, Outgoing::Publish(d) if d.wire(protocol).is_some()) {
                    as_received += 1;
                }
            }
            match t {
                Transmit::Gone => {
                    closed = true;
                    break;
                }
                Transmit::Close if self.b.outbox_len(c) == 0 => {
                    closed = true;
                    break;
                }
                _ => {}
            }
            if batch.is_empty() {
                break;
            }
        }
        let mut wakeups = Vec::new();
        self.b.take_wakeups(&mut wakeups);
        Out {
            packets,
            closed,
            as_received,
        }
    }
}

/// Encode what the writer would, decode what the client would.
fn roundtrip(item: &Outgoing, protocol: Protocol) -> Packet {
    let mut buf = BytesMut::new();
    match item {
        Outgoing::Packet(_) | Outgoing::Ack { .. } => {
            let p = item.control_packet().unwrap();
            zerofan_codec::encode(&p, protocol, &mut buf).unwrap()
        }
        Outgoing::Publish(d) => {
            zerofan_codec::encode_publish_header(&d.header(), protocol, &mut buf).unwrap();
            buf.extend_from_slice(&d.message.payload);
        }
    }
    let frame = buf.freeze();
    if let Outgoing::Publish(d) = item {
        if let Some(w) = d.wire(protocol) {
            // Sent as received only when that is exactly what the encoder
            // would have written.
            assert_eq!(w.bytes(), &frame[..], "a PUBLISH sent as received differs");
        }
    }
    assert_eq!(
        zerofan_codec::frame(&frame, u32::MAX),
        zerofan_codec::Frame::Complete(frame.len())
    );
    zerofan_codec::decode(frame, protocol).unwrap()
}

pub(super) fn disconnect(reason: ReasonCode) -> Packet {
    Packet::Disconnect(Disconnect {
        reason,
        properties: Default::default(),
    })
}
