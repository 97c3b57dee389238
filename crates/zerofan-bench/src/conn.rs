//! A minimal async MQTT client connection built on `zerofan-codec`.
//!
//! Just enough for load generation: CONNECT/CONNACK, SUBSCRIBE/SUBACK,
//! PUBLISH at any QoS with the acks, and a split into a [`Reader`] (frames
//! and decodes from one growing `BytesMut`) and a [`Writer`] (encodes into a
//! scratch buffer and writes many packets per syscall). No keep-alive timer:
//! every bench run is far shorter than the keep-alive it announces.

use bytes::{Bytes, BytesMut};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};
use zerofan_codec::framing::read_varint;
use zerofan_codec::{
    decode, encode, encode_publish_header, frame, Ack, ConnAck, Connect, Frame, MqttStr, Packet,
    Properties, Protocol, PublishHeader, QoS, Subscribe, SubscriptionOptions, Unsubscribe,
};

/// Largest packet this client accepts (the MQTT maximum, 256 MiB).
pub const MAX_PACKET: u32 = 268_435_460;

/// Keep alive announced in CONNECT, in seconds; runs are much shorter.
pub const KEEP_ALIVE: u16 = 600;

/// Payloads at least this large are written straight from their `Bytes`
/// instead of being copied into the write buffer.
const DIRECT_WRITE: usize = 64 * 1024;

/// Everything that can go wrong on a bench connection.
#[derive(Debug)]
pub enum ConnError {
    /// Socket error.
    Io(std::io::Error),
    /// The broker sent bytes the codec refused.
    Decode(zerofan_codec::DecodeError),
    /// A packet could not be encoded.
    Encode(zerofan_codec::EncodeError),
    /// The broker closed the connection.
    Closed,
    /// The broker answered with something the protocol does not allow here,
    /// or refused (CONNACK / SUBACK failure).
    Protocol(String),
    /// No answer within the time allowed.
    Timeout(&'static str),
}

impl fmt::Display for ConnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnError::Io(e) => write!(f, "i/o error: {e}"),
            ConnError::Decode(e) => write!(f, "decode error: {e}"),
            ConnError::Encode(e) => write!(f, "encode error: {e}"),
            ConnError::Closed => write!(f, "connection closed by the broker"),
            ConnError::Protocol(s) => write!(f, "protocol error: {s}"),
            ConnError::Timeout(what) => write!(f, "timed out waiting for {what}"),
        }
    }
}

impl std::error::Error for ConnError {}

impl From<std::io::Error> for ConnError {
    fn from(e: std::io::Error) -> Self {
        ConnError::Io(e)
    }
}
impl From<zerofan_codec::DecodeError> for ConnError {
    fn from(e: zerofan_codec::DecodeError) -> Self {
        ConnError::Decode(e)
    }
}
impl From<zerofan_codec::EncodeError> for ConnError {
    fn from(e: zerofan_codec::EncodeError) -> Self {
        ConnError::Encode(e)
    }
}

/// Result alias for connection operations.
pub type Result<T> = std::result::Result<T, ConnError>;

/// The read half: a growing buffer, framed and decoded in place.
pub struct Reader {
    rd: OwnedReadHalf,
    buf: BytesMut,
    protocol: Protocol,
    /// Spare room asked for before a read; doubles while reads fill it.
    read_size: usize,
}

/// A packet from [`Reader::try_next_seen`].
pub enum Next<T> {
    /// A PUBLISH, looked at in place.
    Publish {
        /// Its QoS.
        qos: QoS,
        /// Its packet identifier (0 at QoS 0).
        packet_id: u16,
        /// What the caller made of its payload.
        seen: T,
    },
    /// Any other packet, decoded.
    Other(Packet),
}

/// Where a PUBLISH's payload lies in the complete packet `p`, with its QoS
/// and packet id; `None` for another packet type or lengths that do not
/// add up (left to the decoder to report).
fn publish_in_place(p: &[u8], protocol: Protocol) -> Option<(QoS, u16, std::ops::Range<usize>)> {
    let first = *p.first()?;
    if first >> 4 != 3 {
        return None;
    }
    let qos = QoS::from_u8((first >> 1) & 3)?;
    // Fixed header: one byte, then the remaining length.
    let (_, n) = read_varint(p.get(1..)?).ok()??;
    let mut at = 1 + n;
    let topic_len = usize::from(u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?));
    at += 2 + topic_len;
    let mut packet_id = 0;
    if qos != QoS::AtMostOnce {
        packet_id = u16::from_be_bytes(p.get(at..at + 2)?.try_into().ok()?);
        at += 2;
    }
    if protocol == Protocol::V5 {
        // Property length (a variable byte integer), then the properties.
        let (props, n) = read_varint(p.get(at..)?).ok()??;
        at += n + usize::try_from(props).ok()?;
    }
    (at <= p.len()).then_some((qos, packet_id, at..p.len()))
}

