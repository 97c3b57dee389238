//! The real-time half of a capture, as a pure struct: [`Packetizer`] turns
//! the arbitrary sample slices an audio callback delivers into fixed-size
//! packets in pooled buffers, and [`PacketReceiver`] is the other end.
//!
//! ```text
//!  audio callback (real-time thread)              consumer (pump thread)
//!  ┌──────────────┐   full packets (SPSC ring)   ┌────────────────┐
//!  │  Packetizer  │ ───────────────────────────▶ │ PacketReceiver │──▶ Packet
//!  │              │ ◀─────────────────────────── │  refill from   │
//!  └──────────────┘   empty buffers (SPSC ring)  │  the Pool      │
//!                                                └────────────────┘
//! ```
//!
//! Why two rings: the callback must never allocate, lock or wait. Taking a
//! buffer from the [`Pool`] can take a mutex (a thread-cache refill) or
//! allocate (a miss), so the callback never touches the pool. The consumer
//! gets buffers from the pool and pushes them into the "empty" ring; the
//! callback pops one per packet, copies samples into it (the one copy),
//! writes the wire header in front, and pushes it into the "full" ring.
//! Both rings are bounded wait-free SPSC queues ([`rtrb`]). When the full
//! ring is full (consumer too slow) the packet is dropped and its buffer
//! reused for the next one; when the empty ring is empty the packet's
//! samples are skipped. Either way the drop is counted and the packet's
//! `seq` is used up, so listeners see the gap.
//!
//! Everything here is plain data moved by method calls: the allocation
//! test drives it with synthetic slices under a counting allocator.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::Thread;

use bytes::Bytes;
use zerofan_pool::{Pool, PooledBuf};

use crate::format::{PacketInfo, SampleFormat, StreamParams};
use crate::header::{encode_header, HEADER_LEN};

/// One captured packet: the wire header followed by the samples, in one
/// pooled buffer that returns to its pool when the packet (or the last
/// `Bytes` made from it) drops.
pub struct Packet {
    buf: PooledBuf,
    info: PacketInfo,
    frames: u32,
}

impl std::fmt::Debug for Packet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packet")
            .field("info", &self.info)
            .field("frames", &self.frames)
            .field("bytes", &self.samples().len())
            .finish()
    }
}

impl Packet {
    /// Sequence number, timestamp and format.
    pub fn info(&self) -> &PacketInfo {
        &self.info
    }

    /// Frames in the packet.
    pub fn frames(&self) -> u32 {
        self.frames
    }

    /// The interleaved little-endian samples (what Node's `data` event
    /// hands out).
    pub fn samples(&self) -> &[u8] {
        self.buf.get(HEADER_LEN..).unwrap_or(&[])
    }

    /// Header and samples, as published (see [`crate::header`]).
    pub fn wire(&self) -> &[u8] {
        &self.buf
    }

    /// Header and samples as `Bytes`, without copying. Costs one small
    /// allocation (the `Bytes` owner header); the pooled memory returns
    /// when the last clone drops.
    pub fn into_wire_bytes(self) -> Bytes {
        self.buf.freeze()
    }

    /// The samples alone as `Bytes`, without copying (see
    /// [`into_wire_bytes`](Self::into_wire_bytes)).
    pub fn into_sample_bytes(self) -> Bytes {
        self.buf.freeze().slice(HEADER_LEN..)
    }

    /// The pooled buffer itself: [`HEADER_LEN`] header bytes, then the
    /// samples. For a binding that makes its own external buffer over the
    /// memory (no `Bytes` allocation): point it at `&buf[HEADER_LEN..]` and
    /// drop `buf` in the finalizer.
    pub fn into_pooled(self) -> PooledBuf {
        self.buf
    }
}

