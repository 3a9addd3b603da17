//! A kernel file system on a loop device over a tmpfs file: the kernel's block path, the
//! baseline of the Moneta papers (Moneta-D §5: ext4 and XFS over the stock block layer).
//!
//! [`LoopFs::create`] makes a file in `/dev/shm`, attaches it to a free loop device with direct
//! I/O on (so the loop device reads and writes the tmpfs pages directly and does not keep a
//! second page cache of its own), makes ext4 or XFS on it, and mounts it on a fresh directory.
//! Dropping the [`LoopFs`] unmounts, detaches and removes everything; a step of `create` that
//! fails undoes the ones before it. It needs root (`losetup`, `mount`).
//!
//! Benchmarks open files on it with `O_DIRECT` ([`open_direct`]), which needs buffers, offsets
//! and lengths aligned to the logical block size: [`aligned_buffer`] gives 4096-aligned memory.

// The module is the kernel block path for every benchmark (`moneta bench`'s kernel paths and
// the applications benchmark); each uses a part of it.
#![allow(dead_code)]

use std::alloc::{self, Layout};
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where the backing files go: a tmpfs, so the "device" is memory, as Moneta's array is.
pub const BACKING_DIR: &str = "/dev/shm";

/// Alignment of [`aligned_buffer`]: the page size, a multiple of every logical block size a
/// loop device reports.
pub const DIRECT_IO_ALIGN: usize = 4096;

/// How long [`LoopFs`]'s teardown keeps retrying an unmount or a detach the kernel calls busy
/// (a process that has just exited may still hold the file system for a moment).
const TEARDOWN_RETRY: Duration = Duration::from_secs(5);

/// How long one of the setup tools (`losetup`, `mkfs.*`) may take.
const TOOL_LIMIT: Duration = Duration::from_secs(120);

/// Which kernel file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FsKind {
    /// ext4 (`mkfs.ext4`, e2fsprogs).
    Ext4,
    /// XFS (`mkfs.xfs`, xfsprogs).
    Xfs,
}

impl FsKind {
    /// Both kinds.
    pub const ALL: [FsKind; 2] = [FsKind::Ext4, FsKind::Xfs];

