//! The permission table (Moneta-D §4.3).
//!
//! Extent records of all channels share one fixed pool of entries (16K by default). Each
//! channel's records form a balanced binary search tree (AVL) keyed by start address, threaded
//! through the pool by index; the root table holds each channel's root. Records of one channel
//! never overlap: installing a record first removes whatever covered its range, so the rights on
//! a byte are those of the latest install. Adjacent records of the same channel, file and rights
//! merge into one. When the pool is full a record is evicted (clock order); its channel's next
//! request to that range fails with a permission miss and the client asks again.
//!
//! The table is owned by the device's poller thread: checks take no lock, and updates arrive
//! through the engine's ordered update buffer.

use moneta_abi::Status;

/// Index of "no node".
const NIL: u32 = u32::MAX;
/// Channel value of a free node.
const FREE: u32 = u32::MAX;

/// Rights bit: read.
pub const READ: u8 = 1;
/// Rights bit: write.
pub const WRITE: u8 = 2;

#[derive(Clone, Copy, Debug)]
struct Node {
    start: u64,
    end: u64,
    file: u64,
    channel: u32,
    left: u32,
    right: u32,
    rights: u8,
    height: u8,
}

#[derive(Clone, Copy, Debug)]
struct Key {
    start: u64,
    /// Left and right subtree.
    child: [u32; 2],
}

#[derive(Clone, Copy, Debug)]
struct Meta {
    end: u64,
    file: u64,
    channel: u32,
    rights: u8,
    height: u8,
}

const EMPTY: Node = Node {
    start: 0,
    end: 0,
    file: 0,
    channel: FREE,
    left: NIL,
    right: NIL,
    rights: 0,
    height: 0,
};

/// A record as seen from outside the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// First byte covered.
    pub start: u64,
    /// One past the last byte covered.
    pub end: u64,
    /// File the record belongs to.
    pub file: u64,
    /// [`READ`] | [`WRITE`].
    pub rights: u8,
}

/// What an update did besides its own job: records of other (or the same) channels it evicted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Evictions {
    /// Channel of each evicted record, in eviction order.
    pub channels: Vec<u32>,
}

/// Why an update could not be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// The channel id is beyond the root table.
    #[error("channel {0} is outside the root table")]
    NoSuchChannel(u32),
    /// Empty or wrapping range, or rights outside READ|WRITE.
    #[error("invalid record: empty or wrapping range, or unknown rights bits")]
    Invalid,
    /// The table has too few entries to hold even this one update (capacity below 2).
    #[error("permission table has no room for this update")]
    NoRoom,
}

/// Counters kept by the table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableCounters {
    /// Records in use.
    pub used: u64,
    /// Inserts that merged into a neighbour.
    pub merges: u64,
    /// Records evicted.
    pub evictions: u64,
}

/// The permission table: a fixed pool of records and a root table of per-channel trees.
pub struct PermissionTable {
    /// What a search touches, kept apart so the search stays in cache.
    keys: Vec<Key>,
    /// The rest of each record.
    meta: Vec<Meta>,
    free: Vec<u32>,
    roots: Vec<u32>,
    merge: bool,
    hand: usize,
    counters: TableCounters,
}

impl PermissionTable {
    /// A table of `capacity` records for channels `0..channels`, merging adjacent records when
    /// `merge` is set (Moneta-D's "Merge" against "NoMerge", Figure 4).
    pub fn new(capacity: usize, channels: usize, merge: bool) -> Self {
        assert!(capacity < NIL as usize && channels < FREE as usize);
        Self {
            keys: vec![
                Key {
                    start: 0,
                    child: [NIL, NIL]
                };
                capacity
            ],
            meta: vec![
                Meta {
                    end: 0,
                    file: 0,
                    channel: FREE,
                    rights: 0,
                    height: 0
                };
                capacity
            ],
            free: (0..capacity as u32).rev().collect(),
            roots: vec![NIL; channels],
            merge,
            hand: 0,
            counters: TableCounters::default(),
        }
    }

    fn node(&self, i: u32) -> Node {
        let (k, m) = (self.keys[i as usize], self.meta[i as usize]);
        Node {
            start: k.start,
            end: m.end,
            file: m.file,
            channel: m.channel,
            left: k.child[0],
            right: k.child[1],
            rights: m.rights,
            height: m.height,
        }
    }

