//! `moneta mount` and `moneta umount`: nvfs through FUSE, so that every program on the machine
//! (statically linked ones, programs the shim cannot reach, other users') sees the files that
//! libmoneta's clients see (docs/mount.md).
//!
//! The server is a libmoneta client of the daemon like any other: `creds.rs` (the connection
//! of each caller, with the caller's credentials), `nodes.rs` (inode numbers to paths),
//! `fs.rs` (the requests), `locks.rs` (record locks onto the permission manager's).

mod creds;
mod fs;
mod locks;
mod nodes;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::Args;
use fuser::{Config, MountOption, SessionACL};
use libmoneta::paths;

/// The file-system subtype of the mounts (`fuse.moneta` when fusermount3 mounts them).
pub const SUBTYPE: &str = "moneta";

/// How the source of a mount begins (then the daemon's socket).
pub const SOURCE_PREFIX: &str = "moneta:";

/// The variable through which a background server tells its parent that the mount is live.
const READY_FD_VAR: &str = "MONETA_MOUNT_READY_FD";

/// Most threads taking requests from the kernel.
const MAX_THREADS: usize = 64;

/// `moneta mount`.
#[derive(Args, Clone, Debug)]
pub struct MountArgs {
    /// An existing directory to mount nvfs on.
    pub mountpoint: PathBuf,
    /// Control socket of the daemon [default: $MONETA_SOCKET or the user's runtime directory].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Serve in the foreground (messages on standard error) until unmounted or stopped by a
    /// signal; without it the server goes to the background once the mount is live.
    #[arg(long)]
    pub foreground: bool,
    /// Threads taking requests from the kernel (1 to 64).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// The background server's log [default: mount.log beside the socket].
    #[arg(long)]
    pub log: Option<PathBuf>,
}

/// `moneta umount`.
#[derive(Args, Clone, Debug)]
pub struct UmountArgs {
    /// Where nvfs is mounted.
    pub mountpoint: PathBuf,
    /// Detach the mount now even if files under it are in use (umount -l); it goes once they
    /// are closed.
    #[arg(long)]
    pub lazy: bool,
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    if p.is_absolute() {
        Ok(p.to_owned())
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .map_err(|e| format!("cannot find the current directory: {e}"))
    }
}

/// `moneta mount`.
pub fn mount(a: MountArgs) -> Result<(), String> {
    if a.threads == 0 || a.threads > MAX_THREADS {
        return Err(format!(
            "--threads {}: between 1 and {MAX_THREADS}",
            a.threads
        ));
    }
    let mountpoint = absolute(&a.mountpoint)?;
    let md = std::fs::metadata(&mountpoint)
        .map_err(|e| format!("cannot use {} as a mount point: {e}", mountpoint.display()))?;
    if !md.is_dir() {
        return Err(format!("{} is not a directory", mountpoint.display()));
    }
    let socket = a.socket.clone().unwrap_or_else(paths::default_socket);
    if a.foreground {
        return serve(&mountpoint, &socket, a.threads);
    }
    background(&a, &mountpoint, &socket)
}

