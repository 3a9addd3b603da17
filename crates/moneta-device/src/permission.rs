//! The permission table (Moneta-D §4.3).
//!
//! Extent records of all channels share one fixed pool of entries (16K by default). Each
//! channel's records are indexed by a balanced search tree keyed by start address, reached from
//! the root table; the tree is a B+ tree whose nodes hold up to [`FANOUT`] keys inline, so a
//! lookup among 16K records touches about five nodes instead of the fourteen levels of a binary
//! tree (the paper used a red-black tree; its hardware needed 96 ns on average, 180 ns at
//! worst). Records of one channel never overlap: installing a record first removes whatever
//! covered its range, so the rights on a byte are those of the latest install. Adjacent records
//! of the same channel, file and rights merge into one. When the pool is full a record is
//! evicted (clock order); its channel's next request to that range fails with a permission miss
//! and the client asks again.
//!
//! The table is owned by the device's poller thread: checks take no lock, and updates arrive
//! through the engine's ordered update buffer.

use moneta_abi::Status;

/// Index of "no node" and "no record".
const NIL: u32 = u32::MAX;
/// Channel value of a free record.
const FREE: u32 = u32::MAX;

/// Rights bit: read.
pub const READ: u8 = 1;
/// Rights bit: write.
pub const WRITE: u8 = 2;

/// Most keys in a tree node: eight starts fill one cache line.
pub const FANOUT: usize = 8;
// The branch-free search in `BNode::rank` is written for eight slots.
const _: () = assert!(FANOUT == 8);

#[derive(Clone, Copy, Debug)]
struct Rec {
    start: u64,
    end: u64,
    file: u64,
    channel: u32,
    rights: u8,
}

const EMPTY: Rec = Rec {
    start: 0,
    end: 0,
    file: 0,
    channel: FREE,
    rights: 0,
};

/// A node of a channel's tree. In a leaf, `keys[i]` is the start of record `ptrs[i]`; in an
/// internal node, `keys[i]` is the smallest start in child `ptrs[i]`. Keys are sorted; one spare
/// slot holds the overflow before a split.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct BNode {
    keys: [u64; FANOUT + 1],
    ptrs: [u32; FANOUT + 1],
    n: u8,
    leaf: bool,
}

const EMPTY_NODE: BNode = BNode {
    keys: [u64::MAX; FANOUT + 1],
    ptrs: [NIL; FANOUT + 1],
    n: 0,
    leaf: true,
};

impl BNode {
    /// How many keys are `<= key` (keys are sorted): the search step, without branches.
    #[inline]
    fn rank(&self, key: u64) -> usize {
        // Branch-free binary search over the eight slots (unused ones hold u64::MAX, so they
        // count only for key == u64::MAX: clamp).
        let k = &self.keys;
        let mut base = 0usize;
        base += if k[base + 4] <= key { 4 } else { 0 };
        base += if k[base + 2] <= key { 2 } else { 0 };
        base += if k[base + 1] <= key { 1 } else { 0 };
        let c = base + usize::from(k[base] <= key);
        c.min(self.n as usize)
    }

    fn insert_at(&mut self, i: usize, key: u64, ptr: u32) {
        let n = self.n as usize;
        self.keys.copy_within(i..n, i + 1);
        self.ptrs.copy_within(i..n, i + 1);
        self.keys[i] = key;
        self.ptrs[i] = ptr;
        self.n += 1;
    }

    fn remove_at(&mut self, i: usize) {
        let n = self.n as usize;
        self.keys.copy_within(i + 1..n, i);
        self.ptrs.copy_within(i + 1..n, i);
        self.n -= 1;
        self.keys[self.n as usize] = u64::MAX;
        self.ptrs[self.n as usize] = NIL;
    }
}

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
    /// Records saved by merging into neighbours.
    pub merges: u64,
    /// Records evicted.
    pub evictions: u64,
}

