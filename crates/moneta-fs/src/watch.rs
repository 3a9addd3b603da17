//! Who kept an answer that depends on an inode, so that they hear when it changes.
//!
//! A client that asked for a file's attributes may keep the answer and give it again without
//! asking, for as long as nothing it depended on has changed. The file system cannot know what
//! each client keeps, so a client's question registers *watches*: (observer, slot) on every
//! thing the answer depended on: the inode it reached (any change of it), and for a path each
//! directory's search permission (its mode and owners) and each name looked up in it (that
//! entry appearing or going), and each link followed. A file created beside one whose path
//! was asked about therefore fires nothing for it. When a transaction changes an inode, every watch on it fires once: the
//! [`ChangeSink`] is told (observer, slot), and the watch is gone (the client asks again,
//! which registers it again). The daemon's sink adds to the observer's counter `slot`, which
//! the client reads before it asks and before it reuses an answer.
//!
//! Watches are bounded per observer: the oldest one goes when an observer has too many, and
//! it fires as it goes, so what depended on it is asked again rather than trusted forever.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes keys the daemon chooses, never a client (observers are channel ids; a slot is one of
/// 256): a rotation and a multiplication per word. Inodes are keyed by the standard hasher,
/// since a name's key follows from a name a client picks.
#[derive(Default)]
struct Small(u64);

impl Hasher for Small {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u16(&mut self, x: u16) {
        self.write_u64(u64::from(x));
    }
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    fn write_u64(&mut self, x: u64) {
        // The rotation brings the well-mixed high bits of what came before to the low ones.
        self.0 = (self.0.rotate_left(32) ^ x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type SmallHash = BuildHasherDefault<Small>;

/// Where fired watches go: `(observer, slot)` once for each.
pub trait ChangeSink: Send + Sync {
    /// A watch of `observer` in `slot` fired.
    fn changed(&self, observer: u32, slot: u16);
}

/// Most watches one observer holds.
pub const MAX_WATCHES: usize = 16_384;

/// What a watch is on: an inode number (its attributes, any change), or one of these keys,
/// which no inode number reaches.
const SEARCH: u64 = 1 << 62;
const NAME: u64 = 1 << 63;

/// The key of what a search of directory `dir` depends on: its mode and owners (a change of
/// its times or names does not change who may search it).
pub(crate) fn search_key(dir: u64) -> u64 {
    SEARCH | dir
}

/// The key of name `name` in directory `dir` (`..` included): it fires when that entry is
/// added or removed, not when another name of the directory changes. FNV-1a, so two names may
/// share a key: a watch then fires more often than it must, never less.
pub(crate) fn name_key(dir: u64, name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in dir.to_le_bytes().iter().chain(name) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    NAME | (h & (SEARCH - 1))
}

/// The watches of every observer.
#[derive(Default)]
pub(crate) struct Watches {
    /// Per inode: the (observer, slot) pairs watching it (a set: the root's search is watched
    /// by every path any client asked about).
    by_ino: HashMap<u64, HashSet<(u32, u16), SmallHash>>,
    /// Per observer: its watches, oldest first (some may have fired already).
    by_observer: HashMap<u32, VecDeque<(u64, u16)>, SmallHash>,
}

impl Watches {
    /// `observer` keeps an answer in `slot` that depends on `inos`.
    pub(crate) fn watch(
        &mut self,
        observer: u32,
        slot: u16,
        inos: &[u64],
        sink: Option<&dyn ChangeSink>,
    ) {
        let mine = self.by_observer.entry(observer).or_default();
        for &ino in inos {
            if !self.by_ino.entry(ino).or_default().insert((observer, slot)) {
                continue;
            }
            mine.push_back((ino, slot));
            if mine.len() > MAX_WATCHES {
                let (old, old_slot) = mine.pop_front().expect("not empty");
                if Self::unwatch_one(&mut self.by_ino, old, observer, old_slot) {
                    if let Some(s) = sink {
                        s.changed(observer, old_slot);
                    }
                }
            }
        }
    }

    /// Removes `observer`'s watch of `ino` in `slot`; whether there was one.
    fn unwatch_one(
        by_ino: &mut HashMap<u64, HashSet<(u32, u16), SmallHash>>,
        ino: u64,
        observer: u32,
        slot: u16,
    ) -> bool {
        let Some(on) = by_ino.get_mut(&ino) else {
            return false;
        };
        let removed = on.remove(&(observer, slot));
        if on.is_empty() {
            by_ino.remove(&ino);
        }
        removed
    }

    /// `ino` changed: every watch on it fires (into `fired`), and is gone.
    pub(crate) fn changed(&mut self, ino: u64, fired: &mut Vec<(u32, u16)>) {
        // The observer's list keeps the entry until it comes to the front, and drops it then:
        // it counts against the bound meanwhile, which only makes the bound tighter.
        if let Some(on) = self.by_ino.remove(&ino) {
            fired.extend(on);
        }
    }

    /// Forgets every watch of `observer` (its channel closed).
    pub(crate) fn forget(&mut self, observer: u32) {
        let Some(mine) = self.by_observer.remove(&observer) else {
            return;
        };
        for (ino, slot) in mine {
            Self::unwatch_one(&mut self.by_ino, ino, observer, slot);
        }
    }

    /// Watches held, all observers together.
    pub(crate) fn len(&self) -> usize {
        self.by_ino.values().map(|on| on.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<(u32, u16)>>);

    impl ChangeSink for Log {
        fn changed(&self, observer: u32, slot: u16) {
            self.0.lock().unwrap().push((observer, slot));
        }
    }

    #[test]
    fn a_watch_fires_once_for_every_observer_and_slot_on_the_inode() {
        let log = Log::default();
        let mut w = Watches::default();
        w.watch(1, 7, &[10, 11], Some(&log));
        w.watch(2, 3, &[11], Some(&log));
        w.watch(1, 7, &[11], Some(&log));
        assert_eq!(w.len(), 3);
        let mut fired = Vec::new();
        w.changed(11, &mut fired);
        fired.sort();
        assert_eq!(fired, [(1, 7), (2, 3)]);
        // Fired watches are gone; the one on inode 10 stays.
        w.changed(11, &mut fired);
        assert_eq!(fired.len(), 2);
        assert_eq!(w.len(), 1);
        w.forget(1);
        assert_eq!(w.len(), 0);
        w.changed(10, &mut fired);
        assert_eq!(fired.len(), 2);
        assert!(log.0.lock().unwrap().is_empty());
    }

    #[test]
    fn an_observer_over_its_bound_loses_its_oldest_watch_which_fires() {
        let log = Log::default();
        let mut w = Watches::default();
        for ino in 0..MAX_WATCHES as u64 {
            w.watch(4, (ino % 200) as u16, &[ino], Some(&log));
        }
        assert!(log.0.lock().unwrap().is_empty());
        w.watch(4, 9, &[1 << 40], Some(&log));
        assert_eq!(*log.0.lock().unwrap(), [(4, 0)]);
        assert_eq!(w.len(), MAX_WATCHES);
    }
}
