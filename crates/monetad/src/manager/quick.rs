//! File-system calls through the channel (`OP_FS`): the device's poller answers the common
//! calls of a connection itself, in the pass that takes the command, with no daemon thread to
//! wake on either side; whatever it cannot answer at once goes to one of the device's file-call
//! workers (or, when they are all taken, back to the client for the control socket), where
//! the same request gets the same answer.
//!
//! The poller must never wait: it serves every channel's data. So a quick call
//!
//! - only *tries* the locks it needs (the connection's session, the releaser's queue, the lock
//!   table, the file system) and leaves the call to a worker when one is busy, before it has
//!   changed anything;
//! - runs with the file system in quick mode ([`Fs::set_quick`]), where anything that would
//!   zero free space, flush or revoke records fails with [`NOT_QUICK`] before any change, and
//!   goes to a worker;
//! - is refused up front at the `Host` durability level when the journal's log is short of
//!   room (a checkpoint there flushes): the releaser thread makes the checkpoint, and the
//!   workers answer meanwhile;
//! - never frees space itself. Freeing revokes every channel's records and waits until no
//!   request issued before is in flight, which only the poller can confirm. An unlink or a
//!   rename that takes the last name of a file with space first *holds* the file (one more open count, as a
//!   handle would), so the file lives on as an orphan, exactly as a file unlinked while open
//!   does; a close that drops the last handle of an unlinked file leaves that handle for
//!   later. The releaser thread then closes those holds, which frees the space with the usual
//!   revocation (made without the file-system lock for files nothing else can reach, so that
//!   quick calls are not held up by it). A crash before that leaves an orphan, which the next
//!   mount frees (as any).
//!   Every call on the socket first finishes what is queued, so it sees the space freed.
//!
//! Credentials are the session's (`SO_PEERCRED` at connect), never taken from the channel's
//! memory; the request is decoded from one copy the poller made of the tag's slice, so a
//! client that rewrites it meanwhile only changes what it asked. The changes to the calling
//! channel's records (new extents to install, a closed file's records to remove) are returned
//! to the poller, which makes them before it completes the command.

use std::sync::{Arc, Mutex};

use moneta_abi::control::{decode_request, encode_reply, errno, Failure, ReplyBody, Request};
use moneta_abi::fsproto::*;
use moneta_device::{FsAnswer, FsOutcome, TableOp};
use moneta_fs::fs::NOT_QUICK;
use moneta_fs::{Durability, Fs};

use super::*;

/// Bytes of an extents reply besides the extents (message header, result, size, count, tag),
/// with room to spare.
const EXTENTS_OVERHEAD: usize = 128;
/// Bytes of each extent in an extents reply.
const EXTENT_BYTES: usize = 24;
/// Bytes of a directory reply besides its entries (message header, result, count, end), with
/// room to spare.
const DIR_OVERHEAD: usize = 64;

