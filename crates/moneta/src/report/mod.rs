//! `moneta report`: runs the experiments that reproduce the papers' figures against the kernel
//! on this machine and writes one self-contained HTML page, with the PNG figures, JSON and CSV
//! data of every experiment beside it.
//!
//! Each experiment ([`experiments`]) is a list of steps, most of them `moneta bench`
//! invocations run in this process with their exact command line recorded for the page's
//! "Reproduce" block; the applications experiment runs [`crate::apps`]. Steps that need what
//! the machine lacks (root for loop devices, a tool) are left out with the reason on the page.

mod array;
mod experiments;
pub mod html;
mod kernelfs;
mod mount;
mod paper;
pub mod plot;
mod remote;

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, ValueEnum};

use crate::bench;

/// How much to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SetArg {
    /// A few minutes on two cores: fewer sizes, three short runs per point.
    Quick,
    /// Every size of every figure, five runs of two seconds per point (45 minutes on two cores).
    Full,
    /// Every experiment at its smallest (a fixed small operation count, one run): checks
    /// that the whole report works, not for reading.
    Tiny,
}

/// Options of `moneta report`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Which set of measurements.
    #[arg(long, value_enum, default_value = "quick")]
    pub set: SetArg,
    /// Directory the page, figures and data go to (created; files of an earlier report there
    /// are replaced).
    #[arg(long, default_value = "moneta-report")]
    pub out: PathBuf,
    /// Only these experiments (comma-separated): breakdown, bandwidth, completion,
    /// permissions, async, iops, kernel-fs, mount, array-latency, array-bandwidth, fairness,
    /// power, wear, remote, apps.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// The parameters of a set.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Set {
    pub kind: SetArg,
    pub runs: usize,
    pub duration: f64,
    pub warmup: f64,
    /// A fixed operation count per thread instead of a duration (tiny).
    pub ops: Option<u64>,
}

impl Set {
    fn new(kind: SetArg) -> Set {
        match kind {
            SetArg::Quick => Set {
                kind,
                runs: 3,
                duration: 0.4,
                warmup: 0.2,
                ops: None,
            },
            SetArg::Full => Set {
                kind,
                runs: 5,
                duration: 2.0,
                warmup: 0.5,
                ops: None,
            },
            SetArg::Tiny => Set {
                kind,
                runs: 1,
                duration: 0.05,
                warmup: 0.0,
                ops: Some(300),
            },
        }
    }

    /// The bench's timing arguments for this set.
    pub fn timing(&self) -> Vec<String> {
        let mut v = vec![
            "--runs".to_string(),
            self.runs.to_string(),
            "--warmup".into(),
            self.warmup.to_string(),
        ];
        match self.ops {
            Some(n) => v.extend(["--ops".into(), n.to_string()]),
            None => v.extend(["--duration".into(), self.duration.to_string()]),
        }
        v
    }

    pub fn name(&self) -> &'static str {
        match self.kind {
            SetArg::Quick => "quick",
            SetArg::Full => "full",
            SetArg::Tiny => "tiny",
        }
    }
}

/// What this machine can run, decided once.
pub(crate) struct Env {
    /// ext4 on a loop device (root, tools), or why not.
    pub ext4: Result<(), String>,
    /// XFS on a loop device, or why not.
    pub xfs: Result<(), String>,
    /// FUSE mounts (`moneta mount`), or why not.
    pub fuse: Result<(), String>,
}

impl Env {
    fn probe() -> Env {
        Env {
            ext4: crate::loopfs::FsKind::Ext4.available(),
            xfs: crate::loopfs::FsKind::Xfs.available(),
            fuse: mount::available(),
        }
    }
}

/// One step of an experiment.
pub(crate) enum Step {
    /// `moneta bench` with these arguments (`--json` and output handling are the report's).
    Bench { label: String, args: Vec<String> },
    /// The applications benchmark.
    Apps,
    /// `moneta bench --path remote` with these arguments.
    Remote { label: String, args: Vec<String> },
}

/// What a step produced.
pub(crate) enum Output {
    Bench(Vec<bench::Record>),
    Apps(Result<Vec<crate::apps::AppRecord>, String>),
    Remote(Result<Vec<bench::remote::RemotePoint>, String>),
}

