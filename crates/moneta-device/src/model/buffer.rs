//! The DRAM buffer in front of the array (the NVM-main-memory paper, §2.3 and §3): lines of
//! the array held in the device's DRAM, so that a read of a line already there costs the
//! buffer's latency instead of the array's, and lines filled ahead of use, from the extent a
//! read lies in (read-ahead) and from hints a client sends (`OP_WILLNEED`).
//!
//! The buffer holds times, not bytes: the emulator's data always lives in the array's memory,
//! and the buffer only decides when a read's data is ready. It is write-through: a write goes
//! to the array as without a buffer (so durability is unchanged) and leaves the lines it
//! covers in the buffer, up to date. A line the array has not finished filling is in the
//! buffer already, with the time it will be ready: a read of it waits for that time.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::parts::IdHasher;

/// Which line the buffer gives up when it is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferPolicy {
    /// The least recently used (a hit or a hint makes a line recent).
    Lru,
    /// The one filled first, whatever its use since.
    Fifo,
}

impl BufferPolicy {
    /// Parses `lru` or `fifo`.
    pub fn parse(s: &str) -> Result<BufferPolicy, String> {
        match s.trim() {
            "lru" => Ok(BufferPolicy::Lru),
            "fifo" => Ok(BufferPolicy::Fifo),
            other => Err(format!(
                "model: buffer_policy `{other}` is not one of lru, fifo"
            )),
        }
    }

    /// The name [`BufferPolicy::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            BufferPolicy::Lru => "lru",
            BufferPolicy::Fifo => "fifo",
        }
    }
}

/// How a line came into the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fill {
    /// A read that missed it.
    Demand,
    /// Read-ahead within the extent of a read.
    Ahead,
    /// A client's hint.
    Hint,
}

/// What the buffer has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BufferStats {
    /// Read transfers whose lines were all in the buffer.
    pub hits: u64,
    /// Read transfers that went to the array.
    pub misses: u64,
    /// Of the hits, those that waited for a line still being filled.
    pub waited: u64,
    /// Lines filled by read-ahead.
    pub ahead_lines: u64,
    /// Lines filled for hints.
    pub hinted_lines: u64,
    /// Lines filled ahead of use (read-ahead or hint) that a read then used.
    pub used_ahead: u64,
    /// Lines filled ahead of use that left the buffer unused.
    pub wasted_ahead: u64,
    /// Lines given up to make room.
    pub evictions: u64,
    /// Lines in the buffer now.
    pub lines: u64,
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Slot {
    line: u64,
    /// When the line's data is in the buffer (ps).
    ready: u64,
    /// Filled ahead of use and not read since.
    ahead: bool,
    prev: u32,
    next: u32,
}

/// The buffer: lines in a table and in a list, most recent (LRU) or newest (FIFO) first.
#[derive(Debug)]
pub(super) struct LineBuffer {
    policy: BufferPolicy,
    shift: u32,
    capacity: usize,
    map: HashMap<u64, u32, BuildHasherDefault<IdHasher>>,
    slots: Vec<Slot>,
    head: u32,
    tail: u32,
    pub(super) stats: BufferStats,
}

impl LineBuffer {
    /// A buffer of `bytes` in lines of `line` bytes (a power of two).
    pub(super) fn new(bytes: u64, line: u64, policy: BufferPolicy) -> LineBuffer {
        let capacity = (bytes / line).max(1) as usize;
        LineBuffer {
            policy,
            shift: line.trailing_zeros(),
            capacity,
            map: HashMap::with_capacity_and_hasher(capacity.min(1 << 20), Default::default()),
            slots: Vec::new(),
            head: NIL,
            tail: NIL,
            stats: BufferStats::default(),
        }
    }

    /// The line of array address `addr`.
    #[inline]
    pub(super) fn line_of(&self, addr: u64) -> u64 {
        addr >> self.shift
    }

    /// The first address of line `line`.
    #[inline]
    pub(super) fn start_of(&self, line: u64) -> u64 {
        line << self.shift
    }

    /// Lines the buffer holds at most.
    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether every line of `[first, last]` is in the buffer (ready or being filled).
    #[inline]
    pub(super) fn holds(&self, first: u64, last: u64) -> bool {
        (first..=last).all(|l| self.map.contains_key(&l))
    }

    /// Whether line `line` is in the buffer.
    #[inline]
    pub(super) fn has(&self, line: u64) -> bool {
        self.map.contains_key(&line)
    }

