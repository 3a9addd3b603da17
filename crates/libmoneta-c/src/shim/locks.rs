//! `fcntl` record locks (POSIX and open-file-description) and `flock` on Moneta files, kept by
//! the daemon so that they hold between processes (`docs/abi.md`, `FS_LOCK`).
//!
//! `F_SETLKW` and a blocking `flock` wait by asking again with back-off; the daemon sees the
//! waiter and answers `EDEADLK` when waiting would close a cycle.

use std::ffi::c_int;

use libmoneta::{LockCmd, LockKind, LockType};

use super::eno;
use super::fds::Desc;

fn kind_of(cmd: c_int) -> LockKind {
    match cmd {
        libc::F_OFD_GETLK | libc::F_OFD_SETLK | libc::F_OFD_SETLKW => LockKind::Ofd,
        _ => LockKind::Posix,
    }
}

/// `fcntl(F_GETLK/F_SETLK/F_SETLKW/F_OFD_*)`; `arg` points to the caller's `struct flock`.
pub(crate) fn fcntl_lock(d: &Desc, cmd: c_int, arg: usize) -> Result<c_int, i32> {
    let fl = arg as *mut libc::flock;
    if fl.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the caller passes a struct flock for these commands.
    let l = unsafe { &mut *fl };
    let kind = kind_of(cmd);
    if kind == LockKind::Ofd && l.l_pid != 0 {
        // Linux: OFD locks need l_pid 0.
        return Err(libc::EINVAL);
    }
    let ty = match l.l_type as c_int {
        libc::F_RDLCK => LockType::Read,
        libc::F_WRLCK => LockType::Write,
        libc::F_UNLCK => LockType::Unlock,
        _ => return Err(libc::EINVAL),
    };
    // The range in absolute bytes, as the kernel computes it.
    let base: i64 = match l.l_whence as c_int {
        libc::SEEK_SET => 0,
        libc::SEEK_CUR => d.file.position() as i64,
        libc::SEEK_END => d.file.len().map_err(eno)? as i64,
        _ => return Err(libc::EINVAL),
    };
    let mut start = base.checked_add(l.l_start).ok_or(libc::EOVERFLOW)?;
    let mut len = l.l_len;
    if len < 0 {
        // A negative length covers the bytes before start.
        start = start.checked_add(len).ok_or(libc::EINVAL)?;
        len = -len;
    }
    if start < 0 {
        return Err(libc::EINVAL);
    }
    match cmd {
        libc::F_GETLK | libc::F_OFD_GETLK => {
            if ty == LockType::Unlock {
                return Err(libc::EINVAL);
            }
            let got = d
                .file
                .lock(kind, LockCmd::Test, ty, start as u64, len as u64, false)
                .map_err(eno)?;
            match got {
                Some(info) => {
                    l.l_type = match info.ty {
                        LockType::Read => libc::F_RDLCK,
                        _ => libc::F_WRLCK,
                    } as _;
                    l.l_whence = libc::SEEK_SET as _;
                    l.l_start = info.start as i64;
                    l.l_len = info.len as i64;
                    l.l_pid = info.pid;
                }
                None => l.l_type = libc::F_UNLCK as _,
            }
            Ok(0)
        }
        libc::F_SETLKW | libc::F_OFD_SETLKW => {
            d.file
                .lock_wait(kind, ty, start as u64, len as u64)
                .map_err(eno)?;
            took(d, ty);
            Ok(0)
        }
        _ => {
            d.file
                .lock(kind, LockCmd::Set, ty, start as u64, len as u64, false)
                .map_err(eno)?;
            took(d, ty);
            Ok(0)
        }
    }
}

/// Remembers that a write lock was taken through `d` (see `hooks::data`: SQLite's switch to
/// WAL is recognized by it).
fn took(d: &Desc, ty: LockType) {
    if ty == LockType::Write {
        d.write_locked
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `flock(2)`.
pub(crate) fn flock(d: &Desc, op: c_int) -> Result<c_int, i32> {
    let nb = op & libc::LOCK_NB != 0;
    let ty = match op & !libc::LOCK_NB {
        libc::LOCK_SH => LockType::Read,
        libc::LOCK_EX => LockType::Write,
        libc::LOCK_UN => LockType::Unlock,
        _ => return Err(libc::EINVAL),
    };
    let r = if nb || ty == LockType::Unlock {
        d.file
            .lock(LockKind::Flock, LockCmd::Set, ty, 0, 0, false)
            .map(|_| ())
    } else {
        d.file.lock_wait(LockKind::Flock, ty, 0, 0)
    };
    match r {
        Ok(()) => Ok(0),
        // flock reports a conflict as EWOULDBLOCK (the same value as EAGAIN on Linux).
        Err(e) => Err(eno(e)),
    }
}
