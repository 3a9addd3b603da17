//! The Moneta array in time and power (Moneta §II, §IV, §V): the hardware under the channels.
//!
//! A request the device takes goes to the model's scheduler, which splits it into transfers of
//! at most a stripe (8 KB) and gives each a scheduler buffer as one frees, in the order its
//! policy says (FIFO, two queues, round-robin in pieces). A transfer then passes through the
//! resources of the array one after the other, each a server that does one thing at a time:
//!
//! - read: the memory controller of its stripe opens the row into the bank's row buffer (the
//!   array read latency, unless the row is open already) and moves the bytes into its
//!   outgoing queue at the controller's rate; the ring carries them to the scheduler buffer;
//!   the link carries them to the host (DMA); the buffer frees;
//! - write: the link carries the bytes from the host into a scheduler buffer; once the
//!   controller's incoming queue has room (the scoreboard), the ring carries them there and
//!   the buffer frees; the controller opens the row (unless the write covers it whole), moves
//!   the bytes into the row buffer and writes the row back as it closes it (the array write
//!   latency): Moneta keeps no row open after a write, for durability.
//!
//! Each resource starts a transfer when both the transfer and the resource are ready, so
//! queueing, contention and parallelism come out of the model rather than out of fixed delays.
//! A request completes when its last transfer does. Time is kept in picoseconds.
//!
//! The model is pure and deterministic: it is driven by [`Model::submit`] and
//! [`Model::advance`] with the caller's clock, and it decides a transfer only once the clock
//! has reached the time it starts, so a request that arrives later can still be served first
//! where the policy says so. Wear leveling ([`startgap`]) maps each controller's rows; the
//! power model (Table I) integrates what the resources did ([`Energy`]).

pub mod buffer;
pub mod config;
mod parts;
pub mod report;
pub mod startgap;
mod stats;
mod transfer;
pub mod wear;

use std::collections::VecDeque;

pub use buffer::{BufferPolicy, BufferStats};
use buffer::{Fill, LineBuffer};
pub use config::{ModelConfig, Policy, Power, PRESETS};
use parts::{Calendar, ChanOrder, Divisor, Epoch, IdMap, Pow2, Rate, Req, Slab};
use startgap::StartGap;
pub use stats::{ControllerStats, ControllerWear, Energy, ModelStats, Wear};
use wear::{Rows, WearFile};

/// Picoseconds per nanosecond.
const PS: u64 = 1000;

/// Most lines one hint fills ([`Model::hint`]): the device's poller works through a hint in
/// one go, as it moves at most a piece of a large request per pass, so a channel ringing
/// hints on every tag cannot hold the others up for long.
pub const HINT_LINES: u64 = 64;

/// A request for the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submit {
    /// The caller's name for it, given back with its completion time.
    pub id: u64,
    /// A write (else a read).
    pub write: bool,
    /// Array address.
    pub addr: u64,
    /// Bytes (at least 1).
    pub len: u64,
    /// The channel it came from (barriers order a channel's requests).
    pub channel: u32,
    /// A barrier: no later request of the channel issues before this one and every earlier
    /// one of the channel have completed.
    pub barrier: bool,
    /// For a read: the end of the extent it lies in (of the permission record covering its
    /// last byte, and those contiguous with it), how far the DRAM buffer may read ahead;
    /// `addr + len` (or less) for none.
    pub reach: u64,
}

/// One memory controller and its memory.
#[derive(Debug)]
struct Controller {
    core: Calendar,
    /// When the incoming (writes) and outgoing (reads) queues are free again.
    inq_free: u64,
    outq_free: u64,
    /// The row open in each bank's row buffer (physical row).
    open: Vec<Option<u64>>,
    wear_level: StartGap,
    /// Writes per physical row (`lines + 1` rows with the gap).
    wear: Rows,
    /// Time the memory woke, and when its last access ended.
    awake_since: u64,
    last_end: u64,
    awake_total: u64,
    /// Whether the memory has been woken at all.
    woken: bool,
    transfers: u64,
    queue_wait: u64,
    row_hits: u64,
    row_misses: u64,
    gap_moves: u64,
}

