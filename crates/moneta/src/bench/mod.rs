//! `moneta bench`: one engine that times the same I/O pattern through different paths.
//!
//! Paths: `moneta` (files on nvfs through libmoneta, synchronous or `--qd` asynchronous),
//! `moneta-raw` (raw commands through a channel on one file's extent: no file system on the
//! way), `kernel-psync` (`pread`/`pwrite` on a file, by default in `/dev/shm`), `kernel-uring`
//! and `kernel-uring-sqpoll` (io_uring on that file), and `perm-check` (the permission table's
//! check alone, in process). Each configuration runs `--runs` times, paths alternating, after
//! a discarded warm-up; the reported run is the median by p50 latency, with the spread of p50
//! over all runs.

pub mod breakdown;
mod files;
pub mod instructions;
pub mod machine;
mod uring;

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use libmoneta::{Channel, Control, Tag};
use moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};
use moneta_abi::{Command, Completion, Opcode};
use moneta_device::Clock;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// An I/O path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// Files on nvfs through libmoneta (`--qd` above 1: asynchronous requests).
    Moneta,
    /// Those files without copies: reads left in the DMA slice, writes filled in place
    /// (requests of at most one DMA slice).
    MonetaZeroCopy,
    /// Raw commands through a channel on one file's extent.
    MonetaRaw,
    /// pread/pwrite on a file (tmpfs by default).
    KernelPsync,
    /// io_uring on that file: fixed file, registered buffers, single issuer, deferred task
    /// work.
    KernelUring,
    /// io_uring with a kernel thread polling the submission queue.
    KernelUringSqpoll,
    /// pread/pwrite with `O_DIRECT` on ext4 on a loop device over a tmpfs file: the kernel's
    /// block path, the papers' baseline (needs root; the bench sets it up and tears it down).
    KernelOdirectExt4,
    /// The same on XFS.
    KernelOdirectXfs,
    /// The permission table's check alone.
    PermCheck,
    /// The file system's calls against the kernel on tmpfs: the soft miss through the channel
    /// (LOOKUP) and on the control socket, stat, 10,000 small files.
    Nvfs,
}

impl Path {
    /// A path of synchronous system calls (queue depth 1 whatever `--qd` says).
    fn synchronous(self) -> bool {
        matches!(
            self,
            Path::KernelPsync | Path::KernelOdirectExt4 | Path::KernelOdirectXfs
        )
    }

    /// The path's name, as `--path` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Moneta => "moneta",
            Path::MonetaZeroCopy => "moneta-zero-copy",
            Path::MonetaRaw => "moneta-raw",
            Path::KernelPsync => "kernel-psync",
            Path::KernelUring => "kernel-uring",
            Path::KernelUringSqpoll => "kernel-uring-sqpoll",
            Path::KernelOdirectExt4 => "kernel-odirect-ext4",
            Path::KernelOdirectXfs => "kernel-odirect-xfs",
            Path::PermCheck => "perm-check",
            Path::Nvfs => "nvfs",
        }
    }
}

/// What each operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Random reads.
    Read,
    /// Random writes.
    Write,
    /// Random reads and writes, half each.
    Randrw,
    /// Sequential reads.
    Seqread,
    /// Sequential writes.
    Seqwrite,
    /// Commands that move no data: the channel's round trip (moneta-raw only).
    Nop,
}

/// Completion strategy for the Moneta paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompletionArg {
    /// DMA completion: spin on the tag status entry.
    Spin,
    /// Forwarding: spin on the completion count.
    Forward,
    /// Issue-sleep: sleep on a futex.
    Sleep,
    /// libmoneta's policy: spin up to 256 KiB, sleep above.
    Auto,
}

impl CompletionArg {
    /// The mode for a request of `size` bytes.
    fn mode(self, size: u64) -> Completion {
        match self {
            CompletionArg::Spin => Completion::Dma,
            CompletionArg::Forward => Completion::Forward,
            CompletionArg::Sleep => Completion::Sleep,
            CompletionArg::Auto => libmoneta::Policy::default().mode(size as usize),
        }
    }
}

/// Options of `moneta bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Paths to measure (repeatable). Without any: the comparison of moneta (files through
    /// libmoneta) and moneta-raw against kernel-psync for 512 B and 4 KiB reads and writes, the
    /// permission check, the idle daemon's CPU, and what talking across two cores costs on this
    /// machine (a cache line there and back, 4 KiB handed across: the floor under a request
    /// served by another core).
    #[arg(long = "path", value_enum)]
    pub paths: Vec<Path>,
    /// Operation.
    #[arg(long, value_enum, default_value = "read")]
    pub op: Op,
    /// Request sizes in bytes (comma-separated; K/M suffixes allowed).
    #[arg(long, value_delimiter = ',', value_parser = monetad::config::parse_size)]
    pub size: Vec<u64>,
    /// Requests in flight per thread (kernel-psync is synchronous).
    #[arg(long, default_value_t = 1)]
    pub qd: usize,
    /// Threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Operations per thread and run instead of a duration (the warm-up still lasts
    /// `--warmup` seconds; 0 skips it).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Seconds of discarded warm-up before each configuration.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Runs per configuration; the median is reported with the spread.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// File for the kernel paths [default: /dev/shm/moneta-bench-PID].
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Bytes of the region the requests fall in.
    #[arg(long, default_value = "64M", value_parser = monetad::config::parse_size)]
    pub region: u64,
    /// Completion strategy for the Moneta paths.
    #[arg(long, value_enum, default_value = "spin")]
    pub completion: CompletionArg,
    /// Records installed for perm-check (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1000u64, 16384])]
    pub records: Vec<u64>,
    /// Use the daemon at this socket (the bench works in a file it creates and removes, or, on
    /// a daemon started with --raw, grants itself an extent, which needs the daemon's user or
    /// root). Without it the bench starts a private daemon on a volatile array and stops it at
    /// the end.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print one JSON object per configuration instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Small files created by `--path nvfs`.
    #[arg(long, default_value_t = 10_000)]
    pub files: usize,
    /// Time each stage of the requests (Moneta-D's Figure 3): on the moneta path from counters
    /// in libmoneta and in the daemon (the private daemon runs with `--trace`; a daemon given
    /// with --socket needs it too for the device's stages); on the kernel paths the system call
    /// and the copy timed apart and the rest of the mean. Queue depth 1.
    #[arg(long)]
    pub breakdown: bool,
    /// Files the requests spread over, each an equal part of the region (moneta and
    /// kernel-psync paths): more files, more permission records.
    #[arg(long, default_value_t = 1)]
    pub open_files: usize,
    /// Extents each moneta file is made of: its chunks are written in a shuffled order, so
    /// they lie next to each other on the array but not in the file, on a private daemon whose
    /// allocation unit is the file's size over this (a power of two, at least 4 KiB).
    #[arg(long)]
    pub extents: Option<u64>,
    /// Private daemon: do not merge adjacent permission records (`monetad --no-merge`).
    #[arg(long)]
    pub no_merge: bool,
    /// Private daemon: permission table entries [default: the daemon's, 16384].
    #[arg(long)]
    pub table_entries: Option<usize>,
    /// Count the instructions the bench threads retire (user and kernel, from the processor's
    /// counters through perf_event_open), per operation; where the machine cannot count them
    /// the record says why.
    #[arg(long)]
    pub count_instructions: bool,
    /// Print CSV (a header, then one row per configuration) instead of tables.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Measure the Moneta paths twice in every run, alone and beside a neighbour: another
    /// process on the same daemon reading 1 MiB at a time as 64 commands on all of its tags
    /// (`moneta bench --path moneta-raw --op read --size 1M`, in a child process). The records
    /// say which (`neighbour`: false alone, true beside it).
    #[arg(long)]
    pub neighbour: bool,
    /// Print nothing (the records are returned to the caller: `moneta report`).
    #[arg(skip)]
    pub quiet: bool,
}

