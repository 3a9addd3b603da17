//! `fsck --repair`: applies the repairs [`crate::tables::check`] proposes, in as many journal
//! transactions as they need.
//!
//! The repairs work on a copy of the tables held in memory, so each sees the ones before it
//! (a file put in `/lost+found` after that directory was made). Each repair's record images
//! are one transaction or part of one: they join the open transaction while it still fits
//! the journal, which is committed first otherwise. So damage of any size is repaired, and a
//! crash between two transactions leaves an image that is consistent in each change made so
//! far; the next `fsck --repair` finds what is left (checking starts from the tables again).
//! Nothing is freed that a file may still need: data named by a damaged record is either
//! given back to its file or gathered into `/lost+found`; only chunks that read as zeros are
//! freed.

use std::collections::{BTreeMap, BTreeSet};
use std::io;

use moneta_device::Media;

use crate::journal::{self, Journal, Txn};
use crate::layout::*;
use crate::tables::{Copy, Fix, Tables};

/// Name of the directory where `fsck` puts what it finds without a name (as e2fsck).
pub const LOST_FOUND: &[u8] = b"lost+found";

/// The tables being repaired.
struct Model {
    g: Geometry,
    inodes: Vec<Inode>,
    bad_inodes: BTreeSet<u64>,
    dirents: BTreeMap<u64, Dirent>,
    bad_dirents: BTreeSet<u64>,
    extents: BTreeMap<u64, ExtentRec>,
    bad_extents: BTreeSet<u64>,
    bitmap: Vec<u64>,
}

impl Model {
    fn inode(&self, ino: u64) -> &Inode {
        &self.inodes[(ino - 1) as usize]
    }

    fn inode_mut(&mut self, ino: u64) -> &mut Inode {
        &mut self.inodes[(ino - 1) as usize]
    }

    fn put_inode(&self, txn: &mut Txn, ino: u64) {
        txn.put(self.g.inode_addr(ino), &self.inode(ino).encode(ino));
    }

    fn put_dirent(&self, txn: &mut Txn, slot: u64) {
        match self.dirents.get(&slot) {
            Some(d) => txn.put(self.g.dirent_addr(slot), &d.encode(slot)),
            None => txn.put(self.g.dirent_addr(slot), &[0u8; DIRENT_SIZE as usize]),
        }
    }

    fn put_extent(&self, txn: &mut Txn, slot: u64) {
        match self.extents.get(&slot) {
            Some(e) => txn.put(self.g.extent_addr(slot), &e.encode(slot)),
            None => txn.put(self.g.extent_addr(slot), &[0u8; EXTENT_SIZE as usize]),
        }
    }

    fn set_bits(&mut self, txn: &mut Txn, start: u64, len: u64, on: bool) {
        let mut words = BTreeSet::new();
        for c in start..start + len {
            let w = (c / 64) as usize;
            if on {
                self.bitmap[w] |= 1 << (c % 64);
            } else {
                self.bitmap[w] &= !(1 << (c % 64));
            }
            words.insert(w);
        }
        for w in words {
            txn.put(
                self.g.bitmap_off + w as u64 * 8,
                &self.bitmap[w].to_le_bytes(),
            );
        }
    }

    fn free_inode(&self) -> Option<u64> {
        (1..=self.g.inode_count)
            .find(|&i| !self.inode(i).is_used() && !self.bad_inodes.contains(&i))
    }

    fn free_dirent(&self) -> Option<u64> {
        (0..self.g.dirent_count)
            .find(|s| !self.dirents.contains_key(s) && !self.bad_dirents.contains(s))
    }

    /// Whether `inodes` inodes and `dirents` entries are free, plus one of each for
    /// `/lost+found` if it must be made: checked before a repair changes anything.
    fn room(&self, inodes: usize, dirents: usize) -> bool {
        let extra = usize::from(self.entry(ROOT_INO, LOST_FOUND).is_none());
        let free_inodes = (1..=self.g.inode_count)
            .filter(|&i| !self.inode(i).is_used() && !self.bad_inodes.contains(&i))
            .take(inodes + extra)
            .count();
        let free_dirents = (0..self.g.dirent_count)
            .filter(|s| !self.dirents.contains_key(s) && !self.bad_dirents.contains(s))
            .take(dirents + extra)
            .count();
        free_inodes == inodes + extra && free_dirents == dirents + extra
    }

