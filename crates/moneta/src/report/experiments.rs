//! The experiments of `moneta report`: what each runs and how its section reads.
//!
//! Every experiment plans its steps for a [`Set`] (the same code for the tiny, quick and full
//! sets: only sizes, points and timings differ) and, once they ran, writes its data files and
//! figures and returns its section of the page. Readings are computed from the data, with the
//! comparison stated either way: where Moneta is slower, the reading says so.

use std::path::Path;

use serde_json::Value;

use super::html::{Section, Table};
use super::plot::{self, BarChart, Chart, Scale, Series};
use super::{paper, Env, Output, Set, SetArg, Step};
use crate::apps::AppRecord;
use crate::bench::{Op, Record};

/// An experiment of the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exp {
    Breakdown,
    Bandwidth,
    Completion,
    Permissions,
    Async,
    Iops,
    KernelFs,
    Mount,
    Apps,
    ArrayLatency,
    ArrayBandwidth,
    Fairness,
    Power,
    Wear,
    Remote,
}

/// Every experiment, in page order.
pub(crate) fn all() -> Vec<Exp> {
    vec![
        Exp::Breakdown,
        Exp::Bandwidth,
        Exp::Completion,
        Exp::Permissions,
        Exp::Async,
        Exp::Iops,
        Exp::KernelFs,
        Exp::Mount,
        Exp::ArrayLatency,
        Exp::ArrayBandwidth,
        Exp::Fairness,
        Exp::Power,
        Exp::Wear,
        Exp::Remote,
        Exp::Apps,
    ]
}

/// The loop-device kernel path the machine can run, if any (ext4).
fn odirect(env: &Env) -> Option<&'static str> {
    env.ext4.is_ok().then_some("kernel-odirect-ext4")
}

fn odirect_note(env: &Env) -> Option<String> {
    env.ext4
        .as_ref()
        .err()
        .map(|why| format!("kernel-odirect-ext4 (the kernel's block path) was left out: {why}."))
}

/// A bench step: `args` then the set's timing.
fn bench(label: impl Into<String>, args: &[&str], extra: &[String], set: &Set) -> Step {
    let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    v.extend(extra.iter().cloned());
    v.extend(set.timing());
    Step::Bench {
        label: label.into(),
        args: v,
    }
}

/// Two bench steps, random reads and random writes of each size in `sizes`, the `paths`
/// alternating run by run in each.
pub(super) fn reads_and_writes_by_size(paths: &[String], sizes: &[u64], set: &Set) -> Vec<Step> {
    let mut args: Vec<String> = paths
        .iter()
        .flat_map(|p| ["--path".to_string(), p.clone()])
        .collect();
    args.extend(["--size".to_string(), sizes_arg(sizes)]);
    ["read", "write"]
        .iter()
        .map(|op| bench(format!("{op}s by size"), &["--op", op], &args, set))
        .collect()
}

/// A table with a row per (operation, size) of `recs` and a column per path, each cell
/// `cell` of that path's record.
pub(super) fn size_table(
    recs: &[&Record],
    paths: &[&str],
    header: impl Fn(&str) -> String,
    cell: impl Fn(&Record) -> String,
) -> Table {
    let mut keys: Vec<(Op, u64)> = Vec::new();
    for r in recs {
        if !keys.contains(&(r.op, r.size)) {
            keys.push((r.op, r.size));
        }
    }
    let mut head = vec!["op".to_string(), "size".to_string()];
    head.extend(paths.iter().map(|p| header(p)));
    let rows = keys
        .iter()
        .map(|&(op, size)| {
            let mut row = vec![op_name(op).to_string(), size_name(size)];
            for p in paths {
                row.push(
                    recs.iter()
                        .find(|r| r.path == *p && r.op == op && r.size == size)
                        .map(|r| cell(r))
                        .unwrap_or_default(),
                );
            }
            row
        })
        .collect();
    Table { header: head, rows }
}

