//! What a run measures on: the daemon (private or the user's), the Moneta files and raw
//! extents, and the kernel's files (tmpfs, or ext4/XFS on a loop device).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

use libmoneta::{Channel, Control};
use moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};
use rand::SeedableRng;

use super::*;

/// A daemon the bench uses: its own private one, or the user's.
pub(crate) struct BenchDaemon {
    pub(crate) socket: PathBuf,
    pub(crate) pid: u32,
    /// It serves nvfs (else a raw device, where the raw path grants itself an extent).
    pub(crate) fs: bool,
    pub(crate) private: Option<PathBuf>,
    /// Its array model's name and parameters, for the records.
    pub(crate) model: ModelNamed,
}

/// A model's name (`none` without one) and its parameters.
pub(crate) type ModelNamed = (String, Option<std::collections::BTreeMap<String, String>>);

/// The model the daemon at `socket` runs.
pub(crate) fn daemon_model(c: &Control) -> Result<ModelNamed, String> {
    let m = c.model().map_err(|e| e.to_string())?;
    let name = m.get("model").unwrap_or("none").to_string();
    let params: std::collections::BTreeMap<String, String> = m
        .pairs
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("parameters.")?.to_string(), v.clone())))
        .collect();
    Ok((name, (!params.is_empty()).then_some(params)))
}

