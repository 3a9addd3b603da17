//! `monetad`: the trusted Moneta device daemon.
//!
//! It wires the emulated device ([`moneta_device`]) to its control server ([`server`]): opens the
//! array, starts the poller, binds the control socket, and runs until asked to stop (a shutdown
//! request from its user or root, `SIGTERM` or `SIGINT`), when in-flight requests finish, the
//! file system checkpoints its journal, the array is flushed, and the socket is removed.

pub mod config;
pub mod kernelfs;
pub mod locks;
pub mod manager;
pub mod server;
pub mod share;
pub mod testing;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{mpsc, Arc};

use moneta_device::{Device, FlushAs, MappedArray, Media, SystemClock};
use moneta_fs::Durability;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};

pub use config::{Args, ArraySource, Config};
pub use server::{Server, Stop};

/// Why the daemon could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Bad settings.
    #[error("{0}")]
    Config(String),
    /// Another daemon already answers on the socket.
    #[error(
        "a monetad is already serving {0}; stop it with `moneta stop` or pick another --socket"
    )]
    AlreadyRunning(std::path::PathBuf),
    /// The array could not be opened.
    #[error(transparent)]
    Media(#[from] moneta_device::MediaError),
    /// The device could not start.
    #[error(transparent)]
    Device(#[from] moneta_device::DeviceError),
    /// The file system could not be formatted or mounted.
    #[error("{0}")]
    Fs(#[from] moneta_fs::MountError),
    /// The socket could not be set up.
    #[error("control socket {path}: {source}")]
    Socket {
        /// Path.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

fn bind_socket(path: &Path, mode: u32) -> Result<std::os::fd::OwnedFd, DaemonError> {
    let err = |source: std::io::Error| DaemonError::Socket {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.exists() {
            private_dir(dir).map_err(err)?;
        }
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        check_socket_dir(dir)
            .map_err(|m| err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, m)))?;
    }
    if let Ok(m) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        // Only a socket is ours to replace: anything else at the path was put there by
        // someone, and is not this daemon's to delete.
        if !m.file_type().is_socket() {
            return Err(err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "a file that is not a socket is in the way; remove it or pick another --socket",
            )));
        }
        if libmoneta::Control::connect(path).is_ok() {
            return Err(DaemonError::AlreadyRunning(path.to_owned()));
        }
        std::fs::remove_file(path).map_err(err)?;
    }
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| err(e.into()))?;
    let addr = SocketAddrUnix::new(path).map_err(|e| err(e.into()))?;
    rustix::net::bind(&fd, &addr).map_err(|e| err(e.into()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(err)?;
    rustix::net::listen(&fd, 256).map_err(|e| err(e.into()))?;
    Ok(fd)
}

/// A file the daemon made, removed when the daemon stops or fails to start.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Creates `dir` (and missing parents) readable by its owner only.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    // The mode given to mkdir is reduced by the umask; the directory must be 0700 exactly.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes the pid file, refusing to overwrite a file that is not one: a pid file holds one
/// decimal number, and anything else at that path belongs to someone else.
pub fn write_pid_file(path: &Path) -> Result<(), String> {
    check_pid_file(path)?;
    // Written aside and renamed into place, so a reader never sees it empty.
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = std::path::PathBuf::from(tmp);
    std::fs::write(&tmp, format!("{}\n", std::process::id()))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("cannot write {}: {e}", path.display())
        })
}