/// Smallest and largest spare room a read asks for.
const READ_MIN: usize = 2 * 1024;
const READ_MAX: usize = 256 * 1024;

impl Reader {
    /// Decode the next complete packet already buffered, if any.
    pub fn try_next(&mut self) -> Result<Option<Packet>> {
        match frame(&self.buf, MAX_PACKET) {
            Frame::Complete(len) => {
                let bytes = self.buf.split_to(len).freeze();
                Ok(Some(decode(bytes, self.protocol)?))
            }
            Frame::NeedMore(n) => {
                self.buf.reserve(n);
                Ok(None)
            }
            Frame::Invalid(e) => Err(e.into()),
        }
    }

    /// The next complete packet: a PUBLISH is looked at in place, without
    /// decoding it into a [`Packet`] (`seen` gets its payload; its topic is
    /// skipped, not validated), anything else is decoded. What a receiver
    /// of hundreds of thousands of messages per second needs: the broker
    /// under test, not the load generator's decoding, should set the pace.
    /// A PUBLISH whose lengths do not add up is decoded instead, so its
    /// error is reported as [`Reader::try_next`] would.
    pub fn try_next_seen<T>(&mut self, seen: impl FnOnce(&[u8]) -> T) -> Result<Option<Next<T>>> {
        let len = match frame(&self.buf, MAX_PACKET) {
            Frame::Complete(len) => len,
            Frame::NeedMore(n) => {
                self.buf.reserve(n);
                return Ok(None);
            }
            Frame::Invalid(e) => return Err(e.into()),
        };
        if let Some((qos, packet_id, payload)) = publish_in_place(&self.buf[..len], self.protocol) {
            let out = seen(&self.buf[payload]);
            bytes::Buf::advance(&mut self.buf, len);
            return Ok(Some(Next::Publish {
                qos,
                packet_id,
                seen: out,
            }));
        }
        let bytes = self.buf.split_to(len).freeze();
        Ok(Some(Next::Other(decode(bytes, self.protocol)?)))
    }

    /// Read more bytes from the socket (at least one). Cancel-safe.
    pub async fn fill(&mut self) -> Result<()> {
        if self.buf.capacity() - self.buf.len() < self.read_size / 2 {
            self.buf.reserve(self.read_size);
        }
        let spare = self.buf.capacity() - self.buf.len();
        let n = self.rd.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Err(ConnError::Closed);
        }
        if n >= spare && self.read_size < READ_MAX {
            self.read_size *= 2;
        }
        Ok(())
    }

    /// Wait for the next packet.
    pub async fn next(&mut self) -> Result<Packet> {
        loop {
            if let Some(p) = self.try_next()? {
                return Ok(p);
            }
            self.fill().await?;
        }
    }

    /// Wait for the next packet, for at most `limit`.
    pub async fn next_within(&mut self, limit: Duration, what: &'static str) -> Result<Packet> {
        tokio::time::timeout(limit, self.next())
            .await
            .map_err(|_| ConnError::Timeout(what))?
    }
}

/// The write half: packets are encoded into `buf` and sent by [`Writer::flush`].
pub struct Writer {
    wr: OwnedWriteHalf,
    buf: BytesMut,
    protocol: Protocol,
}

impl Writer {
    /// Encode a packet into the write buffer.
    pub fn push(&mut self, packet: &Packet) -> Result<()> {
        encode(packet, self.protocol, &mut self.buf)?;
        Ok(())
    }

    /// Queue an acknowledgement (PUBACK, PUBREC, PUBREL or PUBCOMP).
    pub fn push_ack(&mut self, kind: AckKind, packet_id: u16) -> Result<()> {
        let ack = Ack {
            packet_id,
            ..Ack::default()
        };
        let p = match kind {
            AckKind::Ack => Packet::PubAck(ack),
            AckKind::Rec => Packet::PubRec(ack),
            AckKind::Rel => Packet::PubRel(ack),
            AckKind::Comp => Packet::PubComp(ack),
        };
        self.push(&p)
    }

