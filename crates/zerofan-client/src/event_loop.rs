//! The task behind a [`crate::Client`]: connects, runs the MQTT flows over
//! one connection at a time, and reconnects with backoff when it drops,
//! resuming the session (inflight messages resent with DUP, PUBREL resent,
//! subscriptions restored if the broker lost them).
//!
//! One `select!` loop per connection drives a vectored writer, the pooled
//! reader, the bounded command queue (not polled while the inflight window
//! or the write buffer is full: that is the backpressure on `publish`), the
//! bounded incoming queue (the socket is not read while it is full) and the
//! keep-alive timer.

use crate::delivery::PublishAck;
use crate::error::ClientError;
use crate::frame_builder::{OutFrame, HIGH_WATER};
use crate::incoming::{Pushed, Sender};
use crate::message::{AckToken, Message};
use crate::options::ClientOptions;
use crate::reader::Reader;
use crate::session::{
    Inflight, PendingSub, PendingUnsub, PubDone, Session, Stage, SubDone, UnsubDone,
};
use crate::state::{ConnInfo, ConnState};
use crate::stats::Stats;
use crate::subscription::{SubAckInfo, UnsubAckInfo};
use crate::transport::Io;
use crate::writer::Writer;
use bytes::{Bytes, BytesMut};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use zerofan_codec::{
    Ack, Disconnect, MqttStr, Packet, Protocol, QoS, ReasonCode, Subscribe, Unsubscribe,
};

/// Bytes queued for writing above which no new command is taken.
const WRITE_HIGH: usize = 1 << 20;
/// Most commands taken from the queue per wakeup.
const BATCH: usize = 128;

/// A request from a [`crate::Client`] handle.
pub(crate) enum Command {
    Publish {
        frame: OutFrame,
        done: PubDone,
    },
    Subscribe {
        packet: Subscribe,
        done: SubDone,
    },
    Unsubscribe {
        packet: Unsubscribe,
        done: UnsubDone,
    },
    Ack(AckToken),
}

/// How one connection ended.
enum End {
    Shutdown,
    Lost(ClientError),
}

/// Limits the broker announced in CONNACK.
struct ServerLimits {
    receive_maximum: u16,
    max_packet: u32,
    max_qos: QoS,
    keep_alive: u16,
}

/// Channels between the event loop and the handles.
pub(crate) struct Channels {
    pub cmd_rx: mpsc::Receiver<Command>,
    pub in_tx: Sender,
    pub state_tx: watch::Sender<ConnState>,
    pub shutdown: watch::Receiver<bool>,
    pub stats: Arc<Stats>,
}

pub(crate) struct EventLoop {
    opts: ClientOptions,
    client_id: String,
    ch: Channels,
    session: Session,
    reader: Reader,
    parked: Option<Command>,
    /// Messages decoded and not yet in the incoming queue.
    backlog: VecDeque<Message>,
    /// QoS 1/2 messages of `backlog` to acknowledge when they enter the
    /// incoming queue: (the message's number, packet identifier, QoS), in
    /// order. Empty for a QoS 0 stream, which so costs nothing per message.
    owed: VecDeque<(u64, u16, QoS)>,
    /// Messages moved from `backlog` into the incoming queue so far: the
    /// message at `backlog[i]` is number `delivered + i`.
    delivered: u64,
    scratch: BytesMut,
    server: ServerLimits,
    aliases: HashMap<u16, MqttStr>,
    connected_once: bool,
    ping_sent: Option<Instant>,
    /// Connections made: tells a manual acknowledgement's connection.
    generation: u32,
}

impl EventLoop {
    pub fn new(opts: ClientOptions, client_id: String, ch: Channels) -> Self {
        let pool = opts
            .pool
            .clone()
            .unwrap_or_else(|| zerofan_pool::Pool::global().clone());
        let max_packet = opts.maximum_packet_size.unwrap_or(u32::MAX);
        EventLoop {
            reader: Reader::new(pool, max_packet),
            server: ServerLimits {
                receive_maximum: u16::MAX,
                max_packet: u32::MAX,
                max_qos: QoS::ExactlyOnce,
                keep_alive: opts.keep_alive,
            },
            opts,
            client_id,
            ch,
            session: Session::default(),
            parked: None,
            backlog: VecDeque::new(),
            owed: VecDeque::new(),
            delivered: 0,
            scratch: BytesMut::new(),
            aliases: HashMap::new(),
            connected_once: false,
            ping_sent: None,
            generation: 0,
        }
    }