/// Counts the energy model integrates, besides busy times.
#[derive(Debug, Default, Clone, Copy)]
struct Bits {
    array_read: u64,
    array_written: u64,
    buffer_read: u64,
    buffer_written: u64,
}

/// Work done so far, by the resources of the array.
#[derive(Debug, Default, Clone, Copy)]
struct Work {
    reads: u64,
    writes: u64,
    bytes_read: u64,
    bytes_written: u64,
    transfers: u64,
    bits: Bits,
}

/// A scheduler buffer a write's next transfer would get: the request's slot, the buffer and the
/// span from the DMA's start to the ring's end.
#[derive(Debug, Clone, Copy)]
struct WriteFit {
    slot: usize,
    buffer: usize,
    span: (u64, u64),
}

/// The model of one array.
#[derive(Debug)]
pub struct Model {
    cfg: ModelConfig,
    size: u64,
    /// The rates of the link, the ring and a controller.
    link_ps: Rate,
    ring_ps: Rate,
    ctrl_ps: Rate,
    /// The stripe, the number of controllers, the row and the banks of a controller.
    stripe: Pow2,
    ctrl_count: Divisor,
    row: Pow2,
    banks: Divisor,
    /// The largest transfer: a stripe, or less.
    piece: Pow2,
    link_overhead: u64,
    read_lat: u64,
    write_lat: u64,
    wake: u64,
    powerdown_after: u64,
    /// Scheduler buffers.
    buffers: Vec<Calendar>,
    buffer_busy: u64,
    /// Time at least one buffer was held (the scheduler and DMA engine busy).
    sched_busy: u64,
    sched_busy_until: u64,
    link_up: Calendar,
    link_down: Calendar,
    ring: Calendar,
    ctrls: Vec<Controller>,
    /// Requests, by slot: the queues hold slots, so the path of a transfer looks nothing up.
    reqs: Slab,
    /// Queues of request ids: one for [`Policy::Fifo`], reads then writes otherwise.
    queues: [VecDeque<usize>; 2],
    /// The queue the last transfer came from.
    last_queue: usize,
    /// Requests waiting for room in the scheduler's queues.
    backlog: VecDeque<usize>,
    queued: usize,
    chans: IdMap<u32, ChanOrder>,
    /// Whether any barrier has come: until one does, no request waits for another of its
    /// channel and the epochs are not counted.
    ordered: bool,
    /// The time of the first request, where energy starts counting.
    origin: Option<u64>,
    /// The latest time the model was advanced to.
    now: u64,
    /// The time of the last decision (transfers issue in time order).
    clock: u64,
    work: Work,
    /// Chooses the address randomization (named by the wear file).
    seed: u64,
    /// Where the wear lasts, when it is kept in a file.
    wear_file: Option<WearFile>,
    /// The next decision (queue, position, time in picoseconds) as last worked out
    /// (`Some(None)`: nothing queued); `None` once something it depends on has changed: a
    /// transfer issued, or a request arrived that the policy could take first.
    next_cache: Option<Option<(usize, usize, u64)>>,
    /// The scheduler buffer the last write looked at by [`Model::gate`] would get, kept until
    /// anything is booked: its issue then takes it as found.
    write_fit: std::cell::Cell<Option<WriteFit>>,
    /// The DRAM buffer in front of the array, if the configuration has one.
    buffer: Option<LineBuffer>,
    /// Its latency and rate.
    buffer_lat: u64,
    buffer_ps: Rate,
}

