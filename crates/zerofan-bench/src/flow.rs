//! The engine behind every throughput and latency scenario: publishers and
//! subscribers on their own connections, flow-controlled so that the figure
//! is sustained delivered throughput.
//!
//! Each publisher may have at most `window` messages between publish and
//! receipt: it counts what it sent, the receivers count what they got (per
//! publisher, from the sequence prefix of each payload), and a publisher
//! whose window is full sleeps until a receiver wakes it. With a fan-out of
//! N, a message counts as received once all N deliveries have arrived (in
//! aggregate). Publishers stop at the deadline or after `max_messages`;
//! the run then waits up to `drain` for the last deliveries and reports
//! whatever is still missing as lost.

use crate::conn::{self, AckKind, Conn, ConnError, Next, Reader, Writer};
use crate::payload::{self, Rng, SizeDist, Stamp};
use crate::report::{latency_of, new_histogram, CaseResult};
use hdrhistogram::Histogram;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::sleep_until;
use zerofan_codec::{Packet, Protocol, QoS};

/// How many PUBLISH packets a publisher encodes before it flushes.
const BATCH: u64 = 64;

/// Where and how to connect.
#[derive(Clone, Debug)]
pub struct Target {
    /// Broker address.
    pub addr: SocketAddr,
    /// Protocol level.
    pub protocol: Protocol,
    /// Unique prefix for client ids and topics of this invocation.
    pub run_id: String,
    /// Time allowed for each connect / subscribe handshake.
    pub handshake_timeout: Duration,
    /// Connections opened at once while setting up.
    pub connect_concurrency: usize,
    /// Loopback source addresses to spread connections over (0: let the
    /// kernel pick; see [`crate::sys::source_addr`]).
    pub sources: usize,
    /// Where the subscribers of a flow connect, when not `addr` (another
    /// node of a cluster: the messages cross a node-to-node link).
    pub sub_addr: Option<SocketAddr>,
}

impl Target {
    /// The connect options of client number `i`: default fields, its
    /// source address picked from `sources`.
    pub fn opts(&self, i: usize) -> conn::ConnectOpts {
        conn::ConnectOpts {
            source: crate::sys::source_addr(self.addr, i, self.sources),
            ..conn::ConnectOpts::default()
        }
    }
}

/// One publisher of a flow.
#[derive(Clone, Debug)]
pub struct PubSpec {
    /// Topic it publishes to.
    pub topic: String,
    /// Message sizes.
    pub sizes: SizeDist,
    /// Deliveries each of its messages should produce.
    pub fanout: u64,
}

/// One subscriber of a flow.
#[derive(Clone, Debug)]
pub struct SubSpec {
    /// Topic filters it subscribes to.
    pub filters: Vec<String>,
}

/// A complete flow: who publishes, who subscribes, and the bounds.
#[derive(Clone, Debug)]
pub struct FlowSpec {
    /// Scenario name for the report.
    pub scenario: String,
    /// Case description for the report.
    pub case: String,
    /// The publishers.
    pub publishers: Vec<PubSpec>,
    /// The subscribers.
    pub subscribers: Vec<SubSpec>,
    /// QoS of publications and subscriptions.
    pub qos: QoS,
    /// Messages in flight per publisher between publish and receipt.
    pub window: u64,
    /// Publishing stops after this long.
    pub duration: Duration,
    /// Publishing stops after this many messages per publisher.
    pub max_messages: u64,
    /// How long to wait for late deliveries after publishing stops.
    pub drain: Duration,
    /// Subscribers share their messages ($share): no per-receiver order check.
    pub shared: bool,
}

/// Per-publisher counters shared with the receivers.
struct PubState {
    sent: AtomicU64,
    delivered: AtomicU64,
    notify: Notify,
}

