//! A daemon inside the calling process, for documentation examples and quick experiments: a
//! volatile 64 MiB array with nvfs, on a socket in a private temporary directory, stopped when
//! the guard is dropped. `MONETA_SOCKET` is set to its socket, so
//! `libmoneta::Moneta::connect_default()` reaches it.
//!
//! ```
//! let d = monetad::testing::Daemon::start();
//! let m = libmoneta::Moneta::connect(&d.socket).unwrap();
//! assert_eq!(m.stat("/").unwrap().ino, 1);
//! ```

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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
            raw: false,
            chunk_size: 1 << 20,
            data_checksums: false,
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
