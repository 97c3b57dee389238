//! Payload layout and message sizes.
//!
//! Every payload starts with a 20-byte prefix: publisher index (u32 LE),
//! sequence number (u64 LE) and send time in nanoseconds since the run's
//! epoch (u64 LE). Receivers use it to count deliveries per publisher, to
//! spot losses and duplicates, and to measure latency. The rest is filler
//! sliced from one shared buffer, so building a message costs no copy of
//! its body.

use bytes::Bytes;

/// Length of the prefix every payload starts with.
pub const PREFIX_LEN: usize = 20;

/// What the prefix of a payload says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Index of the publisher in the run.
    pub publisher: u32,
    /// Sequence number of the message for that publisher, from 0.
    pub seq: u64,
    /// Send time in nanoseconds since the run's epoch.
    pub sent_ns: u64,
}

impl Stamp {
    /// The 20-byte prefix for this stamp.
    pub fn encode(&self) -> [u8; PREFIX_LEN] {
        let mut out = [0u8; PREFIX_LEN];
        out[0..4].copy_from_slice(&self.publisher.to_le_bytes());
        out[4..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..20].copy_from_slice(&self.sent_ns.to_le_bytes());
        out
    }

    /// Read the prefix of a payload; `None` if it is too short.
    pub fn decode(payload: &[u8]) -> Option<Stamp> {
        let p = payload.get(..PREFIX_LEN)?;
        let publisher = u32::from_le_bytes(p[0..4].try_into().ok()?);
        let seq = u64::from_le_bytes(p[4..12].try_into().ok()?);
        let sent_ns = u64::from_le_bytes(p[12..20].try_into().ok()?);
        Some(Stamp {
            publisher,
            seq,
            sent_ns,
        })
    }
}

/// A shared filler buffer large enough for the biggest body of a run.
pub fn filler(max_payload: usize) -> Bytes {
    let len = max_payload.saturating_sub(PREFIX_LEN);
    Bytes::from((0..len).map(|i| b'a' + (i % 26) as u8).collect::<Vec<u8>>())
}

/// The body (payload after the prefix) of a message of `size` bytes.
pub fn body(filler: &Bytes, size: usize) -> Bytes {
    let len = size.saturating_sub(PREFIX_LEN).min(filler.len());
    filler.slice(..len)
}

/// A small, fast, deterministic PRNG (xorshift64*), good enough for picking
/// message sizes reproducibly.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is replaced by a fixed constant).
    pub fn new(seed: u64) -> Self {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

/// How a publisher picks the size of each message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeDist {
    /// Every message has this many bytes.
    Fixed(usize),
    /// 70% of 100-500 B, 20% of 1-5 KiB, 10% of 10-64 KiB.
    Mixed,
    /// The first message has `first` bytes, every later one `rest`.
    FirstThen {
        /// Size of message 0.
        first: usize,
        /// Size of every other message.
        rest: usize,
    },
}

impl SizeDist {
    /// Size of message `seq`, drawing from `rng` where the distribution is random.
    pub fn size(&self, seq: u64, rng: &mut Rng) -> usize {
        let s = match *self {
            SizeDist::Fixed(n) => n,
            SizeDist::Mixed => match rng.next_u64() % 100 {
                0..=69 => rng.range(100, 500),
                70..=89 => rng.range(1024, 5 * 1024),
                _ => rng.range(10 * 1024, 64 * 1024),
            },
            SizeDist::FirstThen { first, rest } => {
                if seq == 0 {
                    first
                } else {
                    rest
                }
            }
        };
        s.max(PREFIX_LEN)
    }

    /// The largest size this distribution can produce.
    pub fn max(&self) -> usize {
        match *self {
            SizeDist::Fixed(n) => n,
            SizeDist::Mixed => 64 * 1024,
            SizeDist::FirstThen { first, rest } => first.max(rest),
        }
        .max(PREFIX_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trips() {
        let s = Stamp {
            publisher: 7,
            seq: u64::MAX - 3,
            sent_ns: 123_456_789,
        };
        let mut payload = s.encode().to_vec();
        payload.extend_from_slice(b"filler");
        assert_eq!(Stamp::decode(&payload), Some(s));
        assert_eq!(Stamp::decode(&payload[..19]), None);
    }

    #[test]
    fn body_has_the_right_length() {
        let f = filler(1024);
        assert_eq!(f.len(), 1024 - PREFIX_LEN);
        assert_eq!(body(&f, 1024).len() + PREFIX_LEN, 1024);
        assert_eq!(body(&f, 10).len(), 0);
    }

    #[test]
    fn mixed_sizes_follow_the_distribution() {
        let mut rng = Rng::new(42);
        let (mut small, mut mid, mut large) = (0u32, 0u32, 0u32);
        let n = 100_000;
        for seq in 0..n {
            let s = SizeDist::Mixed.size(seq, &mut rng);
            match s {
                100..=500 => small += 1,
                1024..=5120 => mid += 1,
                10240..=65536 => large += 1,
                other => panic!("size {other} outside every class"),
            }
        }
        let pct = |c: u32| f64::from(c) * 100.0 / n as f64;
        assert!((pct(small) - 70.0).abs() < 1.0, "small {}", pct(small));
        assert!((pct(mid) - 20.0).abs() < 1.0, "mid {}", pct(mid));
        assert!((pct(large) - 10.0).abs() < 1.0, "large {}", pct(large));
        assert_eq!(SizeDist::Mixed.max(), 65536);
    }

    #[test]
    fn first_then_and_fixed() {
        let mut rng = Rng::new(1);
        let d = SizeDist::FirstThen {
            first: 50 << 20,
            rest: 64,
        };
        assert_eq!(d.size(0, &mut rng), 50 << 20);
        assert_eq!(d.size(1, &mut rng), 64);
        assert_eq!(d.max(), 50 << 20);
        assert_eq!(SizeDist::Fixed(3).size(0, &mut rng), PREFIX_LEN);
    }

    #[test]
    fn rng_range_is_inclusive_and_bounded() {
        let mut rng = Rng::new(0);
        let mut seen = [false; 4];
        for _ in 0..1000 {
            let v = rng.range(2, 5);
            assert!((2..=5).contains(&v));
            seen[v - 2] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
