//! Advisory file locks between client processes: the table the permission manager keeps for
//! `fcntl` record locks (POSIX and open-file-description locks) and `flock` locks, and the
//! wait-for graph that turns a waiting set that can never succeed into `EDEADLK`.
//!
//! It is a plain data structure over inode numbers and owners; the manager
//! ([`crate::manager`]) decides who owns a lock and when locks go (a close, the end of a
//! session, the last close of an open file description). Semantics follow Linux:
//!
//! - Record locks cover byte ranges and are shared (read) or exclusive (write). Two conflict
//!   when their owners differ, their ranges overlap and one of them is exclusive. POSIX and
//!   OFD locks live in one table, so they conflict with each other; an owner never conflicts
//!   with itself.
//! - A set over ranges its owner already holds replaces them there: ranges split, and ranges
//!   of one owner and type that overlap or touch merge, so an owner's ranges never overlap and
//!   its list is the shortest one. An unlock splits as well.
//! - A set either succeeds entirely or changes nothing.
//! - `flock` locks cover the whole file, one per open file description, in a table of their
//!   own: they never conflict with record locks. A conversion first drops the old lock, as
//!   Linux does, so two shared holders that both upgrade cannot block each other forever.
//!
//! Waiting is the client's: it retries a conflicting set, marked `wait`, until it succeeds.
//! Each such refusal records that its owner waits for the owners of the conflicting locks;
//! when that closes a cycle, the set fails with [`LockError::Deadlock`] instead. An owner's
//! edges go when its next set succeeds or comes without `wait`, when it is released, or once
//! they are [`WAIT_EXPIRY`] old (a live waiter renews them far more often). Only record locks
//! take part: `flock` reports no deadlocks on Linux either.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use moneta_abi::control::errno;

/// Most locks (record locks and `flock` locks, all owners) on one file.
pub const MAX_LOCKS_PER_FILE: usize = 16384;
/// Most locks one owner (a session for POSIX locks, an open file description for OFD and
/// `flock` locks) holds over all files.
pub const MAX_LOCKS_PER_OWNER: usize = 4096;
/// Most locks in the whole daemon: bounds the table's memory whatever clients do.
pub const MAX_LOCKS: usize = 1 << 20;
/// How long a waiter's edges count without being renewed by another waiting set.
pub const WAIT_EXPIRY: Duration = Duration::from_secs(2);
/// Most waiters the deadlock search visits for one set; past it the set is refused with a
/// plain conflict (Linux gives up likewise, after ten steps).
pub const MAX_WAIT_STEPS: usize = 4096;

/// Who holds a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// A session (one connection, one client process): POSIX record locks.
    Session(u64),
    /// An open file description: OFD record locks and `flock` locks.
    Ofd(u64),
}

/// A lock's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shared.
    Read,
    /// Exclusive.
    Write,
}

/// A byte range, both ends included (so a range to the end of every file is representable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Range {
    /// First byte.
    pub start: u64,
    /// Last byte; not below `start`.
    pub end: u64,
}

impl Range {
    fn overlaps(&self, o: &Range) -> bool {
        self.start <= o.end && o.start <= self.end
    }

    /// Overlapping or adjacent.
    #[cfg(test)]
    fn touches(&self, o: &Range) -> bool {
        self.start <= o.end.saturating_add(1) && o.start <= self.end.saturating_add(1)
    }
}

/// One lock held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// Its owner.
    pub owner: Owner,
    /// The process that placed it (for reports).
    pub pid: i32,
    /// Its type.
    pub mode: Mode,
    /// The bytes it covers (the whole file for a `flock` lock).
    pub range: Range,
}

#[cfg(test)]
impl Held {
    fn conflicts(&self, owner: Owner, mode: Mode, range: &Range) -> bool {
        self.owner != owner
            && (self.mode == Mode::Write || mode == Mode::Write)
            && self.range.overlaps(range)
    }
}

/// Limits of a table ([`MAX_LOCKS_PER_FILE`], [`MAX_LOCKS_PER_OWNER`], [`MAX_LOCKS`] by
/// default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most locks on one file.
    pub per_file: usize,
    /// Most locks of one owner.
    pub per_owner: usize,
    /// Most locks in all.
    pub total: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            per_file: MAX_LOCKS_PER_FILE,
            per_owner: MAX_LOCKS_PER_OWNER,
            total: MAX_LOCKS,
        }
    }
}

