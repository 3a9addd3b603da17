//! `moneta bench --path nvfs`: the permission manager's costs against the kernel on tmpfs.
//!
//! - `soft-miss`: the first access to an extent of an open file: the lookup that maps it and
//!   installs its record in the channel, as libmoneta makes it (`OP_LOOKUP` through the
//!   channel, answered by the device's poller, or `FS_LOOKUP` on the control socket when the
//!   poller refers it there; the refusals are counted in `referred`);
//!   `soft-miss+read` adds the first 512-byte read through the channel.
//! - `soft-miss-socket`: the same first lookup as `FS_LOOKUP` on the control socket alone.
//! - `lookup-again`: the channel lookup when the record is already there.
//! - The calls, each asked of the device through the channel (`nvfs`: `OP_FS`) and on the
//!   control socket alone (`nvfs-socket`), against the kernel's on tmpfs: `fstat` (of
//!   a handle), `stat` (by path, two directories deep), `create` (open with `O_CREAT |
//!   O_EXCL`, then close), `rename`, `unlink`, `lock-unlock` (a POSIX write lock on the whole
//!   file, set and removed), `write-fsync` (fsync after a 4 KiB write through the channel).
//! - `nvfs-kept`: `fstat` and `stat` as libmoneta makes them when nothing changed since it
//!   last asked: answered from what it kept (docs/abi.md §3.7).
//! - `nvfs-leased`: `lock-unlock` as libmoneta makes it on a file the process alone has
//!   open: answered in the channel's lock lease (docs/abi.md §3.8); `referred` counts the
//!   calls that asked the daemon all the same.
//! - `nvfs-file`: `write-fsync` as libmoneta makes it (`File::sync_all` after a 4 KiB write):
//!   at the `device` durability level, answered in the library once the write, posted, has
//!   completed; `write-and-fsync`, the write and the `fsync` timed together (against the
//!   kernel's); `create` as libmoneta makes it (`OpenOptions::create_new`, then the file
//!   dropped: its close posted).
//! - `create-write-close`: 10,000 small files: create, 4 KiB written, closed, both ways; the
//!   kernel does `open(O_CREAT)`, `write`, `close` on tmpfs.

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Instant;

use libmoneta::Channel;
use moneta_abi::fsproto::{FsReply, FsRequest, LockCmd, LockKind, LockType, Target, HOLE};
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
    /// Channel lookups the device referred to the control socket (soft misses); for
    /// `nvfs-leased`, the lock calls that asked the daemon.
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
    // The calls, through the channel (as libmoneta makes them) and on the socket alone.
    let n = (files / 2).clamp(100, 5_000);
    // Every call asked of the device (`Channel::ask`): what the device costs.
    let fast = |r: FsRequest| ch.ask(r);
    let slow = |r: FsRequest| c.fs(r);
    out.extend(calls("nvfs", "c", &fast, &ch, n)?);
    out.extend(calls("nvfs-socket", "s", &slow, &ch, n)?);
    // What the device answered and what it sent to the socket (the O_EXCL creates, renames
    // and unlinks, whose frees wait for the releaser, and so on).
    let st = c.status().map_err(err)?;
    out.push(FsRecord {
        referred: st.fs_calls_referred,
        ..record("nvfs", "channel-calls", Vec::new(), 0.0)
    });
    out.last_mut().expect("pushed").ops = st.fs_calls;
    out.extend(kept_stats(&ch, n)?);
    out.push(leased_locks(socket, n)?);
    out.extend(file_fsync(socket, n)?);
    out.push(file_creates(socket, n)?);
    let kdir = kernel_dir()?;
    std::fs::create_dir_all(kdir.join("d1/d2")).map_err(err)?;
    out.extend(kernel_calls(&kdir, n).map_err(err)?);
    // Small files.
    for (label, call) in [("nvfs", &fast as &Call), ("nvfs-socket", &slow as &Call)] {
        let dir = format!("/small-{label}");
        c.fs(FsRequest::Mkdir {
            mode: 0o755,
            path: dir.clone().into_bytes(),
        })
        .map_err(err)?;
        let data = vec![0x42u8; 4096];
        let mut each = Vec::with_capacity(files);
        let t = Instant::now();
        for i in 0..files {
            let name = format!("{dir}/f{i}");
            let (r, ns) = timed(|| small_file(&ch, call, name.as_bytes(), &data));
            r?;
            each.push(ns);
        }
        out.push(record(
            label,
            "create-write-close",
            each,
            t.elapsed().as_secs_f64(),
        ));
    }
    std::fs::create_dir_all(kdir.join("small")).map_err(err)?;
    let data = vec![0x42u8; 4096];
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