/// The permission table: a fixed pool of records and a root table of per-channel trees.
pub struct PermissionTable {
    recs: Vec<Rec>,
    free: Vec<u32>,
    /// Tree nodes; at most one leaf per record plus the internal nodes above them.
    nodes: Vec<BNode>,
    free_nodes: Vec<u32>,
    roots: Vec<u32>,
    merge: bool,
    hand: usize,
    counters: TableCounters,
    /// The user each channel belongs to, for shares (`NO_OWNER`: not held to one).
    owners: Vec<u32>,
    /// Records each user holds.
    held: std::collections::HashMap<u32, usize>,
    /// Most records one user may hold.
    share: usize,
}

/// Owner of a channel that is not held to a share.
const NO_OWNER: u32 = u32::MAX;

impl PermissionTable {
    /// A table of `capacity` records for channels `0..channels`, merging adjacent records when
    /// `merge` is set (Moneta-D's "Merge" against "NoMerge", Figure 4).
    pub fn new(capacity: usize, channels: usize, merge: bool) -> Self {
        assert!(capacity < NIL as usize && channels < FREE as usize);
        Self {
            recs: vec![EMPTY; capacity],
            free: (0..capacity as u32).rev().collect(),
            nodes: Vec::new(),
            free_nodes: Vec::new(),
            roots: vec![NIL; channels],
            merge,
            hand: 0,
            counters: TableCounters::default(),
            owners: vec![NO_OWNER; channels],
            held: std::collections::HashMap::new(),
            share: capacity,
        }
    }

    /// Holds each user to at most `records` records (at least 1): a user that would hold more
    /// gives up one of its own records (in clock order) for each new one, so one user's files
    /// cannot push every other user's records out of the table.
    pub fn set_share(&mut self, records: usize) {
        self.share = records.max(1);
    }

    /// Says which user `channel` belongs to (`None`: no share applies, as for the daemon's own
    /// user). Call it when the channel is opened, before its records are installed.
    pub fn set_owner(&mut self, channel: u32, owner: Option<u32>) {
        if let Some(o) = self.owners.get_mut(channel as usize) {
            *o = owner.unwrap_or(NO_OWNER);
        }
    }

    /// Records `owner` holds now.
    pub fn held_by(&self, owner: u32) -> usize {
        self.held.get(&owner).copied().unwrap_or(0)
    }

    fn owner_of(&self, channel: u32) -> u32 {
        self.owners
            .get(channel as usize)
            .copied()
            .unwrap_or(NO_OWNER)
    }

    /// Capacity in records.
    pub fn capacity(&self) -> usize {
        self.recs.len()
    }

    /// Counters.
    pub fn counters(&self) -> TableCounters {
        self.counters
    }

    /// Checks that channel `channel` may perform an access needing `need` on `[addr, addr+len)`.
    /// `need == 0` asks only for coverage. The hot path: no allocation, no lock.
    #[inline]
    pub fn check(&self, channel: u32, addr: u64, len: u64, need: u8) -> Result<(), Status> {
        self.check_file(channel, addr, len, need, 0)
    }

    /// [`PermissionTable::check`] that also asks, when `file` is not 0, that every record
    /// covering the range carries that file tag; one that does not counts as missing.
    #[inline]
    pub fn check_file(
        &self,
        channel: u32,
        addr: u64,
        len: u64,
        need: u8,
        file: u64,
    ) -> Result<(), Status> {
        let Some(&root) = self.roots.get(channel as usize) else {
            return Err(Status::PermissionMiss);
        };
        let Some(end) = addr.checked_add(len) else {
            return Err(Status::OutOfRange);
        };
        let mut at = addr;
        let mut denied = false;
        loop {
            let r = self.floor(root, at);
            if r == NIL {
                return Err(Status::PermissionMiss);
            }
            let rec = &self.recs[r as usize];
            if rec.end <= at || (file != 0 && rec.file != file) {
                return Err(Status::PermissionMiss);
            }
            denied |= rec.rights & need != need;
            if rec.end >= end {
                break;
            }
            at = rec.end;
        }
        if denied {
            Err(Status::PermissionDenied)
        } else {
            Ok(())
        }
    }

