//! The channel: one memfd shared between `monetad` and one client process (Moneta-D §4.2,
//! Table 1).
//!
//! ```text
//! 0x0000  ChannelHeader      identity words and registers, one cache line per writer
//! 0x1000  error queue        ERROR_QUEUE_LEN entries of ErrorEntry (32 bytes each)
//! 0x2000  tag slots          TAGS_PER_CHANNEL x TagSlot (128 bytes: command + status)
//! 0x4000  DMA buffer         dma_size bytes, slice k starts at k * slice_size
//! ```
//!
//! Who writes what is part of the contract: the device never trusts a word a client can write,
//! and reads each such word at most once per command.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU32, AtomicU64};

/// `b"MONETACH"` read as a little-endian `u64`: the first word of every channel.
pub const CHANNEL_MAGIC: u64 = u64::from_le_bytes(*b"MONETACH");

/// Virtual tags per channel (Moneta-D §4.2). Fixed by the ABI: the doorbell is one 64-bit word.
pub const TAGS_PER_CHANNEL: usize = 64;

/// Entries in each channel's error queue.
pub const ERROR_QUEUE_LEN: usize = 64;

/// Byte offset of the [`ChannelHeader`].
pub const HEADER_OFFSET: usize = 0;
/// Byte offset of the change board: [`CHANGE_SLOTS`] device-written `u64` counters (see
/// [`change_slot`]).
pub const CHANGES_OFFSET: usize = 0x800;
/// Counters on the change board.
pub const CHANGE_SLOTS: usize = 256;
/// Byte offset of the error queue.
pub const ERROR_QUEUE_OFFSET: usize = 0x1000;
/// Byte offset of the tag slot array.
pub const TAG_SLOTS_OFFSET: usize = 0x2000;
/// Byte offset of the DMA buffer.
pub const DMA_OFFSET: usize = 0x4000;

/// Default DMA buffer size: 1 MiB (Moneta-D §4.2).
pub const DEFAULT_DMA_SIZE: usize = 1 << 20;
/// Default DMA slice per tag: 16 KiB (Moneta-D §4.2).
pub const DEFAULT_SLICE_SIZE: usize = 16 << 10;

/// Total bytes of a channel memfd with a DMA buffer of `dma_size` bytes.
pub const fn channel_size(dma_size: usize) -> usize {
    DMA_OFFSET + dma_size
}

/// Value of [`ChannelHeader::parked`] while the device polls the channel's doorbell.
pub const POLLING: u32 = 0;
/// Value of [`ChannelHeader::parked`] once the device has stopped polling the channel: a client
/// that rings the doorbell must then write its kick eventfd (the need-wakeup flag).
pub const PARKED: u32 = 1;

/// The first page of a channel. Identity words are written once by the device before the
/// channel is handed out; the rest are registers, each cache line written by one side only.
#[repr(C, align(64))]
pub struct ChannelHeader {
    /// [`CHANNEL_MAGIC`].
    pub magic: AtomicU64,
    /// [`crate::ABI_VERSION`] of the device that made the channel.
    pub abi_version: AtomicU32,
    /// This channel's id, as used in error entries and administrative grants.
    pub channel_id: AtomicU32,
    /// Number of tags: always [`TAGS_PER_CHANNEL`].
    pub tags: AtomicU32,
    /// Bytes of DMA buffer per tag.
    pub slice_size: AtomicU32,
    /// Byte offset of the DMA buffer in the channel ([`DMA_OFFSET`]).
    pub dma_offset: AtomicU64,
    /// Bytes in the DMA buffer.
    pub dma_size: AtomicU64,
    /// Bytes in the device's array: the highest valid address plus one.
    pub array_size: AtomicU64,
    /// Entries in the error queue ([`ERROR_QUEUE_LEN`]).
    pub error_queue_len: AtomicU32,
    /// The CPU the device's poller is pinned to, plus one; zero when the scheduler places it.
    /// A client may keep its threads off that CPU (libmoneta does, see `MONETA_AFFINITY`).
    /// Zero in devices before this field was named, which reads as "not pinned".
    pub device_cpu: AtomicU32,
    /// Bytes in the whole channel memfd.
    pub total_size: AtomicU64,