    /// The entry named `name` in directory `dir`.
    fn entry(&self, dir: u64, name: &[u8]) -> Option<(u64, &Dirent)> {
        self.dirents
            .iter()
            .find(|(_, d)| d.parent == dir && d.name == name)
            .map(|(s, d)| (*s, d))
    }

    /// Owner and group for what a repair creates: the root directory's, so that whoever the
    /// file system belongs to can reach it.
    fn owner(&self) -> (u32, u32) {
        let r = self.inode(ROOT_INO);
        if r.is_used() {
            (r.uid, r.gid)
        } else {
            (0, 0)
        }
    }

    fn new_inode(&mut self, txn: &mut Txn, mode: u32, nlink: u32, size: u64) -> Option<u64> {
        let ino = self.free_inode()?;
        let now = Time::now();
        let (uid, gid) = self.owner();
        let generation = self.inode(ino).generation.wrapping_add(1);
        *self.inode_mut(ino) = Inode {
            mode,
            uid,
            gid,
            nlink,
            size,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            generation,
        };
        self.put_inode(txn, ino);
        Some(ino)
    }

    fn add_entry(&mut self, txn: &mut Txn, dir: u64, name: Vec<u8>, ino: u64) -> Option<u64> {
        let slot = self.free_dirent()?;
        let kind = kind_of(self.inode(ino).mode);
        self.dirents.insert(
            slot,
            Dirent {
                parent: dir,
                ino,
                kind,
                name,
            },
        );
        self.put_dirent(txn, slot);
        Some(slot)
    }

    /// `/lost+found`, made if missing. `None` when it cannot be: no free inode or entry, or
    /// the name is taken by something that is not a directory.
    fn lost_found(&mut self, txn: &mut Txn) -> Option<u64> {
        if let Some((_, d)) = self.entry(ROOT_INO, LOST_FOUND) {
            let ino = d.ino;
            return (ino <= self.g.inode_count && self.inode(ino).is_dir()).then_some(ino);
        }
        if !self.inode(ROOT_INO).is_dir() || self.free_dirent().is_none() {
            return None;
        }
        let ino = self.new_inode(txn, S_IFDIR | 0o700, 2, 0)?;
        self.add_entry(txn, ROOT_INO, LOST_FOUND.to_vec(), ino)?;
        self.inode_mut(ROOT_INO).nlink += 1;
        self.put_inode(txn, ROOT_INO);
        Some(ino)
    }

    /// Names `ino` `#<ino>` in `/lost+found` (`#<ino>.<n>` if that is taken).
    fn reattach(&mut self, txn: &mut Txn, ino: u64) -> bool {
        if !self.room(0, 1) {
            return false;
        }
        let Some(lf) = self.lost_found(txn) else {
            return false;
        };
        let mut name = format!("#{ino}").into_bytes();
        let mut n = 0;
        while self.entry(lf, &name).is_some() {
            n += 1;
            name = format!("#{ino}.{n}").into_bytes();
        }
        if self.add_entry(txn, lf, name, ino).is_none() {
            return false;
        }
        if self.inode(ino).is_dir() {
            self.inode_mut(lf).nlink += 1;
            self.put_inode(txn, lf);
        } else {
            self.inode_mut(ino).nlink = 1;
            self.put_inode(txn, ino);
        }
        true
    }

    /// Frees an inode with its extents (and their chunks) and symlink target.
    fn free(&mut self, txn: &mut Txn, ino: u64) {
        let slots: Vec<u64> = self
            .extents
            .iter()
            .filter(|(_, e)| e.ino == ino)
            .map(|(s, _)| *s)
            .collect();
        for slot in slots {
            let e = self.extents.remove(&slot).expect("listed");
            self.put_extent(txn, slot);
            if e.dev_chunk + e.count as u64 <= self.g.chunk_count {
                self.set_bits(txn, e.dev_chunk, e.count as u64, false);
            }
        }
        let names: Vec<u64> = self
            .dirents
            .iter()
            .filter(|(_, d)| d.ino == ino)
            .map(|(s, _)| *s)
            .collect();
        for slot in names {
            self.dirents.remove(&slot);
            self.put_dirent(txn, slot);
        }
        let generation = self.inode(ino).generation;
        *self.inode_mut(ino) = Inode {
            generation,
            ..Default::default()
        };
        self.put_inode(txn, ino);
    }

