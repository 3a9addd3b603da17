//! `moneta bench`: one engine that times the same I/O pattern through different paths.
//!
//! Paths: `moneta` (files on nvfs through libmoneta, synchronous or `--qd` asynchronous),
//! `moneta-raw` (raw commands through a channel on one file's extent: no file system on the
//! way), `kernel-psync` (`pread`/`pwrite` on a file, by default in `/dev/shm`), `kernel-uring`
//! and `kernel-uring-sqpoll` (io_uring on that file), and `perm-check` (the permission table's
//! check alone, in process). Each configuration runs `--runs` times, paths alternating, after
//! a discarded warm-up; the reported run is the median by p50 latency, with the spread of p50
//! over all runs.

mod files;
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
    /// Raw commands through a channel on one file's extent.
    MonetaRaw,
    /// pread/pwrite on a file (tmpfs by default).
    KernelPsync,
    /// io_uring on that file: fixed file, registered buffers, single issuer, deferred task
    /// work.
    KernelUring,
    /// io_uring with a kernel thread polling the submission queue.
    KernelUringSqpoll,
    /// The permission table's check alone.
    PermCheck,
    /// The file system's calls (soft miss, stat, small files) against the kernel on tmpfs.
    Nvfs,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Moneta => "moneta",
            Path::MonetaRaw => "moneta-raw",
            Path::KernelPsync => "kernel-psync",
            Path::KernelUring => "kernel-uring",
            Path::KernelUringSqpoll => "kernel-uring-sqpoll",
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
    /// permission check, and the idle daemon's CPU.
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
    /// User time.
    pub user_s: f64,
    /// System time.
    pub sys_s: f64,
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
}

struct RunResult {
    hist: Histogram<u64>,
    ops: u64,
    seconds: f64,
    cpu: Cpu,
    device_cpu: Option<Cpu>,
}

fn rusage_self() -> Cpu {
    proc_cpu(std::process::id()).unwrap_or_default()
}

fn proc_cpu(pid: u32) -> Option<Cpu> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let tick = 100.0; // USER_HZ on Linux
    Some(Cpu {
        user_s: f.get(11)?.parse::<f64>().ok()? / tick,
        sys_s: f.get(12)?.parse::<f64>().ok()? / tick,
    })
}

fn sub(a: Cpu, b: Cpu) -> Cpu {
    Cpu {
        user_s: a.user_s - b.user_s,
        sys_s: a.sys_s - b.sys_s,
    }
}

/// Picks request offsets.
struct Offsets {
    rng: rand::rngs::StdRng,
    size: u64,
    slots: u64,
    next: u64,
    sequential: bool,
}

impl Offsets {
    fn new(seed: u64, size: u64, region: u64, sequential: bool, thread: usize) -> Self {
        let slots = (region / size).max(1);
        Offsets {
            rng: rand::rngs::StdRng::seed_from_u64(seed ^ (thread as u64).wrapping_mul(0x9e37)),
            size,
            slots,
            next: (thread as u64 * slots / 8) % slots,
            sequential,
        }
    }
    fn next(&mut self) -> u64 {
        let slot = if self.sequential {
            let s = self.next;
            self.next = (self.next + 1) % self.slots;
            s
        } else {
            self.rng.gen_range(0..self.slots)
        };
        slot * self.size
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
        file: Arc<libmoneta::File>,
        daemon_pid: u32,
        completion: CompletionArg,
    },
    Kernel {
        fd: Arc<OwnedFd>,
    },
    Uring {
        fd: Arc<OwnedFd>,
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
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..a.threads {
        let stop = stop.clone();
        let a = a.clone();
        let job: Job = match target {
            Target::Moneta { ch, completion, .. } => {
                let ch = ch.clone();
                let mode = completion.mode(size);
                Box::new(move || moneta_thread(&a, size, &ch, mode, t, &stop))
            }
            Target::File {
                file, completion, ..
            } => {
                let file = file.clone();
                let mode = completion.mode(size);
                Box::new(move || files::file_thread(&a, size, &file, mode, t, &stop))
            }
            Target::Kernel { fd } => {
                let fd = fd.clone();
                Box::new(move || kernel_thread(&a, size, &fd, t, &stop))
            }
            Target::Uring { fd, sqpoll } => {
                let fd = fd.clone();
                let sqpoll = *sqpoll;
                Box::new(move || uring::uring_thread(&a, size, &fd, sqpoll, t, &stop))
            }
        };
        handles.push(std::thread::spawn(job));
    }
    if limit.is_none() {
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.flag.store(true, Ordering::Relaxed);
    }
    let mut hist = new_hist();
    let mut ops = 0;
    for h in handles {
        let (th, n) = h
            .join()
            .map_err(|_| "a bench thread panicked".to_string())??;
        hist.add(&th).map_err(|e| e.to_string())?;
        ops += n;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = sub(rusage_self(), cpu0);
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
    let offs = Offsets::new(a.seed, size, a.region, sequential, thread);
    (offs, new_hist(), vec![0x5au8; size as usize], clock())
}

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
    let span = (size as usize).div_ceil(ch.slice_size());
    let qd = a.qd;
    let first = thread * qd * span;
    let tags: Vec<Tag> = (0..qd).map(|i| Tag((first + i * span) as u8)).collect();
    let (mut offs, mut hist, mut buf, clk) = thread_state(a, size, thread);
    let mut ops = 0u64;
    let mut started = vec![0u64; qd];
    let mut writes = vec![false; qd];
    let submit =
        |i: usize, offs: &mut Offsets, buf: &[u8], started: &mut [u64], writes: &mut [bool]| {
            let w = offs.is_write(a.op);
            let addr = offs.next();
            started[i] = clk.now_ns();
            writes[i] = w;
            if w {
                ch.write_dma(tags[i], 0, buf);
            }
            let nop = a.op == Op::Nop;
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
                    addr: if nop { 0 } else { base + addr },
                    len: if nop { 0 } else { size },
                    cookie: 0,
                    seq: 0,
                },
            );
        };
    for i in 0..qd {
        submit(i, &mut offs, &buf, &mut started, &mut writes);
    }
    let mut i = 0;
    loop {
        let c = ch.wait(tags[i], mode).map_err(|e| e.to_string())?;
        if c.status != moneta_abi::Status::Ok {
            return Err(format!("device status {}", c.status.name()));
        }
        if !writes[i] && a.op != Op::Nop {
            ch.read_dma(tags[i], 0, &mut buf);
        }
        let ns = clk.now_ns().saturating_sub(started[i]);
        hist.record(ns.max(1)).ok();
        ops += 1;
        if stop.done(ops) {
            // Drain the rest.
            for k in 1..qd {
                let j = (i + k) % qd;
                ch.wait(tags[j], mode).map_err(|e| e.to_string())?;
            }
            break;
        }
        submit(i, &mut offs, &buf, &mut started, &mut writes);
        i = (i + 1) % qd;
    }
    Ok((hist, ops))
}