    /// Client-written: a client flips bit `k` (atomic XOR) to submit the command in tag `k`'s
    /// slot (the COMMAND register). The device keeps the value it saw last and takes every bit
    /// that changed since, so it never writes this word.
    pub doorbell: AtomicU64,
    /// Padding to the next cache line.
    pub pad1: [AtomicU64; 7],

    /// Device-written: [`POLLING`] or [`PARKED`] (need-wakeup).
    pub parked: AtomicU32,
    /// Reserved, zero.
    pub reserved1: AtomicU32,
    /// Device-written: how many of this channel's permission records were evicted so far.
    pub evictions: AtomicU64,
    /// Device-written: how many times the device has retired a mapped file's pages
    /// (`FS_MAP`) since it started. A client that reads and writes files through their pages
    /// (in place, with no command) checks it around each access, announcing itself in
    /// [`ChannelHeader::in_place`] (docs/abi.md §3.3).
    pub retired: AtomicU64,
    /// Device-written once, before the channel is handed out: what the file system behind
    /// the device promises ([`FS_FSYNC_IS_ORDER`]); zero for a raw device or a daemon that
    /// promises nothing more.
    pub fs_flags: AtomicU32,
    /// Reserved, zero.
    pub reserved2: AtomicU32,
    /// Padding to the next cache line.
    pub pad2: [AtomicU64; 4],

    /// Device-written: requests completed with forwarding (the COMPLETIONCOUNT word).
    pub completion_count: AtomicU64,
    /// Device sets bit `k` when tag `k` completes with forwarding; a client takes the bits by
    /// swapping in zero (the read-and-clear TAGSTATUSREGISTER).
    pub tag_status_register: AtomicU64,
    /// Padding to the next cache line.
    pub pad3: [AtomicU64; 6],

    /// Device-written: count of error entries ever pushed (the queue's producer index).
    pub err_head: AtomicU32,
    /// Device-written: count of error entries dropped because the queue was full.
    pub err_overflow: AtomicU32,
    /// Padding to the next cache line.
    pub pad4: [AtomicU32; 14],

    /// Client-written: count of error entries consumed (the queue's consumer index).
    pub err_tail: AtomicU32,
    /// Client-written: how many of the client's threads are inside an access in place now
    /// (see [`ChannelHeader::retired`]). The device reads it only while retiring pages, and
    /// waits a bounded time for it to be zero.
    pub in_place: AtomicU32,
    /// Padding to the end of the header.
    pub pad5: [AtomicU32; 14],
}

/// [`ChannelHeader::fs_flags`]: the daemon's file system keeps every change in the array as
/// it is made (the `device` durability level), so `fsync` has nothing to make durable: a
/// client may answer it itself once the writes it covers have completed.
pub const FS_FSYNC_IS_ORDER: u32 = 1;

/// [`ChannelHeader::fs_flags`]: the daemon keeps this channel's change board (offset
/// [`CHANGES_OFFSET`]): a client may keep `STAT` answers as docs/abi.md §3.7 says.
pub const FS_CHANGE_BOARD: u32 = 2;

/// [`ChannelHeader::fs_flags`]: the daemon grants lock leases in the channel's lease area
/// (offset [`crate::LEASE_OFFSET`], docs/abi.md §3.8) to a client that asks for them.
pub const FS_LOCK_LEASES: u32 = 4;

/// [`ChannelHeader::fs_flags`]: the daemon grants size leases in the channel's size-lease
/// area (offset [`crate::SIZE_LEASE_OFFSET`], docs/abi.md §3.9) to a client that asks for them.
pub const FS_SIZE_LEASES: u32 = 8;

