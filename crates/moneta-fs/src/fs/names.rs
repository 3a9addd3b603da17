//! Paths: splitting them, walking them from the root or a directory with the caller's search
//! rights, following symbolic links.

use super::*;

impl Fs {
    pub(super) fn lookup_name(&self, dir: u64, name: &[u8]) -> Option<u64> {
        self.dirs.get(&dir)?.by_name.get(name).map(|&(ino, _)| ino)
    }

    pub(super) fn split(path: &[u8]) -> FsResult<(Vec<&[u8]>, bool)> {
        if path.is_empty() {
            return e(libc::ENOENT, "empty path");
        }
        if path.len() > PATH_MAX {
            return e(libc::ENAMETOOLONG, "path too long");
        }
        if path[0] != b'/' {
            return e(libc::EINVAL, "nvfs paths are absolute (they start with /)");
        }
        if path.contains(&0) {
            return e(libc::EINVAL, "path contains a NUL byte");
        }
        let parts: Vec<&[u8]> = path
            .split(|b| *b == b'/')
            .filter(|c| !c.is_empty())
            .collect();
        if parts.iter().any(|c| c.len() > NAME_MAX) {
            return e(
                libc::ENAMETOOLONG,
                "a path component is longer than 255 bytes",
            );
        }
        Ok((parts, path.len() > 1 && path.ends_with(b"/")))
    }

    /// Walks `parts` from the root; follows symlinks in all components, and in the last one
    /// when `follow_last`.
    pub(super) fn walk(
        &self,
        cred: &Cred,
        parts: &[&[u8]],
        follow_last: bool,
        slash: bool,
    ) -> FsResult<u64> {
        self.walk_in(cred, parts, follow_last, slash)
            .map(|(ino, _)| ino)
    }

    /// [`Fs::walk`], also giving the directory that held the last component reached (the
    /// root for the root itself), which the sticky-directory rules of `open` look at.
    pub(super) fn walk_in(
        &self,
        cred: &Cred,
        parts: &[&[u8]],
        follow_last: bool,
        slash: bool,
    ) -> FsResult<(u64, u64)> {
        self.walk_seen(cred, parts, follow_last, slash, None)
    }

    /// [`Fs::walk_in`], listing in `seen` every inode it looks at.
    pub(super) fn walk_seen(
        &self,
        cred: &Cred,
        parts: &[&[u8]],
        follow_last: bool,
        slash: bool,
        mut seen: Option<&mut Vec<u64>>,
    ) -> FsResult<(u64, u64)> {
        // Components still to walk, last first: slices of the path or of a link's target,
        // which this walk borrows (no copy per component).
        let mut pending: Vec<&[u8]> = parts.iter().rev().copied().collect();
        let mut cur = ROOT_INO;
        let mut held_by = ROOT_INO;
        let mut links = 0;
        while let Some(c) = pending.pop() {
            if let Some(s) = seen.as_deref_mut() {
                // The search permission of the directory, and the name looked up in it.
                let search = watch::search_key(cur);
                if !s.contains(&search) {
                    s.push(search);
                }
                if c != b"." {
                    s.push(watch::name_key(cur, c));
                }
            }
            let n = self.inode(cur);
            if !n.is_dir() {
                return e(libc::ENOTDIR, "a path component is not a directory");
            }
            if !may(n, cred, MAY_EXEC) {
                return e(
                    libc::EACCES,
                    "search permission denied on a directory of the path",
                );
            }
            if c == b"." {
                continue;
            }
            if c == b".." {
                cur = self.parent[&cur];
                held_by = self.parent[&cur];
                continue;
            }
            let child = match self.lookup_name(cur, c) {
                Some(i) => i,
                None => return e(libc::ENOENT, "no such file or directory"),
            };
            if let Some(s) = seen.as_deref_mut() {
                if self.inode(child).is_symlink() {
                    // Where a link leads, and whether it may be followed.
                    s.push(child);
                }
            }
            if self.inode(child).is_symlink() && (!pending.is_empty() || follow_last || slash) {
                links += 1;
                if links > MAX_SYMLINKS {
                    return e(libc::ELOOP, "too many levels of symbolic links");
                }
                if !may_follow_link(self.inode(cur), self.inode(child), cred) {
                    return e(
                        libc::EACCES,
                        "a symbolic link in a sticky world-writable directory is followed only \
                         by its owner or when the directory's owner owns it too",
                    );
                }
                let target = &self.symlinks[&child].1;
                if target.starts_with(b"/") {
                    cur = ROOT_INO;
                    held_by = ROOT_INO;
                }
                for part in target.split(|b| *b == b'/').rev() {
                    if !part.is_empty() {
                        pending.push(part);
                    }
                }
                continue;
            }
            held_by = cur;
            cur = child;
        }
        if let Some(s) = seen {
            // What the walk reached: its attributes are the answer.
            s.push(cur);
        }
        if slash && !self.inode(cur).is_dir() {
            return e(libc::ENOTDIR, "not a directory");
        }
        Ok((cur, held_by))
    }

    pub(super) fn resolve(&self, cred: &Cred, path: &[u8], follow: bool) -> FsResult<u64> {
        let (parts, slash) = Self::split(path)?;
        self.walk(cred, &parts, follow, slash)
    }

    pub(super) fn resolve_parent(&self, cred: &Cred, path: &[u8]) -> FsResult<Parent> {
        let (parts, slash) = Self::split(path)?;
        match parts.last() {
            None => Ok(Parent {
                dir: ROOT_INO,
                name: None,
                slash,
                dotdot: false,
            }),
            Some(&last) if last == b"." || last == b".." => Ok(Parent {
                dir: self.walk(cred, &parts, true, false)?,
                name: None,
                slash,
                dotdot: last == b"..",
            }),
            Some(&last) => {
                let dir = self.walk(cred, &parts[..parts.len() - 1], true, false)?;
                if !self.inode(dir).is_dir() {
                    return e(libc::ENOTDIR, "a path component is not a directory");
                }
                if !may(self.inode(dir), cred, MAY_EXEC) {
                    return e(
                        libc::EACCES,
                        "search permission denied on the parent directory",
                    );
                }
                Ok(Parent {
                    dir,
                    name: Some(last.to_vec()),
                    slash,
                    dotdot: false,
                })
            }
        }
    }
}
