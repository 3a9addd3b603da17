//! Sole leases (docs/abi.md §3.10): a handle open for writing that is its file's only open in
//! the whole daemon (no other handle, no fork bundle, no hold) may be told so in a slot of
//! its channel, and its process may then return from a write once the command is rung,
//! collecting the completion later (a posted write). Nobody else can see the file's data
//! without opening it, so what matters is that every such write has reached the array
//! before anybody else could look:
//!
//! - another open of the file (any process, this one included) ends the lease and waits for
//!   the holder's rung commands before its answer goes out: the poller never waits, so an
//!   open through the channel of a file with a lease out is left to a file-call worker (or
//!   referred to the control socket when the workers are busy);
//! - an open that truncates, and a truncate by path, end it and wait before they truncate;
//! - a fork (whose child shares the handle) and a handover to another program image end the
//!   leases of the process and wait;
//! - a connection that ends (a killed client too) ends its leases and waits for what its
//!   channel rang before the channel goes, so a write that returned is carried out.
//!
//! A posted write whose record the table evicted does not fail: the device asks for the
//! file's records again (`Front::refill`) while the lease is out or draining, so the waits
//! above cover it.
//!
//! A close of the handle ends the lease without waiting: the client collects its writes
//! before it closes, and a hostile one can only lose its own. The wait is bounded
//! ([`RECALL_WAIT`]): a command written and never rung makes it last that long, so a client
//! can delay the opens of a file it holds open for writing, never stop them.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use moneta_abi::{SOLE_LEASE_SLOTS, SOLE_LEASE_WANTED};
use moneta_fs::idhash::IdHash;

use super::*;

/// One sole lease, by the inode it covers.
#[derive(Clone, Copy, Debug)]
struct Sole {
    session: u64,
    channel: u32,
    slot: usize,
    handle: u64,
}

/// The sole leases granted, kept with the lock table (whose open-file-description counts
/// they need).
#[derive(Default)]
pub(super) struct SoleLeases {
    by_ino: HashMap<u64, Sole, IdHash>,
    /// Each channel's slots in use, a bit per slot.
    used: HashMap<u32, u32, IdHash>,
    /// Leases ended whose holders' rung commands are still being waited for: (the channel,
    /// how many waits). Another call on the file waits for them too.
    draining: HashMap<u64, (u32, u32), IdHash>,
}

impl SoleLeases {
    /// Whether any lease is out or draining (calls that would end one check this first).
    pub(super) fn any(&self) -> bool {
        !self.by_ino.is_empty() || !self.draining.is_empty()
    }

    /// Whether a lease on `ino` is out, or ended with its holder's writes still waited for.
    pub(super) fn on(&self, ino: u64) -> bool {
        self.by_ino.contains_key(&ino) || self.draining.contains_key(&ino)
    }

    /// The inodes `channel` holds sole leases on, out or draining.
    pub(super) fn inos_of(&self, channel: u32) -> impl Iterator<Item = u64> + '_ {
        let out = self
            .by_ino
            .iter()
            .filter(move |(_, l)| l.channel == channel);
        let draining = self.draining.iter().filter(move |(_, d)| d.0 == channel);
        out.map(|(&ino, _)| ino)
            .chain(draining.map(|(&ino, _)| ino))
    }

    fn start_draining(&mut self, ino: u64, channel: u32) {
        let e = self.draining.entry(ino).or_insert((channel, 0));
        e.1 += 1;
    }

    fn done_draining(&mut self, ino: u64) {
        if let Some(e) = self.draining.get_mut(&ino) {
            e.1 -= 1;
            if e.1 == 0 {
                self.draining.remove(&ino);
            }
        }
    }

    fn forget(&mut self, ino: u64) -> Option<Sole> {
        let l = self.by_ino.remove(&ino)?;
        if let Some(bits) = self.used.get_mut(&l.channel) {
            *bits &= !(1 << l.slot);
            if *bits == 0 {
                self.used.remove(&l.channel);
            }
        }
        Some(l)
    }

    fn matching(&self, f: impl Fn(&Sole) -> bool) -> Vec<u64> {
        self.by_ino
            .iter()
            .filter(|(_, l)| f(l))
            .map(|(&ino, _)| ino)
            .collect()
    }
}

impl Manager {
    /// Grants `s` (through `channel`) a sole lease for handle `handle` (`h`), just opened,
    /// when it is open for writing and `sole`: the file system's count of the file's opens,
    /// read under its lock (which every open takes), is 1, and no pages of the file are
    /// mapped (a mapping outlives its descriptor, and stores through it wait for nothing).
    pub(super) fn try_grant_sole(
        &self,
        locks: &mut LockState,
        s: &Session,
        channel: u32,
        handle: u64,
        h: &Handle,
        sole: bool,
    ) {
        // Offered only where the header says so (not with data checksums), whatever the
        // channel's opt-in word says.
        if !h.write
            || !sole
            || self.device.fs_flags() & moneta_abi::FS_SOLE_LEASES == 0
            || locks.sole.on(h.ino)
            || locks.ofds.get(&h.ofd).copied().unwrap_or(0) != 1
        {
            return;
        }
        let Some(area) = self.device.lease_area(channel) else {
            return;
        };
        let sole = area.sole_area();
        if sole.wanted.load(Ordering::Acquire) != SOLE_LEASE_WANTED {
            return;
        }
        let bits = locks.sole.used.entry(channel).or_default();
        let slot = (!*bits).trailing_zeros() as usize;
        if slot >= SOLE_LEASE_SLOTS {
            return;
        }
        *bits |= 1 << slot;
        let sl = &sole.slots[slot];
        sl.generation.fetch_add(1, Ordering::SeqCst);
        sl.handle.store(handle, Ordering::SeqCst);
        sl.generation.fetch_add(1, Ordering::SeqCst);
        locks.sole.by_ino.insert(
            h.ino,
            Sole {
                session: s.id,
                channel,
                slot,
                handle,
            },
        );
    }

