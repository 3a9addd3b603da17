//! The mount experiment (`mount`): nvfs through `moneta mount` (FUSE, the path of every program
//! the shim does not reach) against the same daemon's channel path through libmoneta and
//! against `pread`/`pwrite` on tmpfs, one thread, one request at a time.

use std::path::Path;

use super::experiments::{
    draw_chart, fmt_ns, num, op_name, reads_and_writes_by_size, series_by_path, size_chart,
    size_name, size_table,
};
use super::html::Section;
use super::plot::Scale;
use super::{Env, Set, SetArg, Step};
use crate::bench::{Op, Record};

const PATHS: [&str; 3] = ["fuse", "moneta", "kernel-psync"];

fn sizes(set: &Set) -> &'static [u64] {
    match set.kind {
        SetArg::Tiny => &[4096],
        SetArg::Quick => &[512, 4096, 65536],
        SetArg::Full => &[512, 4096, 16384, 65536, 262144, 1 << 20],
    }
}

/// Whether this machine can mount through FUSE, or why not.
pub(super) fn available() -> Result<(), String> {
    if !Path::new("/dev/fuse").exists() {
        return Err("there is no /dev/fuse".into());
    }
    if !rustix::process::geteuid().is_root() {
        let found = std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("fusermount3").exists()));
        if !found {
            return Err("fusermount3 is not installed (and this is not root)".into());
        }
    }
    Ok(())
}

/// One bench step per operation, the three paths alternating run by run; none without FUSE.
pub(super) fn steps(set: &Set, env: &Env) -> Vec<Step> {
    if env.fuse.is_err() {
        return Vec::new();
    }
    let paths: Vec<String> = PATHS.iter().map(|p| p.to_string()).collect();
    reads_and_writes_by_size(&paths, sizes(set), set)
}

/// The section when the experiment could not run here.
pub(super) fn absent(env: &Env, s: &mut Section) {
    s.reading = "Not run on this machine: it needs FUSE.".into();
    if let Err(e) = &env.fuse {
        s.notes.push(format!("The mount was left out: {e}."));
    }
}

pub(super) fn present(
    data: &[(String, &Record)],
    dir: &Path,
    s: &mut Section,
) -> Result<(), String> {
    let recs: Vec<&Record> = data.iter().map(|(_, r)| *r).collect();
    let find = |p: &str, op: Op, size: u64| {
        recs.iter()
            .find(|r| r.path == p && r.op == op && r.size == size)
            .copied()
    };
    for (op, name) in [(Op::Read, "read"), (Op::Write, "write")] {
        draw_chart(
            &size_chart(
                &format!(
                    "nvfs through the mount, the channel and tmpfs: median latency of {name}s"
                ),
                "p50 latency (ns)",
                Scale::Log10,
                series_by_path(&recs, op, |r| r.lat_ns.p50 as f64),
            ),
            dir,
            &format!("mount-latency-{name}.png"),
            s,
        )?;
    }
    s.table = Some(size_table(
        &recs,
        &PATHS,
        |p| format!("{p} p50 (MiB/s)"),
        |r| format!("{} ({})", fmt_ns(r.lat_ns.p50 as f64), num(r.mib_s)),
    ));
    let mut keys: Vec<(Op, u64)> = Vec::new();
    for r in &recs {
        if !keys.contains(&(r.op, r.size)) {
            keys.push((r.op, r.size));
        }
    }
    let mut parts = Vec::new();
    for &(op, size) in &keys {
        if let (Some(f), Some(m), Some(k)) = (
            find("fuse", op, size),
            find("moneta", op, size),
            find("kernel-psync", op, size),
        ) {
            let (f, m, k) = (
                f.lat_ns.p50 as f64,
                m.lat_ns.p50 as f64,
                k.lat_ns.p50 as f64,
            );
            if m > 0.0 && k > 0.0 {
                let (d, side) = if f >= m {
                    (f - m, "over")
                } else {
                    (m - f, "under")
                };
                parts.push(format!(
                    "{} {} through the mount: {} {side} the channel path's median ({:.1}x it), \
                     {:.1}x tmpfs's",
                    size_name(size),
                    op_name(op),
                    fmt_ns(d),
                    f / m,
                    f / k
                ));
            }
        }
    }
    if !parts.is_empty() {
        s.reading = format!(
            "What reaching every program costs: {}. The mount is a system call, a round trip \
             through /dev/fuse to a server thread and the server's own request through its \
             channel.",
            parts.join("; ")
        );
    }
    s.notes.push(
        "fuse = pread/pwrite on files of the bench's private daemon through `moneta mount` \
         (FUSE, direct I/O: every call reaches the daemon's channel, coherent with channel \
         clients); moneta = the same daemon's files through libmoneta's channel path; \
         kernel-psync = pread/pwrite on tmpfs. docs/mount.md says what the mount serves."
            .into(),
    );
    Ok(())
}
