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
pub mod report;
pub mod startgap;
pub mod wear;

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

pub use buffer::{BufferPolicy, BufferStats};
use buffer::{Fill, LineBuffer};
pub use config::{ModelConfig, Policy, Power, PRESETS};
use startgap::StartGap;
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

/// A request in the scheduler.
#[derive(Debug)]
struct Req {
    s: Submit,
    /// The barrier epoch of its channel it belongs to.
    epoch: u64,
    /// Next byte (array address) to issue.
    next: u64,
    /// The latest end of its issued transfers.
    done: u64,
    /// When it may issue at the earliest (arrival, or when it entered the scheduler's queue).
    ready: u64,
}

/// Requests in slots that are reused, so that the queues can hold slots.
#[derive(Debug, Default)]
struct Slab {
    slots: Vec<Option<Req>>,
    free: Vec<usize>,
    live: usize,
}

impl Slab {
    fn insert(&mut self, r: Req) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(r);
                i
            }
            None => {
                self.slots.push(Some(r));
                self.slots.len() - 1
            }
        }
    }

    fn remove(&mut self, i: usize) -> Req {
        let r = self.slots[i].take().expect("a queued slot holds a request");
        self.free.push(i);
        self.live -= 1;
        r
    }
}

impl std::ops::Index<usize> for Slab {
    type Output = Req;
    fn index(&self, i: usize) -> &Req {
        self.slots[i]
            .as_ref()
            .expect("a queued slot holds a request")
    }
}

impl std::ops::IndexMut<usize> for Slab {
    fn index_mut(&mut self, i: usize) -> &mut Req {
        self.slots[i]
            .as_mut()
            .expect("a queued slot holds a request")
    }
}

/// One barrier epoch of a channel: requests whose completion is not yet known, and the latest
/// completion among those known.
#[derive(Debug, Default, Clone, Copy)]
struct Epoch {
    unknown: u64,
    latest: u64,
}

#[derive(Debug, Default)]
struct ChanOrder {
    /// The epoch new requests join.
    current: u64,
    /// Open epochs, oldest first: (epoch, state).
    open: VecDeque<(u64, Epoch)>,
    /// Latest completion of the epochs closed and dropped.
    closed_latest: u64,
}