/// What one receiver counted.
struct RecvStats {
    received: u64,
    bytes: u64,
    duplicates: u64,
    foreign: u64,
    last_ns: u64,
    /// Latencies of the buffer being drained, recorded into the run's one
    /// histogram afterwards in one go.
    lat: Vec<u64>,
}

/// The run's latency histogram, shared by its subscribers. One rather than
/// one per subscriber: 100 histograms of 3 significant digits, touched at
/// random slots by every delivery, missed the CPU cache on each record
/// (a fifth of the load generator's time in fan-out to 100).
type SharedHist = Arc<std::sync::Mutex<Histogram<u64>>>;

/// Open one connection per entry of `filters`, at most
/// `target.connect_concurrency` at a time, with client ids
/// `{run_id}-{role}{i}`; each subscribes to its filters (if any) at `qos`.
pub async fn connect_many(
    target: &Target,
    role: &str,
    filters: Vec<Vec<String>>,
    qos: QoS,
) -> Result<Vec<Conn>, ConnError> {
    let sem = Arc::new(Semaphore::new(target.connect_concurrency.max(1)));
    let mut handles = Vec::with_capacity(filters.len());
    for (i, f) in filters.into_iter().enumerate() {
        let sem = sem.clone();
        let id = format!("{}-{role}{i}", target.run_id);
        let (addr, protocol, t) = (target.addr, target.protocol, target.handshake_timeout);
        let opts = target.opts(i);
        handles.push(tokio::spawn(async move {
            let _permit = sem.acquire_owned().await;
            let mut c = conn::connect_with(addr, &id, protocol, t, &opts).await?;
            if !f.is_empty() {
                c.subscribe(&f, qos, t).await?;
            }
            Ok::<Conn, ConnError>(c)
        }));
    }
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        match h.await {
            Ok(r) => out.push(r?),
            Err(e) => return Err(ConnError::Protocol(format!("connect task failed: {e}"))),
        }
    }
    Ok(out)
}

/// Run one flow to completion and report it. Never panics on network data;
/// setup errors become a failed case.
pub async fn run(target: &Target, spec: &FlowSpec) -> CaseResult {
    match run_inner(target, spec).await {
        Ok(r) => r,
        Err(e) => CaseResult::failed(&spec.scenario, &spec.case, e.to_string()),
    }
}

