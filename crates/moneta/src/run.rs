//! `moneta run`: a program with the libmoneta shim preloaded, so that its files under the
//! mount prefix (default `/moneta`) are Moneta files, with no change to the program.
//!
//! The daemon is started on the default device if none answers at the socket. Programs the
//! dynamic linker would not preload into are refused rather than run without the shim: a
//! statically linked executable (no `PT_INTERP`), and a set-user-ID or set-group-ID one (the
//! linker ignores `LD_PRELOAD` for them). A script is judged by its interpreter.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use clap::Args;
use libmoneta::{paths, Control};

/// Options of `moneta run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The daemon's socket [default: $MONETA_SOCKET or the user's runtime directory].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Where Moneta files appear [default: $MONETA_MOUNT, or where a daemon with --kernel-fs
    /// mounted its file system, or /moneta].
    #[arg(long)]
    pub mount: Option<PathBuf>,
    /// Fail instead of starting a daemon when none is running.
    #[arg(long)]
    pub no_start: bool,
    /// Print a summary of what the shim did at the program's exit (MONETA_REPORT=1).
    #[arg(long)]
    pub report: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<OsString>,
}

/// `libmoneta.so`: `$MONETA_LIB`, else beside this executable, else in `../lib`.
pub fn library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MONETA_LIB").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = exe.parent().ok_or("no directory for this executable")?;
    for cand in [dir.join("libmoneta.so"), dir.join("../lib/libmoneta.so")] {
        if cand.exists() {
            return Ok(cand.canonicalize().unwrap_or(cand));
        }
    }
    Err(format!(
        "libmoneta.so not found beside {} (build it with `cargo build --release --workspace`, \
         or set MONETA_LIB)",
        exe.display()
    ))
}

/// The file `cmd` names, searched on `PATH` when it has no slash.
fn resolve(cmd: &Path) -> Result<PathBuf, String> {
    if cmd.as_os_str().as_encoded_bytes().contains(&b'/') {
        return Ok(cmd.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let cand = dir.join(cmd);
        if let Ok(m) = std::fs::metadata(&cand) {
            if m.is_file() && m.mode() & 0o111 != 0 {
                return Ok(cand);
            }
        }
    }
    Err(format!("{}: command not found", cmd.display()))
}

/// Why the shim could not reach `file`, if it could not.
fn refusal(file: &Path, depth: u32) -> Result<Option<String>, String> {
    let meta = std::fs::metadata(file).map_err(|e| format!("{}: {e}", file.display()))?;
    if meta.mode() & (libc::S_ISUID | libc::S_ISGID) != 0 {
        return Ok(Some(format!(
            "{} is set-user-ID or set-group-ID: the dynamic linker ignores LD_PRELOAD for it, \
             so its Moneta files would not be Moneta's",
            file.display()
        )));
    }
    let mut head = [0u8; 4096];
    let n = {
        use std::io::Read;
        let mut f = std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
        f.read(&mut head).map_err(|e| e.to_string())?
    };
    let head = &head[..n];
    if head.starts_with(b"#!") && depth < 4 {
        let line = head[2..].split(|&b| b == b'\n').next().unwrap_or(&[]);
        let interp = String::from_utf8_lossy(line);
        let interp = interp.split_whitespace().next().unwrap_or("");
        if interp.is_empty() {
            return Ok(None);
        }
        return refusal(Path::new(interp), depth + 1);
    }
    if libmoneta::program::is_elf(head) && !libmoneta::program::has_interp(head) {
        return Ok(Some(format!(
            "{} is statically linked: LD_PRELOAD cannot reach it, so its Moneta files would \
             not be Moneta's",
            file.display()
        )));
    }
    Ok(None)
}

/// Where the daemon at `socket` mounted the kernel file system it serves (`monetad
/// --kernel-fs`), if it serves one.
fn kernel_fs_mount(socket: &Path) -> Option<PathBuf> {
    use libmoneta::moneta_abi::control::{ReplyBody, Request};
    use libmoneta::moneta_abi::kfsproto::{KfsReply, KfsRequest};
    use std::os::unix::ffi::OsStrExt;
    let c = Control::connect(socket).ok()?;
    match c.call(&Request::Kfs(KfsRequest::Info)).ok()?.0 {
        ReplyBody::Kfs(KfsReply::Info { mount, .. }) => {
            Some(PathBuf::from(std::ffi::OsStr::from_bytes(&mount)))
        }
        _ => None,
    }
}

/// Runs the program (does not return on success).
pub fn run(a: RunArgs) -> Result<(), String> {
    let lib = library()?;
    let cmd = PathBuf::from(&a.command[0]);
    let file = resolve(&cmd)?;
    if let Some(why) = refusal(&file, 0)? {
        return Err(why);
    }
    let socket = a.socket.clone().unwrap_or_else(paths::default_socket);
    if Control::connect(&socket).is_err() {
        if a.no_start {
            return Err(format!(
                "no monetad answers at {} (start one with `moneta start`)",
                socket.display()
            ));
        }
        let device = paths::default_device();
        let log = socket.with_extension("log");
        crate::daemon::start(
            &socket,
            &["--device".into(), device.display().to_string()],
            &log,
        )?;
        eprintln!("moneta: started monetad at {}", socket.display());
    }
    let mut preload = lib.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut c = std::process::Command::new(&file);
    c.arg0(&a.command[0]).args(&a.command[1..]);
    c.env("LD_PRELOAD", preload).env("MONETA_SOCKET", &socket);
    if let Some(m) = &a.mount {
        c.env("MONETA_MOUNT", m);
    } else if std::env::var_os("MONETA_MOUNT").is_none() {
        // A daemon serving ext4 or XFS: its files are where the kernel mounted it.
        if let Some(m) = kernel_fs_mount(&socket) {
            c.env("MONETA_MOUNT", m);
        }
    }
    if a.report {
        c.env("MONETA_REPORT", "1");
    }
    let e = c.exec();
    Err(format!("cannot run {}: {e}", file.display()))
}