/// Runs the report; prints where the page is.
pub fn run(a: ReportArgs) -> Result<(), String> {
    let set = Set::new(a.set);
    let env = Env::probe();
    let all = experiments::all();
    for id in &a.only {
        if !all.iter().any(|e| e.id() == id) {
            let ids: Vec<&str> = all.iter().map(|e| e.id()).collect();
            return Err(format!(
                "no experiment `{id}`: the experiments are {}",
                ids.join(", ")
            ));
        }
    }
    let chosen: Vec<experiments::Exp> = all
        .into_iter()
        .filter(|e| a.only.is_empty() || a.only.iter().any(|o| o == e.id()))
        .collect();
    std::fs::create_dir_all(&a.out)
        .map_err(|e| format!("cannot create {}: {e}", a.out.display()))?;
    plot::ensure_font().map_err(|e| e.to_string())?;
    let mut machine = machine_rows();
    machine.push(("between two cores, at the start".into(), cores_row()));
    let plans: Vec<Vec<Step>> = chosen.iter().map(|e| e.steps(&set, &env)).collect();
    let total: usize = plans.iter().map(Vec::len).sum();
    let bar = indicatif::ProgressBar::new(total as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} {wide_msg}",
        )
        .map_err(|e| e.to_string())?
        .progress_chars("=> "),
    );
    let started = Instant::now();
    let mut sections = Vec::new();
    for (exp, steps) in chosen.iter().zip(plans) {
        let mut outputs = Vec::with_capacity(steps.len());
        for step in &steps {
            let label = match step {
                Step::Bench { label, .. } | Step::Remote { label, .. } => label.as_str(),
                Step::Apps => "applications",
            };
            bar.set_message(format!("{}: {label}", exp.id()));
            if bar.is_hidden() {
                eprintln!("report: {}: {label}", exp.id());
            }
            outputs.push(run_step(step, &a.out, set)?);
            bar.inc(1);
        }
        let section = exp
            .present(&steps, &outputs, &set, &env, &a.out)
            .map_err(|e| format!("{}: {e}", exp.id()))?;
        sections.push(section);
    }
    bar.finish_and_clear();
    // Hosts move their virtual CPUs: the floor may have changed during the sitting.
    machine.push(("between two cores, at the end".into(), cores_row()));
    let page = html::Page {
        title: format!("Moneta against the kernel on {}", hostname()),
        generated: format!(
            "{} ({} set, {:.0} s)",
            now_utc(),
            set.name(),
            started.elapsed().as_secs_f64()
        ),
        machine,
        versions: versions(),
        intro: intro(&set),
        sections,
    };
    let index = a.out.join("index.html");
    html::write_page(&page, &index).map_err(|e| format!("{}: {e}", index.display()))?;
    println!("report: {}", index.display());
    Ok(())
}

fn run_step(step: &Step, out: &Path, set: Set) -> Result<Output, String> {
    match step {
        Step::Bench { args, .. } => {
            let mut a = bench_args(args)?;
            a.quiet = true;
            bench::run(a)
                .map(Output::Bench)
                .map_err(|e| format!("moneta bench {}: {e}", args.join(" ")))
        }
        Step::Apps => Ok(Output::Apps(run_apps(out, set))),
        // A machine without nbdkit or libnbd cannot run it: the section says why.
        Step::Remote { args, .. } => Ok(Output::Remote(bench_args(args).and_then(|mut a| {
            a.quiet = true;
            bench::remote::run_remote(&a)
        }))),
    }
}

/// Parses bench arguments as the command line would.
pub(crate) fn bench_args(args: &[String]) -> Result<bench::BenchArgs, String> {
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        a: bench::BenchArgs,
    }
    use clap::Parser;
    let argv = std::iter::once("moneta-bench".to_string()).chain(args.iter().cloned());
    Cli::try_parse_from(argv)
        .map(|c| c.a)
        .map_err(|e| e.to_string())
}