    /// A read uses lines `[first, last]`, all in the buffer: when their data is ready.
    pub(super) fn read(&mut self, first: u64, last: u64) -> u64 {
        let mut ready = 0;
        for l in first..=last {
            let Some(&i) = self.map.get(&l) else { continue };
            let s = &mut self.slots[i as usize];
            ready = ready.max(s.ready);
            if s.ahead {
                s.ahead = false;
                self.stats.used_ahead += 1;
            }
            if self.policy == BufferPolicy::Lru {
                self.make_recent(i);
            }
        }
        ready
    }

    /// A hint names line `line`, which is in the buffer: under LRU it becomes recent.
    pub(super) fn touch(&mut self, line: u64) {
        if self.policy == BufferPolicy::Lru {
            if let Some(&i) = self.map.get(&line) {
                self.make_recent(i);
            }
        }
    }

    /// Line `line` is filled, its data ready at `ready`; it replaces the least recent (or
    /// oldest) line when the buffer is full.
    pub(super) fn fill(&mut self, line: u64, ready: u64, how: Fill) {
        let ahead = how != Fill::Demand;
        match how {
            Fill::Demand => {}
            Fill::Ahead => self.stats.ahead_lines += 1,
            Fill::Hint => self.stats.hinted_lines += 1,
        }
        if let Some(&i) = self.map.get(&line) {
            let s = &mut self.slots[i as usize];
            s.ready = s.ready.max(ready);
            s.ahead |= ahead;
            if self.policy == BufferPolicy::Lru {
                self.make_recent(i);
            }
            return;
        }
        let i = if self.slots.len() < self.capacity {
            self.slots.push(Slot {
                line,
                ready,
                ahead,
                prev: NIL,
                next: NIL,
            });
            (self.slots.len() - 1) as u32
        } else {
            // Give up the line at the back of the list.
            let i = self.tail;
            self.unlink(i);
            let old = self.slots[i as usize];
            self.map.remove(&old.line);
            self.stats.evictions += 1;
            if old.ahead {
                self.stats.wasted_ahead += 1;
            }
            self.slots[i as usize] = Slot {
                line,
                ready,
                ahead,
                prev: NIL,
                next: NIL,
            };
            i
        };
        self.map.insert(line, i);
        self.push_front(i);
    }

    fn unlink(&mut self, i: u32) {
        let Slot { prev, next, .. } = self.slots[i as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        s.prev = NIL;
        s.next = self.head;
        if self.head != NIL {
            self.slots[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    fn make_recent(&mut self, i: u32) {
        if self.head != i {
            self.unlink(i);
            self.push_front(i);
        }
    }

    /// What the buffer has done, with the lines it holds.
    pub(super) fn stats(&self) -> BufferStats {
        BufferStats {
            lines: self.map.len() as u64,
            ..self.stats
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_gives_up_the_least_recent_line_and_fifo_the_oldest() {
        for (policy, kept, lost) in [(BufferPolicy::Lru, 0, 1), (BufferPolicy::Fifo, 1, 0)] {
            let mut b = LineBuffer::new(2 * 4096, 4096, policy);
            b.fill(0, 10, Fill::Demand);
            b.fill(1, 20, Fill::Demand);
            // Line 0 is read again: recent under LRU, still the oldest under FIFO.
            assert_eq!(b.read(0, 0), 10);
            b.fill(2, 30, Fill::Demand);
            assert!(b.has(kept) && !b.has(lost) && b.has(2), "{policy:?}");
            assert_eq!(b.stats().evictions, 1);
            assert_eq!(b.stats().lines, 2);
        }
    }

    #[test]
    fn lines_filled_ahead_count_as_used_or_wasted() {
        let mut b = LineBuffer::new(2 * 512, 512, BufferPolicy::Lru);
        b.fill(5, 100, Fill::Ahead);
        b.fill(6, 200, Fill::Hint);
        assert!(b.holds(5, 6) && !b.holds(5, 7));
        assert_eq!(b.read(6, 6), 200);
        // Line 5 leaves unused; line 6 was used.
        b.fill(7, 300, Fill::Demand);
        b.fill(8, 400, Fill::Demand);
        let s = b.stats();
        assert_eq!((s.ahead_lines, s.hinted_lines), (1, 1));
        assert_eq!((s.used_ahead, s.wasted_ahead, s.evictions), (1, 1, 2));
        assert_eq!((b.line_of(4095), b.start_of(8)), (7, 4096));
    }

    #[test]
    fn a_line_filled_twice_keeps_the_later_time() {
        let mut b = LineBuffer::new(1 << 20, 4096, BufferPolicy::Lru);
        b.fill(3, 500, Fill::Hint);
        b.fill(3, 200, Fill::Demand);
        assert_eq!(b.read(3, 3), 500);
        assert_eq!(b.stats().lines, 1);
        assert_eq!(b.capacity(), 256);
    }
}