    /// How far the extent around byte `at` reaches for channel `channel`: the end of the
    /// record covering `at` and of the records contiguous with it that carry the same file tag
    /// (`file`, or the first record's when 0) and the rights `need` (at most 64 records are
    /// followed). `at` itself when no such record covers it. What the DRAM buffer of the
    /// array's model may read ahead: never past the space this channel may read of the file.
    pub fn reach(&self, channel: u32, at: u64, need: u8, file: u64) -> u64 {
        let Some(&root) = self.roots.get(channel as usize) else {
            return at;
        };
        let mut end = at;
        let mut file = file;
        for _ in 0..64 {
            let r = self.floor(root, end);
            if r == NIL {
                break;
            }
            let rec = &self.recs[r as usize];
            if rec.end <= end || rec.rights & need != need || (file != 0 && rec.file != file) {
                break;
            }
            file = rec.file;
            end = rec.end;
        }
        end
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
        if self.recs.len() < 2 {
            return Err(TableError::NoRoom);
        }
        let mut ev = self.remove_range(channel, start, len)?;
        let (mut start, mut end) = (start, end);
        if self.merge {
            let root = self.roots[channel as usize];
            let pred = if start == 0 {
                NIL
            } else {
                self.floor(root, start - 1)
            };
            if pred != NIL && self.mergeable(pred, start, file, rights, true) {
                start = self.recs[pred as usize].start;
                self.delete(channel, start);
                self.counters.merges += 1;
            }
            let root = self.roots[channel as usize];
            let succ = self.floor(root, end);
            if succ != NIL && self.mergeable(succ, end, file, rights, false) {
                let s = self.recs[succ as usize];
                end = s.end;
                self.delete(channel, s.start);
                self.counters.merges += 1;
            }
        }
        // Any record deleted above freed its entry, so a merge never needs an eviction.
        self.add(channel, start, end, rights, file, &mut ev);
        Ok(ev)
    }

    fn mergeable(&self, r: u32, at: u64, file: u64, rights: u8, is_pred: bool) -> bool {
        let rec = &self.recs[r as usize];
        let touches = if is_pred {
            rec.end == at
        } else {
            rec.start == at
        };
        touches && rec.file == file && rec.rights == rights
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
        if first != NIL && self.recs[first as usize].end > start {
            overlapping.push(self.recs[first as usize]);
        }
        let mut idx = Vec::new();
        self.collect_range(root, start, end, &mut idx);
        overlapping.extend(
            idx.into_iter()
                .map(|i| self.recs[i as usize])
                .filter(|r| r.start != first_start(first, &self.recs)),
        );
        for rec in overlapping {
            self.delete(channel, rec.start);
            if rec.start < start {
                self.add(channel, rec.start, start, rec.rights, rec.file, &mut ev);
            }
            if rec.end > end {
                self.add(channel, end, rec.end, rec.rights, rec.file, &mut ev);
            }
        }
        Ok(ev)
    }

    /// Removes all of `channel`'s records of `file`. Returns how many went.
    pub fn remove_file(&mut self, channel: u32, file: u64) -> Result<usize, TableError> {
        let root = self.root_of(channel)?;
        let mut idx = Vec::new();
        self.collect_range(root, 0, u64::MAX, &mut idx);
        let starts: Vec<u64> = idx
            .iter()
            .map(|&i| self.recs[i as usize])
            .filter(|r| r.file == file)
            .map(|r| r.start)
            .collect();
        for &k in &starts {
            self.delete(channel, k);
        }
        Ok(starts.len())
    }

    /// Removes every record of `channel`. Returns how many went.
    pub fn remove_channel(&mut self, channel: u32) -> Result<usize, TableError> {
        let root = self.root_of(channel)?;
        let mut idx = Vec::new();
        self.collect_range(root, 0, u64::MAX, &mut idx);
        for &i in &idx {
            self.release(i);
        }
        self.free_subtree(root);
        self.roots[channel as usize] = NIL;
        Ok(idx.len())
    }