async fn run_inner(target: &Target, spec: &FlowSpec) -> Result<CaseResult, ConnError> {
    // Subscribers first, all subscribed before anyone publishes.
    let filters = spec.subscribers.iter().map(|s| s.filters.clone()).collect();
    let at = Target {
        addr: target.sub_addr.unwrap_or(target.addr),
        ..target.clone()
    };
    let subs = connect_many(&at, &format!("{}-s", spec.scenario), filters, spec.qos).await?;
    let none = vec![Vec::new(); spec.publishers.len()];
    let pubs = connect_many(target, &format!("{}-p", spec.scenario), none, spec.qos).await?;
    // Give brokers with an asynchronous router a moment to install the routes.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let states: Arc<Vec<PubState>> = Arc::new(
        spec.publishers
            .iter()
            .map(|_| PubState {
                sent: AtomicU64::new(0),
                delivered: AtomicU64::new(0),
                notify: Notify::new(),
            })
            .collect(),
    );
    let epoch = Instant::now();
    let (stop_tx, stop_rx) = watch::channel(false);

    let run_hist: SharedHist = Arc::new(std::sync::Mutex::new(new_histogram()));
    let mut recv_handles = Vec::with_capacity(subs.len());
    for c in subs {
        let states = states.clone();
        let stop = stop_rx.clone();
        let shared = spec.shared;
        let hist = run_hist.clone();
        recv_handles.push(tokio::spawn(async move {
            receive(c, states, epoch, stop, shared, hist).await
        }));
    }

    let max_size = spec
        .publishers
        .iter()
        .map(|p| p.sizes.max())
        .max()
        .unwrap_or(64);
    let filler = payload::filler(max_size);
    let deadline = tokio::time::Instant::from_std(epoch + spec.duration);
    let drain_deadline = deadline + spec.drain;
    let mut pub_handles = Vec::with_capacity(pubs.len());
    for (i, (c, p)) in pubs.into_iter().zip(&spec.publishers).enumerate() {
        let job = PublishJob {
            index: i as u32,
            topic: p.topic.clone(),
            sizes: p.sizes.clone(),
            fanout: p.fanout.max(1),
            qos: spec.qos,
            window: spec.window.max(1),
            max_messages: spec.max_messages,
            deadline,
            drain_deadline,
            filler: filler.clone(),
            epoch,
        };
        let states = states.clone();
        pub_handles.push(tokio::spawn(async move { publish(c, job, states).await }));
    }

    // Publishers return their connections: keep them open until the
    // receivers are done, so a broker that delivers on PUBREL still can.
    let mut kept = Vec::new();
    let mut first_error: Option<String> = None;
    for h in pub_handles {
        match h.await {
            Ok(Ok(c)) => kept.push(c),
            Ok(Err(e)) => {
                first_error.get_or_insert_with(|| format!("publisher: {e}"));
            }
            Err(e) => {
                first_error.get_or_insert_with(|| format!("publisher task: {e}"));
            }
        }
    }
    let publish_end = Instant::now();
    let expected_of = |states: &[PubState], specs: &[PubSpec]| -> u64 {
        states
            .iter()
            .zip(specs)
            .map(|(s, p)| s.sent.load(Ordering::Acquire) * p.fanout.max(1))
            .sum()
    };
    let expected = expected_of(&states, &spec.publishers);
    // Drain: wait until every expected delivery arrived or the drain ends.
    let drain_until = publish_end.max(epoch + spec.duration) + spec.drain;
    loop {
        let got: u64 = states
            .iter()
            .map(|s| s.delivered.load(Ordering::Acquire))
            .sum();
        if got >= expected || Instant::now() >= drain_until {
            break;
        }
        if recv_handles.iter().all(|h| h.is_finished()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let _ = stop_tx.send(true);

    let (mut received, mut bytes, mut dups, mut foreign, mut last_ns) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    for h in recv_handles {
        match h.await {
            Ok(Ok(s)) => {
                received += s.received;
                bytes += s.bytes;
                dups += s.duplicates;
                foreign += s.foreign;
                last_ns = last_ns.max(s.last_ns);
            }
            Ok(Err(e)) => {
                first_error.get_or_insert_with(|| format!("subscriber: {e}"));
            }
            Err(e) => {
                first_error.get_or_insert_with(|| format!("subscriber task: {e}"));
            }
        }
    }
    for c in kept {
        c.writer.disconnect().await;
    }

    let sent: u64 = states.iter().map(|s| s.sent.load(Ordering::Acquire)).sum();
    let unique = received.saturating_sub(dups);
    let lost = expected.saturating_sub(unique);
    let seconds = last_ns as f64 / 1e9;
    let (rate, mib) = if seconds > 0.0 {
        (
            received as f64 / seconds,
            bytes as f64 / seconds / (1 << 20) as f64,
        )
    } else {
        (0.0, 0.0)
    };
    let mut notes = Vec::new();
    if foreign > 0 {
        notes.push(format!("{foreign} messages without a known stamp"));
    }
    let latency = latency_of(&run_hist.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(CaseResult {
        scenario: spec.scenario.clone(),
        case: spec.case.clone(),
        sent,
        expected,
        received,
        lost,
        duplicates: dups,
        seconds,
        msgs_per_s: rate,
        mib_per_s: mib,
        latency,
        metrics: Vec::new(),
        notes,
        error: first_error,
    })
}

/// Everything a publisher task needs.
struct PublishJob {
    index: u32,
    topic: String,
    sizes: SizeDist,
    fanout: u64,
    qos: QoS,
    window: u64,
    max_messages: u64,
    deadline: tokio::time::Instant,
    drain_deadline: tokio::time::Instant,
    filler: bytes::Bytes,
    epoch: Instant,
}

/// Packet identifiers for QoS 1/2 in flight.
struct Ids {
    free: Vec<u16>,
    capacity: usize,
}

impl Ids {
    fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, 65_535);
        Ids {
            free: (1..=capacity as u16).rev().collect(),
            capacity,
        }
    }
    fn in_flight(&self) -> usize {
        self.capacity - self.free.len()
    }
}

