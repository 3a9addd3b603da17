//! Lock leases (docs/abi.md §3.8): while one process alone has a file open, through one
//! handle, the daemon may hand the POSIX record locks of that file to the process's channel,
//! so that the process sets, removes and tests them in its own memory instead of asking.
//!
//! A lease lives in a slot of the channel's lease area ([`LEASE_OFFSET`]). The slot's state
//! word says who may touch the slot's lock list, and which of its two lists is current:
//!
//! - the device grants a lease by writing the handle, a new generation and the process's
//!   locks on the file into list 0, then storing [`LEASE_HELD`] (release);
//! - the client changes its locks by moving the word from `HELD` to [`LEASE_BUSY`], writing
//!   the new list into the list that is *not* current, and moving the word back to `HELD`
//!   with the other list current and its length: the current list is never written while it
//!   is current, so the device always finds a whole list;
//! - the device recalls a lease (another open of the file, a fork, a close, a call it must
//!   answer itself) by moving `HELD` to [`LEASE_GONE`]; if it finds `BUSY` it moves it to
//!   [`LEASE_RECALL`] and waits for the client, whose move back to `HELD` then fails, to
//!   store `GONE` with its new list current. A client that leaves the word `BUSY` or
//!   `RECALL` for longer than the device waits loses its last change: the device stores
//!   [`LEASE_SEIZED`] and takes the list that was current before it.
//!
//! The device then places the list's locks in its own table, as the process's, exactly as
//! if they had been asked for, and the client asks the device again from then on.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Byte offset of the lease area in a channel.
pub const LEASE_OFFSET: usize = 0x1800;
/// Byte offset of the lease slots in a channel (after the area's first cache line, whose
/// first word is [`LeaseArea::wanted`]).
pub const LEASE_SLOTS_OFFSET: usize = 0x1840;
/// Lease slots per channel.
pub const LEASE_SLOTS: usize = 3;
/// Bytes per lease slot.
pub const LEASE_SLOT_SIZE: usize = 512;
/// Locks in each of a slot's two lists.
pub const LEASE_ENTRIES: usize = 10;

/// State codes (bits 0–7 of [`LeaseSlot::state`]).
pub const LEASE_FREE: u32 = 0;
/// Granted: the client may take the slot to change its locks.
pub const LEASE_HELD: u32 = 1;
/// The client is changing its locks.
pub const LEASE_BUSY: u32 = 2;
/// The device wants the lease back while the client is changing its locks.
pub const LEASE_RECALL: u32 = 3;
/// Recalled: the device has the locks (or takes the current list); ask it again.
pub const LEASE_GONE: u32 = 4;
/// Recalled without the client's last change, which it must ask for again.
pub const LEASE_SEIZED: u32 = 5;

/// [`LeaseArea::wanted`]: the client takes lock leases.
pub const LEASE_WANTED: u32 = 1;

/// A lock in a lease list: `start` and `end` are the first and last byte (`end` at most
/// 2^63 − 1, which stands for "to the end of the file and beyond"), `mode` 1 for a read lock
/// and 2 for a write lock.
#[repr(C)]
pub struct LeaseEntry {
    /// First byte.
    pub start: AtomicU64,
    /// Last byte.
    pub end: AtomicU64,
    /// [`LEASE_READ`] or [`LEASE_WRITE`].
    pub mode: AtomicU64,
}

/// [`LeaseEntry::mode`] of a shared (read) lock.
pub const LEASE_READ: u64 = 1;
/// [`LeaseEntry::mode`] of an exclusive (write) lock.
pub const LEASE_WRITE: u64 = 2;

/// One lease slot.
#[repr(C)]
pub struct LeaseSlot {
    /// Bits 0–7: the state code; bit 8: the current list (0 or 1); bits 16–23: the current
    /// list's length (at most [`LEASE_ENTRIES`]).
    pub state: AtomicU32,
    /// Reserved, zero.
    pub reserved: AtomicU32,
    /// Device-written at a grant: the handle (of the channel's connection) whose file the
    /// lease covers.
    pub handle: AtomicU64,
    /// Device-written at a grant: a number that changes with every grant of this slot.
    pub generation: AtomicU64,
    /// Reserved, zero.
    pub reserved2: AtomicU64,
    /// The two lists.
    pub lists: [[LeaseEntry; LEASE_ENTRIES]; 2],
}

/// The lease area: the client's opt-in word, then the slots.
#[repr(C)]
pub struct LeaseArea {
    /// Client-written: [`LEASE_WANTED`] asks the device to grant leases on this channel.
    pub wanted: AtomicU32,
    /// Padding to the slots.
    pub pad: [AtomicU32; 15],
    /// The slots.
    pub slots: [LeaseSlot; LEASE_SLOTS],
}

/// A state word: `code` with list `list` current, of `len` locks.
pub const fn lease_word(code: u32, list: u32, len: u32) -> u32 {
    (code & 0xff) | ((list & 1) << 8) | ((len & 0xff) << 16)
}

/// The parts of a state word: (code, current list, its length clamped to [`LEASE_ENTRIES`]).
pub const fn lease_parts(word: u32) -> (u32, usize, usize) {
    let len = ((word >> 16) & 0xff) as usize;
    let len = if len > LEASE_ENTRIES {
        LEASE_ENTRIES
    } else {
        len
    };
    (word & 0xff, ((word >> 8) & 1) as usize, len)
}

/// A lock of a lease list, as plain values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseLock {
    /// First byte.
    pub start: u64,
    /// Last byte.
    pub end: u64,
    /// Exclusive (else shared).
    pub write: bool,
}