impl ChanOrder {
    /// When a request of `epoch` may issue: `None` while an earlier epoch has requests whose
    /// completion is not known yet.
    fn eligible(&self, epoch: u64) -> Option<u64> {
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

    fn known(&mut self, epoch: u64, done: u64) {
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

/// A resource that does one thing at a time, as a calendar of the spans it is booked for.
///
/// A transfer books each resource on its path when it issues, possibly for a span that lies
/// ahead; a later transfer that is ready earlier takes a free gap before that span if it fits,
/// so the resource serves work in the order it becomes ready rather than the order it was
/// issued (a read waiting for a slow row must not hold the ring from a write that is ready).
#[derive(Debug, Default, Clone)]
struct Calendar {
    /// Booked spans, sorted and disjoint.
    spans: Vec<(u64, u64)>,
    /// Time booked so far.
    busy: u64,
    /// The end of the latest span ever booked.
    last_end: u64,
}

impl Calendar {
    /// The earliest start at or after `ready` of a free span of `dur`.
    #[inline]
    fn fit(&self, ready: u64, dur: u64) -> u64 {
        if ready >= self.last_end {
            // Past everything booked: the usual case of a resource that keeps up.
            return ready;
        }
        let mut t = ready;
        let i = self.spans.partition_point(|&(_, e)| e <= t);
        for &(s, e) in &self.spans[i..] {
            if t + dur <= s {
                break;
            }
            t = t.max(e);
        }
        t
    }

    /// Whether `[s, e)` is free; if not, the end of the first span in the way.
    #[inline]
    fn conflict(&self, s: u64, e: u64) -> Option<u64> {
        if s >= self.last_end {
            return None;
        }
        let i = self.spans.partition_point(|&(_, end)| end <= s);
        match self.spans.get(i) {
            Some(&(bs, be)) if bs < e => Some(be),
            _ => None,
        }
    }

    /// Books `[s, s + dur)`, which must be free; returns its end.
    #[inline]
    fn book(&mut self, s: u64, dur: u64) -> u64 {
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
    fn prune(&mut self, t: u64) {
        if self.spans.first().is_none_or(|&(_, e)| e > t) {
            return;
        }
        let i = self.spans.partition_point(|&(_, e)| e <= t);
        if i > 0 {
            self.spans.drain(..i);
        }
    }
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
    stripe: Divisor,
    ctrl_count: Divisor,
    row: Divisor,
    banks: Divisor,
    /// The largest transfer: a stripe, or less.
    piece: Divisor,
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
    /// The DRAM buffer in front of the array, if the configuration has one.
    buffer: Option<LineBuffer>,
    /// Its latency and rate.
    buffer_lat: u64,
    buffer_ps: Rate,
}

/// Hashes the model's own ids (request and channel numbers) by one multiplication: they come
/// from the device, not from clients, and the tables are on the path of every request.
#[derive(Default)]
struct IdHasher(u64);

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

type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A transfer rate as picoseconds per byte in fixed point (32 fractional bits): the time of a
/// transfer is one multiplication, with no floating-point rounding on the request's path.
#[derive(Clone, Copy, Debug)]
struct Rate(u128);

impl Rate {
    fn new(gb_per_s: f64) -> Rate {
        let ps_per_byte = PS as f64 / gb_per_s;
        Rate((ps_per_byte * (1u64 << 32) as f64).round() as u128)
    }

    /// Picoseconds to move `bytes` (rounded to the nearest).
    #[inline]
    fn dur(self, bytes: u64) -> u64 {
        let ps = (u128::from(bytes) * self.0 + (1 << 31)) >> 32;
        u64::try_from(ps).unwrap_or(u64::MAX)
    }
}

/// `x / d` and `x % d` by a shift and a mask where `d` is a power of two (the usual case of
/// the model's geometry), else by division.
#[derive(Clone, Copy, Debug)]
struct Divisor {
    d: u64,
    shift: Option<u32>,
}

impl Divisor {
    fn new(d: u64) -> Divisor {
        Divisor {
            d,
            shift: d.is_power_of_two().then(|| d.trailing_zeros()),
        }
    }

    #[inline]
    fn div_rem(self, x: u64) -> (u64, u64) {
        match self.shift {
            Some(s) => (x >> s, x & (self.d - 1)),
            None => (x / self.d, x % self.d),
        }
    }
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
            stripe: Divisor::new(cfg.stripe),
            ctrl_count: Divisor::new(c),
            row: Divisor::new(cfg.row),
            banks: Divisor::new(cfg.banks_per_controller() as u64),
            piece: Divisor::new(cfg.transfer_max.min(cfg.stripe)),
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
        if s.barrier && !self.ordered {
            // The first barrier: from now on every channel's requests are counted in epochs,
            // those already here in each channel's first.
            self.ordered = true;
            for r in self.reqs.slots.iter().flatten() {
                Model::join_epoch(self.chans.entry(r.s.channel).or_default(), 0);
            }
        }
        let epoch = if self.ordered {
            let ord = self.chans.entry(s.channel).or_default();
            let epoch = ord.current;
            Model::join_epoch(ord, epoch);
            if s.barrier {
                ord.current += 1;
            }
            epoch
        } else {
            0
        };
        let len = s.len.max(1);
        let end = s.addr.saturating_add(len).min(self.size);
        let addr = s.addr.min(end.saturating_sub(1));
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
            self.enqueue(slot, now);
        } else {
            self.backlog.push_back(slot);
        }
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
        let Some(r) = self.reqs.slots.get_mut(id).and_then(|r| r.as_mut()) else {
            return;
        };
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
        let at = |pos: usize, id: usize| {
            let ready = self.ready_at(id)?;
            Some((pos, ready, ready.max(self.gate(id, ready))))
        };
        match self.cfg.policy {
            Policy::Fifo | Policy::TwoQueue => {
                let id = *self.queues[q].front()?;
                at(0, id)
            }
            Policy::RoundRobin => self.queues[q]
                .iter()
                .enumerate()
                .filter_map(|(pos, id)| at(pos, *id))
                .min_by_key(|c| (c.2, c.0)),
        }
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
            (self.find_buffer(ready, stages).2).0
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
        let nq = match self.cfg.policy {
            Policy::Fifo => 1,
            Policy::TwoQueue | Policy::RoundRobin => 2,
        };
        // Decisions are made in time order: none before the last one.
        let mut cands = [None; 2];
        for (q, c) in cands.iter_mut().enumerate().take(nq) {
            *c = self
                .candidate(q)
                .map(|(pos, ready, t)| (q, pos, ready.max(self.clock), t.max(self.clock)));
        }
        let cands = cands.iter().flatten();
        let first = cands.clone().min_by_key(|c| c.3)?;
        // The two queues are taken in turn: after a transfer of one, the other goes next when
        // it has a request waiting by then, even if that one must wait for its resources.
        let other = cands
            .clone()
            .find(|c| c.0 != self.last_queue && c.0 != first.0 && c.2 <= first.3);
        let c = other.unwrap_or(first);
        Some((c.0, c.1, c.3))
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
        loop {
            let next = match self.next_cache.take() {
                Some(next) => next,
                None => self.pick(),
            };
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
            self.issue(id, t);
            self.last_queue = q;
            let finished = {
                let r = &self.reqs[id];
                r.next >= r.s.addr + r.s.len
            };
            if finished {
                if pos == 0 {
                    self.queues[q].pop_front();
                } else {
                    self.queues[q].remove(pos);
                }
                self.queued -= 1;
                let r = self.reqs.remove(id);
                if self.ordered {
                    if let Some(ord) = self.chans.get_mut(&r.s.channel) {
                        ord.known(r.epoch, r.done);
                    }
                }
                done(r.s.id, r.done.div_ceil(PS));
                if let Some(next) = self.backlog.pop_front() {
                    self.enqueue(next, t);
                }
            } else if self.cfg.policy == Policy::RoundRobin {
                // Moneta+Balance: the rest of the request goes to the back of its queue.
                let id = self.queues[q].remove(pos).expect("queued");
                self.queues[q].push_back(id);
            }
        }
    }

    /// Issues the next transfer of request `id` at `t`.
    fn issue(&mut self, id: usize, t: u64) {
        self.prune(t);
        let (write, addr, len, reach) = {
            let r = &self.reqs[id];
            (r.s.write, r.next, self.next_len(r), r.s.reach)
        };
        let (ci, local) = self.place(addr);
        let end = if write {
            self.write_transfer(ci, local, len, t)
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
    }

    /// Forgets what ended by `t` in every calendar.
    fn prune(&mut self, t: u64) {
        self.ring.prune(t);
        self.link_up.prune(t);
        self.link_down.prune(t);
        for b in &mut self.buffers {
            b.prune(t);
        }
        for c in &mut self.ctrls {
            c.core.prune(t);
        }
    }

    /// The earliest start at or after `from` for which a scheduler buffer is free over the
    /// span `stages` gives: `stages(x)` answers the span `(start, end)` the transfer's
    /// stages would take if they started at `x`. Returns (x, buffer, span).
    fn find_buffer(
        &self,
        from: u64,
        stages: impl Fn(&Model, u64) -> (u64, u64),
    ) -> (u64, usize, (u64, u64)) {
        let mut x = from;
        loop {
            let (s, e) = stages(self, x);
            let mut next = u64::MAX;
            for (b, cal) in self.buffers.iter().enumerate() {
                match cal.conflict(s, e) {
                    None => return (x, b, (s, e)),
                    // Each round moves past a booked span, so this ends.
                    Some(end) => next = next.min(end),
                }
            }
            x = next.max(x + 1);
        }
    }

    /// Books what [`Model::find_buffer`] found.
    fn hold_buffer(&mut self, b: usize, (s, e): (u64, u64)) {
        self.buffers[b].book(s, e - s);
        self.buffer_busy += e - s;
        if e > self.sched_busy_until {
            self.sched_busy += e - s.max(self.sched_busy_until);
            self.sched_busy_until = e;
        }
    }

    /// The span a read's data holds a scheduler buffer, from the ring to the end of the DMA,
    /// were it to reach the ring at `x`.
    fn read_stages(len_ring: u64, len_link: u64) -> impl Fn(&Model, u64) -> (u64, u64) {
        move |m: &Model, x: u64| {
            let rs = m.ring.fit(x, len_ring);
            let ls = m.link_up.fit(rs + len_ring, len_link);
            (rs, ls + len_link)
        }
    }

    /// The span a write holds a scheduler buffer, from the DMA's start until the ring has
    /// carried the data into its controller's incoming queue (once that has room, `inq`),
    /// were it to start at `x`.
    fn write_stages(len_ring: u64, len_link: u64, inq: u64) -> impl Fn(&Model, u64) -> (u64, u64) {
        move |m: &Model, x: u64| {
            let ls = m.link_down.fit(x, len_link);
            let rs = m.ring.fit((ls + len_link).max(inq), len_ring);
            (ls, rs + len_ring)
        }
    }

    /// Ring and link times of `len` bytes.
    fn wire(&self, len: u64) -> (u64, u64) {
        (
            self.ring_ps.dur(len),
            self.link_overhead + self.link_ps.dur(len),
        )
    }

    /// Bytes of the next transfer of `r`.
    fn next_len(&self, r: &Req) -> u64 {
        let end = r.s.addr + r.s.len;
        let piece = self.piece;
        let boundary = (piece.div_rem(r.next).0 + 1) * piece.d;
        boundary.min(end) - r.next
    }

    /// The controller's memory wakes for an access at `at`; returns when it can start.
    fn wake(&mut self, ci: usize, at: u64) -> u64 {
        let (wake, after) = (self.wake, self.powerdown_after);
        let c = &mut self.ctrls[ci];
        if !c.woken {
            c.woken = true;
            c.awake_since = at;
            return at + wake;
        }
        if at > c.last_end + after {
            // It powered down `after` past its last access.
            c.awake_total += c.last_end + after - c.awake_since;
            c.awake_since = at;
            return at + wake;
        }
        at
    }

    /// The controller's work on one transfer, booked from `ready`: opens, moves and (for
    /// writes) writes back each row; returns (start, when the data has left or entered the
    /// queue, end).
    fn controller_work(
        &mut self,
        ci: usize,
        local: u64,
        len: u64,
        write: bool,
        ready: u64,
    ) -> (u64, u64, u64) {
        let row = self.cfg.row;
        let row_bits = row * 8;
        let selective = self.cfg.power.selective_writes;
        let banks = self.banks;
        // The time the work takes, and its effect on rows, wear and energy.
        let mut d = 0u64;
        let mut moved = 0u64;
        let end = local + len;
        let mut at = local;
        while at < end {
            let r = self.row.div_rem(at).0;
            let n = ((r + 1) * row).min(end) - at;
            at += n;
            let c = &mut self.ctrls[ci];
            let p = c.wear_level.map(r);
            let bank = banks.div_rem(p).1 as usize;
            let open = c.open[bank] == Some(p);
            if write {
                if n < row && !open {
                    // A partial row is read in before it is written back whole.
                    c.row_misses += 1;
                    d += self.read_lat;
                    self.work.bits.array_read += row_bits;
                } else {
                    c.row_hits += u64::from(open);
                }
                d += self.ctrl_ps.dur(n);
                moved = d;
                self.work.bits.buffer_written += n * 8;
                d += self.write_lat;
                self.work.bits.array_written += if selective { n * 8 } else { row_bits };
                c.open[bank] = None;
                c.wear.bump(p as usize);
                let moved = c.wear_level.wrote();
                c.wear.save_registers(c.wear_level.registers());
                if let Some(m) = moved {
                    // The gap move copies one row inside the memory: read it, write it back.
                    c.gap_moves += 1;
                    d += self.read_lat + self.write_lat;
                    self.work.bits.array_read += row_bits;
                    self.work.bits.array_written += row_bits;
                    c.wear.bump(m.to as usize);
                    for slot in c.open.iter_mut() {
                        if *slot == Some(m.from) || *slot == Some(m.to) {
                            *slot = None;
                        }
                    }
                }
            } else {
                if open {
                    c.row_hits += 1;
                } else {
                    c.row_misses += 1;
                    c.open[bank] = Some(p);
                    d += self.read_lat;
                    self.work.bits.array_read += row_bits;
                }
                d += self.ctrl_ps.dur(n);
                moved = d;
                self.work.bits.buffer_read += n * 8;
            }
        }
        let mut start = self.ctrls[ci].core.fit(ready, d);
        let wake = self.wake(ci, start);
        if wake > start {
            start = self.ctrls[ci].core.fit(wake, d);
        }
        let c = &mut self.ctrls[ci];
        let end = c.core.book(start, d);
        c.queue_wait += start - ready;
        c.transfers += 1;
        c.last_end = c.last_end.max(end);
        (start, start + moved, end)
    }

    /// A read transfer issued at `t` (its controller's outgoing queue has room): returns when
    /// it ends, its data in the host.
    fn read_transfer(&mut self, ci: usize, local: u64, len: u64, t: u64) -> u64 {
        let (_, data, _) = self.controller_work(ci, local, len, false, t);
        let (ring_d, link_d) = self.wire(len);
        let (_, b, span) = self.find_buffer(data, Model::read_stages(ring_d, link_d));
        self.hold_buffer(b, span);
        // The span is the ring's start to the link's end, as the stages found them free.
        let ring_end = self.ring.book(span.0, ring_d);
        let link_end = self.link_up.book(span.1 - link_d, link_d);
        self.ctrls[ci].outq_free = ring_end;
        link_end
    }

    /// A read transfer issued at `t` with a DRAM buffer: a hit (every line it covers in the
    /// buffer) waits for its lines' data, then costs the buffer's latency and rate and the
    /// link; a miss reads the lines it covers whole from the array into the buffer (the ring
    /// carries them all, the link what was asked). Returns when it ends, its data in the host.
    fn buffered_read(&mut self, ci: usize, local: u64, addr: u64, len: u64, t: u64) -> u64 {
        let buf = self.buffer.as_mut().expect("a buffer");
        let (first, last) = (buf.line_of(addr), buf.line_of(addr + len - 1));
        if buf.holds(first, last) {
            let ready = buf.read(first, last);
            buf.stats.hits += 1;
            buf.stats.waited += u64::from(ready > t);
            let data = t.max(ready) + self.buffer_lat + self.buffer_ps.dur(len);
            let link_d = self.link_overhead + self.link_ps.dur(len);
            let ls = self.link_up.fit(data, link_d);
            return self.link_up.book(ls, link_d);
        }
        buf.stats.misses += 1;
        // The lines lie in the transfer's stripe (a line divides the stripe and the largest
        // transfer), so in its controller.
        let lo = buf.start_of(first);
        let hi = buf.start_of(last + 1);
        let (_, data, _) = self.controller_work(ci, local - (addr - lo), hi - lo, false, t);
        let ring_d = self.ring_ps.dur(hi - lo);
        let link_d = self.link_overhead + self.link_ps.dur(len);
        let (_, b, span) = self.find_buffer(data, Model::read_stages(ring_d, link_d));
        self.hold_buffer(b, span);
        let ring_end = self.ring.book(span.0, ring_d);
        let link_end = self.link_up.book(span.1 - link_d, link_d);
        self.ctrls[ci].outq_free = ring_end;
        let buf = self.buffer.as_mut().expect("a buffer");
        for l in first..=last {
            buf.fill(l, ring_end, Fill::Demand);
        }
        link_end
    }

    /// Read-ahead after a read ending at `from`: the lines of the next
    /// [`ModelConfig::readahead`] bytes that lie before `reach` (the end of the read's extent)
    /// and are not in the buffer are filled from the array, from `t`.
    fn read_ahead(&mut self, from: u64, reach: u64, t: u64) {
        let end = from
            .saturating_add(self.cfg.readahead)
            .min(reach)
            .min(self.size);
        if end > from {
            self.fill_lines(from, end, t, Fill::Ahead);
        }
    }

    /// A client's hint that `[addr, addr + len)` will be read soon, arriving at `now_ns`: the
    /// lines of the range not in the buffer are filled from the array (at most
    /// [`HINT_LINES`] of them, and at most as many as the buffer holds, from the range's
    /// start); those in it become recent. Without a buffer the hint has nothing to fill.
    pub fn hint(&mut self, addr: u64, len: u64, now_ns: u64) {
        let Some(buf) = self.buffer.as_ref() else {
            return;
        };
        let t = (now_ns * PS).max(self.clock);
        self.now = self.now.max(now_ns * PS);
        self.origin.get_or_insert(t);
        let most = (buf.capacity() as u64).min(HINT_LINES) * self.cfg.buffer_line;
        let end = addr.saturating_add(len.min(most)).min(self.size);
        if end > addr {
            // What it books can change when the next transfer issues.
            self.next_cache = None;
            self.fill_lines(addr, end, t, Fill::Hint);
        }
    }

    /// Fills the lines of `[from, to)` that the buffer lacks, from `t`: each run of missing
    /// lines within a stripe is one read of the array, carried by the ring into the buffer
    /// (the link is not used). Lines already there become recent.
    fn fill_lines(&mut self, from: u64, to: u64, t: u64, how: Fill) {
        let Some(buf) = self.buffer.as_mut() else {
            return;
        };
        let (first, last) = (buf.line_of(from), buf.line_of(to - 1));
        let mut l = first;
        while l <= last {
            let buf = self.buffer.as_mut().expect("a buffer");
            if buf.has(l) {
                buf.touch(l);
                l += 1;
                continue;
            }
            // A run of missing lines, to the end of the stripe at most.
            let lo = buf.start_of(l);
            let stripe_end = (self.stripe.div_rem(lo).0 + 1) * self.cfg.stripe;
            let mut run_end = l + 1;
            while run_end <= last && !buf.has(run_end) && buf.start_of(run_end) < stripe_end {
                run_end += 1;
            }
            let hi = buf.start_of(run_end);
            let (ci, local) = self.place(lo);
            let (_, data, _) = self.controller_work(ci, local, hi - lo, false, t);
            let ring_d = self.ring_ps.dur(hi - lo);
            let rs = self.ring.fit(data, ring_d);
            let ready = self.ring.book(rs, ring_d);
            let buf = self.buffer.as_mut().expect("a buffer");
            for x in l..run_end {
                buf.fill(x, ready, how);
            }
            l = run_end;
        }
    }

    /// A write transfer issued at `t`: returns when it ends, its row written back (durable).
    fn write_transfer(&mut self, ci: usize, local: u64, len: u64, t: u64) -> u64 {
        let (ring_d, link_d) = self.wire(len);
        let inq = self.ctrls[ci].inq_free;
        let (_, b, span) = self.find_buffer(t, Model::write_stages(ring_d, link_d, inq));
        self.hold_buffer(b, span);
        // The span is the link's start to the ring's end, as the stages found them free.
        self.link_down.book(span.0, link_d);
        let ring_end = self.ring.book(span.1 - ring_d, ring_d);
        let (_, drained, end) = self.controller_work(ci, local, len, true, ring_end);
        self.ctrls[ci].inq_free = drained;
        end
    }

    /// What the model has done up to `now_ns`: utilisation, energy, wear.
    pub fn stats(&self, now_ns: u64) -> ModelStats {
        let now = (now_ns * PS).max(self.now);
        let origin = self.origin.unwrap_or(now);
        let elapsed = now.saturating_sub(origin);
        let secs = |ps: u64| ps as f64 * 1e-12;
        let t = secs(elapsed);
        let p = &self.cfg.power;
        let comp = |(idle, peak): (f64, f64), busy: u64| idle * t + (peak - idle) * secs(busy);
        let nctrl = self.ctrls.len() as u64;
        let dies_per_ctrl = (self.size.div_ceil(nctrl) * 8).div_ceil(p.die_bits) as f64;
        let mut controllers = Vec::with_capacity(self.ctrls.len());
        let mut e_ctrl = 0.0;
        let mut e_background = 0.0;
        for c in &self.ctrls {
            let mut awake = c.awake_total;
            if c.woken {
                let end = now
                    .min(c.last_end + self.powerdown_after)
                    .max(c.awake_since);
                awake += end - c.awake_since;
            }
            e_ctrl += comp(p.controller_w, c.core.busy) + comp(p.ctrl_buffer_w, c.core.busy);
            e_background += dies_per_ctrl
                * (p.idle_die_w * t + (p.active_die_w - p.idle_die_w) * secs(awake.min(elapsed)));
            controllers.push(ControllerStats {
                busy_ns: c.core.busy / PS,
                transfers: c.transfers,
                queue_wait_ns: c.queue_wait / PS,
                row_hits: c.row_hits,
                row_misses: c.row_misses,
                gap_moves: c.gap_moves,
                utilisation: if elapsed > 0 {
                    (c.core.busy as f64 / elapsed as f64).min(1.0)
                } else {
                    0.0
                },
            });
        }
        let b = self.work.bits;
        let e_array = (b.array_read as f64 * p.array_read_pj
            + b.array_written as f64 * p.array_write_pj
            + b.buffer_read as f64 * p.buffer_read_pj
            + b.buffer_written as f64 * p.buffer_write_pj)
            * 1e-12;
        let link_busy = (self.link_up.busy + self.link_down.busy) / 2;
        let energy = Energy {
            scheduler_j: comp(p.scheduler_w, self.sched_busy),
            buffers_j: self.cfg.sched_buffers as f64 * p.sched_buffer_w.0 * t
                + (p.sched_buffer_w.1 - p.sched_buffer_w.0) * secs(self.buffer_busy),
            ring_j: comp(p.ring_w, self.ring.busy),
            link_j: comp(p.link_w, link_busy),
            controllers_j: e_ctrl,
            array_j: e_array,
            background_j: e_background,
        };
        ModelStats {
            elapsed_ns: elapsed / PS,
            reads: self.work.reads,
            writes: self.work.writes,
            bytes_read: self.work.bytes_read,
            bytes_written: self.work.bytes_written,
            transfers: self.work.transfers,
            link_up_busy_ns: self.link_up.busy / PS,
            link_down_busy_ns: self.link_down.busy / PS,
            ring_busy_ns: self.ring.busy / PS,
            controllers,
            energy,
            wear: self.wear(),
            wear_file: self.wear_file.as_ref().map(|f| f.path().to_path_buf()),
            buffer: self.buffer.as_ref().map(LineBuffer::stats),
        }
    }

    /// The wear of every row so far.
    pub fn wear(&self) -> Wear {
        let mut max = 0u32;
        let mut total = 0u64;
        let mut rows = 0u64;
        let mut hist = [0u64; 16];
        for c in &self.ctrls {
            for &w in c.wear.as_slice() {
                max = max.max(w);
                total += u64::from(w);
                rows += 1;
            }
        }
        for c in &self.ctrls {
            for &w in c.wear.as_slice() {
                let bucket = if max == 0 {
                    0
                } else {
                    ((u64::from(w) * 15).div_ceil(u64::from(max))) as usize
                };
                hist[bucket.min(15)] += 1;
            }
        }
        Wear {
            rows,
            max,
            mean: if rows == 0 {
                0.0
            } else {
                total as f64 / rows as f64
            },
            total,
            histogram: hist,
        }
    }

    /// Each controller's start-gap registers and row wear, to persist.
    pub fn wear_state(&self) -> Vec<ControllerWear> {
        self.ctrls
            .iter()
            .map(|c| {
                let (start, gap, writes) = c.wear_level.registers();
                ControllerWear {
                    start,
                    gap,
                    writes,
                    rows: c.wear.as_slice().to_vec(),
                }
            })
            .collect()
    }

    /// Restores what [`Model::wear_state`] gave (of a model with the same configuration,
    /// array size and seed); `false`, changing nothing, if it does not fit.
    pub fn restore_wear(&mut self, state: &[ControllerWear]) -> bool {
        let fits = state.len() == self.ctrls.len()
            && state.iter().zip(&self.ctrls).all(|(w, c)| {
                w.rows.len() == c.wear.len()
                    && w.start < c.wear_level.lines()
                    && w.gap <= c.wear_level.lines()
            });
        if !fits {
            return false;
        }
        for (w, c) in state.iter().zip(&mut self.ctrls) {
            c.wear_level.restore(w.start, w.gap, w.writes);
            c.wear.copy_from(&w.rows);
            c.wear.save_registers(c.wear_level.registers());
        }
        true
    }
}

/// One controller's wear-leveling registers and the writes each of its rows has taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerWear {
    /// Start-gap's start register.
    pub start: u64,
    /// Its gap register.
    pub gap: u64,
    /// Writes since the gap last moved.
    pub writes: u64,
    /// Writes per physical row.
    pub rows: Vec<u32>,
}

/// Energy by part of the device (joules), integrated from idle and peak power over what each
/// part did (Moneta Table I).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Energy {
    /// Scheduler and DMA engine.
    pub scheduler_j: f64,
    /// Scheduler buffers.
    pub buffers_j: f64,
    /// The ring.
    pub ring_j: f64,
    /// The host link.
    pub link_j: f64,
    /// Memory controllers and their queues.
    pub controllers_j: f64,
    /// Array and row-buffer reads and writes.
    pub array_j: f64,
    /// Memory background power.
    pub background_j: f64,
}

impl Energy {
    /// Everything.
    pub fn total_j(&self) -> f64 {
        self.scheduler_j
            + self.buffers_j
            + self.ring_j
            + self.link_j
            + self.controllers_j
            + self.array_j
            + self.background_j
    }
}

/// Wear of the array's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Wear {
    /// Rows (with each controller's gap row).
    pub rows: u64,
    /// Most writes of any row.
    pub max: u32,
    /// Mean writes per row.
    pub mean: f64,
    /// All row writes.
    pub total: u64,
    /// Rows by wear in sixteen buckets: bucket 0 holds rows never written, bucket k rows
    /// written up to k/15 of the maximum.
    pub histogram: [u64; 16],
}

