//! Freeing what the poller's quick calls leave (`quick.rs`): a file with space that loses its
//! last name, or the last handle of such a file, is *held* one more open count instead of
//! freed, since freeing revokes records and waits for the poller, which must never wait. The
//! releaser thread (and every call on the control socket, first) then closes those holds,
//! with one revocation for all of them: without the file-system lock for the files nothing
//! else can reach any more, so that quick calls are not held up by it.

use super::*;

/// How long the releaser thread lets unlinked files gather before it frees them together.
const RELEASE_GATHER: std::time::Duration = std::time::Duration::from_micros(500);

/// The releaser's pause between batches of zeroing ahead of need.
const ZERO_AHEAD_PAUSE: std::time::Duration = std::time::Duration::from_micros(100);

/// Work the poller's quick calls leave for the releaser thread.
#[derive(Default)]
pub(super) struct Releases {
    /// Inodes held once more than their handles: closing that hold frees them.
    pub(super) inos: Vec<u64>,
    /// The journal needs a checkpoint before quick calls can go on.
    pub(super) checkpoint: bool,
    /// Clean space is short: dirty free space is to be zeroed ahead of the quick calls that
    /// would need it (`Fs::zero_ahead`).
    pub(super) zero_ahead: bool,
    /// The releaser waits to be woken (it is not gathering or settling).
    pub(super) parked: bool,
    /// A settler is revoking the space of queued files without the file-system lock; the
    /// files stay queued until it frees them, and other settlers wait for it.
    settling: bool,
}

/// Revocation before reuse, everywhere freed space may still be reached: the member hosts
/// sharing the file system, mapped files' segments, and every channel's records (waiting for
/// the requests in flight over them).
pub(super) struct Revocation {
    pub(super) device: Arc<Device>,
    pub(super) segments: Arc<Mutex<Segments>>,
    pub(super) members: Arc<std::sync::OnceLock<Weak<crate::share::Holder>>>,
}

impl Revocation {
    pub(super) fn revoke(&self, ranges: &[(u64, u64)]) -> Result<(), FsError> {
        // The member hosts of a shared file system drop their records first (each also
        // waits for what its channels have in flight).
        if let Some(h) = self.members.get().and_then(Weak::upgrade) {
            h.revoke(ranges);
        }
        // A mapped file losing space loses its segment first (see `segments.rs`).
        self.segments
            .lock()
            .expect("segments lock")
            .retire_over(ranges)
            .map_err(|f| FsError {
                errno: f.errno,
                message: f.message,
            })?;
        let ops = ranges
            .iter()
            .map(|&(start, len)| TableOp::RemoveRangeAll { start, len })
            .collect();
        self.device.update(ops).map_err(|e| FsError {
            errno: libc::EIO,
            message: format!("revocation failed: {e}"),
        })
    }
}

impl Manager {
    /// Before a call that may take the last name of the regular file at `path` (without
    /// following a final symlink): holds that file if it has space, so that losing the name
    /// does not free it on the poller (a file without space is freed at once: nothing to
    /// revoke). The file held, if any.
    pub(super) fn hold_last_name(
        &self,
        fs: &mut Fs,
        cred: &moneta_fs::Cred,
        path: &[u8],
    ) -> Option<u64> {
        let ino = fs.lookup(cred, path, false).ok()?;
        let st = fs.stat_ino(ino);
        if st.mode & libc::S_IFMT != libc::S_IFREG || st.nlink != 1 || st.blocks == 0 {
            return None;
        }
        fs.hold(ino).ok()?;
        Some(ino)
    }

    /// After the call: a held file that lost its last name and has no other handle is left
    /// for the releaser; otherwise the hold goes at once (it frees nothing).
    pub(super) fn after_hold(&self, fs: &mut Fs, held: Option<u64>, released: &mut Vec<u64>) {
        let Some(ino) = held else { return };
        if fs.nlink(ino) == 0 && fs.open_count(ino) == 1 {
            released.push(ino);
        } else if let Err(e) = fs.close(ino) {
            tracing::warn!(ino, "dropping a quick call's hold: {e}");
        }
    }