/// Counters shared by the real-time side, the consumer and the stats
/// snapshot. Relaxed atomics: each is an independent tally.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Packets completed by the packetizer (delivered + dropped).
    pub captured: AtomicU64,
    /// Packets pushed to the consumer queue.
    pub queued: AtomicU64,
    /// Packets dropped because the consumer queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Packets dropped because no empty buffer was ready.
    pub dropped_no_buffer: AtomicU64,
    /// Packets taken by the consumer and handed to the sink.
    pub delivered: AtomicU64,
    /// Packets the sink refused (its own bounded queue was full).
    pub dropped_by_sink: AtomicU64,
    /// Frames seen by the packetizer.
    pub frames: AtomicU64,
    /// Calls to `Packetizer::push` (device callbacks).
    pub callbacks: AtomicU64,
    /// Most frames in one callback (how bursty the backend delivers).
    pub max_callback_frames: AtomicU64,
    /// Errors reported by the audio backend (xruns included).
    pub errors: AtomicU64,
    /// Of those, overruns/underruns.
    pub xruns: AtomicU64,
}

/// Adds one to a counter. Only one thread writes each of the real-time
/// counters, but a fetch_add keeps them right even if that changes.
#[inline]
pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Relaxed);
}

/// A sample type the packetizer accepts from a callback.
pub trait InputSample: Copy + Send + 'static {
    /// As a 16-bit integer sample.
    fn to_i16(self) -> i16;
    /// As a float sample in [-1, 1].
    fn to_f32(self) -> f32;
}

impl InputSample for i16 {
    #[inline]
    fn to_i16(self) -> i16 {
        self
    }
    #[inline]
    fn to_f32(self) -> f32 {
        f32::from(self) / 32768.0
    }
}

impl InputSample for f32 {
    #[inline]
    fn to_i16(self) -> i16 {
        // Saturating: the cast clamps out-of-range floats and maps NaN to 0.
        (self * 32767.0).round() as i16
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
}

/// Writes `src` into `dst` (exactly `src.len() * bytes_per_sample` bytes)
/// in `format`, little-endian.
#[inline]
fn write_samples<S: InputSample>(src: &[S], format: SampleFormat, dst: &mut [u8]) {
    match format {
        SampleFormat::I16 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
                d.copy_from_slice(&s.to_i16().to_le_bytes());
            }
        }
        SampleFormat::F32 => {
            for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
                d.copy_from_slice(&s.to_f32().to_le_bytes());
            }
        }
    }
}

/// Cuts a stream of interleaved samples into packets of
/// [`StreamParams::frames_per_packet`] frames in pooled buffers. Lives on
/// the audio callback's thread; never allocates, locks or blocks (see the
/// module docs and `tests/no_alloc.rs`).
pub struct Packetizer {
    params: StreamParams,
    free: rtrb::Consumer<PooledBuf>,
    out: rtrb::Producer<Packet>,
    /// The buffer being filled (header room already reserved), if any.
    cur: Option<PooledBuf>,
    /// Frames of the current packet seen so far (even without a buffer).
    frames_in_cur: u32,
    /// Timestamp of the current packet's first frame.
    cur_ts: u64,
    seq: u64,
    counters: Arc<Counters>,
    /// Woken (futex wake, no allocation) when a packet is queued.
    notify: Option<Thread>,
}

impl std::fmt::Debug for Packetizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packetizer")
            .field("params", &self.params)
            .field("seq", &self.seq)
            .field("frames_in_cur", &self.frames_in_cur)
            .finish()
    }
}

impl Packetizer {
    /// The stream parameters packets are cut with.
    pub fn params(&self) -> &StreamParams {
        &self.params
    }

    /// Sets the thread to unpark whenever a packet is queued (the consumer
    /// parks while it waits). `Thread::unpark` is an atomic swap plus, only
    /// if that thread is parked, one futex wake: no lock, no allocation.
    pub fn set_notify(&mut self, thread: Option<Thread>) {
        self.notify = thread;
    }