    /// Queue a PUBLISH whose payload is `prefix` followed by `body`. Small
    /// payloads are copied into the write buffer; large bodies are written
    /// from their own buffer (the pending buffer is flushed first).
    pub async fn publish(
        &mut self,
        topic: &str,
        qos: QoS,
        packet_id: u16,
        prefix: &[u8],
        body: &Bytes,
    ) -> Result<()> {
        self.publish_flagged(topic, qos, false, packet_id, prefix, body)
            .await
    }

    /// [`Writer::publish`] with the RETAIN flag as given.
    pub async fn publish_flagged(
        &mut self,
        topic: &str,
        qos: QoS,
        retain: bool,
        packet_id: u16,
        prefix: &[u8],
        body: &Bytes,
    ) -> Result<()> {
        static EMPTY: std::sync::OnceLock<Properties> = std::sync::OnceLock::new();
        let props = EMPTY.get_or_init(Properties::default);
        let header = PublishHeader {
            dup: false,
            qos,
            retain,
            packet_id: if qos == QoS::AtMostOnce { 0 } else { packet_id },
            topic,
            topic_alias: None,
            properties: props,
            message_expiry_interval: None,
            subscription_identifiers: &[],
            payload_len: prefix.len() + body.len(),
        };
        encode_publish_header(&header, self.protocol, &mut self.buf)?;
        self.buf.extend_from_slice(prefix);
        if body.len() >= DIRECT_WRITE {
            self.flush().await?;
            self.wr.write_all(body).await?;
        } else {
            self.buf.extend_from_slice(body);
        }
        Ok(())
    }

    /// Bytes waiting in the write buffer.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }

    /// Write everything buffered.
    pub async fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.wr.write_all(&self.buf).await?;
            self.buf.clear();
        }
        Ok(())
    }

    /// Send DISCONNECT (best effort) and shut the socket down.
    pub async fn disconnect(mut self) {
        let _ = self.push(&Packet::Disconnect(Default::default()));
        let _ = self.flush().await;
        let _ = self.wr.shutdown().await;
    }
}

/// Which acknowledgement to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckKind {
    /// PUBACK: QoS 1 acknowledgement.
    Ack,
    /// PUBREC: QoS 2 step 1 (receiver to sender).
    Rec,
    /// PUBREL: QoS 2 step 2 (sender to receiver).
    Rel,
    /// PUBCOMP: QoS 2 step 3 (receiver to sender).
    Comp,
}

/// A connected, accepted MQTT session split into halves.
pub struct Conn {
    /// Read half.
    pub reader: Reader,
    /// Write half.
    pub writer: Writer,
    /// The broker's CONNACK.
    pub connack: ConnAck,
}

impl Conn {
    /// The broker's Receive Maximum (MQTT 5), or `u16::MAX`.
    pub fn receive_maximum(&self) -> u16 {
        self.connack.properties.receive_maximum.unwrap_or(u16::MAX)
    }

    /// The broker's Maximum Packet Size (MQTT 5), if announced.
    pub fn maximum_packet_size(&self) -> Option<u32> {
        self.connack.properties.maximum_packet_size
    }
}

/// How a client connects, beyond [`connect`]'s defaults.
#[derive(Clone, Debug)]
pub struct ConnectOpts {
    /// Keep alive announced in CONNECT, in seconds.
    pub keep_alive: u16,
    /// Clean start (clean session in MQTT 3.1.1).
    pub clean_start: bool,
    /// Session Expiry Interval (MQTT 5 only; ignored for 3.1.1).
    pub session_expiry: Option<u32>,
    /// Local address to bind before connecting: many loopback sources
    /// give many more ports than one (each source has its own range).
    pub source: Option<IpAddr>,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            keep_alive: KEEP_ALIVE,
            clean_start: true,
            // ZEROFAN_BENCH_SESSION_EXPIRY=N (MQTT 5, --version 5): every
            // session is persistent (expiry N s; still clean start), so a
            // durable broker writes its QoS 1/2 queue to its store.
            session_expiry: std::env::var("ZEROFAN_BENCH_SESSION_EXPIRY")
                .ok()
                .and_then(|v| v.parse().ok()),
            source: None,
        }
    }
}

/// Open a TCP connection, send CONNECT with a clean session and wait for a
/// successful CONNACK.
pub async fn connect(
    addr: SocketAddr,
    client_id: &str,
    protocol: Protocol,
    timeout: Duration,
) -> Result<Conn> {
    connect_with(addr, client_id, protocol, timeout, &ConnectOpts::default()).await
}

