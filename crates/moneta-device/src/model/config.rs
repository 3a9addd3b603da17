//! The model's parameters, with the presets a user compares (Moneta §II, Table I).
//!
//! Every figure of the array the first Moneta paper gives is a field here; `pcm` holds the
//! paper's values. Times are nanoseconds and rates bytes per nanosecond (1 B/ns = 1 GB/s).

use std::fmt;

pub use super::buffer::BufferPolicy;

/// The slowest rate a configuration may give (GB/s): 1 KB/s.
pub const MIN_RATE: f64 = 1e-6;

/// How the scheduler orders transfers (Moneta §IV).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// One queue, requests in arrival order, each request's transfers back to back
    /// (the baseline Moneta).
    Fifo,
    /// Reads and writes in two queues taken in turn, each in arrival order (Moneta+2Q): the
    /// full-duplex link carries both directions at once.
    TwoQueue,
    /// Two queues as [`Policy::TwoQueue`], and within each the request at the front gets one
    /// transfer (at most a stripe) before it goes to the back (Moneta+Balance): a large
    /// request no longer holds up small ones behind it.
    RoundRobin,
}

impl Policy {
    /// Parses `fifo`, `2q` or `rr`.
    pub fn parse(s: &str) -> Result<Policy, String> {
        match s.trim() {
            "fifo" => Ok(Policy::Fifo),
            "2q" | "two-queue" => Ok(Policy::TwoQueue),
            "rr" | "round-robin" => Ok(Policy::RoundRobin),
            other => Err(format!(
                "scheduling policy `{other}` is not one of fifo, 2q, rr"
            )),
        }
    }

    /// The name [`Policy::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::TwoQueue => "2q",
            Policy::RoundRobin => "rr",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The power model (Moneta Table I). Component figures are watts when idle and at their
/// peak; the array's are energies per bit moved and background power.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Power {
    /// Scheduler and DMA engine: idle, peak (W).
    pub scheduler_w: (f64, f64),
    /// The ring (W).
    pub ring_w: (f64, f64),
    /// Each scheduler buffer (W).
    pub sched_buffer_w: (f64, f64),
    /// Each memory controller (W).
    pub controller_w: (f64, f64),
    /// Each memory controller's pair of queues (W).
    pub ctrl_buffer_w: (f64, f64),
    /// The host link (W).
    pub link_w: (f64, f64),
    /// Writing the array, per bit written (pJ).
    pub array_write_pj: f64,
    /// Reading the array into a row buffer, per bit (pJ).
    pub array_read_pj: f64,
    /// Writing a row buffer, per bit (pJ).
    pub buffer_write_pj: f64,
    /// Reading a row buffer, per bit (pJ).
    pub buffer_read_pj: f64,
    /// Background power of a memory die that is on but idle, its clock stopped (W).
    pub idle_die_w: f64,
    /// Background power of a memory die while its controller is active (W).
    pub active_die_w: f64,
    /// Bits in one memory die.
    pub die_bits: u64,
    /// Whether a write programs only the bits it changes (selective writes) rather than the
    /// whole row (Moneta §V-D).
    pub selective_writes: bool,
}

impl Power {
    /// Table I of the Moneta paper. Table I gives the idle background power of a die
    /// (264 µW, from a commercial PCM part); its active background figure did not survive in
    /// a usable form, so the active die power here (1 mW) is chosen to give the paper's
    /// 0.6 W per controller for 8 KB writes (Moneta §V-D).
    pub const MONETA: Power = Power {
        scheduler_w: (0.3, 1.3),
        ring_w: (0.03, 0.06),
        sched_buffer_w: (1.26e-3, 4.37e-3),
        controller_w: (0.24, 0.34),
        ctrl_buffer_w: (1.26e-3, 4.37e-3),
        link_w: (0.12, 0.4),
        array_write_pj: 16.82,
        array_read_pj: 2.47,
        buffer_write_pj: 1.02,
        buffer_read_pj: 0.93,
        idle_die_w: 264e-6,
        active_die_w: 1e-3,
        die_bits: 1 << 30,
        selective_writes: false,
    };
}

