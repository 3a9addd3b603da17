//! The retag unit (Moneta-D §4.2): virtual tags of all channels share a bounded pool of physical
//! tags. A request that finds none free waits until one is released.
//!
//! Waiting requests are kept per channel, each channel's in arrival order, and the channels are
//! served round-robin, one request each in turn (Moneta §IV's round-robin service, between
//! channels): a client that keeps all 64 of its tags busy with large requests then delays
//! another's request by one of its requests, not by all of them.

use std::collections::{HashMap, VecDeque};

/// A bounded pool of physical tags and the requests waiting for one.
pub struct Retag<T> {
    free: Vec<u16>,
    capacity: usize,
    /// Waiting requests by channel.
    queues: HashMap<u32, VecDeque<T>>,
    /// Channels with waiting requests, in the order they are served next.
    ring: VecDeque<u32>,
    waiting: usize,
    stalls: u64,
    /// Requests already counted as stalled (the oldest waiting ones).
    counted: usize,
}

impl<T> Retag<T> {
    /// A pool of `capacity` physical tags (1..=65535).
    pub fn new(capacity: usize) -> Self {
        assert!((1..=u16::MAX as usize).contains(&capacity));
        Self {
            free: (0..capacity as u16).rev().collect(),
            capacity,
            queues: HashMap::new(),
            ring: VecDeque::new(),
            waiting: 0,
            stalls: 0,
            counted: 0,
        }
    }

    /// Queues a request of `channel` for a physical tag.
    pub fn enqueue(&mut self, channel: u32, req: T) {
        let q = self.queues.entry(channel).or_default();
        if q.is_empty() {
            self.ring.push_back(channel);
        }
        q.push_back(req);
        self.waiting += 1;
    }

    /// Takes the next request in round-robin order, among channels `skip` does not name,
    /// together with a free physical tag, if both exist.
    pub fn take(&mut self, mut skip: impl FnMut(u32) -> bool) -> Option<(u16, T)> {
        if self.waiting == 0 {
            return None;
        }
        if self.free.is_empty() {
            // Every request waiting now found the pool empty: count each once.
            self.stalls += (self.waiting - self.counted) as u64;
            self.counted = self.waiting;
            return None;
        }
        let pos = self.ring.iter().position(|&c| !skip(c))?;
        let channel = self.ring.remove(pos).expect("found");
        let q = self
            .queues
            .get_mut(&channel)
            .expect("a channel in the ring has a queue");
        let req = q
            .pop_front()
            .expect("a channel in the ring has waiting requests");
        if q.is_empty() {
            self.queues.remove(&channel);
        } else {
            self.ring.push_back(channel);
        }
        self.waiting -= 1;
        self.counted = self.counted.saturating_sub(1);
        let tag = self.free.pop().expect("checked non-empty");
        Some((tag, req))
    }

    /// Returns a physical tag to the pool.
    pub fn release(&mut self, tag: u16) {
        debug_assert!((tag as usize) < self.capacity && !self.free.contains(&tag));
        self.free.push(tag);
    }

    /// Removes the waiting requests of `channel`, in order, handing each to `f`.
    pub fn drain_channel(&mut self, channel: u32, mut f: impl FnMut(T)) {
        if let Some(q) = self.queues.remove(&channel) {
            self.ring.retain(|&c| c != channel);
            self.waiting -= q.len();
            self.counted = self.counted.min(self.waiting);
            q.into_iter().for_each(&mut f);
        }
    }

    /// Channels with requests waiting now.
    pub fn channels_waiting(&self) -> usize {
        self.ring.len()
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
        self.waiting
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
    fn waits_when_the_pool_is_empty() {
        let mut r = Retag::new(2);
        for i in 0..4 {
            r.enqueue(7, i);
        }
        let (t0, a) = r.take(|_| false).unwrap();
        let (t1, b) = r.take(|_| false).unwrap();
        assert_eq!((a, b), (0, 1));
        assert_eq!(r.stalls(), 0);
        assert!(r.take(|_| false).is_none());
        assert_eq!(r.in_use(), 2);
        assert_eq!(r.stalls(), 2);
        r.enqueue(7, 4);
        assert!(r.take(|_| false).is_none());
        assert_eq!(r.stalls(), 3);
        r.release(t1);
        assert_eq!(r.take(|_| false).unwrap().1, 2);
        r.release(t0);
        assert_eq!(r.take(|_| false).unwrap().1, 3);
        let mut dropped = vec![];
        r.drain_channel(7, |x| dropped.push(x));
        assert_eq!(dropped, vec![4]);
        assert_eq!(r.waiting(), 0);
    }

    #[test]
    fn channels_take_turns() {
        let mut r = Retag::new(64);
        // A busy channel queues many requests, then a quiet one queues one.
        for i in 0..10 {
            r.enqueue(1, (1, i));
        }
        r.enqueue(2, (2, 0));
        r.enqueue(3, (3, 0));
        let order: Vec<(u32, i32)> = std::iter::from_fn(|| r.take(|_| false).map(|(_, x)| x))
            .take(5)
            .collect();
        assert_eq!(order, [(1, 0), (2, 0), (3, 0), (1, 1), (1, 2)]);
        // A skipped channel keeps its turn for later.
        r.enqueue(2, (2, 1));
        let (_, x) = r.take(|c| c == 1).unwrap();
        assert_eq!(x, (2, 1));
        assert_eq!(r.channels_waiting(), 1);
        assert!(r.take(|c| c == 1).is_none());
    }
}
