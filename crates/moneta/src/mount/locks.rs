//! Record locks through the mount (`fcntl` `F_SETLK`, `F_SETLKW`, `F_GETLK` and their
//! `F_OFD_*` forms), kept by the permission manager so that they hold against libmoneta's
//! clients too.
//!
//! The kernel names a lock's owner by a number: the process's file table for a POSIX lock, the
//! open file for an OFD lock. The manager's owners are connections (POSIX) and handles (OFD),
//! and every caller of one user shares the server's connection for that user. So each owner
//! the kernel names gets a handle of its own on the file, opened through the same connection as
//! the file it locks through, and its locks are OFD locks of that handle: two owners conflict
//! whatever process or user they belong to, one owner's ranges split, merge and convert, and
//! they conflict with libmoneta's POSIX and OFD locks as the manager's rules say. A POSIX
//! owner's locks go when the process closes any descriptor of the file (the kernel's flush),
//! every owner's when the last descriptor of the open file it used goes (release).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use libmoneta::{ClientError, LockCmd, LockInfo, LockKind, LockType};

use super::fs::Open;

/// Most `F_SETLKW` calls waiting at once; beyond, `ENOLCK`. Each waits on a thread of its own.
pub const MAX_WAITERS: usize = 256;

/// What an owner's locks are held through.
pub enum Holder {
    /// A handle of the owner's own (the usual case).
    Own(Box<libmoneta::File>),
    /// The file's handle itself, when a handle of the owner's own could not be opened (the
    /// file lost its name, or the opener's rights to it changed): its locks are then shared
    /// by every owner locking through that open file.
    Shared(Arc<Open>),
}

impl Holder {
    /// The file the locks are set on.
    pub fn file(&self) -> &libmoneta::File {
        match self {
            Holder::Own(f) => f,
            Holder::Shared(o) => &o.file,
        }
    }

    /// Sets, converts or removes a lock of this owner.
    pub fn set(&self, ty: LockType, start: u64, len: u64, wait: bool) -> Result<(), ClientError> {
        self.file()
            .lock(LockKind::Ofd, LockCmd::Set, ty, start, len, wait)
            .map(|_| ())
    }

    /// The lock that would conflict with one of this owner's.
    pub fn test(
        &self,
        ty: LockType,
        start: u64,
        len: u64,
    ) -> Result<Option<LockInfo>, ClientError> {
        self.file()
            .lock(LockKind::Ofd, LockCmd::Test, ty, start, len, false)
    }

    /// Gives up every lock of this owner.
    fn drop_locks(self) {
        match self {
            // Closing the handle releases its locks in the manager.
            Holder::Own(f) => {
                let _ = f.close();
            }
            Holder::Shared(o) => {
                let _ = o
                    .file
                    .lock(LockKind::Ofd, LockCmd::Set, LockType::Unlock, 0, 0, false);
            }
        }
    }
}

struct Owner {
    holder: Arc<Holder>,
    /// The open files (FUSE handles) the owner locked through.
    fhs: Vec<u64>,
    /// The process that set its last lock, for `F_GETLK`.
    pid: u32,
}

/// The owners of locks through the mount, by (owner, inode).
#[derive(Default)]
pub struct Owners {
    owners: Mutex<HashMap<(u64, u64), Owner>>,
}

impl Owners {
    /// The holder of `owner`'s locks on `ino`, if it has one.
    pub fn get(&self, owner: u64, ino: u64) -> Option<Arc<Holder>> {
        let t = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        t.get(&(owner, ino)).map(|o| o.holder.clone())
    }

    /// The holder of `owner`'s locks on `ino` through open file `fh`, made by `open` when the
    /// owner has none yet; `pid` set the lock.
    pub fn holder(
        &self,
        owner: u64,
        ino: u64,
        fh: u64,
        pid: u32,
        open: impl FnOnce() -> Holder,
    ) -> Arc<Holder> {
        let mut t = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let o = t.entry((owner, ino)).or_insert_with(|| Owner {
            holder: Arc::new(open()),
            fhs: Vec::new(),
            pid,
        });
        if !o.fhs.contains(&fh) {
            o.fhs.push(fh);
        }
        o.pid = pid;
        o.holder.clone()
    }