/// Why a lock was not placed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LockError {
    /// Another owner holds a conflicting lock (this one, the first by start).
    #[error(
        "the range is locked by another owner (pid {}); try again, or wait for it",
        .0.pid
    )]
    Conflict(Held),
    /// Waiting would never end: the conflicting locks' owners wait, directly or through
    /// others, for locks the caller holds.
    #[error("waiting for this lock would deadlock; release a lock the waiters need first")]
    Deadlock,
    /// A limit was reached.
    #[error("too many locks {0}; release some first")]
    TooMany(&'static str),
}

impl LockError {
    /// The errno `fcntl` and `flock` give for it.
    pub fn errno(&self) -> i32 {
        match self {
            LockError::Conflict(_) => errno::EAGAIN,
            LockError::Deadlock => errno::EDEADLK,
            LockError::TooMany(_) => errno::ENOLCK,
        }
    }
}

/// A `flock` lock.
#[derive(Clone, Copy, Debug)]
struct Flock {
    ofd: u64,
    pid: i32,
    mode: Mode,
}

/// The locks of one file.
#[derive(Default)]
struct FileLocks {
    /// Record locks per owner, each list sorted by start and disjoint, so that a lookup in
    /// one is a binary search.
    records: HashMap<Owner, Vec<Held>>,
    /// Record locks in all lists.
    nrecords: usize,
    flocks: Vec<Flock>,
}

impl FileLocks {
    fn len(&self) -> usize {
        self.nrecords + self.flocks.len()
    }

    /// For each other owner holding a record lock that conflicts with `mode` over `range`,
    /// its first such lock; sorted by start (then owner).
    fn conflicts(&self, owner: Owner, mode: Mode, range: &Range) -> Vec<Held> {
        let mut out: Vec<Held> = self
            .records
            .iter()
            .filter(|(o, _)| **o != owner)
            .filter_map(|(_, list)| {
                overlapping(list, range)
                    .iter()
                    .find(|h| h.mode == Mode::Write || mode == Mode::Write)
                    .copied()
            })
            .collect();
        out.sort_unstable_by_key(|h| (h.range.start, h.owner));
        out
    }
}

/// The locks of one owner's list (sorted, disjoint) that overlap `range`.
fn overlapping<'a>(list: &'a [Held], range: &Range) -> &'a [Held] {
    let lo = list.partition_point(|h| h.range.end < range.start);
    let hi = list.partition_point(|h| h.range.start <= range.end);
    &list[lo..hi.max(lo)]
}

/// What an owner holds: locks in all, and per inode.
#[derive(Default)]
struct OwnerLocks {
    count: usize,
    files: HashMap<u64, usize>,
}

/// The owners a waiter waits for, as of its last refused set.
struct Wait {
    on: Vec<Owner>,
    at: Instant,
}

/// The lock table.
pub struct Locks {
    files: HashMap<u64, FileLocks>,
    owners: HashMap<Owner, OwnerLocks>,
    total: usize,
    waits: HashMap<Owner, Wait>,
    limits: Limits,
}

impl Default for Locks {
    fn default() -> Self {
        Self::new()
    }
}

/// The whole file, for `flock` locks in reports.
const WHOLE: Range = Range {
    start: 0,
    end: u64::MAX,
};

impl Locks {
    /// An empty table with the default limits.
    pub fn new() -> Locks {
        Self::with_limits(Limits::default())
    }

    /// An empty table with `limits`.
    pub fn with_limits(limits: Limits) -> Locks {
        Locks {
            files: HashMap::new(),
            owners: HashMap::new(),
            total: 0,
            waits: HashMap::new(),
            limits,
        }
    }

    /// Locks held in all.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether no lock is held.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The record locks on `ino`, sorted by start (then owner).
    pub fn records(&self, ino: u64) -> Vec<Held> {
        let mut out: Vec<Held> = self
            .files
            .get(&ino)
            .map(|f| f.records.values().flatten().copied().collect())
            .unwrap_or_default();
        out.sort_unstable_by_key(|h| (h.range.start, h.owner));
        out
    }

    /// The `flock` locks on `ino`: (open file description, type).
    pub fn flocks(&self, ino: u64) -> Vec<(u64, Mode)> {
        self.files
            .get(&ino)
            .map(|f| f.flocks.iter().map(|l| (l.ofd, l.mode)).collect())
            .unwrap_or_default()
    }

    /// Owners with edges in the wait-for graph (expired ones included until pruned).
    pub fn waiters(&self) -> usize {
        self.waits.len()
    }

    /// `F_GETLK`: the first record lock (by start) of another owner that conflicts with
    /// `mode` over `range`, if any.
    pub fn test(&self, ino: u64, owner: Owner, mode: Mode, range: Range) -> Option<Held> {
        self.files
            .get(&ino)?
            .conflicts(owner, mode, &range)
            .first()
            .copied()
    }

