//! Transactions and durability points: committing a change to the journal (and making room
//! for it), zeroing and recycling free space, and what `fsync`, a checkpoint and an unmount
//! flush at each durability level; the quick mode in which the poller may call in.

use super::*;

impl Fs {
    /// Commits the call's change, then frees the space of files too large to free in it.
    pub(super) fn commit(&mut self) -> FsResult<()> {
        self.commit_one()?;
        self.settle()
    }

    /// Commits what was changed so far as one transaction.
    pub(super) fn commit_one(&mut self) -> FsResult<()> {
        // Before the caller's answer: whoever kept an answer about a changed inode hears first.
        let touched = std::mem::take(&mut self.touched);
        let mut fired = Vec::new();
        for &ino in self.dirty.iter().chain(touched.iter()) {
            self.watches.changed(ino, &mut fired);
        }
        if let Some(sink) = &self.sink {
            // Once for each (observer, slot), however many of its inodes changed.
            fired.sort_unstable();
            fired.dedup();
            for (observer, slot) in fired {
                sink.changed(observer, slot);
            }
        }
        for ino in std::mem::take(&mut self.dirty) {
            if self.images {
                let rec = self.inodes[(ino - 1) as usize].encode(ino);
                self.txn.put(self.g.inode_addr(ino), &rec);
            }
        }
        for (w, v) in self.space.take_dirty_words() {
            if self.images {
                self.txn
                    .put(self.g.bitmap_off + w as u64 * 8, &v.to_le_bytes());
            }
        }
        let txn = std::mem::take(&mut self.txn);
        match self.journal.commit(&*self.media, txn) {
            Ok(seq) => {
                self.space.committed(seq, self.journal.durable_seq());
                if self.journal.level() == Durability::Device {
                    // Freed space may be reused at once: recycle what is short.
                    let (runs, _) = self.recycle()?;
                    self.space.recycled(&runs);
                }
                Ok(())
            }
            Err(err) => {
                let msg = format!("metadata commit failed: {err}");
                tracing::error!("{msg}");
                self.failed = Some(msg.clone());
                e(libc::EIO, msg)
            }
        }
    }

    /// Journal bytes the transaction being built will take, about.
    pub(super) fn txn_estimate(&self) -> u64 {
        self.txn.body_len()
            + self.dirty.len() as u64 * (16 + INODE_SIZE)
            + self.space.bits().dirty_words() as u64 * 24
    }

    /// Journal bytes a call's transaction may grow to before freeing or allocating more waits
    /// for a transaction of its own: half the log, leaving room for the rest of the call.
    pub(super) fn txn_budget(&self) -> u64 {
        self.journal.capacity() / 2
    }

    /// Frees, in transactions of their own, the space of the files [`Fs::release`] could not
    /// free in the call's: each transaction frees extents from the file's end until it is
    /// full, the last clears the inode. Until then the inode is an orphan (no name, no link),
    /// which a mount after a crash frees.
    pub(super) fn settle(&mut self) -> FsResult<()> {
        while let Some(&ino) = self.doomed.last() {
            let budget = self.txn_budget();
            loop {
                let done = self.free_from(ino, 0, budget);
                if done {
                    self.forget(ino);
                }
                if let Err(err) = self.commit_one() {
                    return Err(self.fail(&err));
                }
                if done {
                    break;
                }
            }
            self.doomed.pop();
        }
        Ok(())
    }

    /// Zeroes a batch of dirty free space (at least `want` chunks, when there are) so that
    /// it can be handed out; at the `Host` level it is flushed first, since a crash that kept
    /// an allocation but not the zeroing would show a file another file's bytes.
    pub(super) fn zero_batch(&mut self, want: u64) -> FsResult<()> {
        let runs = self.space.take_dirty(want);
        let mut ranges = Vec::with_capacity(runs.len() * 2);
        for &(s, l) in &runs {
            let (addr, len) = (self.g.chunk_addr(s), l * self.g.chunk_size);
            if let Err(err) = self.zero(addr, len) {
                self.space.zeroed(&runs, false);
                return e(libc::EIO, format!("cannot zero free space: {err}"));
            }
            ranges.push((addr, len));
            ranges.extend(self.sums.and_then(|c| c.sums_range(addr, len)));
        }
        if self.journal.level() == Durability::Host {
            if let Err(err) = self.media.flush_ranges(&journal::merge(ranges)) {
                self.space.zeroed(&runs, false);
                return e(libc::EIO, format!("cannot flush zeroed free space: {err}"));
            }
        }
        self.space.zeroed(&runs, true);
        Ok(())
    }