/// One controller's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ControllerStats {
    /// Time the controller was busy.
    pub busy_ns: u64,
    /// Transfers it served.
    pub transfers: u64,
    /// Time transfers waited for it.
    pub queue_wait_ns: u64,
    /// Accesses that found their row open.
    pub row_hits: u64,
    /// Accesses that opened a row.
    pub row_misses: u64,
    /// Start-gap moves.
    pub gap_moves: u64,
    /// Busy time over elapsed time.
    pub utilisation: f64,
}

/// What the model has done.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelStats {
    /// From the first request to now.
    pub elapsed_ns: u64,
    /// Read requests issued.
    pub reads: u64,
    /// Write requests issued.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Transfers issued.
    pub transfers: u64,
    /// Link busy towards the host.
    pub link_up_busy_ns: u64,
    /// Link busy from the host.
    pub link_down_busy_ns: u64,
    /// Ring busy.
    pub ring_busy_ns: u64,
    /// Per controller.
    pub controllers: Vec<ControllerStats>,
    /// Energy so far.
    pub energy: Energy,
    /// Row wear.
    pub wear: Wear,
    /// The file the wear is kept in, if any.
    pub wear_file: Option<std::path::PathBuf>,
    /// The DRAM buffer's figures, if there is one.
    pub buffer: Option<BufferStats>,
}

impl ModelStats {
    /// Average power (W) over the elapsed time.
    pub fn watts(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.energy.total_j() / (self.elapsed_ns as f64 * 1e-9)
        }
    }
}

#[cfg(test)]
mod tests;
