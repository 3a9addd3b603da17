//! The recycled file systems experiment (`kernel-fs`, Moneta-D §5 and Figure 7): ext4 and XFS
//! made on the array by `monetad --kernel-fs`, the same files read and written through
//! channels (`moneta-kfs-*`) and through the kernel's mount (`kernel-kfs-*-odirect`,
//! `kernel-kfs-*-buffered`), one thread, one request at a time, 512 B to 4 MiB.

use std::path::Path;

use super::experiments::{
    draw_chart, fmt_ns, num, reads_and_writes_by_size, series_by_path, size_chart, size_name,
    size_table,
};
use super::html::Section;
use super::plot::Scale;
use super::{Env, Set, SetArg, Step};
use crate::bench::{Op, Record};

/// The file systems this machine can recycle, with the reason for each it cannot.
fn kinds(env: &Env) -> (Vec<&'static str>, Vec<String>) {
    let mut ok = Vec::new();
    let mut why = Vec::new();
    for (name, r) in [("ext4", &env.ext4), ("xfs", &env.xfs)] {
        match r {
            Ok(()) => ok.push(name),
            Err(e) => why.push(format!(
                "the {name} paths (monetad --kernel-fs {name}) were left out: {e}"
            )),
        }
    }
    (ok, why)
}

fn sizes(set: &Set) -> Vec<u64> {
    match set.kind {
        SetArg::Tiny => vec![512, 64 << 10],
        SetArg::Quick => vec![512, 4096, 64 << 10, 1 << 20, 4 << 20],
        SetArg::Full => vec![
            512,
            1 << 10,
            4 << 10,
            16 << 10,
            64 << 10,
            256 << 10,
            1 << 20,
            4 << 20,
        ],
    }
}

/// One bench step per operation, every path of both file systems in it, alternating run by
/// run; none where neither file system can be made here.
pub(super) fn steps(set: &Set, env: &Env) -> Vec<Step> {
    let (ok, _) = kinds(env);
    if ok.is_empty() {
        return Vec::new();
    }
    let paths: Vec<String> = ok
        .iter()
        .flat_map(|k| {
            [
                format!("moneta-kfs-{k}"),
                format!("kernel-kfs-{k}-odirect"),
                format!("kernel-kfs-{k}-buffered"),
            ]
        })
        .collect();
    reads_and_writes_by_size(&paths, &sizes(set), set)
}

/// The section when the experiment could not run here at all.
pub(super) fn absent(env: &Env, s: &mut Section) {
    let (_, why) = kinds(env);
    s.reading = "Not run on this machine: it needs root (a loop device and a mount).".into();
    s.notes.extend(why.into_iter().map(|w| format!("{w}.")));
}

pub(super) fn present(
    data: &[(String, &Record)],
    env: &Env,
    dir: &Path,
    s: &mut Section,
) -> Result<(), String> {
    let recs: Vec<&Record> = data.iter().map(|(_, r)| *r).collect();
    let mut paths: Vec<&str> = Vec::new();
    for r in &recs {
        if !paths.contains(&r.path) {
            paths.push(r.path);
        }
    }
    for (op, name) in [(Op::Read, "read"), (Op::Write, "write")] {
        draw_chart(
            &size_chart(
                &format!("ext4 and XFS on the array: bandwidth of one thread's {name}s"),
                "MiB/s",
                Scale::Log10,
                series_by_path(&recs, op, |r| r.mib_s),
            ),
            dir,
            &format!("kernel-fs-{name}.png"),
            s,
        )?;
        draw_chart(
            &size_chart(
                &format!("ext4 and XFS on the array: median latency of {name}s"),
                "p50 latency (ns)",
                Scale::Log10,
                series_by_path(&recs, op, |r| r.lat_ns.p50 as f64),
            ),
            dir,
            &format!("kernel-fs-latency-{name}.png"),
            s,
        )?;
    }
    s.table = Some(size_table(
        &recs,
        &paths,
        |p| format!("{p} MiB/s (p50)"),
        |r| format!("{} ({})", num(r.mib_s), fmt_ns(r.lat_ns.p50 as f64)),
    ));
    let find = |p: &str, op: Op, size: u64| {
        recs.iter()
            .find(|r| r.path == p && r.op == op && r.size == size)
            .copied()
    };
    let small = recs.iter().map(|r| r.size).min().unwrap_or(0);
    let large = recs.iter().map(|r| r.size).max().unwrap_or(0);
    let mut parts = Vec::new();
    for fs in ["ext4", "xfs"] {
        for (op, name) in [(Op::Read, "reads"), (Op::Write, "writes")] {
            let ch = format!("moneta-kfs-{fs}");
            let ratio = |kernel: &str, size: u64| {
                let (Some(m), Some(k)) = (find(&ch, op, size), find(kernel, op, size)) else {
                    return None;
                };
                (m.mib_s > 0.0 && k.mib_s > 0.0).then(|| m.mib_s / k.mib_s)
            };
            let od = format!("kernel-kfs-{fs}-odirect");
            let bu = format!("kernel-kfs-{fs}-buffered");
            if let (Some(a), Some(b), Some(c), Some(d)) = (
                ratio(&od, small),
                ratio(&od, large),
                ratio(&bu, small),
                ratio(&bu, large),
            ) {
                parts.push(format!(
                    "{} {name}: {:.2}x O_DIRECT's bandwidth at {} and {:.2}x at {}, {:.2}x and \
                     {:.2}x the page cache's",
                    if fs == "xfs" { "XFS" } else { "ext4" },
                    a,
                    size_name(small),
                    b,
                    size_name(large),
                    c,
                    d
                ));
            }
        }
    }
    if !parts.is_empty() {
        s.reading = format!(
            "The same files through a channel against the kernel: {}.",
            parts.join("; ")
        );
    }
    let (_, why) = kinds(env);
    s.notes.extend(why.into_iter().map(|w| format!("{w}.")));
    s.notes.push(
        "The bench starts a private `monetad --kernel-fs ext4` and another with `xfs`, each on \
         a volatile array, writes the files through the kernel's mount and stops the daemons at \
         the end (which unmounts). moneta-kfs = the files through libmoneta's KernelFile: the \
         kernel checks the open, the daemon installs the file's extents in the channel, and \
         each read or write is channel commands, no system call; kernel-kfs-*-odirect = \
         pread/pwrite with O_DIRECT on the same files through the mount (the loop device over \
         the array), as the paper's baseline; kernel-kfs-*-buffered = the same through the page \
         cache."
            .into(),
    );
    s.notes.push(
        "A kernel open of a file takes it from the channels (the daemon's lease breaks, its \
         records are revoked and its pages dropped from the page cache when the channels take \
         it back), so each kernel run opens the files at its start and closes them at its end, \
         and the channel path takes the files back before its clock starts. The buffered path's \
         page cache therefore starts empty in every run: its small random reads miss until the \
         run has touched the region."
            .into(),
    );
    s.notes.push(
        "A KernelFile request above one DMA slice (16 KiB) goes as slice-sized commands, up to \
         16 in flight on the channel's tags, as libmoneta's File sends large requests."
            .into(),
    );
    Ok(())
}