    /// `channel`'s records in address order.
    pub fn records(&self, channel: u32) -> Vec<Record> {
        let mut idx = Vec::new();
        if let Some(&root) = self.roots.get(channel as usize) {
            self.collect_range(root, 0, u64::MAX, &mut idx);
        }
        idx.into_iter()
            .map(|i| {
                let r = self.recs[i as usize];
                Record {
                    start: r.start,
                    end: r.end,
                    file: r.file,
                    rights: r.rights,
                }
            })
            .collect()
    }

    fn root_of(&self, channel: u32) -> Result<u32, TableError> {
        self.roots
            .get(channel as usize)
            .copied()
            .ok_or(TableError::NoSuchChannel(channel))
    }

    /// The record with the greatest start `<= key` in the tree under `n`, or NIL.
    #[inline]
    fn floor(&self, mut n: u32, key: u64) -> u32 {
        while n != NIL {
            let node = &self.nodes[n as usize];
            let c = node.rank(key);
            if c == 0 {
                // Every start in this subtree is above the key.
                return NIL;
            }
            if node.leaf {
                return node.ptrs[c - 1];
            }
            n = node.ptrs[c - 1];
        }
        NIL
    }

    /// Appends, in order, the records under `n` whose start lies in `[lo, hi)`.
    fn collect_range(&self, n: u32, lo: u64, hi: u64, out: &mut Vec<u32>) {
        if n == NIL {
            return;
        }
        let node = self.nodes[n as usize];
        let cnt = node.n as usize;
        for i in 0..cnt {
            if node.leaf {
                if node.keys[i] >= lo && node.keys[i] < hi {
                    out.push(node.ptrs[i]);
                }
            } else {
                // Child i holds starts in [keys[i], keys[i+1]).
                let next = if i + 1 < cnt {
                    node.keys[i + 1]
                } else {
                    u64::MAX
                };
                let child_may_hold = node.keys[i] < hi && (next > lo || i + 1 == cnt);
                if child_may_hold {
                    self.collect_range(node.ptrs[i], lo, hi, out);
                }
            }
        }
    }

    fn new_node(&mut self, leaf: bool) -> u32 {
        let mut node = EMPTY_NODE;
        node.leaf = leaf;
        match self.free_nodes.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn free_subtree(&mut self, n: u32) {
        if n == NIL {
            return;
        }
        let node = self.nodes[n as usize];
        if !node.leaf {
            for i in 0..node.n as usize {
                self.free_subtree(node.ptrs[i]);
            }
        }
        self.free_node(n);
    }

    fn free_node(&mut self, n: u32) {
        self.nodes[n as usize] = EMPTY_NODE;
        self.free_nodes.push(n);
    }

    /// Takes a record entry for a new record and links it into `channel`'s tree, evicting a
    /// record if the pool is full.
    fn add(
        &mut self,
        channel: u32,
        start: u64,
        end: u64,
        rights: u8,
        file: u64,
        ev: &mut Evictions,
    ) {
        let owner = self.owner_of(channel);
        if owner != NO_OWNER && self.held_by(owner) >= self.share {
            // At its share: the user's own oldest record makes room.
            if let Some(victim) = self.evict_own(owner) {
                ev.channels.push(victim);
            }
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                let victim = self.evict_one();
                ev.channels.push(victim);
                self.free.pop().expect("eviction frees an entry")
            }
        };
        self.recs[idx as usize] = Rec {
            start,
            end,
            file,
            channel,
            rights,
        };
        self.counters.used += 1;
        if owner != NO_OWNER {
            *self.held.entry(owner).or_default() += 1;
        }
        let root = self.roots[channel as usize];
        let root = if root == NIL {
            self.new_node(true)
        } else {
            root
        };
        self.roots[channel as usize] = root;
        if let Some((key, right)) = self.insert_node(root, start, idx) {
            let new_root = self.new_node(false);
            let left_min = self.nodes[root as usize].keys[0];
            let r = &mut self.nodes[new_root as usize];
            r.insert_at(0, left_min, root);
            r.insert_at(1, key, right);
            self.roots[channel as usize] = new_root;
        }
    }