    /// The process of another owner holding locks on `ino` than `owner`, if exactly one does
    /// (an OFD lock's holder is reported as pid -1 by the manager; through the mount each
    /// owner's locks are OFD locks, so the process is found here).
    pub fn other_pid(&self, owner: u64, ino: u64) -> Option<u32> {
        let t = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let mut others = t
            .iter()
            .filter(|((o, i), _)| *i == ino && *o != owner)
            .map(|(_, v)| v.pid);
        let first = others.next()?;
        others.next().is_none().then_some(first)
    }

    /// `owner` closed a descriptor of `ino` (the kernel's flush): a POSIX owner's locks go.
    pub fn flush(&self, owner: u64, ino: u64) {
        let gone = {
            let mut t = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            t.remove(&(owner, ino))
        };
        if let Some(o) = gone {
            release_holder(o.holder);
        }
    }

    /// The last descriptor of open file `fh` went: the locks of every owner that locked
    /// through it go (an OFD owner's with its open file; a POSIX owner's went at its close).
    pub fn release(&self, fh: u64) {
        let gone: Vec<Owner> = {
            let mut t = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<(u64, u64)> = t
                .iter()
                .filter(|(_, o)| o.fhs.contains(&fh))
                .map(|(k, _)| *k)
                .collect();
            keys.into_iter().filter_map(|k| t.remove(&k)).collect()
        };
        for o in gone {
            release_holder(o.holder);
        }
    }
}

/// Drops an owner's locks once no waiter still uses its holder (a waiter that holds it places
/// its lock on a handle about to close, which then drops it).
fn release_holder(h: Arc<Holder>) {
    match Arc::try_unwrap(h) {
        Ok(h) => h.drop_locks(),
        Err(h) => {
            let _ = h.set(LockType::Unlock, 0, 0, false);
        }
    }
}

/// The kernel's lock range (first and last byte, the last `OFFSET_MAX` for "to the end and
/// beyond") as the manager's (start, length; 0 for to the end).
pub fn range(start: u64, end: u64) -> Result<(u64, u64), i32> {
    const OFFSET_MAX: u64 = i64::MAX as u64;
    if end < start || start > OFFSET_MAX {
        return Err(libc::EINVAL);
    }
    Ok(if end >= OFFSET_MAX {
        (start, 0)
    } else {
        (start, end - start + 1)
    })
}

/// The manager's range as the kernel's (first and last byte).
pub fn kernel_range(start: u64, len: u64) -> (u64, u64) {
    if len == 0 {
        (start, i64::MAX as u64)
    } else {
        (start, start.saturating_add(len - 1).min(i64::MAX as u64))
    }
}

/// A lock type from `F_RDLCK`, `F_WRLCK` or `F_UNLCK`.
pub fn lock_type(typ: i32) -> Result<LockType, i32> {
    match typ {
        libc::F_RDLCK => Ok(LockType::Read),
        libc::F_WRLCK => Ok(LockType::Write),
        libc::F_UNLCK => Ok(LockType::Unlock),
        _ => Err(libc::EINVAL),
    }
}

/// `F_RDLCK` or `F_WRLCK` for a lock type (`F_UNLCK` for unlock).
pub fn fcntl_type(ty: LockType) -> i32 {
    match ty {
        LockType::Read => libc::F_RDLCK,
        LockType::Write => libc::F_WRLCK,
        LockType::Unlock => libc::F_UNLCK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_convert_both_ways() {
        let max = i64::MAX as u64;
        assert_eq!(range(0, max), Ok((0, 0)));
        assert_eq!(range(10, 19), Ok((10, 10)));
        assert_eq!(range(5, 5), Ok((5, 1)));
        assert_eq!(range(6, 5), Err(libc::EINVAL));
        assert_eq!(range(u64::MAX, u64::MAX), Err(libc::EINVAL));
        assert_eq!(kernel_range(10, 10), (10, 19));
        assert_eq!(kernel_range(3, 0), (3, max));
        assert_eq!(kernel_range(max - 1, 5), (max - 1, max));
        for t in [libc::F_RDLCK, libc::F_WRLCK, libc::F_UNLCK] {
            assert_eq!(fcntl_type(lock_type(t).unwrap()), t);
        }
        assert_eq!(lock_type(42), Err(libc::EINVAL));
    }
}