/// The calls [`calls`] and [`kernel_calls`] time, in the order they give their times.
const CALLS: [&str; 7] = [
    "fstat",
    "stat",
    "create",
    "rename",
    "unlink",
    "lock-unlock",
    "write-fsync",
];

fn call_records(path: &'static str, times: [Vec<u64>; 7]) -> Vec<FsRecord> {
    CALLS
        .into_iter()
        .zip(times)
        .map(|(op, ns)| record(path, op, ns, 0.0))
        .collect()
}

/// `fstat` and `stat` as libmoneta makes them (`Channel::fs`): answered from what was kept
/// while nothing they depended on changes (docs/abi.md §3.7), as here. Records `nvfs-kept`.
fn kept_stats(ch: &Channel, n: usize) -> Result<Vec<FsRecord>, String> {
    let path = b"/d1/d2/kept".to_vec();
    let h = opened(
        ch.fs(open_req(
            String::from_utf8_lossy(&path).into_owned(),
            libc::O_CREAT | libc::O_RDWR,
        ))
        .map_err(err)?,
    )?;
    let (mut fst, mut st) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (r, ns) = timed(|| {
            ch.fs(FsRequest::Stat {
                target: Target::Handle(h),
            })
        });
        r.map_err(err)?;
        fst.push(ns);
        let (r, ns) = timed(|| {
            ch.fs(FsRequest::Stat {
                target: Target::Path {
                    path: path.clone(),
                    follow: true,
                },
            })
        });
        r.map_err(err)?;
        st.push(ns);
    }
    ch.fs(FsRequest::Close { handle: h }).map_err(err)?;
    Ok(vec![
        record("nvfs-kept", "fstat", fst, 0.0),
        record("nvfs-kept", "stat", st, 0.0),
    ])
}

/// `lock-unlock` as libmoneta makes it (`File::lock`) on a file this process alone has open:
/// answered in the channel's lock lease after the first (docs/abi.md §3.8). Records
/// `nvfs-leased`.
fn leased_locks(socket: &std::path::Path, n: usize) -> Result<FsRecord, String> {
    use libmoneta::{LockCmd, LockKind, LockType};
    let f = library_file(socket, "/d1/d2/leased")?;
    let leased = libmoneta::locks_leased();
    let mut each = Vec::with_capacity(n);
    for _ in 0..n {
        let (r, ns) = timed(|| -> Result<(), libmoneta::ClientError> {
            f.lock(LockKind::Posix, LockCmd::Set, LockType::Write, 0, 0, false)?;
            f.lock(LockKind::Posix, LockCmd::Set, LockType::Unlock, 0, 0, false)?;
            Ok(())
        });
        r.map_err(err)?;
        each.push(ns);
    }
    let mut r = record("nvfs-leased", "lock-unlock", each, 0.0);
    // The calls that asked the daemon after all (the first, which brings the lease).
    r.referred = (2 * n as u64).saturating_sub(libmoneta::locks_leased() - leased);
    Ok(r)
}

/// `create` as libmoneta makes it: `OpenOptions::create_new` (`O_CREAT | O_EXCL`) and the
/// file dropped, whose close is posted without waiting for its answer (docs/libmoneta.md,
/// "Closes posted"). Records `nvfs-file`.
fn file_creates(socket: &std::path::Path, n: usize) -> Result<FsRecord, String> {
    let m = libmoneta::Moneta::connect(socket).map_err(err)?;
    let mut each = Vec::with_capacity(n);
    for i in 0..n {
        let path = format!("/d1/d2/made{i}");
        let (r, ns) = timed(|| {
            m.open(
                &path,
                libmoneta::OpenOptions::new().write(true).create_new(true),
            )
            .map(drop)
        });
        r.map_err(err)?;
        each.push(ns);
    }
    Ok(record("nvfs-file", "create", each, 0.0))
}