    /// Closes the holds quick calls left (freeing their files, with revocation) and makes
    /// the checkpoint they asked for, here and now; nothing to do costs one load.
    ///
    /// The space of queued files that nothing else can reach any more (unlinked, open only
    /// through the queued holds: `Fs::unreachable`) is revoked first without the file-system
    /// lock, which the revocation would otherwise hold while it waits for the poller, so that
    /// quick calls go on meanwhile instead of going to the workers. The files stay queued
    /// until they are freed, so no call counts their space free before that (a quick `statfs`
    /// or a call short of space goes to the socket, whose settler waits for this one).
    pub(super) fn settle_releases(&self) {
        if !self.work_queued.load(Ordering::Acquire) {
            return;
        }
        let lock = || self.releases.lock().unwrap_or_else(|e| e.into_inner());
        // One settler at a time (the file system, then the queue, as quick calls take them).
        let (mut fs, unreachable) = loop {
            drop(self.wait_settled(lock()));
            let fs = self.fs();
            let mut r = lock();
            if r.settling {
                continue;
            }
            if r.inos.is_empty() && !r.checkpoint {
                return;
            }
            let (files, ranges) = fs.unreachable(&r.inos);
            let files: Vec<(u64, u32)> = files
                .into_iter()
                .map(|ino| (ino, fs.generation(ino)))
                .collect();
            r.settling = !ranges.is_empty();
            break (fs, (files, ranges));
        };
        let (files, ranges) = unreachable;
        let mut revoked = Vec::new();
        if !ranges.is_empty() {
            drop(fs);
            let done = self.revocation.revoke(&ranges);
            fs = self.fs();
            match done {
                // Nothing could reach them meanwhile; the generation says each is still the
                // file whose space was revoked.
                Ok(()) => {
                    revoked = files
                        .into_iter()
                        .filter(|&(ino, g)| fs.exists(ino) && fs.generation(ino) == g)
                        .map(|(ino, _)| ino)
                        .collect()
                }
                Err(e) => tracing::warn!("revoking unlinked files' space: {e}"),
            }
        }
        // Work taken from the queue is done before the file system's lock goes, so a quick
        // call (which needs both) never sees a queue emptied of frees not yet made.
        let (inos, checkpoint) = {
            let mut r = lock();
            self.work_queued.store(false, Ordering::Release);
            if std::mem::take(&mut r.settling) {
                self.settled.notify_all();
            }
            (
                std::mem::take(&mut r.inos),
                std::mem::take(&mut r.checkpoint),
            )
        };
        // One revocation for all the rest (an `rm -rf` queues thousands).
        match fs.close_many_revoked(&inos, &revoked) {
            Ok(not_open) => {
                for ino in not_open {
                    tracing::warn!(ino, "freeing an unlinked file: it was not open");
                }
            }
            Err(e) => tracing::warn!("freeing unlinked files: {e}"),
        }
        if checkpoint {
            if let Err(e) = fs.checkpoint_if_full() {
                tracing::warn!("checkpoint for quick calls: {e}");
            }
        }
    }

    /// Waits until no settler is revoking without the file-system lock.
    fn wait_settled<'a>(
        &self,
        mut r: std::sync::MutexGuard<'a, Releases>,
    ) -> std::sync::MutexGuard<'a, Releases> {
        while r.settling {
            r = self.settled.wait(r).unwrap_or_else(|e| e.into_inner());
        }
        r
    }

    /// The releaser thread: settles what quick calls leave as soon as they leave it.
    pub(super) fn release_loop(&self) {
        loop {
            {
                let mut r = self.releases.lock().unwrap_or_else(|e| e.into_inner());
                while r.inos.is_empty() && !r.checkpoint && !r.zero_ahead {
                    r.parked = true;
                    r = self.release_wake.wait(r).unwrap_or_else(|e| e.into_inner());
                }
                r.parked = false;
            }
            // A moment for more to come (an `rm -rf` unlinks a file every few microseconds):
            // they then share one revocation, which waits for the poller.
            std::thread::sleep(RELEASE_GATHER);
            self.settle_releases();
            self.zero_ahead();
        }
    }

    /// Zeroes dirty free space while clean space is short, a batch per hold of the
    /// file-system lock, with a pause between for the quick calls (which only try the lock).
    fn zero_ahead(&self) {
        let asked = std::mem::take(
            &mut self
                .releases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .zero_ahead,
        );
        if !asked {
            return;
        }
        loop {
            match self.fs().zero_ahead() {
                Ok(true) => std::thread::sleep(ZERO_AHEAD_PAUSE),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!("zeroing free space ahead of need: {e}");
                    return;
                }
            }
        }
    }
}