    /// `F_SETLK`: places a record lock of `mode` over `range` for `owner`, or removes the
    /// owner's locks there (`mode` `None`). With `wait`, a conflict records the caller as
    /// waiting for the conflicting locks' owners, and fails with [`LockError::Deadlock`] when
    /// that closes a cycle. `now` dates the wait.
    #[allow(clippy::too_many_arguments)]
    pub fn set(
        &mut self,
        ino: u64,
        owner: Owner,
        pid: i32,
        mode: Option<Mode>,
        range: Range,
        wait: bool,
        now: Instant,
    ) -> Result<(), LockError> {
        assert!(range.start <= range.end, "an empty lock range");
        if let Some(mode) = mode {
            let blockers = self
                .files
                .get(&ino)
                .map(|f| f.conflicts(owner, mode, &range))
                .unwrap_or_default();
            if let Some(&first) = blockers.first() {
                if !wait {
                    self.waits.remove(&owner);
                    return Err(LockError::Conflict(first));
                }
                let on: Vec<Owner> = blockers.iter().map(|h| h.owner).collect();
                self.waits
                    .retain(|_, w| now.saturating_duration_since(w.at) < WAIT_EXPIRY);
                if self.closes_cycle(owner, &on, now) {
                    self.waits.remove(&owner);
                    return Err(LockError::Deadlock);
                }
                self.waits.insert(owner, Wait { on, at: now });
                return Err(LockError::Conflict(first));
            }
        }
        self.waits.remove(&owner);
        let empty = FileLocks::default();
        let file = self.files.get(&ino).unwrap_or(&empty);
        let list = file.records.get(&owner).map_or(&[][..], |l| &l[..]);
        let (block, new) = plan(list, owner, pid, mode, range);
        if block.is_empty() && new.is_empty() {
            return Ok(());
        }
        if new.len() > block.len() {
            self.room(file, owner, new.len() - block.len())?;
        }
        let delta = new.len() as isize - block.len() as isize;
        let f = self.files.entry(ino).or_default();
        let list = f.records.entry(owner).or_default();
        list.splice(block, new);
        if list.is_empty() {
            f.records.remove(&owner);
        }
        f.nrecords = f.nrecords.saturating_add_signed(delta);
        self.account(ino, owner, delta);
        Ok(())
    }

    /// `flock`: takes a shared or exclusive lock on the whole of `ino` for open file
    /// description `ofd`, converts the one it holds, or removes it (`mode` `None`). A
    /// conversion drops the old lock first, even when the new one then conflicts (Linux).
    pub fn flock(
        &mut self,
        ino: u64,
        ofd: u64,
        pid: i32,
        mode: Option<Mode>,
    ) -> Result<(), LockError> {
        let owner = Owner::Ofd(ofd);
        if let Some(f) = self.files.get_mut(&ino) {
            if let Some(i) = f.flocks.iter().position(|l| l.ofd == ofd) {
                if Some(f.flocks[i].mode) == mode {
                    return Ok(());
                }
                f.flocks.swap_remove(i);
                self.account(ino, owner, -1);
            }
        }
        let Some(mode) = mode else {
            return Ok(());
        };
        let empty = FileLocks::default();
        let file = self.files.get(&ino).unwrap_or(&empty);
        if let Some(c) = file
            .flocks
            .iter()
            .find(|l| l.mode == Mode::Write || mode == Mode::Write)
        {
            return Err(LockError::Conflict(Held {
                owner: Owner::Ofd(c.ofd),
                pid: c.pid,
                mode: c.mode,
                range: WHOLE,
            }));
        }
        self.room(file, owner, 1)?;
        self.files
            .entry(ino)
            .or_default()
            .flocks
            .push(Flock { ofd, pid, mode });
        self.account(ino, owner, 1);
        Ok(())
    }

    /// Removes every lock `owner` holds on `ino` (record and `flock` locks).
    pub fn release(&mut self, ino: u64, owner: Owner) {
        let Some(f) = self.files.get_mut(&ino) else {
            return;
        };
        let before = f.len();
        if let Some(list) = f.records.remove(&owner) {
            f.nrecords -= list.len();
        }
        if let Owner::Ofd(ofd) = owner {
            f.flocks.retain(|l| l.ofd != ofd);
        }
        let removed = before - f.len();
        if removed > 0 {
            self.account(ino, owner, -(removed as isize));
        }
    }