/// Latency percentiles in nanoseconds.
#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct Latency {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Mean.
    pub mean: u64,
    /// Maximum.
    pub max: u64,
}

/// CPU seconds.
#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct Cpu {
    /// User time (in clock ticks of 10 ms).
    pub user_s: f64,
    /// System time (in clock ticks of 10 ms).
    pub sys_s: f64,
    /// User and system time from the process's CPU clock (nanosecond precision).
    pub total_s: f64,
}

/// One configuration's result (the median run).
#[derive(Serialize, Clone, Debug)]
pub struct Record {
    /// Path.
    pub path: &'static str,
    /// Operation.
    pub op: Op,
    /// Request bytes.
    pub size: u64,
    /// Queue depth per thread.
    pub qd: usize,
    /// Threads.
    pub threads: usize,
    /// Completion strategy (Moneta paths).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion: Option<CompletionArg>,
    /// Operations completed.
    pub ops: u64,
    /// Seconds measured.
    pub seconds: f64,
    /// Operations per second.
    pub iops: f64,
    /// MiB per second.
    pub mib_s: f64,
    /// Latency.
    pub lat_ns: Latency,
    /// CPU of this process.
    pub cpu: Cpu,
    /// CPU of the daemon (Moneta paths).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_cpu: Option<Cpu>,
    /// Runs taken.
    pub runs: usize,
    /// Lowest and highest p50 over the runs.
    pub p50_spread: [u64; 2],
    /// Records installed (perm-check).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    /// Files the requests spread over.
    pub open_files: usize,
    /// Extents of each file, as the file system reports them (moneta paths).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extents: Option<u64>,
    /// Lookups libmoneta sent the manager in the reported run (moneta paths).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub soft_misses: Option<u64>,
    /// Commands refused for a missing permission record and retried, in that run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hard_misses: Option<u64>,
    /// CPUs kept busy on average (this process and, on the Moneta paths, the daemon).
    pub cpus: f64,
    /// MiB/s per busy CPU (Figures 5b and 9b of the papers).
    pub mib_s_per_cpu: f64,
    /// Instructions the bench threads retired per operation (`--count-instructions`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions_per_op: Option<f64>,
    /// What those instructions cover (`user and kernel`, `user`), or why none were counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instructions_note: Option<String>,
    /// Mean time per stage (`--breakdown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Vec<breakdown::Component>>,
    /// Measured beside the `--neighbour` (true) or alone (false).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neighbour: Option<bool>,
}

struct RunResult {
    hist: Histogram<u64>,
    ops: u64,
    seconds: f64,
    cpu: Cpu,
    device_cpu: Option<Cpu>,
    trace: Option<breakdown::Trace>,
    misses: Option<(u64, u64)>,
    instructions: Option<Result<instructions::Count, String>>,
}

fn rusage_self() -> Cpu {
    proc_cpu(std::process::id()).unwrap_or_default()
}

fn proc_cpu(pid: u32) -> Option<Cpu> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let tick = 100.0; // USER_HZ on Linux
    let user_s = f.get(11)?.parse::<f64>().ok()? / tick;
    let sys_s = f.get(12)?.parse::<f64>().ok()? / tick;
    Some(Cpu {
        user_s,
        sys_s,
        total_s: cpu_clock(pid).unwrap_or(user_s + sys_s),
    })
}