/// [`connect`] with the CONNECT fields and source address of `opts`.
pub async fn connect_with(
    addr: SocketAddr,
    client_id: &str,
    protocol: Protocol,
    timeout: Duration,
    opts: &ConnectOpts,
) -> Result<Conn> {
    let open = async {
        match opts.source {
            Some(src) => {
                let sock = if src.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                };
                sock.bind(SocketAddr::new(src, 0))?;
                sock.connect(addr).await
            }
            None => TcpStream::connect(addr).await,
        }
    };
    let stream = tokio::time::timeout(timeout, open)
        .await
        .map_err(|_| ConnError::Timeout("TCP connect"))??;
    stream.set_nodelay(true)?;
    let (rd, wr) = stream.into_split();
    let mut reader = Reader {
        rd,
        buf: BytesMut::new(),
        protocol,
        read_size: READ_MIN,
    };
    let mut writer = Writer {
        wr,
        buf: BytesMut::with_capacity(256),
        protocol,
    };
    let client_id = MqttStr::try_from(client_id)
        .map_err(|e| ConnError::Protocol(format!("bad client id: {e}")))?;
    let properties = Properties {
        session_expiry_interval: opts.session_expiry.filter(|_| protocol == Protocol::V5),
        ..Properties::default()
    };
    let connect = Connect {
        protocol,
        clean_start: opts.clean_start,
        keep_alive: opts.keep_alive,
        properties: properties.into(),
        client_id,
        will: None,
        username: None,
        password: None,
        bridge: false,
    };
    writer.push(&Packet::Connect(Box::new(connect)))?;
    writer.flush().await?;
    match reader.next_within(timeout, "CONNACK").await? {
        Packet::ConnAck(ack) if !ack.reason.is_error() && ack.reason.0 == 0 => Ok(Conn {
            reader,
            writer,
            connack: ack,
        }),
        Packet::ConnAck(ack) => Err(ConnError::Protocol(format!(
            "CONNACK refused with code {:#04x}",
            ack.reason.0
        ))),
        other => Err(ConnError::Protocol(format!(
            "expected CONNACK, got {}",
            packet_name(&other)
        ))),
    }
}

impl Conn {
    /// Subscribe to `filters` at `qos` and wait for a SUBACK granting all of them.
    pub async fn subscribe(
        &mut self,
        filters: &[String],
        qos: QoS,
        timeout: Duration,
    ) -> Result<()> {
        let mut list = Vec::with_capacity(filters.len());
        for f in filters {
            let f = MqttStr::try_from(f.as_str())
                .map_err(|e| ConnError::Protocol(format!("bad filter: {e}")))?;
            list.push((
                f,
                SubscriptionOptions {
                    qos,
                    ..SubscriptionOptions::default()
                },
            ));
        }
        let sub = Subscribe {
            packet_id: 1,
            properties: Default::default(),
            filters: list,
        };
        self.writer.push(&Packet::Subscribe(sub))?;
        self.writer.flush().await?;
        loop {
            match self.reader.next_within(timeout, "SUBACK").await? {
                Packet::SubAck(ack) if ack.packet_id == 1 => {
                    if let Some(bad) = ack.reasons.iter().find(|r| r.is_error()) {
                        return Err(ConnError::Protocol(format!(
                            "SUBACK refused a filter with code {:#04x}",
                            bad.0
                        )));
                    }
                    if ack.reasons.len() != filters.len() {
                        return Err(ConnError::Protocol("SUBACK with wrong count".into()));
                    }
                    return Ok(());
                }
                // Retained messages or anything else before the SUBACK: ignore.
                Packet::Publish(_) => continue,
                other => {
                    return Err(ConnError::Protocol(format!(
                        "expected SUBACK, got {}",
                        packet_name(&other)
                    )))
                }
            }
        }
    }
}

impl Conn {
    /// Send one SUBSCRIBE (packet id `packet_id`) for `filters` and wait for
    /// its SUBACK; returns how many filters the broker refused. Messages
    /// arriving before the SUBACK (retained ones) are skipped.
    pub async fn subscribe_counted(
        &mut self,
        filters: &[String],
        qos: QoS,
        packet_id: u16,
        timeout: Duration,
    ) -> Result<usize> {
        let mut list = Vec::with_capacity(filters.len());
        for f in filters {
            let f = MqttStr::try_from(f.as_str())
                .map_err(|e| ConnError::Protocol(format!("bad filter: {e}")))?;
            list.push((
                f,
                SubscriptionOptions {
                    qos,
                    ..SubscriptionOptions::default()
                },
            ));
        }
        self.writer.push(&Packet::Subscribe(Subscribe {
            packet_id,
            properties: Default::default(),
            filters: list,
        }))?;
        self.writer.flush().await?;
        loop {
            match self.reader.next_within(timeout, "SUBACK").await? {
                Packet::SubAck(ack) if ack.packet_id == packet_id => {
                    if ack.reasons.len() != filters.len() {
                        return Err(ConnError::Protocol("SUBACK with wrong count".into()));
                    }
                    return Ok(ack.reasons.iter().filter(|r| r.is_error()).count());
                }
                Packet::Publish(_) | Packet::PingResp => continue,
                other => {
                    return Err(ConnError::Protocol(format!(
                        "expected SUBACK, got {}",
                        packet_name(&other)
                    )))
                }
            }
        }
    }