    fn set(&mut self, i: u32, n: Node) {
        self.keys[i as usize] = Key {
            start: n.start,
            child: [n.left, n.right],
        };
        self.meta[i as usize] = Meta {
            end: n.end,
            file: n.file,
            channel: n.channel,
            rights: n.rights,
            height: n.height,
        };
    }

    /// Capacity in records.
    pub fn capacity(&self) -> usize {
        self.keys.len()
    }

    /// Counters.
    pub fn counters(&self) -> TableCounters {
        self.counters
    }

    /// Checks that channel `channel` may perform an access needing `need` on `[addr, addr+len)`.
    /// `need == 0` asks only for coverage. The hot path: no allocation, no lock.
    #[inline]
    pub fn check(&self, channel: u32, addr: u64, len: u64, need: u8) -> Result<(), Status> {
        let Some(&root) = self.roots.get(channel as usize) else {
            return Err(Status::PermissionMiss);
        };
        let Some(end) = addr.checked_add(len) else {
            return Err(Status::OutOfRange);
        };
        let mut at = addr;
        let mut denied = false;
        loop {
            let n = self.floor(root, at);
            if n == NIL {
                return Err(Status::PermissionMiss);
            }
            let node = &self.meta[n as usize];
            if node.end <= at {
                return Err(Status::PermissionMiss);
            }
            denied |= node.rights & need != need;
            if node.end >= end {
                break;
            }
            at = node.end;
        }
        if denied {
            Err(Status::PermissionDenied)
        } else {
            Ok(())
        }
    }

    /// Installs a record for `channel` over `[start, start+len)`, replacing whatever that channel
    /// had there, and merging with adjacent records of the same file and rights.
    pub fn insert(
        &mut self,
        channel: u32,
        start: u64,
        len: u64,
        rights: u8,
        file: u64,
    ) -> Result<Evictions, TableError> {
        self.root_of(channel)?;
        let end = start.checked_add(len).ok_or(TableError::Invalid)?;
        if len == 0 || rights & !(READ | WRITE) != 0 {
            return Err(TableError::Invalid);
        }
        if self.keys.len() < 2 {
            return Err(TableError::NoRoom);
        }
        let mut ev = self.remove_range(channel, start, len)?;
        if self.merge {
            let root = self.roots[channel as usize];
            let pred = if start == 0 {
                NIL
            } else {
                self.floor(root, start - 1)
            };
            let pred =
                (pred != NIL && self.mergeable(pred, start, file, rights, true)).then_some(pred);
            let succ = self.floor(root, end);
            let succ =
                (succ != NIL && self.mergeable(succ, end, file, rights, false)).then_some(succ);
            match (pred, succ) {
                (Some(p), Some(s)) => {
                    let s_end = self.meta[s as usize].end;
                    let s_start = self.keys[s as usize].start;
                    self.delete(channel, s_start);
                    self.meta[p as usize].end = s_end;
                    // Three records became one.
                    self.counters.merges += 2;
                    return Ok(ev);
                }
                (Some(p), None) => {
                    // Extending a node's end keeps the tree's order: nothing else overlaps.
                    self.meta[p as usize].end = end;
                    self.counters.merges += 1;
                    return Ok(ev);
                }
                (None, Some(s)) => {
                    // Lowering a node's start down to the end of its predecessor's range keeps
                    // the tree's order for the same reason.
                    self.keys[s as usize].start = start;
                    self.counters.merges += 1;
                    return Ok(ev);
                }
                (None, None) => {}
            }
        }
        self.add(channel, start, end, rights, file, &mut ev);
        Ok(ev)
    }

    fn mergeable(&self, n: u32, at: u64, file: u64, rights: u8, is_pred: bool) -> bool {
        let node = self.node(n);
        let touches = if is_pred {
            node.end == at
        } else {
            node.start == at
        };
        touches && node.file == file && node.rights == rights
    }

    /// Removes `channel`'s coverage of `[start, start+len)`, splitting records that straddle its
    /// edges. Returns the evictions a split needed.
    pub fn remove_range(
        &mut self,
        channel: u32,
        start: u64,
        len: u64,
    ) -> Result<Evictions, TableError> {
        let root = self.root_of(channel)?;
        let end = start.checked_add(len).ok_or(TableError::Invalid)?;
        let mut ev = Evictions::default();
        if len == 0 {
            return Ok(ev);
        }
        let mut overlapping = Vec::new();
        let first = self.floor(root, start);
        let mut key = if first != NIL && self.meta[first as usize].end > start {
            self.keys[first as usize].start
        } else {
            start
        };
        loop {
            let n = self.ceil(self.roots[channel as usize], key);
            if n == NIL || self.keys[n as usize].start >= end {
                break;
            }
            let node = self.node(n);
            overlapping.push(node);
            key = node.start + 1;
        }
        for node in overlapping {
            self.delete(channel, node.start);
            if node.start < start {
                self.add(channel, node.start, start, node.rights, node.file, &mut ev);
            }
            if node.end > end {
                self.add(channel, end, node.end, node.rights, node.file, &mut ev);
            }
        }
        Ok(ev)
    }

