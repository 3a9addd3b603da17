//! The array's timing model under the engine (Moneta §II): every read and write the device
//! serves goes to the model once its data has moved, and completes when the model says.
//!
//! The model decides a request's completion only once the device's clock has reached the start
//! of its last transfer, so the scheduler holds it as [`UNDECIDED`] until then. The model is
//! advanced when a request arrives and whenever the clock passes the next time it has
//! something to decide, which it says in advance: a pass with nothing due costs one comparison.

use moneta_abi::{Decoded, Opcode};

use super::Issued;
use crate::model::{Model, ModelStats, Submit};
use crate::scheduler::{Scheduler, UNDECIDED};

/// The model and when it next needs the clock.
pub(crate) struct Timed {
    model: Model,
    /// Where the array lies in the address space (the model's addresses are the array's).
    local_at: u64,
    /// The time of the model's next decision, if it has anything queued.
    next_ns: Option<u64>,
    /// How far behind the model's times the device published completions.
    late: Lateness,
    /// How long before a completion's time the device starts publishing it (see
    /// [`Timed::publish_cost`]).
    lead_ns: u64,
    /// The cheapest publication in the current window of [`LEAD_WINDOW`], and their count.
    window_min: u64,
    window_n: u32,
    /// Completion times decided since the device last looked: (scheduler seq, ns).
    pub(super) decided: Vec<(u64, u64)>,
}

/// Completions published after the time the model gave them: the emulator falling behind the
/// array it models (the host, not the model, then sets the pace).
#[derive(Clone, Copy, Debug, Default)]
pub struct Lateness {
    /// Requests completed at the model's time.
    pub completions: u64,
    /// Of those, published more than [`LATE_NS`] after it.
    pub late: u64,
    /// Sum of the delays (ns).
    pub total_ns: u64,
    /// The longest delay (ns).
    pub max_ns: u64,
    /// How long before its time a completion is published now (see [`Timed::publish_cost`]).
    pub lead_ns: u64,
}

/// A completion published this much after its time counts as late.
pub const LATE_NS: u64 = 1_000;

/// Publications measured per estimate of the lead: the cheapest of them is taken.
const LEAD_WINDOW: u32 = 64;

/// The most the lead may be, whatever was measured.
const LEAD_MAX_NS: u64 = 1_000;

impl Timed {
    pub(crate) fn new(model: Model, local_at: u64) -> Timed {
        Timed {
            model,
            local_at,
            next_ns: None,
            late: Lateness::default(),
            lead_ns: 0,
            window_min: u64::MAX,
            window_n: 0,
            decided: Vec::new(),
        }
    }

    /// Issues request `cmd` of `channel` in the scheduler and hands it to the model, arriving
    /// at `now_ns`.
    /// `reach` is how far a read's extent goes (see [`Submit::reach`]).
    pub(super) fn submit(
        &mut self,
        sched: &mut Scheduler<Issued>,
        issued: Issued,
        reach: u64,
        now_ns: u64,
    ) {
        let seq = sched.issue(UNDECIDED, issued);
        self.submit_issued(sched, seq, reach, now_ns);
    }

    /// Hands the model request `seq`, issued (or reserved and now issued) in the scheduler as
    /// [`UNDECIDED`].
    pub(super) fn submit_issued(
        &mut self,
        sched: &mut Scheduler<Issued>,
        seq: u64,
        reach: u64,
        now_ns: u64,
    ) {
        let Some(r) = sched.find(seq) else {
            return;
        };
        let mut s = submission(seq, r.channel, &r.cmd, reach);
        s.addr -= self.local_at;
        s.reach = s.reach.saturating_sub(self.local_at);
        self.model.submit(s, now_ns);
        self.advance(sched, now_ns);
    }

    /// Whether the model reads ahead within a read's extent (so the device should say how far
    /// the extent goes).
    #[inline]
    pub(super) fn reads_ahead(&self) -> bool {
        let c = self.model.config();
        c.buffer > 0 && c.readahead > 0
    }

    /// A client's hint that `[addr, addr + len)` will be read soon (`OP_WILLNEED`), at
    /// `now_ns`: the model decides what it can first, so the buffer fills in time order.
    pub(super) fn hint(&mut self, sched: &mut Scheduler<Issued>, addr: u64, len: u64, now_ns: u64) {
        self.advance(sched, now_ns);
        self.model.hint(addr, len, now_ns);
        self.next_ns = self.model.next_event_ns();
    }

    /// Whether the model has a decision due at `now_ns`.
    #[inline]
    pub(super) fn due(&self, now_ns: u64) -> bool {
        self.next_ns.is_some_and(|t| t <= now_ns)
    }

    /// Lets the model decide what it can at `now_ns`, and gives the scheduler the completion
    /// times it decided.
    pub(super) fn advance(&mut self, sched: &mut Scheduler<Issued>, now_ns: u64) {
        let decided = &mut self.decided;
        self.model.advance(now_ns, |seq, done| {
            sched.set_ready(seq, done);
            decided.push((seq, done));
        });
        self.next_ns = self.model.next_event_ns();
    }

