//! Lock leases (docs/abi.md §3.8): the POSIX record locks of a file that one process alone
//! has open, through one handle, kept in that process's channel instead of the lock table.
//!
//! A lease is granted after a POSIX lock call through the channel succeeds, when nobody else
//! can be affected by the locks: the file is open once in the whole daemon (no other handle,
//! no fork bundle, no hold), the table holds no lock of another owner on it (nor an OFD or
//! `flock` lock of the handle's own open file description), the process's locks on it fit
//! half a lease list, and the channel asked for leases and has a slot free. The process then
//! sets, removes and tests its locks in its own memory: with no other owner, a set always
//! succeeds and a test never finds a conflict, so the table would have answered the same.
//!
//! Everything that could make another owner see the file's locks recalls the lease first and
//! puts its list back in the table as the process's: another open of the file (any process,
//! this one included), a fork (whose child shares the handle), and any lock call the daemon
//! answers itself on the file. A close of the handle drops the lease with its locks, as the
//! close drops the process's locks anyway; so does the end of the connection. A channel that
//! closes while its connection lives gives its leases back first.
//!
//! The poller never waits for a client: when a recall finds the client changing its list it
//! marks the slot and refers the call to the control socket, whose thread waits up to
//! [`RECALL_WAIT`] (sleeping, with no lock held) and then seizes the list that was current.
//! A seized slot is never granted again on that channel, so a client thread that stalled
//! inside a change cannot write into a later lease. What a client writes in its list can only
//! place or remove its own process's locks, which it could ask for anyway: entries that are
//! not locks are skipped, and the table's limits apply as to any set.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use moneta_abi::{
    lease_parts, lease_word, LeaseSlot, LEASE_BUSY, LEASE_ENTRIES, LEASE_GONE, LEASE_HELD,
    LEASE_READ, LEASE_RECALL, LEASE_SEIZED, LEASE_SLOTS, LEASE_WANTED, LEASE_WRITE,
};

use super::*;

/// How long a recall waits for a client that is changing its lock list before it takes the
/// list that was current before the change.
pub const RECALL_WAIT: Duration = Duration::from_millis(100);

/// Moves a slot's word from `w` to the same list with state `code`; whether it was still `w`.
fn swap_code(slot: &LeaseSlot, w: u32, code: u32) -> bool {
    let (_, list, len) = lease_parts(w);
    slot.state
        .compare_exchange(
            w,
            lease_word(code, list as u32, len as u32),
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_ok()
}

/// Looks at a slot's word a recall makes at most before it counts the client as stalled.
const RECALL_TRIES: usize = 16;

/// One lease, by the inode it covers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Lease {
    session: u64,
    pid: i32,
    channel: u32,
    slot: usize,
    /// What the handle was opened for: a read lock needs reading, a write lock writing.
    read: bool,
    write: bool,
}

/// What a channel's lease slot is used for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum SlotUse {
    #[default]
    Free,
    Leased(u64),
    /// Seized from a client that stalled in a change: never granted again.
    Quarantined,
}

/// The leases granted, kept with the lock table.
#[derive(Default)]
pub(super) struct Leases {
    by_ino: HashMap<u64, Lease>,
    slots: HashMap<u32, [SlotUse; LEASE_SLOTS]>,
    generation: u64,
}

impl Leases {
    /// Whether any lease is out (calls that would recall one check this first).
    pub(super) fn any(&self) -> bool {
        !self.by_ino.is_empty()
    }

    /// The inodes whose leases session `session` holds.
    pub(super) fn of_session(&self, session: u64) -> Vec<u64> {
        self.by_ino
            .iter()
            .filter(|(_, l)| l.session == session)
            .map(|(&ino, _)| ino)
            .collect()
    }

    /// The lease on `ino`, if any.
    pub(super) fn on(&self, ino: u64) -> bool {
        self.by_ino.contains_key(&ino)
    }