fn sizes_arg(sizes: &[u64]) -> String {
    sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// Powers of two from `lo` to `hi`.
fn pow2(lo: u64, hi: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = lo;
    while s <= hi {
        v.push(s);
        s *= 2;
    }
    v
}

impl Exp {
    pub fn id(self) -> &'static str {
        match self {
            Exp::Breakdown => "breakdown",
            Exp::Bandwidth => "bandwidth",
            Exp::Completion => "completion",
            Exp::Permissions => "permissions",
            Exp::Async => "async",
            Exp::Iops => "iops",
            Exp::KernelFs => "kernel-fs",
            Exp::Mount => "mount",
            Exp::Apps => "apps",
            Exp::ArrayLatency => "array-latency",
            Exp::ArrayBandwidth => "array-bandwidth",
            Exp::Fairness => "fairness",
            Exp::Power => "power",
            Exp::Wear => "wear",
            Exp::Remote => "remote",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Exp::Breakdown => "Where a request's time goes",
            Exp::Bandwidth => "Bandwidth against request size, with and without a file system",
            Exp::Completion => "Completion strategies",
            Exp::Permissions => "Permission-table pressure and extent merging",
            Exp::Async => "Asynchronous against synchronous requests",
            Exp::Iops => "Operations per second and instructions per operation",
            Exp::KernelFs => {
                "Recycled ext4 and XFS: the same files through channels and the kernel"
            }
            Exp::Mount => "nvfs for every program: the FUSE mount against the channel and tmpfs",
            Exp::Apps => "Applications",
            Exp::ArrayLatency => "The array's latency against its parallelism (modelled array)",
            Exp::ArrayBandwidth => "The array's bandwidth against request size (modelled array)",
            Exp::Fairness => "Small requests beside large ones: scheduling (modelled array)",
            Exp::Power => "Power and efficiency against request size (modelled array)",
            Exp::Wear => "Wear under a hot spot, with and without start-gap (modelled array)",
            Exp::Remote => "Remote access: distributed Moneta against a software block transport",
        }
    }

    /// The steps this experiment runs in `set` on this machine.
    pub fn steps(self, set: &Set, env: &Env) -> Vec<Step> {
        let tiny = set.kind == SetArg::Tiny;
        let full = set.kind == SetArg::Full;
        let od = odirect(env);
        match self {
            Exp::Breakdown => {
                let mut paths = vec!["--path", "moneta", "--path", "kernel-psync"];
                if let Some(p) = od {
                    paths.extend(["--path", p]);
                }
                ["read", "write"]
                    .iter()
                    .map(|op| {
                        let mut a = paths.clone();
                        a.extend([
                            "--breakdown",
                            "--op",
                            op,
                            "--size",
                            "512,4096",
                            "--region",
                            "16M",
                        ]);
                        bench(format!("{op}s, stage by stage"), &a, &[], set)
                    })
                    .collect()
            }
            Exp::Bandwidth => {
                let sizes = if tiny {
                    vec![4096, 256 << 10]
                } else if full {
                    pow2(512, 4 << 20)
                } else {
                    vec![512, 4096, 32 << 10, 256 << 10, 1 << 20, 4 << 20]
                };
                let mut paths = vec![
                    "--path",
                    "moneta",
                    "--path",
                    "moneta-raw",
                    "--path",
                    "kernel-psync",
                ];
                if let Some(p) = od {
                    paths.extend(["--path", p]);
                }
                let s = sizes_arg(&sizes);
                ["read", "write"]
                    .iter()
                    .map(|op| {
                        let mut a = paths.clone();
                        a.extend(["--op", op, "--size", &s]);
                        bench(format!("{op}s by size"), &a, &[], set)
                    })
                    .collect()
            }
            Exp::Completion => {
                let sizes = if tiny {
                    vec![4096, 64 << 10]
                } else if full {
                    pow2(512, 256 << 10)
                } else {
                    vec![512, 4096, 32 << 10, 256 << 10]
                };
                let s = sizes_arg(&sizes);
                ["spin", "forward", "sleep"]
                    .iter()
                    .map(|c| {
                        bench(
                            format!("{c} completion"),
                            &[
                                "--path",
                                "moneta",
                                "--completion",
                                c,
                                "--threads",
                                "2",
                                "--op",
                                "randrw",
                                "--size",
                                &s,
                            ],
                            &[],
                            set,
                        )
                    })
                    .collect()
            }
            Exp::Permissions => {
                // One file of a fixed size, written in a shuffled order in as many extents as
                // the point says (the allocation unit is the size over the extents), random
                // 4 KiB reads over all of it.
                let (extents, table, region): (Vec<u64>, Option<&str>, &str) = if tiny {
                    (vec![1024, 4096], Some("2048"), "16M")
                } else if full {
                    (pow2(1024, 32768), None, "128M")
                } else {
                    (pow2(2048, 32768), None, "128M")
                };
                let mut v = Vec::new();
                for &n in &extents {
                    for merge in [true, false] {
                        let ext = n.to_string();
                        let mut a = vec![
                            "--path",
                            "moneta",
                            "--op",
                            "read",
                            "--size",
                            "4096",
                            "--region",
                            region,
                            "--extents",
                            &ext,
                        ];
                        if let Some(t) = table {
                            a.extend(["--table-entries", t]);
                        }
                        if !merge {
                            a.push("--no-merge");
                        }
                        let label = format!(
                            "{n} extents, {}",
                            if merge { "merging" } else { "no merging" }
                        );
                        v.push(bench(label, &a, &[], set));
                    }
                }
                v
            }
            Exp::Async => {
                let sizes = if tiny {
                    vec![4096, 64 << 10]
                } else if full {
                    pow2(512, 256 << 10)
                } else {
                    vec![512, 4096, 16 << 10, 64 << 10, 256 << 10]
                };
                let threads: &[&str] = if tiny { &["1", "2"] } else { &["1", "8"] };
                let s = sizes_arg(&sizes);
                let mut v = Vec::new();
                for t in threads {
                    for qd in ["1", "8"] {
                        let label = format!(
                            "{t} thread(s), {}",
                            if qd == "1" {
                                "synchronous"
                            } else {
                                "asynchronous (8 in flight)"
                            }
                        );
                        v.push(bench(
                            label,
                            &[
                                "--path",
                                "moneta",
                                "--op",
                                "read",
                                "--threads",
                                t,
                                "--qd",
                                qd,
                                "--size",
                                &s,
                            ],
                            &[],
                            set,
                        ));
                    }
                }
                v
            }
            Exp::Iops => {
                let mut paths = vec![
                    "--path",
                    "moneta",
                    "--path",
                    "moneta-raw",
                    "--path",
                    "kernel-psync",
                    "--path",
                    "kernel-uring",
                ];
                if let Some(p) = od {
                    paths.extend(["--path", p]);
                }
                ["read", "write"]
                    .iter()
                    .map(|op| {
                        let mut a = paths.clone();
                        a.extend(["--op", op, "--size", "512,4096", "--count-instructions"]);
                        bench(format!("{op}s"), &a, &[], set)
                    })
                    .collect()
            }
            Exp::KernelFs => super::kernelfs::steps(set, env),
            Exp::Mount => super::mount::steps(set, env),
            Exp::Apps => vec![Step::Apps],
            Exp::Remote => super::remote::steps(set),
            Exp::ArrayLatency | Exp::ArrayBandwidth | Exp::Fairness | Exp::Power | Exp::Wear => {
                super::array::steps(self.id(), set)
            }
        }
    }

    /// Writes the experiment's data and figures into `dir`; its section of the page.
    pub fn present(
        self,
        steps: &[Step],
        outputs: &[Output],
        set: &Set,
        env: &Env,
        dir: &Path,
    ) -> Result<Section, String> {
        let mut s = Section {
            id: self.id().into(),
            title: self.title().into(),
            ..Section::default()
        };
        if let Some(p) = paper::figure(self.id()) {
            s.paper = Some(format!("{}: {}", p.figure, p.shows));
        }
        for step in steps {
            match step {
                Step::Bench { args, .. } | Step::Remote { args, .. } => s
                    .commands
                    .push(format!("moneta bench {} --json", args.join(" "))),
                Step::Apps => s.commands.push(format!(
                    "moneta report --only apps --set {}",
                    if set.kind == SetArg::Full {
                        "full"
                    } else {
                        "quick"
                    }
                )),
            }
        }
        if self == Exp::Apps {
            let recs = match outputs.first() {
                Some(Output::Apps(Ok(r))) => r.clone(),
                Some(Output::Apps(Err(e))) => {
                    s.reading = "Not run on this machine.".into();
                    s.notes
                        .push(format!("The applications benchmark could not run: {e}."));
                    return Ok(s);
                }
                _ => Vec::new(),
            };
            write_data(dir, self.id(), &apps_values(&recs), &mut s)?;
            apps_section(&recs, dir, &mut s)?;
            return Ok(s);
        }
        if self == Exp::Remote {
            let mut data = Vec::new();
            let mut failed = Vec::new();
            for (step, out) in steps.iter().zip(outputs) {
                match (step, out) {
                    (Step::Remote { label, .. }, Output::Remote(Ok(points))) => {
                        data.extend(points.iter().map(|p| (label.clone(), p)));
                    }
                    (Step::Remote { label, .. }, Output::Remote(Err(e))) => {
                        failed.push(format!("{label}: {e}"));
                    }
                    _ => {}
                }
            }
            write_data(dir, self.id(), &super::remote::values(&data), &mut s)?;
            super::remote::present(&data, &failed, dir, &mut s)?;
            if set.kind == SetArg::Tiny {
                s.notes.push(
                    "Tiny set: a few hundred operations per point, for checking only.".into(),
                );
            }
            return Ok(s);
        }
        if self == Exp::KernelFs && steps.is_empty() {
            super::kernelfs::absent(env, &mut s);
            return Ok(s);
        }
        if self == Exp::Mount && steps.is_empty() {
            super::mount::absent(env, &mut s);
            return Ok(s);
        }
        let data = bench_data(steps, outputs);
        let values: Vec<Value> = data
            .iter()
            .map(|(label, r)| {
                let mut v = serde_json::to_value(r).expect("records serialize");
                if let Value::Object(m) = &mut v {
                    m.shift_insert(0, "step".into(), Value::String(label.clone()));
                }
                v
            })
            .collect();
        write_data(dir, self.id(), &values, &mut s)?;
        match self {
            Exp::Breakdown => breakdown(&data, dir, &mut s)?,
            Exp::Bandwidth => bandwidth(&data, dir, &mut s)?,
            Exp::Completion => completion(&data, dir, &mut s)?,
            Exp::Permissions => permissions(&data, dir, &mut s)?,
            Exp::Async => asynchronous(&data, dir, &mut s)?,
            Exp::Iops => iops(&data, dir, &mut s)?,
            Exp::KernelFs => super::kernelfs::present(&data, env, dir, &mut s)?,
            Exp::Mount => super::mount::present(&data, dir, &mut s)?,
            Exp::Apps | Exp::Remote => unreachable!("handled above"),
            Exp::ArrayLatency | Exp::ArrayBandwidth | Exp::Fairness | Exp::Power | Exp::Wear => {
                super::array::present(self.id(), &data, dir, &mut s)?
            }
        }
        if matches!(self, Exp::Breakdown | Exp::Bandwidth | Exp::Iops) {
            s.notes.extend(odirect_note(env));
        }
        if set.kind == SetArg::Tiny {
            s.notes
                .push("Tiny set: a few hundred operations per point, for checking only.".into());
        }
        Ok(s)
    }
}