    fn protocol(&self) -> Protocol {
        self.opts.protocol
    }

    /// Run until shut down. `first` learns how the first attempt went.
    pub async fn run(mut self, first: oneshot::Sender<Result<ConnInfo, ClientError>>) {
        let mut first = Some(first);
        let mut attempt = 0u32;
        loop {
            match self.connect().await {
                Ok((io, info)) => {
                    attempt = 0;
                    let present = info.session_present;
                    if let Some(f) = first.take() {
                        let _ = f.send(Ok(info.clone()));
                    }
                    self.ch
                        .state_tx
                        .send_replace(ConnState::Connected(Box::new(info)));
                    match self.serve(io, present).await {
                        End::Shutdown => break,
                        End::Lost(e) => {
                            Stats::add(&self.ch.stats.connection_losses, 1);
                            self.ch
                                .state_tx
                                .send_replace(ConnState::Reconnecting(e.to_string()));
                        }
                    }
                    if !self.opts.reconnect {
                        break;
                    }
                }
                Err(e) => {
                    if let Some(f) = first.take() {
                        let _ = f.send(Err(e));
                        break;
                    }
                    self.ch
                        .state_tx
                        .send_replace(ConnState::Reconnecting(e.to_string()));
                }
            }
            let delay = self.opts.backoff.delay(attempt);
            attempt = attempt.saturating_add(1);
            let mut sd = self.ch.shutdown.clone();
            let stop = tokio::select! {
                _ = tokio::time::sleep(delay) => false,
                _ = async { sd.wait_for(|s| *s).await.is_ok() } => true,
            };
            if stop {
                break;
            }
        }
        self.close_all();
    }

    fn close_all(&mut self) {
        self.session.fail_all(|| ClientError::Closed);
        if let Some(c) = self.parked.take() {
            fail_command(c, ClientError::Closed);
        }
        self.ch.cmd_rx.close();
        while let Ok(c) = self.ch.cmd_rx.try_recv() {
            fail_command(c, ClientError::Closed);
        }
        self.ch.state_tx.send_replace(ConnState::Closed);
    }

