//! Size grants: a client appending to a file may grow its size inside chunks allocated past
//! the end (by an extend that asked for room ahead) without a call, by publishing the new
//! size where the file system can read it (a slot of its channel, docs/abi.md §3.9).
//!
//! The file system never waits for the client: every answer that depends on the size reads
//! the published value first ([`Fs::size_now`]), and every change that depends on it applies
//! it first, as if the client had extended ([`Fs::settle_size`]). A grant ends (the client's
//! later publications are ignored, and it asks again) when its handle closes, when any of
//! the file's space is freed, when another handle takes it, and at unmount; the last value
//! is read after the end is in force, so a size published before the end always counts.
//!
//! What a client publishes is taken only up to the grant's limit, the end of the chunks that
//! were allocated past the size when it was granted: a hostile client can grow its own file
//! over its own zeroed chunks, which it could do with an extend, and nothing else.

use super::*;

/// A size grant on a file, as the grantor describes it.
pub struct SizeGrant {
    /// The grantor's name for the holder (its channel and handle), to end it by.
    pub key: u64,
    /// The size the file may grow to through the grant.
    pub limit: u64,
    /// Reads the size the holder has published; `None` for nothing (yet) under this grant.
    pub published: Box<dyn Fn() -> Option<u64> + Send>,
    /// Ends the grant where the holder reads it: afterwards the holder publishes nothing that
    /// [`SizeGrant::published`] counts.
    pub end: Box<dyn Fn() + Send>,
}

impl SizeGrant {
    /// What the holder published, up to the limit.
    fn size(&self) -> u64 {
        (self.published)().map_or(0, |s| s.min(self.limit))
    }
}

impl Fs {
    /// Gives `ino` a size grant (ending the one it had, whoever held it). The caller just
    /// extended the file with room ahead up to `grant.limit`.
    pub fn grant_size(&mut self, ino: u64, grant: SizeGrant) -> FsResult<()> {
        let changed = self.end_grant_of(ino);
        // The extend before this fired every watch on the file (its size or times changed),
        // and [`Fs::watch`] keeps none on a granted file: no answer about its attributes is
        // kept while its size may change with no call.
        self.grants.insert(ino, grant);
        if changed {
            self.commit()?;
        }
        Ok(())
    }

    /// Whether `ino` grew at its end since it was opened (by any handle): a file that grows
    /// again is likely to go on growing, where most files are written by one call and closed.
    pub fn grew_since_open(&self, ino: u64) -> bool {
        self.grown.contains(&ino)
    }

    /// Ends the grant on `ino`, if any, as [`Fs::end_grant`] does, because a client that has
    /// the file open too asks its size (a database's other processes do, before they read or
    /// extend it): while a grant is out no such answer can be kept, and a size that others
    /// read is one whose changes they must hear of. The file gets no grant again until its
    /// last close ([`Fs::size_read_by_others`]).
    pub fn share_size(&mut self, ino: u64) -> FsResult<()> {
        if self.granted(ino) {
            self.size_read.insert(ino);
        }
        self.end_grant(ino)
    }

    /// Whether a client that did not hold the grant on `ino` asked its size through a handle
    /// since the file was opened ([`Fs::share_size`]).
    pub fn size_read_by_others(&self, ino: u64) -> bool {
        self.size_read.contains(&ino)
    }

    /// Whether `ino` has a size grant out.
    pub fn granted(&self, ino: u64) -> bool {
        self.grants.contains_key(&ino)
    }

