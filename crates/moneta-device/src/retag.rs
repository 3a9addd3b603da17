//! The retag unit (Moneta-D §4.2): virtual tags of all channels share a bounded pool of physical
//! tags. A request that finds none free waits, in arrival order, until one is released.

use std::collections::VecDeque;

/// A bounded pool of physical tags and the queue of requests waiting for one.
pub struct Retag<T> {
    free: Vec<u16>,
    capacity: usize,
    waiting: VecDeque<T>,
    stalls: u64,
    /// Requests at the front of `waiting` already counted as stalled.
    counted: usize,
}

impl<T> Retag<T> {
    /// A pool of `capacity` physical tags (1..=65535).
    pub fn new(capacity: usize) -> Self {
        assert!((1..=u16::MAX as usize).contains(&capacity));
        Self {
            free: (0..capacity as u16).rev().collect(),
            capacity,
            waiting: VecDeque::new(),
            stalls: 0,
            counted: 0,
        }
    }

    /// Queues a request for a physical tag.
    pub fn enqueue(&mut self, req: T) {
        self.waiting.push_back(req);
    }

    /// Takes the oldest waiting request together with a free physical tag, if both exist.
    pub fn take(&mut self) -> Option<(u16, T)> {
        if self.waiting.is_empty() {
            return None;
        }
        let Some(tag) = self.free.pop() else {
            // Every request waiting now found the pool empty: count each once.
            self.stalls += (self.waiting.len() - self.counted) as u64;
            self.counted = self.waiting.len();
            return None;
        };
        let req = self.waiting.pop_front().expect("checked non-empty");
        self.counted = self.counted.saturating_sub(1);
        Some((tag, req))
    }

    /// Returns a physical tag to the pool.
    pub fn release(&mut self, tag: u16) {
        debug_assert!((tag as usize) < self.capacity && !self.free.contains(&tag));
        self.free.push(tag);
    }

    /// Removes waiting requests for which `drop_it` says so, handing each to `f`.
    pub fn drain_waiting(&mut self, mut drop_it: impl FnMut(&T) -> bool, mut f: impl FnMut(T)) {
        let mut keep = VecDeque::with_capacity(self.waiting.len());
        for r in self.waiting.drain(..) {
            if drop_it(&r) {
                f(r)
            } else {
                keep.push_back(r)
            }
        }
        self.waiting = keep;
        self.counted = self.counted.min(self.waiting.len());
    }

    /// Physical tags in the pool.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Physical tags held now.
    pub fn in_use(&self) -> usize {
        self.capacity - self.free.len()
    }

    /// Requests waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests that had to wait so far.
    pub fn stalls(&self) -> u64 {
        self.stalls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_in_order_when_pool_is_empty() {
        let mut r = Retag::new(2);
        for i in 0..4 {
            r.enqueue(i);
        }
        let (t0, a) = r.take().unwrap();
        let (t1, b) = r.take().unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(r.stalls(), 0);
        assert!(r.take().is_none());
        assert_eq!(r.in_use(), 2);
        assert_eq!(r.stalls(), 2);
        r.enqueue(4);
        assert!(r.take().is_none());
        assert_eq!(r.stalls(), 3);
        r.release(t1);
        assert_eq!(r.take().unwrap().1, 2);
        r.release(t0);
        assert_eq!(r.take().unwrap().1, 3);
        let mut dropped = vec![];
        r.drain_waiting(|&x| x == 4, |x| dropped.push(x));
        assert_eq!(dropped, vec![4]);
        assert_eq!(r.waiting(), 0);
    }
}