/// Everything the model needs to know about the array.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The preset this came from, for reports.
    pub name: String,
    /// Host link rate in each direction (full duplex), bytes per ns.
    pub link_rate: f64,
    /// Fixed cost of each DMA transfer on the link (ns).
    pub link_overhead_ns: f64,
    /// Largest transfer the scheduler makes of a request (bytes); transfers also end at stripe
    /// boundaries.
    pub transfer_max: u64,
    /// Scheduler buffers, each of `transfer_max` bytes.
    pub sched_buffers: usize,
    /// Requests the scheduler holds in its queues at once.
    pub sched_requests: usize,
    /// Ring rate (bytes per ns), shared by both directions.
    pub ring_rate: f64,
    /// Memory controllers.
    pub controllers: usize,
    /// Bytes of each controller's incoming and of its outgoing queue.
    pub ctrl_queue: u64,
    /// Stripe across the controllers (bytes).
    pub stripe: u64,
    /// Memory modules per controller.
    pub dimms: usize,
    /// Ranks per module.
    pub ranks: usize,
    /// Banks per rank.
    pub banks: usize,
    /// Row (and row buffer) size (bytes).
    pub row: u64,
    /// Array read latency: opening a row into its buffer (ns).
    pub read_ns: f64,
    /// Array write latency: writing a row back as it closes (ns).
    pub write_ns: f64,
    /// Rate between a row buffer and its controller (bytes per ns).
    pub ctrl_rate: f64,
    /// Idle time after which a controller powers its memory down (ns).
    pub powerdown_after_ns: f64,
    /// Time to wake powered-down memory (ns).
    pub wake_ns: f64,
    /// Scheduling policy.
    pub policy: Policy,
    /// Writes between two moves of the start-gap gap; 0 turns wear leveling off.
    pub gap_interval: u64,
    /// Randomize addresses before start-gap (a static permutation of each controller's rows).
    pub randomize: bool,
    /// Bytes of the DRAM buffer in front of the array; 0: none.
    pub buffer: u64,
    /// Its line: what it fills and gives up at a time (bytes).
    pub buffer_line: u64,
    /// Which line it gives up when full.
    pub buffer_policy: BufferPolicy,
    /// Latency of a read the buffer serves (ns).
    pub buffer_ns: f64,
    /// Rate of the buffer towards the link (bytes per ns).
    pub buffer_rate: f64,
    /// Bytes past each read, within the extent the read lies in, that the buffer fills ahead
    /// of use; 0: none.
    pub readahead: u64,
    /// Power figures.
    pub power: Power,
}

/// The presets, by name.
pub const PRESETS: [&str; 4] = ["pcm", "dram", "slow-nvm", "flash-like"];

impl ModelConfig {
    /// The Moneta array of the paper: PCM (48 ns reads, 150 ns writes) behind four
    /// controllers, a 2 GB/s full-duplex link, a 4 GB/s ring, two 8 KB scheduler buffers,
    /// 8 KB stripes and rows, start-gap every 100 writes, the two-queue round-robin scheduler
    /// the paper ends with.
    pub fn pcm() -> ModelConfig {
        ModelConfig {
            name: "pcm".into(),
            link_rate: 2.0,
            link_overhead_ns: 0.0,
            transfer_max: 8 << 10,
            sched_buffers: 2,
            sched_requests: 64,
            ring_rate: 4.0,
            controllers: 4,
            ctrl_queue: 8 << 10,
            stripe: 8 << 10,
            dimms: 4,
            ranks: 2,
            banks: 4,
            row: 8 << 10,
            read_ns: 48.0,
            write_ns: 150.0,
            ctrl_rate: 4.0,
            powerdown_after_ns: 1000.0,
            wake_ns: 50.0,
            policy: Policy::RoundRobin,
            gap_interval: 100,
            randomize: true,
            buffer: 0,
            buffer_line: 4 << 10,
            buffer_policy: BufferPolicy::Lru,
            buffer_ns: 50.0,
            buffer_rate: 10.0,
            readahead: 32 << 10,
            power: Power::MONETA,
        }
    }

