//! Starting, stopping and finding `monetad`.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use libmoneta::Control;

/// The `monetad` binary: `$MONETAD`, else beside this executable, else on `PATH`.
pub fn monetad_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MONETAD").filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        let sibling = exe.with_file_name("monetad");
        if sibling.exists() {
            return sibling;
        }
    }
    PathBuf::from("monetad")
}

/// A daemon this command started, with its socket and pid.
pub struct Started {
    /// Control socket.
    pub socket: PathBuf,
    /// Process id.
    pub pid: u32,
    /// Log file.
    pub log: PathBuf,
}

/// Starts `monetad` in the background with `args` (which must not name --socket) on `socket`,
/// its output going to `log`; returns once it answers.
pub fn start(socket: &Path, args: &[String], log: &Path) -> Result<Started, String> {
    if Control::connect(socket).is_ok() {
        return Err(format!(
            "a monetad is already running at {}",
            socket.display()
        ));
    }
    if let Some(dir) = log.parent().filter(|d| !d.exists()) {
        // The daemon's directory is private: whom else it serves is decided by the socket's
        // mode (monetad --socket-mode), not by a directory left open.
        monetad::private_dir(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    // The log names files and users: readable by the daemon's user only.
    let logf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .map_err(|e| format!("cannot open log {}: {e}", log.display()))?;
    logf.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot make the log {} private: {e}", log.display()))?;
    let bin = monetad_binary();
    let mut cmd = Command::new(&bin);
    cmd.args(args)
        .arg("--socket")
        .arg(socket)
        .stdin(Stdio::null())
        .stdout(logf.try_clone().map_err(|e| e.to_string())?)
        .stderr(logf);
    // Detach from our session so the daemon outlives this command and its terminal.
    // SAFETY: setsid is async-signal-safe and touches no state of the parent.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            rustix::process::setsid().map(|_| ()).map_err(Into::into)
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot run {}: {e} (build it with `cargo build --release`, or set MONETAD)",
            bin.display()
        )
    })?;
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Ok(Some(status)) = child.try_wait() {
            let tail = std::fs::read_to_string(log).unwrap_or_default();
            let last: Vec<&str> = tail.lines().rev().take(5).collect();
            return Err(format!(
                "monetad exited ({status}): {}",
                last.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        if Control::connect(socket).and_then(|c| c.ping()).is_ok() {
            return Ok(Started {
                socket: socket.to_owned(),
                pid: child.id(),
                log: log.to_owned(),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    Err(format!(
        "monetad did not answer on {} within 20 s; see {}",
        socket.display(),
        log.display()
    ))
}

/// Asks the daemon at `socket` to shut down and waits until its socket is gone.
pub fn stop(socket: &Path) -> Result<(), String> {
    let ctl = Control::connect(socket).map_err(|e| e.to_string())?;
    ctl.shutdown()
        .map_err(|e| format!("shutdown refused: {e}"))?;
    let t = Instant::now();
    while socket.exists() {
        if t.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "monetad did not remove {} within 20 s",
                socket.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
