//! Lock leases (docs/abi.md §3.8): while this process alone has a file open, through one
//! handle, the daemon may leave the file's POSIX record locks in the channel's lease area.
//! This process then places, removes and tests them in that memory, with no call: with no
//! other owner on the file, a set always succeeds and a test finds no conflict, exactly as
//! the daemon would answer. Anything else (another kind of lock, a list that would not fit,
//! a lease recalled meanwhile) goes to the daemon, which first takes the lease back.
//!
//! `MONETA_LOCK_LEASES=off` asks the daemon for leases no more (to compare).

use std::sync::atomic::{AtomicU64, Ordering};

use moneta_abi::fsproto::LOCK_OFFSET_MAX;
use moneta_abi::{
    lease_apply, lease_parts, lease_word, LeaseArea, LeaseLock, LeaseSlot, FS_LOCK_LEASES,
    LEASE_BUSY, LEASE_ENTRIES, LEASE_GONE, LEASE_HELD, LEASE_OFFSET, LEASE_READ, LEASE_RECALL,
    LEASE_WANTED, LEASE_WRITE,
};

use super::Channel;

/// Lock calls answered in a lease, without asking the daemon.
static LEASED: AtomicU64 = AtomicU64::new(0);

/// How many lock calls this process answered in its leases.
pub fn locks_leased() -> u64 {
    LEASED.load(Ordering::Relaxed)
}

/// A POSIX lock call a lease may answer.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LeasedCall {
    /// Place a lock (`true`: exclusive) or remove (`None`) over the range.
    Set(Option<bool>),
    /// Test for a conflicting lock over the range.
    Test,
}

/// The last byte of a lock of `len` bytes at `start` (0: to the end), as the daemon takes
/// it; `None` for a range the daemon refuses (it then says why).
fn lock_end(start: u64, len: u64) -> Option<u64> {
    let end = match len {
        0 => LOCK_OFFSET_MAX,
        n => start.checked_add(n - 1)?,
    };
    (start <= LOCK_OFFSET_MAX && end <= LOCK_OFFSET_MAX).then_some(end)
}

impl Channel {
    fn lease_area(&self) -> &LeaseArea {
        // SAFETY: the area lies between the error queue and the tag slots, inside the
        // mapping (asserted in moneta-abi), aligned, and holds only atomics; the mapping
        // lives as long as `self`.
        unsafe { &*self.header_ptr().add(LEASE_OFFSET).cast::<LeaseArea>() }
    }

    /// Asks the daemon for lock leases on this channel, where it grants them and
    /// `MONETA_LOCK_LEASES` is not `off`.
    pub(crate) fn want_leases(&self) {
        if self.header().fs_flags.load(Ordering::Acquire) & FS_LOCK_LEASES != 0
            && super::fscall::leasing()
        {
            self.lease_area()
                .wanted
                .store(LEASE_WANTED, Ordering::Release);
        }
    }

    /// Answers `call` on handle `handle` over `len` bytes at `start` in the lease of the
    /// handle's file, if this channel holds one: `Some(())` when answered (a set placed, or
    /// a test that finds no conflict), `None` when the daemon must answer.
    pub(crate) fn leased_lock(
        &self,
        handle: u64,
        call: LeasedCall,
        start: u64,
        len: u64,
    ) -> Option<()> {
        let end = lock_end(start, len)?;
        let slot = self.lease_area().slots.iter().find(|s| {
            lease_parts(s.state.load(Ordering::Acquire)).0 == LEASE_HELD
                && s.handle.load(Ordering::Relaxed) == handle
        })?;
        let r = match call {
            // While the lease is held, every lock on the file is this process's own.
            LeasedCall::Test => Some(()),
            LeasedCall::Set(set) => change(slot, handle, start, end, set),
        };
        if r.is_some() {
            LEASED.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

/// Places or removes a lock in `slot`'s list under the handshake of docs/abi.md §3.8.
fn change(slot: &LeaseSlot, handle: u64, start: u64, end: u64, set: Option<bool>) -> Option<()> {
    let w = slot.state.load(Ordering::Acquire);
    let (code, list, len) = lease_parts(w);
    if code != LEASE_HELD {
        return None;
    }
    let generation = slot.generation.load(Ordering::Acquire);
    let busy = lease_word(LEASE_BUSY, list as u32, len as u32);
    slot.state
        .compare_exchange(w, busy, Ordering::AcqRel, Ordering::Acquire)
        .ok()?;
    // The slot may have been recalled and granted again for another file in between.
    if slot.generation.load(Ordering::Acquire) != generation
        || slot.handle.load(Ordering::Relaxed) != handle
    {
        finish(slot, busy, w);
        return None;
    }
    let mut cur = [LeaseLock {
        start: 0,
        end: 0,
        write: false,
    }; LEASE_ENTRIES];
    for (c, e) in cur.iter_mut().zip(&slot.lists[list][..len]) {
        *c = LeaseLock {
            start: e.start.load(Ordering::Relaxed),
            end: e.end.load(Ordering::Relaxed),
            write: e.mode.load(Ordering::Relaxed) == LEASE_WRITE,
        };
    }
    let mut out = cur;
    let Some(n) = lease_apply(&cur[..len], start, end, set, LEASE_ENTRIES, &mut out) else {
        // Too many locks for the list: the daemon takes them all back, and this call.
        finish(slot, busy, w);
        return None;
    };
    let other = 1 - list;
    for (e, l) in slot.lists[other].iter().zip(&out[..n]) {
        e.start.store(l.start, Ordering::Relaxed);
        e.end.store(l.end, Ordering::Relaxed);
        e.mode.store(
            if l.write { LEASE_WRITE } else { LEASE_READ },
            Ordering::Relaxed,
        );
    }
    let held = lease_word(LEASE_HELD, other as u32, n as u32);
    if finish(slot, busy, held) {
        Some(())
    } else {
        // Seized (or written by someone else): the change may not count; ask the daemon.
        None
    }
}

/// Ends a change: the slot goes from `busy` to `to`, or, when the device recalled it
/// meanwhile, is given back with `to`'s list current. `false` when the device no longer
/// waits for this change (the slot was seized) or the word is not what the handshake allows.
fn finish(slot: &LeaseSlot, busy: u32, to: u32) -> bool {
    match slot
        .state
        .compare_exchange(busy, to, Ordering::AcqRel, Ordering::Acquire)
    {
        Ok(_) => true,
        Err(now) if lease_parts(now).0 == LEASE_RECALL => {
            let (_, list, len) = lease_parts(to);
            slot.state.store(
                lease_word(LEASE_GONE, list as u32, len as u32),
                Ordering::Release,
            );
            true
        }
        Err(_) => false,
    }
}
