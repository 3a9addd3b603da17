//! Space: the chunk bitmap (1 = owned by a file) mirrored in memory, with the words a change
//! touched remembered so the change can log them; and the free chunks, sorted by what they may
//! hold.
//!
//! A chunk a file gives up may still hold its bytes, and after a crash of the machine a free
//! chunk may hold bytes of a file whose allocation the crash undid. So free chunks are kept in
//! runs by state, and only *clean* ones (known to read as zeros) are handed out:
//!
//! ```text
//! owned --free--> pending --(the freeing transaction is durable)--> dirty
//!   ^                                                                  |
//!   +-------- take <-- clean <--(zeroed; at Host level: and flushed)---+
//! ```
//!
//! A run becomes *dirty* only once the transaction that freed it is durable (at once at the
//! `Device` level), so that a crash can never give a chunk back to the file that freed it after
//! another file wrote there: the freed space is not reused before the free is as durable as
//! the reuse could be. Dirty runs are zeroed in batches, merged (a whole run with one call to
//! the host file system), when clean space runs short. Short dirty runs are also *recycled*
//! as soon as they may be, a few at a time: zeroed by stores and kept as *hot* clean space,
//! which small allocations take first. A file created and removed again and again (a
//! database's journal) so keeps landing on the same few pages, whose blocks the backing file
//! has written already: a flush of them changes none of the host file system's extents and
//! waits for no journal commit of its own. At mount every free chunk is dirty
//! unless the caller knows the array reads as zeros (a file system made just now). Chunks a
//! file holds in reserve ahead of its appends ([`Space::reserve`]) are free on the array and
//! counted apart.

use std::collections::{BTreeMap, BTreeSet};

/// The chunk bitmap.
#[derive(Clone, Debug)]
pub struct ChunkMap {
    words: Vec<u64>,
    count: u64,
    free: u64,
    dirty: BTreeSet<usize>,
}

impl ChunkMap {
    /// A bitmap of `count` chunks from its on-array words; bits past `count` are ignored.
    pub fn from_words(mut words: Vec<u64>, count: u64) -> ChunkMap {
        let need = count.div_ceil(64) as usize;
        words.resize(need.max(words.len()), 0);
        let mut used = 0;
        for (i, w) in words.iter().enumerate() {
            let base = i as u64 * 64;
            let valid = if base >= count {
                0
            } else if count - base >= 64 {
                u64::MAX
            } else {
                (1u64 << (count - base)) - 1
            };
            used += (w & valid).count_ones() as u64;
        }
        ChunkMap {
            words,
            count,
            free: count - used,
            dirty: BTreeSet::new(),
        }
    }

    /// Chunks in all.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Free chunks.
    pub fn free(&self) -> u64 {
        self.free
    }

    /// Whether `chunk` is in use.
    pub fn is_used(&self, chunk: u64) -> bool {
        self.words[(chunk / 64) as usize] & (1 << (chunk % 64)) != 0
    }

    /// Marks `len` chunks from `start` used or free; each must be in the other state.
    pub fn set_run(&mut self, start: u64, len: u64, used: bool) {
        for c in start..start + len {
            let (w, b) = ((c / 64) as usize, c % 64);
            debug_assert_ne!(self.is_used(c), used, "chunk {c} already in that state");
            if used {
                self.words[w] |= 1 << b;
                self.free -= 1;
            } else {
                self.words[w] &= !(1 << b);
                self.free += 1;
            }
            self.dirty.insert(w);
        }
    }

    /// The runs of free chunks, in order.
    pub fn free_runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut c = 0;
        while c < self.count {
            let w = self.words[(c / 64) as usize];
            if c.is_multiple_of(64) && w == u64::MAX {
                c += 64;
                continue;
            }
            if c.is_multiple_of(64) && w == 0 && c + 64 <= self.count {
                push_run(&mut out, c, 64);
                c += 64;
                continue;
            }
            if !self.is_used(c) {
                push_run(&mut out, c, 1);
            }
            c += 1;
        }
        out
    }

    /// The words changed since the last call, with their new values.
    pub fn take_dirty(&mut self) -> Vec<(usize, u64)> {
        let d = std::mem::take(&mut self.dirty);
        d.into_iter().map(|w| (w, self.words[w])).collect()
    }

    /// Words changed since the last [`ChunkMap::take_dirty`].
    pub fn dirty_words(&self) -> usize {
        self.dirty.len()
    }

    /// All words.
    pub fn words(&self) -> &[u64] {
        &self.words
    }
}