    /// Chunks `start..start + len` that no file owns: freed when they read as zeros, else
    /// the data of a new file in `/lost+found`.
    fn reclaim(&mut self, m: &dyn Media, txn: &mut Txn, start: u64, len: u64) -> bool {
        let cs = self.g.chunk_size;
        let mut chunk = vec![0u8; cs as usize];
        let holds_data = (start..start + len).any(|c| {
            journal::read(m, self.g.chunk_addr(c), &mut chunk);
            !is_zero(&chunk)
        });
        if !holds_data {
            self.set_bits(txn, start, len, false);
            return true;
        }
        // Room for the whole file first, so that a refusal changes nothing.
        let slots_needed = len.div_ceil(u32::MAX as u64) as usize;
        let free_slots: Vec<u64> = (0..self.g.extent_count)
            .filter(|s| !self.extents.contains_key(s) && !self.bad_extents.contains(s))
            .take(slots_needed)
            .collect();
        if free_slots.len() < slots_needed || !self.room(1, 1) {
            return false;
        }
        let Some(lf) = self.lost_found(txn) else {
            return false;
        };
        let Some(ino) = self.new_inode(txn, S_IFREG | 0o600, 1, len * cs) else {
            return false;
        };
        let mut at = 0;
        for slot in free_slots {
            let count = (len - at).min(u32::MAX as u64);
            self.extents.insert(
                slot,
                ExtentRec {
                    ino,
                    file_chunk: at,
                    dev_chunk: start + at,
                    count: count as u32,
                },
            );
            self.put_extent(txn, slot);
            at += count;
        }
        self.set_bits(txn, start, len, true);
        let name = format!("#{ino}").into_bytes();
        self.add_entry(txn, lf, name, ino).is_some()
    }

    /// Makes one repair's record images into `txn`; `false` when it cannot be made.
    fn apply(&mut self, m: &dyn Media, txn: &mut Txn, fix: &Fix) -> bool {
        match *fix {
            // Written outside the journal, before any transaction (see `repair`).
            Fix::RewriteSuperblock => true,
            Fix::RewriteInode(ino) => {
                self.put_inode(txn, ino);
                true
            }
            Fix::RewriteExtent(slot) => {
                self.put_extent(txn, slot);
                true
            }
            Fix::RebuildInode(ino, kind) => {
                let cs = self.g.chunk_size;
                let size = match kind {
                    S_IFREG => self
                        .extents
                        .values()
                        .filter(|e| e.ino == ino)
                        .map(|e| (e.file_chunk + e.count as u64) * cs)
                        .max()
                        .unwrap_or(0),
                    S_IFLNK => self
                        .dirents
                        .values()
                        .find(|d| d.parent == SYMLINK_TARGET && d.ino == ino)
                        .map_or(0, |d| d.name.len() as u64),
                    _ => 0,
                };
                let (perm, nlink) = if kind == S_IFDIR {
                    (0o700, 2)
                } else {
                    (0o600, 1)
                };
                let (uid, gid) = if ino == ROOT_INO {
                    (0, 0)
                } else {
                    self.owner()
                };
                let now = Time::now();
                *self.inode_mut(ino) = Inode {
                    mode: kind | if ino == ROOT_INO { 0o755 } else { perm },
                    uid,
                    gid,
                    nlink,
                    size,
                    atime: now,
                    mtime: now,
                    ctime: now,
                    btime: now,
                    generation: 1,
                };
                self.bad_inodes.remove(&ino);
                self.put_inode(txn, ino);
                true
            }
            Fix::ClearInode(ino) => {
                self.bad_inodes.remove(&ino);
                *self.inode_mut(ino) = Inode::default();
                txn.put(self.g.inode_addr(ino), &[0u8; INODE_SIZE as usize]);
                true
            }
            Fix::ClearDirent(slot) => {
                self.dirents.remove(&slot);
                self.bad_dirents.remove(&slot);
                self.put_dirent(txn, slot);
                true
            }
            Fix::SetKind(slot, kind) => match self.dirents.get_mut(&slot) {
                Some(d) => {
                    d.kind = kind;
                    self.put_dirent(txn, slot);
                    true
                }
                None => false,
            },
            Fix::DetachExtent(slot) => {
                self.extents.remove(&slot);
                self.bad_extents.remove(&slot);
                self.put_extent(txn, slot);
                true
            }
            Fix::Reclaim(start, len) => self.reclaim(m, txn, start, len),
            Fix::MarkChunks(start, len) => {
                self.set_bits(txn, start, len, true);
                true
            }
            Fix::SetNlink(ino, n) => {
                self.inode_mut(ino).nlink = n;
                self.put_inode(txn, ino);
                true
            }
            Fix::SetSize(ino, size) => {
                self.inode_mut(ino).size = size;
                self.put_inode(txn, ino);
                true
            }
            Fix::Reattach(ino) => self.reattach(txn, ino),
            Fix::FreeInode(ino) | Fix::FreeSymlink(ino) => {
                self.free(txn, ino);
                true
            }
        }
    }
}