    /// Removes all of `channel`'s records of `file`. Returns how many went.
    pub fn remove_file(&mut self, channel: u32, file: u64) -> Result<usize, TableError> {
        let root = self.root_of(channel)?;
        let mut keys = Vec::new();
        self.collect(root, &mut |n: &Node| {
            if n.file == file {
                keys.push(n.start)
            }
        });
        for &k in &keys {
            self.delete(channel, k);
        }
        Ok(keys.len())
    }

    /// Removes every record of `channel`. Returns how many went.
    pub fn remove_channel(&mut self, channel: u32) -> Result<usize, TableError> {
        let root = self.root_of(channel)?;
        let mut idx = Vec::new();
        self.collect_idx(root, &mut idx);
        for &i in &idx {
            self.release(i);
        }
        self.roots[channel as usize] = NIL;
        Ok(idx.len())
    }

    /// `channel`'s records in address order.
    pub fn records(&self, channel: u32) -> Vec<Record> {
        let mut out = Vec::new();
        if let Some(&root) = self.roots.get(channel as usize) {
            self.collect(root, &mut |n: &Node| {
                out.push(Record {
                    start: n.start,
                    end: n.end,
                    file: n.file,
                    rights: n.rights,
                })
            });
        }
        out
    }

    fn root_of(&self, channel: u32) -> Result<u32, TableError> {
        self.roots
            .get(channel as usize)
            .copied()
            .ok_or(TableError::NoSuchChannel(channel))
    }

    fn collect(&self, n: u32, f: &mut impl FnMut(&Node)) {
        if n == NIL {
            return;
        }
        let node = self.node(n);
        self.collect(node.left, f);
        f(&node);
        self.collect(node.right, f);
    }

    fn collect_idx(&self, n: u32, out: &mut Vec<u32>) {
        if n == NIL {
            return;
        }
        out.push(n);
        self.collect_idx(self.keys[n as usize].child[0], out);
        self.collect_idx(self.keys[n as usize].child[1], out);
    }

    /// The node with the greatest start `<= key`, or NIL.
    #[inline]
    fn floor(&self, mut n: u32, key: u64) -> u32 {
        let mut best = NIL;
        // Branches, not conditional moves: speculation runs ahead down the likely path and
        // hides the latency of the dependent loads better.
        while n != NIL {
            let k = &self.keys[n as usize];
            if k.start <= key {
                best = n;
                n = k.child[1];
            } else {
                n = k.child[0];
            }
        }
        best
    }

    /// The node with the smallest start `>= key`, or NIL.
    fn ceil(&self, mut n: u32, key: u64) -> u32 {
        let mut best = NIL;
        while n != NIL {
            let node = &self.keys[n as usize];
            if node.start >= key {
                best = n;
                n = node.child[0];
            } else {
                n = node.child[1];
            }
        }
        best
    }