    /// The keys of every grant out.
    pub fn grant_keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.grants.values().map(|g| g.key)
    }

    /// Ends the grant on `ino`, if any, keeping what was published (the file is about to be
    /// mapped, whose pages follow the size only through calls).
    pub fn end_grant(&mut self, ino: u64) -> FsResult<()> {
        if self.end_grant_of(ino) {
            self.check_alive()?;
            self.commit()?;
        }
        Ok(())
    }

    /// Ends the grant on `ino`, if any, and frees what the file holds past its size's last
    /// chunk (a size lease's room), revoked first: the file is about to be mapped, and a
    /// mapped file's pages cover its space, which must not shrink under them at its last
    /// close. In quick mode, with room to free, it fails before it changes anything.
    pub fn end_grant_and_room(&mut self, ino: u64) -> FsResult<()> {
        if self.past_end(ino) {
            if self.quick {
                return e(NOT_QUICK, "freeing room revokes records first");
            }
            self.check_alive()?;
            self.end_grant_of(ino);
            let ranges = self.ranges_from(ino, self.inode(ino).size.div_ceil(self.g.chunk_size));
            self.revoke(&ranges)?;
            self.trim_past_end(ino)?;
            return self.commit();
        }
        self.end_grant(ino)
    }

    /// The key of the grant on `ino`, if any.
    pub fn grant_key(&self, ino: u64) -> Option<u64> {
        self.grants.get(&ino).map(|g| g.key)
    }

    /// The size of `ino` as its readers must see it: its own, or what its grant's holder
    /// published if that is larger.
    pub fn size_now(&self, ino: u64) -> u64 {
        let size = self.inode(ino).size;
        if self.grants.is_empty() {
            return size;
        }
        match self.grants.get(&ino) {
            Some(g) => size.max(g.size()),
            None => size,
        }
    }

    /// Applies what the holder of `ino`'s grant published to the file's size (and times), as
    /// an extend would; the caller commits. Whether it changed anything.
    pub(super) fn settle_size(&mut self, ino: u64) -> bool {
        let Some(g) = self.grants.get(&ino) else {
            return false;
        };
        let p = g.size();
        if p <= self.inode(ino).size {
            return false;
        }
        let now = Time::now();
        let n = self.inode_mut(ino);
        n.size = p;
        n.mtime = now;
        n.ctime = now;
        true
    }

    /// Ends the grant on `ino`, if any, keeping what was published before; the caller
    /// commits. Whether the size changed.
    pub(super) fn end_grant_of(&mut self, ino: u64) -> bool {
        let Some(g) = self.grants.get(&ino) else {
            return false;
        };
        (g.end)();
        let changed = self.settle_size(ino);
        self.grants.remove(&ino);
        changed
    }

    /// Ends the grants whose key `which` picks (a handle closing, a channel going), keeping
    /// what their holders published, in one transaction.
    pub fn end_grants(&mut self, which: impl Fn(u64) -> bool) -> FsResult<()> {
        let inos: Vec<u64> = self
            .grants
            .iter()
            .filter(|(_, g)| which(g.key))
            .map(|(&ino, _)| ino)
            .collect();
        let mut changed = false;
        for ino in inos {
            changed |= self.end_grant_of(ino);
        }
        if changed {
            self.check_alive()?;
            self.commit()?;
        }
        Ok(())
    }

    /// Applies what every holder published so far (a durability point's metadata, a stop).
    pub(super) fn settle_all_sizes(&mut self) -> bool {
        let inos: Vec<u64> = self.grants.keys().copied().collect();
        let mut changed = false;
        for ino in inos {
            changed |= self.settle_size(ino);
        }
        changed
    }

    /// Ends the size grants of every file but `except` and frees their room past the end
    /// (revoked first): what an extend does before it answers `ENOSPC`. In quick mode, with
    /// room to take, it fails before it changes anything.
    pub(super) fn take_back_rooms(&mut self, except: u64) -> FsResult<()> {
        let inos: Vec<u64> = self
            .grants
            .keys()
            .copied()
            .filter(|&i| i != except)
            .collect();
        if inos.is_empty() {
            return Ok(());
        }
        if self.quick {
            return e(NOT_QUICK, "taking room back revokes records first");
        }
        self.check_alive()?;
        for &ino in &inos {
            self.end_grant_of(ino);
        }
        let cs = self.g.chunk_size;
        let ranges: Vec<(u64, u64)> = inos
            .iter()
            .flat_map(|&ino| self.ranges_from(ino, self.inode(ino).size.div_ceil(cs)))
            .collect();
        self.revoke(&ranges)?;
        for ino in inos {
            self.trim_past_end(ino)?;
        }
        // Committed on their own, so that the frees can become durable (and the space
        // allocatable) before the extend that needs them commits.
        self.commit_one()
    }
}