    /// Feeds interleaved samples captured at `capture_ns` (the time of the
    /// first frame in `samples`, on the stream clock). A trailing partial
    /// frame, which no backend delivers, is ignored.
    pub fn push<S: InputSample>(&mut self, samples: &[S], capture_ns: u64) {
        let ch = usize::from(self.params.channels.max(1));
        let fpp = self.params.frames_per_packet;
        let bps = self.params.format.bytes_per_sample();
        let total = samples.len() / ch;
        bump(&self.counters.frames, total as u64);
        bump(&self.counters.callbacks, 1);
        self.counters
            .max_callback_frames
            .fetch_max(total as u64, Relaxed);
        let mut done = 0usize;
        while done < total {
            if self.frames_in_cur == 0 {
                self.start_packet(capture_ns.wrapping_add(self.params.frames_to_ns(done as u64)));
            }
            let n = (total - done).min((fpp - self.frames_in_cur) as usize);
            if let Some(buf) = self.cur.as_mut() {
                let src = &samples[done * ch..(done + n) * ch];
                let len = src.len() * bps;
                if let Some(dst) = buf.unfilled_mut().get_mut(..len) {
                    write_samples(src, self.params.format, dst);
                    buf.advance(len);
                }
            }
            self.frames_in_cur += n as u32;
            done += n;
            if self.frames_in_cur == fpp {
                self.finish_packet();
            }
        }
    }

    fn start_packet(&mut self, ts: u64) {
        // Backends derive callback timestamps from latency estimates that
        // jitter: never less than the sample clock predicts from the last
        // packet (`cur_ts` still holds its start here), see PacketInfo.
        self.cur_ts = if self.seq == 0 {
            ts
        } else {
            let packet_ns = self
                .params
                .frames_to_ns(u64::from(self.params.frames_per_packet));
            ts.max(self.cur_ts.saturating_add(packet_ns))
        };
        if self.cur.is_none() {
            self.cur = self.free.pop().ok();
        }
        if let Some(buf) = self.cur.as_mut() {
            buf.clear();
            // Room for the header, written when the packet is complete. The
            // receiver only hands out buffers of at least header + packet
            // bytes, so this fits; `get` keeps a broken invariant from
            // panicking on the real-time thread.
            if buf.remaining_capacity() >= HEADER_LEN + self.params.packet_bytes() {
                buf.advance(HEADER_LEN);
            }
        }
    }

    fn finish_packet(&mut self) {
        let info = PacketInfo {
            seq: self.seq,
            timestamp_ns: self.cur_ts,
            sample_rate: self.params.sample_rate,
            channels: self.params.channels,
            format: self.params.format,
        };
        self.seq += 1;
        self.frames_in_cur = 0;
        bump(&self.counters.captured, 1);
        let full = HEADER_LEN + self.params.packet_bytes();
        let Some(mut buf) = self.cur.take() else {
            bump(&self.counters.dropped_no_buffer, 1);
            return;
        };
        if buf.len() != full {
            // Cannot happen (see start_packet); drop rather than send junk.
            bump(&self.counters.dropped_no_buffer, 1);
            self.cur = Some(buf);
            return;
        }
        encode_header(&info, self.params.frames_per_packet, &mut buf);
        let packet = Packet {
            buf,
            info,
            frames: self.params.frames_per_packet,
        };
        match self.out.push(packet) {
            Ok(()) => {
                bump(&self.counters.queued, 1);
                if let Some(t) = &self.notify {
                    t.unpark();
                }
            }
            Err(rtrb::PushError::Full(packet)) => {
                // Consumer too slow: drop this packet, keep its buffer for
                // the next one (no trip through the pool).
                bump(&self.counters.dropped_queue_full, 1);
                self.cur = Some(packet.buf);
            }
        }
    }
}

/// The consumer end of a [`Packetizer`]: takes finished packets and keeps
/// the packetizer supplied with empty pooled buffers.
pub struct PacketReceiver {
    rx: rtrb::Consumer<Packet>,
    free: rtrb::Producer<PooledBuf>,
    pool: Pool,
    buf_size: usize,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for PacketReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketReceiver")
            .field("queued", &self.rx.slots())
            .field("buf_size", &self.buf_size)
            .finish()
    }
}

