//! The scheduler: requests that hold a physical tag and wait for the time the media model says
//! they complete.
//!
//! Without a model of the array a request's time is known when it is issued: now, or now plus a
//! fixed latency per read and per write ([`Timing`]). With the array's timing model
//! ([`crate::model`]) it is [`UNDECIDED`] until the model has issued the request's last
//! transfer, and the engine then sets it ([`Scheduler::set_ready`]).

/// The completion time of a request the timing model has not decided yet.
pub const UNDECIDED: u64 = u64::MAX;

/// Per-access latencies the device adds on top of the data movement.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// Nanoseconds added to every read.
    pub read_ns: u64,
    /// Nanoseconds added to every write.
    pub write_ns: u64,
}

/// Requests in flight, each with the time it completes.
pub struct Scheduler<T> {
    in_flight: Vec<(u64, u64, T)>,
    next_seq: u64,
    /// Places in the issue order taken by requests not issued yet (still moving their data).
    reserved: Vec<u64>,
}

impl<T> Default for Scheduler<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Scheduler<T> {
    /// An empty scheduler.
    pub fn new() -> Self {
        Self {
            in_flight: Vec::new(),
            next_seq: 0,
            reserved: Vec::new(),
        }
    }

    /// Adds a request that completes at `ready_ns`; returns its issue sequence number.
    pub fn issue(&mut self, ready_ns: u64, req: T) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight.push((ready_ns, seq, req));
        seq
    }

    /// Takes a place in the issue order for a request that will be issued later (with
    /// [`Scheduler::issue_reserved`], or dropped with [`Scheduler::forget`]): it counts as in
    /// flight for fences from now on.
    pub fn reserve(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.reserved.push(seq);
        seq
    }

    /// Issues a request in the place `seq` reserved; it completes at `ready_ns`.
    pub fn issue_reserved(&mut self, ready_ns: u64, seq: u64, req: T) {
        self.forget(seq);
        self.in_flight.push((ready_ns, seq, req));
    }

    /// Sets the completion time of request `seq` (issued [`UNDECIDED`]); whether it is in
    /// flight.
    pub fn set_ready(&mut self, seq: u64, ready_ns: u64) -> bool {
        match self.in_flight.iter_mut().find(|(_, s, _)| *s == seq) {
            Some(e) => {
                e.0 = ready_ns.min(UNDECIDED - 1);
                true
            }
            None => false,
        }
    }

    /// Request `seq`, if it is in flight.
    pub fn find(&self, seq: u64) -> Option<&T> {
        self.in_flight
            .iter()
            .find(|(_, s, _)| *s == seq)
            .map(|(_, _, r)| r)
    }

    /// Whether a request issued before `fence` that satisfies `pred` is still in flight.
    pub fn any_before(&self, fence: u64, mut pred: impl FnMut(&T) -> bool) -> bool {
        self.in_flight
            .iter()
            .any(|(_, seq, r)| *seq < fence && pred(r))
    }

    /// Gives up a reserved place (the request completed without the scheduler).
    pub fn forget(&mut self, seq: u64) {
        self.reserved.retain(|&s| s != seq);
    }

    /// The sequence number the next issued request will get: a revocation applied now is
    /// safe once every request with a lower number has completed.
    pub fn fence(&self) -> u64 {
        self.next_seq
    }

    /// True when no request issued (or reserved) before `fence` is still in flight.
    pub fn passed(&self, fence: u64) -> bool {
        self.in_flight.iter().all(|&(_, seq, _)| seq >= fence)
            && self.reserved.iter().all(|&seq| seq >= fence)
    }

    /// Removes and hands to `f`, in issue order, every request ready at `now_ns`, with the
    /// time it was ready.
    pub fn complete_ready(&mut self, now_ns: u64, mut f: impl FnMut(u64, T)) -> usize {
        if self.in_flight.is_empty() {
            return 0;
        }
        let mut done = 0;
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].0 <= now_ns {
                let (ready, _, req) = self.in_flight.remove(i);
                f(ready, req);
                done += 1;
            } else {
                i += 1;
            }
        }
        done
    }

    /// The earliest completion time in flight that is decided.
    pub fn next_ready(&self) -> Option<u64> {
        self.in_flight
            .iter()
            .map(|&(t, _, _)| t)
            .filter(|&t| t != UNDECIDED)
            .min()
    }

    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    /// Whether any request in flight satisfies `pred`.
    pub fn any(&self, mut pred: impl FnMut(&T) -> bool) -> bool {
        self.in_flight.iter().any(|(_, _, r)| pred(r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completes_by_time_and_tracks_fences() {
        let mut s = Scheduler::new();
        s.issue(100, 'a');
        let f = s.fence();
        s.issue(50, 'b');
        assert!(!s.passed(f));
        let mut out = vec![];
        assert_eq!(s.complete_ready(60, |_, r| out.push(r)), 1);
        assert_eq!(out, vec!['b']);
        assert!(!s.passed(f));
        assert_eq!(s.next_ready(), Some(100));
        s.complete_ready(100, |_, r| out.push(r));
        assert!(s.passed(f) && s.is_empty());
        // A reserved place holds a fence until it is issued and completes, or is forgotten.
        let r = s.reserve();
        let f = s.fence();
        let g = s.fence();
        assert!(!s.passed(f));
        s.issue_reserved(300, r, 'c');
        assert!(!s.passed(f));
        s.complete_ready(300, |_, _| {});
        assert!(s.passed(f));
        let r = s.reserve();
        assert!(!s.passed(s.fence()));
        s.forget(r);
        assert!(s.passed(g));
    }
}
