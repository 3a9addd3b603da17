//! Answers about attributes kept between calls (docs/abi.md §3.7): a `STAT` answer (or its
//! error), and the attributes an `OPEN` answered with, are given again without asking while
//! the channel's change-board counter for them keeps the value it had before the question.
//! The daemon adds to that counter before it answers any call that changes something the
//! answer depended on (the inode, and for a path each directory and link on the way), so a
//! kept answer is one the daemon would give now. A counter this process scribbles on can only
//! make its own answers wrong.
//!
//! **Directory listings.** A process that stats one path after another in a directory (`git
//! status` of a work tree, `ls -l`, `find`) asks the daemon for the attributes of the
//! directory's entries at once (`OP_FS_STATDIR`), a page at a time, at its second miss in the
//! directory and at every second one after, until the directory is exhausted (at the first
//! or the fourth, as the last pages paid or not: [`misses_before_a_listing`]). Each entry is
//! kept under the path a stat of it would name, with two counters read before the question:
//! the entry's own (its inode) and the directory path's (everything else it depends on: the
//! walk to the directory and the directory's names). It is given again while both hold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use moneta_abi::fsproto::{entry_path, FsReply, FsRequest, FsStat, Target};
use moneta_abi::{change_slot, CHANGES_OFFSET, CHANGE_SLOTS, FS_CHANGE_BOARD, FS_UNLINK_KEPT};

use super::Channel;
use crate::ClientError;

/// Most answers kept; past it they are all dropped (and asked for again). The daemon watches
/// at most 16,384 dependencies of a channel's answers, and every kept answer has one at least.
const MOST: usize = 16_384;

/// Directories whose misses are counted at once; past it the counts start again.
const MOST_DIRS: usize = 1024;

/// What a kept answer was.
pub(crate) type Kept = Result<FsStat, (i32, String)>;

/// One kept answer: the counter it was given under, and for an entry of a directory's listing
/// the directory path's counter too.
struct Entry {
    count: u64,
    dir: Option<(usize, u64)>,
    kept: Kept,
}

/// What this process has asked of a directory's listing.
#[derive(Default)]
struct Listing {
    /// Stats of paths in it that were not kept, since its last page.
    misses: u32,
    /// The cookie of its next page.
    next: u64,
    /// Every page asked for (or the daemon refused it): misses there ask one stat each.
    done: bool,
    /// A thread is asking for a page now.
    asking: bool,
}

/// The kept answers of one channel, by target.
#[derive(Default)]
pub(crate) struct Attrs {
    map: Mutex<HashMap<Key, Entry>>,
    listings: Mutex<HashMap<Vec<u8>, Listing>>,
    /// The daemon had no room to watch more answers of the channel: no more listings.
    full: AtomicBool,
}

/// Pages of directory listings asked for.
static LISTINGS: AtomicU64 = AtomicU64::new(0);

/// How many pages of directory listings (`OP_FS_STATDIR`) this process asked for.
pub fn listings() -> u64 {
    LISTINGS.load(Ordering::Relaxed)
}

/// Pages in a window of [`misses_before_a_listing`]'s judgement.
const WINDOW: u64 = 16;

/// Pages asked for in the current window, and the stats their entries answered.
static WINDOW_PAGES: AtomicU64 = AtomicU64::new(0);
static WINDOW_HITS: AtomicU64 = AtomicU64::new(0);

/// The last full window's judgement: misses in a directory before its next page.
static MISSES: AtomicU64 = AtomicU64::new(2);

/// How many stats in a directory must miss before its next page is asked for, as the last
/// [`WINDOW`] pages paid: two at first; one when their entries answered two stats a page or
/// more (the process walks trees, and the first miss in a directory is worth a page); four
/// when they answered fewer than one a page (it stats a file or two in each of many
/// directories, where a page costs more than it saves).
fn misses_before_a_listing() -> u32 {
    MISSES.load(Ordering::Relaxed) as u32
}