impl Model {
    /// A model of `cfg` over an array of `size` bytes; `seed` chooses the address
    /// randomization of wear leveling (keep it with the wear counts).
    pub fn new(cfg: ModelConfig, size: u64, seed: u64) -> Result<Model, String> {
        cfg.validate()?;
        if size == 0 {
            return Err("model: the array is empty".into());
        }
        let c = cfg.controllers as u64;
        let per_ctrl = size.div_ceil(c).max(1);
        let lines = per_ctrl.div_ceil(cfg.row).max(1);
        let ctrls = (0..cfg.controllers)
            .map(|i| Controller {
                core: Calendar::default(),
                inq_free: 0,
                outq_free: 0,
                open: vec![None; cfg.banks_per_controller()],
                wear_level: StartGap::new(
                    lines,
                    cfg.gap_interval,
                    cfg.randomize,
                    seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                ),
                wear: Rows::memory(lines as usize + 1),
                awake_since: 0,
                last_end: 0,
                awake_total: 0,
                woken: false,
                transfers: 0,
                queue_wait: 0,
                row_hits: 0,
                row_misses: 0,
                gap_moves: 0,
            })
            .collect();
        Ok(Model {
            link_ps: Rate::new(cfg.link_rate),
            ring_ps: Rate::new(cfg.ring_rate),
            ctrl_ps: Rate::new(cfg.ctrl_rate),
            stripe: Pow2::new(cfg.stripe),
            ctrl_count: Divisor::new(c),
            row: Pow2::new(cfg.row),
            banks: Divisor::new(cfg.banks_per_controller() as u64),
            piece: Pow2::new(cfg.transfer_max.min(cfg.stripe)),
            link_overhead: (cfg.link_overhead_ns * PS as f64).round() as u64,
            read_lat: (cfg.read_ns * PS as f64).round() as u64,
            write_lat: (cfg.write_ns * PS as f64).round() as u64,
            wake: (cfg.wake_ns * PS as f64).round() as u64,
            powerdown_after: (cfg.powerdown_after_ns * PS as f64).round() as u64,
            buffers: vec![Calendar::default(); cfg.sched_buffers],
            buffer_busy: 0,
            sched_busy: 0,
            sched_busy_until: 0,
            link_up: Calendar::default(),
            link_down: Calendar::default(),
            ring: Calendar::default(),
            ctrls,
            reqs: Slab::default(),
            queues: [VecDeque::new(), VecDeque::new()],
            last_queue: 1,
            backlog: VecDeque::new(),
            queued: 0,
            chans: IdMap::default(),
            ordered: false,
            origin: None,
            now: 0,
            clock: 0,
            work: Work::default(),
            seed,
            wear_file: None,
            next_cache: None,
            write_fit: std::cell::Cell::new(None),
            buffer: (cfg.buffer > 0)
                .then(|| LineBuffer::new(cfg.buffer, cfg.buffer_line, cfg.buffer_policy)),
            buffer_lat: (cfg.buffer_ns * PS as f64).round() as u64,
            buffer_ps: Rate::new(cfg.buffer_rate),
            size,
            cfg,
        })
    }

    /// Keeps the wear (row counts and start-gap registers) in a file beside `base` (a
    /// persistent array's path), named by the array's geometry: the counts and registers of an
    /// earlier run continue, and later writes land in the file as they are counted (see
    /// [`wear`]). Call before the first request.
    pub fn keep_wear_in(&mut self, base: &std::path::Path) -> Result<&WearFile, String> {
        let geo = wear::Geometry {
            size: self.size,
            controllers: self.ctrls.len(),
            lines: self.ctrls[0].wear_level.lines(),
            row: self.cfg.row,
            stripe: self.cfg.stripe,
            randomize: self.cfg.randomize,
            seed: self.seed,
        };
        let (file, rows, regs) = wear::open(base, geo)?;
        for ((c, rows), (start, gap, writes)) in self.ctrls.iter_mut().zip(rows).zip(regs) {
            if !c.wear_level.restore(start, gap, writes) {
                return Err(format!(
                    "wear file {}: start-gap registers do not fit",
                    file.path().display()
                ));
            }
            c.wear = rows;
            c.wear.save_registers(c.wear_level.registers());
        }
        Ok(self.wear_file.insert(file))
    }

    /// The wear file, when the wear is kept in one.
    pub fn wear_file(&self) -> Option<&WearFile> {
        self.wear_file.as_ref()
    }

    /// The parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Requests taken and not yet given a completion time.
    pub fn pending(&self) -> usize {
        self.reqs.live
    }

