//! The namespace calls: directories made and removed, names unlinked, linked and renamed,
//! symbolic links.

use super::*;

impl Fs {
    /// `mkdir(2)`.
    pub fn mkdir(&mut self, cred: &Cred, path: &[u8], mode: u32) -> FsResult<Stat> {
        self.check_alive()?;
        let p = self.resolve_parent(cred, path)?;
        let Some(name) = p.name else {
            return e(libc::EEXIST, "file exists");
        };
        if self.lookup_name(p.dir, &name).is_some() {
            return e(libc::EEXIST, "file exists");
        }
        self.need_dir_write(cred, p.dir)?;
        if self.inode(p.dir).nlink >= LINK_MAX {
            return e(libc::EMLINK, "too many subdirectories");
        }
        self.check_room(1, 1)?;
        let now = Time::now();
        let gid = self.new_gid(p.dir, cred);
        let sgid = self.inode(p.dir).mode & 0o2000;
        let ino = self.new_inode(S_IFDIR | (mode & 0o7777) | sgid, cred.uid, gid, 2, now);
        self.add_entry(p.dir, &name, ino);
        let dn = self.inode_mut(p.dir);
        dn.nlink += 1;
        self.touch_dir(p.dir, now);
        self.commit()?;
        Ok(self.stat_of(ino))
    }

    /// `rmdir(2)`.
    pub fn rmdir(&mut self, cred: &Cred, path: &[u8]) -> FsResult<()> {
        self.check_alive()?;
        let p = self.resolve_parent(cred, path)?;
        let Some(name) = p.name else {
            if p.dir == ROOT_INO && !p.dotdot {
                return e(libc::EBUSY, "cannot remove the root directory");
            }
            if p.dotdot {
                return e(libc::ENOTEMPTY, "directory not empty");
            }
            return e(libc::EINVAL, "cannot remove `.`");
        };
        let Some(ino) = self.lookup_name(p.dir, &name) else {
            return e(libc::ENOENT, "no such directory");
        };
        self.need_dir_write(cred, p.dir)?;
        self.sticky_ok(cred, p.dir, ino)?;
        if !self.inode(ino).is_dir() {
            return e(libc::ENOTDIR, "not a directory");
        }
        if !self.dirs[&ino].by_name.is_empty() {
            return e(libc::ENOTEMPTY, "directory not empty");
        }
        let now = Time::now();
        self.remove_entry(p.dir, &name);
        self.inode_mut(p.dir).nlink -= 1;
        self.touch_dir(p.dir, now);
        if let Err(err) = self.drop_link(ino, now) {
            return Err(self.fail(&err));
        }
        self.commit()
    }

    /// `unlink(2)`. An open file keeps its data until its last handle closes.
    pub fn unlink(&mut self, cred: &Cred, path: &[u8]) -> FsResult<()> {
        self.check_alive()?;
        let p = self.resolve_parent(cred, path)?;
        let Some(name) = p.name else {
            return e(libc::EISDIR, "is a directory");
        };
        let Some(ino) = self.lookup_name(p.dir, &name) else {
            return e(libc::ENOENT, "no such file or directory");
        };
        self.need_dir_write(cred, p.dir)?;
        self.sticky_ok(cred, p.dir, ino)?;
        if self.inode(ino).is_dir() {
            return e(libc::EISDIR, "is a directory (use rmdir)");
        }
        if p.slash {
            return e(libc::ENOTDIR, "not a directory");
        }
        let now = Time::now();
        self.remove_entry(p.dir, &name);
        self.touch_dir(p.dir, now);
        if let Err(err) = self.drop_link(ino, now) {
            return Err(self.fail(&err));
        }
        self.commit()
    }