    async fn connect(&mut self) -> Result<(Box<dyn Io>, ConnInfo), ClientError> {
        let t = self.opts.connect_timeout;
        match tokio::time::timeout(t, self.connect_inner()).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Timeout("connecting")),
        }
    }

    async fn connect_inner(&mut self) -> Result<(Box<dyn Io>, ConnInfo), ClientError> {
        let mut io = self.opts.transport.open().await?;
        let clean = if self.connected_once && (self.protocol().is_v5() || !self.opts.clean_start) {
            false
        } else {
            self.opts.clean_start
        };
        let connect = self.opts.connect_packet(&self.client_id, clean)?;
        let bytes = self.encode(&Packet::Connect(Box::new(connect)))?;
        io.write_all(&bytes).await?;
        io.flush().await?;
        self.reader.reset();
        loop {
            if let Some(p) = self.reader.next_packet(self.protocol()) {
                return match p?.0 {
                    Packet::ConnAck(ack) if ack.reason.is_error() => {
                        Err(ClientError::Refused(ack.reason))
                    }
                    Packet::ConnAck(ack) => Ok((io, self.on_connack(ack))),
                    _ => Err(ClientError::Protocol("expected CONNACK")),
                };
            }
            let n = self.reader.read(&mut io).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
            }
            Stats::add(&self.ch.stats.bytes_in, n as u64);
            self.reader.split_frames()?;
        }
    }

    fn on_connack(&mut self, ack: zerofan_codec::ConnAck) -> ConnInfo {
        let p = &ack.properties;
        self.server = ServerLimits {
            receive_maximum: p.receive_maximum.unwrap_or(u16::MAX),
            max_packet: p.maximum_packet_size.unwrap_or(u32::MAX),
            max_qos: match p.maximum_qos {
                Some(0) => QoS::AtMostOnce,
                Some(1) => QoS::AtLeastOnce,
                _ => QoS::ExactlyOnce,
            },
            keep_alive: p.server_keep_alive.unwrap_or(self.opts.keep_alive),
        };
        if let Some(id) = &p.assigned_client_identifier {
            self.client_id = id.to_string();
        }
        self.connected_once = true;
        self.generation = self.generation.wrapping_add(1);
        Stats::add(&self.ch.stats.connects, 1);
        if ack.session_present {
            Stats::add(&self.ch.stats.sessions_resumed, 1);
        }
        ConnInfo {
            session_present: ack.session_present,
            properties: ack.properties,
            client_id: self.client_id.clone(),
        }
    }

    /// Encode a control packet into the scratch buffer.
    fn encode(&mut self, p: &Packet) -> Result<Bytes, ClientError> {
        let len = zerofan_codec::encoded_len(p, self.protocol())?;
        self.scratch.reserve(len);
        zerofan_codec::encode(p, self.protocol(), &mut self.scratch)?;
        let out = self.scratch.split().freeze();
        if self.scratch.capacity() > HIGH_WATER {
            self.scratch = BytesMut::new();
        }
        Ok(out)
    }

    fn send(&mut self, p: &Packet, w: &mut Writer) -> Result<(), ClientError> {
        let b = self.encode(p)?;
        w.push(b);
        Ok(())
    }

    fn window_open(&self) -> bool {
        let limit = self
            .opts
            .max_inflight
            .min(self.server.receive_maximum)
            .max(1) as usize;
        self.session.inflight.len() < limit
    }

    async fn serve(&mut self, io: Box<dyn Io>, session_present: bool) -> End {
        let (mut rd, mut wr) = tokio::io::split(io);
        let mut w = Writer::new();
        self.aliases.clear();
        self.ping_sent = None;
        if let Err(e) = self.resume(&mut w, session_present) {
            return End::Lost(e);
        }
        // Packets that arrived right behind CONNACK (a resumed session's
        // queued messages) are already buffered.
        if let Err(e) = self.on_read(&mut w) {
            return End::Lost(e);
        }
        let ka = Duration::from_secs(u64::from(self.server.keep_alive));
        let mut last_write = Instant::now();
        let mut shutdown = self.ch.shutdown.clone();
        let ka_timer = tokio::time::sleep_until(last_write + ka);
        tokio::pin!(ka_timer);
        let end = loop {
            if self.parked.is_some() && self.window_open() {
                if let Some(c) = self.parked.take() {
                    self.command(c, &mut w);
                }
            }
            let accept = self.parked.is_none() && w.queued() < WRITE_HIGH;
            let deadline = match self.ping_sent {
                Some(t) => t + ka,
                None => last_write + ka,
            };
            if ka_timer.deadline() != deadline {
                ka_timer.as_mut().reset(deadline);
            }
            tokio::select! {
                r = w.step(&mut wr), if w.has_work() => match r {
                    Ok(n) => {
                        if n > 0 {
                            last_write = Instant::now();
                            Stats::add(&self.ch.stats.bytes_out, n as u64);
                        }
                    }
                    Err(e) => break End::Lost(e.into()),
                },
                r = self.reader.read(&mut rd), if self.backlog.is_empty() => match r {
                    Ok(0) => break End::Lost(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into()),
                    Ok(n) => {
                        Stats::add(&self.ch.stats.bytes_in, n as u64);
                        if let Err(e) = self.on_read(&mut w) {
                            self.protocol_failure(&e, &mut w, &mut wr).await;
                            break End::Lost(e);
                        }
                        // Hand over what fits now, without another turn of
                        // the loop.
                        if let Err(e) = self.deliver_ready(&mut w) {
                            break End::Lost(e);
                        }
                    }
                    Err(e) => break End::Lost(e.into()),
                },
                () = self.ch.in_tx.room(), if !self.backlog.is_empty() => {
                    if let Err(e) = self.deliver_ready(&mut w) {
                        break End::Lost(e);
                    }
                },
                cmd = self.ch.cmd_rx.recv(), if accept => match cmd {
                    Some(c) => {
                        self.command(c, &mut w);
                        // Take what else is queued in one go: fewer wakeups,
                        // more packets per vectored write.
                        for _ in 0..BATCH {
                            if self.parked.is_some() || w.queued() >= WRITE_HIGH {
                                break;
                            }
                            match self.ch.cmd_rx.try_recv() {
                                Ok(c) => self.command(c, &mut w),
                                Err(_) => break,
                            }
                        }
                    }
                    None => {
                        self.goodbye(&mut w, &mut wr).await;
                        break End::Shutdown;
                    }
                },
                _ = async { shutdown.wait_for(|s| *s).await.is_ok() } => {
                    // Send what is queued, in order, up to the first publish
                    // that must wait for the inflight window: the rest fails
                    // with `Closed` rather than overtaking it (or replacing
                    // it in the one parked slot, which dropped it).
                    while self.parked.is_none() {
                        match self.ch.cmd_rx.try_recv() {
                            Ok(c) => self.command(c, &mut w),
                            Err(_) => break,
                        }
                    }
                    self.goodbye(&mut w, &mut wr).await;
                    break End::Shutdown;
                },
                _ = &mut ka_timer, if !ka.is_zero() => {
                    if self.ping_sent.is_some() {
                        break End::Lost(ClientError::Timeout("no PINGRESP within keep alive"));
                    }
                    if Instant::now() >= last_write + ka {
                        if let Err(e) = self.send(&Packet::PingReq, &mut w) {
                            break End::Lost(e);
                        }
                        self.ping_sent = Some(Instant::now());
                    }
                },
            }
        };
        w.fail_all();
        self.reader.reset();
        // Messages decoded but not delivered will be sent again by the
        // broker (QoS 1/2) after the reconnect; QoS 0 ones are lost.
        self.backlog.clear();
        self.owed.clear();
        end
    }

    /// Best effort: tell an MQTT 5 broker why we close.
    async fn protocol_failure<W: AsyncWrite + Unpin>(
        &mut self,
        e: &ClientError,
        w: &mut Writer,
        wr: &mut W,
    ) {
        if !self.protocol().is_v5() {
            return;
        }
        let reason = match e {
            ClientError::Decode(d) => d.reason,
            _ => ReasonCode::PROTOCOL_ERROR,
        };
        let p = Packet::Disconnect(Disconnect {
            reason,
            properties: Default::default(),
        });
        if self.send(&p, w).is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(1), w.drain(wr)).await;
        }
    }

    /// Clean shutdown: write what is queued, then DISCONNECT.
    async fn goodbye<W: AsyncWrite + Unpin>(&mut self, w: &mut Writer, wr: &mut W) {
        let p = Packet::Disconnect(Disconnect::default());
        if self.send(&p, w).is_ok() {
            let _ = tokio::time::timeout(self.opts.connect_timeout, async {
                w.drain(wr).await?;
                wr.shutdown().await
            })
            .await;
        }
    }

    /// Queue what a new connection must send before anything else.
    fn resume(&mut self, w: &mut Writer, session_present: bool) -> Result<(), ClientError> {
        if !session_present {
            self.session.incoming_qos2.clear();
            if self.opts.resubscribe && Stats::get(&self.ch.stats.connects) > 1 {
                let subs: Vec<_> = self
                    .session
                    .subscriptions
                    .iter()
                    .map(|(f, (o, p))| (f.clone(), *o, p.clone()))
                    .collect();
                for (filter, options, properties) in subs {
                    let Some(pid) = self.session.alloc_pid() else {
                        break;
                    };
                    let packet = Subscribe {
                        packet_id: pid,
                        properties,
                        filters: vec![(
                            MqttStr::try_from(filter.as_str()).unwrap_or_default(),
                            options,
                        )],
                    };
                    self.send(&Packet::Subscribe(packet.clone()), w)?;
                    self.session
                        .subs
                        .insert(pid, PendingSub { packet, done: None });
                    Stats::add(&self.ch.stats.resubscribed, 1);
                }
            }
        }
        let pending: Vec<Packet> = self
            .session
            .subs
            .values()
            .filter(|s| s.done.is_some())
            .map(|s| Packet::Subscribe(s.packet.clone()))
            .chain(
                self.session
                    .unsubs
                    .values()
                    .map(|u| Packet::Unsubscribe(u.packet.clone())),
            )
            .collect();
        for p in &pending {
            self.send(p, w)?;
        }
        for pid in self.session.inflight_in_order() {
            let Some(inf) = self.session.inflight.get(&pid) else {
                continue;
            };
            match inf.stage {
                Stage::Acked | Stage::Received => {
                    let (head, payload) = (inf.head.clone(), inf.payload.clone());
                    if let Some(&first) = head.first() {
                        w.push(Bytes::copy_from_slice(&[first | 0x08]));
                        w.push(head.slice(1..));
                        w.push(payload);
                        Stats::add(&self.ch.stats.publishes_resent, 1);
                    }
                }
                Stage::Completed => {
                    self.send(&Packet::PubRel(ack(pid)), w)?;
                    Stats::add(&self.ch.stats.pubrels_resent, 1);
                }
            }
        }
        Ok(())
    }

    fn command(&mut self, c: Command, w: &mut Writer) {
        match c {
            Command::Publish { frame, done } => self.publish(frame, done, w),
            Command::Ack(t) => {
                if t.connection != self.generation {
                    return;
                }
                if t.qos == QoS::ExactlyOnce {
                    self.session.incoming_qos2.insert(t.packet_id);
                }
                // A failure to encode an ack cannot happen for a valid id;
                // if it did, the broker sends the message again.
                let _ = self.ack_incoming(Some((t.packet_id, t.qos)), w);
            }
            Command::Subscribe { mut packet, done } => {
                let Some(pid) = self.session.alloc_pid() else {
                    let _ = done.send(Err(ClientError::Protocol("no free packet identifier")));
                    return;
                };
                packet.packet_id = pid;
                match self.send(&Packet::Subscribe(packet.clone()), w) {
                    Ok(()) => {
                        self.session.subs.insert(
                            pid,
                            PendingSub {
                                packet,
                                done: Some(done),
                            },
                        );
                    }
                    Err(e) => {
                        let _ = done.send(Err(e));
                    }
                }
            }
            Command::Unsubscribe { mut packet, done } => {
                let Some(pid) = self.session.alloc_pid() else {
                    let _ = done.send(Err(ClientError::Protocol("no free packet identifier")));
                    return;
                };
                packet.packet_id = pid;
                match self.send(&Packet::Unsubscribe(packet.clone()), w) {
                    Ok(()) => {
                        self.session.unsubs.insert(
                            pid,
                            PendingUnsub {
                                packet,
                                done: Some(done),
                            },
                        );
                    }
                    Err(e) => {
                        let _ = done.send(Err(e));
                    }
                }
            }
        }
    }

    fn publish(&mut self, frame: OutFrame, done: PubDone, w: &mut Writer) {
        let len = frame.len();
        if len as u64 > u64::from(self.server.max_packet) {
            let _ = done.send(Err(ClientError::PacketTooLarge {
                size: len,
                max: self.server.max_packet,
            }));
            return;
        }
        if frame.qos > self.server.max_qos {
            let _ = done.send(Err(ClientError::QosNotSupported(frame.qos as u8)));
            return;
        }
        if frame.qos == QoS::AtMostOnce {
            w.push(frame.head.freeze());
            w.push(frame.payload);
            w.on_written(done);
            Stats::add(&self.ch.stats.publishes_sent, 1);
            return;
        }
        let pid = match self.session.alloc_pid() {
            Some(pid) if self.window_open() => pid,
            _ => {
                self.parked = Some(Command::Publish { frame, done });
                return;
            }
        };
        let OutFrame {
            mut head,
            payload,
            qos,
            pid_offset,
        } = frame;
        if let Some(slot) = head.get_mut(pid_offset..pid_offset + 2) {
            slot.copy_from_slice(&pid.to_be_bytes());
        }
        let head = head.freeze();
        w.push(head.clone());
        w.push(payload.clone());
        Stats::add(&self.ch.stats.publishes_sent, 1);
        let seq = self.session.next_seq();
        self.session.inflight.insert(
            pid,
            Inflight {
                head,
                payload,
                stage: if qos == QoS::AtLeastOnce {
                    Stage::Acked
                } else {
                    Stage::Received
                },
                done: Some(done),
                seq,
                rec_reason: ReasonCode::SUCCESS,
            },
        );
    }

    fn on_read(&mut self, w: &mut Writer) -> Result<(), ClientError> {
        // Frames left from before (those that came right behind CONNACK)
        // first, then what this read completed.
        loop {
            while let Some(p) = self.reader.next_packet(self.protocol()) {
                let (p, src) = p?;
                self.packet(p, src, w)?;
            }
            if !self.reader.split_frames()? {
                return Ok(());
            }
        }
    }

    /// Handle one packet; `src` is the frozen read buffer it was decoded from.
    fn packet(&mut self, p: Packet, src: Bytes, w: &mut Writer) -> Result<(), ClientError> {
        match p {
            Packet::Publish(p) => self.incoming_publish(p, src, w)?,
            Packet::PubAck(a) => {
                if matches!(self.session.inflight.get(&a.packet_id), Some(i) if i.stage == Stage::Acked)
                {
                    if let Some(i) = self.session.inflight.remove(&a.packet_id) {
                        complete(i.done, a.packet_id, a.reason, a.properties);
                    }
                }
            }
            Packet::PubRec(a) => {
                let pid = a.packet_id;
                match self.session.inflight.get_mut(&pid) {
                    Some(i) if i.stage == Stage::Received => {
                        if a.reason.is_error() {
                            if let Some(i) = self.session.inflight.remove(&pid) {
                                complete(i.done, pid, a.reason, a.properties);
                            }
                        } else {
                            i.stage = Stage::Completed;
                            i.rec_reason = a.reason;
                            i.head = Bytes::new();
                            i.payload = Bytes::new();
                            self.send(&Packet::PubRel(ack(pid)), w)?;
                        }
                    }
                    Some(i) if i.stage == Stage::Completed => {
                        self.send(&Packet::PubRel(ack(pid)), w)?;
                    }
                    _ => {
                        let mut rel = ack(pid);
                        if self.protocol().is_v5() {
                            rel.reason = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
                        }
                        self.send(&Packet::PubRel(rel), w)?;
                    }
                }
            }
            Packet::PubComp(a) => {
                if matches!(self.session.inflight.get(&a.packet_id), Some(i) if i.stage == Stage::Completed)
                {
                    if let Some(i) = self.session.inflight.remove(&a.packet_id) {
                        let reason = if a.reason == ReasonCode::PACKET_IDENTIFIER_NOT_FOUND {
                            i.rec_reason
                        } else {
                            a.reason
                        };
                        complete(i.done, a.packet_id, reason, a.properties);
                    }
                }
            }
            Packet::PubRel(a) => {
                let known = self.session.incoming_qos2.remove(&a.packet_id);
                let mut comp = ack(a.packet_id);
                if !known && self.protocol().is_v5() {
                    comp.reason = ReasonCode::PACKET_IDENTIFIER_NOT_FOUND;
                }
                self.send(&Packet::PubComp(comp), w)?;
            }
            Packet::SubAck(s) => {
                if let Some(ps) = self.session.subs.remove(&s.packet_id) {
                    for ((f, o), r) in ps.packet.filters.iter().zip(&s.reasons) {
                        if !r.is_error() {
                            self.session
                                .subscriptions
                                .insert(f.to_string(), (*o, ps.packet.properties.clone()));
                        }
                    }
                    if let Some(d) = ps.done {
                        let _ = d.send(Ok(SubAckInfo {
                            reasons: s.reasons,
                            properties: s.properties,
                        }));
                    }
                }
            }
            Packet::UnsubAck(u) => {
                if let Some(pu) = self.session.unsubs.remove(&u.packet_id) {
                    for f in &pu.packet.filters {
                        self.session.subscriptions.remove(f.as_str());
                    }
                    if let Some(d) = pu.done {
                        let _ = d.send(Ok(UnsubAckInfo {
                            reasons: u.reasons,
                            properties: u.properties,
                        }));
                    }
                }
            }
            Packet::PingResp => self.ping_sent = None,
            Packet::Disconnect(d) => return Err(ClientError::ServerDisconnect(d.reason)),
            Packet::Auth(_) => return Err(ClientError::Protocol("AUTH is not supported")),
            _ => return Err(ClientError::Protocol("packet a server must not send")),
        }
        Ok(())
    }

    fn incoming_publish(
        &mut self,
        p: zerofan_codec::Publish,
        src: Bytes,
        w: &mut Writer,
    ) -> Result<(), ClientError> {
        // The topic when it is not the packet's own (a topic alias), so
        // that the common case moves the topic instead of cloning it.
        let aliased = match p.properties.topic_alias {
            Some(alias) if self.protocol().is_v5() => {
                let max = self.opts.topic_alias_maximum.unwrap_or(0);
                if alias == 0 || alias > max {
                    return Err(ClientError::Protocol("topic alias out of range"));
                }
                if p.topic.is_empty() {
                    match self.aliases.get(&alias) {
                        Some(t) => Some(t.clone()),
                        None => return Err(ClientError::Protocol("unknown topic alias")),
                    }
                } else {
                    // Own copy: an alias must not pin a read buffer.
                    let owned = MqttStr::try_from(p.topic.as_str())
                        .map_err(|_| ClientError::Protocol("bad topic"))?;
                    self.aliases.insert(alias, owned);
                    None
                }
            }
            _ => None,
        };
        let (qos, pid) = (p.qos, p.packet_id);
        let mut msg = Message::from_publish(p, aliased, src);
        if self.opts.manual_acks && qos != QoS::AtMostOnce {
            if qos == QoS::ExactlyOnce && self.session.incoming_qos2.contains(&pid) {
                // Acknowledged already; the broker missed our PUBREC.
                return self.send(&Packet::PubRec(ack(pid)), w);
            }
            msg.set_ack(AckToken {
                connection: self.generation,
                packet_id: pid,
                qos,
            });
            self.backlog.push_back(msg);
            return Ok(());
        }
        let number = self.delivered + self.backlog.len() as u64;
        match qos {
            QoS::AtMostOnce => self.backlog.push_back(msg),
            QoS::AtLeastOnce => {
                self.owed.push_back((number, pid, qos));
                self.backlog.push_back(msg);
            }
            QoS::ExactlyOnce => {
                if self.session.incoming_qos2.contains(&pid) {
                    // Already delivered; the broker missed our PUBREC.
                    self.send(&Packet::PubRec(ack(pid)), w)?;
                } else {
                    self.session.incoming_qos2.insert(pid);
                    self.owed.push_back((number, pid, qos));
                    self.backlog.push_back(msg);
                }
            }
        }
        Ok(())
    }

    /// Move backlog messages into the incoming queue while it has room, in
    /// one hand-over, and acknowledge each QoS 1/2 message that entered.
    fn deliver_ready(&mut self, w: &mut Writer) -> Result<(), ClientError> {
        if self.backlog.is_empty() {
            return Ok(());
        }
        let n = match self.ch.in_tx.push_from(&mut self.backlog) {
            Pushed::Moved(n) => n,
            // Nobody listens: drop (and acknowledge) the messages.
            Pushed::Closed => {
                let n = self.backlog.len();
                self.backlog.clear();
                n
            }
        };
        Stats::add(&self.ch.stats.messages_received, n as u64);
        self.delivered += n as u64;
        while let Some(&(number, pid, qos)) = self.owed.front() {
            if number >= self.delivered {
                break;
            }
            self.owed.pop_front();
            self.ack_incoming(Some((pid, qos)), w)?;
        }
        Ok(())
    }

    fn ack_incoming(&mut self, a: Option<(u16, QoS)>, w: &mut Writer) -> Result<(), ClientError> {
        match a {
            Some((pid, QoS::AtLeastOnce)) => self.send(&Packet::PubAck(ack(pid)), w),
            Some((pid, QoS::ExactlyOnce)) => self.send(&Packet::PubRec(ack(pid)), w),
            _ => Ok(()),
        }
    }
}

