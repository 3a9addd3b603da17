//! A file's life: opening (creating, truncating), holding, closing, and freeing its space
//! once its last name and handle are gone, behind the revocation of every channel's records.

use super::*;

impl Fs {
    pub(super) fn revoke(&mut self, ranges: &[(u64, u64)]) -> FsResult<()> {
        if ranges.is_empty() {
            return Ok(());
        }
        // Quick callers keep away from calls that free space ([`Fs::hold`]); this
        // catches a mistake before anything changed in the calls that revoke first.
        debug_assert!(!self.quick, "a revocation in quick mode");
        if self.quick {
            return e(NOT_QUICK, "freeing space revokes records first");
        }
        match self.revoker.as_mut() {
            Some(r) => r(ranges),
            None => Ok(()),
        }
    }

    /// The tag of `ino`'s current layout: records installed for its extents carry it, and
    /// commands on them ask for it, so that a translation handed out before space left the
    /// file never matches records installed after. A file gets a new tag once any of its
    /// space is freed (its old records over that space were revoked first), and tags are not
    /// reused while mounted. Never 0 (which asks for no tag).
    pub fn layout_tag(&mut self, ino: u64) -> u64 {
        let next = &mut self.next_layout;
        *self.layouts.entry(ino).or_insert_with(|| {
            let t = *next;
            *next += 1;
            t
        })
    }

    /// Frees the chunks of `ino` from file chunk `from` on, the caller having revoked them,
    /// from the end backwards until the transaction being built reaches `budget` bytes.
    /// Returns whether all of them are freed.
    pub(super) fn free_from(&mut self, ino: u64, from: u64, budget: u64) -> bool {
        let Some(m) = self.extents.get(&ino) else {
            return true;
        };
        self.touched.insert(ino);
        let start = m.range(..=from).next_back().map_or(from, |(k, _)| *k);
        let keys: Vec<u64> = m.range(start..).rev().map(|(k, _)| *k).collect();
        let mut freed = false;
        let mut done = true;
        for fc in keys {
            if freed && self.txn_estimate() > budget {
                done = false;
                break;
            }
            let m = self.extents.get_mut(&ino).expect("listed above");
            let x = m[&fc];
            if fc + x.count <= from {
                continue;
            }
            let (s, l) = if fc >= from {
                m.remove(&fc);
                if self.images {
                    self.txn
                        .put(self.g.extent_addr(x.slot), &[0u8; EXTENT_SIZE as usize]);
                }
                self.free_extents.insert(x.slot);
                (x.dev, x.count)
            } else {
                let keep = from - fc;
                m.insert(fc, Ext { count: keep, ..x });
                let rec = ExtentRec {
                    ino,
                    file_chunk: fc,
                    dev_chunk: x.dev,
                    count: keep as u32,
                };
                if self.images {
                    self.txn
                        .put(self.g.extent_addr(x.slot), &rec.encode(x.slot));
                }
                (x.dev + keep, x.count - keep)
            };
            self.space.free_run(s, l);
            freed = true;
        }
        if self.extents.get(&ino).is_some_and(|m| m.is_empty()) {
            self.extents.remove(&ino);
        }
        if freed {
            // Space left the file: translations handed out so far must not match again.
            self.layouts.remove(&ino);
        }
        done
    }

    /// Frees an inode with no names and no open handles: its chunks (revoked first), its
    /// symlink target, its record; a file with more extents than the call's transaction can
    /// hold is freed after it, in transactions of its own ([`Fs::settle`]).
    pub(super) fn release(&mut self, ino: u64) -> FsResult<()> {
        let ranges = self.ranges_from(ino, 0);
        self.revoke(&ranges)?;
        self.drop_reserve(ino);
        let budget = self.txn_budget();
        if self.free_from(ino, 0, budget) {
            self.forget(ino);
        } else {
            self.doomed.push(ino);
        }
        Ok(())
    }

    /// Clears an inode whose space is freed: its symlink target, its record.
    pub(super) fn forget(&mut self, ino: u64) {
        if let Some((slot, _)) = self.symlinks.remove(&ino) {
            if self.images {
                self.txn
                    .put(self.g.dirent_addr(slot), &[0u8; DIRENT_SIZE as usize]);
            }
            self.free_dirents.insert(slot);
        }
        self.dirs.remove(&ino);
        self.parent.remove(&ino);
        let generation = self.inode(ino).generation;
        *self.inode_mut(ino) = Inode {
            generation,
            ..Default::default()
        };
        self.free_inodes.insert(ino);
    }