    /// Takes a request that arrives at `now_ns`. Requests of a channel issue in the order
    /// given here, except as the policy interleaves them with other requests.
    pub fn submit(&mut self, s: Submit, now_ns: u64) {
        let now = now_ns * PS;
        self.now = self.now.max(now);
        self.origin.get_or_insert(now);
        let epoch = if s.barrier || self.ordered {
            self.epoch_of(&s)
        } else {
            0
        };
        let len = s.len.max(1);
        let end = s.addr.saturating_add(len).min(self.size);
        let addr = s.addr.min(end.saturating_sub(1));
        // The mapping of its first row is read when it issues; start fetching it now.
        let (ci, local) = self.place(addr);
        self.ctrls[ci]
            .wear_level
            .prefetch(self.row.div_rem(local).0);
        let slot = self.reqs.insert(Req {
            s: Submit {
                addr,
                len: end - addr,
                ..s
            },
            epoch,
            next: addr,
            done: now,
            ready: now,
        });
        if self.queued < self.cfg.sched_requests {
            // The decision stands unless the request can be the one its queue offers: the
            // front of an empty queue, or any under round-robin or barriers.
            let q = self.queue_of(s.write);
            if self.queues[q].is_empty() || self.ordered || self.cfg.policy == Policy::RoundRobin {
                self.next_cache = None;
            }
            // Ready now: in the queue at once.
            self.queues[q].push_back(slot);
            self.queued += 1;
        } else {
            self.backlog.push_back(slot);
        }
    }

    /// The barrier epoch of its channel a request joins, once any barrier has come (kept out
    /// of line, so that the path of a request where no barrier has come stays short).
    #[inline(never)]
    fn epoch_of(&mut self, s: &Submit) -> u64 {
        if s.barrier && !self.ordered {
            // The first barrier: from now on every channel's requests are counted in epochs,
            // those already here in each channel's first.
            self.ordered = true;
            for r in self.reqs.iter() {
                Model::join_epoch(self.chans.entry(r.s.channel).or_default(), 0);
            }
        }
        let ord = self.chans.entry(s.channel).or_default();
        let epoch = ord.current;
        Model::join_epoch(ord, epoch);
        if s.barrier {
            ord.current += 1;
        }
        epoch
    }

    /// Counts a request in `epoch` of its channel.
    fn join_epoch(ord: &mut ChanOrder, epoch: u64) {
        match ord.open.back_mut() {
            Some((e, st)) if *e == epoch => st.unknown += 1,
            _ => ord.open.push_back((
                epoch,
                Epoch {
                    unknown: 1,
                    latest: 0,
                },
            )),
        }
    }

    fn queue_of(&self, write: bool) -> usize {
        match self.cfg.policy {
            Policy::Fifo => 0,
            Policy::TwoQueue | Policy::RoundRobin => usize::from(write),
        }
    }

    fn enqueue(&mut self, id: usize, at: u64) {
        let r = &mut self.reqs[id];
        r.ready = r.ready.max(at);
        let write = r.s.write;
        let q = self.queue_of(write);
        self.queues[q].push_back(id);
        self.queued += 1;
    }

    /// When request `id` may issue at the earliest, `None` while a barrier holds it back.
    fn ready_at(&self, id: usize) -> Option<u64> {
        let r = &self.reqs[id];
        if !self.ordered {
            return Some(r.ready);
        }
        let after = self.chans.get(&r.s.channel)?.eligible(r.epoch)?;
        Some(r.ready.max(after))
    }

    /// The position in queue `q` of the request whose next transfer the policy takes next,
    /// with the time it is ready and the time it can issue. FIFO and two-queue scheduling
    /// process a queue in order: its first request goes next, and while it waits (for a
    /// barrier, its controller or a buffer) so does everything behind it, as Moneta's
    /// in-order scheduler did. Round-robin takes, in queue order, the request that can
    /// issue first: one that a barrier holds back is not in the running (Moneta+Balance
    /// inserts requests after a barrier only once it has completed).
    fn candidate(&self, q: usize) -> Option<(usize, u64, u64)> {
        match self.cfg.policy {
            Policy::Fifo | Policy::TwoQueue => {
                let id = *self.queues[q].front()?;
                self.candidate_at(0, id)
            }
            Policy::RoundRobin if self.queues[q].len() == 1 => {
                self.candidate_at(0, self.queues[q][0])
            }
            Policy::RoundRobin => {
                // The one that can issue first; the first in the queue of those that tie.
                let mut best: Option<(usize, u64, u64)> = None;
                for (pos, &id) in self.queues[q].iter().enumerate() {
                    if let Some(c) = self.candidate_at(pos, id) {
                        if best.is_none_or(|b| c.2 < b.2) {
                            best = Some(c);
                        }
                    }
                }
                best
            }
        }
    }