/// Whether `path` is free for a pid file: missing, or a regular file holding one number.
fn check_pid_file(path: &Path) -> Result<(), String> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(format!(
            "{} is not a regular file; remove it or pick another --socket",
            path.display()
        ));
    }
    match std::fs::read(path) {
        Ok(old) => {
            let text = String::from_utf8_lossy(&old);
            if text.trim().parse::<u32>().is_err() {
                return Err(format!(
                    "{} exists and is not a pid file; remove it or pick another --socket",
                    path.display()
                ));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Refuses a socket directory another user could tamper with: it must belong to us (or root)
/// and not be writable by group or others, unless it is sticky like /tmp.
fn check_socket_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).map_err(|e| e.to_string())?;
    let me = rustix::process::geteuid().as_raw();
    if !m.is_dir() {
        return Err("not a directory".into());
    }
    if m.uid() != me && m.uid() != 0 {
        return Err(format!(
            "the directory belongs to uid {}, not to us ({me})",
            m.uid()
        ));
    }
    let sticky = m.mode() & 0o1000 != 0;
    if m.mode() & 0o022 != 0 && !sticky {
        return Err(format!(
            "the directory is writable by others (mode {:o}); use a private directory",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Raises the soft open-file limit to the hard limit: each channel holds descriptors.
fn raise_fd_limit() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if lim.current < lim.maximum {
        let _ = rustix::process::setrlimit(
            rustix::process::Resource::Nofile,
            rustix::process::Rlimit {
                current: lim.maximum,
                maximum: lim.maximum,
            },
        );
    }
}

/// Runs the daemon until it is asked to stop.
pub fn run(config: Config) -> Result<(), DaemonError> {
    // Lease breaks of a kernel file system's files come as a signal every thread blocks (the
    // threads started below inherit the mask), read from a signalfd.
    let break_signal = config
        .kernel_fs
        .is_some()
        .then(kernelfs::block_break_signal);
    // SIGIO would end the process, and the one thing that could send it is a file lease the
    // daemon holds for an instant to learn whether a mapped file's pages are still held
    // (manager/segments.rs) should something open the pages in that instant.
    // SAFETY: setting a signal's disposition to ignore; no handler of ours is replaced.
    unsafe { libc::signal(libc::SIGIO, libc::SIG_IGN) };
    // Handlers first: once the socket exists, a SIGTERM must mean a clean shutdown.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| DaemonError::Config(format!("cannot install signal handlers: {e}")))?;
    raise_fd_limit();
    let pid_path = config::pid_file(&config.socket);
    // Checked before the socket is bound, so a refusal leaves nothing behind.
    check_pid_file(&pid_path).map_err(DaemonError::Config)?;
    if let Some(m) = &config.device.model {
        let warning = moneta_device::model::config::check_emulable(
            m,
            moneta_device::model::config::host_copy_rate(),
        )
        .map_err(DaemonError::Config)?;
        if let Some(w) = warning {
            tracing::warn!("{w}");
        }
    }
    let listener = bind_socket(&config.socket, config.socket_mode)?;
    // The socket is this daemon's from here on: gone again however `run` ends.
    let _socket = RemoveOnDrop(config.socket.clone());
    write_pid_file(&pid_path).map_err(DaemonError::Config)?;
    let _pid = RemoveOnDrop(pid_path.clone());
    let (media, fresh) = match &config.array {
        ArraySource::File(path, size) => {
            let fresh = !path.exists();
            let media = match MappedArray::open_file(path, *size) {
                // A daemon killed while its kernel file system was mounted left the mount
                // holding the array: free it, when nothing else uses it, and try again.
                Err(moneta_device::MediaError::Busy(p))
                    if config.kernel_fs.is_some()
                        && kernelfs::release_stale(&p).map_err(DaemonError::Config)? =>
                {
                    MappedArray::open_file(path, *size)?
                }
                r => r?,
            };
            (media, fresh)
        }
        ArraySource::Volatile(size) => (MappedArray::volatile(*size)?, true),
    };
    let media = Arc::new(media);
    // A kernel file system takes nvfs's place on the array.
    let kernel_fs = match &config.kernel_fs {
        Some((kind, mount)) => Some(
            kernelfs::KernelFs::attach(
                *kind,
                media.backing(),
                moneta_device::Media::size(&*media),
                fresh,
                mount,
            )
            .map_err(DaemonError::Config)?,
        ),
        None => None,
    };
    // What the file system and the engine write through: the array, or (a test hook) the
    // array with a copy of every flushed range kept aside.
    let shared: Arc<dyn Media> = match &config.durable_shadow {
        Some(path) => Arc::new(
            testing::DurableShadow::new(media.clone(), path)
                .map_err(|e| DaemonError::Config(format!("--durable-shadow: {e}")))?,
        ),
        None => media.clone(),
    };
    let fs = if config.raw || kernel_fs.is_some() {
        None
    } else {
        if fresh {
            // A new array (a file this call created, or memory) gets a file system at once.
            let opts = moneta_fs::MkfsOptions {
                chunk_size: config.chunk_size,
                root_uid: rustix::process::geteuid().as_raw(),
                root_gid: rustix::process::getegid().as_raw(),
                data_checksums: config.data_checksums,
                ..Default::default()
            };
            moneta_fs::mkfs(&*shared, &opts)?;
        }
        let opts = moneta_fs::MountOptions {
            durability: config.durability,
            append_reserve: config.append_reserve,
            // A file this call created, or memory: its free space reads as zeros.
            fresh,
            // Memory goes with this process: no mount will ever replay a log of it.
            volatile: matches!(config.array, ArraySource::Volatile(_)),
        };
        Some(moneta_fs::Fs::mount_with(shared.clone(), opts)?)
    };
    let array_size = moneta_device::Media::size(&*media);
    // The device keeps the file system's data checksums, when it has them.
    let mut device_config = config.device.clone();
    device_config.integrity = fs.as_ref().and_then(|f| f.integrity());
    // At the device level a channel's FLUSH and the engine's stop leave the backing file to
    // the host's writeback: the array's own persistence is all the level promises. At the
    // host level they flush through the array's last flush lane, the group commit through the
    // others (both through the one where there is only one).
    let lanes = shared.flush_lanes().max(1);
    let commit_lanes = (lanes - 1).max(1);
    let device = Arc::new(match config.durability {
        Durability::Device => Device::start(
            device_config,
            FlushAs::device(shared.clone()),
            SystemClock::best(),
        )?,
        Durability::Host => Device::start(
            device_config,
            FlushAs::lane(shared.clone(), lanes - 1),
            SystemClock::best(),
        )?,
    });
    if let Some(cpu) = config.device.poller_cpu {
        // A poller with a CPU of its own has it to itself: the daemon's threads started from
        // here on (connections, the reaper) run elsewhere, as the clients' libmoneta keeps
        // theirs. (The device checked the CPU against this thread's mask, so only now.)
        if let Err(e) = libmoneta::affinity::keep_thread_off(None, cpu) {
            tracing::warn!("cannot keep the daemon's threads off CPU {cpu}: {e}");
        }
    }
    // A persistent array's mapped files keep their pages beside it.
    let pages = match &config.array {
        ArraySource::File(path, _) => {
            let mut name = path.as_os_str().to_owned();
            name.push(".pages");
            Some(std::path::PathBuf::from(name))
        }
        ArraySource::Volatile(_) => None,
    };
    let manager = match fs {
        Some(fs) => Some(
            manager::Manager::new(fs, device.clone(), pages, commit_lanes)
                .map_err(|e| DaemonError::Config(format!("mapped files' pages: {e}")))?,
        ),
        None => None,
    };
    let share = match (&config.share, &manager) {
        (Some(config::ShareConfig::Listen { addr, key }), Some(m)) => {
            let key = share::link::Key::load(key).map_err(DaemonError::Config)?;
            let holder = share::Holder::start(addr, key, m.clone(), device.clone(), array_size)
                .map_err(DaemonError::Config)?;
            tracing::info!(listen = %addr, "sharing the file system with member hosts");
            Some(server::Share::Holder(holder))
        }
        (Some(config::ShareConfig::From { addr, key }), None) => {
            let key = share::link::Key::load(key).map_err(DaemonError::Config)?;
            let ranges = config
                .device
                .members
                .iter()
                .map(|m| (m.start, m.len))
                .collect();
            // What the member's fence may wait for: its longest forwarded command.
            let fence = config
                .device
                .members
                .iter()
                .map(|m| m.timeout)
                .max()
                .unwrap_or_default();
            let member = share::Member::start(addr, key, device.clone(), ranges, fence)
                .map_err(DaemonError::Config)?;
            Some(server::Share::Member(member))
        }
        (None, _) => None,
        _ => unreachable!("the configuration pairs a share with the right file system"),
    };
    let stop_share = share.clone();
    let kernel_files = match (&kernel_fs, break_signal) {
        (Some(k), Some(signal)) => {
            let files = Arc::new(kernelfs::Files::new(
                device.clone(),
                k.kind,
                k.dev,
                k.mount.clone(),
                signal,
            ));
            kernelfs::start_watcher(files.clone(), signal)
                .map_err(|e| DaemonError::Config(format!("cannot start the lease watcher: {e}")))?;
            tracing::info!(
                kind = k.kind.name(),
                mount = %k.mount.display(),
                device = %k.loop_device.display(),
                formatted = k.formatted,
                "kernel file system mounted"
            );
            Some(files)
        }
        _ => None,
    };
    let stopping = manager.clone();
    if let Some(m) = &manager {
        m.start_reaper()
            .map_err(|e| DaemonError::Config(format!("cannot start the bundle reaper: {e}")))?;
    }
    let (stop_tx, stop_rx) = mpsc::channel();
    let server = Arc::new(
        Server::new(
            device.clone(),
            manager,
            rustix::process::geteuid().as_raw(),
            config.socket.clone(),
            stop_tx.clone(),
        )
        .polling(libmoneta::affinity::worth_polling(config.device.poller_cpu))
        .shares(config.shares)
        .kernel_files(kernel_files.clone())
        .share(share),
    );
    std::thread::Builder::new()
        .name("moneta-accept".into())
        .spawn(move || {
            let _stop = moneta_device::failstop::FailStop::new("control server");
            server.serve(listener)
        })
        .map_err(|e| DaemonError::Config(format!("cannot start the control server: {e}")))?;
    std::thread::Builder::new()
        .name("moneta-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let _ = stop_tx.send(Stop::Signal(sig));
            }
        })
        .map_err(|e| DaemonError::Config(format!("cannot start the signal thread: {e}")))?;
    tracing::info!(
        socket = %config.socket.display(),
        array = ?config.array,
        size = array_size,
        pid = std::process::id(),
        "monetad ready"
    );
    let why = stop_rx.recv().unwrap_or(Stop::Requested);
    tracing::info!(?why, "stopping");
    // Records revoked and leases given back while the device still runs.
    if let Some(files) = &kernel_files {
        files.shutdown();
    }
    if let Some(server::Share::Member(m)) = &stop_share {
        m.stop();
    }
    // Idempotent: after a shutdown request the device has already stopped.
    let _ = device.shutdown();
    if let Some(m) = stopping {
        if let Err(e) = m.unmount() {
            tracing::error!("the file system could not checkpoint its journal: {e}");
        }
    }
    // Unmounted (the kernel writes the file system's last changes into the array), and the
    // loop device detached.
    drop(kernel_fs);
    // At every level a clean stop leaves the whole array on the host's disk.
    if let Err(e) = shared.flush(0, array_size) {
        tracing::error!("cannot flush the array: {e}");
    }
    tracing::info!("stopped: array flushed");
    Ok(())
}