/// Counts a page asked for, and judges the window it ends.
fn count_page() {
    LISTINGS.fetch_add(1, Ordering::Relaxed);
    let pages = WINDOW_PAGES.fetch_add(1, Ordering::Relaxed) + 1;
    if pages >= WINDOW {
        let hits = WINDOW_HITS.swap(0, Ordering::Relaxed);
        WINDOW_PAGES.store(0, Ordering::Relaxed);
        let misses = if hits >= 2 * pages {
            1
        } else if hits >= pages {
            2
        } else {
            4
        };
        MISSES.store(misses, Ordering::Relaxed);
    }
}

/// A target as a key: a handle, or a path and whether a final link is followed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum Key {
    Handle(u64),
    Path(Vec<u8>, bool),
}

impl Key {
    pub(crate) fn of(t: &Target) -> Key {
        match t {
            Target::Handle(h) => Key::Handle(*h),
            Target::Path { path, follow } => Key::Path(path.clone(), *follow),
        }
    }

    fn target(&self) -> Target {
        match self {
            Key::Handle(h) => Target::Handle(*h),
            Key::Path(p, f) => Target::Path {
                path: p.clone(),
                follow: *f,
            },
        }
    }
}

/// The directory of `path` as a listing names it, when `path` is a plain absolute path below
/// one (no empty, `.` or `..` component, no trailing `/`): entries are kept under
/// [`entry_path`] of it, which is then the path a stat of them names.
fn parent(path: &[u8]) -> Option<&[u8]> {
    if path.len() < 2 || path[0] != b'/' || path.ends_with(b"/") {
        return None;
    }
    if path[1..]
        .split(|&b| b == b'/')
        .any(|c| c.is_empty() || c == b"." || c == b"..")
    {
        return None;
    }
    let cut = path.iter().rposition(|&b| b == b'/')?;
    Some(if cut == 0 { b"/" } else { &path[..cut] })
}

impl Channel {
    /// Whether the daemon keeps this channel's change board.
    pub(crate) fn keeps_changes(&self) -> bool {
        self.header().fs_flags.load(Ordering::Acquire) & FS_CHANGE_BOARD != 0
    }

    /// Whether the daemon takes `FS_UNLINK_KEEP`, whose success is also the answer `ENOENT`
    /// to a stat of its path.
    pub(crate) fn unlink_kept(&self) -> bool {
        self.header().fs_flags.load(Ordering::Acquire) & FS_UNLINK_KEPT != 0
    }

    /// Whether an answer about `path` (either follow flag) was kept, held or not.
    pub(crate) fn asked_about(&self, path: &[u8]) -> bool {
        let map = self.attrs.map.lock().unwrap_or_else(|e| e.into_inner());
        [true, false]
            .into_iter()
            .any(|follow| map.contains_key(&Key::Path(path.to_vec(), follow)))
    }

    /// The change board.
    fn board(&self) -> &[AtomicU64; CHANGE_SLOTS] {
        // SAFETY: the board lies inside the channel's first page (asserted in moneta-abi),
        // aligned, and holds only atomics; the mapping lives as long as `self`.
        unsafe {
            &*self
                .header_ptr()
                .add(CHANGES_OFFSET)
                .cast::<[AtomicU64; CHANGE_SLOTS]>()
        }
    }

    /// The counter that answers for `target` now.
    pub(crate) fn change_count(&self, target: &Target) -> u64 {
        self.board()[change_slot(target)].load(Ordering::Acquire)
    }

    /// Every counter now (before a call whose target is known only from its answer).
    pub(crate) fn change_counts(&self) -> Box<[u64; CHANGE_SLOTS]> {
        let b = self.board();
        Box::new(std::array::from_fn(|i| b[i].load(Ordering::Acquire)))
    }

    /// The answer kept for `key`, if its counters have not moved since.
    pub(crate) fn kept(&self, key: &Key) -> Option<Kept> {
        self.kept_counted(key, true)
    }