/// The applications benchmark against a private daemon of its own.
fn run_apps(out: &Path, set: Set) -> Result<Vec<crate::apps::AppRecord>, String> {
    let dir = std::env::temp_dir().join(format!("moneta-report-apps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let socket = dir.join("monetad.sock");
    // The device gets a CPU of its own (on two or more), as the papers' device is hardware of
    // its own: the programs' threads run on the others (see libmoneta's `affinity`).
    let daemon = crate::daemon::start(
        &socket,
        &[
            "--volatile".into(),
            "--size".into(),
            "512M".into(),
            "--poller-cpu".into(),
            "auto".into(),
        ],
        &dir.join("monetad.log"),
    );
    let r = daemon.and_then(|_| {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        crate::apps::run(&crate::apps::AppOptions {
            quick: set.kind != SetArg::Full,
            moneta_socket: socket.clone(),
            moneta_bin: exe,
            work: out.join("apps-work"),
        })
    });
    let _ = crate::daemon::stop(&socket);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(out.join("apps-work"));
    r
}

fn intro(set: &Set) -> String {
    let how = match set.ops {
        Some(n) => format!("{n} operations per thread, one run per point"),
        None => format!(
            "{} runs of {} s per point after a {} s warm-up that is discarded; a point is the \
             median run, and the JSON files keep every point's spread",
            set.runs, set.duration, set.warmup
        ),
    };
    format!(
        "Every figure below was measured on this machine in one sitting: Moneta's paths and the \
         kernel's side by side, driven by the same benchmark engine ({how}). Ratios are taken \
         within one run. The paper's figure is described under each of ours for comparison; the \
         papers measured a hardware prototype, so absolute numbers differ, and the shapes are \
         what should agree.\n\n\
         Paths: moneta = files on nvfs through libmoneta, no system call on the data path; \
         moneta-raw = raw commands through a channel on one file's extent (no file system); \
         kernel-psync = pread/pwrite on tmpfs (the kernel's best case: page cache, no device); \
         kernel-uring = io_uring on that file; kernel-odirect-ext4/xfs = O_DIRECT on ext4 or \
         XFS on a loop device over a tmpfs file (the kernel's block path, the papers' \
         baseline); moneta-kfs-ext4/xfs = files of ext4 or XFS made on the array by monetad \
         --kernel-fs, through a channel, and kernel-kfs-*-odirect/buffered = the same files \
         through the kernel's mount. The Moneta device is emulated by a daemon's polling thread, which uses one \
         of the machine's cores while requests flow: the CPU columns count it."
    )
}

fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60
    )
}

/// Year, month, day of a count of days since 1970-01-01 (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// What talking across the first two cores costs now (`moneta bench`'s last line): the floor
/// under every request the device's poller serves from another core.
fn cores_row() -> String {
    match crate::bench::machine::core_to_core() {
        Some(c) => format!(
            "cores {} and {}: a cache line there and back {} ns, 4 KiB handed across {} ns",
            c.cpus[0], c.cpus[1], c.line_round_trip_ns, c.handoff_4k_ns
        ),
        None => "fewer than two usable CPUs".into(),
    }
}

fn machine_rows() -> Vec<(String, String)> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split(':').nth(1))
            .map(|v| v.trim().to_string())
    };
    let flags = field("flags").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kb: u64 = m
                .lines()
                .find(|l| l.starts_with("MemTotal"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(format!("{:.1} GiB", kb as f64 / (1 << 20) as f64))
        })
        .unwrap_or_else(|| "unknown".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    vec![
        (
            "processor".into(),
            field("model name").unwrap_or_else(|| "unknown".into()),
        ),
        (
            "cores".into(),
            std::thread::available_parallelism()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "unknown".into()),
        ),
        ("memory".into(), mem),
        (
            "virtual machine".into(),
            if flags.split_whitespace().any(|f| f == "hypervisor") {
                "yes (hypervisor flag)".into()
            } else {
                "no".into()
            },
        ),
        ("load average at start".into(), load),
        ("host".into(), hostname()),
    ]
}

fn versions() -> Vec<(String, String)> {
    let u = rustix::system::uname();
    let mut v = vec![
        ("moneta".to_string(), env!("CARGO_PKG_VERSION").to_string()),
        (
            "Linux".into(),
            format!(
                "{} {}",
                u.release().to_string_lossy(),
                u.version().to_string_lossy()
            ),
        ),
    ];
    if let Ok(os) = std::fs::read_to_string("/etc/os-release") {
        if let Some(name) = os
            .lines()
            .find_map(|l| l.strip_prefix("PRETTY_NAME="))
            .map(|n| n.trim_matches('"').to_string())
        {
            v.push(("system".into(), name));
        }
    }
    for (tool, arg) in [("fio", "--version"), ("sqlite3", "--version")] {
        if let Ok(o) = std::process::Command::new(tool).arg(arg).output() {
            let s = String::from_utf8_lossy(&o.stdout);
            if let Some(line) = s.lines().next() {
                v.push((
                    tool.into(),
                    line.split_whitespace().next().unwrap_or("").into(),
                ));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_from_days() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_415), (2025, 11, 23));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn every_experiment_plans_bench_steps_that_parse() {
        let env = Env {
            ext4: Ok(()),
            xfs: Ok(()),
            fuse: Ok(()),
        };
        for kind in [SetArg::Tiny, SetArg::Quick, SetArg::Full] {
            let set = Set::new(kind);
            for e in experiments::all() {
                let steps = e.steps(&set, &env);
                assert!(!steps.is_empty(), "{}", e.id());
                for s in steps {
                    if let Step::Bench { args, .. } | Step::Remote { args, .. } = s {
                        bench_args(&args).unwrap_or_else(|err| panic!("{args:?}: {err}"));
                    }
                }
            }
        }
    }
}
