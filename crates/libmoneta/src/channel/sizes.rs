//! Size leases (docs/abi.md §3.9): after an extend that ends a file, the daemon may leave
//! room allocated past the new end and a slot in which this process publishes the size it
//! grows the file to inside that room. A write there then needs no extend call: publish the
//! new end, check that the grant still stands, write. The daemon reads the slot whenever
//! anything depends on the file's size, so other processes see the size at once; `fsync`
//! asks the daemon (which applies the size) when something was published since the last
//! call. A grant that ended meanwhile (another process truncated the file, say) is seen by
//! the check, and the write asks with an extend as before.
//!
//! `MONETA_SIZE_LEASES=off` asks the daemon for no size leases (to compare).

use std::sync::atomic::{AtomicU64, Ordering};

use moneta_abi::SIZE_LEASE_WANTED;
use moneta_abi::{
    size_word, word_size, SizeLeaseArea, FS_ROOM_AT_OPEN, FS_SIZE_LEASES, SIZE_LEASE_OFFSET,
};

use super::Channel;

/// Writes past the known size that a size lease covered, without an extend call.
static GROWN: AtomicU64 = AtomicU64::new(0);

/// How many writes this process made past a file's size inside its room, with no call.
pub fn sizes_leased() -> u64 {
    GROWN.load(Ordering::Relaxed)
}

impl Channel {
    fn size_area(&self) -> &SizeLeaseArea {
        // SAFETY: the area lies in the header's page, past the header and before the change
        // board (asserted in moneta-abi), aligned, and holds only atomics; the mapping lives
        // as long as `self`.
        unsafe {
            &*self
                .header_ptr()
                .add(SIZE_LEASE_OFFSET)
                .cast::<SizeLeaseArea>()
        }
    }

    /// Asks the daemon for size leases on this channel, where it grants them and
    /// `MONETA_SIZE_LEASES` is not `off`.
    pub(crate) fn want_size_leases(&self) {
        if self.header().fs_flags.load(Ordering::Acquire) & FS_SIZE_LEASES != 0
            && super::fscall::sizing()
        {
            self.size_area()
                .wanted
                .store(SIZE_LEASE_WANTED, Ordering::Release);
        }
    }

    /// Whether an open may ask for room (`FS_OPEN_ROOM`): the daemon takes it, and this
    /// process asked for size leases.
    pub(crate) fn room_at_open(&self) -> bool {
        self.header().fs_flags.load(Ordering::Acquire) & FS_ROOM_AT_OPEN != 0
            && self.size_area().wanted.load(Ordering::Acquire) == SIZE_LEASE_WANTED
    }

    /// The size `handle`'s file has published under a size lease this channel holds on it
    /// now (0 when none yet): while the lease stands nobody else moves the file's size, so
    /// the size is exactly the larger of this and the size the lease's extend answered.
    pub(crate) fn leased_size(&self, handle: u64) -> Option<u64> {
        for s in &self.size_area().slots {
            let g = s.generation.load(Ordering::SeqCst);
            if g & 1 == 1 || s.handle.load(Ordering::SeqCst) != handle {
                continue;
            }
            if s.limit.load(Ordering::SeqCst) == 0 {
                return None;
            }
            let p = word_size(s.published.load(Ordering::SeqCst), g).unwrap_or(0);
            return (s.generation.load(Ordering::SeqCst) == g).then_some(p);
        }
        None
    }

    /// Publishes that the file of `handle` now ends at `end` at least, if a size lease of
    /// this channel covers it: whether it does (the write may go ahead with no call).
    pub(crate) fn publish_size(&self, handle: u64, end: u64) -> bool {
        for s in &self.size_area().slots {
            let g = s.generation.load(Ordering::SeqCst);
            if g & 1 == 1 || s.handle.load(Ordering::SeqCst) != handle {
                continue;
            }
            if s.limit.load(Ordering::SeqCst) < end {
                return false;
            }
            let mut w = s.published.load(Ordering::SeqCst);
            loop {
                if word_size(w, g).is_some_and(|p| p >= end) {
                    break;
                }
                match s.published.compare_exchange(
                    w,
                    size_word(g, end),
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                ) {
                    Ok(_) => break,
                    Err(now) => w = now,
                }
            }
            // The daemon ends a grant by changing the generation before it reads the slot
            // a last time: unchanged now, the size published above counts.
            if s.generation.load(Ordering::SeqCst) != g {
                return false;
            }
            GROWN.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        false
    }
}