    /// `link(2)` (does not follow a symlink at `old`).
    pub fn link(&mut self, cred: &Cred, old: &[u8], new: &[u8]) -> FsResult<Stat> {
        self.check_alive()?;
        let ino = self.resolve(cred, old, false)?;
        let p = self.resolve_parent(cred, new)?;
        let Some(name) = p.name else {
            return e(libc::EEXIST, "file exists");
        };
        if self.lookup_name(p.dir, &name).is_some() {
            return e(libc::EEXIST, "file exists");
        }
        if !may_link(self.inode(ino), cred) {
            // Linux checks this before the target directory (fs/namei.c, do_linkat).
            return e(
                libc::EPERM,
                "a hard link to another user's file needs read and write permission on it \
                 (and it must be a regular file, not set-user-ID or set-group-ID executable)",
            );
        }
        if self.inode(ino).is_dir() {
            return e(libc::EPERM, "hard links to directories are not allowed");
        }
        self.need_dir_write(cred, p.dir)?;
        let n = *self.inode(ino);
        if n.nlink == 0 {
            return e(libc::ENOENT, "the file was removed");
        }
        if n.nlink >= LINK_MAX {
            return e(libc::EMLINK, "too many links");
        }
        self.check_room(0, 1)?;
        let now = Time::now();
        self.add_entry(p.dir, &name, ino);
        let m = self.inode_mut(ino);
        m.nlink += 1;
        m.ctime = now;
        self.touch_dir(p.dir, now);
        self.commit()?;
        Ok(self.stat_of(ino))
    }

    /// `symlink(2)`: the target is stored as given (at most 255 bytes); absolute targets are
    /// resolved from the nvfs root.
    pub fn symlink(&mut self, cred: &Cred, target: &[u8], path: &[u8]) -> FsResult<Stat> {
        self.check_alive()?;
        if target.is_empty() {
            return e(libc::ENOENT, "empty symlink target");
        }
        if target.len() > NAME_MAX {
            return e(
                libc::ENAMETOOLONG,
                "nvfs symlink targets are at most 255 bytes",
            );
        }
        if target.contains(&0) {
            return e(libc::EINVAL, "symlink target contains a NUL byte");
        }
        let p = self.resolve_parent(cred, path)?;
        let Some(name) = p.name else {
            return e(libc::EEXIST, "file exists");
        };
        if self.lookup_name(p.dir, &name).is_some() {
            return e(libc::EEXIST, "file exists");
        }
        self.need_dir_write(cred, p.dir)?;
        self.check_room(1, 2)?;
        let now = Time::now();
        let gid = self.new_gid(p.dir, cred);
        let ino = self.new_inode(S_IFLNK | 0o777, cred.uid, gid, 1, now);
        self.inode_mut(ino).size = target.len() as u64;
        let slot = self.free_dirents.pop_first().expect("room checked");
        let rec = Dirent {
            parent: SYMLINK_TARGET,
            ino,
            kind: DT_LNK,
            name: target.to_vec(),
        };
        if self.images {
            self.txn.put(self.g.dirent_addr(slot), &rec.encode(slot));
        }
        self.symlinks.insert(ino, (slot, target.to_vec()));
        self.add_entry(p.dir, &name, ino);
        self.touch_dir(p.dir, now);
        self.commit()?;
        Ok(self.stat_of(ino))
    }

    /// `readlink(2)`.
    pub fn readlink(&self, cred: &Cred, path: &[u8]) -> FsResult<Vec<u8>> {
        let ino = self.resolve(cred, path, false)?;
        match self.symlinks.get(&ino) {
            Some((_, t)) => Ok(t.clone()),
            None => e(libc::EINVAL, "not a symbolic link"),
        }
    }

    pub(super) fn is_ancestor(&self, anc: u64, mut dir: u64) -> bool {
        loop {
            if dir == anc {
                return true;
            }
            if dir == ROOT_INO {
                return false;
            }
            dir = self.parent[&dir];
        }
    }

