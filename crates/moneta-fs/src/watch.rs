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
//! Watches are bounded per observer: an answer whose watches would take an observer past
//! [`MAX_WATCHES`] is not kept, and its slot fires at once (the client read the counter
//! before it asked, so it asks again next time), while the answers kept before it stay kept;
//! only an answer of one watch (a handle's) makes room by dropping the oldest, which fires.
//! Dropping the oldest for every answer would make a client that cycles through more paths
//! than the bound holds keep none of them, each new answer firing ten old slots.

use std::collections::{HashMap, HashSet, VecDeque};

// Observers and slots are the daemon's numbers, hashed by its own hasher; inodes are keyed by
// the standard hasher, since a name's key follows from a name a client picks.
use crate::idhash::IdHash;

/// Where fired watches go: `(observer, slot)` once for each.
pub trait ChangeSink: Send + Sync {
    /// A watch of `observer` in `slot` fired.
    fn changed(&self, observer: u32, slot: u16);
}

/// Most watches one observer holds.
pub const MAX_WATCHES: usize = 16_384;

/// An answer past the bound that needs at most this many new watches gets room by dropping the
/// oldest (a handle's stat, one watch, as after every open); one that needs more, a path's
/// (about two for each directory), is not kept. Dropping ten old watches for each new path
/// would leave a client that walks more paths than the bound holds with none kept.
pub const MAKE_ROOM_FOR: usize = 1;

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

/// One watch: (observer, slot).
type Watch = (u32, u16);

/// The watches on one inode (a set). Most inodes are watched by one answer of one client (a
/// file's stat after its open), which is kept inline; the root's search, watched by every path
/// any client asked about, has a table.
enum On {
    One(Watch),
    Many(HashSet<Watch, IdHash>),
}

impl On {
    fn contains(&self, w: &Watch) -> bool {
        match self {
            On::One(x) => x == w,
            On::Many(set) => set.contains(w),
        }
    }

    /// Adds `w`; whether it was not there.
    fn insert(&mut self, w: Watch) -> bool {
        match self {
            On::One(x) if *x == w => false,
            On::One(x) => {
                let mut set = HashSet::with_capacity_and_hasher(4, IdHash::default());
                set.insert(*x);
                set.insert(w);
                *self = On::Many(set);
                true
            }
            On::Many(set) => set.insert(w),
        }
    }

    /// Removes `w`: (whether it was there, whether none is left).
    fn remove(&mut self, w: &Watch) -> (bool, bool) {
        match self {
            On::One(x) => (x == w, x == w),
            On::Many(set) => (set.remove(w), set.is_empty()),
        }
    }