/// Publish until the deadline or the message cap, within the window; then,
/// at QoS 1/2, wait (up to the drain deadline) for the acks of what is in
/// flight. Returns the connection so the caller decides when to close it.
async fn publish(
    mut c: Conn,
    job: PublishJob,
    states: Arc<Vec<PubState>>,
) -> Result<Conn, ConnError> {
    let state = &states[job.index as usize];
    if let Some(max) = c.maximum_packet_size() {
        // Fixed header, topic and id: well under 1 KiB for our topics.
        if (job.sizes.max() + job.topic.len() + 16) as u64 > u64::from(max) {
            return Err(ConnError::Protocol(format!(
                "the broker's Maximum Packet Size is {max} bytes, below the {} byte messages of this case",
                job.sizes.max()
            )));
        }
    }
    let qos_window = match job.qos {
        QoS::AtMostOnce => usize::MAX,
        _ => (job.window as usize).min(c.receive_maximum() as usize),
    };
    let mut ids = Ids::new(if job.qos == QoS::AtMostOnce {
        1
    } else {
        qos_window
    });
    let mut rng = Rng::new(0x5EED ^ u64::from(job.index));
    let mut seq: u64 = 0;
    loop {
        // Acks first: they free packet ids.
        while let Some(p) = c.reader.try_next()? {
            handle_publisher_packet(p, &mut ids, &mut c.writer)?;
        }
        let now = tokio::time::Instant::now();
        let stopping = now >= job.deadline || seq >= job.max_messages;
        if stopping {
            c.writer.flush().await?;
            if ids.in_flight() == 0 || now >= job.drain_deadline {
                break;
            }
            tokio::select! {
                r = c.reader.fill() => r?,
                _ = sleep_until(job.drain_deadline) => {}
            }
            continue;
        }
        let free_ids = if job.qos == QoS::AtMostOnce {
            u64::MAX
        } else {
            ids.free.len() as u64
        };
        let credit = credit(
            seq,
            state.delivered.load(Ordering::Acquire),
            job.fanout,
            job.window,
            job.max_messages - seq,
            free_ids,
        );
        if credit > 0 {
            for _ in 0..credit {
                let size = job.sizes.size(seq, &mut rng);
                let body = payload::body(&job.filler, size);
                let stamp = Stamp {
                    publisher: job.index,
                    seq,
                    sent_ns: job.epoch.elapsed().as_nanos() as u64,
                };
                let id = if job.qos == QoS::AtMostOnce {
                    0
                } else {
                    ids.free.pop().unwrap_or(1)
                };
                c.writer
                    .publish(&job.topic, job.qos, id, &stamp.encode(), &body)
                    .await?;
                seq += 1;
                state.sent.store(seq, Ordering::Release);
            }
            c.writer.flush().await?;
            continue;
        }
        c.writer.flush().await?;
        tokio::select! {
            r = c.reader.fill() => r?,
            _ = state.notify.notified() => {}
            _ = sleep_until(job.deadline) => {}
        }
    }
    Ok(c)
}

/// How many messages a publisher may send now: what its window allows given
/// the deliveries counted so far (`sent * fanout - delivered` deliveries are
/// outstanding, at most `window * fanout`), capped by the messages left, the
/// free packet ids and one write batch.
fn credit(sent: u64, delivered: u64, fanout: u64, window: u64, left: u64, free_ids: u64) -> u64 {
    let fanout = fanout.max(1);
    let outstanding = (sent * fanout).saturating_sub(delivered);
    let room = (window * fanout).saturating_sub(outstanding) / fanout;
    room.min(left).min(free_ids).min(BATCH)
}