    /// Request `id`, at position `pos` of its queue, as a candidate: its position, when it
    /// is ready and when it can issue; `None` while a barrier holds it back.
    fn candidate_at(&self, pos: usize, id: usize) -> Option<(usize, u64, u64)> {
        let ready = self.ready_at(id)?;
        // Its resources are looked for from the last decision on: a gap before it is past
        // (and its calendars may have forgotten what filled it).
        Some((pos, ready, ready.max(self.gate(id, ready.max(self.clock)))))
    }

    /// When the next transfer of request `id`, ready at `ready`, can start: a write needs a
    /// scheduler buffer to receive it from the host, a read needs room in its controller's
    /// outgoing queue (the scoreboard).
    fn gate(&self, id: usize, ready: u64) -> u64 {
        let r = &self.reqs[id];
        let ci = self.place(r.next).0;
        if r.s.write {
            let (ring_d, link_d) = self.wire(self.next_len(r));
            let stages = Model::write_stages(ring_d, link_d, self.ctrls[ci].inq_free);
            // It issues when its DMA starts into the buffer it gets.
            let (_, b, span) = self.find_buffer(ready, stages);
            self.write_fit.set(Some(WriteFit {
                slot: id,
                buffer: b,
                span,
            }));
            span.0
        } else if self.buffered(r.next, self.next_len(r)) {
            // Served from the DRAM buffer: the controller's queue is not on its path.
            ready
        } else {
            self.ctrls[ci].outq_free
        }
    }

    /// Whether the DRAM buffer holds every line of `[addr, addr + len)`.
    fn buffered(&self, addr: u64, len: u64) -> bool {
        self.buffer
            .as_ref()
            .is_some_and(|b| b.holds(b.line_of(addr), b.line_of(addr + len - 1)))
    }

    /// The controller of array address `addr` and the address within it.
    fn place(&self, addr: u64) -> (usize, u64) {
        let (stripe, within) = self.stripe.div_rem(addr);
        let (round, ci) = self.ctrl_count.div_rem(stripe);
        (ci as usize, round * self.cfg.stripe + within)
    }

    /// The next transfer to issue: its queue, position and time.
    fn pick(&self) -> Option<(usize, usize, u64)> {
        if self.queued == 0 {
            return None;
        }
        // Each queue's candidate: (position, ready, issue time), the times raised to the last
        // decision's, as decisions are made in time order.
        let clock = self.clock;
        let cand = |q: usize| {
            if self.queues[q].is_empty() {
                return None;
            }
            self.candidate(q)
                .map(|(pos, ready, t)| (pos, ready.max(clock), t.max(clock)))
        };
        let reads = cand(0);
        let writes = match self.cfg.policy {
            Policy::Fifo => None,
            Policy::TwoQueue | Policy::RoundRobin => cand(1),
        };
        // The one that can issue first (the first queue's when they tie), and the other's.
        let (q, first, other) = match (reads, writes) {
            (Some(a), Some(b)) if b.2 < a.2 => (1, b, Some(a)),
            (Some(a), b) => (0, a, b),
            (None, Some(b)) => (1, b, None),
            (None, None) => return None,
        };
        // The two queues are taken in turn: after a transfer of one, the other goes next when
        // it has a request waiting by then, even if that one must wait for its resources.
        if let Some(o) = other {
            if 1 - q != self.last_queue && o.1 <= first.2 {
                return Some((1 - q, o.0, o.2));
            }
        }
        Some((q, first.0, first.2))
    }

    /// When the next transfer would issue, if anything is queued: the caller should advance
    /// the model again by then (in nanoseconds, rounded up).
    pub fn next_event_ns(&self) -> Option<u64> {
        match self.next_cache {
            Some(next) => next,
            None => self.pick(),
        }
        .map(|(_, _, t)| t.div_ceil(PS))
    }