fn kernel_thread(
    a: &BenchArgs,
    size: u64,
    fd: &OwnedFd,
    thread: usize,
    stop: &Stop,
) -> Result<(Histogram<u64>, u64), String> {
    let (mut offs, mut hist, mut buf, clk) = thread_state(a, size, thread);
    let mut ops = 0u64;
    while !stop.done(ops) {
        let w = offs.is_write(a.op);
        let addr = offs.next();
        let t = clk.now_ns();
        let r = if w {
            rustix::io::pwrite(fd, &buf, addr)
        } else {
            rustix::io::pread(fd, &mut buf, addr)
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
    let h = &r.hist;
    let iops = r.ops as f64 / r.seconds;
    Record {
        path: path.name(),
        op: a.op,
        size,
        qd: if path == Path::KernelPsync { 1 } else { a.qd },
        threads: a.threads,
        completion,
        ops: r.ops,
        seconds: r.seconds,
        iops,
        mib_s: if a.op == Op::Nop {
            0.0
        } else {
            iops * size as f64 / (1 << 20) as f64
        },
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
        let started = crate::daemon::start(
            &socket,
            &["--volatile".into(), "--size".into(), size.to_string()],
            &dir.join("monetad.log"),
        )?;
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

/// A file of `region` bytes, written through so every chunk is allocated.
fn region_file(m: &libmoneta::Moneta, name: &str, region: u64) -> Result<libmoneta::File, String> {
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
    let chunk = vec![0xa5u8; 1 << 20];
    let mut off = 0;
    while off < region {
        let n = chunk.len().min((region - off) as usize);
        f.write_at(&chunk[..n], off)
            .map_err(|e| format!("cannot fill {name}: {e}"))?;
        off += n as u64;
    }
    Ok(f)
}

fn file_name(what: &str) -> String {
    format!("/moneta-bench-{what}-{}", std::process::id())
}

fn raw_target(d: &BenchDaemon, a: &BenchArgs) -> Result<Target, String> {
    let raw = if d.fs {
        // A file's extent, its records installed by the lookup: the array under a file,
        // reached without the file system.
        let m = libmoneta::Moneta::connect(&d.socket).map_err(|e| e.to_string())?;
        let f = region_file(&m, &file_name("raw"), a.region)?;
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

fn file_target(d: &BenchDaemon, a: &BenchArgs) -> Result<Target, String> {
    if !d.fs {
        return Err(format!(
            "the daemon at {} serves a raw device: the moneta path needs nvfs",
            d.socket.display()
        ));
    }
    let m = libmoneta::Moneta::connect(&d.socket).map_err(|e| e.to_string())?;
    let f = region_file(&m, &file_name("files"), a.region)?;
    Ok(Target::File {
        file: Arc::new(f),
        daemon_pid: d.pid,
        completion: a.completion,
    })
}

fn kernel_file(a: &BenchArgs) -> Result<(Arc<OwnedFd>, PathBuf), String> {
    let path = a
        .target
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("/dev/shm/moneta-bench-{}", std::process::id())));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // Fill the region so reads hit allocated pages, as the array's do.
    let chunk = vec![0xa5u8; 1 << 20];
    let mut off = 0;
    while off < a.region {
        let n = chunk.len().min((a.region - off) as usize);
        rustix::io::pwrite(&f, &chunk[..n], off).map_err(|e| e.to_string())?;
        off += n as u64;
    }
    Ok((Arc::new(f.into()), path))
}

fn validate(a: &BenchArgs, sizes: &[u64], slice: usize, raw: bool) -> Result<(), String> {
    if a.threads == 0 || a.qd == 0 || a.runs == 0 || a.duration <= 0.0 || a.ops == Some(0) {
        return Err("threads, qd, runs, ops and duration must be positive".into());
    }
    if a.qd > 4096 {
        return Err("qd is at most 4096".into());
    }
    for &s in sizes {
        if s == 0 || s > a.region {
            return Err(format!(
                "size {s} must be between 1 and the region ({})",
                a.region
            ));
        }
        let span = (s as usize).div_ceil(slice);
        if raw && a.threads * a.qd * span > moneta_abi::TAGS_PER_CHANNEL {
            return Err(format!(
                "threads x qd x slices per request = {} exceeds the channel's 64 tags",
                a.threads * a.qd * span
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
    if a.qd != 1 && !io_paths.is_empty() && io_paths.iter().all(|p| *p == Path::KernelPsync) {
        return Err("kernel-psync is synchronous: use --threads, not --qd".into());
    }
    validate(
        &a,
        &sizes,
        moneta_abi::DEFAULT_SLICE_SIZE,
        io_paths.contains(&Path::MonetaRaw),
    )?;
    let mut out = Vec::new();
    let daemon = if io_paths
        .iter()
        .any(|p| matches!(p, Path::Moneta | Path::MonetaRaw))
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
        Some(kernel_file(&a)?)
    } else {
        None
    };
    let mut targets: Vec<(Path, Target)> = Vec::new();
    for &p in &io_paths {
        let t = match p {
            Path::MonetaRaw => raw_target(daemon.as_ref().expect("daemon"), &a)?,
            Path::Moneta => file_target(daemon.as_ref().expect("daemon"), &a)?,
            Path::KernelPsync => Target::Kernel {
                fd: kernel.as_ref().expect("kernel file").0.clone(),
            },
            Path::KernelUring | Path::KernelUringSqpoll => Target::Uring {
                fd: kernel.as_ref().expect("kernel file").0.clone(),
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
                if *p == Path::KernelPsync {
                    w.qd = 1;
                }
                if cfg.warmup > 0.0 {
                    run_threads(&w, size, t, cfg.warmup, None)?;
                }
            }
            for _ in 0..cfg.runs {
                for (p, rs) in results.iter_mut() {
                    let t = target_for(*p, &targets);
                    let mut w = cfg.clone();
                    if *p == Path::KernelPsync {
                        w.qd = 1;
                    }
                    rs.push(run_threads(&w, size, t, cfg.duration, cfg.ops)?);
                }
            }
            for (p, rs) in results {
                let completion =
                    matches!(p, Path::MonetaRaw | Path::Moneta).then_some(cfg.completion);
                let rec = summarize(&cfg, p, size, rs, completion);
                if a.json {
                    println!("{}", serde_json::to_string(&rec).expect("serialize"));
                }
                out.push(rec);
            }
        }
    }
    if a.paths.contains(&Path::PermCheck) || compare {
        for &n in &a.records {
            let rec = perm_check(n, a.seed);
            if a.json {
                println!("{}", serde_json::to_string(&rec).expect("serialize"));
            }
            out.push(rec);
        }
    }
    if !a.json {
        print_table(&out);
    }
    let files_left = daemon
        .as_ref()
        .filter(|d| d.fs && d.private.is_none())
        .map(|d| d.socket.clone());
    drop(targets);
    if let Some(socket) = files_left {
        // On the user's daemon: remove the bench's files.
        if let Ok(m) = libmoneta::Moneta::connect(&socket) {
            for what in ["raw", "files"] {
                let _ = m.unlink(file_name(what));
            }
        }
    }
    if compare {
        if let Some(d) = &daemon {
            let idle = idle_cpu(d.pid, Duration::from_secs(2));
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({"path": "moneta-idle", "seconds": 2.0, "cpu_pct": idle})
                );
            } else if let Some(pct) = idle {
                println!("idle daemon: {pct:.2}% of one CPU over 2 s");
            }
        }
    }
    if let Some((_, path)) = kernel {
        if a.target.is_none() {
            let _ = std::fs::remove_file(path);
        }
    }
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
    Some((d.user_s + d.sys_s) / over.as_secs_f64() * 100.0)
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
        let what = match r.records {
            Some(n) => format!("{} ({n} rec)", r.path),
            None => r.path.to_string(),
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
