//! The model's building blocks: requests in reusable slots, a channel's barrier epochs, the
//! calendar a one-at-a-time resource is booked on, and fixed-point rates and divisions.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use super::{Submit, PS};

/// A request in the scheduler.
#[derive(Debug)]
pub(super) struct Req {
    pub(super) s: Submit,
    /// The barrier epoch of its channel it belongs to.
    pub(super) epoch: u64,
    /// Next byte (array address) to issue.
    pub(super) next: u64,
    /// The latest end of its issued transfers.
    pub(super) done: u64,
    /// When it may issue at the earliest (arrival, or when it entered the scheduler's queue).
    pub(super) ready: u64,
}

/// Requests in slots that are reused, so that the queues can hold slots.
#[derive(Debug, Default)]
pub(super) struct Slab {
    /// The slots; those on `free` hold a request that completed.
    pub(super) slots: Vec<Req>,
    /// Whether each slot holds a request that has not completed.
    pub(super) used: Vec<bool>,
    pub(super) free: Vec<usize>,
    pub(super) live: usize,
}

impl Slab {
    #[inline]
    pub(super) fn insert(&mut self, r: Req) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = r;
                self.used[i] = true;
                i
            }
            None => {
                self.slots.push(r);
                self.used.push(true);
                self.slots.len() - 1
            }
        }
    }

    /// Frees slot `i` (its request completed).
    #[inline]
    pub(super) fn release(&mut self, i: usize) {
        if std::mem::replace(&mut self.used[i], false) {
            self.free.push(i);
            self.live -= 1;
        }
    }

    /// The requests not yet completed.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Req> {
        self.slots
            .iter()
            .zip(&self.used)
            .filter_map(|(r, &used)| used.then_some(r))
    }
}

impl std::ops::Index<usize> for Slab {
    type Output = Req;
    #[inline]
    fn index(&self, i: usize) -> &Req {
        debug_assert!(self.used[i], "a queued slot holds a request");
        &self.slots[i]
    }
}

impl std::ops::IndexMut<usize> for Slab {
    #[inline]
    fn index_mut(&mut self, i: usize) -> &mut Req {
        debug_assert!(self.used[i], "a queued slot holds a request");
        &mut self.slots[i]
    }
}

/// One barrier epoch of a channel: requests whose completion is not yet known, and the latest
/// completion among those known.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Epoch {
    pub(super) unknown: u64,
    pub(super) latest: u64,
}

#[derive(Debug, Default)]
pub(super) struct ChanOrder {
    /// The epoch new requests join.
    pub(super) current: u64,
    /// Open epochs, oldest first: (epoch, state).
    pub(super) open: VecDeque<(u64, Epoch)>,
    /// Latest completion of the epochs closed and dropped.
    pub(super) closed_latest: u64,
}

impl ChanOrder {
    /// When a request of `epoch` may issue: `None` while an earlier epoch has requests whose
    /// completion is not known yet.
    pub(super) fn eligible(&self, epoch: u64) -> Option<u64> {
        let mut t = self.closed_latest;
        for &(e, st) in &self.open {
            if e >= epoch {
                break;
            }
            if st.unknown > 0 {
                return None;
            }
            t = t.max(st.latest);
        }
        Some(t)
    }

    pub(super) fn known(&mut self, epoch: u64, done: u64) {
        if let Some((_, st)) = self.open.iter_mut().find(|(e, _)| *e == epoch) {
            st.unknown -= 1;
            st.latest = st.latest.max(done);
        }
        // Fold finished epochs at the front, keeping the current one open.
        while let Some(&(e, st)) = self.open.front() {
            if st.unknown > 0 || e == self.current {
                break;
            }
            self.closed_latest = self.closed_latest.max(st.latest);
            self.open.pop_front();
        }
    }
}

/// Spans a calendar keeps before [`Calendar::prune`] forgets those that ended.
const PRUNE_AT: usize = 8;

/// A resource that does one thing at a time, as a calendar of the spans it is booked for.
///
/// A transfer books each resource on its path when it issues, possibly for a span that lies
/// ahead; a later transfer that is ready earlier takes a free gap before that span if it fits,
/// so the resource serves work in the order it becomes ready rather than the order it was
/// issued (a read waiting for a slow row must not hold the ring from a write that is ready).
#[derive(Debug, Default, Clone)]
pub(super) struct Calendar {
    /// Booked spans, sorted and disjoint.
    pub(super) spans: Vec<(u64, u64)>,
    /// Time booked so far.
    pub(super) busy: u64,
    /// The end of the latest span ever booked.
    pub(super) last_end: u64,
}

impl Calendar {
    /// The earliest start at or after `ready` of a free span of `dur`.
    #[inline]
    pub(super) fn fit(&self, ready: u64, dur: u64) -> u64 {
        if ready >= self.last_end {
            // Past everything booked: the usual case of a resource that keeps up.
            return ready;
        }
        let mut t = ready;
        let i = self.first_ending_after(t);
        for &(s, e) in &self.spans[i..] {
            if t + dur <= s {
                break;
            }
            t = t.max(e);
        }
        t
    }