/// `fsync` as libmoneta makes it (`File::sync_all`), each after a 4 KiB `File::write_at`,
/// only the `fsync` timed, as the kernel's is (`write-fsync`), and the two together
/// (`write-and-fsync`): at the array's `device` durability level (this bench's volatile
/// array) the `fsync` is answered in the library once the file's writes have completed
/// (docs/nvfs.md, "Durability levels"), and the write, posted under the file's sole lease
/// (docs/abi.md §3.10), returns before it completes, so the `fsync` alone carries the rest
/// of the write's time. Records `nvfs-file`.
fn file_fsync(socket: &std::path::Path, n: usize) -> Result<Vec<FsRecord>, String> {
    let f = library_file(socket, "/d1/d2/synced")?;
    let data = [0x5au8; 4096];
    let mut each = Vec::with_capacity(n);
    let mut both = Vec::with_capacity(n);
    for _ in 0..n {
        f.write_at(&data, 0).map_err(err)?;
        let (r, ns) = timed(|| f.sync_all());
        r.map_err(err)?;
        each.push(ns);
        let (r, ns) = timed(|| {
            f.write_at(&data, 0)?;
            f.sync_all()
        });
        r.map_err(err)?;
        both.push(ns);
    }
    Ok(vec![
        record("nvfs-file", "write-fsync", each, 0.0),
        record("nvfs-file", "write-and-fsync", both, 0.0),
    ])
}

/// `path` opened for reading and writing (made if missing) through libmoneta, on a connection
/// of its own to the daemon at `socket`.
fn library_file(socket: &std::path::Path, path: &str) -> Result<libmoneta::File, String> {
    libmoneta::Moneta::connect(socket)
        .map_err(err)?
        .open(
            path,
            libmoneta::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true),
        )
        .map_err(err)
}

/// A file-system call made one way or another.
type Call<'a> = dyn Fn(FsRequest) -> Result<FsReply, libmoneta::ClientError> + 'a;

fn opened(r: FsReply) -> Result<u64, String> {
    match r {
        FsReply::Opened { handle, .. } => Ok(handle),
        r => Err(format!("unexpected reply {r:?}")),
    }
}

fn open_req(path: String, flags: i32) -> FsRequest {
    FsRequest::Open {
        flags: flags as u32,
        mode: 0o644,
        path: path.into_bytes(),
    }
}