    /// Inserts `key -> rec` under node `n`; returns the smallest key and index of a new right
    /// sibling when `n` split.
    fn insert_node(&mut self, n: u32, key: u64, rec: u32) -> Option<(u64, u32)> {
        let node = self.nodes[n as usize];
        if node.leaf {
            let pos = node.rank(key);
            self.nodes[n as usize].insert_at(pos, key, rec);
        } else {
            let i = node.rank(key).max(1) - 1;
            let split = self.insert_node(node.ptrs[i], key, rec);
            let child_min = self.nodes[node.ptrs[i] as usize].keys[0];
            self.nodes[n as usize].keys[i] = child_min;
            if let Some((k, right)) = split {
                self.nodes[n as usize].insert_at(i + 1, k, right);
            }
        }
        if (self.nodes[n as usize].n as usize) <= FANOUT {
            return None;
        }
        // Split: the upper half moves to a new sibling.
        let leaf = self.nodes[n as usize].leaf;
        let right = self.new_node(leaf);
        // Records are often installed in address order: when the new key went to the end,
        // leave this node full and start the sibling with it alone, so appends pack nodes.
        let appended = self.nodes[n as usize].keys[FANOUT] == key;
        let half = if appended { FANOUT } else { FANOUT.div_ceil(2) };
        let full = self.nodes[n as usize];
        for (j, i) in (half..=FANOUT).enumerate() {
            self.nodes[right as usize].keys[j] = full.keys[i];
            self.nodes[right as usize].ptrs[j] = full.ptrs[i];
        }
        self.nodes[right as usize].n = (FANOUT + 1 - half) as u8;
        let left = &mut self.nodes[n as usize];
        for i in half..=FANOUT {
            left.keys[i] = u64::MAX;
            left.ptrs[i] = NIL;
        }
        left.n = half as u8;
        Some((self.nodes[right as usize].keys[0], right))
    }

    /// Evicts the next record of `owner`'s channels in clock order; returns its channel.
    fn evict_own(&mut self, owner: u32) -> Option<u32> {
        let cap = self.recs.len();
        for _ in 0..cap {
            let i = self.hand;
            self.hand = (self.hand + 1) % cap;
            let rec = self.recs[i];
            if rec.channel != FREE && self.owner_of(rec.channel) == owner {
                self.delete(rec.channel, rec.start);
                self.counters.evictions += 1;
                return Some(rec.channel);
            }
        }
        None
    }

    /// Evicts the next record in clock order; returns its channel.
    fn evict_one(&mut self) -> u32 {
        let cap = self.recs.len();
        for _ in 0..cap {
            let i = self.hand;
            self.hand = (self.hand + 1) % cap;
            let rec = self.recs[i];
            if rec.channel != FREE {
                self.delete(rec.channel, rec.start);
                self.counters.evictions += 1;
                return rec.channel;
            }
        }
        unreachable!("eviction from a table with no records in use")
    }

    fn release(&mut self, i: u32) {
        let owner = self.owner_of(self.recs[i as usize].channel);
        if owner != NO_OWNER {
            if let Some(h) = self.held.get_mut(&owner) {
                *h -= 1;
                if *h == 0 {
                    self.held.remove(&owner);
                }
            }
        }
        self.recs[i as usize] = EMPTY;
        self.free.push(i);
        self.counters.used -= 1;
    }

    /// Unlinks and frees `channel`'s record with start `key`, if there is one.
    fn delete(&mut self, channel: u32, key: u64) {
        let root = self.roots[channel as usize];
        if root == NIL {
            return;
        }
        if let Some(rec) = self.delete_node(root, key) {
            self.release(rec);
        }
        // Shrink the root: an empty root goes, an internal root with one child hands over.
        loop {
            let root = self.roots[channel as usize];
            let node = self.nodes[root as usize];
            if node.n == 0 {
                self.free_node(root);
                self.roots[channel as usize] = NIL;
                break;
            }
            if node.leaf || node.n > 1 {
                break;
            }
            self.roots[channel as usize] = node.ptrs[0];
            self.free_node(root);
        }
    }