    /// `rename(2)`, atomic, replacing a target; `noreplace` is `RENAME_NOREPLACE`.
    pub fn rename(&mut self, cred: &Cred, from: &[u8], to: &[u8], noreplace: bool) -> FsResult<()> {
        self.check_alive()?;
        let sp = self.resolve_parent(cred, from)?;
        let dp = self.resolve_parent(cred, to)?;
        let (Some(sname), Some(dname)) = (sp.name.clone(), dp.name.clone()) else {
            return e(libc::EBUSY, "cannot rename `/`, `.` or `..`");
        };
        let Some(src) = self.lookup_name(sp.dir, &sname) else {
            return e(libc::ENOENT, "no such file or directory");
        };
        let src_dir = self.inode(src).is_dir();
        if (sp.slash || dp.slash) && !src_dir {
            return e(libc::ENOTDIR, "not a directory");
        }
        self.need_dir_write(cred, sp.dir)?;
        self.need_dir_write(cred, dp.dir)?;
        self.sticky_ok(cred, sp.dir, src)?;
        let dst = self.lookup_name(dp.dir, &dname);
        if noreplace && dst.is_some() {
            return e(libc::EEXIST, "the target exists");
        }
        if dst == Some(src) {
            // Two names of one file: nothing to do (POSIX).
            return Ok(());
        }
        if src_dir {
            if self.is_ancestor(src, dp.dir) {
                return e(libc::EINVAL, "cannot move a directory into itself");
            }
            if sp.dir != dp.dir && !may(self.inode(src), cred, MAY_WRITE) {
                return e(
                    libc::EACCES,
                    "moving a directory needs write permission on it",
                );
            }
        }
        if let Some(d) = dst {
            if self.inode(d).is_dir() && self.is_ancestor(d, sp.dir) {
                return e(libc::ENOTEMPTY, "the target is an ancestor of the source");
            }
        }
        if let Some(d) = dst {
            self.sticky_ok(cred, dp.dir, d)?;
            let ddir = self.inode(d).is_dir();
            if src_dir && !ddir {
                return e(libc::ENOTDIR, "the target is not a directory");
            }
            if !src_dir && ddir {
                return e(libc::EISDIR, "the target is a directory");
            }
            if ddir && !self.dirs[&d].by_name.is_empty() {
                return e(libc::ENOTEMPTY, "the target directory is not empty");
            }
        } else if src_dir && sp.dir != dp.dir && self.inode(dp.dir).nlink >= LINK_MAX {
            return e(libc::EMLINK, "too many subdirectories");
        }
        let now = Time::now();
        if let Some(d) = dst {
            self.remove_entry(dp.dir, &dname);
            if self.inode(d).is_dir() {
                self.inode_mut(dp.dir).nlink -= 1;
            }
            if let Err(err) = self.drop_link(d, now) {
                return Err(self.fail(&err));
            }
        }
        // Move the record: rewrite its slot with the new parent and name.
        self.touched.insert(watch::name_key(sp.dir, &sname));
        self.touched.insert(watch::name_key(dp.dir, &dname));
        if src_dir {
            self.touched.insert(watch::name_key(src, b".."));
        }
        let (ino, slot) = self
            .dirs
            .get_mut(&sp.dir)
            .expect("dir")
            .by_name
            .remove(sname.as_slice())
            .expect("entry");
        self.dirs
            .get_mut(&sp.dir)
            .expect("dir")
            .by_slot
            .remove(&slot);
        let rec = Dirent {
            parent: dp.dir,
            ino,
            kind: kind_of(self.inode(ino).mode),
            name: dname.clone(),
        };
        if self.images {
            self.txn.put(self.g.dirent_addr(slot), &rec.encode(slot));
        }
        let dd = self.dirs.get_mut(&dp.dir).expect("dir");
        let dname: super::Name = dname.into();
        dd.by_name.insert(dname.clone(), (ino, slot));
        dd.by_slot.insert(slot, dname);
        if src_dir && sp.dir != dp.dir {
            self.inode_mut(sp.dir).nlink -= 1;
            self.inode_mut(dp.dir).nlink += 1;
            self.parent.insert(src, dp.dir);
        }
        self.touch_dir(sp.dir, now);
        self.touch_dir(dp.dir, now);
        self.inode_mut(src).ctime = now;
        self.commit()
    }
}
