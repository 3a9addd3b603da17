//! Start-gap wear leveling with address randomization (Qureshi et al., MICRO 2009; Moneta
//! §II-B: each memory controller levels the wear of the memory it manages).
//!
//! A region of `n` lines lives in `n + 1` physical lines; one of them, the *gap*, holds no
//! data. Every `interval` writes the gap moves down by one line (the line below it is copied
//! into it); when it reaches the bottom, the top line is copied there and `start` advances, so
//! over time every logical line visits every physical one. A logical line maps to
//! `(line + start) mod n`, one further when that is at or past the gap. Before that, a static
//! random permutation of the lines (a Feistel network) spreads a hot region over the whole
//! device, as start-gap alone moves lines only slowly past their neighbours.
//!
//! The model moves no data: the emulated array keeps every byte at its array address, and the
//! mapping only decides which physical line (and bank) an access wears and occupies.

/// A keyed permutation of `0..n` (a four-round Feistel network on the smallest even number of
/// bits that covers `n`, cycle-walking back into range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half: u32,
    keys: [u64; 4],
}

fn mix(mut x: u64) -> u64 {
    // A 64-bit finalizer (splitmix64): cheap, and every input bit reaches every output bit.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Permutation {
    /// A permutation of `0..n` chosen by `seed`.
    pub fn new(n: u64, seed: u64) -> Permutation {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half = bits.div_ceil(2).max(1);
        let mut keys = [0u64; 4];
        let mut s = seed;
        for k in &mut keys {
            s = mix(s.wrapping_add(0x9e37_79b9_7f4a_7c15));
            *k = s;
        }
        Permutation { n, half, keys }
    }

    fn round(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half) - 1;
        let (mut l, mut r) = (x >> self.half, x & mask);
        for k in self.keys {
            let f = mix(r ^ k) & mask;
            (l, r) = (r, l ^ f);
        }
        (l << self.half) | r
    }

    /// Where `x` (below `n`) goes.
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.round(x);
        // The network permutes 0..2^(2·half); walking the cycle from x until it comes back
        // below n permutes 0..n.
        while y >= self.n {
            y = self.round(y);
        }
        y
    }
}

/// The start and gap registers of one region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartGap {
    n: u64,
    start: u64,
    gap: u64,
    interval: u64,
    writes: u64,
    perm: Option<Permutation>,
    /// The permutation worked out for every line, for regions small enough to keep it
    /// (a lookup instead of a Feistel network and its cycle walk on every access).
    table: Option<Box<[u32]>>,
}

/// Most lines whose permutation is kept as a table (64 MiB of it).
const TABLE_LINES: u64 = 16 << 20;

/// A gap move: the line at `from` was copied to `to` (physical line numbers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    /// Source line.
    pub from: u64,
    /// Destination line (the old gap).
    pub to: u64,
}

impl StartGap {
    /// A region of `n` logical lines (in `n + 1` physical ones), the gap moving every
    /// `interval` writes (0: never), addresses permuted by `seed` when `randomize`.
    pub fn new(n: u64, interval: u64, randomize: bool, seed: u64) -> StartGap {
        assert!(n > 0, "a region has lines");
        let perm = randomize.then(|| Permutation::new(n, seed));
        let table = perm
            .as_ref()
            .filter(|_| n <= TABLE_LINES)
            .map(|p| (0..n).map(|x| p.apply(x) as u32).collect());
        StartGap {
            n,
            start: 0,
            gap: n,
            interval,
            writes: 0,
            perm,
            table,
        }
    }

    /// The registers (start, gap, writes since the last move), to persist.
    pub fn registers(&self) -> (u64, u64, u64) {
        (self.start, self.gap, self.writes)
    }

    /// Restores persisted registers; `false` (and nothing changed) if they cannot belong to
    /// this region.
    pub fn restore(&mut self, start: u64, gap: u64, writes: u64) -> bool {
        if start >= self.n || gap > self.n {
            return false;
        }
        self.start = start;
        self.gap = gap;
        self.writes = writes.min(self.interval.saturating_sub(1));
        true
    }

    /// Logical lines.
    pub fn lines(&self) -> u64 {
        self.n
    }

    /// The physical line (0..=n) holding logical line `line` (0..n).
    #[inline]
    pub fn map(&self, line: u64) -> u64 {
        let r = match (&self.table, &self.perm) {
            (Some(t), _) => u64::from(t[line as usize]),
            (None, Some(p)) => p.apply(line),
            (None, None) => line,
        };
        // Both below n: one subtraction instead of a division.
        let pa = r + self.start;
        let pa = if pa >= self.n { pa - self.n } else { pa };
        if pa >= self.gap {
            pa + 1
        } else {
            pa
        }
    }