fn push_run(out: &mut Vec<(u64, u64)>, start: u64, len: u64) {
    match out.last_mut() {
        Some((s, l)) if *s + *l == start => *l += len,
        _ => out.push((start, len)),
    }
}

/// Disjoint runs of chunks (first chunk to length), adjacent ones merged.
#[derive(Clone, Debug, Default)]
pub struct Runs {
    map: BTreeMap<u64, u64>,
    total: u64,
}

impl Runs {
    /// Chunks in all the runs.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Runs held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no run is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The runs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.map.iter().map(|(s, l)| (*s, *l))
    }

    /// Adds `[start, start + len)`, which must not overlap a run held.
    pub fn insert(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (mut s, mut l) = (start, len);
        if let Some((&ps, &pl)) = self.map.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "run {start}+{len} overlaps {ps}+{pl}");
            if ps + pl == start {
                self.map.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some((&ns, _)) = self.map.range(start..).next() {
            debug_assert!(
                ns >= start + len,
                "run {start}+{len} overlaps the one at {ns}"
            );
        }
        if let Some(nl) = self.map.remove(&(start + len)) {
            l += nl;
        }
        self.map.insert(s, l);
        self.total += len;
    }

    /// Removes `[start, start + len)`, which must lie inside one run.
    pub fn remove(&mut self, start: u64, len: u64) {
        if len == 0 {
            return;
        }
        let (rs, rl) = self
            .containing(start)
            .expect("the range to remove lies in a run");
        assert!(rs + rl >= start + len, "the range to remove spans runs");
        self.map.remove(&rs);
        if rs < start {
            self.map.insert(rs, start - rs);
        }
        if rs + rl > start + len {
            self.map.insert(start + len, rs + rl - start - len);
        }
        self.total -= len;
    }

    /// The run holding chunk `c`.
    pub fn containing(&self, c: u64) -> Option<(u64, u64)> {
        self.map
            .range(..=c)
            .next_back()
            .map(|(s, l)| (*s, *l))
            .filter(|(s, l)| s + l > c)
    }

    /// Up to `max` runs in address order from chunk `c` on, wrapping around once: the part
    /// of the run holding `c` from `c` first.
    pub fn from(&self, c: u64, max: usize) -> Vec<(u64, u64)> {
        self.runs_from(c).take(max).collect()
    }

    /// [`Runs::from`], one run at a time, with no limit.
    pub fn runs_from(&self, c: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        let first = self.containing(c).map(|(s, l)| (c, s + l - c));
        let after = self.map.range(c + 1..).map(|(s, l)| (*s, *l));
        let before = self.map.range(..c).map(move |(&s, &l)| {
            if s + l > c {
                // The part below `c` of the run holding it.
                (s, c - s)
            } else {
                (s, l)
            }
        });
        first.into_iter().chain(after).chain(before)
    }
}

/// Candidate runs [`Space::take`] looks through for one that holds a whole request.
const FIT_SCAN: usize = 64;
/// Runs newly dirty that [`Space::take_short_dirty`] remembers (the rest wait for a batch).
const FRESH_MAX: usize = 1024;

/// The space of a mounted file system: which chunks files own, and the free ones by state.
#[derive(Clone, Debug)]
pub struct Space {
    bits: ChunkMap,
    clean: Runs,
    /// Clean runs that were recycled: taken first by requests they hold whole.
    hot: Runs,
    dirty: Runs,
    /// Runs that became dirty since the last [`Space::take_short_dirty`]: what it looks at.
    fresh: Vec<(u64, u64)>,
    /// Freed by a transaction not yet durable: (its sequence number, or `u64::MAX` while it
    /// is still being built; first chunk; chunks).
    pending: Vec<(u64, u64, u64)>,
    pending_total: u64,
    /// Chunks held in reserve by files ([`Space::reserve`]).
    held: u64,
    /// Where the next allocation without a goal looks first.
    cursor: u64,
}

impl Space {
    /// The space of a bitmap: free chunks are clean when `free_is_zero` (an array just made),
    /// dirty otherwise.
    pub fn new(bits: ChunkMap, free_is_zero: bool) -> Space {
        let mut runs = Runs::default();
        for (s, l) in bits.free_runs() {
            runs.insert(s, l);
        }
        let (clean, dirty) = if free_is_zero {
            (runs, Runs::default())
        } else {
            (Runs::default(), runs)
        };
        Space {
            bits,
            clean,
            hot: Runs::default(),
            dirty,
            fresh: Vec::new(),
            pending: Vec::new(),
            pending_total: 0,
            held: 0,
            cursor: 0,
        }
    }

