//! `moneta bench --path nvfs`: the permission manager's costs against the kernel on tmpfs.
//!
//! - `soft-miss`: the first access to an extent of an open file: the lookup that maps it and
//!   installs its record in the channel, as libmoneta makes it (`OP_LOOKUP` through the
//!   channel, answered by the device's poller, or `FS_LOOKUP` on the control socket when the
//!   poller refers it there; the refusals are counted in `referred`);
//!   `soft-miss+read` adds the first 512-byte read through the channel.
//! - `soft-miss-socket`: the same first lookup as `FS_LOOKUP` on the control socket alone.
//! - `lookup-again`: the channel lookup when the record is already there.
//! - `fstat`: attributes of an open file (a handle); the kernel does `fstat(2)` on tmpfs.
//! - `stat`: attributes by path, two directories deep; the kernel does `stat(2)`.
//! - `create-write-close`: 10,000 small files: create, 4 KiB written, closed; the kernel does
//!   `open(O_CREAT)`, `write`, `close` on tmpfs.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use libmoneta::{Channel, Control};
use moneta_abi::fsproto::{FsRequest, Target, HOLE};
use moneta_abi::Completion;
use serde::Serialize;

/// One measured operation.
#[derive(Serialize, Clone, Debug)]
pub struct FsRecord {
    /// `nvfs` or `kernel-tmpfs`.
    pub path: &'static str,
    /// What was measured.
    pub op: &'static str,
    /// Operations timed.
    pub ops: u64,
    /// Median nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// Mean.
    pub mean_ns: u64,
    /// Seconds for all of them.
    pub seconds: f64,
    /// Channel lookups the device referred to the control socket (soft misses only).
    pub referred: u64,
}