    /// Removes `key` from the subtree under `n`; returns the record it named. Nodes left empty
    /// are freed by their parent; all leaves stay at the same depth.
    fn delete_node(&mut self, n: u32, key: u64) -> Option<u32> {
        let node = self.nodes[n as usize];
        let c = node.rank(key);
        if c == 0 {
            return None;
        }
        let i = c - 1;
        if node.leaf {
            if node.keys[i] != key {
                return None;
            }
            self.nodes[n as usize].remove_at(i);
            return Some(node.ptrs[i]);
        }
        let child = node.ptrs[i];
        let rec = self.delete_node(child, key)?;
        let cn = self.nodes[child as usize];
        if cn.n == 0 {
            self.free_node(child);
            self.nodes[n as usize].remove_at(i);
        } else {
            self.nodes[n as usize].keys[i] = cn.keys[0];
        }
        Some(rec)
    }

    /// Checks the tree and pool invariants; for tests.
    #[doc(hidden)]
    pub fn validate(&self) {
        let mut seen = 0usize;
        let mut nodes = 0usize;
        for (c, &root) in self.roots.iter().enumerate() {
            if root == NIL {
                continue;
            }
            let mut prev_end = None;
            let mut leaf_depth = None;
            self.validate_node(
                root,
                c as u32,
                0,
                &mut leaf_depth,
                &mut prev_end,
                &mut seen,
                &mut nodes,
            );
        }
        assert_eq!(seen as u64, self.counters.used);
        assert_eq!(seen + self.free.len(), self.recs.len());
        assert_eq!(nodes + self.free_nodes.len(), self.nodes.len());
        let mut held = std::collections::HashMap::<u32, usize>::new();
        for r in self.recs.iter().filter(|r| r.channel != FREE) {
            let o = self.owner_of(r.channel);
            if o != NO_OWNER {
                *held.entry(o).or_default() += 1;
            }
        }
        assert_eq!(held, self.held, "records held per user");
        assert!(
            self.held.values().all(|&h| h <= self.share),
            "a user over its share"
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn validate_node(
        &self,
        n: u32,
        c: u32,
        depth: usize,
        leaf_depth: &mut Option<usize>,
        prev_end: &mut Option<u64>,
        seen: &mut usize,
        nodes: &mut usize,
    ) -> u64 {
        let node = self.nodes[n as usize];
        *nodes += 1;
        assert!(
            node.n >= 1 && node.n as usize <= FANOUT,
            "node size {}",
            node.n
        );
        for i in 1..node.n as usize {
            assert!(node.keys[i - 1] < node.keys[i], "keys out of order");
        }
        if node.leaf {
            assert_eq!(
                *leaf_depth.get_or_insert(depth),
                depth,
                "leaves at different depths"
            );
            for i in 0..node.n as usize {
                let r = self.recs[node.ptrs[i] as usize];
                assert_eq!(r.channel, c);
                assert_eq!(r.start, node.keys[i]);
                assert!(r.start < r.end);
                if let Some(pe) = *prev_end {
                    assert!(pe <= r.start, "overlap");
                }
                *prev_end = Some(r.end);
                *seen += 1;
            }
        } else {
            for i in 0..node.n as usize {
                let min = self.validate_node(
                    node.ptrs[i],
                    c,
                    depth + 1,
                    leaf_depth,
                    prev_end,
                    seen,
                    nodes,
                );
                assert_eq!(
                    min, node.keys[i],
                    "separator is not the child's smallest key"
                );
            }
        }
        node.keys[0]
    }
}

fn first_start(first: u32, recs: &[Rec]) -> u64 {
    if first == NIL {
        u64::MAX
    } else {
        recs[first as usize].start
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_user_holds_at_most_its_share() {
        let mut t = PermissionTable::new(16, 4, false);
        t.set_share(6);
        t.set_owner(0, Some(1000));
        t.set_owner(1, Some(1001));
        t.set_owner(2, None);
        // The other user and the unlimited channel have records first.
        for i in 0..4u64 {
            t.insert(1, i * 100, 10, READ, 1).unwrap();
            t.insert(2, i * 100, 10, READ, 1).unwrap();
        }
        // User 1000 installs 20 records: it keeps 6, giving up its own oldest each time.
        let mut evicted_others = 0;
        for i in 0..20u64 {
            let ev = t.insert(0, i * 100, 10, READ, 1).unwrap();
            evicted_others += ev.channels.iter().filter(|&&c| c != 0).count();
            t.validate();
        }
        assert_eq!(t.held_by(1000), 6);
        assert_eq!(evicted_others, 0, "no other user's records went");
        assert_eq!(t.records(1).len(), 4);
        assert_eq!(t.records(2).len(), 4);
        // Its latest records are the ones kept.
        assert!(t.check(0, 1900, 10, READ).is_ok());
        assert_eq!(t.check(0, 0, 10, READ), Err(Status::PermissionMiss));
        // Freed records count down; a reused channel id takes its new owner.
        t.remove_channel(0).unwrap();
        assert_eq!(t.held_by(1000), 0);
        t.set_owner(0, Some(1002));
        t.insert(0, 0, 10, READ, 1).unwrap();
        assert_eq!((t.held_by(1000), t.held_by(1002)), (0, 1));
        t.validate();
    }

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
        // With a file tag, only records of that file count.
        assert_eq!(t.check_file(1, 150, 100, READ, 7), Ok(()));
        assert_eq!(
            t.check_file(1, 150, 100, READ, 8),
            Err(Status::PermissionMiss)
        );
        t.insert(1, 300, 10, READ, 8).unwrap();
        assert_eq!(
            t.check_file(1, 250, 60, READ, 7),
            Err(Status::PermissionMiss)
        );
        assert_eq!(t.check_file(1, 250, 60, READ, 0), Ok(()));
        t.validate();
    }

    #[test]
    fn reach_follows_contiguous_readable_records_of_one_file() {
        // Without merging, so that the extent is several records.
        let mut t = PermissionTable::new(16, 2, false);
        t.insert(0, 0, 100, READ, 7).unwrap();
        t.insert(0, 100, 100, READ | WRITE, 7).unwrap();
        t.insert(0, 200, 100, READ, 8).unwrap();
        t.insert(0, 400, 100, WRITE, 7).unwrap();
        assert_eq!(t.reach(0, 50, READ, 7), 200);
        assert_eq!(t.reach(0, 50, READ, 0), 200);
        // Another file's record ends it; so does a gap, or a record without the right.
        assert_eq!(t.reach(0, 250, READ, 0), 300);
        assert_eq!(t.reach(0, 250, READ, 7), 250);
        assert_eq!(t.reach(0, 350, READ, 0), 350);
        assert_eq!(t.reach(0, 450, READ, 7), 450);
        // Another channel's records are not this one's.
        assert_eq!(t.reach(1, 50, READ, 0), 50);
        assert_eq!(t.reach(9, 50, READ, 0), 50);
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

    #[test]
    fn large_trees_stay_balanced_through_inserts_and_removals() {
        use rand::{seq::SliceRandom, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut t = PermissionTable::new(20_000, 2, false);
        let mut order: Vec<u64> = (0..16_384).collect();
        order.shuffle(&mut rng);
        for &i in &order {
            t.insert(1, i * 100, 50, READ, i).unwrap();
        }
        t.validate();
        assert_eq!(t.counters().used, 16_384);
        for &i in &order {
            assert_eq!(t.check(1, i * 100 + 10, 40, READ), Ok(()));
            assert_eq!(t.check(1, i * 100 + 50, 1, 0), Err(Status::PermissionMiss));
        }
        order.shuffle(&mut rng);
        for &i in &order[..12_000] {
            t.remove_range(1, i * 100, 50).unwrap();
        }
        t.validate();
        for &i in &order[12_000..] {
            assert_eq!(t.check(1, i * 100, 50, READ), Ok(()));
        }
        for &i in &order[..12_000] {
            assert!(t.check(1, i * 100, 1, 0).is_err());
        }
        assert_eq!(t.remove_channel(1).unwrap(), 16_384 - 12_000);
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