    /// The same array with DRAM-like timing (15 ns each way), no wear to level, and DRAM
    /// write energy (as cheap as a read).
    pub fn dram() -> ModelConfig {
        let mut c = ModelConfig::pcm();
        c.name = "dram".into();
        c.read_ns = 15.0;
        c.write_ns = 15.0;
        c.gap_interval = 0;
        c.randomize = false;
        c.power.array_write_pj = c.power.array_read_pj;
        c
    }

    /// A slower non-volatile memory: 1 µs reads and 4 µs writes, where Moneta §V-C finds
    /// that more controllers start to matter.
    pub fn slow_nvm() -> ModelConfig {
        let mut c = ModelConfig::pcm();
        c.name = "slow-nvm".into();
        c.read_ns = 1_000.0;
        c.write_ns = 4_000.0;
        c
    }

    /// Flash-like latencies (25 µs reads, 200 µs programs) behind the same array, to see how
    /// far parallelism hides them; wear leveling stays as for PCM.
    pub fn flash_like() -> ModelConfig {
        let mut c = ModelConfig::pcm();
        c.name = "flash-like".into();
        c.read_ns = 25_000.0;
        c.write_ns = 200_000.0;
        c
    }

    /// A preset by name.
    pub fn preset(name: &str) -> Result<ModelConfig, String> {
        match name.trim() {
            "pcm" => Ok(ModelConfig::pcm()),
            "dram" => Ok(ModelConfig::dram()),
            "slow-nvm" => Ok(ModelConfig::slow_nvm()),
            "flash-like" => Ok(ModelConfig::flash_like()),
            other => Err(format!(
                "no model preset `{other}`; the presets are {} (or none)",
                PRESETS.join(", ")
            )),
        }
    }

    /// Banks per controller.
    pub fn banks_per_controller(&self) -> usize {
        self.dimms * self.ranks * self.banks
    }

