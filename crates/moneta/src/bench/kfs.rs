//! The recycled file system paths (Moneta-D §5, Figure 7): ext4 or XFS made on the array by a
//! private `monetad --kernel-fs`, the same files measured through channels (`moneta-kfs-*`,
//! `libmoneta::KernelFile`) and through the kernel's mount (`kernel-kfs-*-odirect` and
//! `kernel-kfs-*-buffered`, `pread`/`pwrite`).
//!
//! A kernel open of a file breaks the daemon's lease on it (docs/kernelfs.md): every channel
//! record of the file is revoked and the channel path falls back to the kernel until that
//! descriptor is closed. So the kernel paths open their descriptors at the start of each run
//! and close them at its end, and the channel path takes the lease again (and its records)
//! before its own run's clock starts: the two are measured one after the other, never with
//! each other's descriptors open.

use std::os::fd::OwnedFd;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use libmoneta::{Channel, KernelFile};
use moneta_device::Clock;

use super::threads::{thread_state, Stop, ThreadOutcome};
use super::{BenchArgs, Path};
use crate::loopfs::FsKind;

/// Bytes between the one-byte reads that take the lease and the file's records before a run
/// of the channel path (libmoneta asks for maps well ahead of a request, so most of them find
/// their extent kept).
const PRIME_STEP: u64 = 1 << 20;

/// How long the daemon may take to format and mount its array.
const START_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

impl Path {
    /// The file system a recycled-file-system path runs on, if it is one.
    pub(crate) fn kfs_kind(self) -> Option<FsKind> {
        match self {
            Path::MonetaKfsExt4 | Path::KernelKfsExt4Odirect | Path::KernelKfsExt4Buffered => {
                Some(FsKind::Ext4)
            }
            Path::MonetaKfsXfs | Path::KernelKfsXfsOdirect | Path::KernelKfsXfsBuffered => {
                Some(FsKind::Xfs)
            }
            _ => None,
        }
    }
}

/// Why the recycled file system of `kind` cannot run here (root, the tools, the kernel's
/// support), or `None` when it can.
pub(crate) fn unavailable(kind: FsKind) -> Option<String> {
    kind.available()
        .err()
        .map(|why| format!("monetad --kernel-fs {kind}: {why}"))
}

/// A private `monetad --kernel-fs KIND` on a volatile array, its mount, and the bench's files
/// there. Dropping it stops the daemon (which revokes every record and unmounts) and removes
/// its directory.
pub(crate) struct KfsDaemon {
    pub(crate) kind: FsKind,
    pub(crate) socket: PathBuf,
    pub(crate) pid: u32,
    /// The bench's files on the mount, one per `--open-files`.
    pub(crate) files: Arc<Vec<PathBuf>>,
    mount: PathBuf,
    dir: PathBuf,
}