    /// Starts fetching what [`StartGap::map`] of `line` will read, where it reads a table.
    #[inline]
    pub(crate) fn prefetch(&self, line: u64) {
        if let Some(e) = self.table.as_ref().and_then(|t| t.get(line as usize)) {
            super::parts::prefetch(e);
        }
    }

    /// Counts a write; every `interval` writes the gap moves, and the copy it takes is
    /// returned.
    pub fn wrote(&mut self) -> Option<Move> {
        if self.interval == 0 {
            return None;
        }
        self.writes += 1;
        if self.writes < self.interval {
            return None;
        }
        self.writes = 0;
        Some(self.step())
    }

    /// Moves the gap by one line.
    pub fn step(&mut self) -> Move {
        if self.gap == 0 {
            // The top line wraps into the bottom, and every mapping shifts by one.
            self.gap = self.n;
            self.start = (self.start + 1) % self.n;
            Move {
                from: self.n,
                to: 0,
            }
        } else {
            let to = self.gap;
            self.gap -= 1;
            Move { from: self.gap, to }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutations_are_bijections() {
        for n in [1u64, 2, 3, 7, 100, 1000, 4096, 5000] {
            let p = Permutation::new(n, n * 31 + 7);
            let mut seen = vec![false; n as usize];
            for x in 0..n {
                let y = p.apply(x);
                assert!(y < n);
                assert!(!seen[y as usize], "n {n}: {y} twice");
                seen[y as usize] = true;
            }
        }
        // Different seeds, different permutations.
        let (a, b) = (Permutation::new(1000, 1), Permutation::new(1000, 2));
        assert!((0..1000).any(|x| a.apply(x) != b.apply(x)));
    }

    /// The registers against a model that really moves lines: after every gap move each
    /// logical line is where `map` says, and the mapping is a permutation into `n + 1` lines
    /// that leaves exactly the gap empty.
    fn check_against_moves(n: u64, randomize: bool, moves: u64, check_every: u64) {
        let mut sg = StartGap::new(n, 1, randomize, 42);
        // phys[p] = the logical line stored at physical line p.
        let mut phys: Vec<Option<u64>> = vec![None; n as usize + 1];
        for l in 0..n {
            phys[sg.map(l) as usize] = Some(l);
        }
        assert_eq!(phys.iter().filter(|p| p.is_none()).count(), 1);
        for i in 0..moves {
            let m = sg.wrote().expect("a move per write");
            assert!(phys[m.to as usize].is_none(), "the move writes the gap");
            phys[m.to as usize] = phys[m.from as usize].take();
            if i % check_every == 0 || i + 1 == moves {
                for l in 0..n {
                    assert_eq!(phys[sg.map(l) as usize], Some(l), "move {i}, line {l}");
                }
            }
        }
    }

    #[test]
    fn lines_are_where_the_mapping_says_at_every_step() {
        for n in [1, 2, 3, 5, 16] {
            check_against_moves(n, false, 5 * (n + 1) * n + 3, 1);
            check_against_moves(n, true, 5 * (n + 1) * n + 3, 1);
        }
    }

    #[test]
    fn a_million_gap_moves_keep_every_line_in_place() {
        check_against_moves(1000, true, 1_000_000, 10_007);
    }

    #[test]
    fn the_gap_moves_every_interval_and_registers_restore() {
        let mut sg = StartGap::new(64, 100, true, 9);
        let moves = (0..1000).filter_map(|_| sg.wrote()).count();
        assert_eq!(moves, 10);
        let regs = sg.registers();
        let mut again = StartGap::new(64, 100, true, 9);
        assert!(again.restore(regs.0, regs.1, regs.2));
        assert!((0..64).all(|l| again.map(l) == sg.map(l)));
        assert!(!again.restore(64, 0, 0));
        let mut off = StartGap::new(8, 0, false, 0);
        assert!((0..1000).all(|_| off.wrote().is_none()));
        assert_eq!(off.map(3), 3);
    }

    #[test]
    fn a_hot_line_spreads_over_the_region() {
        // One logical line written over and over lands on every physical line in turn.
        let n = 32;
        let mut sg = StartGap::new(n, 1, false, 0);
        let mut hit = vec![0u32; n as usize + 1];
        for _ in 0..(n + 1) * n * 2 {
            hit[sg.map(0) as usize] += 1;
            sg.wrote();
        }
        assert!(hit.iter().all(|&h| h > 0), "{hit:?}");
    }
}
