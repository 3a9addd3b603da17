//! An nbdkit plugin that serves a file of a Moneta daemon, or a range of a raw daemon's array,
//! as an NBD export, so that every NBD client (`qemu-img`, `nbdcopy`, `nbdinfo`, `nbdfuse`, the
//! kernel's `nbd-client`, fio's `nbd` engine) reads and writes it unmodified. nbdkit speaks the
//! protocol (newstyle negotiation, structured replies, several connections, TLS if asked); the
//! plugin reads and writes through libmoneta's channel.
//!
//! ```sh
//! nbdkit libmoneta_nbd.so file=/nvfs/path [socket=/path/to/monetad.sock]
//! nbdkit libmoneta_nbd.so file=/mnt/moneta/disk.img socket=...   # monetad --kernel-fs
//! nbdkit libmoneta_nbd.so range=0:1G socket=...                   # monetad --raw, its owner
//! ```
//!
//! `moneta export` runs it. The nbdkit process connects to the daemon as the user who runs
//! it, so the export's rights are that user's rights on the file: a file the user may only
//! read is exported read-only. On a daemon serving ext4 or XFS (`--kernel-fs`) the file is a
//! path of its mount, opened through the kernel and handed to the daemon. A range of the array
//! is for a raw daemon's own user (who may grant records), never under a file system. FLUSH
//! is an `fsync` of the file (durable as the daemon's durability level says), or a FLUSH of the
//! range; a write with FUA is followed by the same; several connections see each other's
//! writes at once (they all go to the same array), so the export offers multi-connection.
//! TRIM is not offered (no hole punching), and WRITE_ZEROES is written zeros (nbdkit's own
//! emulation).

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use libmoneta::moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};
use libmoneta::moneta_abi::Completion;
use libmoneta::{Channel, ClientError, File, KernelFile, Moneta};
use nbdkit::{plugin, CacheFlags, Error, Flags, FuaFlags, Result, Server, ThreadModel};

/// The plugin's settings (`key=value` on nbdkit's command line).
struct Settings {
    socket: Option<PathBuf>,
    file: Option<PathBuf>,
    /// `range=START:LEN` (array bytes; `LEN` 0: to the end).
    range: Option<(u64, u64)>,
}

static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    socket: None,
    file: None,
    range: None,
});

/// A raw daemon's array range, granted to a channel: the plugin's one channel, or, on the
/// array of a shared file system, one channel per client connection.
struct Raw {
    ch: Arc<Channel>,
    start: u64,
    len: u64,
    write: bool,
    /// The array of a shared file system (`monetad --share-listen`), served to its members'
    /// devices: the manager's revocations take the range's records away from every channel,
    /// this one's too (after the commands in flight on the freed space complete), and the
    /// range is granted again when a command misses them, unless the manager has cut the
    /// members' export connections off since this connection began (`share.cuts` moved): then
    /// the connection ends, since what comes on it may be a request its member gave up on.
    shared: Option<Cuts>,
}

/// A shared array's connection: the manager's count of cuts when it began, and whether a cut
/// has since ended it.
///
/// A command runs under `turn` shared; a grant, with the checks of the count around it, runs
/// under `turn` alone. So no command of the connection runs between a grant made after a cut
/// and the check that ends the connection: a command either ran before the cut's removal of
/// every record (which waits for it) or finds the connection ended.
struct Cuts {
    at_open: u64,
    cut: std::sync::atomic::AtomicBool,
    turn: std::sync::RwLock<()>,
}