    /// A request the model timed for `ready_ns` was published at `now_ns`.
    #[inline]
    pub(super) fn completed(&mut self, ready_ns: u64, now_ns: u64) {
        let d = now_ns.saturating_sub(ready_ns);
        let l = &mut self.late;
        l.completions += 1;
        l.total_ns += d;
        l.max_ns = l.max_ns.max(d);
        l.late += u64::from(d > LATE_NS);
    }

    /// What the emulator's lateness has been, and its lead now.
    pub(super) fn lateness(&self) -> Lateness {
        Lateness {
            lead_ns: self.lead_ns,
            ..self.late
        }
    }

    /// How long before a completion's time the device starts publishing it: what publishing
    /// one has cost lately (see [`Timed::publish_cost`]).
    #[inline]
    pub(super) fn lead(&self) -> u64 {
        self.lead_ns
    }

    /// A completion's publication took `cost_ns` from the pass's clock to its status store
    /// done (the store must first take the status line from the core of a client that is
    /// waiting on it).
    ///
    /// Without a model that cost overlaps the copy's: the completion's store leaves right
    /// behind the copy's stores and takes its line while they drain. With one it comes after
    /// the model's time, which starts once the copy has drained ([`moved_ns`]), so the client
    /// would see every request that much later than the model says, a few hundred nanoseconds.
    /// So a completion is published that long before its time, to be seen at it. The lead is
    /// the cheapest publication of each window of [`LEAD_WINDOW`] (a pass that was preempted
    /// or found the line at hand says nothing of the usual cost; the cheapest errs late), and
    /// at most [`LEAD_MAX_NS`].
    pub(super) fn publish_cost(&mut self, cost_ns: u64) {
        self.window_min = self.window_min.min(cost_ns);
        self.window_n += 1;
        if self.window_n >= LEAD_WINDOW {
            self.lead_ns = self.window_min.min(LEAD_MAX_NS);
            self.window_min = u64::MAX;
            self.window_n = 0;
        }
    }

    /// When the model next needs the clock.
    pub(super) fn next_event(&self) -> Option<u64> {
        self.next_ns
    }

    /// The wear file, when the model keeps its wear in one.
    pub(super) fn wear_file(&self) -> Option<&crate::model::wear::WearFile> {
        self.model.wear_file()
    }

    /// What the model has done, up to `now_ns`.
    pub(super) fn stats(&self, now_ns: u64) -> ModelStats {
        self.model.stats(now_ns)
    }
}

/// The device's time once the data a request moved has reached the memory system: the copy's
/// stores drained from the core's store buffer (a full fence) and the clock read after them (a
/// load fence keeps the time-stamp counter from being read ahead of the fence). The model's
/// time starts there. Without the fence, a read's copy into a DMA slice that the client's core
/// holds drains only at the completion's store, after the model's time, and the client saw the
/// model add a few hundred nanoseconds less than it said, where an unmodelled device pays that
/// drain before its completion.
#[inline]
pub(super) fn moved_ns<C: crate::clock::Clock>(clock: &C) -> u64 {
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: LFENCE has no preconditions; SSE2 is part of every x86-64 processor.
    unsafe {
        core::arch::x86_64::_mm_lfence()
    };
    clock.now_ns()
}

/// What the model needs to know of a request.
fn submission(id: u64, channel: u32, cmd: &Decoded, reach: u64) -> Submit {
    Submit {
        reach,
        id,
        write: cmd.opcode == Opcode::Write,
        addr: cmd.addr,
        len: cmd.len.max(1),
        channel,
        barrier: cmd.barrier,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelConfig;

    fn timed() -> Timed {
        Timed::new(Model::new(ModelConfig::pcm(), 1 << 30, 1).unwrap(), 0)
    }

    #[test]
    fn the_lead_is_the_cheapest_publication_of_each_window() {
        let mut t = timed();
        // Nothing is led until a window has been seen.
        for i in 0..LEAD_WINDOW - 1 {
            t.publish_cost(200 + u64::from(i));
            assert_eq!(t.lead(), 0);
        }
        t.publish_cost(150);
        assert_eq!(t.lead(), 150);
        // A preempted pass among cheap ones changes nothing; the next window is its own.
        for i in 0..LEAD_WINDOW {
            t.publish_cost(if i == 7 {
                5_000_000
            } else {
                120 + u64::from(i % 3)
            });
        }
        assert_eq!(t.lead(), 120);
        assert_eq!(t.lateness().lead_ns, 120);
    }

    #[test]
    fn the_lead_stays_under_its_bound() {
        let mut t = timed();
        for _ in 0..LEAD_WINDOW {
            t.publish_cost(3 * LEAD_MAX_NS);
        }
        assert_eq!(t.lead(), LEAD_MAX_NS);
    }
}