/// [`ChannelHeader::fs_flags`]: the array goes with the daemon (a volatile array), so nothing
/// written to it outlives the daemon and `fsync` has nothing to make durable, not even a size
/// published under a size lease: a client may answer every `fsync` itself once the writes it
/// covers have completed.
pub const FS_VOLATILE: u32 = 16;

/// [`ChannelHeader::fs_flags`]: the daemon takes `FS_UNLINK_KEEP`
/// ([`crate::fsproto::OP_FS_UNLINK_KEEP`]), an unlink that succeeds and is also the answer
/// `ENOENT` to a `STAT` of its path, with either follow flag, which a client may keep as
/// docs/abi.md §3.7 says (the daemon watches what that stat depends on as it unlinks).
pub const FS_UNLINK_KEPT: u32 = 32;

/// [`ChannelHeader::fs_flags`]: the daemon takes `FS_OPEN_ROOM`
/// ([`crate::fsproto::OP_FS_OPEN_ROOM`]), an open that may also give an empty file room and a
/// size lease over it, as the first extend of a growing file would (docs/abi.md §3.9).
pub const FS_ROOM_AT_OPEN: u32 = 64;

/// [`ChannelHeader::fs_flags`]: the daemon grants sole leases in the channel's sole-lease area
/// (offset [`crate::SOLE_LEASE_OFFSET`], docs/abi.md §3.10) to a client that asks for them: a
/// handle that is its file's only open may have its writes return once rung.
pub const FS_SOLE_LEASES: u32 = 128;

/// [`ChannelHeader::fs_flags`]: the daemon hands out its durability page
/// ([`crate::fsproto::OP_FS_DURABLE`], [`crate::DurablePage`]): at the `host` level a client
/// whose data for an `fsync` it has made durable itself may learn there whether any metadata
/// change is still to be made durable (docs/abi.md §2.10).
pub const FS_DURABLE_PAGE: u32 = 256;

/// The change-board counter that answers for a `STAT` of `target` (docs/abi.md §3.7): the
/// device adds to it whenever something the answer it gave depended on changes (the
/// inode's attributes; for a path, every directory and link the path went through), so a
/// client that kept the answer, with the counter's value read *before* it asked, may give it
/// again for as long as the counter keeps that value. FNV-1a of the handle's bytes, or of
/// the path's bytes and the follow flag, modulo [`CHANGE_SLOTS`].
pub fn change_slot(target: &crate::fsproto::Target) -> usize {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let eat = |h: u64, bytes: &[u8]| {
        bytes
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
    };
    let h = match target {
        crate::fsproto::Target::Handle(handle) => eat(eat(OFFSET, b"h"), &handle.to_le_bytes()),
        crate::fsproto::Target::Path { path, follow } => {
            eat(eat(eat(OFFSET, b"p"), &[u8::from(*follow)]), path)
        }
    };
    (h % CHANGE_SLOTS as u64) as usize
}