impl Cuts {
    fn ended(&self) -> bool {
        self.cut.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn end(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Raw {
    /// The manager's count of cuts (`share.cuts`), if it can be read.
    fn cuts(&self) -> Option<u64> {
        self.ch
            .control()
            .model()
            .ok()?
            .get("share.cuts")?
            .parse()
            .ok()
    }

    fn grant(&self) -> std::result::Result<(), ClientError> {
        self.ch.control().grant(Grant {
            channel: self.ch.id(),
            rights: if self.write {
                RIGHT_READ | RIGHT_WRITE
            } else {
                RIGHT_READ
            },
            start: self.start,
            len: self.len,
            file: 0,
        })
    }

    /// Whether no cut came since the connection began (a count that cannot be read counts
    /// as a cut).
    fn current(&self, c: &Cuts) -> bool {
        self.cuts() == Some(c.at_open)
    }

    /// Runs `op`; on a shared file system's array, once more after granting the range again
    /// if a revocation took its records, while no cut came since the connection began.
    fn run(&self, mut op: impl FnMut() -> std::result::Result<(), ClientError>) -> Result<()> {
        let Some(c) = &self.shared else {
            return op().map_err(err);
        };
        // NBD_ESHUTDOWN: the client is to connect again (a member's link does).
        let ended = || {
            Error::new(
                libc::ESHUTDOWN,
                "the manager cut the members' export connections off; connect again",
            )
        };
        let shared = || c.turn.read().unwrap_or_else(|e| e.into_inner());
        let first = {
            let _turn = shared();
            if c.ended() {
                return Err(ended());
            }
            op()
        };
        match first {
            Err(ClientError::Status(libmoneta::moneta_abi::Status::PermissionMiss)) => {
                {
                    let _alone = c.turn.write().unwrap_or_else(|e| e.into_inner());
                    // Checked before the grant and after it: a cut that comes later takes the
                    // new records too, after the commands then in flight completed.
                    if c.ended() || !self.current(c) {
                        c.end();
                        return Err(ended());
                    }
                    self.grant().map_err(err)?;
                    if !self.current(c) {
                        c.end();
                        return Err(ended());
                    }
                }
                let _turn = shared();
                if c.ended() {
                    return Err(ended());
                }
                op().map_err(err)
            }
            r => r.map_err(err),
        }
    }
}

/// Whether the daemon at `socket` shares its file system with member hosts
/// (`monetad --share-listen`).
fn shares_its_file_system(socket: &std::path::Path) -> bool {
    libmoneta::Control::connect(socket)
        .and_then(|c| c.model())
        .is_ok_and(|m| m.get("share.role") == Some("manager"))
}

static RAW: OnceLock<std::result::Result<Arc<Raw>, (i32, String)>> = OnceLock::new();

/// Parses a size with an optional K, M, G or T suffix (powers of 1024).
fn size(s: &str) -> Option<u64> {
    let (num, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        b'T' | b't' => (&s[..s.len() - 1], 40),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// The daemon connection, made at the first client (after nbdkit forks into the background).
static CONN: OnceLock<Moneta> = OnceLock::new();

fn settings() -> std::sync::MutexGuard<'static, Settings> {
    SETTINGS.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(e: ClientError) -> Error {
    Error::new(e.errno(), e.to_string())
}

fn conn() -> Result<&'static Moneta> {
    if let Some(m) = CONN.get() {
        return Ok(m);
    }
    let socket = settings()
        .socket
        .clone()
        .unwrap_or_else(libmoneta::paths::default_socket);
    let m = Moneta::connect(&socket).map_err(err)?;
    // Another connection may have raced this one: keep the first.
    let _ = CONN.set(m);
    Ok(CONN.get().expect("set above"))
}

/// What one client connection reads and writes.
enum Backend {
    /// A file of nvfs, opened for the connection.
    Nvfs(Box<File>),
    /// A file of the daemon's ext4 or XFS, opened through the kernel for the connection.
    Kernel(KernelFile),
    /// The raw range.
    Raw(Arc<Raw>),
}

/// One client connection.
struct Export {
    backend: Backend,
    write: bool,
}

/// Whether the daemon shares its file system, learned at the first client connection.
static SHARED: OnceLock<std::result::Result<bool, (i32, String)>> = OnceLock::new();

/// The raw range: granted the first time to the whole plugin's channel, or, on a shared file
/// system's array, to a channel of this client connection's own.
fn raw(start: u64, len: u64, readonly: bool) -> Result<Arc<Raw>> {
    let socket = settings()
        .socket
        .clone()
        .unwrap_or_else(libmoneta::paths::default_socket);
    let shared = SHARED
        .get_or_init(|| {
            let m = Moneta::connect(&socket).map_err(|e| (e.errno(), e.to_string()))?;
            // Never under a file system, which the range would overwrite, unless the file
            // system is shared with member hosts: their devices write its files' bytes through
            // the range under the records its manager gives them (docs/distributed.md).
            let shared = shares_its_file_system(&socket);
            if !shared && (m.statfs().is_ok() || matches!(m.kernel_fs(), Ok(Some(_)))) {
                return Err((
                    libc::EINVAL,
                    "the daemon serves a file system: export its files (file=), not its array"
                        .into(),
                ));
            }
            Ok(shared)
        })
        .clone()
        .map_err(|(e, m)| Error::new(e, m))?;
    let open = || -> std::result::Result<Arc<Raw>, (i32, String)> {
        let ch = Channel::open(&socket).map_err(|e| (e.errno(), e.to_string()))?;
        let size = ch.info().array_size;
        let len = if len == 0 {
            size.saturating_sub(start)
        } else {
            len
        };
        if len == 0 || start.checked_add(len).is_none_or(|e| e > size) {
            return Err((
                libc::EINVAL,
                format!("range {start}+{len} is not inside the array ({size} bytes)"),
            ));
        }
        let mut r = Raw {
            ch: Arc::new(ch),
            start,
            len,
            write: !readonly,
            shared: None,
        };
        if shared {
            // The count first: a cut after it takes the grant below too.
            let at_open = r.cuts().ok_or((
                libc::EIO,
                "the daemon's count of cuts (share.cuts) cannot be read".to_string(),
            ))?;
            r.shared = Some(Cuts {
                at_open,
                cut: std::sync::atomic::AtomicBool::new(false),
                turn: std::sync::RwLock::new(()),
            });
        }
        r.grant().map_err(|e| (e.errno(), e.to_string()))?;
        if let Some(c) = r.shared.as_ref().filter(|c| !r.current(c)) {
            // A cut came between the count and the grant, and may have missed the grant: the
            // connection serves nothing (its client connects again).
            c.end();
        }
        Ok(Arc::new(r))
    };
    if shared {
        return open().map_err(|(e, m)| Error::new(e, m));
    }
    RAW.get_or_init(open)
        .as_ref()
        .map(Arc::clone)
        .map_err(|(e, m)| Error::new(*e, m.clone()))
}

impl Server for Export {
    fn name() -> &'static str {
        "moneta"
    }

    fn description() -> Option<&'static str> {
        Some("a file of a Moneta daemon's nvfs, read and written through its channel")
    }

    fn magic_config_key() -> Option<&'static str> {
        Some("file")
    }

    fn config_help() -> Option<&'static str> {
        Some(
            "file=<PATH>         the file to export: an nvfs path, or a path of the mount of a \
             daemon with --kernel-fs\n\
             range=<START:LEN>   or a range of a raw daemon's array (its own user only)\n\
             socket=<PATH>       the daemon's control socket (default: the user's)",
        )
    }