impl Manager {
    /// Answers the `FS` request message `request` of the session that owns `channel`, with
    /// a reply of at most `room` bytes; `None` refers it to the control socket.
    pub(super) fn quick_request(
        self: &Arc<Self>,
        session: &Arc<Mutex<Session>>,
        channel: u32,
        request: &[u8],
        room: usize,
    ) -> Option<FsOutcome> {
        let (seq, Request::Fs(req)) = decode_request(request).ok()? else {
            return None;
        };
        if !req.on_channel() {
            return None;
        }
        let op = req.op();
        if let FsRequest::Stat { target } = &req {
            // A stat needs the caller's credentials and a handle's inode, both published for
            // the channel: not the session, which another thread of the process may hold
            // through a call on the socket.
            if let Some(result) = self.quick_stat(channel, target) {
                let reply = fitted_reply(op, seq, result, room)?;
                return Some(FsOutcome::Now(FsAnswer {
                    reply,
                    ops: Vec::new(),
                }));
            }
        }
        if let FsRequest::Fsync { handle } = req {
            if self.durability == Durability::Host {
                return Some(self.fsync_later(session, handle, seq, op, room));
            }
        }
        if let FsRequest::StatDir {
            path,
            cookie,
            follow,
        } = req
        {
            // A page of a few dozen entries on the poller, from what the connection published
            // (as a stat); when the file system is busy, a worker makes it.
            let room = room.saturating_sub(DIR_OVERHEAD + FsReply::STATS_HEAD);
            if let Some(result) = self.quick_stat_dir(channel, &path, cookie, follow, room) {
                let reply = fitted_reply(op, seq, result, room)?;
                return Some(FsOutcome::Now(FsAnswer {
                    reply,
                    ops: Vec::new(),
                }));
            }
            return Some(self.later(session, seq, op, room, move |me, s| {
                let s = s.lock().unwrap_or_else(|e| e.into_inner());
                if s.ending {
                    return Err(fail(errno::EBADF, "the connection is closing"));
                }
                let cred = s.cred.clone();
                drop(s);
                statdir::stat_dir(
                    &mut me.fs(),
                    &cred,
                    Some(channel),
                    &path,
                    cookie,
                    follow,
                    statdir::QUICK_ENTRIES,
                    room,
                )
            }));
        }
        // A call the poller cannot make at once (a lock it needs is busy, it would free or
        // zero space, the journal needs room) is made by a worker, as the socket would make
        // it: the client waits on its channel, not for a round trip through the socket and a
        // connection thread woken for it; and a close libmoneta posted without waiting
        // (docs/libmoneta.md) is made now, not when the process next calls. Lock calls, which
        // may wait for other processes, go to the socket, and so do those whose answer made
        // as the socket makes it may not fit the tag's slice (extents, directory entries).
        let to_worker = !matches!(
            req,
            FsRequest::Lock { .. }
                | FsRequest::Lookup { .. }
                | FsRequest::Extend { .. }
                | FsRequest::Readdir { .. }
        );
        let later = |req: FsRequest| {
            to_worker.then(|| self.call_later(session, channel, req, seq, op, room))
        };
        let Ok(mut s) = session.try_lock() else {
            return later(req);
        };
        if let FsRequest::Lock {
            handle,
            kind,
            cmd,
            ty,
            wait,
            start,
            len,
        } = req
        {
            // Locks live apart from the file system: they need only the lock table.
            let mut locks = self.locks.try_lock().ok()?;
            let h = Self::handle(&s, handle);
            if let Ok(h) = &h {
                // The daemon answers on the file: its lease (this process's, or a leftover
                // of a closed channel) comes back first, or the call goes to the socket.
                if !self.recall(&mut locks, h.ino, false) {
                    return None;
                }
            }
            let result = h
                .clone()
                .and_then(|h| Self::lock(&mut locks, &s, &h, kind, cmd, ty, wait, start, len));
            if let (Ok(_), Ok(h), LockKind::Posix, LockCmd::Set) = (&result, &h, kind, cmd) {
                // The open count is read under the file system's lock, which every open
                // takes; when it is busy, no lease this time.
                if let Ok(fs) = self.fs.try_lock() {
                    let opens = fs.open_count(h.ino);
                    drop(fs);
                    self.try_grant(&mut locks, &s, channel, handle, h, opens);
                }
            }
            drop((locks, s));
            return Some(FsOutcome::Now(FsAnswer {
                reply: encode_reply(op, seq, &result.map(ReplyBody::Fs)),
                ops: Vec::new(),
            }));
        }
        let mut ops = Vec::new();
        let Some(result) = self.quick_call(&mut s, channel, &req, room, &mut ops) else {
            drop(s);
            return later(req);
        };
        drop(s);
        let reply = fitted_reply(op, seq, result, room)?;
        Some(FsOutcome::Now(FsAnswer { reply, ops }))
    }

    /// A stat on the poller from what the channel's connection published (its credentials,
    /// its handles), under the file-system lock alone; `None` when that lock is busy or the
    /// file system cannot answer quickly, for the session's path to take it.
    fn quick_stat(&self, channel: u32, target: &Target) -> Option<Result<FsReply, Failure>> {
        // The handle's inode is read with the credentials, under the registry's lock.
        let (cred, ino) = {
            let registry = self.registry.try_lock().ok()?;
            let p = registry.get(&channel)?;
            let ino = match target {
                Target::Handle(h) => p.get(*h).map(|(ino, _)| ino),
                Target::Path { .. } => None,
            };
            (p.cred.clone(), ino)
        };
        let mut fs = self.fs.try_lock().ok()?;
        if !fs.quick_ready() {
            return None;
        }
        let handle_ino = |_| ino.ok_or_else(no_handle);
        // A stat may end another channel's size grant, a transaction: in quick mode, as any
        // change the poller makes.
        fs.set_quick(true);
        let r = stat_target(&mut fs, &cred, handle_ino, Some(channel), target);
        fs.set_quick(false);
        Some(r)
    }

