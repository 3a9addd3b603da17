//! The chunk allocator: a bitmap of data chunks (1 = in use) mirrored in memory, with the words
//! a change touched remembered so the change can log them.

use std::collections::BTreeSet;

/// The chunk bitmap.
#[derive(Clone, Debug)]
pub struct ChunkMap {
    words: Vec<u64>,
    count: u64,
    free: u64,
    cursor: u64,
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
            cursor: 0,
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

    fn set(&mut self, chunk: u64, used: bool) {
        let (w, b) = ((chunk / 64) as usize, chunk % 64);
        debug_assert_ne!(
            self.is_used(chunk),
            used,
            "chunk {chunk} already in that state"
        );
        if used {
            self.words[w] |= 1 << b;
            self.free -= 1;
        } else {
            self.words[w] &= !(1 << b);
            self.free += 1;
        }
        self.dirty.insert(w);
    }

    /// Takes `n` chunks, all or none: first those right after `goal` (so a file growing at its
    /// end stays one extent), then the next free runs from a roving cursor. Returns the runs
    /// taken as (first chunk, chunks), in order of use.
    pub fn alloc(&mut self, goal: Option<u64>, n: u64) -> Option<Vec<(u64, u64)>> {
        if n > self.free {
            return None;
        }
        let mut runs: Vec<(u64, u64)> = Vec::new();
        let mut left = n;
        if let Some(g) = goal {
            let mut c = g;
            while left > 0 && c < self.count && !self.is_used(c) {
                self.set(c, true);
                c += 1;
                left -= 1;
            }
            if c > g {
                runs.push((g, c - g));
            }
        }
        let mut c = self.cursor.min(self.count);
        let mut scanned = 0u64;
        while left > 0 {
            if c >= self.count {
                c = 0;
            }
            // Skip full words quickly.
            if c.is_multiple_of(64) && self.words[(c / 64) as usize] == u64::MAX {
                c += 64;
                scanned += 64;
                continue;
            }
            if !self.is_used(c) {
                self.set(c, true);
                match runs.last_mut() {
                    Some((s, l)) if *s + *l == c => *l += 1,
                    _ => runs.push((c, 1)),
                }
                left -= 1;
            }
            c += 1;
            scanned += 1;
            assert!(
                scanned <= self.count + 128,
                "free count says {} chunks are free but none was found",
                self.free
            );
        }
        self.cursor = c;
        Some(runs)
    }

    /// Frees `len` chunks from `start`.
    pub fn free_run(&mut self, start: u64, len: u64) {
        for c in start..start + len {
            self.set(c, false);
        }
    }

    /// Marks chunks in use (repair).
    pub fn mark_run(&mut self, start: u64, len: u64) {
        for c in start..start + len {
            if !self.is_used(c) {
                self.set(c, true);
            }
        }
    }

    /// The words changed since the last call, with their new values.
    pub fn take_dirty(&mut self) -> Vec<(usize, u64)> {
        let d = std::mem::take(&mut self.dirty);
        d.into_iter().map(|w| (w, self.words[w])).collect()
    }

    /// All words.
    pub fn words(&self) -> &[u64] {
        &self.words
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sequential_growth_is_contiguous() {
        let mut m = ChunkMap::from_words(vec![0; 4], 200);
        let a = m.alloc(None, 3).unwrap();
        assert_eq!(a, vec![(0, 3)]);
        let b = m.alloc(Some(3), 5).unwrap();
        assert_eq!(b, vec![(3, 5)]);
        assert_eq!(m.free(), 192);
        assert!(m.alloc(None, 193).is_none());
        assert_eq!(m.free(), 192, "a refused allocation takes nothing");
        m.free_run(1, 2);
        assert!(!m.is_used(1) && m.is_used(0));
        let dirty = m.take_dirty();
        assert_eq!(dirty, vec![(0, 0b1111_1001)]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(Option<u64>, u64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (proptest::option::of(0u64..300), 1u64..40).prop_map(|(g, n)| Op::Alloc(g, n)),
            (0usize..64).prop_map(Op::Free),
        ]
    }

    proptest! {
        /// Against a model (a set of used chunks): allocations are all-or-nothing, never hand
        /// out a used chunk, honour the goal when it is free, and frees make chunks reusable;
        /// the dirty words always match the bitmap.
        #[test]
        fn matches_a_model(count in 1u64..300, ops in proptest::collection::vec(op(), 1..80)) {
            let mut m = ChunkMap::from_words(vec![], count);
            let mut model = vec![false; count as usize];
            let mut held: Vec<(u64, u64)> = Vec::new();
            let mut disk = vec![0u64; count.div_ceil(64) as usize];
            for o in ops {
                match o {
                    Op::Alloc(goal, n) => {
                        let free = model.iter().filter(|u| !**u).count() as u64;
                        let goal = goal.filter(|g| *g < count);
                        match m.alloc(goal, n) {
                            None => prop_assert!(n > free),
                            Some(runs) => {
                                prop_assert!(n <= free);
                                prop_assert_eq!(runs.iter().map(|r| r.1).sum::<u64>(), n);
                                if let Some(g) = goal {
                                    if !model[g as usize] {
                                        prop_assert_eq!(runs[0].0, g);
                                    }
                                }
                                for &(s, l) in &runs {
                                    for c in s..s + l {
                                        prop_assert!(!model[c as usize], "chunk {} handed out twice", c);
                                        model[c as usize] = true;
                                    }
                                    held.push((s, l));
                                }
                            }
                        }
                    }
                    Op::Free(i) if !held.is_empty() => {
                        let (s, l) = held.swap_remove(i % held.len());
                        m.free_run(s, l);
                        for c in s..s + l {
                            model[c as usize] = false;
                        }
                    }
                    Op::Free(_) => {}
                }
                for (w, v) in m.take_dirty() {
                    disk[w] = v;
                }
                prop_assert_eq!(m.free(), model.iter().filter(|u| !**u).count() as u64);
                for c in 0..count {
                    prop_assert_eq!(m.is_used(c), model[c as usize]);
                }
                let reloaded = ChunkMap::from_words(disk.clone(), count);
                prop_assert_eq!(reloaded.free(), m.free());
            }
        }
    }
}