    /// Checks that the parameters describe an array that can exist.
    pub fn validate(&self) -> Result<(), String> {
        let nonneg = |v: f64, what: &str| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("model: {what} must not be negative, not {v}"))
            }
        };
        // Rates in GB/s, from 1 KB/s (a transfer time is then a 64-bit fixed-point product).
        let rate = |v: f64, what: &str| {
            if v.is_finite() && v >= MIN_RATE {
                Ok(())
            } else {
                Err(format!(
                    "model: {what} must be a rate of at least {MIN_RATE} GB/s (1 KB/s), not {v}"
                ))
            }
        };
        rate(self.link_rate, "link_rate")?;
        rate(self.ring_rate, "ring_rate")?;
        rate(self.ctrl_rate, "ctrl_rate")?;
        nonneg(self.link_overhead_ns, "link_overhead_ns")?;
        nonneg(self.read_ns, "read_ns")?;
        nonneg(self.write_ns, "write_ns")?;
        nonneg(self.powerdown_after_ns, "powerdown_after_ns")?;
        nonneg(self.wake_ns, "wake_ns")?;
        if !(1..=16).contains(&self.controllers) {
            return Err(format!(
                "model: controllers must be 1 to 16, not {}",
                self.controllers
            ));
        }
        for (v, what) in [
            (self.stripe, "stripe"),
            (self.row, "row"),
            (self.transfer_max, "transfer_max"),
        ] {
            if !v.is_power_of_two() || !(512..=(1 << 20)).contains(&v) {
                return Err(format!(
                    "model: {what} must be a power of two from 512 bytes to 1 MiB, not {v}"
                ));
            }
        }
        if self.ctrl_queue < self.transfer_max {
            return Err(format!(
                "model: a controller queue ({} bytes) must hold a whole transfer ({} bytes)",
                self.ctrl_queue, self.transfer_max
            ));
        }
        if self.sched_buffers == 0 || self.sched_buffers > 1024 {
            return Err(format!(
                "model: sched_buffers must be 1 to 1024, not {}",
                self.sched_buffers
            ));
        }
        if self.sched_requests == 0 || self.sched_requests > 65536 {
            return Err(format!(
                "model: sched_requests must be 1 to 65536, not {}",
                self.sched_requests
            ));
        }
        for (v, what) in [
            (self.dimms, "dimms"),
            (self.ranks, "ranks"),
            (self.banks, "banks"),
        ] {
            if !(1..=64).contains(&v) {
                return Err(format!("model: {what} must be 1 to 64, not {v}"));
            }
        }
        rate(self.buffer_rate, "buffer_rate")?;
        nonneg(self.buffer_ns, "buffer_ns")?;
        if !self.buffer_line.is_power_of_two()
            || self.buffer_line < 512
            || self.buffer_line > self.stripe.min(self.transfer_max)
        {
            return Err(format!(
                "model: buffer_line must be a power of two from 512 bytes to the stripe and the \
                 largest transfer ({} bytes), not {}",
                self.stripe.min(self.transfer_max),
                self.buffer_line
            ));
        }
        if self.buffer != 0 && (self.buffer < self.buffer_line || self.buffer > 1 << 40) {
            return Err(format!(
                "model: buffer must be 0 (none) or from one line ({} bytes) to 1 TiB, not {}",
                self.buffer_line, self.buffer
            ));
        }
        if self.readahead > 4 << 20 {
            return Err(format!(
                "model: readahead must be at most 4 MiB, not {}",
                self.readahead
            ));
        }
        let p = &self.power;
        for (v, what) in [
            (p.array_write_pj, "array_write_pj"),
            (p.array_read_pj, "array_read_pj"),
            (p.buffer_write_pj, "buffer_write_pj"),
            (p.buffer_read_pj, "buffer_read_pj"),
            (p.idle_die_w, "idle_die_w"),
            (p.active_die_w, "active_die_w"),
        ] {
            nonneg(v, what)?;
        }
        for ((idle, peak), what) in [
            (p.scheduler_w, "scheduler_w"),
            (p.ring_w, "ring_w"),
            (p.sched_buffer_w, "sched_buffer_w"),
            (p.controller_w, "controller_w"),
            (p.ctrl_buffer_w, "ctrl_buffer_w"),
            (p.link_w, "link_w"),
        ] {
            nonneg(idle, what)?;
            if !(peak.is_finite() && peak >= idle) {
                return Err(format!(
                    "model: {what} peak ({peak} W) must be at least its idle power ({idle} W)"
                ));
            }
        }
        if p.die_bits == 0 {
            return Err("model: die_bits must be positive".into());
        }
        Ok(())
    }

    /// The highest bandwidth the array can sustain for large transfers of one direction
    /// (bytes per ns): the least of the link, the ring, and the controllers each streaming
    /// rows (one row open, moved, and for writes closed, at a time).
    pub fn peak_rate(&self, write: bool) -> f64 {
        let per_row = self.row as f64 / self.ctrl_rate
            + if write {
                self.read_ns + self.write_ns
            } else {
                self.read_ns
            };
        let ctrl = self.controllers as f64 * self.row as f64 / per_row;
        self.link_rate.min(self.ring_rate).min(ctrl)
    }
}