fn handle_publisher_packet(p: Packet, ids: &mut Ids, writer: &mut Writer) -> Result<(), ConnError> {
    match p {
        Packet::PubAck(a) | Packet::PubComp(a) => {
            if ids.free.len() < ids.capacity {
                ids.free.push(a.packet_id);
            }
        }
        Packet::PubRec(a) => {
            if a.reason.is_error() {
                // The broker refused the message: the id is free again.
                if ids.free.len() < ids.capacity {
                    ids.free.push(a.packet_id);
                }
            } else {
                writer.push_ack(AckKind::Rel, a.packet_id)?;
            }
        }
        Packet::PingResp | Packet::Publish(_) => {}
        Packet::Disconnect(d) => {
            return Err(ConnError::Protocol(format!(
                "broker disconnected the publisher with code {:#04x}",
                d.reason.0
            )))
        }
        other => {
            return Err(ConnError::Protocol(format!(
                "unexpected {} on a publisher",
                conn::packet_name(&other)
            )))
        }
    }
    Ok(())
}

/// Count deliveries until told to stop; acknowledge QoS 1/2.
async fn receive(
    c: Conn,
    states: Arc<Vec<PubState>>,
    epoch: Instant,
    mut stop: watch::Receiver<bool>,
    shared: bool,
    hist: SharedHist,
) -> Result<RecvStats, ConnError> {
    let Conn {
        mut reader,
        mut writer,
        ..
    } = c;
    let n = states.len();
    let mut next_seq = vec![0u64; n];
    let mut batch = vec![0u64; n];
    let mut touched: Vec<usize> = Vec::with_capacity(n);
    let mut st = RecvStats {
        received: 0,
        bytes: 0,
        duplicates: 0,
        foreign: 0,
        last_ns: 0,
        lat: Vec::new(),
    };
    loop {
        if *stop.borrow() {
            break;
        }
        tokio::select! {
            _ = stop.changed() => break,
            r = reader.fill() => r?,
        }
        let now_ns = epoch.elapsed().as_nanos() as u64;
        drain_buffer(
            &mut reader,
            &mut writer,
            &mut st,
            now_ns,
            &mut next_seq,
            &mut batch,
            &mut touched,
            shared,
        )?;
        if !st.lat.is_empty() {
            let mut h = hist.lock().unwrap_or_else(|e| e.into_inner());
            for &v in &st.lat {
                let _ = h.record(v);
            }
            drop(h);
            st.lat.clear();
        }
        for &i in &touched {
            states[i].delivered.fetch_add(batch[i], Ordering::AcqRel);
            states[i].notify.notify_one();
            batch[i] = 0;
        }
        touched.clear();
        if writer.pending() > 0 {
            writer.flush().await?;
        }
    }
    writer.disconnect().await;
    Ok(st)
}