/// The order repairs are made in within a pass: copies and rebuilt records first (later
/// repairs read them), then what clears, then what adds.
fn rank(f: &Fix) -> u8 {
    match f {
        Fix::RewriteSuperblock => 0,
        Fix::RewriteInode(_) | Fix::RewriteExtent(_) => 1,
        Fix::RebuildInode(..) | Fix::ClearInode(_) => 2,
        Fix::ClearDirent(_) | Fix::DetachExtent(_) | Fix::SetKind(..) => 3,
        Fix::FreeInode(_) | Fix::FreeSymlink(_) => 4,
        Fix::MarkChunks(..) | Fix::SetNlink(..) | Fix::SetSize(..) => 5,
        Fix::Reattach(_) | Fix::Reclaim(..) => 6,
    }
}

/// Writes the superblock copy that `t` found damaged from the good one (outside the journal:
/// the superblock is not in it, and each copy is written whole, so a crash leaves the other).
pub fn rewrite_superblock(m: &dyn Media, t: &Tables) -> io::Result<()> {
    let Some((copy, _)) = &t.sb_damage else {
        return Ok(());
    };
    let addr = match copy {
        Copy::Primary => 0,
        Copy::Mirror => t.sb.geometry.backup_superblock_addr(),
    };
    let mut block = vec![0u8; BLOCK as usize];
    block[..SUPERBLOCK_SIZE].copy_from_slice(&t.sb.encode());
    journal::write(m, addr, &block);
    m.flush(addr, BLOCK)
}

/// Makes `fixes` (found in `t`) through `journal`, in transactions that each fit it. Returns
/// the repairs made.
pub fn repair(
    m: &dyn Media,
    t: &Tables,
    fixes: &[Fix],
    journal: &mut Journal,
) -> io::Result<Vec<Fix>> {
    let mut model = Model {
        g: t.sb.geometry,
        inodes: t.inodes.clone(),
        bad_inodes: t.bad_inodes.clone(),
        dirents: t.dirents.clone(),
        bad_dirents: t.bad_dirents.iter().copied().collect(),
        extents: t.extents.clone(),
        bad_extents: t.bad_extents.iter().copied().collect(),
        bitmap: t.bitmap.clone(),
    };
    let mut order: Vec<&Fix> = fixes.iter().collect();
    order.sort_by_key(|f| rank(f));
    if order.contains(&&Fix::RewriteSuperblock) {
        rewrite_superblock(m, t)?;
    }
    let room = journal.capacity();
    let mut open = Txn::default();
    let mut done = Vec::new();
    for fix in order {
        let mut part = Txn::default();
        // A repair that could not be made (no room) has checked that first; what it may
        // still have made (`/lost+found`) stands on its own, and is kept.
        let made = model.apply(m, &mut part, fix);
        if open.body_len() + part.body_len() > room {
            journal.commit(m, std::mem::take(&mut open))?;
        }
        open.append(part);
        if made {
            done.push(fix.clone());
        }
    }
    journal.commit(m, open)?;
    journal.checkpoint(m)?;
    Ok(done)
}
