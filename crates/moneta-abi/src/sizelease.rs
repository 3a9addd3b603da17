//! Size leases (docs/abi.md §3.9): a client appending to a file may grow its size inside the
//! chunks the daemon allocated past the end, without a call, by publishing the new size in a
//! slot of its channel; the daemon reads the slot whenever anything depends on the size.
//!
//! The daemon grants a slot by storing `published = 0`, `handle`, `limit` and a new
//! `generation` (sequentially consistent stores, generation last). A client about to write
//! `[off, end)` past the size it knows loads `generation`, checks `handle` and `limit >= end`,
//! raises `published` to `end` (a compare-and-swap of [`size_word`]`(generation, end)`),
//! loads `generation` again and goes on only if it did not change; otherwise it asks with an
//! extend as before. The daemon ends a grant by storing a new `generation` and `limit = 0`,
//! and only then reads `published` a last time. Both sides use sequentially consistent
//! accesses, so either the client sees the new generation and asks, or the daemon sees the
//! published size: a write the client issued after publishing is never outside the size.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Byte offset of the size-lease area in a channel (inside the header's unused page).
pub const SIZE_LEASE_OFFSET: usize = 0x0400;
/// Byte offset of the first size-lease slot (after the area's first cache line).
pub const SIZE_LEASE_SLOTS_OFFSET: usize = 0x0440;
/// Size-lease slots per channel.
pub const SIZE_LEASE_SLOTS: usize = 8;
/// Bytes per size-lease slot.
pub const SIZE_LEASE_SLOT_SIZE: usize = 32;
/// [`SizeLeaseArea::wanted`]: the client publishes sizes in granted slots.
pub const SIZE_LEASE_WANTED: u32 = 1;
/// Bits of a published word that carry the size (the rest carry the generation's low bits).
pub const SIZE_BITS: u32 = 48;

/// One size-lease slot.
#[repr(C)]
pub struct SizeLeaseSlot {
    /// Device-written: changes with every grant and every end of a grant in this slot.
    pub generation: AtomicU64,
    /// Device-written: the handle (of the channel's connection) whose file the grant covers.
    pub handle: AtomicU64,
    /// Device-written: the size the file may grow to through this grant; 0 when none.
    pub limit: AtomicU64,
    /// Client-written: [`size_word`] of the generation it was granted under and the size it
    /// grew the file to.
    pub published: AtomicU64,
}

/// The size-lease area: the client's opt-in word, then the slots.
#[repr(C)]
pub struct SizeLeaseArea {
    /// Client-written: [`SIZE_LEASE_WANTED`] asks the device to grant size leases.
    pub wanted: AtomicU32,
    /// Padding to the slots.
    pub pad: [AtomicU32; 15],
    /// The slots.
    pub slots: [SizeLeaseSlot; SIZE_LEASE_SLOTS],
}

/// The published word for `size` under `generation`: its low 16 bits above the size's 48, so
/// that a word written under an earlier grant of the slot never counts for a later one.
pub const fn size_word(generation: u64, size: u64) -> u64 {
    ((generation & 0xffff) << SIZE_BITS) | (size & ((1 << SIZE_BITS) - 1))
}

/// The size a published word carries, if it was written under `generation`.
pub const fn word_size(word: u64, generation: u64) -> Option<u64> {
    if word >> SIZE_BITS == generation & 0xffff {
        Some(word & ((1 << SIZE_BITS) - 1))
    } else {
        None
    }
}

const _: () = {
    assert!(size_of::<SizeLeaseSlot>() == SIZE_LEASE_SLOT_SIZE);
    assert!(offset_of!(SizeLeaseArea, slots) == SIZE_LEASE_SLOTS_OFFSET - SIZE_LEASE_OFFSET);
    assert!(SIZE_LEASE_OFFSET >= size_of::<crate::channel::ChannelHeader>());
    assert!(
        SIZE_LEASE_SLOTS_OFFSET + SIZE_LEASE_SLOTS * SIZE_LEASE_SLOT_SIZE
            <= crate::channel::CHANGES_OFFSET
    );
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_counts_only_under_its_generation() {
        let w = size_word(7, 12_345);
        assert_eq!(word_size(w, 7), Some(12_345));
        assert_eq!(word_size(w, 8), None);
        assert_eq!(word_size(w, 7 + 0x1_0000), Some(12_345));
        assert_eq!(word_size(0, 1), None);
        assert_eq!(
            word_size(size_word(1, (1 << 46) + 5), 1),
            Some((1 << 46) + 5)
        );
    }
}
