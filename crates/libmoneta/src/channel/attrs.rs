//! Answers about attributes kept between calls (docs/abi.md §3.7): a `STAT` answer (or its
//! error), and the attributes an `OPEN` answered with, are given again without asking while
//! the channel's change-board counter for them keeps the value it had before the question.
//! The daemon adds to that counter before it answers any call that changes something the
//! answer depended on (the inode, and for a path each directory and link on the way), so a
//! kept answer is one the daemon would give now. A counter this process scribbles on can only
//! make its own answers wrong.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use moneta_abi::fsproto::{FsStat, Target};
use moneta_abi::{change_slot, CHANGES_OFFSET, CHANGE_SLOTS, FS_CHANGE_BOARD};

use super::Channel;

/// Most answers kept; past it they are all dropped (and asked for again).
const MOST: usize = 4096;

/// What a kept answer was.
pub(crate) type Kept = Result<FsStat, (i32, String)>;

/// The kept answers of one channel, by target.
#[derive(Default)]
pub(crate) struct Attrs {
    map: Mutex<HashMap<Key, (u64, Kept)>>,
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

impl Channel {
    /// Whether the daemon keeps this channel's change board.
    pub(crate) fn keeps_changes(&self) -> bool {
        self.header().fs_flags.load(Ordering::Acquire) & FS_CHANGE_BOARD != 0
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

    /// The answer kept for `key`, if its counter has not moved since.
    pub(crate) fn kept(&self, key: &Key) -> Option<Kept> {
        let map = self.attrs.map.lock().unwrap_or_else(|e| e.into_inner());
        let (count, kept) = map.get(key)?;
        (*count == self.change_count(&key.target())).then(|| kept.clone())
    }

    /// Keeps `answer` for `key`, given when the counter read `count` (before the question).
    pub(crate) fn keep(&self, key: Key, count: u64, answer: Kept) {
        let mut map = self.attrs.map.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MOST {
            map.clear();
        }
        map.insert(key, (count, answer));
    }

    /// Forgets what was kept for `key` (a handle closed).
    pub(crate) fn forget(&self, key: &Key) {
        self.attrs
            .map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}