impl BenchDaemon {
    pub(crate) fn get(a: &BenchArgs, region: u64) -> Result<BenchDaemon, String> {
        if let Some(s) = &a.socket {
            let c = Control::connect(s).map_err(|e| e.to_string())?;
            let st = c.status().map_err(|e| e.to_string())?;
            let fs = c.fs(moneta_abi::fsproto::FsRequest::Statfs).is_ok();
            return Ok(BenchDaemon {
                socket: s.clone(),
                pid: st.pid as u32,
                fs,
                private: None,
                model: daemon_model(&c)?,
            });
        }
        // A directory of its own: a bench may keep two private daemons up at once.
        static STARTED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("moneta-bench-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let socket = dir.join("monetad.sock");
        // Room for the two region files and the file system's tables.
        let size = a
            .array_size
            .unwrap_or((2 * region + (64 << 20)).next_multiple_of(1 << 20));
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
            // Pieces written out of order are extents of their own only when no reserve
            // ahead of a file's appends keeps the next ones beside them.
            args.extend([
                "--chunk-size".into(),
                c.to_string(),
                "--append-reserve".into(),
                "0".into(),
            ]);
        }
        if let Some(m) = &a.model {
            args.extend(["--model".into(), m.clone()]);
        }
        for kv in &a.model_set {
            args.extend(["--model-set".into(), kv.clone()]);
        }
        let started = crate::daemon::start(&socket, &args, &dir.join("monetad.log"))?;
        let model = Control::connect(&socket)
            .map_err(|e| e.to_string())
            .and_then(|c| daemon_model(&c))?;
        Ok(BenchDaemon {
            socket,
            pid: started.pid,
            fs: true,
            private: Some(dir),
            model,
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
pub(crate) fn chunk_for_extents(a: &BenchArgs) -> Result<Option<u64>, String> {
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
pub(crate) fn region_file(
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
pub(crate) fn count_extents(
    m: &libmoneta::Moneta,
    f: &libmoneta::File,
    len: u64,
) -> Result<u64, String> {
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

pub(crate) fn file_name(what: &str) -> String {
    format!("/moneta-bench-{what}-{}", std::process::id())
}

pub(crate) fn raw_target(d: &BenchDaemon, a: &BenchArgs) -> Result<Target, String> {
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
            ch: ChannelOwner::Files(m, Box::new(f)),
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
pub(crate) struct BenchFiles {
    pub(crate) files: Arc<Vec<Arc<libmoneta::File>>>,
    pub(crate) extents: u64,
}

pub(crate) fn bench_files(d: &BenchDaemon, a: &BenchArgs) -> Result<BenchFiles, String> {
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
pub(crate) struct KernelFiles {
    pub(crate) fds: Arc<Vec<OwnedFd>>,
    /// Files to remove at the end (tmpfs; a loop file system goes whole).
    pub(crate) remove: Vec<PathBuf>,
    pub(crate) _fs: Option<crate::loopfs::LoopFs>,
}

/// The kernel paths' files: `--target`, or files in /dev/shm (one per `--open-files`); with
/// `fs`, files on a new ext4 or XFS on a loop device, opened with `O_DIRECT`.
pub(crate) fn kernel_files(
    a: &BenchArgs,
    fs: Option<crate::loopfs::FsKind>,
) -> Result<KernelFiles, String> {
    files_in(a, fs, None)
}

/// The files of the kernel paths: `--target`, files in /dev/shm, on a loop-device file
/// system of kind `fs`, or in directory `under`.
fn files_in(
    a: &BenchArgs,
    fs: Option<crate::loopfs::FsKind>,
    under: Option<&std::path::Path>,
) -> Result<KernelFiles, String> {
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
        let path = match (&loopfs, under) {
            (Some(l), _) => l.mount.join(format!("bench-{i}")),
            (None, Some(dir)) => dir.join(format!("bench-{i}")),
            (None, None) => a.target.clone().unwrap_or_else(|| {
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
            if a.target.is_none() || under.is_some() {
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

/// The fuse path's files: the private daemon's file system mounted with `moneta mount` (this
/// program, in the foreground, as a child process) on a directory of the bench's, and files
/// there filled through the mount. Dropping it unmounts and waits for the server.
pub(crate) struct FuseFiles {
    pub(crate) files: KernelFiles,
    mountpoint: PathBuf,
    server: std::process::Child,
}

pub(crate) fn fuse_files(d: &BenchDaemon, a: &BenchArgs) -> Result<FuseFiles, String> {
    if !d.fs {
        return Err(format!(
            "the daemon at {} serves a raw device: the fuse path needs nvfs",
            d.socket.display()
        ));
    }
    if a.target.is_some() {
        return Err("--target names a kernel file: the fuse path makes its own".into());
    }
    let dir = std::env::temp_dir().join(format!("moneta-bench-mount-{}", std::process::id()));
    let mountpoint = dir.join("mnt");
    std::fs::create_dir_all(&mountpoint)
        .map_err(|e| format!("cannot create {}: {e}", mountpoint.display()))?;
    let log = dir.join("mount.log");
    let logf = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut server = std::process::Command::new(exe)
        .arg("mount")
        .arg("--foreground")
        .arg("--socket")
        .arg(&d.socket)
        .arg(&mountpoint)
        .stdin(std::process::Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf)
        .spawn()
        .map_err(|e| format!("cannot start moneta mount: {e}"))?;
    let t = Instant::now();
    loop {
        if let Some((t, src)) = crate::mount::mounted(&mountpoint) {
            if crate::mount::is_moneta(&t, &src) {
                break;
            }
        }
        if let Ok(Some(status)) = server.try_wait() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!(
                "fuse: moneta mount exited ({status}): {}",
                text.trim()
            ));
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = server.kill();
            let _ = server.wait();
            return Err(format!(
                "fuse: the mount on {} was not live within 20 s",
                mountpoint.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut fuse = FuseFiles {
        files: KernelFiles {
            fds: Arc::new(Vec::new()),
            remove: Vec::new(),
            _fs: None,
        },
        mountpoint,
        server,
    };
    fuse.files = files_in(a, None, Some(&fuse.mountpoint))?;
    Ok(fuse)
}

impl Drop for FuseFiles {
    fn drop(&mut self) {
        for p in self.files.remove.drain(..) {
            let _ = std::fs::remove_file(p);
        }
        self.files.fds = Arc::new(Vec::new());
        if let Err(e) = crate::mount::umount(crate::mount::UmountArgs {
            mountpoint: self.mountpoint.clone(),
            lazy: true,
        }) {
            eprintln!("moneta bench: {e}");
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.server.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !matches!(self.server.try_wait(), Ok(Some(_))) {
            let _ = self.server.kill();
            let _ = self.server.wait();
        }
        if let Some(dir) = self.mountpoint.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