    /// The bitmap.
    pub fn bits(&self) -> &ChunkMap {
        &self.bits
    }

    /// The bitmap's words changed since the last call, with their new values.
    pub fn take_dirty_words(&mut self) -> Vec<(usize, u64)> {
        self.bits.take_dirty()
    }

    /// Free chunks on the array, in any state (reserves included).
    pub fn free(&self) -> u64 {
        self.bits.free()
    }

    /// Clean chunks: what [`Space::take`] can hand out now (hot ones included).
    pub fn clean(&self) -> u64 {
        self.clean.total() + self.hot.total()
    }

    /// Hot chunks: clean ones that were recycled.
    pub fn hot(&self) -> u64 {
        self.hot.total()
    }

    /// The clean or hot run holding chunk `c`, and which.
    fn clean_run(&mut self, c: u64) -> Option<(&mut Runs, u64, u64)> {
        if let Some((s, l)) = self.clean.containing(c) {
            return Some((&mut self.clean, s, l));
        }
        let (s, l) = self.hot.containing(c)?;
        Some((&mut self.hot, s, l))
    }

    /// Dirty chunks: free and durably so, to be zeroed before use.
    pub fn dirty(&self) -> u64 {
        self.dirty.total()
    }

    /// Chunks freed by transactions that are not durable yet.
    pub fn pending(&self) -> u64 {
        self.pending_total
    }