/// `n` of each call, made with `call`, in a directory of its own (`tag` names it): fstat,
/// stat two directories deep, create (open with `O_CREAT | O_EXCL`, then close), rename,
/// unlink, a POSIX write lock set and removed, and fsync of a 4 KiB file.
fn calls(
    label: &'static str,
    tag: &str,
    call: &Call,
    ch: &Channel,
    n: usize,
) -> Result<Vec<FsRecord>, String> {
    let f = format!("/d1/d2/{tag}");
    let h = opened(call(open_req(f.clone(), libc::O_CREAT | libc::O_RDWR)).map_err(err)?)?;
    let x = match call(FsRequest::Extend {
        handle: h,
        offset: 0,
        len: 4096,
    })
    .map_err(err)?
    {
        FsReply::Extents { extents, .. } => extents.first().copied().ok_or("no extent")?,
        r => return Err(format!("unexpected reply {r:?}")),
    };
    let data = [0x17u8; 4096];
    let dir = format!("/m-{tag}");
    call(FsRequest::Mkdir {
        mode: 0o755,
        path: dir.clone().into_bytes(),
    })
    .map_err(err)?;
    let (mut fst, mut st, mut cr, mut rn, mut ul, mut lk, mut fs) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let lock = |ty| FsRequest::Lock {
        handle: h,
        kind: LockKind::Posix,
        cmd: LockCmd::Set,
        ty,
        wait: false,
        start: 0,
        len: 0,
    };
    for i in 0..n {
        let (r, ns) = timed(|| {
            call(FsRequest::Stat {
                target: Target::Handle(h),
            })
        });
        r.map_err(err)?;
        fst.push(ns);
        let (r, ns) = timed(|| {
            call(FsRequest::Stat {
                target: Target::Path {
                    path: f.clone().into_bytes(),
                    follow: true,
                },
            })
        });
        r.map_err(err)?;
        st.push(ns);
        let name = format!("{dir}/f{i}");
        let (r, ns) = timed(|| -> Result<(), String> {
            let h = opened(
                call(open_req(
                    name.clone(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                ))
                .map_err(err)?,
            )?;
            call(FsRequest::Close { handle: h }).map_err(err)?;
            Ok(())
        });
        r?;
        cr.push(ns);
        let to = format!("{dir}/r{i}");
        let (r, ns) = timed(|| {
            call(FsRequest::Rename {
                flags: 0,
                from: name.clone().into_bytes(),
                to: to.clone().into_bytes(),
            })
        });
        r.map_err(err)?;
        rn.push(ns);
        let (r, ns) = timed(|| {
            call(FsRequest::Unlink {
                path: to.into_bytes(),
            })
        });
        r.map_err(err)?;
        ul.push(ns);
        let (r, ns) = timed(|| -> Result<(), String> {
            call(lock(LockType::Write)).map_err(err)?;
            call(lock(LockType::Unlock)).map_err(err)?;
            Ok(())
        });
        r?;
        lk.push(ns);
        ch.write(x.dev, &data, Completion::Dma).map_err(err)?;
        let (r, ns) = timed(|| call(FsRequest::Fsync { handle: h }));
        r.map_err(err)?;
        fs.push(ns);
    }
    call(FsRequest::Close { handle: h }).map_err(err)?;
    Ok(call_records(label, [fst, st, cr, rn, ul, lk, fs]))
}

/// The same calls on the kernel's tmpfs.
fn kernel_calls(kdir: &std::path::Path, n: usize) -> std::io::Result<Vec<FsRecord>> {
    use rustix::fs::{Mode, OFlags};
    let kpath = kdir.join("d1/d2/f");
    let kf = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&kpath)?;
    let dir = kdir.join("m");
    std::fs::create_dir_all(&dir)?;
    let data = [0x17u8; 4096];
    let (mut fst, mut st, mut cr, mut rn, mut ul, mut lk, mut fs) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut wfs: Vec<u64> = Vec::new();
    let setlk = |ty: libc::c_short| {
        let fl = libc::flock {
            l_type: ty,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: 0,
            l_len: 0,
            l_pid: 0,
        };
        // SAFETY: F_SETLK with a valid flock on a descriptor this function owns.
        let r = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&kf), libc::F_SETLK, &fl) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    for i in 0..n {
        let (r, ns) = timed(|| rustix::fs::fstat(&kf));
        r?;
        fst.push(ns);
        let (r, ns) = timed(|| rustix::fs::stat(&kpath));
        r?;
        st.push(ns);
        let name = dir.join(format!("f{i}"));
        let (r, ns) = timed(|| {
            rustix::fs::open(
                &name,
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            )
            .map(drop)
        });
        r?;
        cr.push(ns);
        let to = dir.join(format!("r{i}"));
        let (r, ns) = timed(|| rustix::fs::rename(&name, &to));
        r?;
        rn.push(ns);
        let (r, ns) = timed(|| rustix::fs::unlink(&to));
        r?;
        ul.push(ns);
        let (r, ns) = timed(|| -> std::io::Result<()> {
            setlk(libc::F_WRLCK as libc::c_short)?;
            setlk(libc::F_UNLCK as libc::c_short)
        });
        r?;
        lk.push(ns);
        kf.write_all_at(&data, 0)?;
        let (r, ns) = timed(|| kf.sync_all());
        r?;
        fs.push(ns);
        let (r, ns) = timed(|| {
            kf.write_all_at(&data, 0)?;
            kf.sync_all()
        });
        r?;
        wfs.push(ns);
    }
    let mut out = call_records("kernel-tmpfs", [fst, st, cr, rn, ul, lk, fs]);
    out.push(record("kernel-tmpfs", "write-and-fsync", wfs, 0.0));
    Ok(out)
}

fn small_file(ch: &Channel, call: &Call, name: &[u8], data: &[u8]) -> Result<(), String> {
    let h = opened(
        call(FsRequest::Open {
            flags: (libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY) as u32,
            mode: 0o644,
            path: name.to_vec(),
        })
        .map_err(err)?,
    )?;
    let x = match call(FsRequest::Extend {
        handle: h,
        offset: 0,
        len: data.len() as u64,
    })
    .map_err(err)?
    {
        FsReply::Extents { extents, .. } => extents.first().copied().ok_or("no extent")?,
        r => return Err(format!("unexpected reply {r:?}")),
    };
    ch.write(x.dev, data, Completion::Dma).map_err(err)?;
    call(FsRequest::Close { handle: h }).map_err(err)?;
    Ok(())
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
    for r in recs.iter().filter(|r| r.op != "channel-calls") {
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
    for r in recs.iter().filter(|r| r.path == "nvfs-leased") {
        println!(
            "{} {}: {} of {} lock calls asked the daemon (the rest answered in the lease)",
            r.path,
            r.op,
            r.referred,
            2 * r.ops
        );
    }
    for r in recs
        .iter()
        .filter(|r| r.referred > 0 && r.op != "channel-calls" && r.path != "nvfs-leased")
    {
        println!(
            "{} {}: {} of {} channel lookups referred to the control socket",
            r.path, r.op, r.referred, r.ops
        );
    }
    for r in recs.iter().filter(|r| r.op == "channel-calls") {
        println!(
            "file calls through the channel: {} answered by the device, {} referred to the \
             control socket",
            r.ops, r.referred
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