    /// Whether clean space is short and dirty free space could make more: a file made now
    /// and again, or growing, would soon find none to take at once (the poller's quick calls
    /// never zero, and a call that must is referred to the control socket). Some other thread
    /// should call [`Fs::zero_ahead`].
    pub fn wants_zeroing(&self) -> bool {
        let cs = self.g.chunk_size;
        let low = ZERO_AHEAD_LOW.min(self.g.chunk_count * cs / 8);
        self.failed.is_none() && self.space.dirty() > 0 && self.space.clean() * cs < low
    }

    /// Zeroes a batch ([`ZERO_AHEAD_BATCH`]) of dirty free space while clean space is short
    /// ([`Fs::wants_zeroing`]), as an allocation would have to; whether more is wanted.
    pub fn zero_ahead(&mut self) -> FsResult<bool> {
        if !self.wants_zeroing() {
            return Ok(false);
        }
        self.zero_batch((ZERO_AHEAD_BATCH / self.g.chunk_size).max(1))?;
        Ok(self.wants_zeroing())
    }

    /// Zeroes short runs freed durably since the last call (a few: see [`RECYCLE_MAX`]) to
    /// recycle them; returns them (chunks) and the array ranges zeroed (with their checksums),
    /// which at the `Host` level must be flushed before the runs are recycled.
    pub(super) fn recycle(&mut self) -> FsResult<(Runs, Runs)> {
        let cs = self.g.chunk_size;
        let runs = self.space.take_short_dirty(
            (RECYCLE_RUN / cs).max(1),
            (RECYCLE_MAX / cs).max(1),
            (HOT_MAX / cs).max(1),
        );
        let mut ranges = Vec::with_capacity(runs.len() * 2);
        // At the host level the zeros are flushed soon: written so that the flush does not
        // have to write-protect the mapping (`Media::write_file`).
        let by_file = self.journal.level() == Durability::Host && self.sums.is_none();
        // Zeros for the longest run there is (none when there is nothing to recycle, as at
        // most durability points).
        let longest = runs.iter().map(|&(_, l)| l * cs).max().unwrap_or(0);
        let zeros = vec![0u8; if by_file { longest as usize } else { 0 }];
        for &(s, l) in &runs {
            let (addr, len) = (self.g.chunk_addr(s), l * cs);
            let zeroed = if by_file {
                self.media.write_file(addr, &zeros[..len as usize])
            } else {
                self.zero(addr, len)
            };
            if let Err(err) = zeroed {
                self.space.zeroed(&runs, false);
                return e(libc::EIO, format!("cannot zero freed space: {err}"));
            }
            ranges.push((addr, len));
            ranges.extend(self.sums.and_then(|c| c.sums_range(addr, len)));
        }
        Ok((runs, ranges))
    }

    /// Makes at least `need` chunks available to `ino` (clean, or in its own reserve):
    /// zeroes dirty space, makes freed space durable (`Host`), takes other files' reserves
    /// back. The caller checked that `need` chunks are free.
    pub(super) fn make_room(&mut self, ino: u64, need: u64) -> FsResult<()> {
        if self.quick {
            let own = self.reserves.get(&ino).map_or(0, |&(s, e)| e - s);
            if self.space.clean() + own < need {
                return e(NOT_QUICK, "the space must be zeroed or made durable first");
            }
        }
        loop {
            let batch = (self.next_zero_batch / self.g.chunk_size).max(1);
            let own = self.reserves.get(&ino).map_or(0, |&(s, e)| e - s);
            let have = self.space.clean() + own;
            if have >= need {
                return Ok(());
            }
            if self.space.dirty() > 0 {
                self.zero_batch((need - have).max(batch))?;
                self.next_zero_batch = (self.next_zero_batch * 2).min(ZERO_BATCH);
            } else if self.space.pending() > 0 {
                // Freed by transactions that are not durable yet: make them so.
                self.sync_now(&[])?;
            } else if self.reserves.len() > usize::from(own > 0) {
                let others: Vec<u64> = self
                    .reserves
                    .keys()
                    .copied()
                    .filter(|&i| i != ino)
                    .collect();
                for other in others {
                    self.drop_reserve(other);
                }
            } else if own > 0 {
                self.drop_reserve(ino);
            } else {
                return e(libc::ENOSPC, "no space left");
            }
        }
    }

    /// A durability point now, under the lock: the log and `extra`, flushed together.
    pub(super) fn sync_now(&mut self, extra: &[(u64, u64)]) -> FsResult<()> {
        if let Err(err) = self.journal.sync(&*self.media, extra) {
            return e(libc::EIO, format!("flush failed: {err}"));
        }
        self.space.durable(self.journal.durable_seq());
        Ok(())
    }

    pub(super) fn txn_pending(&self) -> bool {
        !self.txn.is_empty() || !self.dirty.is_empty()
    }

