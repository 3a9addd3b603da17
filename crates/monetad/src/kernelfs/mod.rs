//! The kernel's own file systems on the array (Moneta-D §3, "recycling" XFS): `monetad
//! --kernel-fs ext4|xfs` attaches the array to a loop device, makes ext4 or XFS on it (once)
//! and mounts it; clients open files through the kernel, which decides whether they may, and
//! hand the descriptors to the daemon, which installs permission records from each file's
//! extent map ([`files`]).
//!
//! The loop device reads and writes the backing file (or the volatile array's memfd) through
//! its page cache, which holds the very pages the daemon maps as the array: what a channel
//! writes is what the kernel reads through the loop device, and the other way round. Needs
//! root, as the kernel does for loop devices and mounts.

pub mod files;
mod leases;
pub mod sys;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub use files::Files;
pub use leases::{block_break_signal, start_watcher, BREAK_SIGNAL_OFFSET};

/// Which kernel file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// ext4 (e2fsprogs).
    Ext4,
    /// XFS (xfsprogs).
    Xfs,
}

impl Kind {
    /// Parses `ext4` or `xfs`.
    pub fn parse(s: &str) -> Result<Kind, String> {
        match s {
            "ext4" => Ok(Kind::Ext4),
            "xfs" => Ok(Kind::Xfs),
            other => Err(format!("unknown kernel file system `{other}`: ext4 or xfs")),
        }
    }

    /// The name `mount -t` and `blkid` use.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ext4 => "ext4",
            Kind::Xfs => "xfs",
        }
    }

    /// The smallest array the tool formats (mkfs.xfs refuses file systems under 300 MiB).
    pub fn min_size(self) -> u64 {
        match self {
            Kind::Ext4 => 16 << 20,
            Kind::Xfs => 300 << 20,
        }
    }

    fn mkfs(self) -> Command {
        match self {
            Kind::Ext4 => {
                let mut c = Command::new("mkfs.ext4");
                // Inode tables and journal written now, not by a thread after the mount; no
                // discard (the array is fresh).
                c.args([
                    "-F",
                    "-q",
                    "-E",
                    "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
                ]);
                c
            }
            Kind::Xfs => {
                let mut c = Command::new("mkfs.xfs");
                c.args(["-f", "-q", "-K"]);
                c
            }
        }
    }
}

/// A kernel file system on the array, mounted. Dropping it unmounts it (the loop device then
/// detaches itself).
#[derive(Debug)]
pub struct KernelFs {
    /// Which file system.
    pub kind: Kind,
    /// Where it is mounted.
    pub mount: PathBuf,
    /// The loop device.
    pub loop_device: PathBuf,
    /// The file system's device number (`st_dev` of its files).
    pub dev: u64,
    /// Whether this start made the file system.
    pub formatted: bool,
}

/// Runs a setup tool, with what it said when it fails.
fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The file system `blkid` finds on `device`, if any.
fn probe(device: &Path) -> Result<Option<String>, String> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(device)
        .output()
        .map_err(|e| format!("cannot run blkid (util-linux): {e}"))?;
    match out.status.code() {
        Some(0) => Ok(Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())),
        // 2: nothing recognised.
        Some(2) => Ok(None),
        _ => Err(format!(
            "blkid {}: {}",
            device.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

impl KernelFs {
    /// Attaches the array (`backing`, `size` bytes) to a loop device and mounts a `kind` file
    /// system from it on `mount`, making one first if the array is `fresh` (created by this
    /// start, or volatile). An array that holds something else is refused, never formatted.
    pub fn attach(
        kind: Kind,
        backing: BorrowedFd<'_>,
        size: u64,
        fresh: bool,
        mount: &Path,
    ) -> Result<KernelFs, String> {
        if !rustix::process::geteuid().is_root() {
            return Err(format!(
                "--kernel-fs {} needs root (a loop device and a mount)",
                kind.name()
            ));
        }
        if size < kind.min_size() {
            return Err(format!(
                "--kernel-fs {} needs an array of at least {} MiB (--size)",
                kind.name(),
                kind.min_size() >> 20
            ));
        }
        let (loop_device, loop_fd) = sys::attach_loop(backing)
            .map_err(|e| format!("cannot attach the array to a loop device: {e}"))?;
        let made = Self::format_and_mount(kind, &loop_device, fresh, mount);
        // The mount holds the loop device from here on; without one, closing this descriptor
        // detaches it (autoclear).
        drop::<OwnedFd>(loop_fd);
        let formatted = made?;
        let dev = std::fs::metadata(mount)
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m))
            .map_err(|e| format!("{}: {e}", mount.display()))?;
        Ok(KernelFs {
            kind,
            mount: mount.to_owned(),
            loop_device,
            dev,
            formatted,
        })
    }

    fn format_and_mount(
        kind: Kind,
        device: &Path,
        fresh: bool,
        mount: &Path,
    ) -> Result<bool, String> {
        let found = probe(device)?;
        let formatted = match found.as_deref() {
            Some(t) if t == kind.name() => false,
            Some(other) => {
                return Err(format!(
                    "the array holds a {other} file system, not {}; refusing to format it \
                     (give another --device)",
                    kind.name()
                ))
            }
            None if !fresh => {
                return Err(format!(
                    "the array holds data that is not a {} file system; refusing to format \
                     it (give a new --device, or a volatile array)",
                    kind.name()
                ))
            }
            None => {
                run(kind.mkfs().arg(device), &format!("mkfs.{}", kind.name()))?;
                true
            }
        };
        std::fs::create_dir_all(mount).map_err(|e| format!("{}: {e}", mount.display()))?;
        if is_mount_point(mount) {
            return Err(format!(
                "{} is already a mount point; unmount it or give another --kernel-fs-mount",
                mount.display()
            ));
        }
        run(
            Command::new("mount")
                .args(["-t", kind.name()])
                .arg(device)
                .arg(mount),
            "mount",
        )?;
        Ok(formatted)
    }
}