#[allow(clippy::too_many_arguments)]
fn drain_buffer(
    reader: &mut Reader,
    writer: &mut Writer,
    st: &mut RecvStats,
    now_ns: u64,
    next_seq: &mut [u64],
    batch: &mut [u64],
    touched: &mut Vec<usize>,
    shared: bool,
) -> Result<(), ConnError> {
    while let Some(p) = reader.try_next_seen(|payload| (Stamp::decode(payload), payload.len()))? {
        match p {
            Next::Publish {
                qos,
                packet_id,
                seen: (stamp, len),
            } => {
                match qos {
                    QoS::AtMostOnce => {}
                    QoS::AtLeastOnce => writer.push_ack(AckKind::Ack, packet_id)?,
                    QoS::ExactlyOnce => writer.push_ack(AckKind::Rec, packet_id)?,
                }
                let Some(stamp) = stamp else {
                    st.foreign += 1;
                    continue;
                };
                let i = stamp.publisher as usize;
                if i >= batch.len() {
                    st.foreign += 1;
                    continue;
                }
                st.received += 1;
                st.bytes += len as u64;
                st.last_ns = now_ns;
                st.lat.push(now_ns.saturating_sub(stamp.sent_ns).max(1));
                if !shared {
                    if stamp.seq < next_seq[i] {
                        st.duplicates += 1;
                    } else {
                        next_seq[i] = stamp.seq + 1;
                    }
                }
                if batch[i] == 0 {
                    touched.push(i);
                }
                batch[i] += 1;
            }
            Next::Other(Packet::PubRel(a)) => writer.push_ack(AckKind::Comp, a.packet_id)?,
            Next::Other(Packet::PingResp | Packet::PubAck(_) | Packet::PubComp(_)) => {}
            Next::Other(Packet::Disconnect(d)) => {
                return Err(ConnError::Protocol(format!(
                    "broker disconnected a subscriber with code {:#04x}",
                    d.reason.0
                )))
            }
            Next::Other(other) => {
                return Err(ConnError::Protocol(format!(
                    "unexpected {} on a subscriber",
                    conn::packet_name(&other)
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use zerofan_codec::{decode, encode, frame, ConnAck, Frame, ReasonCode, SubAck};

    /// A toy broker for tests: QoS 0 only, exact topic match, and every
    /// `drop_every`-th PUBLISH (if non-zero) is silently dropped.
    async fn toy_broker(drop_every: u64) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        type Subs = Arc<Mutex<Vec<(String, mpsc::UnboundedSender<Packet>)>>>;
        let subs: Subs = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicU64::new(0));
        tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let (subs, count) = (subs.clone(), count.clone());
                tokio::spawn(async move {
                    let (mut rd, mut wr) = sock.into_split();
                    let (tx, mut rx) = mpsc::unbounded_channel::<Packet>();
                    tokio::spawn(async move {
                        let mut out = BytesMut::new();
                        while let Some(p) = rx.recv().await {
                            out.clear();
                            encode(&p, Protocol::V311, &mut out).unwrap();
                            if wr.write_all(&out).await.is_err() {
                                return;
                            }
                        }
                    });
                    let mut buf = BytesMut::new();
                    loop {
                        while let Frame::Complete(n) = frame(&buf, conn::MAX_PACKET) {
                            let p = decode(buf.split_to(n).freeze(), Protocol::V311).unwrap();
                            match p {
                                Packet::Connect(_) => {
                                    let _ = tx.send(Packet::ConnAck(ConnAck::default()));
                                }
                                Packet::Subscribe(s) => {
                                    for (f, _) in &s.filters {
                                        subs.lock().unwrap().push((f.to_string(), tx.clone()));
                                    }
                                    let _ = tx.send(Packet::SubAck(SubAck {
                                        packet_id: s.packet_id,
                                        reasons: vec![ReasonCode::GRANTED_QOS_0; s.filters.len()],
                                        ..SubAck::default()
                                    }));
                                }
                                Packet::Publish(p) => {
                                    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
                                    if drop_every > 0 && n % drop_every == 0 {
                                        continue;
                                    }
                                    for (f, s) in subs.lock().unwrap().iter() {
                                        if *f == *p.topic {
                                            let _ = s.send(Packet::Publish(p.clone()));
                                        }
                                    }
                                }
                                _ => {}
                            }
                        }
                        if rd.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn spec(max_messages: u64, duration: Duration) -> FlowSpec {
        FlowSpec {
            scenario: "test".into(),
            case: "2x2".into(),
            publishers: (0..2)
                .map(|i| PubSpec {
                    topic: format!("t/{i}"),
                    sizes: SizeDist::Fixed(100),
                    fanout: 2,
                })
                .collect(),
            subscribers: vec![
                SubSpec {
                    filters: vec!["t/0".into(), "t/1".into()],
                },
                SubSpec {
                    filters: vec!["t/0".into(), "t/1".into()],
                },
            ],
            qos: QoS::AtMostOnce,
            window: 8,
            duration,
            max_messages,
            drain: Duration::from_millis(300),
            shared: false,
        }
    }

    fn target(addr: SocketAddr) -> Target {
        Target {
            addr,
            sub_addr: None,
            protocol: Protocol::V311,
            run_id: "test".into(),
            handshake_timeout: Duration::from_secs(5),
            connect_concurrency: 4,
            // Spread over two source addresses: binding before connect is
            // on the path these tests drive.
            sources: 2,
        }
    }

    #[tokio::test]
    async fn every_message_is_counted_once() {
        let addr = toy_broker(0).await;
        let r = run(&target(addr), &spec(500, Duration::from_secs(10))).await;
        assert_eq!(r.error, None);
        assert_eq!(r.sent, 1000);
        assert_eq!(r.expected, 2000);
        assert_eq!(r.received, 2000);
        assert_eq!((r.lost, r.duplicates), (0, 0));
        assert!(r.msgs_per_s > 0.0);
        assert_eq!(r.latency.map(|l| l.count), Some(2000));
    }

    #[tokio::test]
    async fn losses_are_reported_and_the_run_still_ends() {
        let addr = toy_broker(7).await;
        let started = Instant::now();
        let r = run(&target(addr), &spec(1_000_000, Duration::from_millis(500))).await;
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(r.error, None);
        assert!(r.lost > 0, "{r:?}");
        assert_eq!(r.received + r.lost, r.expected);
        // The window stalls the publishers once enough messages are lost.
        assert!(r.sent < 1000, "{}", r.sent);
    }

    #[test]
    fn credit_follows_the_window() {
        // Nothing sent: a full window, capped by one batch.
        assert_eq!(credit(0, 0, 1, 16, 1000, u64::MAX), 16);
        assert_eq!(credit(0, 0, 1, 1000, 1000, u64::MAX), BATCH);
        // 10 sent, 4 received: 6 outstanding of 16.
        assert_eq!(credit(10, 4, 1, 16, 1000, u64::MAX), 10);
        // Fan-out 10: a message frees its slot only once all 10 deliveries
        // arrived (in aggregate).
        assert_eq!(credit(16, 9, 10, 16, 1000, u64::MAX), 0);
        assert_eq!(credit(16, 10, 10, 16, 1000, u64::MAX), 1);
        assert_eq!(credit(16, 159, 10, 16, 1000, u64::MAX), 15);
        assert_eq!(credit(16, 160, 10, 16, 1000, u64::MAX), 16);
        // Message cap and packet ids.
        assert_eq!(credit(0, 0, 1, 16, 3, u64::MAX), 3);
        assert_eq!(credit(0, 0, 1, 16, 1000, 2), 2);
        // Window of one: ping-pong.
        assert_eq!(credit(1, 0, 1, 1, 1000, u64::MAX), 0);
        assert_eq!(credit(1, 1, 1, 1, 1000, u64::MAX), 1);
        // More deliveries than expected (duplicates) never overflow.
        assert_eq!(credit(1, 5, 1, 4, 1000, u64::MAX), 4);
    }

    #[test]
    fn ids_hand_out_and_take_back() {
        let mut ids = Ids::new(3);
        assert_eq!(ids.in_flight(), 0);
        let a = ids.free.pop().unwrap();
        let b = ids.free.pop().unwrap();
        assert_eq!((a, b), (1, 2));
        assert_eq!(ids.in_flight(), 2);
        ids.free.push(a);
        assert_eq!(ids.in_flight(), 1);
        assert_eq!(Ids::new(100_000).capacity, 65_535);
    }
}