    /// Issues every transfer whose start the clock has reached, and hands `done` each request
    /// whose completion time is now known (it may lie ahead of `now_ns`), in nanoseconds
    /// rounded up.
    pub fn advance(&mut self, now_ns: u64, mut done: impl FnMut(u64, u64)) {
        let now = now_ns * PS;
        self.now = self.now.max(now);
        let mut next = match self.next_cache.take() {
            Some(next) => next,
            None => self.pick(),
        };
        loop {
            let Some((q, pos, t)) = next else {
                self.next_cache = Some(None);
                break;
            };
            if t > now {
                // The next decision, kept until something it depends on changes.
                self.next_cache = Some(next);
                break;
            }
            let id = self.queues[q][pos];
            self.clock = t;
            let finished = self.issue(id, t);
            self.last_queue = q;
            if finished {
                if pos == 0 {
                    self.queues[q].pop_front();
                } else {
                    self.queues[q].remove(pos);
                }
                self.queued -= 1;
                let (rid, rdone, channel, epoch) = {
                    let r = &self.reqs[id];
                    (r.s.id, r.done, r.s.channel, r.epoch)
                };
                self.reqs.release(id);
                if self.ordered {
                    if let Some(ord) = self.chans.get_mut(&channel) {
                        ord.known(epoch, rdone);
                    }
                }
                done(rid, rdone.div_ceil(PS));
                if let Some(next) = self.backlog.pop_front() {
                    self.enqueue(next, t);
                }
            } else if self.cfg.policy == Policy::RoundRobin {
                // Moneta+Balance: the rest of the request goes to the back of its queue.
                let id = self.queues[q].remove(pos).expect("queued");
                self.queues[q].push_back(id);
            }
            next = if self.queued == 0 { None } else { self.pick() };
        }
    }

    /// Issues the next transfer of request `id` at `t`; returns whether that was its last.
    fn issue(&mut self, id: usize, t: u64) -> bool {
        let (write, addr, len, reach) = {
            let r = &self.reqs[id];
            (r.s.write, r.next, self.next_len(r), r.s.reach)
        };
        let (ci, local) = self.place(addr);
        if self.work.transfers.is_multiple_of(8) {
            self.prune(t);
        }
        // What the gate found still holds if nothing was booked since and the transfer
        // issues when the gate said.
        let fit = self
            .write_fit
            .take()
            .filter(|f| f.slot == id && f.span.0 == t)
            .map(|f| (f.buffer, f.span));
        let end = if write {
            self.write_transfer(ci, local, len, t, fit)
        } else if self.buffer.is_some() {
            let end = self.buffered_read(ci, local, addr, len, t);
            self.read_ahead(addr + len, reach, t);
            end
        } else {
            self.read_transfer(ci, local, len, t)
        };
        self.work.transfers += 1;
        if write {
            self.work.bytes_written += len;
        } else {
            self.work.bytes_read += len;
        }
        let r = &mut self.reqs[id];
        if r.next == r.s.addr {
            if write {
                self.work.writes += 1;
            } else {
                self.work.reads += 1;
            }
        }
        r.next = addr + len;
        r.done = r.done.max(end);
        r.next >= r.s.addr + r.s.len
    }

    /// Forgets everything that ended by the last decision, in every calendar: what the model
    /// decides must not change (no query looks before the last decision).
    #[cfg(test)]
    fn forget_past(&mut self) {
        let t = self.clock;
        let cals = [&mut self.ring, &mut self.link_up, &mut self.link_down]
            .into_iter()
            .chain(self.buffers.iter_mut())
            .chain(self.ctrls.iter_mut().map(|c| &mut c.core));
        for cal in cals {
            let i = cal.spans.partition_point(|&(_, e)| e <= t);
            cal.spans.drain(..i);
        }
    }

    /// Forgets what ended by `t` in the calendars every transfer may book, every eighth
    /// transfer; a controller's is pruned when work is booked on it
    /// ([`Model::controller_work`]). No query ever looks before the last decision, so pruning
    /// only bounds the calendars' length.
    fn prune(&mut self, t: u64) {
        self.ring.prune(t);
        self.link_up.prune(t);
        self.link_down.prune(t);
        for b in &mut self.buffers {
            b.prune(t);
        }
    }
}

#[cfg(test)]
mod tests;