/// Frees the backing file `image` from a daemon that was killed while its file system was
/// mounted: the mount keeps the loop device, and the loop device the file (and the lock on it
/// that a daemon takes), so no daemon could start on the array again. Only when no process has
/// the file open (a live daemon would) and the loop devices over it are mounted nowhere busy:
/// each such mount is unmounted (not lazily: a busy one is reported, since a second loop
/// device over the same file would let two file systems write it), and the loop devices,
/// which detach themselves once unmounted, are waited for. `Ok(false)`: nothing of the kind
/// holds the file.
pub fn release_stale(image: &Path) -> Result<bool, String> {
    let image = std::fs::canonicalize(image).map_err(|e| format!("{}: {e}", image.display()))?;
    let loops = loops_over(&image);
    if loops.is_empty() || open_by_a_process(&image) {
        return Ok(false);
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for (_, dev) in &loops {
        // Field 3 of a mountinfo line is the device's major:minor, field 5 the mount point.
        for line in mountinfo.lines() {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() > 4 && f[2] == dev {
                let point = f[4].replace("\\040", " ");
                tracing::warn!(
                    "{} is still mounted on {point} by a daemon that was killed: unmounting it",
                    image.display()
                );
                let c = std::ffi::CString::new(point.as_str()).map_err(|e| e.to_string())?;
                // A use of an instant (a process forked while it held a file there, until its
                // exec closes it) is waited out; a lasting one is reported.
                let mut tries = 0;
                let unmounted = loop {
                    // SAFETY: a NUL-terminated path.
                    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
                        break Ok(());
                    }
                    let e = std::io::Error::last_os_error();
                    tries += 1;
                    if e.raw_os_error() != Some(libc::EBUSY) || tries >= 20 {
                        break Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                };
                if let Err(e) = unmounted {
                    return Err(format!(
                        "{} is still mounted on {point} by a daemon that was killed, and in use \
                         there ({e}); unmount it once the programs using it are done (umount \
                         {point}) and start again",
                        image.display()
                    ));
                }
            }
        }
    }
    // Unmounted, each loop device detaches itself (autoclear) once its last user is gone.
    for _ in 0..100 {
        if loops_over(&image).is_empty() {
            return Ok(true);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "{} is still held by a loop device ({}); detach it (losetup -d) and start again",
        image.display(),
        loops
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The loop devices whose backing file is `image`: (name, major:minor).
fn loops_over(image: &Path) -> Vec<(String, String)> {
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let want = image.as_os_str().to_string_lossy().into_owned();
    dir.flatten()
        .filter_map(|e| {
            let b = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            (b.trim_end() == want).then_some(())?;
            let dev = std::fs::read_to_string(e.path().join("dev")).ok()?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                dev.trim().to_string(),
            ))
        })
        .collect()
}

/// Whether a process has `image` open.
fn open_by_a_process(image: &Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    for p in procs.flatten() {
        if !p
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if std::fs::read_link(fd.path()).is_ok_and(|l| l == image) {
                return true;
            }
        }
    }
    false
}

/// Whether `dir` is a mount point (its device differs from its parent's, or it is `/`).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(m), Ok(p)) = (std::fs::metadata(dir), std::fs::metadata(dir.join(".."))) else {
        return false;
    };
    m.dev() != p.dev() || m.ino() == p.ino()
}

impl Drop for KernelFs {
    fn drop(&mut self) {
        // A process that has just closed a file may still hold the file system for a moment.
        for _ in 0..50 {
            if run(Command::new("umount").arg(&self.mount), "umount").is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Still in use: taken out of the tree now, unmounted by the kernel once the last
        // file is closed (the loop device then detaches itself).
        match run(
            Command::new("umount").arg("-l").arg(&self.mount),
            "umount -l",
        ) {
            Ok(_) => tracing::warn!(
                "{} was busy: detached, and unmounted when its last file closes",
                self.mount.display()
            ),
            Err(e) => tracing::error!("cannot unmount {}: {e}", self.mount.display()),
        }
    }
}