    fn len(&self) -> usize {
        match self {
            On::One(_) => 1,
            On::Many(set) => set.len(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Watch> {
        let (one, many) = match self {
            On::One(x) => (Some(x), None),
            On::Many(set) => (None, Some(set.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

/// The watches of every observer.
#[derive(Default)]
pub(crate) struct Watches {
    /// Per inode: the (observer, slot) pairs watching it.
    by_ino: HashMap<u64, On>,
    /// Per observer: its watches.
    by_observer: HashMap<u32, Held, IdHash>,
}

/// One observer's watches.
#[derive(Default)]
struct Held {
    /// Watches still standing.
    live: usize,
    /// Every watch registered, in order; those fired since stay until the list is compacted
    /// (see [`Held::compact`]), so it holds at most twice the bound.
    list: VecDeque<(u64, u16)>,
}

impl Held {
    /// Drops from the list the watches that fired (and repeats of one registered again):
    /// what is left is exactly the live ones.
    fn compact(&mut self, by_ino: &HashMap<u64, On>, observer: u32) {
        let mut seen: HashSet<(u64, u16), IdHash> = HashSet::default();
        self.list.retain(|&(ino, slot)| {
            by_ino
                .get(&ino)
                .is_some_and(|on| on.contains(&(observer, slot)))
                && seen.insert((ino, slot))
        });
        self.live = self.list.len();
    }
}

impl Watches {
    /// `observer` keeps an answer in `slot` that depends on `inos`. Past the bound the
    /// answer is not kept: `slot` fires at once.
    pub(crate) fn watch(
        &mut self,
        observer: u32,
        slot: u16,
        inos: &[u64],
        sink: Option<&dyn ChangeSink>,
    ) {
        let mine = self.by_observer.entry(observer).or_default();
        // Which watches are new matters only near the bound; below it they all fit.
        let fresh = if mine.live + inos.len() <= MAX_WATCHES {
            0
        } else {
            inos.iter()
                .filter(|ino| {
                    !self
                        .by_ino
                        .get(ino)
                        .is_some_and(|on| on.contains(&(observer, slot)))
                })
                .count()
        };
        if mine.live + fresh > MAX_WATCHES {
            if fresh > MAKE_ROOM_FOR {
                if let Some(s) = sink {
                    s.changed(observer, slot);
                }
                return;
            }
            // A handle's answer (one watch) is asked for right after its open: room is made
            // for it by dropping the oldest watches, each firing its slot.
            while mine.live + fresh > MAX_WATCHES {
                let Some((old, old_slot)) = mine.list.pop_front() else {
                    break;
                };
                if Self::unwatch_one(&mut self.by_ino, old, observer, old_slot) {
                    mine.live -= 1;
                    if let Some(s) = sink {
                        s.changed(observer, old_slot);
                    }
                }
            }
        }
        for &ino in inos {
            let new = match self.by_ino.entry(ino) {
                std::collections::hash_map::Entry::Occupied(mut on) => {
                    on.get_mut().insert((observer, slot))
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(On::One((observer, slot)));
                    true
                }
            };
            if new {
                mine.list.push_back((ino, slot));
                mine.live += 1;
            }
        }
        if mine.list.len() >= 2 * MAX_WATCHES {
            mine.compact(&self.by_ino, observer);
        }
    }

    /// Removes `observer`'s watch of `ino` in `slot`; whether there was one.
    fn unwatch_one(by_ino: &mut HashMap<u64, On>, ino: u64, observer: u32, slot: u16) -> bool {
        let Some(on) = by_ino.get_mut(&ino) else {
            return false;
        };
        let (removed, empty) = on.remove(&(observer, slot));
        if empty {
            by_ino.remove(&ino);
        }
        removed
    }

    /// How many more watches `observer` may hold.
    pub(crate) fn room(&self, observer: u32) -> usize {
        MAX_WATCHES.saturating_sub(self.by_observer.get(&observer).map_or(0, |h| h.live))
    }

    /// `ino` changed: every watch on it fires (into `fired`), and is gone.
    pub(crate) fn changed(&mut self, ino: u64, fired: &mut Vec<(u32, u16)>) {
        // The observers' lists keep the entries until they are compacted; the watches no
        // longer count against the bound.
        if let Some(on) = self.by_ino.remove(&ino) {
            for &(observer, _) in on.iter() {
                if let Some(mine) = self.by_observer.get_mut(&observer) {
                    mine.live = mine.live.saturating_sub(1);
                }
            }
            fired.extend(on.iter().copied());
        }
    }

    /// Forgets every watch of `observer` (its channel closed).
    pub(crate) fn forget(&mut self, observer: u32) {
        let Some(mine) = self.by_observer.remove(&observer) else {
            return;
        };
        for (ino, slot) in mine.list {
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
    fn an_answer_past_the_bound_is_not_kept_and_its_slot_fires() {
        let log = Log::default();
        let mut w = Watches::default();
        for ino in 0..MAX_WATCHES as u64 {
            w.watch(4, (ino % 200) as u16, &[ino], Some(&log));
        }
        assert!(log.0.lock().unwrap().is_empty());
        assert_eq!(w.room(4), 0);
        assert_eq!(w.room(5), MAX_WATCHES);
        // Past the bound: slot 209 fires at once, nothing is registered, and the answers kept
        // before stay kept (no other slot fires).
        w.watch(4, 209, &[1 << 40, 1 << 41], Some(&log));
        assert_eq!(*log.0.lock().unwrap(), [(4, 209)]);
        assert_eq!(w.len(), MAX_WATCHES);
        let mut fired = Vec::new();
        w.changed(1 << 40, &mut fired);
        assert!(fired.is_empty());
        // A watch already held costs nothing more: the same answer again is kept.
        w.watch(4, 7, &[7], Some(&log));
        assert_eq!(log.0.lock().unwrap().len(), 1);
        // Watches that fire give their room back.
        w.changed(5, &mut fired);
        w.changed(6, &mut fired);
        assert_eq!(fired, [(4, 5), (4, 6)]);
        assert_eq!(w.room(4), 2);
        w.watch(4, 209, &[1 << 40, 1 << 41], Some(&log));
        assert_eq!(log.0.lock().unwrap().len(), 1);
        assert_eq!(w.len(), MAX_WATCHES);
        w.changed(1 << 41, &mut fired);
        assert_eq!(fired.last(), Some(&(4, 209)));
    }

    #[test]
    fn a_handle_answer_past_the_bound_makes_room_by_dropping_the_oldest() {
        let log = Log::default();
        let mut w = Watches::default();
        for ino in 0..MAX_WATCHES as u64 {
            w.watch(4, (ino % 200) as u16, &[ino], Some(&log));
        }
        // Inode 0's watch fires early, so the oldest live one is inode 1's.
        let mut fired = Vec::new();
        w.changed(0, &mut fired);
        w.watch(4, 0, &[1 << 40], Some(&log));
        assert!(log.0.lock().unwrap().is_empty());
        // Full again: one watch more drops the oldest live one (inode 1, slot 1), which fires.
        w.watch(4, 210, &[1 << 41], Some(&log));
        assert_eq!(*log.0.lock().unwrap(), [(4, 1)]);
        assert_eq!(w.len(), MAX_WATCHES);
        fired.clear();
        w.changed(1, &mut fired);
        assert!(fired.is_empty());
        w.changed(1 << 41, &mut fired);
        assert_eq!(fired, [(4, 210)]);
    }

    #[test]
    fn an_observer_list_stays_bounded_through_fires_and_returns() {
        // One path asked again and again while what it depends on keeps changing: every
        // round registers and fires its watches; the list must not grow without end.
        let mut w = Watches::default();
        for round in 0..(3 * MAX_WATCHES as u64) {
            w.watch(1, 3, &[10, 11, 12], None);
            let mut fired = Vec::new();
            w.changed(10 + round % 3, &mut fired);
            assert_eq!(fired, [(1, 3)]);
        }
        let mine = &w.by_observer[&1];
        assert!(mine.list.len() < 2 * MAX_WATCHES, "{}", mine.list.len());
        assert_eq!(mine.live, 2);
        assert_eq!(w.len(), 2);
        w.forget(1);
        assert_eq!(w.len(), 0);
    }
}