    /// The file system's name, as `mount -t` and `/proc/filesystems` spell it.
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
        }
    }

    /// The tool that makes it.
    pub fn mkfs_tool(self) -> &'static str {
        match self {
            FsKind::Ext4 => "mkfs.ext4",
            FsKind::Xfs => "mkfs.xfs",
        }
    }

    /// The Debian package of [`FsKind::mkfs_tool`].
    pub fn package(self) -> &'static str {
        match self {
            FsKind::Ext4 => "e2fsprogs",
            FsKind::Xfs => "xfsprogs",
        }
    }

    /// The smallest size the tool accepts (mkfs.xfs refuses file systems under 300 MiB).
    pub fn min_size(self) -> u64 {
        match self {
            FsKind::Ext4 => 16 << 20,
            FsKind::Xfs => 300 << 20,
        }
    }

    /// Arguments of the tool, before the device: quiet, forced (the device is ours), no
    /// discard (nothing to discard on a fresh file), and ext4's inode tables and journal
    /// written now rather than by a background thread that would disturb the measurements.
    fn mkfs_args(self) -> &'static [&'static str] {
        match self {
            FsKind::Ext4 => &[
                "-F",
                "-q",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
            ],
            FsKind::Xfs => &["-f", "-q", "-K"],
        }
    }

    /// Whether this machine can make one: root, the tools, the kernel's support. `Err` says
    /// what is missing.
    pub fn available(self) -> Result<(), String> {
        if !rustix::process::geteuid().is_root() {
            return Err(format!(
                "a {} file system on a loop device needs root (losetup, mount)",
                self.name()
            ));
        }
        find_tool("losetup", "mount (util-linux)")?;
        find_tool(self.mkfs_tool(), self.package())?;
        // A file system built as a module is listed only once loaded, and mount loads it; so
        // refuse here only when it is neither listed nor could be a module (no module tree for
        // the running kernel). Otherwise a mount failure says ENODEV.
        if let Ok(fs) = std::fs::read_to_string("/proc/filesystems") {
            let listed = fs
                .lines()
                .any(|l| l.split_whitespace().last() == Some(self.name()));
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            let modules = Path::new("/lib/modules").join(release.trim()).is_dir();
            if !listed && !modules {
                return Err(format!(
                    "the kernel has no {} support (not in /proc/filesystems, no modules)",
                    self.name()
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for FsKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A mounted kernel file system on a loop device over a tmpfs file. Dropping it unmounts,
/// detaches and removes everything.
#[derive(Debug)]
pub struct LoopFs {
    /// Where it is mounted (a fresh directory under the temporary directory).
    pub mount: PathBuf,
    /// Which file system.
    pub kind: FsKind,
    /// The loop device, e.g. `/dev/loop0`.
    pub device: PathBuf,
    /// The tmpfs file behind it.
    pub backing: PathBuf,
    /// Its size in bytes.
    pub size_bytes: u64,
    /// Whether the loop device does direct I/O on the backing file (the kernel may refuse it
    /// for a backing file system without `O_DIRECT`; the device then works through the
    /// backing file's page cache).
    pub loop_direct_io: bool,
    parts: Parts,
}

impl LoopFs {
    /// Makes a `kind` file system of `size_bytes` on a loop device over a new file in
    /// `/dev/shm` and mounts it on a fresh directory. Needs root. A failed step undoes the
    /// earlier ones; `Err` says which step failed and why (a missing tool names its package).
    pub fn create(kind: FsKind, size_bytes: u64) -> Result<LoopFs, String> {
        kind.available()?;
        if size_bytes < kind.min_size() {
            return Err(format!(
                "{} needs at least {} MiB, asked for {} bytes",
                kind.name(),
                kind.min_size() >> 20,
                size_bytes
            ));
        }
        let losetup = find_tool("losetup", "mount (util-linux)")?;
        let mkfs = find_tool(kind.mkfs_tool(), kind.package())?;
        let tag = unique_tag();
        // Each step records what it made in `parts` at once, so an error (the `?`s below)
        // drops `parts` and undoes exactly what was made.
        let mut parts = Parts::default();

        let backing = Path::new(BACKING_DIR).join(format!("moneta-loopfs-{tag}-{}.img", kind));
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&backing)
            .map_err(|e| format!("creating {}: {e}", backing.display()))?;
        parts.backing = Some(backing.clone());
        // Sparse: tmpfs gives pages only to what the file system writes.
        f.set_len(size_bytes)
            .map_err(|e| format!("sizing {} to {size_bytes} bytes: {e}", backing.display()))?;
        drop(f);

        let out = run_tool(
            Command::new(&losetup)
                .args(["--find", "--show", "--direct-io=on"])
                .arg(&backing),
        )
        .map_err(|e| format!("attaching a loop device: {e}"))?;
        let device = PathBuf::from(out.trim());
        if !device.starts_with("/dev") {
            return Err(format!("losetup answered {out:?}, not a device"));
        }
        parts.device = Some(device.clone());
        parts.losetup = Some(losetup);
        let loop_direct_io = loop_dio(&device);

        run_tool(Command::new(&mkfs).args(kind.mkfs_args()).arg(&device))
            .map_err(|e| format!("{} on {}: {e}", kind.mkfs_tool(), device.display()))?;

        let mount = std::env::temp_dir().join(format!("moneta-loopfs-{tag}-{}", kind));
        std::fs::create_dir(&mount).map_err(|e| format!("mkdir {}: {e}", mount.display()))?;
        parts.mount_dir = Some(mount.clone());
        mount_fs(&device, &mount, kind.name()).map_err(|e| {
            format!(
                "mounting {} ({}) on {}: {e}",
                device.display(),
                kind.name(),
                mount.display()
            )
        })?;
        parts.mounted = true;

        Ok(LoopFs {
            mount,
            kind,
            device,
            backing,
            size_bytes,
            loop_direct_io,
            parts,
        })
    }

    /// Unmounts, detaches and removes everything now, reporting what could not be undone
    /// (dropping does the same and prints it).
    pub fn destroy(mut self) -> Result<(), String> {
        self.parts.teardown()
    }
}

/// What [`LoopFs::create`] has made so far; dropping it undoes all of it, in reverse order.
#[derive(Debug, Default)]
struct Parts {
    backing: Option<PathBuf>,
    device: Option<PathBuf>,
    losetup: Option<PathBuf>,
    mount_dir: Option<PathBuf>,
    mounted: bool,
}

impl Parts {
    /// Undoes every step, going on past a failed one; the failures, joined.
    fn teardown(&mut self) -> Result<(), String> {
        let mut errors = Vec::new();
        if self.mounted {
            let dir = self
                .mount_dir
                .as_deref()
                .expect("mounted without a directory");
            match unmount(dir) {
                Ok(()) => self.mounted = false,
                Err(e) => errors.push(format!("unmounting {}: {e}", dir.display())),
            }
        }
        // A directory still mounted on is kept (and the state says so): removing it would fail.
        if !self.mounted {
            if let Some(dir) = self.mount_dir.take() {
                if let Err(e) = std::fs::remove_dir(&dir) {
                    errors.push(format!("removing {}: {e}", dir.display()));
                }
            }
        }
        if let Some(dev) = self.device.take() {
            let losetup = self.losetup.take().unwrap_or_else(|| "losetup".into());
            if let Err(e) = detach(&losetup, &dev) {
                errors.push(format!("detaching {}: {e}", dev.display()));
            }
        }
        // The file goes even when the device could not be detached: the kernel keeps its
        // pages until the loop device lets go, and the name is not left behind.
        if let Some(f) = self.backing.take() {
            if let Err(e) = std::fs::remove_file(&f) {
                errors.push(format!("removing {}: {e}", f.display()));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }
}

impl Drop for Parts {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("moneta: loop file system teardown: {e}");
        }
    }
}

/// `tool` on `PATH` or in the system directories (`/usr/sbin` is not on every user's `PATH`);
/// `Err` names the Debian package that has it.
fn find_tool(tool: &str, package: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from));
    for d in dirs {
        let cand = d.join(tool);
        if cand.is_file() {
            return Ok(cand);
        }
    }
    Err(format!(
        "{tool} not found: install the {package} package (apt-get install {})",
        package.split_whitespace().next().unwrap_or(package)
    ))
}

/// Runs a setup tool to completion within [`TOOL_LIMIT`]; its standard output, or its error
/// output in `Err`.
fn run_tool(cmd: &mut Command) -> Result<String, String> {
    let name = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("{name}: {e}"))?;
    // The tools print little, so the pipes cannot fill while we wait.
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > TOOL_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{name} took longer than {TOOL_LIMIT:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("{name}: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{name}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether the loop device does direct I/O (`/sys/block/loopN/loop/dio`).
fn loop_dio(device: &Path) -> bool {
    let Some(name) = device.file_name() else {
        return false;
    };
    let p = Path::new("/sys/block").join(name).join("loop/dio");
    std::fs::read_to_string(p).is_ok_and(|s| s.trim() == "1")
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn mount_fs(device: &Path, dir: &Path, fstype: &str) -> io::Result<()> {
    let dev = cstring(device)?;
    let target = cstring(dir)?;
    let fstype = CString::new(fstype).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the three strings are NUL-terminated and outlive the call; no data argument.
    let r = unsafe {
        libc::mount(
            dev.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENODEV) {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "{e} (the kernel has no {} support)",
                    fstype.to_string_lossy()
                ),
            ));
        }
        Err(e)
    }
}

/// Unmounts `dir`, retrying while it is busy, and detaches it lazily as a last resort (it
/// then goes when its last user does).
fn unmount(dir: &Path) -> io::Result<()> {
    let target = cstring(dir)?;
    let start = Instant::now();
    loop {
        // SAFETY: `target` is NUL-terminated and outlives the call.
        let r = unsafe { libc::umount2(target.as_ptr(), 0) };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e);
        }
        if start.elapsed() > TEARDOWN_RETRY {
            // SAFETY: as above.
            let r = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            return if r == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            };
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `losetup -d`, retried while the kernel still holds the device for a moment.
fn detach(losetup: &Path, device: &Path) -> Result<(), String> {
    let start = Instant::now();
    loop {
        match run_tool(Command::new(losetup).arg("-d").arg(device)) {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() > TEARDOWN_RETRY => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// A name no other `LoopFs` of this or another process uses at the same time.
fn unique_tag() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{nanos:08x}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Opens `path` with `O_DIRECT` (created if `write` and missing): reads and writes then go to
/// the device, past the page cache, and need [`DIRECT_IO_ALIGN`]-aligned buffers, offsets and
/// lengths ([`aligned_buffer`]).
pub fn open_direct(path: &Path, write: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .create(write)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .mode(0o600)
        .open(path)
}

/// `len` zeroed bytes at a [`DIRECT_IO_ALIGN`]-aligned address, for `O_DIRECT` reads and
/// writes.
///
/// ```ignore
/// let mut b = aligned_buffer(8192);
/// assert_eq!(b.as_ptr() as usize % DIRECT_IO_ALIGN, 0);
/// b[0] = 1;
/// ```
pub fn aligned_buffer(len: usize) -> AlignedBuf {
    // At least one block, so the layout is never of size zero (which `alloc` must not get).
    let cap = len
        .max(1)
        .checked_next_multiple_of(DIRECT_IO_ALIGN)
        .expect("buffer size overflows");
    let layout = Layout::from_size_align(cap, DIRECT_IO_ALIGN).expect("buffer layout");
    // SAFETY: the layout has a non-zero size.
    let ptr = unsafe { alloc::alloc_zeroed(layout) };
    let Some(ptr) = NonNull::new(ptr) else {
        alloc::handle_alloc_error(layout)
    };
    AlignedBuf { ptr, len, layout }
}

/// Memory from [`aligned_buffer`]: a byte slice whose start is [`DIRECT_IO_ALIGN`]-aligned.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the buffer owns its memory exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads, through `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points at `layout.size() >= len` initialized (zeroed) bytes owned by
        // `self`, borrowed for `self`'s lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed` with this very layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        for len in [0, 1, 512, 4096, 4097, 1 << 20] {
            let mut b = aligned_buffer(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_ptr() as usize % DIRECT_IO_ALIGN, 0);
            assert!(b.iter().all(|&x| x == 0));
            b.fill(0xa5);
            assert!(b.iter().all(|&x| x == 0xa5));
        }
    }

    #[test]
    fn names() {
        assert_eq!(FsKind::Ext4.name(), "ext4");
        assert_eq!(FsKind::Xfs.name(), "xfs");
        assert_eq!(FsKind::Xfs.package(), "xfsprogs");
    }

    #[test]
    fn a_missing_tool_names_its_package() {
        let e = find_tool("mkfs.no-such-fs", "no-such-package").unwrap_err();
        assert!(e.contains("no-such-package"), "{e}");
    }
}
