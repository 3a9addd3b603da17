//! `moneta export`: a file of nvfs (or of a daemon's ext4 or XFS, or a range of a raw
//! daemon's array) served as an NBD export, so that any NBD client
//! (`qemu-img`, `nbdcopy`, `nbdinfo`, `nbdfuse`, the kernel's `nbd-client`, fio's `nbd`
//! engine) reads and writes it unmodified (docs/export.md).
//!
//! The protocol is nbdkit's: this command runs `nbdkit` with the plugin `libmoneta_nbd.so`
//! (crate `moneta-nbd`), which reads and writes the file through a channel of the daemon as
//! the user who runs the command.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::Args;

/// Options of `moneta export`.
#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The file to export: an nvfs path (starting with /), or, on a daemon started with
    /// --kernel-fs, a path of its mount.
    #[arg(required_unless_present = "range", conflicts_with = "range")]
    pub file: Option<PathBuf>,
    /// Export a range of a raw daemon's array instead (`monetad --raw`; its own user or root):
    /// START:LEN in bytes, K/M/G/T suffixes allowed, LEN 0 for the rest of the array.
    #[arg(long)]
    pub range: Option<String>,
    /// The daemon's socket [default: $MONETA_SOCKET or the user's runtime directory].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Serve on this Unix socket instead of TCP (its permissions decide who may connect).
    #[arg(long, conflicts_with_all = ["port", "ip"])]
    pub unix: Option<PathBuf>,
    /// TCP port [default: 10809, NBD's].
    #[arg(long)]
    pub port: Option<u16>,
    /// Address to listen on [default: 127.0.0.1]. Anyone who reaches the export may read (and
    /// write) the file with your rights: open it wider only with TLS (`-- --tls=require
    /// --tls-psk=FILE`).
    #[arg(long)]
    pub ip: Option<String>,
    /// Serve the file read-only (otherwise writable when you may write it).
    #[arg(long)]
    pub readonly: bool,
    /// Stay in the foreground (until interrupted) instead of serving in the background.
    #[arg(long)]
    pub foreground: bool,
    /// Write the server's process id here (a background export is stopped with `kill`).
    #[arg(long)]
    pub pidfile: Option<PathBuf>,
    /// Further nbdkit options (see `nbdkit --help`), after `--`.
    #[arg(last = true)]
    pub extra: Vec<String>,
}

/// `libmoneta_nbd.so`: `$MONETA_NBD_PLUGIN`, else beside this executable, else in `../lib`.
fn plugin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MONETA_NBD_PLUGIN").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("no directory for this executable")?;
    for cand in [
        dir.join("libmoneta_nbd.so"),
        dir.join("../lib/libmoneta_nbd.so"),
    ] {
        if cand.exists() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
    }
    Err(format!(
        "libmoneta_nbd.so not found beside {} (build it with `cargo build --release \
         --workspace`, or set MONETA_NBD_PLUGIN)",
        exe.display()
    ))
}

/// `nbdkit` on `PATH`.
fn nbdkit() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("nbdkit"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "nbdkit is not installed: moneta export serves the file through nbdkit's NBD server \
             (Debian: apt install nbdkit)"
                .to_string()
        })
}

/// Where the export is, as an NBD URI.
fn uri(a: &ExportArgs) -> String {
    match &a.unix {
        Some(u) => format!("nbd+unix:///?socket={}", u.display()),
        None => {
            let ip = a.ip.as_deref().unwrap_or("127.0.0.1");
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_string()
            };
            format!("nbd://{host}:{}", a.port.unwrap_or(10809))
        }
    }
}

