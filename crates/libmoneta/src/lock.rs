//! Advisory file locks on open files: POSIX record locks (`fcntl` `F_SETLK`, `F_SETLKW`,
//! `F_GETLK`), open-file-description locks (`F_OFD_*`) and `flock`, kept by the daemon's
//! permission manager so that they hold between processes (`OP_FS_LOCK`, `docs/abi.md` §2.10).
//!
//! - A [`LockKind::Posix`] lock belongs to the process (its connection): it conflicts with
//!   other processes' locks, never with its own, and goes when the process closes *any* handle
//!   of the file or ends. A forked child does not inherit it.
//! - A [`LockKind::Ofd`] lock belongs to the open file description: the [`File`] and every
//!   copy a forked child inherits share it, a second open of the same file conflicts with it,
//!   and it goes when the last of them closes.
//! - A [`LockKind::Flock`] lock covers the whole file, belongs to the open file description
//!   as well, and never conflicts with record locks.
//!
//! The daemon never blocks a call: a set that conflicts fails with `EAGAIN`. Waiting (as
//! `F_SETLKW` or `flock` without `LOCK_NB` do) is [`File::lock_wait`]: it retries with
//! `wait` set, which lets the daemon answer `EDEADLK` when the wait could never end.
//!
//! ```
//! # let _daemon = monetad::testing::Daemon::start();
//! use libmoneta::{LockCmd, LockKind, LockType, Moneta, OpenOptions};
//!
//! let opts = OpenOptions::new().read(true).write(true).create(true).clone();
//! let a = Moneta::connect_default()?; // one process...
//! let b = Moneta::connect_default()?; // ...and another
//! let fa = a.open("/db", &opts)?;
//! let fb = b.open("/db", &opts)?;
//! fa.lock(LockKind::Posix, LockCmd::Set, LockType::Write, 0, 100, false)?;
//! // The other process sees the lock, and who holds it.
//! let held = fb.lock(LockKind::Posix, LockCmd::Test, LockType::Read, 50, 1, false)?;
//! let held = held.expect("a conflicting lock");
//! assert_eq!((held.ty, held.start, held.len), (LockType::Write, 0, 100));
//! assert_eq!(held.pid, std::process::id() as i32);
//! let busy = fb.lock(LockKind::Posix, LockCmd::Set, LockType::Read, 50, 1, false);
//! assert_eq!(busy.unwrap_err().errno(), libc::EAGAIN);
//! // Bytes past the lock are free; unlocking frees the rest.
//! fb.lock(LockKind::Posix, LockCmd::Set, LockType::Read, 100, 0, false)?;
//! fa.lock(LockKind::Posix, LockCmd::Set, LockType::Unlock, 0, 0, false)?;
//! fb.lock_wait(LockKind::Posix, LockType::Read, 0, 0)?;
//! # Ok::<(), libmoneta::ClientError>(())
//! ```

use std::time::Duration;

use moneta_abi::fsproto::{FsReply, FsRequest};
pub use moneta_abi::fsproto::{LockCmd, LockKind, LockType};

use crate::channel::leases::LeasedCall;
use crate::file::File;
use crate::ClientError;

/// The first pause of [`File::lock_wait`] after a conflict.
pub const LOCK_WAIT_FIRST: Duration = Duration::from_micros(50);
/// The longest pause of [`File::lock_wait`]: the pauses double up to it. Well under the
/// daemon's wait expiry (2 s), so a waiter stays known to its deadlock detection.
pub const LOCK_WAIT_MAX: Duration = Duration::from_millis(10);

/// A lock another owner holds, as a test ([`LockCmd::Test`]) reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// [`LockType::Read`] or [`LockType::Write`].
    pub ty: LockType,
    /// The holder's process id for a POSIX lock (0 for a process in another pid namespace);
    /// -1 for a lock of an open file description, as Linux reports it.
    pub pid: i32,
    /// First byte.
    pub start: u64,
    /// Bytes; 0 when the lock runs to the end of the file and beyond.
    pub len: u64,
}