    /// Removes every lock `owner` holds, on every file, and its wait edges.
    pub fn release_owner(&mut self, owner: Owner) {
        self.waits.remove(&owner);
        let inos: Vec<u64> = match self.owners.get(&owner) {
            Some(o) => o.files.keys().copied().collect(),
            None => return,
        };
        for ino in inos {
            self.release(ino, owner);
        }
    }

    /// Refuses `more` locks for `owner` on `file` beyond the limits.
    fn room(&self, file: &FileLocks, owner: Owner, more: usize) -> Result<(), LockError> {
        let held = self.owners.get(&owner).map_or(0, |o| o.count);
        if file.len() + more > self.limits.per_file {
            Err(LockError::TooMany("on this file"))
        } else if held + more > self.limits.per_owner {
            Err(LockError::TooMany("held by this process or open file"))
        } else if self.total + more > self.limits.total {
            Err(LockError::TooMany("in the daemon"))
        } else {
            Ok(())
        }
    }

    /// Counts `delta` locks for `owner` on `ino`, dropping what became empty.
    fn account(&mut self, ino: u64, owner: Owner, delta: isize) {
        self.total = self.total.saturating_add_signed(delta);
        let o = self.owners.entry(owner).or_default();
        o.count = o.count.saturating_add_signed(delta);
        let n = o.files.entry(ino).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            o.files.remove(&ino);
        }
        if o.count == 0 {
            self.owners.remove(&owner);
        }
        if self.files.get(&ino).is_some_and(|f| f.len() == 0) {
            self.files.remove(&ino);
        }
    }

    /// Whether `me` waiting for `on` closes a cycle of live waits.
    fn closes_cycle(&self, me: Owner, on: &[Owner], now: Instant) -> bool {
        let mut seen = HashSet::new();
        let mut stack = on.to_vec();
        while let Some(o) = stack.pop() {
            if o == me {
                return true;
            }
            if !seen.insert(o) {
                continue;
            }
            if seen.len() > MAX_WAIT_STEPS {
                return false;
            }
            if let Some(w) = self.waits.get(&o) {
                if now.saturating_duration_since(w.at) < WAIT_EXPIRY {
                    stack.extend_from_slice(&w.on);
                }
            }
        }
        false
    }

    /// Checks the table's invariants (for tests): records sorted by start, an owner's ranges
    /// disjoint and never touching when of one type, counts right.
    #[cfg(test)]
    fn validate(&self) {
        let mut total = 0;
        let mut per: HashMap<(Owner, u64), usize> = HashMap::new();
        for (&ino, f) in &self.files {
            assert!(f.len() > 0, "empty file entries are dropped");
            assert_eq!(f.nrecords, f.records.values().map(Vec::len).sum::<usize>());
            total += f.len();
            for (owner, list) in &f.records {
                assert!(!list.is_empty(), "empty lists are dropped");
                for a in list {
                    assert_eq!(a.owner, *owner);
                    assert!(a.range.start <= a.range.end);
                }
                for w in list.windows(2) {
                    let (a, b) = (&w[0], &w[1]);
                    assert!(
                        a.range.end < b.range.start,
                        "{a:?} then {b:?}: unsorted or overlapping"
                    );
                    assert!(a.mode != b.mode || !a.range.touches(&b.range), "unmerged");
                }
                *per.entry((*owner, ino)).or_default() += list.len();
            }
            for l in &f.flocks {
                *per.entry((Owner::Ofd(l.ofd), ino)).or_default() += 1;
            }
        }
        assert_eq!(total, self.total);
        for ((owner, ino), n) in &per {
            assert_eq!(self.owners[owner].files[ino], *n);
        }
        for (owner, o) in &self.owners {
            assert_eq!(o.count, o.files.values().sum::<usize>());
            assert!(o.files.keys().all(|i| per.contains_key(&(*owner, *i))));
        }
    }
}