const _: () = {
    assert!(CHANGES_OFFSET >= size_of::<ChannelHeader>());
    assert!(CHANGES_OFFSET + CHANGE_SLOTS * 8 <= ERROR_QUEUE_OFFSET);
    assert!(size_of::<ChannelHeader>() == 384);
    assert!(offset_of!(ChannelHeader, magic) == 0);
    assert!(offset_of!(ChannelHeader, abi_version) == 8);
    assert!(offset_of!(ChannelHeader, channel_id) == 12);
    assert!(offset_of!(ChannelHeader, tags) == 16);
    assert!(offset_of!(ChannelHeader, slice_size) == 20);
    assert!(offset_of!(ChannelHeader, dma_offset) == 24);
    assert!(offset_of!(ChannelHeader, dma_size) == 32);
    assert!(offset_of!(ChannelHeader, array_size) == 40);
    assert!(offset_of!(ChannelHeader, error_queue_len) == 48);
    assert!(offset_of!(ChannelHeader, device_cpu) == 52);
    assert!(offset_of!(ChannelHeader, total_size) == 56);
    assert!(offset_of!(ChannelHeader, doorbell) == 64);
    assert!(offset_of!(ChannelHeader, parked) == 128);
    assert!(offset_of!(ChannelHeader, evictions) == 136);
    assert!(offset_of!(ChannelHeader, retired) == 144);
    assert!(offset_of!(ChannelHeader, fs_flags) == 152);
    assert!(offset_of!(ChannelHeader, completion_count) == 192);
    assert!(offset_of!(ChannelHeader, tag_status_register) == 200);
    assert!(offset_of!(ChannelHeader, err_head) == 256);
    assert!(offset_of!(ChannelHeader, err_overflow) == 260);
    assert!(offset_of!(ChannelHeader, err_tail) == 320);
    assert!(offset_of!(ChannelHeader, in_place) == 324);
    assert!(ERROR_QUEUE_OFFSET >= size_of::<ChannelHeader>());
};

/// A command as it sits in a tag slot: eight little-endian 64-bit words written by the client.
/// See [`crate::command::Command`] for the encoding.
#[repr(C)]
pub struct CommandSlot {
    /// The command's words.
    pub words: [AtomicU64; 8],
}

/// One entry of the tag status table (TAGSTATUSTABLE). `result`, `bytes`, `cookie` and
/// `device_ns` are written by the device before it publishes completion in `state`.
#[repr(C, align(64))]
pub struct TagStatus {
    /// The sequence number of the last command completed on this tag: written by the device
    /// for DMA completion and issue-sleep, by the client's forwarding reader for forwarding.
    /// A client waits for it to equal the sequence number of its command. The futex word of
    /// issue-sleep.
    pub state: AtomicU32,
    /// A [`crate::status::Status`] code.
    pub result: AtomicU32,
    /// Client-written: non-zero while a thread sleeps on `state` (issue-sleep), so the device
    /// makes a wake-up system call only when someone sleeps.
    pub waiter: AtomicU32,
    /// Device-written: the sequence number of the command whose completion time
    /// [`TagStatus::eta_ns`] holds.
    pub eta_seq: AtomicU32,
    /// The command's cookie, echoed.
    pub cookie: AtomicU64,
    /// Bytes moved.
    pub bytes: AtomicU64,
    /// Nanoseconds the device spent on the request, from intake to completion.
    pub device_ns: AtomicU64,
    /// Device-written, under an array model: when the command `eta_seq` names will complete,
    /// as the model decided it (`CLOCK_MONOTONIC`, ns), so that a client may spin until then
    /// rather than sleep and pay a wake-up after it. [`ETA_AWAY`] when the command waits for
    /// the host's disk or for a lock, on a thread of the device that sleeps meanwhile.
    /// Written before `eta_seq`.
    pub eta_ns: AtomicU64,
    /// Padding to the end of the cache line.
    pub pad: [AtomicU64; 2],
}

/// [`TagStatus::eta_ns`] of a command that waits for the host's disk (a durability point at
/// the `host` level) or for a lock the device could not take at once: it has no completion
/// time, and takes from tens of microseconds to milliseconds. A client waiting for it had
/// better sleep than spin: the thread that does the work needs a CPU.
pub const ETA_AWAY: u64 = u64::MAX;

/// A tag's command and status, each on its own cache line.
#[repr(C)]
pub struct TagSlot {
    /// Client-written command.
    pub command: CommandSlot,
    /// Completion status.
    pub status: TagStatus,
}

/// Size of one [`TagSlot`].
pub const TAG_SLOT_SIZE: usize = size_of::<TagSlot>();