/// Every parameter of a [`ModelConfig`] by name: what `[model]` in the daemon's TOML file and
/// `--model-set NAME=VALUE` take, and what `status` and the bench report. Sizes take `K`, `M`
/// and `G` suffixes (powers of 1024); rates are GB/s (bytes per ns); times are ns; power pairs
/// are given as `NAME_idle_w` and `NAME_peak_w`.
pub const PARAMETERS: &[(&str, &str)] = &[
    ("name", "name reported for this configuration"),
    ("policy", "scheduling: fifo, 2q (reads and writes in two queues) or rr (2q, round-robin in transfers)"),
    ("link_rate", "host link, each direction (GB/s)"),
    ("link_overhead_ns", "fixed cost of each DMA transfer on the link (ns)"),
    ("transfer_max", "largest transfer a request is split into (bytes)"),
    ("sched_buffers", "scheduler buffers, each of transfer_max bytes"),
    ("sched_requests", "requests the scheduler holds in its queues"),
    ("ring_rate", "ring between scheduler and controllers (GB/s)"),
    ("controllers", "memory controllers (1-16)"),
    ("ctrl_queue", "each controller's incoming and outgoing queue (bytes)"),
    ("stripe", "striping unit across controllers (bytes)"),
    ("dimms", "memory modules per controller"),
    ("ranks", "ranks per module"),
    ("banks", "banks per rank, each with a row buffer"),
    ("row", "row and row buffer size (bytes)"),
    ("read_ns", "array read latency, on opening a row (ns)"),
    ("write_ns", "array write latency, on closing a written row (ns)"),
    ("ctrl_rate", "between a row buffer and its controller (GB/s)"),
    ("powerdown_after_ns", "idle time before a controller powers its memory down (ns)"),
    ("wake_ns", "time to wake powered-down memory (ns)"),
    ("gap_interval", "writes between start-gap moves (0: no wear leveling)"),
    ("randomize", "randomize addresses before start-gap (true or false)"),
    ("buffer", "DRAM buffer in front of the array (bytes; 0: none)"),
    ("buffer_line", "the buffer's line, filled and given up whole (bytes)"),
    ("buffer_policy", "line the full buffer gives up: lru or fifo"),
    ("buffer_ns", "latency of a read the buffer serves (ns)"),
    ("buffer_rate", "buffer towards the link (GB/s)"),
    ("readahead", "bytes past a read, within its extent, the buffer fills ahead (0: none)"),
    ("scheduler_idle_w", "scheduler and DMA engine, idle (W)"),
    ("scheduler_peak_w", "scheduler and DMA engine, busy (W)"),
    ("ring_idle_w", "ring, idle (W)"),
    ("ring_peak_w", "ring, busy (W)"),
    ("sched_buffer_idle_w", "each scheduler buffer, idle (W)"),
    ("sched_buffer_peak_w", "each scheduler buffer, busy (W)"),
    ("controller_idle_w", "each memory controller, idle (W)"),
    ("controller_peak_w", "each memory controller, busy (W)"),
    ("ctrl_buffer_idle_w", "each controller's queues, idle (W)"),
    ("ctrl_buffer_peak_w", "each controller's queues, busy (W)"),
    ("link_idle_w", "host link, idle (W)"),
    ("link_peak_w", "host link, busy (W)"),
    ("array_write_pj", "array write energy per bit (pJ)"),
    ("array_read_pj", "array read energy per bit (pJ)"),
    ("buffer_write_pj", "row buffer write energy per bit (pJ)"),
    ("buffer_read_pj", "row buffer read energy per bit (pJ)"),
    ("idle_die_w", "background power of an idle memory die (W)"),
    ("active_die_w", "background power of a memory die while its controller is active (W)"),
    ("die_bits", "bits per memory die"),
    ("selective_writes", "writes program only the bits they change (true or false)"),
];

fn parse_count(v: &str, what: &str) -> Result<u64, String> {
    let v = v.trim();
    let (num, mult) = match v.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) if i > 0 => {
            let m = match v[i..]
                .to_ascii_uppercase()
                .trim_end_matches("IB")
                .trim_end_matches('B')
            {
                "K" => 1u64 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                _ => return Err(format!("model: {what} `{v}` has an unknown unit")),
            };
            (&v[..i], m)
        }
        _ => (v, 1),
    };
    num.trim()
        .replace('_', "")
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("model: {what} must be a whole number, not `{v}`"))
}

fn parse_real(v: &str, what: &str) -> Result<f64, String> {
    v.trim()
        .replace('_', "")
        .parse::<f64>()
        .map_err(|_| format!("model: {what} must be a number, not `{v}`"))
}

fn parse_flag(v: &str, what: &str) -> Result<bool, String> {
    match v.trim() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!("model: {what} must be true or false, not `{v}`")),
    }
}