/// The change a set makes to `owner`'s `list` (sorted, disjoint): the block of the list that
/// overlaps or touches `range`, and what replaces it, sorted. Over `range`, the owner's
/// locks are cut away; those of the new type that overlap or touch it merge into the new lock.
fn plan(
    list: &[Held],
    owner: Owner,
    pid: i32,
    mode: Option<Mode>,
    range: Range,
) -> (std::ops::Range<usize>, Vec<Held>) {
    let lo = list.partition_point(|h| h.range.end.saturating_add(1) < range.start);
    let hi = list.partition_point(|h| h.range.start <= range.end.saturating_add(1));
    let block = lo..hi.max(lo);
    let mut add = Vec::new();
    let mut merged = range;
    for h in &list[block.clone()] {
        if Some(h.mode) == mode {
            merged.start = merged.start.min(h.range.start);
            merged.end = merged.end.max(h.range.end);
        } else if !h.range.overlaps(&range) {
            // Touches without overlapping, and of another type: stays.
            add.push(*h);
        } else {
            if h.range.start < range.start {
                add.push(Held {
                    range: Range {
                        start: h.range.start,
                        end: range.start - 1,
                    },
                    ..*h
                });
            }
            if h.range.end > range.end {
                add.push(Held {
                    range: Range {
                        start: range.end + 1,
                        end: h.range.end,
                    },
                    ..*h
                });
            }
        }
    }
    if let Some(mode) = mode {
        add.push(Held {
            owner,
            pid,
            mode,
            range: merged,
        });
    }
    add.sort_unstable_by_key(|h| h.range.start);
    (block, add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Owner = Owner::Session(1);
    const B: Owner = Owner::Session(2);
    const C: Owner = Owner::Ofd(3);

    fn r(start: u64, end: u64) -> Range {
        Range { start, end }
    }

    fn set(
        t: &mut Locks,
        o: Owner,
        m: Option<Mode>,
        start: u64,
        end: u64,
    ) -> Result<(), LockError> {
        t.set(1, o, 10, m, r(start, end), false, Instant::now())
    }

    fn ranges(t: &Locks, o: Owner) -> Vec<(Mode, u64, u64)> {
        t.records(1)
            .iter()
            .filter(|h| h.owner == o)
            .map(|h| (h.mode, h.range.start, h.range.end))
            .collect()
    }

    #[test]
    fn readers_share_and_writers_exclude() {
        let mut t = Locks::new();
        set(&mut t, A, Some(Mode::Read), 0, 99).unwrap();
        set(&mut t, B, Some(Mode::Read), 50, 149).unwrap();
        let e = set(&mut t, C, Some(Mode::Write), 120, 130).unwrap_err();
        assert_eq!(e.errno(), errno::EAGAIN);
        match e {
            LockError::Conflict(h) => assert_eq!((h.owner, h.range), (B, r(50, 149))),
            other => panic!("{other:?}"),
        }
        set(&mut t, C, Some(Mode::Write), 150, 160).unwrap();
        assert_eq!(
            t.test(1, A, Mode::Read, r(0, u64::MAX)).map(|h| h.owner),
            Some(C)
        );
        assert_eq!(t.test(1, A, Mode::Read, r(0, 149)), None);
        assert_eq!(
            t.test(1, A, Mode::Write, r(0, 10)),
            None,
            "own locks never conflict"
        );
        assert_eq!(
            t.test(1, A, Mode::Write, r(0, 60)).map(|h| h.owner),
            Some(B)
        );
        t.validate();
    }

    #[test]
    fn an_owner_splits_merges_and_converts_its_ranges() {
        let mut t = Locks::new();
        set(&mut t, A, Some(Mode::Write), 0, 99).unwrap();
        set(&mut t, A, None, 40, 59).unwrap();
        assert_eq!(
            ranges(&t, A),
            vec![(Mode::Write, 0, 39), (Mode::Write, 60, 99)]
        );
        // Filling the gap merges all three.
        set(&mut t, A, Some(Mode::Write), 40, 59).unwrap();
        assert_eq!(ranges(&t, A), vec![(Mode::Write, 0, 99)]);
        // Converting the middle to read splits into three.
        set(&mut t, A, Some(Mode::Read), 10, 19).unwrap();
        assert_eq!(
            ranges(&t, A),
            vec![
                (Mode::Write, 0, 9),
                (Mode::Read, 10, 19),
                (Mode::Write, 20, 99)
            ]
        );
        // Adjacent ranges of one type merge, of another do not.
        set(&mut t, A, Some(Mode::Read), 100, 109).unwrap();
        assert_eq!(ranges(&t, A).len(), 4);
        set(&mut t, A, Some(Mode::Read), 0, u64::MAX).unwrap();
        assert_eq!(ranges(&t, A), vec![(Mode::Read, 0, u64::MAX)]);
        // Other owners' ranges stay as they are.
        set(&mut t, B, Some(Mode::Read), 5, 7).unwrap();
        set(&mut t, A, None, 0, u64::MAX).unwrap();
        assert_eq!(ranges(&t, A), vec![]);
        assert_eq!(ranges(&t, B), vec![(Mode::Read, 5, 7)]);
        assert_eq!(t.len(), 1);
        t.validate();
    }

    #[test]
    fn release_drops_an_owners_locks() {
        let mut t = Locks::new();
        let now = Instant::now();
        t.set(1, A, 1, Some(Mode::Read), r(0, 9), false, now)
            .unwrap();
        t.set(2, A, 1, Some(Mode::Read), r(0, 9), false, now)
            .unwrap();
        t.set(2, C, 1, Some(Mode::Read), r(0, 9), false, now)
            .unwrap();
        t.flock(2, 3, 1, Some(Mode::Write)).unwrap();
        t.release(1, A);
        assert!(t.records(1).is_empty());
        assert_eq!(t.records(2).len(), 2);
        t.release_owner(A);
        t.validate();
        assert_eq!(t.len(), 2);
        t.release_owner(C);
        assert!(t.is_empty());
        assert!(t.flocks(2).is_empty());
        t.validate();
    }

    #[test]
    fn flock_is_whole_file_and_apart_from_record_locks() {
        let mut t = Locks::new();
        set(&mut t, A, Some(Mode::Write), 0, u64::MAX).unwrap();
        t.flock(1, 7, 1, Some(Mode::Write)).unwrap();
        assert!(t.flock(1, 8, 1, Some(Mode::Read)).is_err());
        t.flock(1, 7, 1, Some(Mode::Read)).unwrap();
        t.flock(1, 8, 1, Some(Mode::Read)).unwrap();
        // Both holders upgrade: the first loses its shared lock and conflicts with the
        // second's; the second then succeeds (Linux's non-atomic conversion).
        assert!(t.flock(1, 7, 1, Some(Mode::Write)).is_err());
        assert_eq!(t.flocks(1), vec![(8, Mode::Read)]);
        t.flock(1, 8, 1, Some(Mode::Write)).unwrap();
        t.flock(1, 8, 1, Some(Mode::Write)).unwrap();
        t.flock(1, 8, 1, None).unwrap();
        t.flock(1, 8, 1, None).unwrap();
        assert!(t.flocks(1).is_empty());
        assert_eq!(t.len(), 1);
        t.validate();
    }

    #[test]
    fn waiting_in_a_cycle_is_a_deadlock() {
        let mut t = Locks::new();
        let now = Instant::now();
        t.set(1, A, 1, Some(Mode::Write), r(0, 9), false, now)
            .unwrap();
        t.set(1, B, 2, Some(Mode::Write), r(10, 19), false, now)
            .unwrap();
        t.set(1, C, 3, Some(Mode::Write), r(20, 29), false, now)
            .unwrap();
        // A waits for B, B for C: no cycle yet.
        let conflict = |r: Result<(), LockError>| matches!(r, Err(LockError::Conflict(_)));
        assert!(conflict(t.set(
            1,
            A,
            1,
            Some(Mode::Write),
            r(10, 10),
            true,
            now
        )));
        assert!(conflict(t.set(
            1,
            B,
            2,
            Some(Mode::Write),
            r(20, 20),
            true,
            now
        )));
        // C waiting for A closes A -> B -> C -> A.
        let e = t.set(1, C, 3, Some(Mode::Read), r(5, 5), true, now);
        assert_eq!(e, Err(LockError::Deadlock));
        assert_eq!(LockError::Deadlock.errno(), errno::EDEADLK);
        // Without wait it is a plain conflict, and the refused waiter is not recorded.
        assert!(conflict(t.set(
            1,
            C,
            3,
            Some(Mode::Read),
            r(5, 5),
            false,
            now
        )));
        // Once B stops waiting (a set without wait), C may wait for A.
        assert!(conflict(t.set(
            1,
            B,
            2,
            Some(Mode::Write),
            r(20, 20),
            false,
            now
        )));
        assert!(conflict(t.set(
            1,
            C,
            3,
            Some(Mode::Read),
            r(5, 5),
            true,
            now
        )));
        // Now B waiting for C closes B -> C -> A -> B.
        assert_eq!(
            t.set(1, B, 2, Some(Mode::Write), r(20, 20), true, now),
            Err(LockError::Deadlock)
        );
        // Edges expire unless renewed.
        let later = now + WAIT_EXPIRY + Duration::from_millis(1);
        assert!(conflict(t.set(
            1,
            B,
            2,
            Some(Mode::Write),
            r(20, 20),
            true,
            later
        )));
        // A success drops the caller's edges: A takes a free range, then B's wait on C and
        // C's on A do not meet A -> B any more.
        t.set(1, A, 1, Some(Mode::Read), r(50, 60), false, later)
            .unwrap();
        assert!(conflict(t.set(
            1,
            C,
            3,
            Some(Mode::Read),
            r(5, 5),
            true,
            later
        )));
        // Releasing an owner drops its edges.
        t.release_owner(C);
        assert_eq!(t.waiters(), 1, "only B still waits");
        t.validate();
    }

    #[test]
    fn limits_refuse_with_enolck_and_change_nothing() {
        let mut t = Locks::with_limits(Limits {
            per_file: 6,
            per_owner: 3,
            total: 8,
        });
        for i in 0..3 {
            set(&mut t, A, Some(Mode::Read), i * 10, i * 10).unwrap();
        }
        let e = set(&mut t, A, Some(Mode::Read), 100, 100).unwrap_err();
        assert_eq!(e.errno(), errno::ENOLCK);
        // Merging into an existing range needs no new lock; splitting does.
        set(&mut t, A, Some(Mode::Read), 0, 5).unwrap();
        assert_eq!(
            set(&mut t, A, None, 2, 3),
            Err(LockError::TooMany("held by this process or open file"))
        );
        assert_eq!(ranges(&t, A).len(), 3);
        for i in 0..3 {
            set(&mut t, B, Some(Mode::Read), 1000 + i * 10, 1000 + i * 10).unwrap();
        }
        assert_eq!(
            set(&mut t, C, Some(Mode::Read), 500, 500),
            Err(LockError::TooMany("on this file"))
        );
        assert_eq!(
            t.flock(1, 3, 1, Some(Mode::Read)).unwrap_err().errno(),
            errno::ENOLCK
        );
        t.set(2, C, 1, Some(Mode::Read), r(0, 0), false, Instant::now())
            .unwrap();
        t.set(3, C, 1, Some(Mode::Read), r(0, 0), false, Instant::now())
            .unwrap();
        assert_eq!(
            t.set(4, C, 1, Some(Mode::Read), r(0, 0), false, Instant::now()),
            Err(LockError::TooMany("in the daemon"))
        );
        t.validate();
    }

    /// The model: a 64-byte file plus one cell standing for every byte past it, and per owner
    /// the type it holds on each cell; one `flock` slot per open file description.
    const CELLS: usize = 65;
    const OWNERS: [Owner; 3] = [Owner::Session(1), Owner::Ofd(2), Owner::Ofd(3)];

    #[derive(Clone, Debug)]
    enum Op {
        Set(usize, Option<Mode>, u64, u64),
        Test(usize, Mode, u64, u64),
        Flock(usize, Option<Mode>),
        Release(usize),
    }

    fn mode() -> impl Strategy<Value = Mode> {
        prop_oneof![Just(Mode::Read), Just(Mode::Write)]
    }

    /// A start in the file and a length (0: to the end of everything).
    fn span() -> impl Strategy<Value = (u64, u64)> {
        (0u64..64).prop_flat_map(|s| (Just(s), 0u64..=64 - s))
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            5 => (0usize..3, proptest::option::weighted(0.8, mode()), span())
                .prop_map(|(o, m, (s, l))| Op::Set(o, m, s, l)),
            2 => (0usize..3, mode(), span()).prop_map(|(o, m, (s, l))| Op::Test(o, m, s, l)),
            1 => (0usize..3, proptest::option::of(mode())).prop_map(|(o, m)| Op::Flock(o, m)),
            1 => (0usize..3).prop_map(Op::Release),
        ]
    }

    fn range_of(s: u64, l: u64) -> Range {
        if l == 0 {
            r(s, u64::MAX)
        } else {
            r(s, s + l - 1)
        }
    }

    fn cells(range: Range) -> std::ops::Range<usize> {
        range.start.min(64) as usize..(range.end.min(64) + 1) as usize
    }

    type Model = [[Option<Mode>; CELLS]; 3];

    /// The records the model's state means, each owner's in maximal runs.
    fn runs(m: &Model) -> Vec<(Owner, Mode, Range)> {
        let mut out = Vec::new();
        for (o, row) in m.iter().enumerate() {
            let mut i = 0;
            while i < CELLS {
                let Some(mode) = row[i] else {
                    i += 1;
                    continue;
                };
                let mut j = i;
                while j + 1 < CELLS && row[j + 1] == Some(mode) {
                    j += 1;
                }
                let end = if j == CELLS - 1 { u64::MAX } else { j as u64 };
                out.push((OWNERS[o], mode, r(i as u64, end)));
                i = j + 1;
            }
        }
        out.sort_by_key(|&(o, _, r)| (r.start, o));
        out
    }

    fn model_conflict(m: &Model, o: usize, mode: Mode, range: Range) -> bool {
        (0..3).filter(|&p| p != o).any(|p| {
            m[p][cells(range)]
                .iter()
                .any(|c| matches!(c, Some(x) if *x == Mode::Write || mode == Mode::Write))
        })
    }

    fn flock_count(f: &[Option<Mode>; 3]) -> usize {
        f.iter().filter(|x| x.is_some()).count()
    }

    proptest! {
        #[test]
        fn matches_a_byte_model(
            ops in proptest::collection::vec(op(), 1..80),
            small in any::<bool>(),
        ) {
            let limits = if small {
                Limits { per_file: 7, per_owner: 4, total: 100 }
            } else {
                Limits::default()
            };
            let mut t = Locks::with_limits(limits);
            let mut m: Model = [[None; CELLS]; 3];
            // flock slots of the OFD owners (index 0, a session, takes none).
            let mut fl: [Option<Mode>; 3] = [None; 3];
            let now = Instant::now();
            for op in ops {
                match op {
                    Op::Set(o, mode, s, l) => {
                        let range = range_of(s, l);
                        let got = t.set(1, OWNERS[o], o as i32, mode, range, false, now);
                        let conflict = mode.is_some_and(|x| model_conflict(&m, o, x, range));
                        let mut next = m;
                        next[o][cells(range)].iter_mut().for_each(|c| *c = mode);
                        let count = |mm: &Model, p: usize| {
                            runs(mm).iter().filter(|x| x.0 == OWNERS[p]).count()
                                + usize::from(fl[p].is_some() && p > 0)
                        };
                        let file = runs(&next).len() + flock_count(&fl);
                        let over = file > limits.per_file || count(&next, o) > limits.per_owner;
                        if conflict {
                            prop_assert!(matches!(got, Err(LockError::Conflict(_))), "{got:?}");
                        } else if over {
                            prop_assert!(matches!(got, Err(LockError::TooMany(_))), "{got:?}");
                        } else {
                            prop_assert_eq!(got, Ok(()));
                            m = next;
                        }
                    }
                    Op::Test(o, mode, s, l) => {
                        let range = range_of(s, l);
                        let got = t.test(1, OWNERS[o], mode, range);
                        prop_assert_eq!(got.is_some(), model_conflict(&m, o, mode, range));
                        if let Some(h) = got {
                            prop_assert!(h.conflicts(OWNERS[o], mode, &range));
                            let p = OWNERS.iter().position(|x| *x == h.owner).unwrap();
                            prop_assert!(m[p][cells(h.range)].iter().all(|c| *c == Some(h.mode)));
                        }
                    }
                    Op::Flock(o, mode) => {
                        if o == 0 {
                            continue;
                        }
                        let Owner::Ofd(id) = OWNERS[o] else { unreachable!() };
                        let got = t.flock(1, id, o as i32, mode);
                        if fl[o] == mode {
                            prop_assert_eq!(got, Ok(()));
                            continue;
                        }
                        fl[o] = None;
                        let Some(x) = mode else {
                            prop_assert_eq!(got, Ok(()));
                            continue;
                        };
                        let other = fl[3 - o];
                        let own = runs(&m).iter().filter(|r| r.0 == OWNERS[o]).count();
                        if other.is_some_and(|y| y == Mode::Write || x == Mode::Write) {
                            prop_assert!(matches!(got, Err(LockError::Conflict(_))), "{got:?}");
                        } else if runs(&m).len() + flock_count(&fl) + 1 > limits.per_file
                            || own + 1 > limits.per_owner
                        {
                            prop_assert!(matches!(got, Err(LockError::TooMany(_))), "{got:?}");
                        } else {
                            prop_assert_eq!(got, Ok(()));
                            fl[o] = Some(x);
                        }
                    }
                    Op::Release(o) => {
                        t.release_owner(OWNERS[o]);
                        m[o] = [None; CELLS];
                        fl[o] = None;
                    }
                }
                t.validate();
                let held: Vec<(Owner, Mode, Range)> =
                    t.records(1).iter().map(|h| (h.owner, h.mode, h.range)).collect();
                let mut held_sorted = held.clone();
                held_sorted.sort_by_key(|&(o, _, r)| (r.start, o));
                prop_assert_eq!(held_sorted, runs(&m));
                let mut flocks = t.flocks(1);
                flocks.sort_unstable_by_key(|x| x.0);
                let want: Vec<(u64, Mode)> = (1..3)
                    .filter_map(|o| fl[o].map(|x| (o as u64 + 1, x)))
                    .collect();
                prop_assert_eq!(flocks, want);
                prop_assert_eq!(t.len(), runs(&m).len() + flock_count(&fl));
            }
        }
    }
}
