//! libmoneta: the untrusted user-space driver of the Moneta device (Moneta-D §2.2, §4).
//!
//! Applications read and write files on nvfs through their process's channel, without a
//! system call on the common path, and ask the daemon's permission manager only for metadata
//! and misses. Layers, bottom up: the control connection ([`Control`]), the channel driver
//! ([`Channel`]: tags, doorbell, completion), files with their translation maps ([`Moneta`],
//! [`File`]), asynchronous requests ([`aio`]), `fork` ([`fork`]) and advisory locks
//! ([`lock`]). The C interface is `libmoneta.so` (crate `libmoneta-c`, header
//! `include/moneta.h`).
//!
//! The examples start a daemon inside the test process (`monetad::testing`); an application
//! connects to the one `moneta start` runs.
//!
//! ```
//! # let _daemon = monetad::testing::Daemon::start();
//! use libmoneta::{Moneta, OpenOptions};
//!
//! let m = Moneta::connect_default()?;
//! let f = m.open("/hello", OpenOptions::new().read(true).write(true).create(true))?;
//! f.write_at(b"hello, nvm", 0)?;
//! let mut buf = [0u8; 10];
//! assert_eq!(f.read_at(&mut buf, 0)?, 10);
//! assert_eq!(&buf, b"hello, nvm");
//! assert_eq!(m.stats().soft_misses, 0); // the extend that wrote it mapped it too
//! # Ok::<(), libmoneta::ClientError>(())
//! ```

pub mod affinity;
pub mod aio;
pub mod channel;
mod connection;
pub mod control;
mod fdnum;
pub mod file;
pub mod fork;
mod generation;
pub mod kernel;
pub mod lock;
pub mod paths;
pub mod policy;
mod position;
pub mod program;
pub mod trace;
pub mod trust;

use std::path::PathBuf;

pub use affinity::Affinity;
pub use aio::{Pending, WriteSlot};
pub use channel::attrs::listings;
pub use channel::fscall::{calls_made, closes_posted, stats_kept};
pub use channel::leases::locks_leased;
pub use channel::sizes::sizes_leased;
pub use channel::sole::writes_posted;
pub use channel::{Channel, Completed, Tag};
pub use control::Control;
pub use file::{Connector, DirEntry, File, FileState, Handover, Moneta, OpenOptions, Stats};
pub use kernel::{KernelFile, KernelFs};
pub use lock::{LockCmd, LockInfo, LockKind, LockType};
pub use moneta_abi;
pub use policy::Policy;

/// The setting environment variable `name` asks for, read by `parse`, or the default when it
/// is unset. An unparsable value is ignored with a message on standard error naming what was
/// `expected`, once per process (`warned` is the variable's own).
pub(crate) fn env_setting<T: Default>(
    name: &str,
    parse: fn(&str) -> Option<T>,
    expected: &str,
    warned: &'static std::sync::Once,
) -> T {
    let Ok(v) = std::env::var(name) else {
        return T::default();
    };
    parse(&v).unwrap_or_else(|| {
        warned.call_once(|| eprintln!("libmoneta: ignoring {name}={v:?}: expected {expected}"));
        T::default()
    })
}

/// Errors of the client core.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No daemon answers at the socket.
    #[error("monetad is not running at {socket} ({source}); start it with `moneta start`")]
    NotRunning {
        /// The socket path tried.
        socket: PathBuf,
        /// Why the connection failed.
        source: std::io::Error,
    },
    /// The socket or the daemon behind it is not one this client trusts (see [`trust`]).
    #[error("{0}")]
    Untrusted(String),
    /// The daemon refused the request.
    #[error("monetad refused: {message} (errno {errno})")]
    Refused {
        /// Positive errno.
        errno: i32,
        /// The daemon's reason.
        message: String,
    },
    /// The daemon's reply was malformed.
    #[error("control protocol error: {0}")]
    Protocol(moneta_abi::control::Error),
    /// The channel the daemon sent does not look like one.
    #[error("bad channel: {0}")]
    BadChannel(String),
    /// The daemon closed the connection or died.
    #[error("monetad went away")]
    DeviceGone,
    /// The daemon had closed the connection before the request was sent (it stopped or was
    /// restarted): the request was not carried out.
    #[error("monetad had closed the connection; the request was not sent")]
    Disconnected,
    /// The daemon did not answer in time.
    #[error("monetad did not answer in time")]
    Timeout,
    /// A command completed with an error status.
    #[error("device status: {}", .0.name())]
    Status(moneta_abi::Status),
    /// A system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// An error carrying `errno`, as a system call would give it.
pub(crate) fn errno(e: i32) -> ClientError {
    ClientError::Io(std::io::Error::from_raw_os_error(e))
}

/// A reply that does not have the shape its request asked for.
pub(crate) fn bad_reply(what: &'static str) -> ClientError {
    ClientError::Protocol(moneta_abi::control::Error::BadField(what))
}

impl From<rustix::io::Errno> for ClientError {
    fn from(e: rustix::io::Errno) -> Self {
        ClientError::Io(e.into())
    }
}

impl ClientError {
    /// The errno a POSIX caller should see.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::NotRunning { .. } => 107, // ENOTCONN
            ClientError::Refused { errno, .. } => *errno,
            ClientError::Untrusted(_) => 13, // EACCES
            ClientError::Protocol(_) | ClientError::BadChannel(_) => 71, // EPROTO
            ClientError::DeviceGone | ClientError::Disconnected => 5, // EIO
            ClientError::Timeout => 110,     // ETIMEDOUT
            ClientError::Status(s) => s.errno(),
            ClientError::Io(e) => e.raw_os_error().unwrap_or(5),
        }
    }
}

#[cfg(test)]
mod tests {
    /// A variable of this test's own, so no other test sees it change.
    const VAR: &str = "LIBMONETA_TEST_ENV_SETTING";

    fn parse(s: &str) -> Option<u8> {
        s.trim().parse().ok()
    }

    #[test]
    fn env_setting_reads_defaults_and_ignores_garbage() {
        static WARNED: std::sync::Once = std::sync::Once::new();
        let get = || super::env_setting(VAR, parse, "a byte", &WARNED);
        std::env::remove_var(VAR);
        assert_eq!(get(), 0);
        std::env::set_var(VAR, " 7 ");
        assert_eq!(get(), 7);
        std::env::set_var(VAR, "seven");
        assert_eq!(get(), 0);
        assert!(WARNED.is_completed(), "an unparsable value is reported");
        std::env::set_var(VAR, "300");
        assert_eq!(get(), 0);
        std::env::remove_var(VAR);
    }
}