/// Each step's records, labelled with the step.
fn bench_data<'a>(steps: &[Step], outputs: &'a [Output]) -> Vec<(String, &'a Record)> {
    let mut v = Vec::new();
    for (step, out) in steps.iter().zip(outputs) {
        if let (Step::Bench { label, .. }, Output::Bench(recs)) = (step, out) {
            v.extend(recs.iter().map(|r| (label.clone(), r)));
        }
    }
    v
}

fn apps_values(recs: &[AppRecord]) -> Vec<Value> {
    recs.iter()
        .map(|r| serde_json::to_value(r).expect("records serialize"))
        .collect()
}

/// `<id>.json` (the records, pretty) and `<id>.csv`, linked from the section.
fn write_data(dir: &Path, id: &str, values: &[Value], s: &mut Section) -> Result<(), String> {
    let json = format!("{id}.json");
    let text = serde_json::to_string_pretty(values).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(&json), text + "\n").map_err(|e| format!("{json}: {e}"))?;
    let csv = format!("{id}.csv");
    std::fs::write(dir.join(&csv), crate::csvout::to_csv(values)?)
        .map_err(|e| format!("{csv}: {e}"))?;
    s.data_files = vec![json, csv];
    Ok(())
}

pub(super) fn draw_chart(c: &Chart, dir: &Path, name: &str, s: &mut Section) -> Result<(), String> {
    plot::render_chart(c, &dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
    s.images.push(name.into());
    Ok(())
}

pub(super) fn draw_bars(
    b: &BarChart,
    dir: &Path,
    name: &str,
    s: &mut Section,
) -> Result<(), String> {
    plot::render_bars(b, &dir.join(name)).map_err(|e| format!("{name}: {e}"))?;
    s.images.push(name.into());
    Ok(())
}

pub(super) fn op_name(op: Op) -> &'static str {
    match op {
        Op::Read => "read",
        Op::Write => "write",
        Op::Randrw => "50/50",
        Op::Seqread => "sequential read",
        Op::Seqwrite => "sequential write",
        Op::Nop => "nop",
    }
}