    /// Drops one name of `ino`; frees it when no name and no handle is left.
    pub(super) fn drop_link(&mut self, ino: u64, now: Time) -> FsResult<()> {
        let n = self.inode_mut(ino);
        n.ctime = now;
        if n.is_dir() {
            n.nlink = 0;
        } else {
            n.nlink = n.nlink.saturating_sub(1);
        }
        if n.nlink == 0 && self.open.get(&ino).copied().unwrap_or(0) == 0 {
            self.release(ino)?;
        }
        Ok(())
    }

    /// `open(2)`: the flags are Linux's (`O_ACCMODE`, `O_CREAT`, `O_EXCL`, `O_TRUNC`,
    /// `O_DIRECTORY`, `O_NOFOLLOW`; `O_APPEND` is the client's business; others are ignored).
    /// `mode` is applied as given (the client applies its umask). On success the inode counts
    /// one more open handle until [`Fs::close`].
    pub fn open(&mut self, cred: &Cred, path: &[u8], flags: i32, mode: u32) -> FsResult<Opened> {
        self.check_alive()?;
        let acc = flags & libc::O_ACCMODE;
        if acc == 3 {
            return e(libc::EINVAL, "invalid access mode");
        }
        if flags & libc::O_CREAT != 0 && flags & libc::O_DIRECTORY != 0 {
            // As Linux since 6.4: creating cannot make a directory.
            return e(libc::EINVAL, "O_CREAT with O_DIRECTORY");
        }
        let (read, write) = (acc != libc::O_WRONLY, acc != libc::O_RDONLY);
        let trunc = flags & libc::O_TRUNC != 0;
        let nofollow = flags & libc::O_NOFOLLOW != 0;
        let mut created = false;
        let ino = if flags & libc::O_CREAT != 0 {
            let p = self.resolve_parent(cred, path)?;
            match p.name {
                None => {
                    if flags & libc::O_EXCL != 0 {
                        return e(libc::EEXIST, "file exists");
                    }
                    return e(libc::EISDIR, "is a directory");
                }
                Some(name) => match self.lookup_name(p.dir, &name) {
                    Some(existing) => {
                        if flags & libc::O_EXCL != 0 {
                            return e(libc::EEXIST, "file exists");
                        }
                        let (ino, dir) = if self.inode(existing).is_symlink() {
                            if nofollow {
                                return e(libc::ELOOP, "the path names a symbolic link");
                            }
                            let (parts, slash) = Self::split(path)?;
                            self.walk_in(cred, &parts, true, slash)?
                        } else {
                            (existing, p.dir)
                        };
                        if !may_open_existing_in_sticky(self.inode(dir), self.inode(ino), cred) {
                            return e(
                                libc::EACCES,
                                "O_CREAT found another user's file in a sticky world-writable \
                                 directory; open it without O_CREAT, or use O_EXCL and a new name",
                            );
                        }
                        ino
                    }
                    None => {
                        if p.slash {
                            return e(
                                libc::EISDIR,
                                "cannot create a regular file with a trailing /",
                            );
                        }
                        self.need_dir_write(cred, p.dir)?;
                        self.check_room(1, 1)?;
                        let now = Time::now();
                        let gid = self.new_gid(p.dir, cred);
                        let ino = self.new_inode(S_IFREG | (mode & 0o7777), cred.uid, gid, 1, now);
                        self.add_entry(p.dir, &name, ino);
                        self.touch_dir(p.dir, now);
                        created = true;
                        ino
                    }
                },
            }
        } else {
            self.resolve(cred, path, !nofollow)?
        };
        let n = *self.inode(ino);
        if n.is_symlink() {
            return e(libc::ELOOP, "the path names a symbolic link (O_NOFOLLOW)");
        }
        if n.is_dir() && (write || trunc) {
            return e(libc::EISDIR, "is a directory");
        }
        if flags & libc::O_DIRECTORY != 0 && !n.is_dir() {
            return e(libc::ENOTDIR, "not a directory");
        }
        if !created {
            let mut want = 0;
            if read {
                want |= MAY_READ;
            }
            if write || trunc {
                want |= MAY_WRITE;
            }
            if !may(&n, cred, want) {
                return e(libc::EACCES, "permission denied");
            }
        }
        if trunc && n.is_reg() && !created {
            self.truncate_ino(ino, 0)?;
        }
        if created || self.txn_pending() {
            self.commit()?;
        }
        *self.open.entry(ino).or_default() += 1;
        Ok(Opened {
            ino,
            read,
            write,
            created,
            stat: self.stat_of(ino),
        })
    }