    /// Whether handle `handle` of `channel`'s connection holds the sole lease on `ino`.
    pub(super) fn holds_sole(&self, ino: u64, channel: Option<u32>, handle: u64) -> bool {
        let locks = self.locks();
        locks
            .sole
            .by_ino
            .get(&ino)
            .is_some_and(|l| Some(l.channel) == channel && l.handle == handle)
    }

    /// The file-system lock, taken once no sole lease is out on the file that an open of
    /// `path` with `flags` (or a truncate by path, with `O_TRUNC`) would truncate: the
    /// truncation must not overtake the writes its holder posted. The lease ends and its
    /// writes are waited for with no lock held; a lease granted again meanwhile (its holder
    /// closed the file and opened it again) is ended again, eight times at most: a process
    /// that keeps reopening the file as fast as that can only disorder its own writes.
    pub(super) fn open_truncating(
        &self,
        cred: &Cred,
        path: &[u8],
        flags: i32,
    ) -> MutexGuard<'_, Fs> {
        for _ in 0..8 {
            let fs = self.fs();
            if flags & libc::O_TRUNC == 0 || !self.locks().sole.any() {
                return fs;
            }
            let Ok(ino) = fs.lookup(cred, path, flags & libc::O_NOFOLLOW == 0) else {
                return fs;
            };
            if !self.locks().sole.on(ino) {
                return fs;
            }
            drop(fs);
            self.recall_sole(ino);
        }
        self.fs()
    }

    /// Ends the lease on `ino`, if there is one, in its slot: the client's next check finds
    /// a new generation. Returns the channel whose rung commands the caller waits for.
    fn end_sole(&self, locks: &mut LockState, ino: u64) -> Option<u32> {
        let l = locks.sole.forget(ino)?;
        if let Some(area) = self.device.lease_area(l.channel) {
            let sl = &area.sole_area().slots[l.slot];
            sl.generation.fetch_add(1, Ordering::SeqCst);
            sl.handle.store(0, Ordering::SeqCst);
            sl.generation.fetch_add(1, Ordering::SeqCst);
        }
        Some(l.channel)
    }

    /// Waits (with no lock held) until what `channel` rang has completed, for at most
    /// [`RECALL_WAIT`].
    fn wait_rung(&self, channel: u32) {
        if let Some(area) = self.device.lease_area(channel) {
            if !area.wait_rung(RECALL_WAIT) {
                tracing::debug!(channel, "a channel's rung commands did not all complete");
            }
        }
    }

    /// Ends the lease on `ino` and waits for the commands its holder rang, from a daemon
    /// thread (never the poller); if another call ended it and still waits, waits as well.
    /// Whether there was one.
    pub(super) fn recall_sole(&self, ino: u64) -> bool {
        let channel = {
            let mut locks = self.locks();
            if !locks.sole.any() {
                return false;
            }
            let c = self
                .end_sole(&mut locks, ino)
                .or_else(|| locks.sole.draining.get(&ino).map(|d| d.0));
            if let Some(c) = c {
                locks.sole.start_draining(ino, c);
            }
            c
        };
        match channel {
            Some(c) => {
                self.wait_rung(c);
                self.locks().sole.done_draining(ino);
                true
            }
            None => false,
        }
    }

    /// Ends the lease of handle `handle` of `channel` on `ino`, if it has one (the handle is
    /// closing: its client collected its writes first).
    pub(super) fn drop_sole(
        &self,
        locks: &mut LockState,
        channel: Option<u32>,
        handle: u64,
        ino: u64,
    ) {
        let mine = locks
            .sole
            .by_ino
            .get(&ino)
            .is_some_and(|l| Some(l.channel) == channel && l.handle == handle);
        if mine {
            self.end_sole(locks, ino);
        }
    }

    /// Ends every lease of session `session` and waits for what its channel rang (it forks,
    /// hands its files over, or ends).
    pub(super) fn recall_sole_session(&self, session: u64) {
        self.recall_sole_where(|l| l.session == session);
    }

    /// Ends the leases of `channel` whatever session holds them (its id is about to be given
    /// again) and waits for what it rang.
    pub(super) fn recall_sole_channel(&self, channel: u32) {
        self.recall_sole_where(|l| l.channel == channel);
        self.locks().sole.used.remove(&channel);
    }

    /// Ends the leases `which` picks and waits for what their channels rang; meanwhile
    /// every other call on those files waits too.
    fn recall_sole_where(&self, which: impl Fn(&Sole) -> bool) {
        let ended: Vec<(u64, u32)> = {
            let mut locks = self.locks();
            let inos = locks.sole.matching(which);
            let mut ended = Vec::new();
            for ino in inos {
                if let Some(c) = self.end_sole(&mut locks, ino) {
                    locks.sole.start_draining(ino, c);
                    ended.push((ino, c));
                }
            }
            ended
        };
        let mut channels: Vec<u32> = ended.iter().map(|e| e.1).collect();
        channels.sort_unstable();
        channels.dedup();
        for c in channels {
            self.wait_rung(c);
        }
        let mut locks = self.locks();
        for (ino, _) in ended {
            locks.sole.done_draining(ino);
        }
    }
}
