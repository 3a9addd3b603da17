//! An nbdkit plugin that serves one file of a Moneta daemon's nvfs as an NBD export, so that
//! every NBD client (`qemu-img`, `nbdcopy`, `nbdinfo`, `nbdfuse`, the kernel's `nbd-client`,
//! fio's `nbd` engine) reads and writes it unmodified. nbdkit speaks the protocol (newstyle
//! negotiation, structured replies, several connections, TLS if asked); the plugin reads and
//! writes through libmoneta's channel.
//!
//! ```sh
//! nbdkit libmoneta_nbd.so file=/nvfs/path [socket=/path/to/monetad.sock]
//! ```
//!
//! `moneta export` runs it. The nbdkit process connects to the daemon as the user who runs
//! it, so the export's rights are that user's rights on the file: a file the user may only
//! read is exported read-only. FLUSH is an `fsync` of the file (durable as the daemon's
//! durability level says); a write with FUA is followed by an `fdatasync`; several
//! connections see each other's writes at once (they all go to the same array), so the export
//! offers multi-connection. nvfs cannot punch holes: TRIM is not offered, and WRITE_ZEROES is
//! written zeros (nbdkit's own emulation).

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use libmoneta::{ClientError, File, Moneta};
use nbdkit::{plugin, Error, Flags, FuaFlags, Result, Server, ThreadModel};

/// The plugin's settings (`key=value` on nbdkit's command line).
struct Settings {
    socket: Option<PathBuf>,
    file: Option<PathBuf>,
}

static SETTINGS: Mutex<Settings> = Mutex::new(Settings {
    socket: None,
    file: None,
});

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

/// One client connection: the file, opened for it.
struct Export {
    file: File,
    write: bool,
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
            "file=<PATH>     (required) the nvfs path of the file to export\n\
             socket=<PATH>   the daemon's control socket (default: the user's)",
        )
    }

    fn config(key: &str, value: &str) -> Result<()> {
        let mut s = settings();
        match key {
            "file" if value.starts_with('/') => s.file = Some(PathBuf::from(value)),
            "file" => {
                return Err(Error::new(
                    libc::EINVAL,
                    "file= takes an nvfs path, starting with /",
                ))
            }
            "socket" => s.socket = Some(PathBuf::from(value)),
            _ => {
                return Err(Error::new(
                    libc::EINVAL,
                    format!("unknown parameter {key} (file=, socket=)"),
                ))
            }
        }
        Ok(())
    }

    fn config_complete() -> Result<()> {
        if settings().file.is_none() {
            return Err(Error::new(libc::EINVAL, "file=<nvfs path> is required"));
        }
        Ok(())
    }

    fn thread_model() -> Result<ThreadModel> {
        Ok(ThreadModel::Parallel)
    }

    fn open(readonly: bool) -> Result<Box<dyn Server>> {
        let m = conn()?;
        let path = settings().file.clone().expect("checked by config_complete");
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
        Ok(Box::new(Export { file, write }))
    }

    fn get_size(&self) -> Result<i64> {
        Ok(self.file.len().map_err(err)? as i64)
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

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self
                .file
                .read_at(&mut buf[done..], offset + done as u64)
                .map_err(err)?;
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
        let mut done = 0;
        while done < buf.len() {
            done += self
                .file
                .write_at(&buf[done..], offset + done as u64)
                .map_err(err)?;
        }
        if flags.contains(Flags::FUA) {
            self.file.sync_data().map_err(err)?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        self.file.sync_all().map_err(err)
    }
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
        is_rotational
    });
}