    /// Send one UNSUBSCRIBE for `filters` and wait for its UNSUBACK.
    pub async fn unsubscribe(
        &mut self,
        filters: &[String],
        packet_id: u16,
        timeout: Duration,
    ) -> Result<()> {
        let mut list = Vec::with_capacity(filters.len());
        for f in filters {
            list.push(
                MqttStr::try_from(f.as_str())
                    .map_err(|e| ConnError::Protocol(format!("bad filter: {e}")))?,
            );
        }
        self.writer.push(&Packet::Unsubscribe(Unsubscribe {
            packet_id,
            properties: Default::default(),
            filters: list,
        }))?;
        self.writer.flush().await?;
        loop {
            match self.reader.next_within(timeout, "UNSUBACK").await? {
                // Any UNSUBACK: only one UNSUBSCRIBE is in flight, and
                // rumqttd 0.20 answers with another packet id.
                Packet::UnsubAck(_) => return Ok(()),
                Packet::Publish(_) | Packet::PingResp => continue,
                other => {
                    return Err(ConnError::Protocol(format!(
                        "expected UNSUBACK, got {}",
                        packet_name(&other)
                    )))
                }
            }
        }
    }
}

/// A short name for a packet, for error messages.
pub fn packet_name(p: &Packet) -> &'static str {
    match p {
        Packet::Connect(_) => "CONNECT",
        Packet::ConnAck(_) => "CONNACK",
        Packet::Publish(_) => "PUBLISH",
        Packet::PubAck(_) => "PUBACK",
        Packet::PubRec(_) => "PUBREC",
        Packet::PubRel(_) => "PUBREL",
        Packet::PubComp(_) => "PUBCOMP",
        Packet::Subscribe(_) => "SUBSCRIBE",
        Packet::SubAck(_) => "SUBACK",
        Packet::Unsubscribe(_) => "UNSUBSCRIBE",
        Packet::UnsubAck(_) => "UNSUBACK",
        Packet::PingReq => "PINGREQ",
        Packet::PingResp => "PINGRESP",
        Packet::Disconnect(_) => "DISCONNECT",
        Packet::Auth(_) => "AUTH",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerofan_codec::Publish;

    /// The in-place view finds what the decoder finds, for both encodings,
    /// QoS 0 and 1, with and without properties.
    #[test]
    fn publish_in_place_agrees_with_the_decoder() {
        let props = Properties {
            content_type: Some(MqttStr::from_static("x/y")),
            user_properties: vec![(MqttStr::from_static("k"), MqttStr::from_static("v"))],
            ..Properties::default()
        };
        for protocol in [Protocol::V311, Protocol::V5] {
            for (qos, packet_id) in [(QoS::AtMostOnce, 0), (QoS::AtLeastOnce, 7)] {
                for size in [0usize, 20, 300] {
                    let p = Publish {
                        qos,
                        packet_id,
                        topic: MqttStr::from_static("bench/topic"),
                        payload: Bytes::from(vec![0x5a; size]),
                        properties: if protocol == Protocol::V5 {
                            props.clone().into()
                        } else {
                            Default::default()
                        },
                        ..Publish::default()
                    };
                    let mut b = BytesMut::new();
                    encode(&Packet::Publish(p.clone()), protocol, &mut b).unwrap();
                    let (q, id, range) = publish_in_place(&b, protocol).unwrap();
                    assert_eq!((q, id), (qos, packet_id));
                    assert_eq!(&b[range], &p.payload[..]);
                }
            }
        }
        // Not a PUBLISH, or cut short: left to the decoder.
        assert!(publish_in_place(&[0xd0, 0], Protocol::V311).is_none());
        assert!(publish_in_place(&[0x30, 5, 0, 9, b'a'], Protocol::V311).is_none());
    }
}
