//! A [`Moment`]: an instant kept in 8 bytes against a base the core keeps
//! (its start), where an `Instant` or an `Option<Instant>` takes 16.
//! Every session keeps one (when it expires) and every connection one
//! (its last packet).

use std::time::{Duration, Instant};

/// An `Option<Instant>` in 8 bytes: nanoseconds after (negative: before)
/// a base instant the core keeps (its start), `i64::MIN` for none. Exact,
/// to the nanosecond, within 292 years of the base, which holds every
/// session expiry: at most `u32::MAX` seconds (136 years) after a detach,
/// and a restored one was stored from such an expiry. Beyond, it
/// saturates, so it still compares the same with any instant nearer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Moment(i64);

impl Moment {
    pub(crate) const NONE: Moment = Moment(i64::MIN);

    /// `at` against `base`.
    pub(crate) fn new(base: Instant, at: Option<Instant>) -> Moment {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match at {
            None => Moment::NONE,
            Some(at) if at >= base => Moment(nanos(at.duration_since(base))),
            // Down to `-i64::MAX`: never `NONE`.
            Some(at) => Moment(-nanos(base.duration_since(at))),
        }
    }

    /// The instant, against the same `base` it was made with.
    pub(crate) fn get(self, base: Instant) -> Option<Instant> {
        if self == Moment::NONE {
            return None;
        }
        let d = Duration::from_nanos(self.0.unsigned_abs());
        // Made from an instant, so it is one again; a saturated past one
        // that the clock cannot hold reads as the base (past as well).
        Some(if self.0 >= 0 {
            base.checked_add(d).unwrap_or(base)
        } else {
            base.checked_sub(d).unwrap_or(base)
        })
    }
}