    /// Chunks held in reserve by files.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Takes `n` clean chunks, or fewer when that needs more than `max_runs` runs: first those
    /// from `goal` on (so a file growing at its end stays one extent), then, from a roving
    /// cursor, a run that holds all that is left if one of the next few does, else the runs in
    /// order. Returns the runs taken, in order of use.
    pub fn take(&mut self, goal: Option<u64>, n: u64, max_runs: usize) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut left = n.min(self.clean());
        if let Some(g) = goal {
            if let Some((pool, s, l)) = self.clean_run(g) {
                let k = left.min(s + l - g);
                pool.remove(g, k);
                out.push((g, k));
                left -= k;
            }
        }
        // A hot run that holds what is left whole (the smallest such).
        if left > 0 && out.len() < max_runs {
            let fit = self
                .hot
                .iter()
                .filter(|(_, l)| *l >= left)
                .min_by_key(|(_, l)| *l);
            if let Some((s, _)) = fit {
                self.hot.remove(s, left);
                push_run(&mut out, s, left);
                left = 0;
            }
        }
        while left > 0 && out.len() < max_runs {
            // The first of the next few runs that holds all that is left, else the next run.
            let mut first = None;
            let mut fit = None;
            for (s, l) in self.clean.runs_from(self.cursor).take(FIT_SCAN) {
                first.get_or_insert((s, l));
                if l >= left {
                    fit = Some((s, l));
                    break;
                }
            }
            let Some((s, l)) = fit.or(first) else {
                break;
            };
            let k = left.min(l);
            self.clean.remove(s, k);
            push_run(&mut out, s, k);
            left -= k;
            self.cursor = s + k;
        }
        while left > 0 && out.len() < max_runs {
            // Only hot runs are left, none big enough: take them in order.
            let Some((s, l)) = self.hot.iter().next() else {
                break;
            };
            let k = left.min(l);
            self.hot.remove(s, k);
            push_run(&mut out, s, k);
            left -= k;
        }
        for &(s, l) in &out {
            self.bits.set_run(s, l, true);
        }
        out
    }

    /// Gives chunks taken by [`Space::take`] back unused (an allocation refused after all).
    pub fn untake(&mut self, runs: &[(u64, u64)]) {
        for &(s, l) in runs {
            self.bits.set_run(s, l, false);
            self.clean.insert(s, l);
        }
    }

    /// Frees chunks a file owned, in the transaction being built.
    pub fn free_run(&mut self, start: u64, len: u64) {
        self.bits.set_run(start, len, false);
        self.pending.push((u64::MAX, start, len));
        self.pending_total += len;
    }

    /// The transaction being built was committed as `seq`, and every transaction up to
    /// `durable` is durable: the chunks they freed are dirty now.
    pub fn committed(&mut self, seq: u64, durable: u64) {
        for p in &mut self.pending {
            if p.0 == u64::MAX {
                p.0 = seq;
            }
        }
        self.durable(durable);
    }

    /// Every transaction up to `seq` is durable.
    pub fn durable(&mut self, seq: u64) {
        let mut keep = Vec::new();
        for (s, start, len) in std::mem::take(&mut self.pending) {
            if s <= seq {
                self.dirty.insert(start, len);
                self.pending_total -= len;
                if self.fresh.len() < FRESH_MAX {
                    self.fresh.push((start, len));
                }
            } else {
                keep.push((s, start, len));
            }
        }
        self.pending = keep;
    }

    /// Takes up to `want` dirty chunks (in address order from the cursor) to be zeroed; give
    /// them back with [`Space::zeroed`].
    pub fn take_dirty(&mut self, want: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut got = 0;
        for (s, l) in self.dirty.runs_from(self.cursor) {
            if got >= want {
                break;
            }
            let k = l.min(want - got);
            out.push((s, k));
            got += k;
        }
        for &(s, l) in &out {
            self.dirty.remove(s, l);
        }
        out.sort_unstable();
        out
    }

    /// Takes the dirty runs no longer than `max_run` chunks among those that became dirty
    /// since the last call, up to `want` chunks in all, to be zeroed and recycled
    /// ([`Space::recycled`]); none while `hot_max` chunks are hot already.
    pub fn take_short_dirty(&mut self, max_run: u64, want: u64, hot_max: u64) -> Vec<(u64, u64)> {
        let room = want.min(hot_max.saturating_sub(self.hot.total()));
        let mut out = Vec::new();
        let mut got = 0;
        for (start, len) in std::mem::take(&mut self.fresh) {
            // Runs merge in the dirty set: look at the whole run this piece is part of now,
            // and take it whole when it is short, else the piece itself when it is (space
            // freed again and again beside other freed space, as a journal made and removed
            // in every transaction, would otherwise merge into runs too long to recycle and
            // wait for a batch of zeroing).
            let Some((s, l)) = self.dirty.containing(start) else {
                continue;
            };
            let (s, l) = if l <= max_run {
                (s, l)
            } else if len <= max_run && start + len <= s + l {
                (start, len)
            } else {
                continue;
            };
            if got + l <= room {
                self.dirty.remove(s, l);
                out.push((s, l));
                got += l;
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Runs taken with [`Space::take_short_dirty`] read as zeros now: they are hot.
    pub fn recycled(&mut self, runs: &[(u64, u64)]) {
        for &(s, l) in runs {
            self.hot.insert(s, l);
        }
    }

    /// Runs taken with [`Space::take_dirty`] now read as zeros (or, when zeroing failed, did
    /// not: `clean` false puts them back).
    pub fn zeroed(&mut self, runs: &[(u64, u64)], clean: bool) {
        for &(s, l) in runs {
            if clean {
                self.clean.insert(s, l);
            } else {
                self.dirty.insert(s, l);
            }
        }
    }

    /// Holds up to `max` clean chunks from `start` on in reserve for a file; returns how many.
    /// They stay free on the array and out of every other allocation.
    pub fn reserve(&mut self, start: u64, max: u64) -> u64 {
        let Some((pool, s, l)) = self.clean_run(start) else {
            return 0;
        };
        let k = max.min(s + l - start);
        pool.remove(start, k);
        self.held += k;
        k
    }

    /// Gives reserved chunks back.
    pub fn unreserve(&mut self, start: u64, len: u64) {
        self.clean.insert(start, len);
        self.held -= len;
    }

    /// Allocates reserved chunks to their file.
    pub fn claim(&mut self, start: u64, len: u64) {
        self.held -= len;
        self.bits.set_run(start, len, true);
    }

    /// Marks chunks used that a repair found owned (not through allocation).
    pub fn mark_used(&mut self, start: u64, len: u64) {
        for c in start..start + len {
            if !self.bits.is_used(c) {
                for runs in [&mut self.clean, &mut self.hot, &mut self.dirty] {
                    if runs.containing(c).is_some() {
                        runs.remove(c, 1);
                    }
                }
                self.bits.set_run(c, 1, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn runs_merge_and_split() {
        let mut r = Runs::default();
        r.insert(10, 5);
        r.insert(20, 5);
        r.insert(15, 5);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(10, 15)]);
        r.remove(12, 3);
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![(10, 2), (15, 10)]);
        assert_eq!(r.total(), 12);
        assert_eq!(r.containing(16), Some((15, 10)));
        assert_eq!(r.containing(13), None);
        assert_eq!(r.from(17, 10), vec![(17, 8), (10, 2), (15, 2)]);
        assert_eq!(r.from(17, 2), vec![(17, 8), (10, 2)]);
        assert_eq!(r.runs_from(10).collect::<Vec<_>>(), vec![(10, 2), (15, 10)]);
    }

    #[test]
    fn sequential_growth_is_contiguous_and_frees_wait_for_durability() {
        let mut s = Space::new(ChunkMap::from_words(vec![0; 4], 200), true);
        let a = s.take(None, 3, 8);
        assert_eq!(a, vec![(0, 3)]);
        let b = s.take(Some(3), 5, 8);
        assert_eq!(b, vec![(3, 5)]);
        assert_eq!((s.free(), s.clean()), (192, 192));
        s.free_run(1, 2);
        assert_eq!((s.free(), s.clean(), s.pending()), (194, 192, 2));
        s.committed(7, 6);
        assert_eq!(s.pending(), 2, "the freeing transaction is not durable yet");
        s.durable(7);
        assert_eq!((s.pending(), s.dirty()), (0, 2));
        assert_eq!(s.take_dirty(1), vec![(1, 1)], "no more than asked for");
        s.zeroed(&[(1, 1)], false);
        let d = s.take_dirty(5);
        assert_eq!(d, vec![(1, 2)]);
        s.zeroed(&d, true);
        assert_eq!(s.clean(), 194);
        assert_eq!(s.take(Some(1), 2, 8), vec![(1, 2)]);
        let words = s.take_dirty_words();
        assert_eq!(words, vec![(0, 0b1111_1111)]);
    }

    #[test]
    fn short_frees_are_recycled_even_where_they_merge_into_a_long_dirty_run() {
        let mut s = Space::new(ChunkMap::from_words(vec![], 100), true);
        s.take(None, 100, 8);
        // A long run freed earlier, and not zeroed.
        s.free_run(10, 40);
        s.committed(1, 1);
        assert_eq!(s.take_short_dirty(4, 64, 64), vec![], "too long to recycle");
        // Short runs freed beside it merge with it in the dirty set; each is recycled alone.
        s.free_run(50, 2);
        s.free_run(8, 2);
        s.free_run(70, 3);
        s.committed(2, 2);
        assert_eq!(
            s.take_short_dirty(4, 64, 64),
            vec![(8, 2), (50, 2), (70, 3)]
        );
        assert_eq!(s.dirty(), 40, "the long run stays to be zeroed in a batch");
        // At most `want` chunks, and none once `hot_max` are hot.
        s.free_run(60, 2);
        s.free_run(80, 2);
        s.committed(3, 3);
        assert_eq!(s.take_short_dirty(4, 2, 64), vec![(60, 2)]);
        s.recycled(&[(60, 2)]);
        s.free_run(90, 2);
        s.committed(4, 4);
        assert_eq!(s.take_short_dirty(4, 64, 2), vec![]);
    }

    #[test]
    fn a_reserve_keeps_others_out_and_returns() {
        let mut s = Space::new(ChunkMap::from_words(vec![], 100), true);
        let a = s.take(None, 2, 8);
        assert_eq!(a, vec![(0, 2)]);
        assert_eq!(s.reserve(2, 10), 10);
        assert_eq!(s.take(None, 1, 8), vec![(12, 1)], "past the reserve");
        s.claim(2, 3);
        s.unreserve(5, 7);
        assert_eq!((s.held(), s.free(), s.clean()), (0, 100 - 6, 100 - 6));
        assert_eq!(s.take(None, 7, 8), vec![(13, 7)], "from the cursor on");
        assert_eq!(s.take(Some(5), 2, 8), vec![(5, 2)]);
    }

    #[test]
    fn a_large_request_prefers_a_run_that_holds_it() {
        let mut s = Space::new(ChunkMap::from_words(vec![], 100), true);
        s.take(None, 100, 8);
        for (st, l) in [(0, 2), (10, 3), (20, 30)] {
            s.free_run(st, l);
        }
        s.committed(1, 1);
        let d = s.take_dirty(u64::MAX);
        s.zeroed(&d, true);
        assert_eq!(s.take(None, 20, 8), vec![(20, 20)]);
        assert_eq!(
            s.take(None, 12, 2),
            vec![(40, 10), (0, 2)],
            "two runs at most"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Take(Option<u64>, u64),
        Free(usize),
        Commit,
        Zero(u64),
        Reserve(u64, u64),
        Unreserve,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (proptest::option::of(0u64..300), 1u64..40).prop_map(|(g, n)| Op::Take(g, n)),
            (0usize..64).prop_map(Op::Free),
            Just(Op::Commit),
            (1u64..80).prop_map(Op::Zero),
            (0u64..300, 1u64..20).prop_map(|(s, n)| Op::Reserve(s, n)),
            Just(Op::Unreserve),
        ]
    }

    proptest! {
        /// Against a model (each chunk: owned, clean, dirty, pending or reserved): takes hand
        /// out clean chunks only, never an owned one, honour the goal when it is clean, and
        /// give what was asked for when that is clean; freed chunks come back only through
        /// durability and zeroing; the counts and the bitmap agree with the model.
        #[test]
        fn matches_a_model(count in 1u64..300, ops in proptest::collection::vec(op(), 1..80)) {
            #[derive(Clone, Copy, PartialEq, Debug)]
            enum St { Owned, Clean, Dirty, Pending, Held }
            let mut s = Space::new(ChunkMap::from_words(vec![], count), true);
            let mut model = vec![St::Clean; count as usize];
            let mut owned: Vec<(u64, u64)> = Vec::new();
            let mut held: Vec<(u64, u64)> = Vec::new();
            let mut seq = 0;
            let mut disk = vec![0u64; count.div_ceil(64) as usize];
            for o in ops {
                match o {
                    Op::Take(goal, n) => {
                        let clean = model.iter().filter(|m| **m == St::Clean).count() as u64;
                        let goal = goal.filter(|g| *g < count);
                        let runs = s.take(goal, n, usize::MAX);
                        prop_assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), n.min(clean));
                        if let (Some(g), Some(first)) = (goal, runs.first()) {
                            if model[g as usize] == St::Clean {
                                prop_assert_eq!(first.0, g);
                            }
                        }
                        for &(st, l) in &runs {
                            for c in st..st + l {
                                prop_assert_eq!(model[c as usize], St::Clean, "chunk {} handed out", c);
                                model[c as usize] = St::Owned;
                            }
                            owned.push((st, l));
                        }
                    }
                    Op::Free(i) if !owned.is_empty() => {
                        let (st, l) = owned.swap_remove(i % owned.len());
                        s.free_run(st, l);
                        for c in st..st + l {
                            model[c as usize] = St::Pending;
                        }
                    }
                    Op::Free(_) => {}
                    Op::Commit => {
                        seq += 1;
                        s.committed(seq, seq);
                        for m in model.iter_mut() {
                            if *m == St::Pending {
                                *m = St::Dirty;
                            }
                        }
                    }
                    Op::Zero(n) => {
                        let runs = s.take_dirty(n);
                        for &(st, l) in &runs {
                            for c in st..st + l {
                                prop_assert_eq!(model[c as usize], St::Dirty);
                                model[c as usize] = St::Clean;
                            }
                        }
                        s.zeroed(&runs, true);
                    }
                    Op::Reserve(st, n) if st < count => {
                        let k = s.reserve(st, n);
                        for c in st..st + k {
                            prop_assert_eq!(model[c as usize], St::Clean);
                            model[c as usize] = St::Held;
                        }
                        if k > 0 {
                            held.push((st, k));
                        }
                    }
                    Op::Reserve(..) => {}
                    Op::Unreserve => {
                        if let Some((st, k)) = held.pop() {
                            s.unreserve(st, k);
                            for c in st..st + k {
                                model[c as usize] = St::Clean;
                            }
                        }
                    }
                }
                for (w, v) in s.take_dirty_words() {
                    disk[w] = v;
                }
                let n = |st: St| model.iter().filter(|m| **m == st).count() as u64;
                prop_assert_eq!(s.free(), count - n(St::Owned));
                prop_assert_eq!(s.clean(), n(St::Clean));
                prop_assert_eq!(s.dirty(), n(St::Dirty));
                prop_assert_eq!(s.pending(), n(St::Pending));
                prop_assert_eq!(s.held(), n(St::Held));
                for c in 0..count {
                    prop_assert_eq!(s.bits().is_used(c), model[c as usize] == St::Owned);
                }
                let reloaded = ChunkMap::from_words(disk.clone(), count);
                prop_assert_eq!(reloaded.free(), s.free());
            }
        }
    }
}
