//! Sole leases (docs/abi.md §3.10): while a handle is the only open of its file in the whole
//! daemon, the daemon may say so in a slot of the handle's channel, and the client may then
//! return from a write as soon as its command is rung (a *posted* write), collecting the
//! completion later: nobody else can read the file without an open, and the daemon ends the
//! lease at any other open and waits for the commands the holder rang before it answers.
//!
//! The daemon grants a slot by adding 1 to `generation` (odd), storing `handle`, and adding 1
//! again (even). A client about to post a write loads `generation` (even, `handle` its
//! own), rings the command, and loads `generation` again: unchanged, the write may return;
//! changed, it waits for the command as any other. The daemon ends a lease by adding 1,
//! storing `handle = 0` and adding 1 again, and only then looks at the channel's tags and
//! waits until every WRITE rung with DMA or issue-sleep completion has completed (a bounded
//! time). Both sides use sequentially consistent accesses, so either the client sees the new
//! generation and waits, or the daemon sees the command rung and waits for it.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Byte offset of the sole-lease area in a channel (inside the header's unused page).
pub const SOLE_LEASE_OFFSET: usize = 0x0600;
/// Byte offset of the first sole-lease slot (after the area's first cache line).
pub const SOLE_LEASE_SLOTS_OFFSET: usize = 0x0640;
/// Sole-lease slots per channel.
pub const SOLE_LEASE_SLOTS: usize = 16;
/// Bytes per sole-lease slot.
pub const SOLE_LEASE_SLOT_SIZE: usize = 16;
/// [`SoleLeaseArea::wanted`]: the client posts writes under granted slots.
pub const SOLE_LEASE_WANTED: u32 = 1;

/// One sole-lease slot.
#[repr(C)]
pub struct SoleLeaseSlot {
    /// Device-written: odd while the slot changes; changes with every grant and every end.
    pub generation: AtomicU64,
    /// Device-written: the handle (of the channel's connection) that is its file's only open;
    /// 0 when the slot is not granted.
    pub handle: AtomicU64,
}

/// The sole-lease area: the client's opt-in word, then the slots.
#[repr(C)]
pub struct SoleLeaseArea {
    /// Client-written: [`SOLE_LEASE_WANTED`] asks the device to grant sole leases.
    pub wanted: AtomicU32,
    /// Padding to the slots.
    pub pad: [AtomicU32; 15],
    /// The slots.
    pub slots: [SoleLeaseSlot; SOLE_LEASE_SLOTS],
}

const _: () = {
    assert!(size_of::<SoleLeaseSlot>() == SOLE_LEASE_SLOT_SIZE);
    assert!(offset_of!(SoleLeaseArea, slots) == SOLE_LEASE_SLOTS_OFFSET - SOLE_LEASE_OFFSET);
    assert!(
        crate::sizelease::SIZE_LEASE_SLOTS_OFFSET
            + crate::sizelease::SIZE_LEASE_SLOTS * crate::sizelease::SIZE_LEASE_SLOT_SIZE
            <= SOLE_LEASE_OFFSET
    );
    assert!(
        SOLE_LEASE_SLOTS_OFFSET + SOLE_LEASE_SLOTS * SOLE_LEASE_SLOT_SIZE
            <= crate::channel::CHANGES_OFFSET
    );
};
