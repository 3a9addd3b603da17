//! The attributes of a directory's entries in one call, for clients that keep answers: what
//! a stat of each entry's path would answer, and what those answers depend on.

use super::*;

/// The answer of [`Fs::stat_entries`].
pub struct StatEntries {
    /// Entries (`.` and `..` left out): the name, what a stat of `dir/name` answers, and the
    /// cookie that continues after the entry.
    pub entries: Vec<(Vec<u8>, Stat, u64)>,
    /// The cookie that continues after the last entry looked at (see [`Fs::readdir`]).
    pub next: u64,
    /// The directory has no more entries.
    pub end: bool,
    /// What every answer depends on besides its entry's own inode: each directory searched
    /// on the way (its search permission), each name looked up, each link followed, and the
    /// directory itself, whose inode changes whenever one of its names is added, removed or
    /// renamed (and with its mode and owners).
    pub seen: Vec<u64>,
}

impl Fs {
    /// The attributes of the entries of the directory at `path` (a final link followed), from
    /// `cookie` on, at most `max` looked at: for each but `.` and `..`, what
    /// [`Fs::stat`] of `path/name` with `follow` answers now. With `follow` an entry that is
    /// a symbolic link is left out (its answer is its target's, which depends on more). The
    /// caller needs to read and search the directory, as listing it and stating each entry
    /// need. An entry's answer depends on its inode and on what [`StatEntries::seen`] lists.
    pub fn stat_entries(
        &self,
        cred: &Cred,
        path: &[u8],
        follow: bool,
        cookie: u64,
        max: usize,
    ) -> FsResult<StatEntries> {
        let (parts, slash) = Self::split(path)?;
        let mut seen = Vec::with_capacity(16);
        let (dir, _) = self.walk_seen(cred, &parts, true, slash, Some(&mut seen))?;
        if !self.dirs.contains_key(&dir) {
            return e(libc::ENOTDIR, "not a directory");
        }
        if !may(self.inode(dir), cred, MAY_READ | MAY_EXEC) {
            return e(
                libc::EACCES,
                "no permission to list and search the directory",
            );
        }
        if !seen.contains(&dir) {
            seen.push(dir);
        }
        let (list, end) = self.readdir(dir, cookie, max)?;
        let next = list.last().map_or(cookie, |d| d.next);
        let entries = list
            .into_iter()
            .filter(|d| d.name != b"." && d.name != b"..")
            .filter(|d| !(follow && d.kind == DT_LNK))
            .map(|d| {
                let st = self.stat_of(d.ino);
                (d.name, st, d.next)
            })
            .collect();
        Ok(StatEntries {
            entries,
            next,
            end,
            seen,
        })
    }
}