    /// `fsync` of `ino`, a durability point: at the `Host` level the file's data (and their
    /// checksums) and every metadata change so far reach the host's disk in one ordered flush
    /// ([`Fs::sync_plan`], the flush, [`Fs::sync_done`]); at the `Device` level they are in
    /// the array already and nothing is flushed.
    pub fn fsync(&mut self, ino: u64) -> FsResult<()> {
        let Some(plan) = self.sync_plan(Some(ino))? else {
            return Ok(());
        };
        let flushed = self.media.flush_ranges(&plan.ranges);
        self.sync_done(&plan, flushed)
    }

    /// What a durability point for `fsync` of `ino` (or of the metadata alone, `None`) must
    /// flush; `None` at the `Device` level, where nothing is. The caller flushes the ranges
    /// (with `Media::flush_ranges`, outside the file-system lock if it likes, merged with
    /// other callers' plans) and then calls [`Fs::sync_done`].
    pub fn sync_plan(&mut self, ino: Option<u64>) -> FsResult<Option<SyncPlan>> {
        self.check_alive()?;
        // Sizes published under grants are part of what the durability point keeps.
        let settled = match ino {
            Some(ino) => self.settle_size(ino),
            None => self.settle_all_sizes(),
        };
        if settled {
            self.commit()?;
        }
        if self.journal.level() == Durability::Device {
            return Ok(None);
        }
        let (seq, mut ranges) = self.journal.pending();
        if let Some(ino) = ino {
            let data = self.ranges_from(ino, 0);
            for &(addr, len) in &data {
                ranges.extend(self.sums.and_then(|c| c.sums_range(addr, len)));
            }
            ranges.extend(coalesce(data, SYNC_GAP));
        }
        // Short runs whose free is durable already are zeroed now and flushed with the rest
        // (never on their own: a flush just for them would cost what recycling saves).
        let (recycled, zeroed) = if ranges.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            self.recycle()?
        };
        ranges.extend(zeroed);
        Ok(Some(SyncPlan {
            ranges: journal::merge(ranges),
            seq,
            recycled,
        }))
    }

    /// Finishes a durability point whose ranges were flushed with result `flushed`: the
    /// metadata up to the plan's transaction is durable and its images go in place.
    pub fn sync_done(&mut self, plan: &SyncPlan, flushed: std::io::Result<()>) -> FsResult<()> {
        if let Err(err) = flushed {
            self.space.zeroed(&plan.recycled, false);
            return e(libc::EIO, format!("flush failed: {err}"));
        }
        self.space.recycled(&plan.recycled);
        if let Err(err) = self.journal.made_durable(&*self.media, plan.seq) {
            let msg = format!("metadata could not be written in place: {err}");
            self.failed = Some(msg.clone());
            return e(libc::EIO, msg);
        }
        self.space.durable(self.journal.durable_seq());
        Ok(())
    }

    /// Makes everything durable and the tables independent of the journal (a checkpoint):
    /// what a clean stop does. Reserves go back.
    pub fn unmount(&mut self) -> FsResult<()> {
        self.check_alive()?;
        self.end_grants(|_| true)?;
        let files: Vec<u64> = self.reserves.keys().copied().collect();
        for ino in files {
            self.drop_reserve(ino);
        }
        if let Err(err) = self.journal.checkpoint(&*self.media) {
            return e(libc::EIO, format!("checkpoint failed: {err}"));
        }
        self.space.durable(self.journal.durable_seq());
        Ok(())
    }

    /// Checkpoints the journal when [`Fs::quick_ready`] says its log has too little room for
    /// quick calls: what a helper thread does for them, since a checkpoint at the `Host` level
    /// flushes.
    pub fn checkpoint_if_full(&mut self) -> FsResult<()> {
        self.check_alive()?;
        if self.quick_ready() {
            return Ok(());
        }
        if let Err(err) = self.journal.checkpoint(&*self.media) {
            return e(libc::EIO, format!("checkpoint failed: {err}"));
        }
        self.space.durable(self.journal.durable_seq());
        Ok(())
    }

    /// Quick mode, for a caller that must not wait (the device's poller answering a file
    /// call from a channel): calls that would zero free space, make frees durable or revoke
    /// records fail with [`NOT_QUICK`] before they change anything. The caller also checks
    /// [`Fs::quick_ready`] first and keeps away from calls that free space.
    pub fn set_quick(&mut self, on: bool) {
        self.quick = on;
    }

    /// Whether a call may run in quick mode now: the file system has not failed and, at the
    /// `Host` level, the log has room for a call's transaction without a checkpoint (which
    /// flushes).
    pub fn quick_ready(&self) -> bool {
        self.failed.is_none()
            && (self.journal.level() == Durability::Device
                || self.journal.room() >= self.journal.capacity() / 2 + journal::TXN_HEADER)
    }
}