    /// The first span that ends after `t`. The spans that do are usually the last one or two
    /// (the calendars are asked about times near the end of what is booked), so a short
    /// calendar is searched from its end.
    #[inline]
    fn first_ending_after(&self, t: u64) -> usize {
        if self.spans.len() > 2 * PRUNE_AT {
            return self.spans.partition_point(|&(_, e)| e <= t);
        }
        let mut i = self.spans.len();
        while i > 0 && self.spans[i - 1].1 > t {
            i -= 1;
        }
        i
    }

    /// Whether `[s, e)` is free; if not, the end of the first span in the way.
    #[inline]
    pub(super) fn conflict(&self, s: u64, e: u64) -> Option<u64> {
        if s >= self.last_end {
            return None;
        }
        let i = self.first_ending_after(s);
        match self.spans.get(i) {
            Some(&(bs, be)) if bs < e => Some(be),
            _ => None,
        }
    }

    /// Books `[s, s + dur)`, which must be free; returns its end.
    #[inline]
    pub(super) fn book(&mut self, s: u64, dur: u64) -> u64 {
        let e = s + dur;
        if dur > 0 {
            if self.spans.last().is_none_or(|&(bs, _)| bs < s) {
                self.spans.push((s, e));
            } else {
                let i = self.spans.partition_point(|&(bs, _)| bs < s);
                self.spans.insert(i, (s, e));
            }
            self.busy += dur;
            self.last_end = self.last_end.max(e);
        }
        e
    }

    /// Forgets spans that ended by `t` (no later booking starts before it).
    #[inline]
    pub(super) fn prune(&mut self, t: u64) {
        // A few spans cost less to search past than to drain each time.
        if self.spans.len() < PRUNE_AT || self.spans[0].1 > t {
            return;
        }
        let i = self.spans.partition_point(|&(_, e)| e <= t);
        if i > 0 {
            self.spans.drain(..i);
        }
    }
}

/// Hashes the model's own ids (request and channel numbers) by one multiplication: they come
/// from the device, not from clients, and the tables are on the path of every request.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b) ^ self.0.rotate_left(8));
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        // Fibonacci hashing: the high bits, which the table uses, depend on every input bit.
        self.0 = x.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

pub(super) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Asks the CPU to bring the cache line of `x` in ahead of its use: the model's per-line tables
/// (address randomization, wear counts) are larger than a core's cache and read at random, so
/// a request starts their fetch when it arrives and the miss overlaps the work before its use.
#[inline(always)]
pub(super) fn prefetch<T>(x: &T) {
    // SAFETY: a prefetch is a hint that cannot fault and changes nothing the program sees;
    // SSE, which provides it, is part of every x86_64 processor.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (x as *const T).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// A transfer rate as picoseconds per byte in fixed point (32 fractional bits): the time of a
/// transfer is one multiplication, with no floating-point rounding on the request's path.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rate(u64);

impl Rate {
    pub(super) fn new(gb_per_s: f64) -> Rate {
        let ps_per_byte = PS as f64 / gb_per_s;
        // At most 2^52 for the slowest rate a configuration accepts (validated elsewhere);
        // saturating for anything slower still.
        Rate(
            (ps_per_byte * (1u64 << 32) as f64)
                .round()
                .min(u64::MAX as f64) as u64,
        )
    }

    /// Picoseconds to move `bytes` (rounded to the nearest).
    #[inline]
    pub(super) fn dur(self, bytes: u64) -> u64 {
        // The usual transfer and rate fit 64 bits (8 KB at 2 GB/s: 2^13 · 2^41).
        if let Some(x) = bytes
            .checked_mul(self.0)
            .and_then(|x| x.checked_add(1 << 31))
        {
            return x >> 32;
        }
        let ps = (u128::from(bytes) * u128::from(self.0) + (1 << 31)) >> 32;
        u64::try_from(ps).unwrap_or(u64::MAX)
    }
}

/// A power of two (the stripe, the row, the largest transfer: validated so), dividing by a
/// shift and a mask.
#[derive(Clone, Copy, Debug)]
pub(super) struct Pow2 {
    pub(super) d: u64,
    shift: u32,
}

impl Pow2 {
    pub(super) fn new(d: u64) -> Pow2 {
        assert!(d.is_power_of_two(), "validated to be a power of two");
        Pow2 {
            d,
            shift: d.trailing_zeros(),
        }
    }

    #[inline]
    pub(super) fn div_rem(self, x: u64) -> (u64, u64) {
        (x >> self.shift, x & (self.d - 1))
    }
}

/// `x / d` and `x % d` by a shift and a mask where `d` is a power of two (the usual case of
/// the model's geometry), else by division.
#[derive(Clone, Copy, Debug)]
pub(super) struct Divisor {
    pub(super) d: u64,
    pub(super) shift: Option<u32>,
}

impl Divisor {
    pub(super) fn new(d: u64) -> Divisor {
        Divisor {
            d,
            shift: d.is_power_of_two().then(|| d.trailing_zeros()),
        }
    }

    #[inline]
    pub(super) fn div_rem(self, x: u64) -> (u64, u64) {
        match self.shift {
            Some(s) => (x >> s, x & (self.d - 1)),
            None => (x / self.d, x % self.d),
        }
    }
}