/// `590 ns`, `1.2 µs`, `38 µs`, `1.5 ms`.
pub(super) fn fmt_ns(ns: f64) -> String {
    if ns < 1000.0 {
        format!("{ns:.0} ns")
    } else if ns < 10_000.0 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1e6 {
        format!("{:.0} µs", ns / 1e3)
    } else {
        format!("{:.1} ms", ns / 1e6)
    }
}

/// `a` against `b` where higher is better: `2.3x faster` or `1.4x slower`.
fn faster(a: f64, b: f64) -> String {
    if !(a > 0.0 && b > 0.0) {
        return "not comparable".into();
    }
    let r = a / b;
    if r >= 1.0 {
        format!("{r:.2}x faster")
    } else {
        format!("{:.2}x slower", 1.0 / r)
    }
}

/// `512 B`, `4 KiB`, `1 MiB`.
pub(super) fn size_name(s: u64) -> String {
    match s {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1024 && s % 1024 == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// Moneta's latency `m` against the kernel's `k`: `Moneta 1.25x faster` or `Moneta 1.03x
/// slower`.
fn latency_vs(m: f64, k: f64) -> String {
    if !(m > 0.0 && k > 0.0) {
        return "not comparable".into();
    }
    if m <= k {
        format!("Moneta {:.2}x faster", k / m)
    } else {
        format!("Moneta {:.2}x slower", m / k)
    }
}

/// A short name of a path for crowded axes.
fn short_path(p: &str) -> &str {
    match p {
        "kernel-psync" => "psync",
        "kernel-odirect-ext4" => "ext4 direct",
        "kernel-odirect-xfs" => "xfs direct",
        p => p,
    }
}

pub(super) fn num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

// ---- breakdown --------------------------------------------------------------------------

fn breakdown(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let recs: Vec<&Record> = data
        .iter()
        .map(|(_, r)| *r)
        .filter(|r| r.breakdown.is_some())
        .collect();
    let mut stages: Vec<&'static str> = Vec::new();
    for r in &recs {
        for c in r.breakdown.as_ref().expect("filtered") {
            if !stages.contains(&c.name) {
                stages.push(c.name);
            }
        }
    }
    let category = |r: &Record| format!("{} {} {}", r.path, op_name(r.op), size_name(r.size));
    let short = |r: &Record| {
        format!(
            "{} {}{}",
            short_path(r.path),
            if r.op == Op::Write { "W" } else { "R" },
            plot::format_bytes(r.size as f64)
        )
    };
    let bars = |which: &[&Record], title: &str| BarChart {
        title: title.into(),
        y_label: "mean time per request (ns)".into(),
        categories: which.iter().map(|r| short(r)).collect(),
        groups: stages
            .iter()
            .map(|st| {
                (
                    st.to_string(),
                    which
                        .iter()
                        .map(|r| {
                            r.breakdown
                                .as_ref()
                                .and_then(|b| b.iter().find(|c| c.name == *st))
                                .map(|c| c.ns)
                                .unwrap_or(f64::NAN)
                        })
                        .collect(),
                )
            })
            .collect(),
        stacked: true,
    };
    let fast: Vec<&Record> = recs
        .iter()
        .copied()
        .filter(|r| !r.path.starts_with("kernel-odirect"))
        .collect();
    draw_bars(
        &bars(
            &fast,
            "Latency breakdown: Moneta and the kernel's page cache",
        ),
        dir,
        "breakdown.png",
        s,
    )?;
    if fast.len() < recs.len() {
        draw_bars(
            &bars(&recs, "Latency breakdown with the kernel's block path"),
            dir,
            "breakdown-block.png",
            s,
        )?;
    }
    let mut header = vec!["configuration".to_string(), "mean latency".to_string()];
    header.extend(stages.iter().map(|s| format!("{s} (ns)")));
    let rows = recs
        .iter()
        .map(|r| {
            let mut row = vec![category(r), fmt_ns(r.lat_ns.mean as f64)];
            for st in &stages {
                row.push(
                    r.breakdown
                        .as_ref()
                        .and_then(|b| b.iter().find(|c| c.name == *st))
                        .map(|c| format!("{:.0}", c.ns))
                        .unwrap_or_default(),
                );
            }
            row
        })
        .collect();
    s.table = Some(Table { header, rows });
    let find = |path: &str, op: Op, size: u64| {
        recs.iter()
            .find(|r| r.path == path && r.op == op && r.size == size)
    };
    let top = |r: &Record| {
        let b = r.breakdown.as_ref()?;
        let total: f64 = b.iter().map(|c| c.ns).sum();
        let c = b.iter().max_by(|a, b| a.ns.total_cmp(&b.ns))?;
        Some((c.name, 100.0 * c.ns / total.max(1.0)))
    };
    if let (Some(m), Some(k)) = (
        find("moneta", Op::Read, 512),
        find("kernel-psync", Op::Read, 512),
    ) {
        let mut line = format!(
            "A 512 B read takes {} through Moneta and {} through the kernel's page cache ({}",
            fmt_ns(m.lat_ns.mean as f64),
            fmt_ns(k.lat_ns.mean as f64),
            latency_vs(m.lat_ns.mean as f64, k.lat_ns.mean as f64),
        );
        if let Some(o) = find("kernel-odirect-ext4", Op::Read, 512) {
            line += &format!(
                "; {} through ext4's block path, {}",
                fmt_ns(o.lat_ns.mean as f64),
                latency_vs(m.lat_ns.mean as f64, o.lat_ns.mean as f64)
            );
        }
        line += ").";
        if let (Some((mn, ms)), Some((kn, ks))) = (top(m), top(k)) {
            line += &format!(
                " Moneta's largest stage is {mn} ({ms:.0}%); the kernel's is {kn} ({ks:.0}%)."
            );
        }
        s.reading = line;
    }
    s.notes.extend([
        "Moneta's stages are counted inside the code: libmoneta times the lookup, submission, \
         copy and wait of each request, and the daemon (run with --trace) its queueing, \
         permission check, data movement and media model; the doorbell and completion hand-off \
         between the client's core and the device's is what remains of the wait. The timing adds \
         a few clock reads per request, so traced latencies run a little above untraced ones."
            .to_string(),
        "The kernel's stages are estimated, not counted: the system call is a null system call \
         timed in the same run, the copy a memcpy of the same size, and the file system (with \
         the page cache or the block layer) is the rest of the mean latency."
            .to_string(),
    ]);
    Ok(())
}

// ---- bandwidth --------------------------------------------------------------------------

/// One line per path: `(x, y)` from the records of `op` that `keep` accepts.
pub(super) fn series_by_path(recs: &[&Record], op: Op, y: impl Fn(&Record) -> f64) -> Vec<Series> {
    let mut paths: Vec<&str> = Vec::new();
    for r in recs.iter().filter(|r| r.op == op) {
        if !paths.contains(&r.path) {
            paths.push(r.path);
        }
    }
    paths
        .iter()
        .map(|p| Series {
            label: p.to_string(),
            points: recs
                .iter()
                .filter(|r| r.op == op && r.path == *p)
                .map(|r| (r.size as f64, y(r)))
                .collect(),
            dashed: p.starts_with("kernel"),
        })
        .collect()
}

pub(super) fn size_chart(title: &str, y_label: &str, y_scale: Scale, series: Vec<Series>) -> Chart {
    Chart {
        title: title.into(),
        x_label: "request size (bytes)".into(),
        y_label: y_label.into(),
        x_scale: Scale::Log2,
        y_scale,
        series,
        y_from_zero: true,
    }
}

fn bandwidth(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let recs: Vec<&Record> = data.iter().map(|(_, r)| *r).collect();
    for (op, name) in [(Op::Read, "read"), (Op::Write, "write")] {
        draw_chart(
            &size_chart(
                &format!("Bandwidth of one thread's {name}s"),
                "MiB/s",
                Scale::Log10,
                series_by_path(&recs, op, |r| r.mib_s),
            ),
            dir,
            &format!("bandwidth-{name}.png"),
            s,
        )?;
    }
    let mut paths: Vec<&str> = Vec::new();
    for r in &recs {
        if !paths.contains(&r.path) {
            paths.push(r.path);
        }
    }
    let mut header = vec!["op".to_string(), "size".to_string()];
    header.extend(paths.iter().map(|p| format!("{p} MiB/s")));
    let mut rows = Vec::new();
    let mut keys: Vec<(Op, u64)> = Vec::new();
    for r in &recs {
        if !keys.contains(&(r.op, r.size)) {
            keys.push((r.op, r.size));
        }
    }
    for (op, size) in &keys {
        let mut row = vec![op_name(*op).to_string(), size_name(*size)];
        for p in &paths {
            row.push(
                recs.iter()
                    .find(|r| r.op == *op && r.size == *size && r.path == *p)
                    .map(|r| num(r.mib_s))
                    .unwrap_or_default(),
            );
        }
        rows.push(row);
    }
    s.table = Some(Table { header, rows });
    let bw = |path: &str, op: Op, size: u64| {
        recs.iter()
            .find(|r| r.path == path && r.op == op && r.size == size)
            .map(|r| r.mib_s)
    };
    let small = keys.iter().map(|k| k.1).min().unwrap_or(0);
    let large = keys.iter().map(|k| k.1).max().unwrap_or(0);
    let mut parts = Vec::new();
    for (op, name) in [(Op::Read, "reads"), (Op::Write, "writes")] {
        if let (Some(m), Some(k), Some(m2), Some(k2)) = (
            bw("moneta", op, small),
            bw("kernel-psync", op, small),
            bw("moneta", op, large),
            bw("kernel-psync", op, large),
        ) {
            let mut p = format!(
                "{name}: {} at {} and {} at {} than kernel-psync",
                faster(m, k),
                size_name(small),
                faster(m2, k2),
                size_name(large)
            );
            if let (Some(o), Some(o2)) = (
                bw("kernel-odirect-ext4", op, small),
                bw("kernel-odirect-ext4", op, large),
            ) {
                p += &format!(
                    ", {} and {} than ext4 with O_DIRECT",
                    faster(m, o),
                    faster(m2, o2)
                );
            }
            parts.push(p);
        }
    }
    s.reading = format!(
        "Moneta through its file system, one thread: {}.",
        parts.join("; ")
    );
    if let (Some(f), Some(r)) = (
        bw("moneta", Op::Write, small),
        bw("moneta-raw", Op::Write, small),
    ) {
        s.reading += &if f >= 0.97 * r {
            format!(
                " Small writes through the file system run as fast as without it ({} against \
                 {} MiB/s for moneta-raw).",
                num(f),
                num(r)
            )
        } else {
            format!(
                " The file system costs Moneta {:.0}% of its small-write bandwidth (moneta \
                 against moneta-raw).",
                100.0 * (1.0 - f / r)
            )
        };
    }
    s.notes.push(
        "One thread, one request at a time. moneta-raw is Moneta without a file system (raw \
         commands on one file's extent); kernel-psync is the kernel's page cache on tmpfs with no \
         device under it, the kernel's best case rather than the papers' baseline."
            .into(),
    );
    Ok(())
}

// ---- completion -------------------------------------------------------------------------

fn by_label<'a>(data: &[(String, &'a Record)]) -> Vec<(String, Vec<&'a Record>)> {
    let mut out: Vec<(String, Vec<&Record>)> = Vec::new();
    for (label, r) in data {
        match out.iter_mut().find(|(l, _)| l == label) {
            Some((_, v)) => v.push(r),
            None => out.push((label.clone(), vec![*r])),
        }
    }
    out
}