    /// Counts one more open handle of `ino`, which must be open already (a handle copied for a
    /// forked process); [`Fs::close`] drops it.
    pub fn reopen(&mut self, ino: u64) -> FsResult<()> {
        match self.open.get_mut(&ino) {
            Some(count) => {
                *count += 1;
                Ok(())
            }
            None => e(libc::EBADF, "the inode is not open"),
        }
    }

    /// Drops an open handle of `ino`; frees the file if it was unlinked and this was its last
    /// handle.
    pub fn close(&mut self, ino: u64) -> FsResult<()> {
        let Some(&count) = self.open.get(&ino) else {
            return e(libc::EBADF, "the inode is not open");
        };
        if count == 1 {
            // The last handle: a size grant ends, and room allocated past the end goes back
            // (revoked first, so in quick mode this fails before anything changed).
            if self.trims_at_close(ino) {
                let ranges = self.ranges_from(ino, self.size_now(ino).div_ceil(self.g.chunk_size));
                self.revoke(&ranges)?;
            }
            let settled = self.end_grant_of(ino);
            if self.trim_past_end(ino)? || settled {
                self.commit()?;
            }
        }
        if self.drop_handle(ino) && self.inode(ino).is_used() && self.inode(ino).nlink == 0 {
            self.check_alive()?;
            if let Err(err) = self.release(ino) {
                return Err(self.fail(&err));
            }
            self.commit()?;
        }
        Ok(())
    }

    /// Counts one handle of open `ino` gone; whether it was the last. No handle left means no
    /// channel holds the file's records: the next open starts a new tag (the table holds tags
    /// of open files only), and its reserve goes back.
    fn drop_handle(&mut self, ino: u64) -> bool {
        let count = self.open.get_mut(&ino).expect("the caller found it open");
        *count -= 1;
        if *count > 0 {
            return false;
        }
        self.open.remove(&ino);
        self.grown.remove(&ino);
        self.size_read.remove(&ino);
        self.layouts.remove(&ino);
        self.drop_reserve(ino);
        true
    }

    /// Drops one open handle of each of `inos`, as [`Fs::close`] would one by one, but revokes
    /// the records over the space of every file this frees in one go, before any of it is
    /// freed, and frees them in as few transactions as the journal allows: a queue of unlinked
    /// files costs one revocation, not one each. Returns the inodes that were not open.
    pub fn close_many(&mut self, inos: &[u64]) -> FsResult<Vec<u64>> {
        self.close_many_revoked(inos, &[])
    }

    /// The files among `inos` (each occurrence one handle to drop, as for
    /// [`Fs::close_many`]) whose space nothing but those handles can reach any more: unlinked
    /// regular files open only through them. No record can be installed over such a file's
    /// space and its extents cannot change, so their space may be revoked without the file
    /// system's lock, before [`Fs::close_many_revoked`] frees it. Returns those files and the
    /// ranges to revoke.
    pub fn unreachable(&self, inos: &[u64]) -> (Vec<u64>, Vec<(u64, u64)>) {
        let mut held: HashMap<u64, u32> = HashMap::new();
        for &ino in inos {
            *held.entry(ino).or_default() += 1;
        }
        let mut files = Vec::new();
        let mut ranges = Vec::new();
        for (ino, n) in held {
            if self.exists(ino)
                && self.inode(ino).is_reg()
                && self.inode(ino).nlink == 0
                && self.open.get(&ino) == Some(&n)
                && !self.grants.contains_key(&ino)
            {
                files.push(ino);
                ranges.extend(self.ranges_from(ino, 0));
            }
        }
        (files, ranges)
    }