/// Starts the server as a process of its own, detached from this one's session, and returns
/// once it says the mount is live (or why it is not).
fn background(a: &MountArgs, mountpoint: &Path, socket: &Path) -> Result<(), String> {
    let log = a
        .log
        .clone()
        .unwrap_or_else(|| socket.with_file_name("mount.log"));
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("cannot open the log {}: {e}", log.display()))?;
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("pipe: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg("--foreground")
        .arg("--socket")
        .arg(socket)
        .arg("--threads")
        .arg(a.threads.to_string())
        .arg(mountpoint)
        .env(READY_FD_VAR, wr.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    let wr_fd = wr.as_raw_fd();
    // SAFETY: only async-signal-safe calls (setsid, fcntl) between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            rustix::process::setsid()?;
            if libc::fcntl(wr_fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start the mount's server: {e}"))?;
    drop(wr);
    let mut said = String::new();
    let _ = std::fs::File::from(rd).read_to_string(&mut said);
    if said.trim() == "ready" {
        println!(
            "nvfs mounted on {} (server pid {}, log {})",
            mountpoint.display(),
            child.id(),
            log.display()
        );
        return Ok(());
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let why = said.trim();
    if why.is_empty() {
        Err(format!(
            "the mount's server exited ({status}) before the mount was live; see {}",
            log.display()
        ))
    } else {
        Err(why.to_string())
    }
}

/// Tells the parent (`moneta mount` without `--foreground`) how the mount went, if it waits.
fn notify(msg: &str) {
    let Some(fd) = std::env::var(READY_FD_VAR)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    std::env::remove_var(READY_FD_VAR);
    // SAFETY: the descriptor was made for this process by its parent and nothing else here
    // owns it; it is closed once written.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let _ = writeln!(f, "{msg}");
}

/// Mounts and serves until unmounted (or SIGTERM, SIGINT, SIGHUP, which unmount).
fn serve(mountpoint: &Path, socket: &Path, threads: usize) -> Result<(), String> {
    // The server outlives the command that started it: a parent gone before it reads "ready"
    // must not end the server with SIGPIPE. Set before any thread exists.
    // SAFETY: changes one signal's disposition; no thread of this process runs yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let r = serve_inner(mountpoint, socket, threads);
    if let Err(e) = &r {
        notify(e);
    }
    r
}

fn serve_inner(mountpoint: &Path, socket: &Path, threads: usize) -> Result<(), String> {
    let pool = creds::Pool::new(socket)?;
    fs::check_root(&pool)
        .map_err(|e| format!("cannot serve the daemon at {}: {e}", socket.display()))?;
    let root = pool.acts_for_others();
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName(format!("{SOURCE_PREFIX}{}", socket.display())),
        MountOption::Subtype(SUBTYPE.into()),
        // The kernel checks mode bits too (access(2) needs it); the manager checks everything
        // again with the caller's credentials.
        MountOption::DefaultPermissions,
        MountOption::RW,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    // Root acts for every user with their own credentials, so everyone may come in; another
    // user can act only as itself, so only it may.
    config.acl = if root {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(threads);
    config.clone_fd = true;
    let mut session = fuser::Session::new(fs::MountFs::new(pool), mountpoint, &config)
        .map_err(|e| mount_error(mountpoint, &e))?;
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| format!("cannot take signals: {e}"))?;
    let shown = mountpoint.to_owned();
    std::thread::Builder::new()
        .name("moneta-mount-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("moneta mount: signal {sig}: unmounting {}", shown.display());
                if let Err(e) = unmounter.unmount() {
                    eprintln!("moneta mount: cannot unmount {}: {e}", shown.display());
                }
            }
        })
        .map_err(|e| e.to_string())?;
    eprintln!(
        "moneta mount: nvfs of {} on {} ({}), {threads} threads",
        socket.display(),
        mountpoint.display(),
        if root {
            "every user, with their own credentials"
        } else {
            "this user only"
        }
    );
    notify("ready");
    session
        .run()
        .map_err(|e| format!("serving {}: {e}", mountpoint.display()))
}

/// Why mounting failed, and what to do.
fn mount_error(mountpoint: &Path, e: &std::io::Error) -> String {
    let dev = Path::new("/dev/fuse");
    let hint = if !dev.exists() {
        "/dev/fuse is missing: load the fuse module (modprobe fuse)".to_string()
    } else if rustix::fs::access(
        dev,
        rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
    )
    .is_err()
    {
        // The FUSE library opens the device itself before it hands the mount to fusermount3.
        "this user may not open /dev/fuse (distributions make it mode 666 for mounts without \
         root): mount as root, or make /dev/fuse readable and writable by all"
            .to_string()
    } else if rustix::process::geteuid().is_root() {
        "FUSE refused the mount".to_string()
    } else {
        "without root the mount goes through fusermount3 (the fuse3 package), which must be \
         installed and let this user mount there (write access to the mount point)"
            .to_string()
    };
    format!("cannot mount {}: {e}; {hint}", mountpoint.display())
}

/// What is mounted at `path` (the last mount there), from /proc/self/mountinfo: its type and
/// source.
pub fn mounted(path: &Path) -> Option<(String, String)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let mut fields = line.split(' ');
        let Some(point) = fields.nth(4) else { continue };
        if unescape(point) != want {
            continue;
        }
        let mut rest = fields.skip_while(|f| *f != "-").skip(1);
        if let (Some(t), Some(src)) = (rest.next(), rest.next()) {
            found = Some((
                t.to_string(),
                String::from_utf8_lossy(&unescape(src)).into_owned(),
            ));
        }
    }
    found
}

/// Whether a mount of this type and source is a `moneta mount` (mounted directly by root it
/// is of type `fuse`, through fusermount3 `fuse.moneta`; its source names the daemon).
pub fn is_moneta(fstype: &str, source: &str) -> bool {
    (fstype == "fuse" || fstype == format!("fuse.{SUBTYPE}")) && source.starts_with(SOURCE_PREFIX)
}

/// A mountinfo field with its octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = b[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// `moneta umount`.
pub fn umount(a: UmountArgs) -> Result<(), String> {
    // Not canonicalized: the mount of a server that died answers every stat with ENOTCONN.
    let path = absolute(&a.mountpoint)?;
    match mounted(&path) {
        Some((t, src)) if is_moneta(&t, &src) => {}
        Some((t, src)) => {
            return Err(format!(
                "{} is not a moneta mount: {src}, of type {t}",
                path.display()
            ))
        }
        None => return Err(format!("nothing is mounted on {}", path.display())),
    }
    if rustix::process::geteuid().is_root() {
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| "a mount point has no NUL byte".to_string())?;
        let flags = if a.lazy { libc::MNT_DETACH } else { 0 };
        // SAFETY: a NUL-terminated path.
        if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(if e.raw_os_error() == Some(libc::EBUSY) {
                format!(
                    "{} is in use: close the files under it (fuser -m), or use --lazy",
                    path.display()
                )
            } else {
                format!("cannot unmount {}: {e}", path.display())
            });
        }
        return Ok(());
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u");
    if a.lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg(&path).output().map_err(|e| {
        format!("cannot run fusermount3 (from the fuse3 package) to unmount as a user: {e}")
    })?;
    if !out.status.success() {
        return Err(format!(
            "fusermount3 -u {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), b"/a b");
        assert_eq!(unescape(r"/a\134"), b"/a\\");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/end\04"), b"/end\\04");
        let (t, _) = mounted(Path::new("/")).expect("/ is mounted");
        assert!(!t.is_empty());
        assert!(is_moneta("fuse", "moneta:/run/m.sock"));
        assert!(is_moneta("fuse.moneta", "moneta:/run/m.sock"));
        assert!(!is_moneta("fuse", "sshfs#host:"));
        assert!(!is_moneta("ext4", "moneta:/x"));
    }
}