    /// `OP_FS_STATDIR` on the poller, as [`Manager::quick_stat`] answers a stat; `None` when
    /// a lock is busy or the file system cannot answer quickly.
    fn quick_stat_dir(
        &self,
        channel: u32,
        path: &[u8],
        cookie: u64,
        follow: bool,
        room: usize,
    ) -> Option<Result<FsReply, Failure>> {
        let cred = {
            let registry = self.registry.try_lock().ok()?;
            registry.get(&channel)?.cred.clone()
        };
        let mut fs = self.fs.try_lock().ok()?;
        if !fs.quick_ready() {
            return None;
        }
        Some(statdir::stat_dir(
            &mut fs,
            &cred,
            Some(channel),
            path,
            cookie,
            follow,
            statdir::QUICK_ENTRIES,
            room,
        ))
    }

    /// A call of the channel's connection made by one of the device's file-call workers
    /// exactly as the socket makes it ([`Manager::call`], which may wait for locks and for the
    /// poller): the poller completes the command with its answer.
    fn call_later(
        self: &Arc<Self>,
        session: &Arc<Mutex<Session>>,
        channel: u32,
        req: FsRequest,
        seq: u32,
        op: u16,
        room: usize,
    ) -> FsOutcome {
        self.later(session, seq, op, room, move |me, s| {
            let mut s = s.lock().unwrap_or_else(|e| e.into_inner());
            if s.ending {
                // Its channel is going, and the id may be another connection's soon: nothing
                // may be published, watched or granted for it any more.
                return Err(fail(errno::EBADF, "the connection is closing"));
            }
            me.call(&mut s, Some(channel), req)
        })
    }

    /// `fsync` at the `Host` level through the channel: a durability point waits for the
    /// host's disk, so it is left to the device's file-call workers, where it joins the group
    /// commit of the socket's callers ([`Manager::fsync`]). The handle is looked up when the
    /// worker runs, as the socket would when the call came; the session is not held through
    /// the flush.
    fn fsync_later(
        self: &Arc<Self>,
        session: &Arc<Mutex<Session>>,
        handle: u64,
        seq: u32,
        op: u16,
        room: usize,
    ) -> FsOutcome {
        self.later(session, seq, op, room, move |me, s| {
            let ino = Self::handle(&s.lock().unwrap_or_else(|e| e.into_inner()), handle)?.ino;
            me.fsync(ino).map_err(failure)?;
            Ok(FsReply::Empty)
        })
    }

    /// Work for a file-call worker: `work` with the manager and the session (a connection
    /// gone meanwhile is `EBADF`), its result as the reply message of request `seq`.
    fn later(
        self: &Arc<Self>,
        session: &Arc<Mutex<Session>>,
        seq: u32,
        op: u16,
        room: usize,
        work: impl FnOnce(&Arc<Self>, &Arc<Mutex<Session>>) -> Result<FsReply, Failure> + Send + 'static,
    ) -> FsOutcome {
        let me = self.clone();
        let session = Arc::downgrade(session);
        FsOutcome::Later(Box::new(move || {
            let result = match session.upgrade() {
                Some(s) => work(&me, &s),
                None => Err(fail(errno::EBADF, "the connection has closed")),
            };
            FsAnswer {
                // An empty reply is out of bounds for the poller, which then refers the call.
                reply: fitted_reply(op, seq, result, room).unwrap_or_default(),
                ops: Vec::new(),
            }
        }))
    }