    fn config(key: &str, value: &str) -> Result<()> {
        let mut s = settings();
        match key {
            "file" if value.starts_with('/') => s.file = Some(PathBuf::from(value)),
            "file" => {
                return Err(Error::new(
                    libc::EINVAL,
                    "file= takes an absolute path, starting with /",
                ))
            }
            "socket" => s.socket = Some(PathBuf::from(value)),
            "range" => {
                let parsed = value
                    .split_once(':')
                    .and_then(|(a, b)| Some((size(a)?, size(b)?)));
                match parsed {
                    Some(r) => s.range = Some(r),
                    None => {
                        return Err(Error::new(
                            libc::EINVAL,
                            "range= takes START:LEN in bytes (K, M, G, T suffixes; LEN 0: to \
                             the end)",
                        ))
                    }
                }
            }
            _ => {
                return Err(Error::new(
                    libc::EINVAL,
                    format!("unknown parameter {key} (file=, range=, socket=)"),
                ))
            }
        }
        Ok(())
    }

    fn config_complete() -> Result<()> {
        let s = settings();
        match (&s.file, &s.range) {
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => Err(Error::new(
                libc::EINVAL,
                "give file=<path> or range=<START:LEN>, one of them",
            )),
        }
    }

    fn thread_model() -> Result<ThreadModel> {
        Ok(ThreadModel::Parallel)
    }

    fn open(readonly: bool) -> Result<Box<dyn Server>> {
        let (file, range) = {
            let s = settings();
            (s.file.clone(), s.range)
        };
        if let Some((start, len)) = range {
            let r = raw(start, len, readonly)?;
            let write = r.write && !readonly;
            return Ok(Box::new(Export {
                backend: Backend::Raw(r),
                write,
            }));
        }
        let path = file.expect("checked by config_complete");
        let m = conn()?;
        if m.kernel_fs().map_err(err)?.is_some() {
            return open_kernel(m, &path, readonly);
        }
        let (file, write) = if readonly {
            (m.open_flags(&path, libc::O_RDONLY, 0).map_err(err)?, false)
        } else {
            match m.open_flags(&path, libc::O_RDWR, 0) {
                Ok(f) => (f, true),
                // The user may only read it: a read-only export.
                Err(e) if matches!(e.errno(), libc::EACCES | libc::EPERM | libc::EROFS) => {
                    (m.open_flags(&path, libc::O_RDONLY, 0).map_err(err)?, false)
                }
                Err(e) => return Err(err(e)),
            }
        };
        Ok(Box::new(Export {
            backend: Backend::Nvfs(Box::new(file)),
            write,
        }))
    }