    /// [`Channel::kept`]; `hit` counts an answer from a listing's entry as one the listing
    /// saved (not so for the stat that asked for the page).
    fn kept_counted(&self, key: &Key, hit: bool) -> Option<Kept> {
        let map = self.attrs.map.lock().unwrap_or_else(|e| e.into_inner());
        let e = map.get(key)?;
        let holds = e.count == self.change_count(&key.target())
            && e.dir
                .is_none_or(|(slot, count)| self.board()[slot].load(Ordering::Acquire) == count);
        if hit && holds && e.dir.is_some() {
            WINDOW_HITS.fetch_add(1, Ordering::Relaxed);
        }
        holds.then(|| e.kept.clone())
    }

    /// Keeps `answer` for `key`, given when the counter read `count` (before the question).
    pub(crate) fn keep(&self, key: Key, count: u64, answer: Kept) {
        self.keep_entry(
            key,
            Entry {
                count,
                dir: None,
                kept: answer,
            },
        );
    }

    fn keep_entry(&self, key: Key, entry: Entry) {
        let mut map = self.attrs.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MOST {
            map.clear();
        }
        map.insert(key, entry);
    }

    /// Forgets what was kept for `key` (a handle closed).
    pub(crate) fn forget(&self, key: &Key) {
        self.attrs
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// After a stat of `path` found nothing kept: when it is enough misses in its directory
    /// since the last page ([`misses_before_a_listing`]), asks for the next page of the
    /// directory's listing and keeps its entries; the answer for `key` if the listing had it.
    pub(crate) fn listed(&self, path: &[u8], follow: bool, key: &Key) -> Option<Kept> {
        if self.attrs.full.load(Ordering::Relaxed) {
            return None;
        }
        let dir = parent(path)?;
        let cookie = {
            let mut all = self
                .attrs
                .listings
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !all.contains_key(dir) {
                if all.len() >= MOST_DIRS {
                    all.clear();
                }
                all.insert(dir.to_vec(), Listing::default());
            }
            let l = all.get_mut(dir).expect("inserted above");
            if l.done || l.asking {
                return None;
            }
            l.misses += 1;
            if l.misses < misses_before_a_listing() {
                return None;
            }
            l.asking = true;
            l.next
        };
        // Every counter before the question: each entry's, and the directory's.
        let counts = self.change_counts();
        count_page();
        let req = FsRequest::StatDir {
            path: dir.to_vec(),
            cookie,
            follow,
        };
        super::fscall::count_call(&req);
        let r = self.ask(req);
        let (next, done) = match r {
            Ok(FsReply::Stats { entries, next, end }) => {
                let ds = change_slot(&Target::Path {
                    path: dir.to_vec(),
                    follow: true,
                });
                for e in entries {
                    if e.name.is_empty() || e.name.contains(&b'/') {
                        continue;
                    }
                    let target = Target::Path {
                        path: entry_path(dir, &e.name),
                        follow,
                    };
                    let count = counts[change_slot(&target)];
                    self.keep_entry(
                        Key::of(&target),
                        Entry {
                            count,
                            dir: Some((ds, counts[ds])),
                            kept: Ok(e.stat),
                        },
                    );
                }
                (next, end || next == cookie)
            }
            // No room left to watch more answers, or a daemon that does not list directories.
            Err(ClientError::Refused {
                errno: libc::ENOBUFS | libc::EPROTO | libc::EOPNOTSUPP,
                ..
            }) => {
                self.attrs.full.store(true, Ordering::Relaxed);
                (cookie, true)
            }
            // Not a directory this process may list, or no listings from this daemon: one
            // stat at a time there.
            _ => (cookie, true),
        };
        {
            let mut all = self
                .attrs
                .listings
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let l = all.entry(dir.to_vec()).or_default();
            *l = Listing {
                misses: 0,
                next,
                done,
                asking: false,
            };
        }
        self.kept_counted(key, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_have_a_listing() {
        assert_eq!(parent(b"/a"), Some(&b"/"[..]));
        assert_eq!(parent(b"/a/b/c"), Some(&b"/a/b"[..]));
        for odd in [
            &b"/"[..],
            b"",
            b"a/b",
            b"/a/",
            b"/a//b",
            b"/a/./b",
            b"/a/../b",
            b"/a/b/..",
        ] {
            assert_eq!(parent(odd), None, "{}", String::from_utf8_lossy(odd));
        }
    }
}