/// Seconds of CPU `pid` has used, from its CPU-time clock.
fn cpu_clock(pid: u32) -> Option<f64> {
    let mut id: libc::clockid_t = 0;
    // SAFETY: `id` is a valid place for the clock id.
    if unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut id) } != 0 {
        return None;
    }
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to fill.
    if unsafe { libc::clock_gettime(id, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}

fn sub(a: Cpu, b: Cpu) -> Cpu {
    Cpu {
        user_s: a.user_s - b.user_s,
        sys_s: a.sys_s - b.sys_s,
        total_s: a.total_s - b.total_s,
    }
}

/// Picks request offsets.
///
/// With several files the region is split into equal parts, one per file, each holding whole
/// requests; a sequential pattern goes through the files one after the other.
struct Offsets {
    rng: rand::rngs::StdRng,
    size: u64,
    slots: u64,
    per_file: u64,
    next: u64,
    sequential: bool,
}

impl Offsets {
    fn new(
        seed: u64,
        size: u64,
        region: u64,
        files: usize,
        sequential: bool,
        thread: usize,
    ) -> Self {
        let files = files.max(1) as u64;
        let per_file = (region / files / size).max(1);
        let slots = per_file * files;
        Offsets {
            rng: rand::rngs::StdRng::seed_from_u64(seed ^ (thread as u64).wrapping_mul(0x9e37)),
            size,
            slots,
            per_file,
            next: (thread as u64 * slots / 8) % slots,
            sequential,
        }
    }
    fn slot(&mut self) -> u64 {
        if self.sequential {
            let s = self.next;
            self.next = (self.next + 1) % self.slots;
            s
        } else {
            self.rng.gen_range(0..self.slots)
        }
    }
    /// The next request's offset (one file).
    fn next(&mut self) -> u64 {
        self.slot() * self.size
    }
    /// The next request's file and offset in it.
    fn next_in(&mut self) -> (usize, u64) {
        let s = self.slot();
        (
            (s / self.per_file) as usize,
            (s % self.per_file) * self.size,
        )
    }
    fn is_write(&mut self, op: Op) -> bool {
        match op {
            Op::Read | Op::Seqread | Op::Nop => false,
            Op::Write | Op::Seqwrite => true,
            Op::Randrw => self.rng.gen_bool(0.5),
        }
    }
}

/// The clock every path's latencies are taken with (the TSC where invariant: cheaper to read
/// than `Instant`, and the same for every path).
fn clock() -> &'static moneta_device::SystemClock {
    static CLOCK: std::sync::OnceLock<moneta_device::SystemClock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(moneta_device::SystemClock::best)
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// A target a run drives: everything set up once per configuration.
enum Target {
    Moneta {
        ch: Arc<RawChannel>,
        daemon_pid: u32,
        completion: CompletionArg,
    },
    File {
        files: Arc<Vec<Arc<libmoneta::File>>>,
        zero_copy: bool,
        daemon_pid: u32,
        completion: CompletionArg,
        /// The daemon's socket, for its trace counters.
        socket: PathBuf,
    },
    Kernel {
        fds: Arc<Vec<OwnedFd>>,
    },
    Uring {
        fds: Arc<Vec<OwnedFd>>,
        sqpoll: bool,
    },
}

/// The raw path's channel and where its region starts on the array.
struct RawChannel {
    ch: ChannelOwner,
    base: u64,
}

enum ChannelOwner {
    /// A connection of its own, granted the region (a `--raw` daemon).
    Bare(Box<Channel>),
    /// The channel of a connection holding the region's file open (the file is kept so its
    /// records stay installed).
    Files(libmoneta::Moneta, #[allow(dead_code)] libmoneta::File),
}

impl RawChannel {
    fn ch(&self) -> &Channel {
        match &self.ch {
            ChannelOwner::Bare(c) => c,
            ChannelOwner::Files(m, _) => m.channel(),
        }
    }
}

/// When a bench thread stops: at the end of the run's time, or after a number of operations.
pub(crate) struct Stop {
    flag: AtomicBool,
    limit: Option<u64>,
}

impl Stop {
    /// Whether a thread that has completed `ops` operations stops now.
    #[inline]
    pub(crate) fn done(&self, ops: u64) -> bool {
        self.flag.load(Ordering::Relaxed) || self.limit.is_some_and(|l| ops >= l)
    }

    /// Whether a thread that has issued `issued` requests may issue another: with an
    /// operation count, exactly that many complete.
    #[inline]
    pub(crate) fn may_issue(&self, issued: u64) -> bool {
        !self.done(issued)
    }
}

/// One bench thread's work: its latency histogram and operation count.
type ThreadOutcome = Result<(Histogram<u64>, u64), String>;
type Job = Box<dyn FnOnce() -> ThreadOutcome + Send>;

fn run_threads(
    a: &BenchArgs,
    size: u64,
    target: &Target,
    seconds: f64,
    limit: Option<u64>,
) -> Result<RunResult, String> {
    let stop = Arc::new(Stop {
        flag: AtomicBool::new(false),
        limit,
    });
    let cpu0 = rusage_self();
    let dev0 = match target {
        Target::Moneta { daemon_pid, .. } | Target::File { daemon_pid, .. } => {
            proc_cpu(*daemon_pid)
        }
        _ => None,
    };
    let traced = match target {
        Target::File { socket, .. } if a.breakdown => {
            let c = Control::connect(socket).map_err(|e| e.to_string())?;
            let before = c.status().map_err(|e| e.to_string())?;
            breakdown::begin();
            Some((c, before))
        }
        _ => None,
    };
    let stats = |t: &Target| match t {
        Target::File { files, .. } => files.first().map(|f| f.moneta().stats()),
        _ => None,
    };
    let stats0 = stats(target);
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..a.threads {
        let stop = stop.clone();
        let count = a.count_instructions;
        let a = a.clone();
        let job: Job = match target {
            Target::Moneta { ch, completion, .. } => {
                let ch = ch.clone();
                let mode = completion.mode(size);
                Box::new(move || moneta_thread(&a, size, &ch, mode, t, &stop))
            }
            Target::File {
                files,
                completion,
                zero_copy,
                ..
            } => {
                let files = files.clone();
                let mode = completion.mode(size);
                let zc = *zero_copy;
                Box::new(move || files::file_thread(&a, size, &files, mode, zc, t, &stop))
            }
            Target::Kernel { fds } => {
                let fds = fds.clone();
                Box::new(move || kernel_thread(&a, size, &fds, t, &stop))
            }
            Target::Uring { fds, sqpoll } => {
                let fds = fds.clone();
                let sqpoll = *sqpoll;
                Box::new(move || uring::uring_thread(&a, size, &fds[0], sqpoll, t, &stop))
            }
        };
        handles.push(std::thread::spawn(move || {
            let counter = count.then(instructions::Counter::start);
            let out = job();
            (out, counter.map(|c| c.finish()))
        }));
    }
    if limit.is_none() {
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.flag.store(true, Ordering::Relaxed);
    }
    let mut hist = new_hist();
    let mut ops = 0;
    let mut counted: Option<Result<instructions::Count, String>> = None;
    for h in handles {
        let (out, count) = h
            .join()
            .map_err(|_| "a bench thread panicked".to_string())?;
        let (th, n) = out?;
        hist.add(&th).map_err(|e| e.to_string())?;
        ops += n;
        counted = match (counted, count) {
            (None, c) => c,
            (Some(Ok(a)), Some(Ok(b))) => Some(Ok(a.add(b))),
            (Some(Err(e)), _) | (_, Some(Err(e))) => Some(Err(e)),
            (c, None) => c,
        };
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = sub(rusage_self(), cpu0);
    let misses = match (stats0, stats(target)) {
        (Some(a), Some(b)) => Some((b.soft_misses - a.soft_misses, b.hard_misses - a.hard_misses)),
        _ => None,
    };
    let trace = match traced {
        Some((c, before)) => {
            let after = c.status().map_err(|e| e.to_string())?;
            Some(breakdown::end(&before, &after))
        }
        None => None,
    };
    let device_cpu = match (target, dev0) {
        (Target::Moneta { daemon_pid, .. } | Target::File { daemon_pid, .. }, Some(d0)) => {
            proc_cpu(*daemon_pid).map(|d| sub(d, d0))
        }
        _ => None,
    };
    Ok(RunResult {
        hist,
        ops,
        seconds: elapsed,
        cpu,
        device_cpu,
        trace,
        misses,
        instructions: counted,
    })
}

/// What every bench thread starts with: its offsets, histogram, buffer and the clock.
fn thread_state(
    a: &BenchArgs,
    size: u64,
    thread: usize,
) -> (
    Offsets,
    Histogram<u64>,
    Vec<u8>,
    &'static moneta_device::SystemClock,
) {
    let sequential = matches!(a.op, Op::Seqread | Op::Seqwrite);
    let offs = Offsets::new(a.seed, size, a.region, a.open_files, sequential, thread);
    (offs, new_hist(), vec![0x5au8; size as usize], clock())
}

/// Slices of the DMA buffer each request slot of the raw path may use: the channel's 64
/// shared evenly by every thread's slots.
fn raw_slot_slices(a: &BenchArgs) -> usize {
    (moneta_abi::TAGS_PER_CHANNEL / (a.threads * a.qd)).max(1)
}

/// The raw path: one command per request where it fits the slot's share of the DMA buffer,
/// else consecutive commands of that share (as a driver splits a large request), the request
/// ending with the last.
fn moneta_thread(
    a: &BenchArgs,
    size: u64,
    raw: &RawChannel,
    mode: Completion,
    thread: usize,
    stop: &Stop,
) -> Result<(Histogram<u64>, u64), String> {
    let ch = raw.ch();
    let base = raw.base;
    let qd = a.qd;
    let slot_slices = raw_slot_slices(a);
    let piece = (slot_slices * ch.slice_size()) as u64;
    let pieces = size.div_ceil(piece);
    let first = thread * qd * slot_slices;
    let tags: Vec<Tag> = (0..qd)
        .map(|i| Tag((first + i * slot_slices) as u8))
        .collect();
    let (mut offs, mut hist, mut buf, clk) = thread_state(a, size, thread);
    let mut ops = 0u64;
    let nop = a.op == Op::Nop;
    // Per slot: started, write, request address, next piece.
    let mut started = vec![0u64; qd];
    let mut writes = vec![false; qd];
    let mut addrs = vec![0u64; qd];
    let mut next = vec![0u64; qd];
    let send = |i: usize, k: u64, w: bool, addr: u64, buf: &[u8]| {
        let at = k * piece;
        let len = piece.min(size - at);
        if w && !nop {
            ch.write_dma(tags[i], 0, &buf[at as usize..(at + len) as usize]);
        }
        let opcode = match (nop, w) {
            (true, _) => Opcode::Nop,
            (false, true) => Opcode::Write,
            (false, false) => Opcode::Read,
        };
        ch.submit(
            tags[i],
            &Command {
                opcode,
                completion: mode,
                addr: if nop { 0 } else { base + addr + at },
                len: if nop { 0 } else { len },
                cookie: 0,
                seq: 0,
                // Raw commands: the records' file is not asked for.
                file: 0,
            },
        );
    };
    let start = |i: usize,
                 offs: &mut Offsets,
                 buf: &[u8],
                 started: &mut [u64],
                 writes: &mut [bool],
                 addrs: &mut [u64],
                 next: &mut [u64]| {
        let w = offs.is_write(a.op);
        let addr = offs.next();
        started[i] = clk.now_ns();
        writes[i] = w;
        addrs[i] = addr;
        next[i] = 1;
        send(i, 0, w, addr, buf);
    };
    let (mut issued, mut live) = (0u64, 0usize);
    for i in 0..qd {
        if stop.may_issue(issued) {
            start(
                i,
                &mut offs,
                &buf,
                &mut started,
                &mut writes,
                &mut addrs,
                &mut next,
            );
            issued += 1;
            live += 1;
        }
    }
    let mut i = 0;
    while live > 0 {
        if next[i] == 0 {
            // This slot finished its last request.
            i = (i + 1) % qd;
            continue;
        }
        let c = ch.wait(tags[i], mode).map_err(|e| e.to_string())?;
        if c.status != moneta_abi::Status::Ok {
            return Err(format!("device status {}", c.status.name()));
        }
        let k = next[i] - 1;
        if !writes[i] && !nop {
            let at = (k * piece) as usize;
            let len = piece.min(size - k * piece) as usize;
            ch.read_dma(tags[i], 0, &mut buf[at..at + len]);
        }
        if next[i] < pieces {
            send(i, next[i], writes[i], addrs[i], &buf);
            next[i] += 1;
            continue;
        }
        let ns = clk.now_ns().saturating_sub(started[i]);
        hist.record(ns.max(1)).ok();
        ops += 1;
        if stop.may_issue(issued) {
            start(
                i,
                &mut offs,
                &buf,
                &mut started,
                &mut writes,
                &mut addrs,
                &mut next,
            );
            issued += 1;
        } else {
            next[i] = 0;
            live -= 1;
        }
        i = (i + 1) % qd;
    }
    Ok((hist, ops))
}

fn kernel_thread(
    a: &BenchArgs,
    size: u64,
    fds: &[OwnedFd],
    thread: usize,
    stop: &Stop,
) -> Result<(Histogram<u64>, u64), String> {
    let (mut offs, mut hist, _, clk) = thread_state(a, size, thread);
    // Aligned for O_DIRECT (the kernel-odirect paths); the same for every kernel path.
    let mut buf = crate::loopfs::aligned_buffer(size as usize);
    buf.fill(0x5a);
    let mut ops = 0u64;
    while !stop.done(ops) {
        let w = offs.is_write(a.op);
        let (i, addr) = offs.next_in();
        let fd = &fds[i];
        let t = clk.now_ns();
        let r = if w {
            rustix::io::pwrite(fd, &buf, addr)
        } else {
            rustix::io::pread(fd, &mut buf[..], addr)
        };
        let ns = clk.now_ns().saturating_sub(t);
        match r {
            Ok(n) if n as u64 == size => {}
            Ok(n) => return Err(format!("short transfer: {n} of {size}")),
            Err(e) => return Err(format!("kernel I/O failed: {e}")),
        }
        hist.record(ns.max(1)).ok();
        ops += 1;
    }
    Ok((hist, ops))
}

fn summarize(
    a: &BenchArgs,
    path: Path,
    size: u64,
    mut runs: Vec<RunResult>,
    completion: Option<CompletionArg>,
) -> Record {
    let n = runs.len();
    let mut p50s: Vec<u64> = runs.iter().map(|r| r.hist.value_at_quantile(0.5)).collect();
    p50s.sort_unstable();
    runs.sort_by_key(|r| r.hist.value_at_quantile(0.5));
    let r = runs.swap_remove(n / 2);
    // The stages of the run whose latencies are reported, so that they add up to its mean (a
    // sum over every run let one slow run push the stages past the median run's mean).
    let trace = r.trace;
    let h = &r.hist;
    let (instructions_per_op, instructions_note) = match &r.instructions {
        None => (None, None),
        Some(Ok(c)) => (
            Some(c.instructions as f64 / r.ops.max(1) as f64),
            Some(c.scope.to_string()),
        ),
        Some(Err(e)) => (None, Some(e.clone())),
    };
    let iops = r.ops as f64 / r.seconds;
    let mib_s = if a.op == Op::Nop {
        0.0
    } else {
        iops * size as f64 / (1 << 20) as f64
    };
    let busy = |c: &Cpu| c.total_s;
    let cpus = (busy(&r.cpu) + r.device_cpu.as_ref().map(busy).unwrap_or(0.0)) / r.seconds;
    let breakdown = if !a.breakdown {
        None
    } else if let Some(t) = &trace {
        Some(breakdown::moneta_components(t))
    } else {
        path.synchronous()
            .then(|| breakdown::kernel_components(h.mean(), size, path != Path::KernelPsync))
    };
    Record {
        path: path.name(),
        op: a.op,
        size,
        qd: if path.synchronous() { 1 } else { a.qd },
        threads: a.threads,
        completion,
        ops: r.ops,
        seconds: r.seconds,
        iops,
        mib_s,
        lat_ns: Latency {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            mean: h.mean() as u64,
            max: h.max(),
        },
        cpu: r.cpu,
        device_cpu: r.device_cpu,
        runs: n,
        p50_spread: [p50s[0], p50s[n - 1]],
        records: None,
        open_files: a.open_files,
        extents: None,
        soft_misses: r.misses.map(|m| m.0),
        hard_misses: r.misses.map(|m| m.1),
        cpus,
        mib_s_per_cpu: if cpus > 0.0 { mib_s / cpus } else { 0.0 },
        instructions_per_op,
        instructions_note,
        breakdown,
        neighbour: None,
    }
}

/// The permission check alone: `records` records in one channel's tree, random lookups.
pub fn perm_check(records: u64, seed: u64) -> Record {
    let records = records.max(1);
    let mut t = moneta_device::PermissionTable::new(records as usize, 2, true);
    for i in 0..records {
        // Gaps between records keep them from merging.
        t.insert(
            1,
            i * 8192,
            4096,
            moneta_device::READ | moneta_device::WRITE,
            i,
        )
        .expect("insert");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let addrs: Vec<u64> = (0..1 << 16)
        .map(|_| rng.gen_range(0..records) * 8192 + rng.gen_range(0..3584))
        .collect();
    let rounds = 32;
    let mut best = f64::MAX;
    let mut hist = new_hist();
    for _ in 0..rounds {
        let start = Instant::now();
        let mut ok = 0u64;
        for &a in &addrs {
            ok += t
                .check(1, std::hint::black_box(a), 512, moneta_device::READ)
                .is_ok() as u64;
        }
        let ns = start.elapsed().as_nanos() as f64 / addrs.len() as f64;
        assert_eq!(ok, addrs.len() as u64);
        best = best.min(ns);
        hist.record((ns * 1000.0) as u64).ok();
    }
    let p50 = hist.value_at_quantile(0.5) as f64 / 1000.0;
    let ops = (rounds * addrs.len()) as u64;
    Record {
        path: Path::PermCheck.name(),
        op: Op::Read,
        size: 512,
        qd: 1,
        threads: 1,
        completion: None,
        ops,
        seconds: p50 * ops as f64 / 1e9,
        iops: 1e9 / p50,
        mib_s: 0.0,
        lat_ns: Latency {
            p50: p50.round() as u64,
            p90: (hist.value_at_quantile(0.9) as f64 / 1000.0).round() as u64,
            p99: (hist.value_at_quantile(0.99) as f64 / 1000.0).round() as u64,
            p999: (hist.value_at_quantile(0.999) as f64 / 1000.0).round() as u64,
            mean: (hist.mean() / 1000.0).round() as u64,
            max: (hist.max() as f64 / 1000.0).round() as u64,
        },
        cpu: Cpu::default(),
        device_cpu: None,
        runs: rounds,
        p50_spread: [
            best.round() as u64,
            (hist.max() as f64 / 1000.0).round() as u64,
        ],
        records: Some(records),
        open_files: 0,
        extents: None,
        soft_misses: None,
        hard_misses: None,
        cpus: 1.0,
        mib_s_per_cpu: 0.0,
        instructions_per_op: None,
        instructions_note: None,
        breakdown: None,
        neighbour: None,
    }
}

/// The `--neighbour`: another `moneta bench` process on the same daemon, reading 1 MiB at a
/// time through all 64 of its tags for `seconds`.
struct Neighbour {
    child: Option<std::process::Child>,
}

impl Neighbour {
    /// Starts it and returns once its reads are flowing (the daemon has read more than the
    /// region the neighbour wrote first).
    fn start(socket: &std::path::Path, seconds: f64) -> Result<Neighbour, String> {
        let ctl = Control::connect(socket).map_err(|e| e.to_string())?;
        let before = ctl.status().map_err(|e| e.to_string())?.bytes_read;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = std::process::Command::new(exe)
            .args([
                "bench",
                "--path",
                "moneta-raw",
                "--op",
                "read",
                "--size",
                "1M",
            ])
            .args(["--warmup", "0", "--runs", "1", "--json"])
            .args(["--region", "64M", "--duration", &format!("{seconds:.3}")])
            .arg("--socket")
            .arg(socket)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the neighbour: {e}"))?;
        let mut n = Neighbour { child: Some(child) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = n.child.as_mut().expect("started");
            if let Some(st) = c.try_wait().map_err(|e| e.to_string())? {
                return Err(format!("the neighbour stopped early ({st})"));
            }
            let read = ctl.status().map_err(|e| e.to_string())?.bytes_read;
            if read.saturating_sub(before) > 256 << 20 {
                return Ok(n);
            }
            if Instant::now() > deadline {
                return Err("the neighbour did not start reading within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for it to end (it removes its files).
    fn finish(mut self) -> Result<(), String> {
        let child = self.child.take().expect("started");
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "the neighbour failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A daemon the bench uses: its own private one, or the user's.
struct BenchDaemon {
    socket: PathBuf,
    pid: u32,
    /// It serves nvfs (else a raw device, where the raw path grants itself an extent).
    fs: bool,
    private: Option<PathBuf>,
}

impl BenchDaemon {
    fn get(a: &BenchArgs, region: u64) -> Result<BenchDaemon, String> {
        if let Some(s) = &a.socket {
            let c = Control::connect(s).map_err(|e| e.to_string())?;
            let st = c.status().map_err(|e| e.to_string())?;
            let fs = c.fs(moneta_abi::fsproto::FsRequest::Statfs).is_ok();
            return Ok(BenchDaemon {
                socket: s.clone(),
                pid: st.pid as u32,
                fs,
                private: None,
            });
        }
        let dir = std::env::temp_dir().join(format!("moneta-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let socket = dir.join("monetad.sock");
        // Room for the two region files and the file system's tables.
        let size = (2 * region + (64 << 20)).next_multiple_of(1 << 20);
        let mut args = vec!["--volatile".into(), "--size".into(), size.to_string()];
        if a.breakdown {
            args.push("--trace".into());
        }
        if a.no_merge {
            args.push("--no-merge".into());
        }
        if let Some(n) = a.table_entries {
            args.extend(["--table-entries".into(), n.to_string()]);
        }
        if let Some(c) = chunk_for_extents(a)? {
            args.extend(["--chunk-size".into(), c.to_string()]);
        }
        let started = crate::daemon::start(&socket, &args, &dir.join("monetad.log"))?;
        Ok(BenchDaemon {
            socket,
            pid: started.pid,
            fs: true,
            private: Some(dir),
        })
    }
}

impl Drop for BenchDaemon {
    fn drop(&mut self) {
        if let Some(dir) = self.private.take() {
            let _ = crate::daemon::stop(&self.socket);
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// The private daemon's allocation unit for `--extents`: each file's size over the extents.
fn chunk_for_extents(a: &BenchArgs) -> Result<Option<u64>, String> {
    let Some(n) = a.extents else { return Ok(None) };
    let per_file = a.region / a.open_files.max(1) as u64;
    let chunk = per_file / n.max(1);
    if n == 0 || !chunk.is_power_of_two() || chunk < 4096 || chunk * n != per_file {
        return Err(format!(
            "--extents {n}: each file's {per_file} bytes must split into {n} extents of a power \
             of two of at least 4 KiB (choose --region = open files x extents x 4K, 8K, ...)"
        ));
    }
    Ok(Some(chunk))
}

/// A file of `len` bytes, written through so every chunk is allocated; with `extents`, written
/// chunk by chunk in a shuffled order so each chunk is an extent of its own.
fn region_file(
    m: &libmoneta::Moneta,
    name: &str,
    len: u64,
    extents: Option<u64>,
    seed: u64,
) -> Result<libmoneta::File, String> {
    let f = m
        .open(
            name,
            libmoneta::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true),
        )
        .map_err(|e| format!("cannot create {name}: {e}"))?;
    let fill = |off: u64, n: u64| -> Result<(), String> {
        let chunk = vec![0xa5u8; 1 << 20];
        let mut at = off;
        while at < off + n {
            let k = chunk.len().min((off + n - at) as usize);
            f.write_at(&chunk[..k], at)
                .map_err(|e| format!("cannot fill {name}: {e}"))?;
            at += k as u64;
        }
        Ok(())
    };
    match extents {
        Some(n) if n > 1 => {
            use rand::seq::SliceRandom;
            let piece = len / n;
            let mut order: Vec<u64> = (0..n).collect();
            order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
            for k in order {
                fill(k * piece, piece)?;
            }
        }
        _ => fill(0, len)?,
    }
    Ok(f)
}

/// Extents of `f` as the file system reports them.
fn count_extents(m: &libmoneta::Moneta, f: &libmoneta::File, len: u64) -> Result<u64, String> {
    let ctl = m.channel().control();
    let (mut at, mut n) = (0u64, 0u64);
    while at < len {
        let (_, exts) = ctl
            .fs_lookup(f.handle(), at, len - at)
            .map_err(|e| format!("cannot look up the bench file: {e}"))?;
        let Some(last) = exts.last() else { break };
        n += exts.len() as u64;
        at = last.file_off + last.len;
    }
    Ok(n)
}

fn file_name(what: &str) -> String {
    format!("/moneta-bench-{what}-{}", std::process::id())
}

fn raw_target(d: &BenchDaemon, a: &BenchArgs) -> Result<Target, String> {
    let raw = if d.fs {
        // A file's extent, its records installed by the lookup: the array under a file,
        // reached without the file system.
        let m = libmoneta::Moneta::connect(&d.socket).map_err(|e| e.to_string())?;
        let f = region_file(&m, &file_name("raw"), a.region, None, a.seed)?;
        let (_, exts) = m
            .channel()
            .control()
            .fs_lookup(f.handle(), 0, a.region)
            .map_err(|e| format!("cannot look up the bench file: {e}"))?;
        let base = exts.first().map(|x| x.dev).unwrap_or(u64::MAX);
        let contiguous = exts
            .iter()
            .all(|x| x.dev != moneta_abi::fsproto::HOLE && x.dev == base + x.file_off)
            && exts.last().is_some_and(|x| x.file_off + x.len >= a.region);
        if !contiguous {
            return Err(
                "the raw path's file is not one contiguous extent on this daemon's array".into(),
            );
        }
        RawChannel {
            ch: ChannelOwner::Files(m, f),
            base,
        }
    } else {
        let ch = Channel::open(&d.socket).map_err(|e| e.to_string())?;
        ch.control()
            .grant(Grant {
                channel: ch.id(),
                rights: RIGHT_READ | RIGHT_WRITE,
                start: 0,
                len: a.region,
                file: 0,
            })
            .map_err(|e| format!("cannot grant the bench an extent: {e}"))?;
        RawChannel {
            ch: ChannelOwner::Bare(Box::new(ch)),
            base: 0,
        }
    };
    Ok(Target::Moneta {
        ch: Arc::new(raw),
        daemon_pid: d.pid,
        completion: a.completion,
    })
}

/// The moneta paths' files: `--open-files` files sharing the region, each of `--extents`
/// extents when given; with the extents counted per file.
struct BenchFiles {
    files: Arc<Vec<Arc<libmoneta::File>>>,
    extents: u64,
}

fn bench_files(d: &BenchDaemon, a: &BenchArgs) -> Result<BenchFiles, String> {
    if !d.fs {
        return Err(format!(
            "the daemon at {} serves a raw device: the moneta path needs nvfs",
            d.socket.display()
        ));
    }
    let m = libmoneta::Moneta::connect(&d.socket).map_err(|e| e.to_string())?;
    let n = a.open_files.max(1);
    let per_file = a.region / n as u64;
    let mut files = Vec::with_capacity(n);
    for i in 0..n {
        let f = region_file(
            &m,
            &file_name(&format!("files{i}")),
            per_file,
            a.extents,
            a.seed.wrapping_add(i as u64),
        )?;
        files.push(Arc::new(f));
    }
    let extents = count_extents(&m, &files[0], per_file)?;
    Ok(BenchFiles {
        files: Arc::new(files),
        extents,
    })
}

/// The kernel paths' files, and the loop-device file system they are on (kernel-odirect).
struct KernelFiles {
    fds: Arc<Vec<OwnedFd>>,
    /// Files to remove at the end (tmpfs; a loop file system goes whole).
    remove: Vec<PathBuf>,
    _fs: Option<crate::loopfs::LoopFs>,
}

/// The kernel paths' files: `--target`, or files in /dev/shm (one per `--open-files`); with
/// `fs`, files on a new ext4 or XFS on a loop device, opened with `O_DIRECT`.
fn kernel_files(a: &BenchArgs, fs: Option<crate::loopfs::FsKind>) -> Result<KernelFiles, String> {
    let n = a.open_files.max(1);
    if n > 1 && a.target.is_some() {
        return Err("--open-files above 1 makes its own files: drop --target".into());
    }
    let per_file = a.region / n as u64;
    let loopfs = match fs {
        Some(kind) => {
            // Room for the files and the file system's own metadata and journal.
            let size = (a.region + a.region / 8 + (64 << 20)).max(kind.min_size());
            Some(
                crate::loopfs::LoopFs::create(kind, size)
                    .map_err(|e| format!("kernel-odirect-{kind}: {e}"))?,
            )
        }
        None => None,
    };
    let mut fds = Vec::with_capacity(n);
    let mut remove = Vec::with_capacity(n);
    for i in 0..n {
        let path = match &loopfs {
            Some(l) => l.mount.join(format!("bench-{i}")),
            None => a.target.clone().unwrap_or_else(|| {
                PathBuf::from(format!("/dev/shm/moneta-bench-{}-{i}", std::process::id()))
            }),
        };
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        // Fill the region so reads hit allocated pages (blocks), as the array's do.
        let chunk = vec![0xa5u8; 1 << 20];
        let mut off = 0;
        while off < per_file {
            let k = chunk.len().min((per_file - off) as usize);
            rustix::io::pwrite(&f, &chunk[..k], off).map_err(|e| e.to_string())?;
            off += k as u64;
        }
        if loopfs.is_some() {
            f.sync_all().map_err(|e| e.to_string())?;
            drop(f);
            let d = crate::loopfs::open_direct(&path, true)
                .map_err(|e| format!("cannot open {} with O_DIRECT: {e}", path.display()))?;
            fds.push(d.into());
        } else {
            fds.push(f.into());
            if a.target.is_none() {
                remove.push(path);
            }
        }
    }
    Ok(KernelFiles {
        fds: Arc::new(fds),
        remove,
        _fs: loopfs,
    })
}

fn validate(a: &BenchArgs, sizes: &[u64], slice: usize, paths: &[Path]) -> Result<(), String> {
    let raw = paths.contains(&Path::MonetaRaw);
    if a.threads == 0
        || a.qd == 0
        || a.runs == 0
        || a.duration <= 0.0
        || a.ops == Some(0)
        || a.open_files == 0
    {
        return Err("threads, qd, runs, ops, open files and duration must be positive".into());
    }
    if a.qd > 4096 {
        return Err("qd is at most 4096".into());
    }
    if a.breakdown && a.qd != 1 {
        return Err("--breakdown times requests one at a time: use it with --qd 1".into());
    }
    if raw && a.threads * a.qd > moneta_abi::TAGS_PER_CHANNEL {
        return Err(format!(
            "threads x qd = {} exceeds the raw channel's {} tags",
            a.threads * a.qd,
            moneta_abi::TAGS_PER_CHANNEL
        ));
    }
    if a.open_files > 4096 {
        return Err("--open-files is at most 4096".into());
    }
    if a.open_files > 1
        && paths.iter().any(|p| {
            matches!(
                p,
                Path::MonetaRaw | Path::KernelUring | Path::KernelUringSqpoll
            )
        })
    {
        return Err(
            "--open-files above 1 works with the moneta, moneta-zero-copy and kernel-psync paths"
                .into(),
        );
    }
    if paths.contains(&Path::MonetaZeroCopy) {
        if let Some(s) = sizes.iter().find(|&&s| s as usize > slice) {
            return Err(format!(
                "moneta-zero-copy requests fit one DMA slice ({slice} bytes): size {s} does not"
            ));
        }
    }
    let part = a.region / a.open_files as u64;
    for &s in sizes {
        if s == 0 || s > part {
            return Err(format!(
                "size {s} must be between 1 and the region's part per file ({part})"
            ));
        }
    }
    Ok(())
}

/// Runs the benchmark; returns the records.
pub fn run(mut a: BenchArgs) -> Result<Vec<Record>, String> {
    let compare = a.paths.is_empty();
    if compare {
        a.paths = vec![Path::KernelPsync, Path::Moneta, Path::MonetaRaw];
    }
    let sizes = if a.size.is_empty() {
        vec![512, 4096]
    } else {
        a.size.clone()
    };
    let ops = if compare {
        vec![Op::Read, Op::Write]
    } else {
        vec![a.op]
    };
    let io_paths: Vec<Path> = a
        .paths
        .iter()
        .copied()
        .filter(|p| *p != Path::PermCheck && *p != Path::Nvfs)
        .collect();
    if a.paths.contains(&Path::Nvfs) {
        crate::fsbench::run(a.files, a.json)?;
        if io_paths.is_empty() && !a.paths.contains(&Path::PermCheck) {
            return Ok(Vec::new());
        }
    }
    if a.op == Op::Nop && io_paths.iter().any(|p| *p != Path::MonetaRaw) {
        return Err("--op nop measures the channel alone: use it with --path moneta-raw".into());
    }
    if a.qd != 1 && !io_paths.is_empty() && io_paths.iter().all(|p| p.synchronous()) {
        return Err(
            "kernel-psync and kernel-odirect are synchronous: use --threads, not --qd".into(),
        );
    }
    validate(&a, &sizes, moneta_abi::DEFAULT_SLICE_SIZE, &io_paths)?;
    if a.neighbour
        && (io_paths.is_empty()
            || io_paths
                .iter()
                .any(|p| !matches!(p, Path::Moneta | Path::MonetaZeroCopy | Path::MonetaRaw)))
    {
        return Err("--neighbour shares a Moneta daemon: use it with the moneta paths only".into());
    }
    let mut out = Vec::new();
    let daemon = if io_paths
        .iter()
        .any(|p| matches!(p, Path::Moneta | Path::MonetaZeroCopy | Path::MonetaRaw))
    {
        Some(BenchDaemon::get(&a, a.region)?)
    } else {
        None
    };
    let kernel = if io_paths.iter().any(|p| {
        matches!(
            p,
            Path::KernelPsync | Path::KernelUring | Path::KernelUringSqpoll
        )
    }) {
        Some(kernel_files(&a, None)?)
    } else {
        None
    };
    let mut odirect = Vec::new();
    for (p, kind) in [
        (Path::KernelOdirectExt4, crate::loopfs::FsKind::Ext4),
        (Path::KernelOdirectXfs, crate::loopfs::FsKind::Xfs),
    ] {
        if io_paths.contains(&p) {
            odirect.push((p, kernel_files(&a, Some(kind))?));
        }
    }
    let moneta_files = if io_paths
        .iter()
        .any(|p| matches!(p, Path::Moneta | Path::MonetaZeroCopy))
    {
        Some(bench_files(daemon.as_ref().expect("daemon"), &a)?)
    } else {
        None
    };
    let mut targets: Vec<(Path, Target)> = Vec::new();
    for &p in &io_paths {
        let t = match p {
            Path::MonetaRaw => raw_target(daemon.as_ref().expect("daemon"), &a)?,
            Path::Moneta | Path::MonetaZeroCopy => {
                let d = daemon.as_ref().expect("daemon");
                Target::File {
                    files: moneta_files.as_ref().expect("files").files.clone(),
                    zero_copy: p == Path::MonetaZeroCopy,
                    daemon_pid: d.pid,
                    completion: a.completion,
                    socket: d.socket.clone(),
                }
            }
            Path::KernelPsync => Target::Kernel {
                fds: kernel.as_ref().expect("kernel file").fds.clone(),
            },
            Path::KernelOdirectExt4 | Path::KernelOdirectXfs => Target::Kernel {
                fds: odirect
                    .iter()
                    .find(|(q, _)| *q == p)
                    .expect("loop file system")
                    .1
                    .fds
                    .clone(),
            },
            Path::KernelUring | Path::KernelUringSqpoll => Target::Uring {
                fds: kernel.as_ref().expect("kernel file").fds.clone(),
                sqpoll: p == Path::KernelUringSqpoll,
            },
            Path::PermCheck | Path::Nvfs => unreachable!("not an I/O path"),
        };
        targets.push((p, t));
    }
    for &op in &ops {
        for &size in &sizes {
            let mut cfg = a.clone();
            cfg.op = op;
            let mut results: Vec<(Path, Vec<RunResult>)> =
                io_paths.iter().map(|&p| (p, Vec::new())).collect();
            // Warm-up, discarded, then runs alternating between paths.
            for (p, _) in &results {
                let t = target_for(*p, &targets);
                let mut w = cfg.clone();
                if p.synchronous() {
                    w.qd = 1;
                }
                if cfg.warmup > 0.0 {
                    run_threads(&w, size, t, cfg.warmup, None)?;
                }
            }
            // Beside the neighbour: the same runs again with it reading, alternating.
            let mut beside: Vec<(Path, Vec<RunResult>)> = if cfg.neighbour {
                io_paths.iter().map(|&p| (p, Vec::new())).collect()
            } else {
                Vec::new()
            };
            for _ in 0..cfg.runs {
                for (p, rs) in results.iter_mut() {
                    let t = target_for(*p, &targets);
                    let mut w = cfg.clone();
                    if p.synchronous() {
                        w.qd = 1;
                    }
                    rs.push(run_threads(&w, size, t, cfg.duration, cfg.ops)?);
                }
                for (p, rs) in beside.iter_mut() {
                    let t = target_for(*p, &targets);
                    let d = daemon.as_ref().expect("the neighbour needs the daemon");
                    let n = Neighbour::start(&d.socket, cfg.duration + 2.0)?;
                    rs.push(run_threads(&cfg, size, t, cfg.duration, cfg.ops)?);
                    n.finish()?;
                }
            }
            let results: Vec<(Path, Vec<RunResult>, Option<bool>)> = if cfg.neighbour {
                results
                    .into_iter()
                    .map(|(p, r)| (p, r, Some(false)))
                    .chain(beside.into_iter().map(|(p, r)| (p, r, Some(true))))
                    .collect()
            } else {
                results.into_iter().map(|(p, r)| (p, r, None)).collect()
            };
            for (p, rs, neighbour) in results {
                let completion =
                    matches!(p, Path::MonetaRaw | Path::Moneta).then_some(cfg.completion);
                let mut rec = summarize(&cfg, p, size, rs, completion);
                rec.neighbour = neighbour;
                if matches!(p, Path::Moneta | Path::MonetaZeroCopy) {
                    rec.extents = moneta_files.as_ref().map(|f| f.extents);
                }
                if a.json && !a.quiet {
                    println!("{}", serde_json::to_string(&rec).expect("serialize"));
                }
                out.push(rec);
            }
        }
    }
    if a.paths.contains(&Path::PermCheck) || compare {
        for &n in &a.records {
            let rec = perm_check(n, a.seed);
            if a.json && !a.quiet {
                println!("{}", serde_json::to_string(&rec).expect("serialize"));
            }
            out.push(rec);
        }
    }
    if a.quiet {
    } else if a.csv {
        print!("{}", crate::csvout::to_csv(&out)?);
    } else if !a.json {
        print_table(&out);
        if a.breakdown {
            print_breakdown(&out);
        }
    }
    let files_left = daemon
        .as_ref()
        .filter(|d| d.fs && d.private.is_none())
        .map(|d| d.socket.clone());
    drop(targets);
    drop(moneta_files);
    if let Some(socket) = files_left {
        // On the user's daemon: remove the bench's files.
        if let Ok(m) = libmoneta::Moneta::connect(&socket) {
            let _ = m.unlink(file_name("raw"));
            for i in 0..a.open_files {
                let _ = m.unlink(file_name(&format!("files{i}")));
            }
        }
    }
    if compare && !a.quiet {
        if let Some(d) = &daemon {
            let idle = idle_cpu(d.pid, Duration::from_secs(2));
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"path": "moneta-idle", "seconds": 2.0, "cpu_pct": idle})
                );
            } else if let Some(pct) = idle.filter(|_| !a.csv) {
                println!("idle daemon: {pct:.2}% of one CPU over 2 s");
            }
        }
        // The floor under a request served by another core, for reading the figures above.
        let cores = machine::core_to_core();
        if a.json {
            if let Some(c) = &cores {
                let v = serde_json::json!({
                    "path": "machine-cores",
                    "cpus": c.cpus,
                    "line_round_trip_ns": c.line_round_trip_ns,
                    "handoff_4k_ns": c.handoff_4k_ns,
                });
                println!("{v}");
            }
        } else if !a.csv {
            match cores {
                Some(c) => println!(
                    "cores {} and {}: a cache line there and back {} ns, 4 KiB handed across {} ns",
                    c.cpus[0], c.cpus[1], c.line_round_trip_ns, c.handoff_4k_ns
                ),
                None => println!("cores: fewer than two usable CPUs, nothing handed across"),
            }
        }
    }
    if let Some(k) = kernel {
        for p in &k.remove {
            let _ = std::fs::remove_file(p);
        }
    }
    drop(odirect);
    Ok(out)
}

fn target_for(p: Path, targets: &[(Path, Target)]) -> &Target {
    &targets
        .iter()
        .find(|(q, _)| *q == p)
        .expect("a target per path")
        .1
}

/// The daemon's CPU use over `over`, in percent of one CPU, after letting it settle.
pub fn idle_cpu(pid: u32, over: Duration) -> Option<f64> {
    std::thread::sleep(Duration::from_millis(200));
    let a = proc_cpu(pid)?;
    std::thread::sleep(over);
    let b = proc_cpu(pid)?;
    let d = sub(b, a);
    Some(d.total_s / over.as_secs_f64() * 100.0)
}

fn print_table(recs: &[Record]) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "path",
        "op",
        "size",
        "qd",
        "thr",
        "p50 ns",
        "p99 ns",
        "p50 spread",
        "kIOPS",
        "MiB/s",
        "p50 vs psync",
        "IOPS vs best kernel",
    ]);
    for r in recs {
        let ours = !r.path.starts_with("kernel") && r.path != "perm-check";
        let same = |k: &&Record| k.op == r.op && k.size == r.size && k.threads == r.threads;
        let psync = recs.iter().filter(same).find(|k| k.path == "kernel-psync");
        let ratio = match psync {
            Some(k) if ours => format!("{:.2}x", r.lat_ns.p50 as f64 / k.lat_ns.p50 as f64),
            _ => String::new(),
        };
        // The fastest kernel path at the same queue depth (psync counts at depth 1 only).
        let best = recs
            .iter()
            .filter(same)
            .filter(|k| k.path.starts_with("kernel") && k.qd == r.qd)
            .map(|k| k.iops)
            .fold(0.0f64, f64::max);
        let vs_best = if ours && best > 0.0 {
            format!("{:.2}x", r.iops / best)
        } else {
            String::new()
        };
        let what = match (r.records, r.neighbour) {
            (Some(n), _) => format!("{} ({n} rec)", r.path),
            (None, Some(true)) => format!("{} beside 1M reader", r.path),
            (None, Some(false)) => format!("{} alone", r.path),
            (None, None) => r.path.to_string(),
        };
        t.add_row([
            what,
            format!("{:?}", r.op).to_lowercase(),
            r.size.to_string(),
            r.qd.to_string(),
            r.threads.to_string(),
            r.lat_ns.p50.to_string(),
            r.lat_ns.p99.to_string(),
            format!("{}-{}", r.p50_spread[0], r.p50_spread[1]),
            format!("{:.1}", r.iops / 1000.0),
            format!("{:.1}", r.mib_s),
            ratio,
            vs_best,
        ]);
    }
    println!("{t}");
}

fn print_breakdown(recs: &[Record]) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    for r in recs {
        let Some(parts) = &r.breakdown else { continue };
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(["stage", "ns", "share", "how"]);
        let total: f64 = parts.iter().map(|c| c.ns).sum();
        for c in parts {
            t.add_row([
                c.name.to_string(),
                format!("{:.0}", c.ns),
                format!("{:.0}%", 100.0 * c.ns / total.max(1.0)),
                c.how.to_string(),
            ]);
        }
        println!(
            "{} {} {} B: {:.0} ns per request (mean {} ns)",
            r.path,
            format!("{:?}", r.op).to_lowercase(),
            r.size,
            total,
            r.lat_ns.mean
        );
        println!("{t}");
    }
}