    fn forget(&mut self, ino: u64) -> Option<Lease> {
        let l = self.by_ino.remove(&ino)?;
        if let Some(slots) = self.slots.get_mut(&l.channel) {
            if slots[l.slot] == SlotUse::Leased(ino) {
                slots[l.slot] = SlotUse::Free;
            }
            if slots.iter().all(|u| *u == SlotUse::Free) {
                self.slots.remove(&l.channel);
            }
        }
        Some(l)
    }
}

impl Manager {
    /// Grants `s` (through `channel`) a lease on the file of handle `handle` (`h`) if nobody
    /// else can be affected (see the module's text). `open_count` is the file system's count
    /// of opens of the file, read under its lock, which every open takes.
    pub(super) fn try_grant(
        &self,
        locks: &mut LockState,
        s: &Session,
        channel: u32,
        handle: u64,
        h: &Handle,
        open_count: u32,
    ) {
        if open_count != 1
            || locks.leases.on(h.ino)
            || locks.ofds.get(&h.ofd).copied().unwrap_or(0) != 1
        {
            return;
        }
        let Some(area) = self.device.lease_area(channel) else {
            return;
        };
        let area_ref = area.area();
        if area_ref.wanted.load(Ordering::Acquire) != LEASE_WANTED {
            return;
        }
        let me = Owner::Session(s.id);
        let records = locks.table.records(h.ino);
        if records.iter().any(|r| r.owner != me)
            || !locks.table.flocks(h.ino).is_empty()
            || records.len() > LEASE_ENTRIES / 2
        {
            return;
        }
        let uses = locks.leases.slots.entry(channel).or_default();
        let Some(slot) = uses.iter().position(|u| *u == SlotUse::Free) else {
            return;
        };
        uses[slot] = SlotUse::Leased(h.ino);
        locks.table.release(h.ino, me);
        locks.leases.generation += 1;
        let sl = &area_ref.slots[slot];
        sl.handle.store(handle, Ordering::Relaxed);
        sl.generation
            .store(locks.leases.generation, Ordering::Relaxed);
        for (e, r) in sl.lists[0].iter().zip(&records) {
            e.start.store(r.range.start, Ordering::Relaxed);
            e.end.store(r.range.end, Ordering::Relaxed);
            e.mode.store(
                match r.mode {
                    Mode::Read => LEASE_READ,
                    Mode::Write => LEASE_WRITE,
                },
                Ordering::Relaxed,
            );
        }
        sl.state.store(
            lease_word(LEASE_HELD, 0, records.len() as u32),
            Ordering::Release,
        );
        locks.leases.by_ino.insert(
            h.ino,
            Lease {
                session: s.id,
                pid: s.pid,
                channel,
                slot,
                read: h.read,
                write: h.write,
            },
        );
    }