    /// [`Fs::close_many`], where the caller has revoked the space of the files `revoked`
    /// already, as [`Fs::unreachable`] listed them: the files of those that this frees are
    /// not revoked again.
    pub fn close_many_revoked(&mut self, inos: &[u64], revoked: &[u64]) -> FsResult<Vec<u64>> {
        let mut not_open = Vec::new();
        let mut free = Vec::new();
        let mut trim = Vec::new();
        let mut settled = false;
        for &ino in inos {
            let Some(&count) = self.open.get(&ino) else {
                not_open.push(ino);
                continue;
            };
            if count == 1 {
                if self.trims_at_close(ino) {
                    trim.push(ino);
                }
                settled |= self.end_grant_of(ino);
            }
            if self.drop_handle(ino) && self.inode(ino).is_used() && self.inode(ino).nlink == 0 {
                free.push(ino);
            }
        }
        // `trim` holds linked files only and `free` unlinked ones: no file is in both.
        if free.is_empty() && trim.is_empty() {
            if settled {
                self.commit()?;
            }
            return Ok(not_open);
        }
        self.check_alive()?;
        let cs = self.g.chunk_size;
        let ranges: Vec<(u64, u64)> = free
            .iter()
            .filter(|ino| !revoked.contains(ino))
            .flat_map(|&ino| self.ranges_from(ino, 0))
            .chain(
                trim.iter()
                    .flat_map(|&ino| self.ranges_from(ino, self.inode(ino).size.div_ceil(cs))),
            )
            .collect();
        if let Err(err) = self.revoke(&ranges) {
            return Err(self.fail(&err));
        }
        // Frees of unlinked files alone are quiet: a crash that loses them leaves orphans,
        // which the next mount frees, so no `fsync` needs them durable (Journal::set_quiet).
        let quiet = trim.is_empty() && !settled;
        for ino in trim {
            if let Err(err) = self.trim_past_end(ino) {
                return Err(self.fail(&err));
            }
        }
        self.journal.set_quiet(quiet);
        let freed = self.free_unlinked(&free);
        self.journal.set_quiet(false);
        freed?;
        Ok(not_open)
    }

    /// Frees `files` (unlinked, without handles, their space revoked) in as few transactions
    /// as the journal takes, and commits.
    fn free_unlinked(&mut self, files: &[u64]) -> FsResult<()> {
        let budget = self.txn_budget();
        for &ino in files {
            if self.txn_estimate() > budget {
                if let Err(err) = self.commit_one() {
                    return Err(self.fail(&err));
                }
            }
            if self.free_from(ino, 0, budget) {
                self.forget(ino);
            } else {
                self.doomed.push(ino);
            }
        }
        self.commit()
    }

    /// Whether closing the last handle of `ino` would free room allocated past its end (a
    /// size grant's), which revokes first: a quick caller leaves that close to a thread that
    /// may wait, as it does the close that frees an unlinked file.
    pub fn trims_at_close(&self, ino: u64) -> bool {
        self.open_count(ino) == 1 && self.inode(ino).nlink > 0 && self.past_end(ino)
    }

    /// Whether `ino` is a regular file in use with chunks past the last one its size (as its
    /// readers see it) reaches.
    pub(super) fn past_end(&self, ino: u64) -> bool {
        self.exists(ino) && self.inode(ino).is_reg() && {
            let keep = self.size_now(ino).div_ceil(self.g.chunk_size);
            self.extents
                .get(&ino)
                .and_then(|m| m.iter().next_back())
                .is_some_and(|(&fc, x)| fc + x.count > keep)
        }
    }

    /// Frees the chunks of `ino` past its size's last chunk, the caller having revoked them
    /// (its grant ended, so the size no longer moves); the caller commits. Whether it freed
    /// any.
    pub(super) fn trim_past_end(&mut self, ino: u64) -> FsResult<bool> {
        if self.grants.contains_key(&ino) || !self.past_end(ino) {
            return Ok(false);
        }
        let keep = self.inode(ino).size.div_ceil(self.g.chunk_size);
        self.drop_reserve(ino);
        let budget = self.txn_budget();
        while !self.free_from(ino, keep, budget) {
            self.commit_one()?;
        }
        Ok(true)
    }

    /// Counts one more open handle of an inode in use, open or not: a caller that unlinks or
    /// renames over a file in quick mode holds it first, so that losing its last name does not
    /// free it there, and closes it later where freeing may wait.
    pub fn hold(&mut self, ino: u64) -> FsResult<()> {
        if !self.exists(ino) {
            return e(libc::ENOENT, "no such inode");
        }
        *self.open.entry(ino).or_default() += 1;
        Ok(())
    }
}