fn label_series(groups: &[(String, Vec<&Record>)], y: impl Fn(&Record) -> f64) -> Vec<Series> {
    groups
        .iter()
        .map(|(label, rs)| Series {
            label: label.clone(),
            points: rs.iter().map(|r| (r.size as f64, y(r))).collect(),
            dashed: false,
        })
        .collect()
}

fn best_at<'a>(
    groups: &'a [(String, Vec<&Record>)],
    size: u64,
    y: impl Fn(&Record) -> f64,
) -> Option<(&'a str, f64)> {
    groups
        .iter()
        .filter_map(|(l, rs)| {
            rs.iter()
                .find(|r| r.size == size)
                .map(|r| (l.as_str(), y(r)))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

fn completion(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let groups = by_label(data);
    draw_chart(
        &size_chart(
            "Completion strategies: bandwidth (2 threads, 50/50 mix)",
            "MiB/s",
            Scale::Log10,
            label_series(&groups, |r| r.mib_s),
        ),
        dir,
        "completion-bandwidth.png",
        s,
    )?;
    draw_chart(
        &size_chart(
            "Completion strategies: bandwidth per CPU",
            "MiB/s per busy CPU (client and daemon)",
            Scale::Log10,
            label_series(&groups, |r| r.mib_s_per_cpu),
        ),
        dir,
        "completion-efficiency.png",
        s,
    )?;
    let sizes: Vec<u64> = groups
        .first()
        .map(|(_, rs)| rs.iter().map(|r| r.size).collect())
        .unwrap_or_default();
    let mut header = vec!["size".to_string()];
    for (l, _) in &groups {
        header.push(format!("{l} MiB/s"));
        header.push(format!("{l} MiB/s per CPU"));
    }
    let rows = sizes
        .iter()
        .map(|&z| {
            let mut row = vec![size_name(z)];
            for (_, rs) in &groups {
                let r = rs.iter().find(|r| r.size == z);
                row.push(r.map(|r| num(r.mib_s)).unwrap_or_default());
                row.push(r.map(|r| num(r.mib_s_per_cpu)).unwrap_or_default());
            }
            row
        })
        .collect();
    s.table = Some(Table { header, rows });
    if let (Some(&lo), Some(&hi)) = (sizes.first(), sizes.last()) {
        let b_lo = best_at(&groups, lo, |r| r.mib_s);
        let b_hi = best_at(&groups, hi, |r| r.mib_s);
        let e_hi = best_at(&groups, hi, |r| r.mib_s_per_cpu);
        if let (Some(a), Some(b), Some(c)) = (b_lo, b_hi, e_hi) {
            s.reading = format!(
                "Fastest at {}: {}; at {}: {}. Most bandwidth per CPU at {}: {} ({} MiB/s per CPU).",
                size_name(lo),
                a.0,
                size_name(hi),
                b.0,
                size_name(hi),
                c.0,
                num(c.1)
            );
        }
    }
    s.notes.push(
        "Files through libmoneta, two threads, random 50/50 reads and writes. spin = DMA \
         completion (the client polls its tag's status entry), forward = the device sets a bit \
         the client polls (the papers' OS forwarding, here without an OS), sleep = the client \
         sleeps on a futex the device wakes (issue-sleep). The daemon's polling thread counts \
         in the CPU; on two cores, two spinning clients and the poller compete for them."
            .into(),
    );
    Ok(())
}

// ---- permissions ------------------------------------------------------------------------

fn permissions(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let mut merged = Vec::new();
    let mut unmerged = Vec::new();
    for (label, r) in data {
        let n: f64 = label
            .split_whitespace()
            .next()
            .and_then(|x| x.parse().ok())
            .unwrap_or(0.0);
        if label.ends_with("no merging") {
            unmerged.push((n, *r));
        } else {
            merged.push((n, *r));
        }
    }
    let series = |v: &[(f64, &Record)], label: &str| Series {
        label: label.into(),
        points: v.iter().map(|(n, r)| (*n, r.iops / 1e3)).collect(),
        dashed: false,
    };
    draw_chart(
        &Chart {
            title: "Random 4 KiB reads against the extents of one file".into(),
            x_label: "extents in the file".into(),
            y_label: "thousand operations per second".into(),
            x_scale: Scale::Log2,
            y_scale: Scale::Linear,
            series: vec![series(&merged, "merging"), series(&unmerged, "no merging")],
            y_from_zero: true,
        },
        dir,
        "permissions.png",
        s,
    )?;
    let header = [
        "extents",
        "merging kIOPS",
        "merging hard misses",
        "no merging kIOPS",
        "no merging hard misses",
        "no merging soft misses",
    ]
    .map(String::from)
    .to_vec();
    let rows = merged
        .iter()
        .map(|(n, m)| {
            let u = unmerged.iter().find(|(k, _)| k == n).map(|(_, r)| *r);
            vec![
                format!("{n:.0}"),
                num(m.iops / 1e3),
                m.hard_misses.unwrap_or(0).to_string(),
                u.map(|r| num(r.iops / 1e3)).unwrap_or_default(),
                u.and_then(|r| r.hard_misses)
                    .map(|h| h.to_string())
                    .unwrap_or_default(),
                u.and_then(|r| r.soft_misses)
                    .map(|h| h.to_string())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    s.table = Some(Table { header, rows });
    let lo = |v: &[(f64, &Record)]| v.iter().map(|(_, r)| r.iops).fold(f64::MAX, f64::min);
    let hi = |v: &[(f64, &Record)]| v.iter().map(|(_, r)| r.iops).fold(0.0, f64::max);
    let thrash = unmerged
        .iter()
        .find(|(_, r)| r.hard_misses.unwrap_or(0) > 0)
        .map(|(n, _)| *n);
    s.reading = format!(
        "With merging, throughput stays between {} and {} kIOPS over every size tried; without, \
         it ranges from {} down to {} kIOPS{}.",
        num(lo(&merged) / 1e3),
        num(hi(&merged) / 1e3),
        num(hi(&unmerged) / 1e3),
        num(lo(&unmerged) / 1e3),
        match thrash {
            Some(n) => format!(
                ", the fall beginning once the file's {n:.0} extents no longer fit the table \
                 (hard misses)"
            ),
            None => String::new(),
        }
    );
    s.notes.push(
        "One file of a fixed size on a daemon whose allocation unit is the file's size over \
         the extents, written in a shuffled order: its extents lie next to each other on the \
         array but not in the file, so merged records fold into one while unmerged ones need a \
         record per extent, against a table of 16K records. A hard miss costs more here than in the paper: libmoneta then drops its whole \
         translation map (it cannot tell an eviction from a layout change) and looks the file \
         up again range by range, each lookup installing records that evict others."
            .into(),
    );
    Ok(())
}

// ---- async ------------------------------------------------------------------------------

fn asynchronous(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let groups = by_label(data);
    draw_chart(
        &size_chart(
            "Asynchronous against synchronous reads: bandwidth",
            "MiB/s",
            Scale::Log10,
            label_series(&groups, |r| r.mib_s),
        ),
        dir,
        "async-bandwidth.png",
        s,
    )?;
    draw_chart(
        &size_chart(
            "Asynchronous against synchronous reads: bandwidth per CPU",
            "MiB/s per busy CPU (client and daemon)",
            Scale::Log10,
            label_series(&groups, |r| r.mib_s_per_cpu),
        ),
        dir,
        "async-efficiency.png",
        s,
    )?;
    let sizes: Vec<u64> = groups
        .first()
        .map(|(_, rs)| rs.iter().map(|r| r.size).collect())
        .unwrap_or_default();
    let mut header = vec!["size".to_string()];
    header.extend(groups.iter().map(|(l, _)| format!("{l} MiB/s")));
    let rows = sizes
        .iter()
        .map(|&z| {
            let mut row = vec![size_name(z)];
            for (_, rs) in &groups {
                row.push(
                    rs.iter()
                        .find(|r| r.size == z)
                        .map(|r| num(r.mib_s))
                        .unwrap_or_default(),
                );
            }
            row
        })
        .collect();
    s.table = Some(Table { header, rows });
    // Speedups per thread count: groups come as (sync, async) pairs.
    let mut parts = Vec::new();
    for pair in groups.chunks(2) {
        if let [(ls, sync), (_, asy)] = pair {
            let ratios: Vec<f64> = sync
                .iter()
                .filter_map(|a| {
                    asy.iter()
                        .find(|b| b.size == a.size)
                        .map(|b| b.mib_s / a.mib_s)
                })
                .filter(|r| r.is_finite())
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let lo = ratios.iter().copied().fold(f64::MAX, f64::min);
            let hi = ratios.iter().copied().fold(0.0, f64::max);
            let threads = ls.split(',').next().unwrap_or(ls);
            parts.push(format!("{threads}: {lo:.2}x to {hi:.2}x"));
        }
    }
    s.reading = format!(
        "Asynchronous requests (8 in flight per thread) against synchronous ones, bandwidth \
         ratio over the sizes: {}.",
        parts.join("; ")
    );
    s.notes.push(
        "Files through libmoneta, random reads, spin completion. Above 1 the asynchronous \
         interface wins."
            .into(),
    );
    Ok(())
}

// ---- iops -------------------------------------------------------------------------------

fn iops(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let recs: Vec<&Record> = data.iter().map(|(_, r)| *r).collect();
    let mut paths: Vec<&str> = Vec::new();
    for r in &recs {
        if !paths.contains(&r.path) {
            paths.push(r.path);
        }
    }
    let cols: Vec<(u64, Op)> = vec![
        (512, Op::Read),
        (512, Op::Write),
        (4096, Op::Read),
        (4096, Op::Write),
    ];
    let get = |p: &str, (z, op): (u64, Op)| {
        recs.iter()
            .find(|r| r.path == p && r.size == z && r.op == op)
    };
    draw_bars(
        &BarChart {
            title: "Operations per second, one thread, one request at a time".into(),
            y_label: "thousand operations per second".into(),
            categories: cols
                .iter()
                .map(|(z, op)| format!("{} {}", size_name(*z), op_name(*op)))
                .collect(),
            groups: paths
                .iter()
                .map(|p| {
                    (
                        p.to_string(),
                        cols.iter()
                            .map(|c| get(p, *c).map(|r| r.iops / 1e3).unwrap_or(f64::NAN))
                            .collect(),
                    )
                })
                .collect(),
            stacked: false,
        },
        dir,
        "iops.png",
        s,
    )?;
    let mut header = vec!["path".to_string()];
    for (z, op) in &cols {
        header.push(format!("{} {} kIOPS", size_name(*z), op_name(*op)));
    }
    header.push("instructions per 4 KiB read".into());
    header.push("instructions per 4 KiB write".into());
    let rows = paths
        .iter()
        .map(|p| {
            let mut row = vec![p.to_string()];
            for c in &cols {
                row.push(get(p, *c).map(|r| num(r.iops / 1e3)).unwrap_or_default());
            }
            for op in [Op::Read, Op::Write] {
                row.push(
                    get(p, (4096, op))
                        .and_then(|r| r.instructions_per_op)
                        .map(|i| format!("{i:.0}"))
                        .unwrap_or_else(|| "n/a".into()),
                );
            }
            row
        })
        .collect();
    s.table = Some(Table { header, rows });
    let mut parts = Vec::new();
    for c in &cols {
        if let (Some(m), Some(k)) = (get("moneta", *c), get("kernel-psync", *c)) {
            parts.push(format!(
                "{} {} {} ({} against {} kIOPS)",
                size_name(c.0),
                op_name(c.1),
                faster(m.iops, k.iops),
                num(m.iops / 1e3),
                num(k.iops / 1e3)
            ));
        }
    }
    s.reading = format!("Moneta against kernel-psync: {}.", parts.join("; "));
    let counted = recs.iter().find_map(|r| r.instructions_per_op.map(|_| r));
    match counted {
        Some(r) => s.notes.push(format!(
            "Instructions are those the bench threads retired ({}), from the processor's \
             counters; the Moneta daemon's polling thread, which stands for the device, is not \
             counted.",
            r.instructions_note.as_deref().unwrap_or("")
        )),
        None => s.notes.push(format!(
            "Instructions per operation could not be counted here: {}. scripts/count-instructions.sh \
             counts libmoneta's with callgrind instead (see docs/performance.md).",
            recs.iter()
                .find_map(|r| r.instructions_note.clone())
                .unwrap_or_else(|| "no counter".into())
        )),
    }
    s.notes.push(
        "One thread at queue depth 1: operations per second are the inverse of latency. The \
         paper's table reports the device's peak with many requests in flight."
            .into(),
    );
    if paths.contains(&"kernel-uring") {
        s.notes.push(
            "kernel-uring is slow here because io_uring hands each tmpfs request to a kernel \
             worker thread (an iou-wrk thread runs during the measurement): at queue depth 1 \
             every request waits for that thread to wake. It is the kernel's behaviour on this \
             file system, not a setting of the bench (fixed file, registered buffers, single \
             issuer, deferred task work)."
                .into(),
        );
    }
    Ok(())
}

// ---- apps -------------------------------------------------------------------------------

fn apps_section(recs: &[AppRecord], dir: &Path, s: &mut Section) -> Result<(), String> {
    let mut targets: Vec<&str> = Vec::new();
    let mut workloads: Vec<&str> = Vec::new();
    for r in recs {
        if !targets.contains(&r.target.as_str()) {
            targets.push(&r.target);
        }
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let speed = crate::apps::speedups(recs);
    let others: Vec<&str> = targets
        .iter()
        .copied()
        .filter(|t| *t != crate::apps::TARGET_MONETA)
        .collect();
    let sp = |w: &str, t: &str| speed.iter().find(|(a, b, _)| a == w && b == t).map(|x| x.2);
    draw_bars(
        &BarChart {
            title: "Moneta's speedup over the kernel, per application".into(),
            y_label: "Moneta ops/s over the kernel's".into(),
            categories: workloads.iter().map(|w| w.to_string()).collect(),
            groups: others
                .iter()
                .map(|t| {
                    (
                        format!("over {t}"),
                        workloads
                            .iter()
                            .map(|w| sp(w, t).unwrap_or(f64::NAN))
                            .collect(),
                    )
                })
                .collect(),
            stacked: false,
        },
        dir,
        "apps.png",
        s,
    )?;
    let mut header = vec!["workload".to_string()];
    header.extend(targets.iter().map(|t| format!("{t} ops/s")));
    header.extend(others.iter().map(|t| format!("speedup over {t}")));
    let rows = workloads
        .iter()
        .map(|w| {
            let mut row = vec![w.to_string()];
            for t in &targets {
                row.push(
                    recs.iter()
                        .find(|r| r.workload == *w && r.target == *t)
                        .map(|r| match r.skipped() {
                            Some(_) => "skipped".to_string(),
                            None => num(r.ops_per_s),
                        })
                        .unwrap_or_default(),
                );
            }
            for t in &others {
                row.push(sp(w, t).map(|x| format!("{x:.2}x")).unwrap_or_default());
            }
            row
        })
        .collect();
    s.table = Some(Table { header, rows });
    let block = others
        .iter()
        .copied()
        .find(|t| t.contains("ext4"))
        .filter(|t| speed.iter().any(|x| x.1 == *t));
    let base = block.unwrap_or(crate::apps::TARGET_TMPFS);
    let mut parts = Vec::new();
    for w in &workloads {
        if let Some(x) = sp(w, base) {
            parts.push(format!("{w} {x:.2}x"));
        }
    }
    s.reading = format!("Moneta over {base}: {}.", parts.join(", "));
    for t in &targets {
        if let Some(why) = recs
            .iter()
            .find(|r| r.target == *t)
            .and_then(|r| r.skipped())
        {
            s.notes.push(format!("{t} was skipped: {why}."));
        }
    }
    s.notes.push(
        "Unmodified programs: a BerkeleyDB program (examples/apps/bdb_bench.c), the sqlite3 \
         shell and fio, run under `moneta run` on Moneta and directly on the kernel's targets. \
         BerkeleyDB and SQLite cannot use O_DIRECT with Debian's builds, so on the loop-device \
         targets they go through the page cache and each commit's flush reaches the block layer; \
         fio uses O_DIRECT there. SQLite's journal is a file created and deleted per transaction, \
         and every create and unlink on nvfs is a round trip to the daemon: that is where Moneta \
         loses on SQLite. The daemon's polling thread (the device) has a CPU of its own \
         (`monetad --poller-cpu auto`, on a machine of two or more) and the programs' threads \
         run on the others, so on two CPUs the two fio jobs share one CPU on Moneta and have two \
         on the kernel. With the poller's CPU shared as well (`--poller-cpu none`), every \
         request waits for the scheduler to give the poller a turn: docs/performance.md has \
         those figures. fio runs in rounds (three in the full set), each running every fio \
         workload on every target in turn, and each figure is the target's median round: on a \
         shared virtual machine the host's speed can change by half within a minute."
            .into(),
    );
    Ok(())
}