fn ack(packet_id: u16) -> Ack {
    Ack {
        packet_id,
        ..Default::default()
    }
}

fn complete(
    done: Option<PubDone>,
    packet_id: u16,
    reason: ReasonCode,
    properties: zerofan_codec::Props,
) {
    if let Some(d) = done {
        let _ = d.send(Ok(PublishAck {
            packet_id,
            reason,
            properties,
        }));
    }
}

fn fail_command(c: Command, e: ClientError) {
    match c {
        Command::Publish { done, .. } => {
            let _ = done.send(Err(e));
        }
        Command::Subscribe { done, .. } => {
            let _ = done.send(Err(e));
        }
        Command::Unsubscribe { done, .. } => {
            let _ = done.send(Err(e));
        }
        Command::Ack(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_bit_lands_on_the_protocol_level() {
        for (protocol, level) in [(Protocol::V311, 0x84u8), (Protocol::V5, 0x85)] {
            let opts = crate::ClientOptions::new("127.0.0.1:1").protocol(protocol);
            let plain = opts.connect_packet("id", true).unwrap();
            let mut opts = opts;
            opts.bridge = true;
            let marked = opts.connect_packet("id", true).unwrap();
            let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
            zerofan_codec::encode(&Packet::Connect(Box::new(plain)), protocol, &mut a).unwrap();
            zerofan_codec::encode(&Packet::Connect(Box::new(marked)), protocol, &mut b).unwrap();
            // 0x10, remaining length, 00 04 "MQTT", level.
            assert_eq!(&b[2..8], b"\x00\x04MQTT");
            assert_eq!(b[8], level);
            assert_eq!(a[8], level & 0x7F);
            assert_eq!(a.len(), b.len());
            assert_eq!(a[9..], b[9..]);
        }
    }
}