/// Runs the export (in the foreground, does not return on success).
pub fn export(a: ExportArgs) -> Result<(), String> {
    let plugin = plugin()?;
    let nbdkit = nbdkit()?;
    let socket = a
        .socket
        .clone()
        .unwrap_or_else(libmoneta::paths::default_socket);
    // What is exported must exist and be reachable now: a mistake is reported here, not to
    // the first client.
    let m = libmoneta::Moneta::connect(&socket).map_err(|e| e.to_string())?;
    let target = match (&a.file, &a.range) {
        (Some(file), None) => {
            if !file.is_absolute() {
                return Err(format!(
                    "{}: the file is an absolute path, starting with /",
                    file.display()
                ));
            }
            check_file(&m, file)?;
            format!("file={}", file.display())
        }
        (None, Some(r)) => {
            // A file system shared with member hosts is the exception: their devices reach its
            // array through this export (docs/distributed.md).
            let shared = libmoneta::Control::connect(&socket)
                .and_then(|c| c.model())
                .is_ok_and(|m| m.get("share.role") == Some("manager"));
            if !shared && (m.statfs().is_ok() || matches!(m.kernel_fs(), Ok(Some(_)))) {
                return Err(
                    "the daemon serves a file system: export its files, not its array (--range \
                     is for a daemon started with --raw, or one that shares its file system with \
                     --share-listen)"
                        .into(),
                );
            }
            format!("range={r}")
        }
        _ => return Err("give a file or --range, one of them".into()),
    };
    drop(m);
    let what = a
        .file
        .as_ref()
        .map(|f| f.display().to_string())
        .unwrap_or_else(|| format!("range {}", a.range.as_deref().unwrap_or("")));
    let mut c = Command::new(nbdkit);
    match &a.unix {
        Some(u) => {
            c.arg("--unix").arg(u);
        }
        None => {
            c.arg("--port")
                .arg(a.port.unwrap_or(10809).to_string())
                .arg("--ipaddr")
                .arg(a.ip.as_deref().unwrap_or("127.0.0.1"));
        }
    }
    if a.readonly {
        c.arg("--readonly");
    }
    let pidfile = match (&a.pidfile, a.foreground) {
        (Some(p), _) => Some(p.clone()),
        (None, true) => None,
        (None, false) => {
            Some(std::env::temp_dir().join(format!("moneta-export-{}.pid", std::process::id())))
        }
    };
    if let Some(p) = &pidfile {
        let _ = std::fs::remove_file(p);
        c.arg("--pidfile").arg(p);
    }
    if a.foreground {
        c.arg("--foreground");
    }
    c.args(&a.extra)
        .arg(&plugin)
        .arg(target)
        .arg(format!("socket={}", socket.display()));
    if a.foreground {
        eprintln!("moneta: serving {what} at {}", uri(&a));
        let e = c.exec();
        return Err(format!("cannot run nbdkit: {e}"));
    }
    // nbdkit forks into the background once it listens, having written the pidfile.
    let status = c.status().map_err(|e| format!("cannot run nbdkit: {e}"))?;
    if !status.success() {
        return Err(format!("nbdkit failed ({status})"));
    }
    let p = pidfile.expect("a pidfile in the background");
    let pid = wait_pid(&p)?;
    if a.pidfile.is_none() {
        let _ = std::fs::remove_file(&p);
    }
    println!("{}", uri(&a));
    eprintln!(
        "moneta: serving {what} at {} (nbdkit, pid {pid}; stop it with `kill {pid}`)",
        uri(&a)
    );
    Ok(())
}

/// A regular file the user may read: of nvfs, or of the kernel's mount on a daemon with
/// `--kernel-fs`.
fn check_file(m: &libmoneta::Moneta, file: &Path) -> Result<(), String> {
    let name = file.display();
    if let Some(k) = m.kernel_fs().map_err(|e| e.to_string())? {
        let real = file.canonicalize().map_err(|e| format!("{name}: {e}"))?;
        if !real.starts_with(&k.mount) {
            return Err(format!(
                "{name}: the daemon serves {} on {}: export a file there",
                k.kind,
                k.mount.display()
            ));
        }
        let f = std::fs::File::open(&real).map_err(|e| format!("{name}: {e}"))?;
        let md = f.metadata().map_err(|e| format!("{name}: {e}"))?;
        if !md.is_file() {
            return Err(format!("{name}: not a regular file"));
        }
        return Ok(());
    }
    let f = m
        .open_flags(file, libc::O_RDONLY, 0)
        .map_err(|e| format!("{name}: {e}"))?;
    let st = f.stat().map_err(|e| format!("{name}: {e}"))?;
    if st.mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{name}: not a regular file"));
    }
    Ok(())
}

/// The process id nbdkit wrote into `p`.
fn wait_pid(p: &Path) -> Result<i32, String> {
    let t = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            return Ok(pid);
        }
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!("nbdkit wrote no process id into {}", p.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