    /// Takes back the lease on `ino`, if there is one, and places its locks in the table.
    /// `false` when the client is changing its list and `seize` is not set: the slot is then
    /// marked so that the client gives the lease back as soon as its change is done, and the
    /// caller tries again later (or refers its call). With `seize`, takes the list that was
    /// current before the change.
    pub(super) fn recall(&self, locks: &mut LockState, ino: u64, seize: bool) -> bool {
        let Some(&lease) = locks.leases.by_ino.get(&ino) else {
            return true;
        };
        let Some(area) = self.device.lease_area(lease.channel) else {
            // The channel is gone, and its memory with it: its locks went with its process.
            locks.leases.forget(ino);
            return true;
        };
        let slot = &area.area().slots[lease.slot];
        let mut tries = 0;
        let taken = loop {
            let w = slot.state.load(Ordering::Acquire);
            tries += 1;
            if tries > RECALL_TRIES {
                // A client that keeps changing the word under the device's hand: as one that
                // stalled in a change.
                if !seize {
                    return false;
                }
                let (_, list, len) = lease_parts(w);
                slot.state.store(
                    lease_word(LEASE_SEIZED, list as u32, len as u32),
                    Ordering::Release,
                );
                break (list, len, true);
            }
            let (code, list, len) = lease_parts(w);
            match code {
                LEASE_HELD if swap_code(slot, w, LEASE_GONE) => break (list, len, false),
                LEASE_BUSY => {
                    // Either the client finishes first (and the next look sees it) or it
                    // finds the recall when it finishes.
                    swap_code(slot, w, LEASE_RECALL);
                }
                LEASE_RECALL if !seize => return false,
                LEASE_RECALL if swap_code(slot, w, LEASE_SEIZED) => break (list, len, true),
                // The word moved under the swap: look again.
                LEASE_HELD | LEASE_RECALL => {}
                // Given back (or written by the client as if it were): the list it names.
                _ => {
                    slot.state.store(
                        lease_word(LEASE_GONE, list as u32, len as u32),
                        Ordering::Release,
                    );
                    break (list, len, false);
                }
            }
        };
        let (list, len, seized) = taken;
        let now = Instant::now();
        for e in &slot.lists[list][..len] {
            let (start, end, mode) = (
                e.start.load(Ordering::Relaxed),
                e.end.load(Ordering::Relaxed),
                e.mode.load(Ordering::Relaxed),
            );
            // As fcntl: a read lock needs the handle open for reading, a write lock for
            // writing (a client that skipped the check placed locks it could not have).
            let mode = match mode {
                LEASE_READ if lease.read => Mode::Read,
                LEASE_WRITE if lease.write => Mode::Write,
                _ => continue,
            };
            if start > end || end > LOCK_OFFSET_MAX {
                continue;
            }
            // Only the lease holder's own locks were ever on the file: none can conflict but
            // its own entries, which replace one another as sets of one owner do.
            let _ = locks.table.set(
                ino,
                Owner::Session(lease.session),
                lease.pid,
                Some(mode),
                Range { start, end },
                false,
                now,
            );
        }
        locks.leases.forget(ino);
        if seized {
            tracing::warn!(
                pid = lease.pid,
                channel = lease.channel,
                "a lock lease was seized from a client that did not give it back in time"
            );
            if let Some(uses) = locks.leases.slots.get_mut(&lease.channel) {
                uses[lease.slot] = SlotUse::Quarantined;
            } else {
                let mut uses = [SlotUse::Free; LEASE_SLOTS];
                uses[lease.slot] = SlotUse::Quarantined;
                locks.leases.slots.insert(lease.channel, uses);
            }
        }
        true
    }

    /// Recalls the lease on `ino` from a daemon thread (not the poller): waits for a client
    /// that is changing its list, with no lock held, for up to [`RECALL_WAIT`].
    pub(super) fn recall_waiting(&self, ino: u64) {
        let deadline = Instant::now() + RECALL_WAIT;
        loop {
            let mut locks = self.locks();
            if self.recall(&mut locks, ino, Instant::now() >= deadline) {
                return;
            }
            drop(locks);
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Recalls every lease of session `session`, waiting as [`Manager::recall_waiting`].
    pub(super) fn recall_session(&self, session: u64) {
        let inos = self.locks().leases.of_session(session);
        for ino in inos {
            self.recall_waiting(ino);
        }
    }

    /// Ends the lease on `ino` without taking its locks (its holder is closing the file, or
    /// gone): the client finds the slot given back.
    pub(super) fn drop_lease(&self, locks: &mut LockState, ino: u64) {
        let Some(lease) = locks.leases.forget(ino) else {
            return;
        };
        if let Some(area) = self.device.lease_area(lease.channel) {
            let slot: &LeaseSlot = &area.area().slots[lease.slot];
            let (_, list, len) = lease_parts(slot.state.load(Ordering::Acquire));
            slot.state.store(
                lease_word(LEASE_GONE, list as u32, len as u32),
                Ordering::Release,
            );
        }
    }

    /// Forgets the slots of a channel that is closing (after its leases were recalled).
    pub(super) fn forget_channel(locks: &mut LockState, channel: u32) {
        locks.leases.slots.remove(&channel);
    }
}