const _: () = {
    assert!(size_of::<CommandSlot>() == 64);
    assert!(size_of::<TagStatus>() == 64);
    assert!(offset_of!(TagStatus, state) == 0);
    assert!(offset_of!(TagStatus, result) == 4);
    assert!(offset_of!(TagStatus, waiter) == 8);
    assert!(offset_of!(TagStatus, eta_seq) == 12);
    assert!(offset_of!(TagStatus, eta_ns) == 40);
    assert!(offset_of!(TagStatus, cookie) == 16);
    assert!(offset_of!(TagStatus, bytes) == 24);
    assert!(offset_of!(TagStatus, device_ns) == 32);
    assert!(TAG_SLOT_SIZE == 128);
    assert!(offset_of!(TagSlot, command) == 0);
    assert!(offset_of!(TagSlot, status) == 64);
    assert!(TAG_SLOTS_OFFSET + TAGS_PER_CHANNEL * TAG_SLOT_SIZE == DMA_OFFSET);
};

/// One error-queue entry (ERRORQUEUE, Moneta-D §4.4), written by the device.
///
/// Word 0: channel id (bits 0-31), tag (bits 32-47), opcode (bits 48-63).
/// Word 1: status code (bits 0-31), reserved zero (bits 32-63).
/// Word 2: the command's cookie. Word 3: the command's address.
#[repr(C)]
pub struct ErrorEntry {
    /// The entry's words.
    pub words: [AtomicU64; 4],
}

const _: () = {
    assert!(size_of::<ErrorEntry>() == 32);
    assert!(ERROR_QUEUE_OFFSET + ERROR_QUEUE_LEN * size_of::<ErrorEntry>() <= TAG_SLOTS_OFFSET);
};

/// A decoded error-queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorRecord {
    /// Channel the failed command came from.
    pub channel: u32,
    /// Its tag.
    pub tag: u16,
    /// Its opcode, as the client wrote it.
    pub opcode: u16,
    /// Why it failed: a [`crate::status::Status`] code.
    pub status: u32,
    /// Its cookie.
    pub cookie: u64,
    /// Its address.
    pub addr: u64,
}

impl ErrorRecord {
    /// Encodes the record into an entry's four words.
    pub fn to_words(&self) -> [u64; 4] {
        [
            u64::from(self.channel) | (u64::from(self.tag) << 32) | (u64::from(self.opcode) << 48),
            u64::from(self.status),
            self.cookie,
            self.addr,
        ]
    }

    /// Decodes an entry's four words.
    pub fn from_words(w: [u64; 4]) -> Self {
        Self {
            channel: w[0] as u32,
            tag: (w[0] >> 32) as u16,
            opcode: (w[0] >> 48) as u16,
            status: w[1] as u32,
            cookie: w[2],
            addr: w[3],
        }
    }
}

/// Byte offset of tag `tag`'s slot.
pub const fn tag_slot_offset(tag: usize) -> usize {
    TAG_SLOTS_OFFSET + tag * TAG_SLOT_SIZE
}

/// Byte offset of error-queue entry `index` (already reduced modulo [`ERROR_QUEUE_LEN`]).
pub const fn error_entry_offset(index: usize) -> usize {
    ERROR_QUEUE_OFFSET + index * size_of::<ErrorEntry>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_record_round_trips() {
        let r = ErrorRecord {
            channel: 1023,
            tag: 63,
            opcode: 0xbeef,
            status: 4,
            cookie: u64::MAX,
            addr: 1 << 40,
        };
        assert_eq!(ErrorRecord::from_words(r.to_words()), r);
    }

    #[test]
    fn layout_offsets() {
        assert_eq!(tag_slot_offset(0), 0x2000);
        assert_eq!(tag_slot_offset(63), 0x2000 + 63 * 128);
        assert_eq!(error_entry_offset(63), 0x1000 + 63 * 32);
        assert_eq!(channel_size(DEFAULT_DMA_SIZE), 0x4000 + (1 << 20));
    }
}