impl ModelConfig {
    /// Sets parameter `key` (one of [`PARAMETERS`]) from its text; the result is checked by
    /// [`ModelConfig::validate`], not here.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let count = |v: &str| parse_count(v, key);
        let real = |v: &str| parse_real(v, key);
        let small = |v: &str| -> Result<usize, String> {
            usize::try_from(parse_count(v, key)?).map_err(|_| format!("model: {key} is too large"))
        };
        let p = &mut self.power;
        match key {
            "name" => self.name = value.trim().to_string(),
            "policy" => self.policy = Policy::parse(value)?,
            "link_rate" => self.link_rate = real(value)?,
            "link_overhead_ns" => self.link_overhead_ns = real(value)?,
            "transfer_max" => self.transfer_max = count(value)?,
            "sched_buffers" => self.sched_buffers = small(value)?,
            "sched_requests" => self.sched_requests = small(value)?,
            "ring_rate" => self.ring_rate = real(value)?,
            "controllers" => self.controllers = small(value)?,
            "ctrl_queue" => self.ctrl_queue = count(value)?,
            "stripe" => self.stripe = count(value)?,
            "dimms" => self.dimms = small(value)?,
            "ranks" => self.ranks = small(value)?,
            "banks" => self.banks = small(value)?,
            "row" => self.row = count(value)?,
            "read_ns" => self.read_ns = real(value)?,
            "write_ns" => self.write_ns = real(value)?,
            "ctrl_rate" => self.ctrl_rate = real(value)?,
            "powerdown_after_ns" => self.powerdown_after_ns = real(value)?,
            "wake_ns" => self.wake_ns = real(value)?,
            "gap_interval" => self.gap_interval = count(value)?,
            "randomize" => self.randomize = parse_flag(value, key)?,
            "buffer" => self.buffer = count(value)?,
            "buffer_line" => self.buffer_line = count(value)?,
            "buffer_policy" => self.buffer_policy = BufferPolicy::parse(value)?,
            "buffer_ns" => self.buffer_ns = real(value)?,
            "buffer_rate" => self.buffer_rate = real(value)?,
            "readahead" => self.readahead = count(value)?,
            "scheduler_idle_w" => p.scheduler_w.0 = real(value)?,
            "scheduler_peak_w" => p.scheduler_w.1 = real(value)?,
            "ring_idle_w" => p.ring_w.0 = real(value)?,
            "ring_peak_w" => p.ring_w.1 = real(value)?,
            "sched_buffer_idle_w" => p.sched_buffer_w.0 = real(value)?,
            "sched_buffer_peak_w" => p.sched_buffer_w.1 = real(value)?,
            "controller_idle_w" => p.controller_w.0 = real(value)?,
            "controller_peak_w" => p.controller_w.1 = real(value)?,
            "ctrl_buffer_idle_w" => p.ctrl_buffer_w.0 = real(value)?,
            "ctrl_buffer_peak_w" => p.ctrl_buffer_w.1 = real(value)?,
            "link_idle_w" => p.link_w.0 = real(value)?,
            "link_peak_w" => p.link_w.1 = real(value)?,
            "array_write_pj" => p.array_write_pj = real(value)?,
            "array_read_pj" => p.array_read_pj = real(value)?,
            "buffer_write_pj" => p.buffer_write_pj = real(value)?,
            "buffer_read_pj" => p.buffer_read_pj = real(value)?,
            "idle_die_w" => p.idle_die_w = real(value)?,
            "active_die_w" => p.active_die_w = real(value)?,
            "die_bits" => p.die_bits = count(value)?,
            "selective_writes" => p.selective_writes = parse_flag(value, key)?,
            other => {
                return Err(format!(
                    "model: no parameter `{other}`; the parameters are {}",
                    PARAMETERS
                        .iter()
                        .map(|(k, _)| *k)
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            }
        }
        Ok(())
    }

    /// Every parameter and its value, in the order of [`PARAMETERS`], as [`ModelConfig::set`]
    /// takes them back.
    pub fn parameters(&self) -> Vec<(&'static str, String)> {
        let p = &self.power;
        let f = |v: f64| format!("{v}");
        let values = [
            self.name.clone(),
            self.policy.name().to_string(),
            f(self.link_rate),
            f(self.link_overhead_ns),
            self.transfer_max.to_string(),
            self.sched_buffers.to_string(),
            self.sched_requests.to_string(),
            f(self.ring_rate),
            self.controllers.to_string(),
            self.ctrl_queue.to_string(),
            self.stripe.to_string(),
            self.dimms.to_string(),
            self.ranks.to_string(),
            self.banks.to_string(),
            self.row.to_string(),
            f(self.read_ns),
            f(self.write_ns),
            f(self.ctrl_rate),
            f(self.powerdown_after_ns),
            f(self.wake_ns),
            self.gap_interval.to_string(),
            self.randomize.to_string(),
            self.buffer.to_string(),
            self.buffer_line.to_string(),
            self.buffer_policy.name().to_string(),
            f(self.buffer_ns),
            f(self.buffer_rate),
            self.readahead.to_string(),
            f(p.scheduler_w.0),
            f(p.scheduler_w.1),
            f(p.ring_w.0),
            f(p.ring_w.1),
            f(p.sched_buffer_w.0),
            f(p.sched_buffer_w.1),
            f(p.controller_w.0),
            f(p.controller_w.1),
            f(p.ctrl_buffer_w.0),
            f(p.ctrl_buffer_w.1),
            f(p.link_w.0),
            f(p.link_w.1),
            f(p.array_write_pj),
            f(p.array_read_pj),
            f(p.buffer_write_pj),
            f(p.buffer_read_pj),
            f(p.idle_die_w),
            f(p.active_die_w),
            p.die_bits.to_string(),
            p.selective_writes.to_string(),
        ];
        PARAMETERS.iter().map(|(k, _)| *k).zip(values).collect()
    }
}

impl ModelConfig {
    /// The most bytes per ns the array can move in both directions at once: the link each
    /// way, bounded by the ring both share and by the controllers.
    pub fn peak_total_rate(&self) -> f64 {
        (self.peak_rate(false) + self.peak_rate(true)).min(self.ring_rate)
    }
}

/// How fast this host copies memory (bytes per ns): the best of a few copies of 16 MiB. The
/// device copies every byte a request moves, so a model that moves more than this cannot be
/// emulated in real time.
pub fn host_copy_rate() -> f64 {
    let len = 16 << 20;
    let src = vec![1u8; len];
    let mut dst = vec![0u8; len];
    let mut best = f64::MAX;
    for _ in 0..4 {
        let t = std::time::Instant::now();
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        best = best.min(t.elapsed().as_nanos() as f64);
    }
    len as f64 / best.max(1.0)
}

/// How many times the host's measured copy rate a model may need before it is refused.
pub const REFUSE_FACTOR: f64 = 8.0;

/// What a host that copies `host_rate` bytes per ns can make of a model. The measurement is
/// of a moment (another tenant, a cold cache or a busy machine lowers it several times), so
/// only a model that needs more than [`REFUSE_FACTOR`] times what the host copies is refused;
/// one that needs more than the host copies but less than that starts with a warning, and
/// `moneta status` then says whether the device fell behind (`emulation.late`).
pub fn check_emulable(cfg: &ModelConfig, host_rate: f64) -> Result<Option<String>, String> {
    let need = cfg.peak_total_rate();
    let why = format!(
        "the `{}` model moves up to {need:.1} GB/s (both directions of the link, within \
         the ring and the controllers), more than this host copies ({host_rate:.1} GB/s \
         measured now)",
        cfg.name
    );
    if need > REFUSE_FACTOR * host_rate {
        return Err(format!(
            "{why}: the device would fall behind the model and show the host's speed, not \
             the array's. Lower link_rate, ring_rate or ctrl_rate, or use fewer controllers"
        ));
    }
    if need > host_rate {
        return Ok(Some(format!(
            "{why}: at the array's peak the device may fall behind the model; `moneta \
             status` says by how much (emulation.late)"
        )));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_faster_than_the_host_is_refused() {
        let pcm = ModelConfig::pcm();
        assert_eq!(pcm.peak_total_rate(), 4.0);
        assert_eq!(check_emulable(&pcm, 10.0), Ok(None));
        // Near the host's rate: a warning, not a refusal.
        let warn = check_emulable(&pcm, 3.0).unwrap().unwrap();
        assert!(warn.contains("may fall behind"), "{warn}");
        let mut fast = ModelConfig::pcm();
        fast.link_rate = 50.0;
        fast.ring_rate = 100.0;
        fast.ctrl_rate = 100.0;
        fast.controllers = 16;
        let e = check_emulable(&fast, 10.0).unwrap_err();
        assert!(
            e.contains("more than this host copies") && e.contains("link_rate"),
            "{e}"
        );
        assert!(host_copy_rate() > 0.1);
    }

    #[test]
    fn presets_are_valid_and_named() {
        for name in PRESETS {
            let c = ModelConfig::preset(name).unwrap();
            assert_eq!(c.name, name);
            c.validate().unwrap();
        }
        assert!(ModelConfig::preset("tape").unwrap_err().contains("pcm"));
    }

    #[test]
    fn bad_parameters_are_refused() {
        let mut c = ModelConfig::pcm();
        c.controllers = 17;
        assert!(c.validate().unwrap_err().contains("controllers"));
        let mut c = ModelConfig::pcm();
        c.stripe = 3000;
        assert!(c.validate().unwrap_err().contains("stripe"));
        let mut c = ModelConfig::pcm();
        c.link_rate = 0.0;
        assert!(c.validate().unwrap_err().contains("link_rate"));
        let mut c = ModelConfig::pcm();
        c.power.link_w = (1.0, 0.5);
        assert!(c.validate().unwrap_err().contains("peak"));
    }

    #[test]
    fn every_parameter_is_set_and_read_back_by_name() {
        let pcm = ModelConfig::pcm();
        let params = pcm.parameters();
        assert_eq!(params.len(), PARAMETERS.len());
        // Setting each parameter to the value read back changes nothing.
        let mut c = ModelConfig::dram();
        for (k, v) in &params {
            c.set(k, v).unwrap();
        }
        assert_eq!(c, pcm);
        // Each one does reach its field.
        let mut c = ModelConfig::pcm();
        c.set("controllers", "8").unwrap();
        c.set("stripe", "16K").unwrap();
        c.set("read_ns", "1000").unwrap();
        c.set("policy", "fifo").unwrap();
        c.set("link_peak_w", "0.5").unwrap();
        c.set("selective_writes", "true").unwrap();
        assert_eq!(
            (c.controllers, c.stripe, c.read_ns, c.policy),
            (8, 16 << 10, 1000.0, Policy::Fifo)
        );
        assert_eq!(c.power.link_w, (0.12, 0.5));
        assert!(c.power.selective_writes);
        for (k, _) in PARAMETERS {
            assert!(c.parameters().iter().any(|(n, _)| n == k), "{k}");
        }
        // Bad names and values are refused with the reason.
        assert!(c
            .set("cache", "1")
            .unwrap_err()
            .contains("no parameter `cache`"));
        assert!(c
            .set("controllers", "four")
            .unwrap_err()
            .contains("whole number"));
        assert!(c.set("read_ns", "fast").unwrap_err().contains("number"));
        assert!(c
            .set("randomize", "maybe")
            .unwrap_err()
            .contains("true or false"));
        assert!(c.set("policy", "lifo").unwrap_err().contains("fifo"));
    }

    #[test]
    fn the_pcm_array_is_link_bound_for_large_transfers() {
        let c = ModelConfig::pcm();
        assert_eq!(c.peak_rate(false), 2.0);
        assert_eq!(c.peak_rate(true), 2.0);
        let mut one = ModelConfig::flash_like();
        one.controllers = 1;
        assert!(one.peak_rate(true) < 0.05);
    }
}