    fn get_size(&self) -> Result<i64> {
        Ok(match &self.backend {
            Backend::Nvfs(f) => f.len().map_err(err)?,
            Backend::Kernel(f) => f.len().map_err(err)?,
            Backend::Raw(r) => r.len,
        } as i64)
    }

    fn can_write(&self) -> Result<bool> {
        Ok(self.write)
    }

    fn can_flush(&self) -> Result<bool> {
        Ok(true)
    }

    fn can_fua(&self) -> Result<FuaFlags> {
        Ok(FuaFlags::Native)
    }

    fn can_multi_conn(&self) -> Result<bool> {
        Ok(true)
    }

    fn is_rotational(&self) -> Result<bool> {
        Ok(false)
    }

    fn can_cache(&self) -> Result<CacheFlags> {
        // A hint fills the device's DRAM buffer (WILLNEED); a kernel file's pages are the
        // kernel's to read ahead.
        Ok(match &self.backend {
            Backend::Kernel(_) => CacheFlags::None,
            Backend::Nvfs(_) | Backend::Raw(_) => CacheFlags::Native,
        })
    }

    fn cache(&self, count: u32, offset: u64) -> Result<()> {
        match &self.backend {
            Backend::Nvfs(f) => f.will_need(offset, u64::from(count)).map_err(err),
            Backend::Raw(r) => {
                let len = u64::from(count).min(r.len.saturating_sub(offset));
                r.ch.will_need(r.start + offset, len, Completion::Dma)
                    .map_err(err)
            }
            Backend::Kernel(_) => Ok(()),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let at = offset + done as u64;
            let n = match &self.backend {
                Backend::Nvfs(f) => f.read_at(&mut buf[done..], at).map_err(err)?,
                Backend::Kernel(f) => f.read_at(&mut buf[done..], at).map_err(err)?,
                Backend::Raw(r) => {
                    let rest = &mut buf[done..];
                    r.run(|| r.ch.read_pipelined(r.start + at, rest, Completion::Dma))?;
                    buf.len() - done
                }
            };
            if n == 0 {
                // The file shrank under the export: what is past its end reads as zeros.
                buf[done..].fill(0);
                break;
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: Flags) -> Result<()> {
        match &self.backend {
            Backend::Nvfs(f) => {
                let mut done = 0;
                while done < buf.len() {
                    done += f
                        .write_at(&buf[done..], offset + done as u64)
                        .map_err(err)?;
                }
            }
            Backend::Kernel(f) => f.write_at(buf, offset).map_err(err)?,
            Backend::Raw(r) => {
                r.run(|| r.ch.write_pipelined(r.start + offset, buf, Completion::Dma))?
            }
        }
        if flags.contains(Flags::FUA) {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        match &self.backend {
            Backend::Nvfs(f) => f.sync_all().map_err(err),
            Backend::Kernel(f) => f.sync().map_err(err),
            Backend::Raw(r) => r.run(|| r.ch.flush(r.start, r.len, Completion::Dma)),
        }
    }
}

/// A file of the daemon's kernel file system, opened through the kernel (which checks the
/// user's rights) and handed to the daemon.
fn open_kernel(m: &Moneta, path: &std::path::Path, readonly: bool) -> Result<Box<dyn Server>> {
    use std::os::fd::OwnedFd;
    let open = |flags: i32| -> std::io::Result<OwnedFd> {
        Ok(std::fs::OpenOptions::new()
            .read(true)
            .write(flags == libc::O_RDWR)
            .open(path)?
            .into())
    };
    let (fd, write) = if readonly {
        (open(libc::O_RDONLY)?, false)
    } else {
        match open(libc::O_RDWR) {
            Ok(fd) => (fd, true),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES | libc::EPERM | libc::EROFS)
                ) =>
            {
                (open(libc::O_RDONLY)?, false)
            }
            Err(e) => return Err(e.into()),
        }
    };
    let file = KernelFile::adopt(m, fd).map_err(err)?;
    Ok(Box::new(Export {
        backend: Backend::Kernel(file),
        write,
    }))
}

/// nbdkit's entry point (`plugin_init`), made by the nbdkit crate.
#[allow(missing_docs)]
mod entry {
    use super::*;

    plugin!(Export {
        thread_model,
        config,
        config_complete,
        write_at,
        flush,
        can_write,
        can_flush,
        can_fua,
        can_multi_conn,
        is_rotational,
        can_cache,
        cache
    });
}