impl PacketReceiver {
    /// The next finished packet, if one is queued. Tops the empty-buffer
    /// ring back up first (pool gets: hits in steady state).
    pub fn try_recv(&mut self) -> Option<Packet> {
        self.refill();
        self.rx.pop().ok()
    }

    /// The next finished packet without refilling (for draining at the end).
    pub fn drain_one(&mut self) -> Option<Packet> {
        self.rx.pop().ok()
    }

    /// Finished packets waiting.
    pub fn queued(&self) -> usize {
        self.rx.slots()
    }

    /// Fills the empty-buffer ring from the pool.
    pub fn refill(&mut self) {
        while self.free.slots() > 0 {
            if self.free.push(self.pool.get(self.buf_size)).is_err() {
                break;
            }
        }
    }

    /// The pool the buffers come from.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub(crate) fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}

/// A connected [`Packetizer`] / [`PacketReceiver`] pair for `params`, with
/// `queue_packets` slots in each ring. Warms the pool up with enough
/// buffers for both rings and the packet being filled, and fills the
/// empty-buffer ring, so the first packets are pool hits.
pub fn packet_channel(
    params: StreamParams,
    pool: Pool,
    queue_packets: usize,
) -> (Packetizer, PacketReceiver) {
    let queue = queue_packets.max(2);
    let buf_size = HEADER_LEN + params.packet_bytes();
    let counters = Arc::new(Counters::default());
    let (tx, rx) = rtrb::RingBuffer::new(queue);
    // Two spare empty buffers beyond the packet queue: a stalled consumer
    // then shows up as "queue full" drops (the packetizer keeps reusing its
    // current buffer), and "no buffer" drops mean buffers are held
    // elsewhere without the receiver refilling.
    let (free_tx, free_rx) = rtrb::RingBuffer::new(queue + 2);
    pool.warm_up(buf_size, 2 * queue + 6);
    let mut receiver = PacketReceiver {
        rx,
        free: free_tx,
        pool,
        buf_size,
        counters: counters.clone(),
    };
    receiver.refill();
    let packetizer = Packetizer {
        params,
        free: free_rx,
        out: tx,
        cur: None,
        frames_in_cur: 0,
        cur_ts: 0,
        seq: 0,
        counters,
        notify: None,
    };
    (packetizer, receiver)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header::decode_packet;
    use zerofan_pool::PoolConfig;

    fn params(format: SampleFormat, channels: u16, fpp: u32) -> StreamParams {
        StreamParams {
            sample_rate: 48_000,
            channels,
            format,
            frames_per_packet: fpp,
        }
    }

    #[test]
    fn arbitrary_slices_make_whole_packets_in_order() {
        let p = params(SampleFormat::I16, 2, 480);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 16);
        // 2000 frames of a ramp in odd-sized callbacks.
        let samples: Vec<i16> = (0..4000).map(|i| i as i16).collect();
        let mut at = 0;
        for (k, chunk) in [7usize, 333, 480, 1, 999, 180].iter().cycle().enumerate() {
            if at >= samples.len() {
                break;
            }
            let end = (at + chunk * 2).min(samples.len());
            pk.push(&samples[at..end], (k as u64) * 1000);
            at = end;
        }
        let mut expect = 0i16;
        for seq in 0..4u64 {
            let pkt = rx.try_recv().expect("packet");
            assert_eq!(pkt.info().seq, seq);
            assert_eq!(pkt.samples().len(), 1920);
            let (info, s) = decode_packet(pkt.wire()).expect("valid wire packet");
            assert_eq!(info, *pkt.info());
            for c in s.chunks_exact(2) {
                assert_eq!(i16::from_le_bytes([c[0], c[1]]), expect);
                expect = expect.wrapping_add(1);
            }
        }
        assert!(rx.try_recv().is_none(), "160 frames left over, no packet");
        assert_eq!(pk.counters.captured.load(Relaxed), 4);
    }