/// The locks of one owner after it sets (`Some(write)`) or removes (`None`) a lock over
/// `[start, end]`: the list stays sorted by start and disjoint, and neighbours of one type
/// that overlap or touch merge, as POSIX locks of one process do. `out` receives the new
/// list; `false` (with `out` unspecified) when it would hold more than `max` locks.
pub fn lease_apply(
    list: &[LeaseLock],
    start: u64,
    end: u64,
    set: Option<bool>,
    max: usize,
    out: &mut [LeaseLock],
) -> Option<usize> {
    let mut n = 0usize;
    let mut push = |l: LeaseLock, out: &mut [LeaseLock]| -> bool {
        if n > 0 {
            let last = &mut out[n - 1];
            if last.write == l.write && last.end.checked_add(1).is_some_and(|e| e >= l.start) {
                last.end = last.end.max(l.end);
                return true;
            }
        }
        if n >= max.min(out.len()) {
            return false;
        }
        out[n] = l;
        n += 1;
        true
    };
    let new = set.map(|write| LeaseLock { start, end, write });
    let mut placed = false;
    for l in list {
        if l.end < start || l.start > end {
            // Untouched; the new lock goes in where it sorts.
            if l.start > end && !placed {
                if let Some(x) = new {
                    if !push(x, out) {
                        return None;
                    }
                }
                placed = true;
            }
            if !push(*l, out) {
                return None;
            }
            continue;
        }
        // The part before the range survives.
        if l.start < start
            && !push(
                LeaseLock {
                    start: l.start,
                    end: start - 1,
                    write: l.write,
                },
                out,
            )
        {
            return None;
        }
        if !placed {
            if let Some(x) = new {
                if !push(x, out) {
                    return None;
                }
            }
            placed = true;
        }
        // The part after it survives.
        if l.end > end
            && !push(
                LeaseLock {
                    start: end + 1,
                    end: l.end,
                    write: l.write,
                },
                out,
            )
        {
            return None;
        }
    }
    if !placed {
        if let Some(x) = new {
            if !push(x, out) {
                return None;
            }
        }
    }
    Some(n)
}

const _: () = {
    assert!(size_of::<LeaseEntry>() == 24);
    assert!(size_of::<LeaseSlot>() == LEASE_SLOT_SIZE);
    assert!(offset_of!(LeaseSlot, lists) == 32);
    assert!(offset_of!(LeaseArea, slots) == LEASE_SLOTS_OFFSET - LEASE_OFFSET);
    assert!(LEASE_SLOTS_OFFSET + LEASE_SLOTS * LEASE_SLOT_SIZE <= crate::channel::TAG_SLOTS_OFFSET);
    assert!(LEASE_OFFSET >= crate::channel::ERROR_QUEUE_OFFSET + 64 * 32);
};

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(list: &[LeaseLock], s: u64, e: u64, set: Option<bool>) -> Option<Vec<LeaseLock>> {
        let mut out = [LeaseLock {
            start: 0,
            end: 0,
            write: false,
        }; LEASE_ENTRIES];
        lease_apply(list, s, e, set, LEASE_ENTRIES, &mut out).map(|n| out[..n].to_vec())
    }

    fn l(start: u64, end: u64, write: bool) -> LeaseLock {
        LeaseLock { start, end, write }
    }

    #[test]
    fn sets_split_merge_and_unlocks_split() {
        let a = apply(&[], 10, 19, Some(false)).unwrap();
        assert_eq!(a, [l(10, 19, false)]);
        // A write lock in the middle splits the read lock.
        let b = apply(&a, 13, 15, Some(true)).unwrap();
        assert_eq!(b, [l(10, 12, false), l(13, 15, true), l(16, 19, false)]);
        // Read again there: the three merge into one.
        let c = apply(&b, 13, 15, Some(false)).unwrap();
        assert_eq!(c, [l(10, 19, false)]);
        // Touching locks of one type merge; of different types they stay apart.
        let d = apply(&c, 20, 29, Some(false)).unwrap();
        assert_eq!(d, [l(10, 29, false)]);
        let e = apply(&d, 30, 39, Some(true)).unwrap();
        assert_eq!(e, [l(10, 29, false), l(30, 39, true)]);
        // An unlock splits, and one over everything empties the list.
        let f = apply(&e, 25, 34, None).unwrap();
        assert_eq!(f, [l(10, 24, false), l(35, 39, true)]);
        assert_eq!(apply(&f, 0, (1 << 63) - 1, None).unwrap(), []);
        // A lock before every other sorts first.
        let g = apply(&f, 0, 1, Some(true)).unwrap();
        assert_eq!(g[0], l(0, 1, true));
        assert_eq!(g.len(), 3);
    }

    #[test]
    fn a_list_that_would_overflow_is_refused() {
        let mut list = Vec::new();
        for i in 0..LEASE_ENTRIES as u64 {
            list = apply(&list, i * 10, i * 10 + 1, Some(i % 2 == 0)).unwrap();
        }
        assert_eq!(list.len(), LEASE_ENTRIES);
        assert!(apply(&list, 500, 501, Some(true)).is_none());
        // Splitting one lock in two needs room as well.
        assert!(apply(&list, 20, 20, None).is_some());
        assert!(apply(&list, 0, 0, Some(false)).is_none());
    }

    #[test]
    fn words_round_trip_and_lengths_are_clamped() {
        let w = lease_word(LEASE_HELD, 1, 7);
        assert_eq!(lease_parts(w), (LEASE_HELD, 1, 7));
        assert_eq!(lease_parts(lease_word(LEASE_GONE, 0, 200)).2, LEASE_ENTRIES);
    }
}