fn record(path: &'static str, op: &'static str, mut ns: Vec<u64>, seconds: f64) -> FsRecord {
    ns.sort_unstable();
    let n = ns.len().max(1);
    FsRecord {
        path,
        op,
        ops: ns.len() as u64,
        p50_ns: ns.get(n / 2).copied().unwrap_or(0),
        p99_ns: ns.get(n * 99 / 100).copied().unwrap_or(0),
        mean_ns: ns.iter().sum::<u64>() / n as u64,
        seconds,
        referred: 0,
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed().as_nanos() as u64)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Runs the measurements against a private daemon serving a fresh volatile nvfs.
pub fn run(files: usize, json: bool) -> Result<Vec<FsRecord>, String> {
    let dir = std::env::temp_dir().join(format!("moneta-fsbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(err)?;
    let socket = dir.join("monetad.sock");
    // An inode per 16 KiB of array: room for every small file (the volatile array is
    // sparse). No reserves, so the two files grown in turn below interleave.
    let size = ((files as u64) << 16).max(1 << 30);
    crate::daemon::start(
        &socket,
        &[
            "--volatile".into(),
            "--size".into(),
            size.to_string(),
            "--append-reserve".into(),
            "0".into(),
        ],
        &dir.join("monetad.log"),
    )?;
    let r = measure(&socket, files);
    let _ = crate::daemon::stop(&socket);
    let _ = std::fs::remove_dir_all(&dir);
    let recs = r?;
    if json {
        for r in &recs {
            println!("{}", serde_json::to_string(r).expect("serialize"));
        }
    } else {
        print_table(&recs);
    }
    Ok(recs)
}

fn measure(socket: &std::path::Path, files: usize) -> Result<Vec<FsRecord>, String> {
    let mut out = Vec::new();
    let ch = Channel::open(socket).map_err(err)?;
    let c = ch.control();
    let cs = match c.fs(FsRequest::Statfs).map_err(err)? {
        moneta_abi::fsproto::FsReply::StatFs(s) => s.chunk_size,
        _ => return Err("bad statfs reply".into()),
    };
    // A file of single-chunk extents: two files grown in turn never sit side by side.
    let extents = 256u64;
    let (a, _, _) = c
        .fs_open(b"/fragmented", libc::O_CREAT | libc::O_RDWR, 0o644)
        .map_err(err)?;
    let (b, _, _) = c
        .fs_open(b"/spacer", libc::O_CREAT | libc::O_RDWR, 0o644)
        .map_err(err)?;
    for i in 0..extents {
        c.fs_extend(a, i * cs, cs).map_err(err)?;
        c.fs_extend(b, i * cs, cs).map_err(err)?;
    }
    c.fs_close(a).map_err(err)?;
    c.fs_close(b).map_err(err)?;
    // Soft misses on a fresh connection and channel, the way libmoneta takes them: through
    // the channel, falling back to the socket when referred.
    let rch = Channel::open(socket).map_err(err)?;
    let rc = rch.control();
    let (h, _, _) = rc.fs_open(b"/fragmented", libc::O_RDONLY, 0).map_err(err)?;
    let lookup = |at: u64, referred: &mut u64| -> Result<u64, String> {
        let m = match rch.lookup(h, at, 1).map_err(err)? {
            Some(m) => m,
            None => {
                *referred += 1;
                rc.fs_lookup_mapped(h, at, 1).map_err(err)?
            }
        };
        let x = m.extents.first().ok_or("no extent")?;
        if x.dev == HOLE {
            return Err("the file should have no holes".into());
        }
        Ok(x.dev)
    };
    let mut miss = Vec::new();
    let mut first_read = Vec::new();
    let mut referred = 0;
    let mut buf = [0u8; 512];
    for i in 0..extents {
        let (r, ns) = timed(|| lookup(i * cs, &mut referred));
        let dev = r?;
        miss.push(ns);
        let (r, ns2) = timed(|| rch.read(dev, &mut buf, Completion::Dma));
        r.map_err(err)?;
        first_read.push(ns + ns2);
    }
    let mut again = Vec::new();
    let mut referred_again = 0;
    for i in 0..extents * 4 {
        let (r, ns) = timed(|| lookup((i % extents) * cs, &mut referred_again));
        r?;
        again.push(ns);
    }
    // The same first lookups on the control socket alone, on another fresh channel.
    let sch = Channel::open(socket).map_err(err)?;
    let sc = sch.control();
    let (sh, _, _) = sc.fs_open(b"/fragmented", libc::O_RDONLY, 0).map_err(err)?;
    let mut socket_miss = Vec::new();
    for i in 0..extents {
        let (r, ns) = timed(|| sc.fs_lookup(sh, i * cs, 1));
        r.map_err(err)?;
        socket_miss.push(ns);
    }
    let with_refs = |mut r: FsRecord, n: u64| {
        r.referred = n;
        r
    };
    out.push(with_refs(record("nvfs", "soft-miss", miss, 0.0), referred));
    out.push(with_refs(
        record("nvfs", "soft-miss+read", first_read, 0.0),
        referred,
    ));
    out.push(record("nvfs", "soft-miss-socket", socket_miss, 0.0));
    out.push(with_refs(
        record("nvfs", "lookup-again", again, 0.0),
        referred_again,
    ));
    // fstat and stat.
    c.fs(FsRequest::Mkdir {
        mode: 0o755,
        path: b"/d1".to_vec(),
    })
    .map_err(err)?;
    c.fs(FsRequest::Mkdir {
        mode: 0o755,
        path: b"/d1/d2".to_vec(),
    })
    .map_err(err)?;
    let (sh, _, _) = c
        .fs_open(b"/d1/d2/f", libc::O_CREAT | libc::O_RDWR, 0o644)
        .map_err(err)?;
    let n = 20_000;
    let mut fst = Vec::with_capacity(n);
    let mut st = Vec::with_capacity(n);
    for _ in 0..n {
        let (r, ns) = timed(|| {
            c.fs(FsRequest::Stat {
                target: Target::Handle(sh),
            })
        });
        r.map_err(err)?;
        fst.push(ns);
        let (r, ns) = timed(|| c.fs_stat(b"/d1/d2/f", true));
        r.map_err(err)?;
        st.push(ns);
    }
    out.push(record("nvfs", "fstat", fst, 0.0));
    out.push(record("nvfs", "stat", st, 0.0));
    let kdir = kernel_dir()?;
    std::fs::create_dir_all(kdir.join("d1/d2")).map_err(err)?;
    let kf = std::fs::File::create(kdir.join("d1/d2/f")).map_err(err)?;
    let (mut kfst, mut kst) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let kpath = kdir.join("d1/d2/f");
    for _ in 0..n {
        let (r, ns) = timed(|| rustix::fs::fstat(&kf));
        r.map_err(err)?;
        kfst.push(ns);
        let (r, ns) = timed(|| rustix::fs::stat(&kpath));
        r.map_err(err)?;
        kst.push(ns);
    }
    out.push(record("kernel-tmpfs", "fstat", kfst, 0.0));
    out.push(record("kernel-tmpfs", "stat", kst, 0.0));
    // Small files.
    c.fs(FsRequest::Mkdir {
        mode: 0o755,
        path: b"/small".to_vec(),
    })
    .map_err(err)?;
    let data = vec![0x42u8; 4096];
    let mut each = Vec::with_capacity(files);
    let t = Instant::now();
    for i in 0..files {
        let name = format!("/small/f{i}");
        let (r, ns) = timed(|| small_file(&ch, c, name.as_bytes(), &data));
        r?;
        each.push(ns);
    }
    out.push(record(
        "nvfs",
        "create-write-close",
        each,
        t.elapsed().as_secs_f64(),
    ));
    std::fs::create_dir_all(kdir.join("small")).map_err(err)?;
    let mut keach = Vec::with_capacity(files);
    let t = Instant::now();
    for i in 0..files {
        let p = kdir.join(format!("small/f{i}"));
        let (r, ns) = timed(|| -> std::io::Result<()> {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&p)?;
            f.write_all_at(&data, 0)
        });
        r.map_err(err)?;
        keach.push(ns);
    }
    out.push(record(
        "kernel-tmpfs",
        "create-write-close",
        keach,
        t.elapsed().as_secs_f64(),
    ));
    let _ = std::fs::remove_dir_all(&kdir);
    Ok(out)
}

fn small_file(ch: &Channel, c: &Control, name: &[u8], data: &[u8]) -> Result<(), String> {
    let (h, _, _) = c
        .fs_open(name, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644)
        .map_err(err)?;
    let (_, ext) = c.fs_extend(h, 0, data.len() as u64).map_err(err)?;
    let x = ext.first().ok_or("no extent")?;
    ch.write(x.dev, data, Completion::Dma).map_err(err)?;
    c.fs_close(h).map_err(err)
}

fn kernel_dir() -> Result<PathBuf, String> {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    Ok(base.join(format!("moneta-fsbench-kernel-{}", std::process::id())))
}

fn print_table(recs: &[FsRecord]) {
    let mut t = comfy_table::Table::new();
    t.set_header(["path", "op", "ops", "p50", "p99", "mean", "vs kernel (p50)"]);
    let us = |ns: u64| format!("{:.2} µs", ns as f64 / 1000.0);
    for r in recs {
        let k = recs
            .iter()
            .find(|k| k.path == "kernel-tmpfs" && k.op == r.op && r.path != "kernel-tmpfs");
        let ratio = k
            .map(|k| format!("{:.1}x", r.p50_ns as f64 / k.p50_ns.max(1) as f64))
            .unwrap_or_default();
        t.add_row([
            r.path.to_string(),
            r.op.to_string(),
            r.ops.to_string(),
            us(r.p50_ns),
            us(r.p99_ns),
            us(r.mean_ns),
            ratio,
        ]);
    }
    println!("{t}");
    for r in recs.iter().filter(|r| r.referred > 0) {
        println!(
            "{} {}: {} of {} channel lookups referred to the control socket",
            r.path, r.op, r.referred, r.ops
        );
    }
    for r in recs.iter().filter(|r| r.op == "create-write-close") {
        println!(
            "{}: {} small files in {:.3} s ({:.0} files/s)",
            r.path,
            r.ops,
            r.seconds,
            r.ops as f64 / r.seconds.max(1e-9)
        );
    }
}
