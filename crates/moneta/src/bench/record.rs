//! What a configuration's measurement yields, and the CPU clocks it reads.

use hdrhistogram::Histogram;
use serde::Serialize;

use super::*;

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
    /// The array model of the run's daemon (`none`, or its name; the kernel paths do not go
    /// through it).
    pub model: String,
    /// Its parameters, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_parameters: Option<std::collections::BTreeMap<String, String>>,
    /// What the model says of the reported run: power, energy, wear.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_figures: Option<modelfig::ModelFigures>,
    /// The `--neighbour`'s bandwidth in the reported run (MiB/s), beside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neighbour_mib_s: Option<f64>,
    /// Bytes the daemon moved through channels in the reported run (the `moneta-kfs` paths:
    /// `ops` x `size` when no request fell back to the kernel).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel_bytes: Option<u64>,
}

pub(crate) struct RunResult {
    pub(crate) hist: Histogram<u64>,
    pub(crate) ops: u64,
    pub(crate) seconds: f64,
    pub(crate) cpu: Cpu,
    pub(crate) device_cpu: Option<Cpu>,
    pub(crate) trace: Option<breakdown::Trace>,
    pub(crate) misses: Option<(u64, u64)>,
    pub(crate) instructions: Option<Result<instructions::Count, String>>,
    /// The array model's counters before and after the run, on a daemon with a model.
    pub(crate) model: Option<(modelfig::ModelSnap, modelfig::ModelSnap)>,
    /// The `--neighbour`'s bandwidth during the run (MiB/s), beside it.
    pub(crate) neighbour_mib_s: Option<f64>,
    /// Bytes the daemon moved through channels during the run (the `moneta-kfs` paths).
    pub(crate) channel_bytes: Option<u64>,
}

pub(crate) fn rusage_self() -> Cpu {
    proc_cpu(std::process::id()).unwrap_or_default()
}

pub(crate) fn proc_cpu(pid: u32) -> Option<Cpu> {
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
pub(crate) fn cpu_clock(pid: u32) -> Option<f64> {
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

pub(crate) fn sub(a: Cpu, b: Cpu) -> Cpu {
    Cpu {
        user_s: a.user_s - b.user_s,
        sys_s: a.sys_s - b.sys_s,
        total_s: a.total_s - b.total_s,
    }
}