impl File {
    /// Places, converts or removes a lock ([`LockCmd::Set`]), or asks which lock would
    /// conflict with one ([`LockCmd::Test`], not for [`LockKind::Flock`]).
    ///
    /// `start` is an absolute offset and `len` a positive length or 0 for "to the end of the
    /// file and beyond" (resolve `SEEK_CUR`, `SEEK_END` and negative lengths first); both are
    /// ignored for `flock`. `wait` says that the caller will retry a conflicting set until it
    /// succeeds, so the daemon checks whether that wait could ever end.
    ///
    /// A set answers `Ok(None)`; a test answers the first conflicting lock, or `None` when the
    /// lock could be placed. Errors (as [`ClientError::errno`]): `EAGAIN` on a conflict,
    /// `EDEADLK` when waiting would deadlock, `ENOLCK` beyond the daemon's limits, `EBADF` for
    /// a record lock of a type the file was not opened for (read needs read access, write
    /// needs write access), `EINVAL` for a range past 2^63 - 1, a test of type
    /// [`LockType::Unlock`] or a test of a `flock` lock.
    pub fn lock(
        &self,
        kind: LockKind,
        cmd: LockCmd,
        ty: LockType,
        start: u64,
        len: u64,
        wait: bool,
    ) -> Result<Option<LockInfo>, ClientError> {
        let handle = self.h()?;
        // Its closes must now wait for their answers (see `File::close_soon`).
        self.note_locking();
        if kind == LockKind::Posix {
            // A lease answers what the daemon would, without asking it (docs/abi.md §3.8);
            // a lock of a type the file was not opened for is the daemon's to refuse.
            let call = match (cmd, ty) {
                (LockCmd::Set, LockType::Unlock) => Some(LeasedCall::Set(None)),
                (LockCmd::Set, LockType::Read) if self.readable() => {
                    Some(LeasedCall::Set(Some(false)))
                }
                (LockCmd::Set, LockType::Write) if self.writable() => {
                    Some(LeasedCall::Set(Some(true)))
                }
                (LockCmd::Test, LockType::Read | LockType::Write) => Some(LeasedCall::Test),
                _ => None,
            };
            if let Some(call) = call {
                if self
                    .channel()
                    .leased_lock(handle, call, start, len)
                    .is_some()
                {
                    return Ok(None);
                }
            }
        }
        let reply = self.channel().fs(FsRequest::Lock {
            handle,
            kind,
            cmd,
            ty,
            wait,
            start,
            len,
        })?;
        match (cmd, reply) {
            (LockCmd::Set, FsReply::Empty) => Ok(None),
            (LockCmd::Test, FsReply::Lock(l)) if l.ty == LockType::Unlock => Ok(None),
            (LockCmd::Test, FsReply::Lock(l)) => Ok(Some(LockInfo {
                ty: l.ty,
                pid: l.pid,
                start: l.start,
                len: l.len,
            })),
            _ => Err(ClientError::Protocol(moneta_abi::control::Error::BadField(
                "lock reply",
            ))),
        }
    }

    /// Sets a lock, waiting for conflicting ones to go (`F_SETLKW`, `flock` without
    /// `LOCK_NB`): retries while the daemon answers `EAGAIN`, pausing [`LOCK_WAIT_FIRST`] at
    /// first and twice as long each time up to [`LOCK_WAIT_MAX`]. It waits as long as it
    /// takes, like `F_SETLKW`, and returns the first other answer: success, `EDEADLK` when
    /// the locks it waits for belong to owners that wait for it, or another error.
    pub fn lock_wait(
        &self,
        kind: LockKind,
        ty: LockType,
        start: u64,
        len: u64,
    ) -> Result<(), ClientError> {
        let mut pause = LOCK_WAIT_FIRST;
        loop {
            match self.lock(kind, LockCmd::Set, ty, start, len, true) {
                Err(e) if e.errno() == libc::EAGAIN => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(LOCK_WAIT_MAX);
                }
                other => return other.map(|_| ()),
            }
        }
    }
}