impl KfsDaemon {
    /// Starts the daemon and writes the files through the kernel (every block allocated and
    /// written, as the other paths' files are), each then closed so the daemon may lease it.
    pub(crate) fn start(a: &BenchArgs, kind: FsKind) -> Result<KfsDaemon, String> {
        if let Some(why) = unavailable(kind) {
            return Err(why);
        }
        let dir =
            std::env::temp_dir().join(format!("moneta-bench-kfs-{kind}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let socket = dir.join("monetad.sock");
        let mount = dir.join("mnt");
        std::fs::create_dir_all(&mount).map_err(|e| format!("{}: {e}", mount.display()))?;
        // Room for the files and the file system's own metadata and journal (XFS refuses
        // less than 300 MiB).
        let size = (a.region + a.region / 8 + (64 << 20))
            .max(kind.min_size())
            .next_multiple_of(1 << 20);
        let args: Vec<String> = vec![
            "--volatile".into(),
            "--size".into(),
            size.to_string(),
            "--kernel-fs".into(),
            kind.name().into(),
            "--kernel-fs-mount".into(),
            mount.to_string_lossy().into_owned(),
        ];
        let started = crate::daemon::start(&socket, &args, &dir.join("monetad.log"));
        let mut d = KfsDaemon {
            kind,
            socket,
            pid: 0,
            files: Arc::new(Vec::new()),
            mount,
            dir,
        };
        d.pid = started
            .map_err(|e| format!("monetad --kernel-fs {kind}: {e}"))?
            .pid;
        let t = std::time::Instant::now();
        while crate::mount::mounted(&d.mount).is_none() {
            if t.elapsed() > START_LIMIT {
                return Err(format!(
                    "monetad --kernel-fs {kind}: nothing mounted on {} within {START_LIMIT:?}",
                    d.mount.display()
                ));
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let n = a.open_files.max(1);
        let per_file = a.region / n as u64;
        let mut files = Vec::with_capacity(n);
        for i in 0..n {
            let path = d.mount.join(format!("bench-{i}"));
            fill(&path, per_file)?;
            files.push(path);
        }
        d.files = Arc::new(files);
        Ok(d)
    }

    /// The files opened through libmoneta on one channel, for reading and writing.
    pub(crate) fn channel_files(&self) -> Result<Arc<Vec<Arc<KernelFile>>>, String> {
        let ch = Arc::new(Channel::open(&self.socket).map_err(|e| e.to_string())?);
        let mut v = Vec::with_capacity(self.files.len());
        for p in self.files.iter() {
            v.push(Arc::new(KernelFile::open(&ch, p, true).map_err(|e| {
                format!("cannot open {} through the channel: {e}", p.display())
            })?));
        }
        Ok(Arc::new(v))
    }
}

impl Drop for KfsDaemon {
    fn drop(&mut self) {
        if self.pid != 0 {
            if let Err(e) = crate::daemon::stop(&self.socket) {
                eprintln!(
                    "moneta bench: stopping monetad --kernel-fs {}: {e}",
                    self.kind
                );
            }
        }
        // Never remove through a mount still there (the daemon unmounts as it stops).
        if crate::mount::mounted(&self.mount).is_some() {
            eprintln!(
                "moneta bench: {} is still mounted; unmount it by hand",
                self.mount.display()
            );
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes `len` bytes into a new file at `path` through the kernel, makes them durable, and
/// closes it.
fn fill(path: &FsPath, len: u64) -> Result<(), String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    let chunk = vec![0xa5u8; 1 << 20];
    let mut off = 0;
    while off < len {
        let k = chunk.len().min((len - off) as usize);
        rustix::io::pwrite(&f, &chunk[..k], off)
            .map_err(|e| format!("cannot fill {}: {e}", path.display()))?;
        off += k as u64;
    }
    f.sync_all()
        .map_err(|e| format!("cannot sync {}: {e}", path.display()))
}

/// Opens the files through the kernel for one run: with `O_DIRECT` or through the page cache.
/// The opens break the daemon's leases; the descriptors close when the run drops them.
pub(crate) fn open_kernel(paths: &[PathBuf], direct: bool) -> Result<Arc<Vec<OwnedFd>>, String> {
    let mut fds = Vec::with_capacity(paths.len());
    for p in paths {
        let f = if direct {
            crate::loopfs::open_direct(p, true)
        } else {
            std::fs::OpenOptions::new().read(true).write(true).open(p)
        }
        .map_err(|e| format!("cannot open {}: {e}", p.display()))?;
        fds.push(OwnedFd::from(f));
    }
    Ok(Arc::new(fds))
}

/// Takes the lease and the records of every file again before a run of the channel path
/// (after a kernel path's run the daemon revoked them): a one-byte read every
/// [`PRIME_STEP`] bytes of the part of the region each file holds.
pub(crate) fn prime(files: &[Arc<KernelFile>], per_file: u64) -> Result<(), String> {
    let mut b = [0u8; 1];
    for f in files {
        let mut at = 0;
        while at < per_file {
            f.read_at(&mut b, at)
                .map_err(|e| format!("cannot read the bench file through the channel: {e}"))?;
            at += PRIME_STEP;
        }
    }
    Ok(())
}

/// The channel path's thread: `read_at`/`write_at` on the files, one request at a time.
pub(crate) fn kfs_thread(
    a: &BenchArgs,
    size: u64,
    files: &[Arc<KernelFile>],
    thread: usize,
    stop: &Stop,
) -> ThreadOutcome {
    let (mut offs, mut hist, mut buf, clk) = thread_state(a, size, thread);
    let mut ops = 0u64;
    while !stop.done(ops) {
        let w = offs.is_write(a.op);
        let (i, off) = offs.next_in();
        let f = &files[i];
        let t = clk.now_ns();
        let r = if w {
            f.write_at(&buf, off).map(|()| buf.len())
        } else {
            f.read_at(&mut buf, off)
        };
        let ns = clk.now_ns().saturating_sub(t);
        match r {
            Ok(n) if n as u64 == size => {}
            Ok(n) => return Err(format!("short transfer: {n} of {size}")),
            Err(e) => return Err(format!("libmoneta: {e}")),
        }
        hist.record(ns.max(1)).ok();
        ops += 1;
    }
    Ok((hist, ops))
}