    /// Allocates a node for a new record and links it into `channel`'s tree, evicting a record
    /// if the pool is full.
    fn add(
        &mut self,
        channel: u32,
        start: u64,
        end: u64,
        rights: u8,
        file: u64,
        ev: &mut Evictions,
    ) {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                let victim = self.evict_one();
                ev.channels.push(victim);
                self.free.pop().expect("eviction frees a node")
            }
        };
        self.set(
            idx,
            Node {
                start,
                end,
                file,
                channel,
                left: NIL,
                right: NIL,
                rights,
                height: 1,
            },
        );
        self.counters.used += 1;
        let root = self.roots[channel as usize];
        self.roots[channel as usize] = self.insert_node(root, idx);
    }

    /// Evicts the next record in clock order; returns its channel.
    fn evict_one(&mut self) -> u32 {
        let cap = self.keys.len();
        for _ in 0..cap {
            let i = self.hand;
            self.hand = (self.hand + 1) % cap;
            let node = self.node(i as u32);
            if node.channel != FREE {
                self.delete(node.channel, node.start);
                self.counters.evictions += 1;
                return node.channel;
            }
        }
        unreachable!("eviction from a table with no records in use")
    }

    fn release(&mut self, i: u32) {
        self.set(i, EMPTY);
        self.free.push(i);
        self.counters.used -= 1;
    }

    /// Unlinks and frees `channel`'s node with start `key`, if there is one.
    fn delete(&mut self, channel: u32, key: u64) {
        let root = self.roots[channel as usize];
        let (root, removed) = self.delete_node(root, key);
        self.roots[channel as usize] = root;
        if let Some(i) = removed {
            self.release(i);
        }
    }

    fn height(&self, n: u32) -> u8 {
        if n == NIL {
            0
        } else {
            self.meta[n as usize].height
        }
    }

    fn fix(&mut self, n: u32) {
        let h = 1 + self
            .height(self.keys[n as usize].child[0])
            .max(self.height(self.keys[n as usize].child[1]));
        self.meta[n as usize].height = h;
    }

    fn rotate_right(&mut self, n: u32) -> u32 {
        let l = self.keys[n as usize].child[0];
        self.keys[n as usize].child[0] = self.keys[l as usize].child[1];
        self.keys[l as usize].child[1] = n;
        self.fix(n);
        self.fix(l);
        l
    }

    fn rotate_left(&mut self, n: u32) -> u32 {
        let r = self.keys[n as usize].child[1];
        self.keys[n as usize].child[1] = self.keys[r as usize].child[0];
        self.keys[r as usize].child[0] = n;
        self.fix(n);
        self.fix(r);
        r
    }

    fn rebalance(&mut self, n: u32) -> u32 {
        self.fix(n);
        let (l, r) = (
            self.keys[n as usize].child[0],
            self.keys[n as usize].child[1],
        );
        let bal = i32::from(self.height(l)) - i32::from(self.height(r));
        if bal > 1 {
            let (ll, lr) = (
                self.keys[l as usize].child[0],
                self.keys[l as usize].child[1],
            );
            if self.height(ll) < self.height(lr) {
                self.keys[n as usize].child[0] = self.rotate_left(l);
            }
            return self.rotate_right(n);
        }
        if bal < -1 {
            let (rl, rr) = (
                self.keys[r as usize].child[0],
                self.keys[r as usize].child[1],
            );
            if self.height(rr) < self.height(rl) {
                self.keys[n as usize].child[1] = self.rotate_right(r);
            }
            return self.rotate_left(n);
        }
        n
    }

    fn insert_node(&mut self, root: u32, idx: u32) -> u32 {
        if root == NIL {
            return idx;
        }
        let key = self.keys[idx as usize].start;
        if key < self.keys[root as usize].start {
            let l = self.insert_node(self.keys[root as usize].child[0], idx);
            self.keys[root as usize].child[0] = l;
        } else {
            let r = self.insert_node(self.keys[root as usize].child[1], idx);
            self.keys[root as usize].child[1] = r;
        }
        self.rebalance(root)
    }

    /// Removes the node keyed `key` from the subtree; returns the new subtree root and the
    /// removed node's index.
    fn delete_node(&mut self, root: u32, key: u64) -> (u32, Option<u32>) {
        if root == NIL {
            return (NIL, None);
        }
        let node = self.node(root);
        let removed;
        if key < node.start {
            let (l, r) = self.delete_node(node.left, key);
            self.keys[root as usize].child[0] = l;
            removed = r;
        } else if key > node.start {
            let (r, rem) = self.delete_node(node.right, key);
            self.keys[root as usize].child[1] = r;
            removed = rem;
        } else {
            if node.left == NIL {
                return (node.right, Some(root));
            }
            if node.right == NIL {
                return (node.left, Some(root));
            }
            let (right, min) = self.remove_min(node.right);
            self.keys[min as usize].child[0] = node.left;
            self.keys[min as usize].child[1] = right;
            return (self.rebalance(min), Some(root));
        }
        (self.rebalance(root), removed)
    }

    fn remove_min(&mut self, root: u32) -> (u32, u32) {
        let left = self.keys[root as usize].child[0];
        if left == NIL {
            return (self.keys[root as usize].child[1], root);
        }
        let (l, min) = self.remove_min(left);
        self.keys[root as usize].child[0] = l;
        (self.rebalance(root), min)
    }

    /// Checks the AVL and pool invariants; for tests.
    #[doc(hidden)]
    pub fn validate(&self) {
        let mut seen = 0usize;
        for (c, &root) in self.roots.iter().enumerate() {
            let mut prev_end = None;
            self.validate_node(root, c as u32, &mut prev_end, &mut seen);
        }
        assert_eq!(seen as u64, self.counters.used);
        assert_eq!(seen + self.free.len(), self.keys.len());
    }

    fn validate_node(&self, n: u32, c: u32, prev_end: &mut Option<u64>, seen: &mut usize) -> u8 {
        if n == NIL {
            return 0;
        }
        let node = self.node(n);
        assert_eq!(node.channel, c);
        let hl = self.validate_node(node.left, c, prev_end, seen);
        assert!(node.start < node.end);
        if let Some(pe) = *prev_end {
            assert!(pe <= node.start, "overlap");
            if self.merge && pe == node.start {
                // Adjacent records may stay separate only when they differ.
            }
        }
        *prev_end = Some(node.end);
        *seen += 1;
        let hr = self.validate_node(node.right, c, prev_end, seen);
        assert!((i32::from(hl) - i32::from(hr)).abs() <= 1, "unbalanced");
        assert_eq!(node.height, 1 + hl.max(hr));
        node.height
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn check_covers_and_denies() {
        let mut t = PermissionTable::new(16, 4, true);
        t.insert(1, 100, 100, READ, 7).unwrap();
        t.insert(1, 200, 100, READ | WRITE, 7).unwrap();
        assert_eq!(t.check(1, 150, 100, READ), Ok(()));
        assert_eq!(t.check(1, 150, 100, WRITE), Err(Status::PermissionDenied));
        assert_eq!(t.check(1, 250, 50, WRITE), Ok(()));
        assert_eq!(t.check(1, 250, 51, WRITE), Err(Status::PermissionMiss));
        assert_eq!(t.check(1, 99, 2, READ), Err(Status::PermissionMiss));
        assert_eq!(t.check(2, 150, 1, READ), Err(Status::PermissionMiss));
        assert_eq!(t.check(99, 150, 1, READ), Err(Status::PermissionMiss));
        assert_eq!(t.check(1, u64::MAX, 2, READ), Err(Status::OutOfRange));
        t.validate();
    }

    #[test]
    fn merges_adjacent_records_of_one_file() {
        let mut t = PermissionTable::new(16, 2, true);
        t.insert(0, 0, 10, READ, 1).unwrap();
        t.insert(0, 20, 10, READ, 1).unwrap();
        t.insert(0, 10, 10, READ, 1).unwrap();
        assert_eq!(
            t.records(0),
            vec![Record {
                start: 0,
                end: 30,
                file: 1,
                rights: READ
            }]
        );
        assert_eq!(t.counters().merges, 2);
        t.insert(0, 30, 10, READ, 2).unwrap(); // other file: no merge
        t.insert(0, 40, 10, WRITE, 2).unwrap(); // other rights: no merge
        assert_eq!(t.records(0).len(), 3);
        let mut nm = PermissionTable::new(16, 2, false);
        nm.insert(0, 0, 10, READ, 1).unwrap();
        nm.insert(0, 10, 10, READ, 1).unwrap();
        assert_eq!(nm.records(0).len(), 2);
        t.validate();
        nm.validate();
    }

    #[test]
    fn revocation_splits_records() {
        let mut t = PermissionTable::new(16, 1, true);
        t.insert(0, 0, 100, READ | WRITE, 1).unwrap();
        t.remove_range(0, 40, 20).unwrap();
        assert_eq!(t.check(0, 0, 40, WRITE), Ok(()));
        assert_eq!(t.check(0, 39, 2, READ), Err(Status::PermissionMiss));
        assert_eq!(t.check(0, 60, 40, READ), Ok(()));
        assert_eq!(t.records(0).len(), 2);
        assert_eq!(t.remove_file(0, 1).unwrap(), 2);
        assert!(t.records(0).is_empty());
        t.validate();
    }

    #[test]
    fn eviction_when_full_gives_a_miss() {
        let mut t = PermissionTable::new(4, 2, true);
        for i in 0..4 {
            t.insert(0, i * 100, 10, READ, i).unwrap();
        }
        let ev = t.insert(1, 0, 10, READ, 9).unwrap();
        assert_eq!(ev.channels, vec![0]);
        assert_eq!(t.counters().evictions, 1);
        assert_eq!(t.check(1, 0, 10, READ), Ok(()));
        let misses = (0..4)
            .filter(|i| t.check(0, i * 100, 10, READ).is_err())
            .count();
        assert_eq!(misses, 1);
        t.validate();
    }

    #[test]
    fn channel_removal_frees_everything() {
        let mut t = PermissionTable::new(64, 3, false);
        for i in 0..30 {
            t.insert(2, i * 10, 5, READ, 0).unwrap();
        }
        assert_eq!(t.remove_channel(2).unwrap(), 30);
        assert_eq!(t.counters().used, 0);
        assert_eq!(
            t.insert(5, 0, 1, READ, 0),
            Err(TableError::NoSuchChannel(5))
        );
        assert_eq!(t.insert(0, 0, 0, READ, 0), Err(TableError::Invalid));
        assert_eq!(t.insert(0, 0, 1, 4, 0), Err(TableError::Invalid));
        t.validate();
    }

    /// The model: per channel, a map from byte to (file, rights) over a small address space.
    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32, u64, u64, u8, u64),
        Remove(u32, u64, u64),
        RemoveFile(u32, u64),
        RemoveChannel(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..3, 0u64..200, 1u64..40, 1u8..4, 0u64..3)
                .prop_map(|(c, s, l, r, f)| Op::Insert(c, s, l, r, f)),
            2 => (0u32..3, 0u64..200, 1u64..60).prop_map(|(c, s, l)| Op::Remove(c, s, l)),
            1 => (0u32..3, 0u64..3).prop_map(|(c, f)| Op::RemoveFile(c, f)),
            1 => (0u32..3).prop_map(Op::RemoveChannel),
        ]
    }

    proptest! {
        #[test]
        fn matches_model(ops in proptest::collection::vec(op(), 1..120), merge in any::<bool>()) {
            // Capacity large enough that nothing is evicted, so the model is exact.
            let mut t = PermissionTable::new(1024, 3, merge);
            let mut model = vec![vec![None::<(u64, u8)>; 260]; 3];
            for op in ops {
                match op {
                    Op::Insert(c, s, l, r, f) => {
                        t.insert(c, s, l, r, f).unwrap();
                        for b in s..s + l { model[c as usize][b as usize] = Some((f, r)); }
                    }
                    Op::Remove(c, s, l) => {
                        t.remove_range(c, s, l).unwrap();
                        for b in s..s + l { model[c as usize][b as usize] = None; }
                    }
                    Op::RemoveFile(c, f) => {
                        t.remove_file(c, f).unwrap();
                        for b in model[c as usize].iter_mut() {
                            if matches!(b, Some((ff, _)) if *ff == f) { *b = None; }
                        }
                    }
                    Op::RemoveChannel(c) => {
                        t.remove_channel(c).unwrap();
                        model[c as usize].iter_mut().for_each(|b| *b = None);
                    }
                }
                t.validate();
            }
            for c in 0..3u32 {
                for b in 0..260u64 {
                    let m = model[c as usize][b as usize];
                    for need in [0, READ, WRITE, READ | WRITE] {
                        let want = match m {
                            None => Err(Status::PermissionMiss),
                            Some((_, r)) if r & need == need => Ok(()),
                            Some(_) => Err(Status::PermissionDenied),
                        };
                        prop_assert_eq!(t.check(c, b, 1, need), want);
                    }
                }
                if merge {
                    // With merging, no two adjacent records share file and rights.
                    let recs = t.records(c);
                    for w in recs.windows(2) {
                        prop_assert!(!(w[0].end == w[1].start && w[0].file == w[1].file
                            && w[0].rights == w[1].rights));
                    }
                }
            }
        }

        #[test]
        fn evictions_never_break_the_tree(ops in proptest::collection::vec(op(), 1..200)) {
            let mut t = PermissionTable::new(8, 3, true);
            for op in ops {
                match op {
                    Op::Insert(c, s, l, r, f) => {
                        t.insert(c, s, l, r, f).unwrap();
                        // The record just installed is never the one evicted for it.
                        prop_assert!(t.check(c, s, l, 0).is_ok());
                    }
                    Op::Remove(c, s, l) => { t.remove_range(c, s, l).unwrap(); }
                    Op::RemoveFile(c, f) => { t.remove_file(c, f).unwrap(); }
                    Op::RemoveChannel(c) => { t.remove_channel(c).unwrap(); }
                }
                t.validate();
            }
        }
    }
}
