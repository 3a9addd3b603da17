//! Sole leases (docs/abi.md §3.10): while a handle is its file's only open in the whole
//! daemon, the daemon says so in a slot of the channel, and a write through it may return as
//! soon as its command is rung (a *posted* write). Nobody else can read the file without an
//! open, and the daemon ends the lease at any other open (or a fork, or a truncation by path)
//! and waits for the commands rung before then: so a write that returned is in the array
//! before anybody else can look. This process sees its own posted writes because the file
//! collects them (waits for their completions) before its reads, its other writes over the
//! same bytes, its `fsync`, its truncation and its close ([`crate::File`]).
//!
//! The check is the slot's generation, loaded before the command is rung and again after: if
//! it did not change, the lease stood when the command was rung, and the daemon, which
//! changes the generation before it waits, waits for it; otherwise the write waits for its
//! completion itself, as any other.
//!
//! `MONETA_POSTED_WRITES=off` asks the daemon for no sole leases (to compare).

use std::sync::atomic::{AtomicU64, Ordering};

use moneta_abi::{SoleLeaseArea, FS_SOLE_LEASES, SOLE_LEASE_OFFSET, SOLE_LEASE_WANTED};

use super::Channel;

/// Most writes posted and not yet collected on one channel, by all its files: the rest wait
/// for their completions, so posted writes never hold more than half the tags.
pub(crate) const MAX_POSTED: u32 = 32;

/// Writes that returned before their completion, under a sole lease.
static POSTED: AtomicU64 = AtomicU64::new(0);

/// How many writes this process returned from before their completions (posted under sole
/// leases).
pub fn writes_posted() -> u64 {
    POSTED.load(Ordering::Relaxed)
}

/// A sole lease as a write found it: the slot and the generation to check again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SoleCheck {
    slot: usize,
    generation: u64,
}

impl Channel {
    fn sole_area(&self) -> &SoleLeaseArea {
        // SAFETY: the area lies in the header's page, past the size-lease area and before the
        // change board (asserted in moneta-abi), aligned, and holds only atomics; the mapping
        // lives as long as `self`.
        unsafe {
            &*self
                .header_ptr()
                .add(SOLE_LEASE_OFFSET)
                .cast::<SoleLeaseArea>()
        }
    }

    /// Asks the daemon for sole leases on this channel, where it grants them and
    /// `MONETA_POSTED_WRITES` is not `off`.
    pub(crate) fn want_sole_leases(&self) {
        if self.header().fs_flags.load(Ordering::Acquire) & FS_SOLE_LEASES != 0
            && super::fscall::posting()
        {
            self.sole_area()
                .wanted
                .store(SOLE_LEASE_WANTED, Ordering::Release);
        }
    }

    /// The sole lease `handle` holds now, if it holds one and the channel may post another
    /// write (it then counts as posted until [`Channel::unpost`]).
    pub(crate) fn sole_lease(&self, handle: u64) -> Option<SoleCheck> {
        if self.posted.load(Ordering::Relaxed) >= MAX_POSTED {
            return None;
        }
        for (slot, s) in self.sole_area().slots.iter().enumerate() {
            let g = s.generation.load(Ordering::SeqCst);
            if g & 1 == 1 || s.handle.load(Ordering::SeqCst) != handle {
                continue;
            }
            if s.generation.load(Ordering::SeqCst) != g {
                return None;
            }
            // Counted before it is taken, so threads posting at once stay within the bound.
            if self.posted.fetch_add(1, Ordering::Relaxed) >= MAX_POSTED {
                self.posted.fetch_sub(1, Ordering::Relaxed);
                return None;
            }
            return Some(SoleCheck {
                slot,
                generation: g,
            });
        }
        None
    }

    /// Whether the lease `c` found still stands, after the write's command was rung: the
    /// write may then return without its completion.
    pub(crate) fn sole_still(&self, c: SoleCheck) -> bool {
        let still = self.sole_area().slots[c.slot]
            .generation
            .load(Ordering::SeqCst)
            == c.generation;
        if still {
            POSTED.fetch_add(1, Ordering::Relaxed);
        }
        still
    }

    /// A posted write collected, or one that waited after all.
    pub(crate) fn unpost(&self) {
        self.posted.fetch_sub(1, Ordering::Relaxed);
    }
}
