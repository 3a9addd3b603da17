//! Test helpers. [`Daemon`]: a daemon inside the calling process, for documentation examples
//! and quick experiments: a volatile 64 MiB array with nvfs, on a socket in a private
//! temporary directory, stopped when the guard is dropped. `MONETA_SOCKET` is set to its
//! socket, so `libmoneta::Moneta::connect_default()` reaches it. [`DurableShadow`]: an array
//! that keeps a copy of what it flushed, behind `monetad --durable-shadow`.
//!
//! ```
//! let d = monetad::testing::Daemon::start();
//! let m = libmoneta::Moneta::connect(&d.socket).unwrap();
//! assert_eq!(m.stat("/").unwrap().ino, 1);
//! ```

use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moneta_device::{MappedArray, Media};

use crate::config::{ArraySource, Config};

/// A running in-process daemon.
pub struct Daemon {
    /// Its control socket.
    pub socket: PathBuf,
    dir: PathBuf,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// Starts a daemon and waits until it answers; panics if it cannot.
    pub fn start() -> Daemon {
        Self::start_with(false)
    }

    /// Starts a daemon on a raw array (`--raw`: no file system; its owner grants records).
    pub fn start_raw() -> Daemon {
        Self::start_with(true)
    }

    fn start_with(raw: bool) -> Daemon {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "moneta-inproc-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the daemon's directory");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .expect("make the directory private");
        let socket = dir.join("monetad.sock");
        let config = Config {
            socket: socket.clone(),
            array: ArraySource::Volatile(64 << 20),
            device: moneta_device::DeviceConfig::default(),
            socket_mode: 0o600,
            shares: crate::server::Shares::for_channels(1024),
            raw,
            kernel_fs: None,
            chunk_size: moneta_fs::layout::DEFAULT_CHUNK,
            durability: moneta_fs::Durability::Device,
            append_reserve: moneta_fs::fs::DEFAULT_APPEND_RESERVE,
            durable_shadow: None,
            data_checksums: false,
            share: None,
        };
        let thread = std::thread::Builder::new()
            .name("monetad".into())
            .spawn(move || {
                if let Err(e) = crate::run(config) {
                    eprintln!("in-process monetad: {e}");
                }
            })
            .expect("start the daemon's thread");
        let deadline = Instant::now() + Duration::from_secs(10);
        while libmoneta::Control::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "the in-process daemon did not start"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        std::env::set_var("MONETA_SOCKET", &socket);
        Daemon {
            socket,
            dir,
            thread: Some(thread),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(c) = libmoneta::Control::connect(&self.socket) {
            let _ = c.shutdown();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An array that copies every range it flushes to the host's disk into a second file of the
/// same size (whole pages, as `msync` writes them), after the flush and before it returns. So
/// that file holds what the disk would hold after a crash of the machine if the kernel had
/// written nothing back on its own; a test makes the images such a crash could leave by taking
/// each page that differs from the array either from it or from the array.
pub struct DurableShadow {
    inner: Arc<MappedArray>,
    shadow: std::fs::File,
}

/// Bytes per page the shadow copies.
const PAGE: u64 = 4096;

impl DurableShadow {
    /// Over `inner`, copying into the existing file at `path` (which should hold the array as
    /// it was durably when the daemon started).
    pub fn new(inner: Arc<MappedArray>, path: &Path) -> io::Result<DurableShadow> {
        let shadow = std::fs::OpenOptions::new().write(true).open(path)?;
        if shadow.metadata()?.len() != inner.size() {
            return Err(io::Error::other(format!(
                "{} is not the array's size",
                path.display()
            )));
        }
        Ok(DurableShadow { inner, shadow })
    }

    fn keep(&self, addr: u64, len: u64) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let first = addr / PAGE * PAGE;
        let end = (addr.saturating_add(len).div_ceil(PAGE) * PAGE).min(self.inner.size());
        let mut buf = vec![0u8; (end - first) as usize];
        // SAFETY: `buf` holds the range, which lies inside the array.
        unsafe { self.inner.read(first, buf.as_mut_ptr(), buf.len()) };
        self.shadow.write_all_at(&buf, first)
    }
}

impl Media for DurableShadow {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn persistent(&self) -> bool {
        self.inner.persistent()
    }
    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.read(addr, dst, len) }
    }
    unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.write(addr, src, len) }
    }
    fn flush(&self, addr: u64, len: u64) -> io::Result<()> {
        self.inner.flush(addr, len)?;
        self.keep(addr, len)
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.inner.flush_ranges(ranges)?;
        for &(addr, len) in ranges {
            self.keep(addr, len)?;
        }
        Ok(())
    }
    fn write_file(&self, addr: u64, bytes: &[u8]) -> io::Result<()> {
        self.inner.write_file(addr, bytes)
    }
    fn zero(&self, addr: u64, len: u64) -> io::Result<()> {
        self.inner.zero(addr, len)
    }
}
