//! Posted writes (docs/abi.md §3.10, docs/libmoneta.md "Posted writes"): while the file's
//! handle holds a sole lease, a small write returns once its command is rung, and its tag
//! stays held until the file collects the completion. The file collects every write it posted
//! before anything that must see them: a read (in place too), a write that does not post, a
//! posted write over the same bytes, `fsync`, a truncation, a mapping of the file's pages and
//! the close. The device does not fail a posted write for a record its table evicted (it
//! installs the file's records again while the lease is out or being ended); one that missed
//! all the same is reported as `EIO`, not written again: another process may have opened the
//! file since, and a write carried out now would land after what it saw. A failed posted
//! write is reported by the next write, `fsync` or close of the file (as the kernel reports a
//! failed write-back).
//!
//! Collection holds the list's lock while it waits, so a thread that finds the list empty
//! knows that every write posted before has completed, not merely that another thread took
//! it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use moneta_abi::{Completion, Opcode, Status};

use super::File;
use crate::channel::{command, Tag};
use crate::{errno, ClientError};

/// Most writes one file keeps posted: the next one collects them first.
const MAX_POSTED_PER_FILE: usize = 16;

/// One write returned before its completion.
#[derive(Clone, Copy, Debug)]
struct Posted {
    tag: Tag,
    off: u64,
    len: u64,
    /// The fork generation it was posted in: a forked child's copy of the list names the
    /// parent's tags, which are not its own to wait for.
    generation: u64,
    /// The connection's channel it was posted on ([`crate::connection`]'s epoch): after the
    /// daemon went away and the connection was made anew, its tag is the old channel's.
    epoch: u64,
}

/// A file's posted writes.
#[derive(Default)]
pub(super) struct PostedWrites {
    list: Mutex<Vec<Posted>>,
    /// `list.len()`, for a look without the lock.
    count: AtomicU32,
    /// The first failure of a collected write not reported yet (an errno).
    failed: AtomicU32,
}

impl File {
    /// Posts `data` for file offset `off` at array address `dev` (layout tag `file`), if the
    /// handle holds a sole lease: `None` when it does not (the caller writes and waits), else
    /// how the write went (a write whose lease ended while it was rung waits here).
    pub(super) fn post_write(
        &self,
        data: &[u8],
        (dev, file): (u64, u64),
        off: u64,
        handle: u64,
    ) -> Option<Result<(), ClientError>> {
        // The channel and its epoch together: a connection made anew between the two loads
        // would file the write under the wrong channel (it then waits instead).
        let epoch = self.m.inner.epoch.load(Ordering::Acquire);
        let ch = self.ch();
        if self.m.inner.epoch.load(Ordering::Acquire) != epoch {
            return None;
        }
        let p = &self.posted;
        let end = off + data.len() as u64;
        if p.count.load(Ordering::Acquire) > 0 {
            let clash = {
                let list = p.list.lock().unwrap_or_else(|e| e.into_inner());
                list.len() >= MAX_POSTED_PER_FILE
                    || list.iter().any(|q| q.off < end && off < q.off + q.len)
            };
            if clash {
                if let Err(e) = self.settle_reporting() {
                    return Some(Err(e));
                }
            }
        }
        if ch.known_gone() {
            // The daemon is gone: the write waits, and fails at once.
            return None;
        }
        let lease = ch.sole_lease(handle)?;
        let tag = self.command_tag_on(ch);
        ch.write_dma(tag, 0, data);
        ch.submit(
            tag,
            &command(Opcode::Write, Completion::Dma, dev, data.len() as u64, file),
        );
        let mut list = p.list.lock().unwrap_or_else(|e| e.into_inner());
        // Another thread may have filled the list since the look above: this one waits then.
        if list.len() < MAX_POSTED_PER_FILE && !ch.known_gone() && ch.sole_still(lease) {
            list.push(Posted {
                tag,
                off,
                len: data.len() as u64,
                generation: crate::generation::generation(),
                epoch,
            });
            p.count.store(list.len() as u32, Ordering::Release);
            return Some(Ok(()));
        }
        drop(list);
        // The lease ended as the command was rung: the daemon may not have waited for it.
        ch.unpost();
        let r = ch.wait(tag, Completion::Dma);
        ch.release(tag);
        Some(match r {
            Ok(c) => match c.status {
                Status::Ok => Ok(()),
                // Redone through the usual path, which looks the records up again.
                Status::PermissionMiss => {
                    let mut f = 0;
                    self.hard_miss_at(off, &mut f)
                        .and_then(|()| self.write_unposted(data, off))
                }
                Status::PermissionDenied => Err(errno(libc::EBADF)),
                s => Err(ClientError::Status(s)),
            },
            Err(e) => Err(e),
        })
    }

    /// Collects the writes posted through this file, if there are any (see the module's
    /// text).
    #[inline]
    pub(crate) fn settle(&self) -> Result<(), ClientError> {
        if self.posted.count.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        self.settle_posted()
    }

    /// [`File::settle`], and the failure of a write collected before, if one was not
    /// reported yet: for the calls that report what became of earlier writes.
    pub(crate) fn settle_reporting(&self) -> Result<(), ClientError> {
        self.settle()?;
        match self.posted.failed.swap(0, Ordering::AcqRel) {
            0 => Ok(()),
            e => Err(errno(e as i32)),
        }
    }

    #[cold]
    fn settle_posted(&self) -> Result<(), ClientError> {
        let mut list = self.posted.list.lock().unwrap_or_else(|e| e.into_inner());
        let here = crate::generation::generation();
        let epoch = self.m.inner.epoch.load(Ordering::Acquire);
        let ch = self.ch();
        let mut first: Option<ClientError> = None;
        for q in list.drain(..) {
            if q.generation != here {
                // Posted by the parent before a fork: the parent collects it.
                continue;
            }
            if q.epoch != epoch {
                // The daemon went away, and the connection was made anew: whether it carried
                // the write out before it went, nothing can tell.
                first.get_or_insert(errno(libc::EIO));
                continue;
            }
            let r = ch.wait(q.tag, Completion::Dma);
            ch.unpost();
            let outcome = match r {
                Ok(c) => match c.status {
                    Status::Ok => Ok(()),
                    // The device installs the records of a leased file again for its posted
                    // writes: one that missed all the same is lost. Not written again now:
                    // another process may have opened the file since and seen it without
                    // this write, which would land after what it saw.
                    Status::PermissionMiss => Err(errno(libc::EIO)),
                    Status::PermissionDenied => Err(errno(libc::EBADF)),
                    s => Err(ClientError::Status(s)),
                },
                Err(e) => Err(e),
            };
            ch.release(q.tag);
            if let Err(e) = outcome {
                first.get_or_insert(e);
            }
        }
        self.posted.count.store(0, Ordering::Release);
        drop(list);
        if let Some(e) = first {
            // Kept as a non-zero errno (0 is the word's "none").
            let code = match e.errno() {
                c if c > 0 => c,
                _ => libc::EIO,
            };
            let _ = self.posted.failed.compare_exchange(
                0,
                code as u32,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        Ok(())
    }
}