    /// One call of `s` on the poller. `None` leaves it to a worker (or refers it), and then
    /// nothing has changed.
    fn quick_call(
        &self,
        s: &mut Session,
        channel: u32,
        req: &FsRequest,
        room: usize,
        ops: &mut Vec<TableOp>,
    ) -> Option<Result<FsReply, Failure>> {
        // The releaser's queue, the lock table (some calls need it), then the file system;
        // all only tried. The releaser takes its work under the file-system lock, so with
        // both held here the queue says exactly which frees are still to come.
        let mut rel = self.releases.try_lock().ok()?;
        let mut locks = self.locks.try_lock().ok()?;
        let mut fs = self.fs.try_lock().ok()?;
        if !fs.quick_ready() {
            if fs.durability() == Durability::Host {
                rel.checkpoint = true;
                self.work_queued.store(true, Ordering::Release);
                let wake = std::mem::take(&mut rel.parked);
                drop((fs, locks, rel));
                if wake {
                    self.release_wake.notify_one();
                }
            }
            return None;
        }
        let pending = !rel.inos.is_empty();
        if pending && matches!(req, FsRequest::Statfs) {
            // The free space must count what the queued releases free.
            return None;
        }
        let mut released = Vec::new();
        fs.set_quick(true);
        let r = self.quick_in(
            &mut fs,
            &mut locks,
            s,
            channel,
            req,
            room,
            ops,
            &mut released,
        );
        fs.set_quick(false);
        let mut wake = false;
        if !rel.zero_ahead && fs.wants_zeroing() {
            // Clean space is short: the releaser zeroes ahead, so that the calls to come find
            // some at once rather than going to the socket to zero it.
            rel.zero_ahead = true;
            wake = std::mem::take(&mut rel.parked);
        }
        if !released.is_empty() {
            rel.inos.extend(released);
            self.work_queued.store(true, Ordering::Release);
            // Only a parked releaser is woken, once the locks are down (it takes them): one
            // gathering in its pause finds what comes meanwhile without a wake-up.
            wake |= std::mem::take(&mut rel.parked);
        }
        drop((fs, locks, rel));
        if wake {
            self.release_wake.notify_one();
        }
        match r {
            Some(Err(f)) if f.errno == NOT_QUICK => {
                ops.clear();
                None
            }
            // Space that a queued release will free may be what this call lacks.
            Some(Err(f)) if f.errno == errno::ENOSPC && pending => None,
            other => other,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn quick_in(
        &self,
        fs: &mut Fs,
        locks: &mut LockState,
        s: &mut Session,
        channel: u32,
        req: &FsRequest,
        room: usize,
        ops: &mut Vec<TableOp>,
        released: &mut Vec<u64>,
    ) -> Option<Result<FsReply, Failure>> {
        let cred = s.cred.clone();
        // Extents an answer may carry in the slice.
        let max = (room.saturating_sub(EXTENTS_OVERHEAD) / EXTENT_BYTES).min(MAX_EXTENTS);
        let r = match req {
            &FsRequest::Open {
                flags,
                mode,
                ref path,
            }
            | &FsRequest::OpenRoom {
                flags,
                mode,
                ref path,
            } => {
                if s.handles.len() >= MAX_HANDLES {
                    return Some(Err(fail(
                        errno::EMFILE,
                        "too many open files on this connection",
                    )));
                }
                let flags = flags as i32;
                if flags & libc::O_TRUNC != 0 {
                    // Truncating a file with data frees space: a worker does that.
                    let follow = flags & libc::O_NOFOLLOW == 0;
                    if let Ok(ino) = fs.lookup(&cred, path, follow) {
                        if fs.stat_ino(ino).size > 0 {
                            return None;
                        }
                    }
                }
                if locks.leases.any() || locks.sole.any() {
                    // Another open of a leased file takes the lease back first; when its
                    // holder is changing its locks, a worker waits for it. A sole lease's
                    // end waits for its holder's writes: a worker does that too.
                    let follow = flags & libc::O_NOFOLLOW == 0;
                    if let Ok(ino) = fs.lookup(&cred, path, follow) {
                        if locks.sole.on(ino) || !self.recall(locks, ino, false) {
                            return None;
                        }
                    }
                }
                fs.open(&cred, path, flags, mode)
                    .map(|o| {
                        let ino = o.ino;
                        let reply = Self::opened(s, locks, o);
                        if let FsReply::Opened { handle, .. } = reply {
                            if let Some(h) = s.handles.get(&handle).copied() {
                                // Not a file with pages mapped (nor when that cannot be
                                // known at once): stores there do not wait for writes.
                                let sole = fs.open_count(ino) == 1
                                    && self.segments.try_lock().is_ok_and(|g| !g.has(ino));
                                self.try_grant_sole(locks, s, channel, handle, &h, sole);
                            }
                        }
                        if !matches!(req, FsRequest::OpenRoom { .. }) {
                            watch_opened(fs, Some(channel), &reply);
                            return reply;
                        }
                        // A mapped file's space is shown from its segment: no room for it
                        // (nor when the segments are busy: the client extends later).
                        let mapped = |ino| self.segments.try_lock().map_or(true, |g| g.has(ino));
                        // The extents that fit the slice beside the attributes.
                        let max = (room.saturating_sub(EXTENTS_OVERHEAD + STAT_LEN) / EXTENT_BYTES)
                            .min(MAX_EXTENTS);
                        let (reply, given) =
                            self.opened_room(fs, s, Some(channel), mapped, reply, max);
                        if let Some((h, maps, file)) = given {
                            ops.extend(inserts(s, channel, &h, &maps, file));
                        }
                        // After the room's transaction, which fires the file's watches.
                        watch_opened(fs, Some(channel), &reply);
                        reply
                    })
                    .map_err(failure)
            }
            &FsRequest::Close { handle } => (|| {
                let h = Self::handle(s, handle)?;
                let before = s.rights(h.ino);
                s.remove(handle);
                self.drop_lease(locks, h.ino);
                self.drop_sole(locks, Some(channel), handle, h.ino);
                locks.table.release(h.ino, Owner::Session(s.id));
                locks.close_ofd(h.ofd);
                if s.rights(h.ino) != before {
                    ops.extend(removals(fs, h.ino, channel));
                }
                self.end_size_grant(fs, Some(channel), handle);
                if fs.open_count(h.ino) == 1
                    && (fs.nlink(h.ino) == 0 && fs.stat_ino(h.ino).blocks > 0
                        || fs.trims_at_close(h.ino))
                {
                    // The last handle of an unlinked file with space, or of a file with room
                    // allocated past its end: closing it frees that space, which revokes
                    // first.
                    released.push(h.ino);
                } else {
                    fs.close(h.ino).map_err(failure)?;
                }
                Ok(FsReply::Empty)
            })(),
            &FsRequest::Lookup {
                handle,
                offset,
                len,
            } => (|| {
                let h = Self::handle(s, handle)?;
                let (size, maps) = fs.map(h.ino, offset, len, max).map_err(failure)?;
                let file = fs.layout_tag(h.ino);
                ops.extend(inserts(s, channel, &h, &maps, file));
                Ok(extents(size, file, &maps))
            })(),
            &FsRequest::Extend {
                handle,
                offset,
                len,
            } => (|| {
                let h = Self::handle(s, handle)?;
                if !h.write {
                    return Err(fail(errno::EBADF, "the handle is not open for writing"));
                }
                // A mapped file's new space is shown from its segment, which revokes records
                // and waits for the poller: the socket does that.
                match self.segments.try_lock() {
                    Ok(segs) if !segs.has(h.ino) => {}
                    _ => return Err(fail(NOT_QUICK, "a mapped file grows through the socket")),
                }
                let (size, maps) =
                    self.extend_with_room(fs, Some(channel), false, &h, handle, offset, len, max)?;
                let file = fs.layout_tag(h.ino);
                ops.extend(inserts(s, channel, &h, &maps, file));
                Ok(extents(size, file, &maps))
            })(),
            &FsRequest::Fsync { handle } => {
                // At the `Device` level a durability point flushes nothing; at `Host` it
                // does, and a worker makes it (`quick_request`).
                if fs.durability() != Durability::Device {
                    return None;
                }
                Self::handle(s, handle)
                    .and_then(|h| fs.fsync(h.ino).map_err(failure))
                    .map(|()| FsReply::Empty)
            }
            FsRequest::Stat { target } => stat_target(
                fs,
                &cred,
                |h| Self::handle(s, h).map(|h| h.ino),
                Some(channel),
                target,
            ),
            &FsRequest::Statfs => Ok(statfs_reply(fs)),
            &FsRequest::Unlink { ref path } | &FsRequest::UnlinkKeep { ref path } => {
                let keep = matches!(req, FsRequest::UnlinkKeep { .. });
                let held = self.hold_last_name(fs, &cred, path);
                let r = fs.unlink(&cred, path).map_err(failure);
                self.after_hold(fs, held, released);
                if keep && r.is_ok() {
                    watch_unlinked(fs, &cred, Some(channel), path);
                }
                r.map(|()| FsReply::Empty)
            }
            &FsRequest::Rename {
                flags,
                ref from,
                ref to,
            } => {
                let held = if flags & RENAME_NOREPLACE != 0 {
                    None
                } else {
                    self.hold_last_name(fs, &cred, to)
                };
                let r = fs
                    .rename(&cred, from, to, flags & RENAME_NOREPLACE != 0)
                    .map_err(failure);
                self.after_hold(fs, held, released);
                r.map(|()| FsReply::Empty)
            }
            &FsRequest::Utimes {
                ref target,
                atime,
                mtime,
            } => (|| {
                let ino = self.target_ino(fs, s, target)?;
                fs.utimes(&cred, ino, set_time(atime), set_time(mtime))
                    .map_err(failure)?;
                Ok(FsReply::Empty)
            })(),
            &FsRequest::Chmod { ref target, mode } => (|| {
                let ino = self.target_ino(fs, s, target)?;
                fs.chmod(&cred, ino, mode).map_err(failure)?;
                Ok(FsReply::Empty)
            })(),
            &FsRequest::Chown {
                ref target,
                uid,
                gid,
            } => (|| {
                let ino = self.target_ino(fs, s, target)?;
                let opt = |v: u32| (v != u32::MAX).then_some(v);
                fs.chown(&cred, ino, opt(uid), opt(gid)).map_err(failure)?;
                Ok(FsReply::Empty)
            })(),
            // The name space: none of these frees space (a directory, a name and a link
            // target take records, not chunks), and the file system refuses in quick mode
            // anything that would flush or revoke.
            &FsRequest::Mkdir { mode, ref path } => fs
                .mkdir(&cred, path, mode)
                .map(|st| FsReply::Stat(wire_stat(&st)))
                .map_err(failure),
            FsRequest::Rmdir { path } => fs
                .rmdir(&cred, path)
                .map(|()| FsReply::Empty)
                .map_err(failure),
            FsRequest::Link { from, to } => fs
                .link(&cred, from, to)
                .map(|st| FsReply::Stat(wire_stat(&st)))
                .map_err(failure),
            FsRequest::Symlink { target, path } => fs
                .symlink(&cred, target, path)
                .map(|st| FsReply::Stat(wire_stat(&st)))
                .map_err(failure),
            FsRequest::Readlink { path } => fs
                .readlink(&cred, path)
                .map(FsReply::Bytes)
                .map_err(failure),
            &FsRequest::Readdir { handle, cookie } => (|| {
                let h = Self::handle(s, handle)?;
                if !h.read {
                    return Err(fail(errno::EBADF, "the handle is not open for reading"));
                }
                let (list, end) = fs.readdir(h.ino, cookie, 1024).map_err(failure)?;
                Ok(dir_reply(list, end, room.saturating_sub(DIR_OVERHEAD)))
            })(),
            _ => return None,
        };
        if let Ok(FsReply::Dir { entries, end }) = &r {
            if entries.is_empty() && !end {
                // Not one entry fits this channel's slice: the socket's message holds it.
                return None;
            }
        }
        Some(r)
    }
}

/// The reply message of a call that came to `result`, in at most `room` bytes: a failure's
/// message is cut to fit (nothing else can be long); `None` if even that does not fit.
fn fitted_reply(
    op: u16,
    seq: u32,
    result: Result<FsReply, Failure>,
    room: usize,
) -> Option<Vec<u8>> {
    let result = result.map(ReplyBody::Fs);
    let reply = encode_reply(op, seq, &result);
    if reply.len() <= room {
        return Some(reply);
    }
    let Err(f) = result else {
        tracing::error!("a quick call's reply does not fit the slice");
        return None;
    };
    let keep = room.saturating_sub(reply.len() - f.message.len());
    let mut message = f.message;
    while message.len() > keep {
        message.pop();
    }
    Some(encode_reply(
        op,
        seq,
        &Err(Failure {
            errno: f.errno,
            message,
        }),
    ))
}