    #[test]
    fn timestamps_follow_frames_within_a_callback() {
        let p = params(SampleFormat::F32, 1, 480);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 8);
        // One callback of 1200 frames at t=1s: packets start at frame 0, 480, 960.
        pk.push(&vec![0.0f32; 1200], 1_000_000_000);
        // The third packet finishes in the next callback, but started in this one.
        pk.push(&vec![0.0f32; 240], 2_000_000_000);
        let ts: Vec<u64> = std::iter::from_fn(|| rx.try_recv())
            .map(|p| p.info().timestamp_ns)
            .collect();
        assert_eq!(ts, [1_000_000_000, 1_010_000_000, 1_020_000_000]);
    }

    #[test]
    fn timestamps_never_step_less_than_a_packet() {
        let p = params(SampleFormat::I16, 1, 480);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 8);
        // A burst of 3 packets stamped 100 ms, then a callback whose
        // estimate (105 ms) lags the sample clock, then a real jump.
        pk.push(&[0i16; 1440], 100_000_000);
        pk.push(&[0i16; 480], 105_000_000);
        pk.push(&[0i16; 480], 500_000_000);
        let ts: Vec<u64> = std::iter::from_fn(|| rx.try_recv())
            .map(|p| p.info().timestamp_ns / 1_000_000)
            .collect();
        assert_eq!(ts, [100, 110, 120, 130, 500]);
    }

    #[test]
    fn converts_between_formats() {
        let p = params(SampleFormat::I16, 1, 4);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 4);
        pk.push(&[0.0f32, 1.0, -1.0, 2.0], 0);
        let pkt = rx.try_recv().expect("packet");
        let got: Vec<i16> = pkt
            .samples()
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(got, [0, 32767, -32767, 32767]);

        let p = params(SampleFormat::F32, 1, 2);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 4);
        pk.push(&[16384i16, -32768], 0);
        let pkt = rx.try_recv().expect("packet");
        let got: Vec<f32> = pkt
            .samples()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, [0.5, -1.0]);
    }

    #[test]
    fn slow_consumer_drops_and_counts_with_seq_gaps() {
        let p = params(SampleFormat::I16, 1, 10);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 4);
        // 10 packets without the consumer looking: 4 fit, 6 are dropped.
        pk.push(&[1i16; 100], 0);
        assert_eq!(pk.counters.queued.load(Relaxed), 4);
        assert_eq!(pk.counters.dropped_queue_full.load(Relaxed), 6);
        let seqs: Vec<u64> = std::iter::from_fn(|| rx.try_recv())
            .map(|p| p.info().seq)
            .collect();
        assert_eq!(seqs, [0, 1, 2, 3]);
        // The consumer caught up: the next packet goes through with seq 10.
        pk.push(&[1i16; 10], 0);
        assert_eq!(rx.try_recv().map(|p| p.info().seq), Some(10));
    }

    #[test]
    fn no_empty_buffer_drops_and_counts() {
        let p = params(SampleFormat::I16, 1, 10);
        let (mut pk, mut rx) = packet_channel(p, Pool::new(PoolConfig::default()), 4);
        let mut held = Vec::new();
        // The consumer takes packets but never refills: 6 empty buffers
        // (queue + 2), then nothing to fill. (try_recv refills: pop directly.)
        for _ in 0..8 {
            pk.push(&[1i16; 10], 0);
            while let Ok(p) = rx.rx.pop() {
                held.push(p);
            }
        }
        assert_eq!(held.len(), 6);
        assert_eq!(pk.counters.dropped_no_buffer.load(Relaxed), 2);
        rx.refill();
        pk.push(&[1i16; 10], 0);
        assert_eq!(rx.try_recv().map(|p| p.info().seq), Some(8));
    }
}
