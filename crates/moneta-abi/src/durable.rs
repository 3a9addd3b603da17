//! The durability page (docs/abi.md §2.10, "The durability page"): one page of memory the
//! daemon shares, read-only, with every client that asks (`OP_FS_DURABLE`), in which it shows
//! how far the file system's metadata transactions are committed and how far they are durable
//! on the host's disk, at the `host` durability level.
//!
//! Every metadata call that has returned (through any connection) committed its transaction
//! first, and the daemon raises `committed` to that transaction's sequence number before the
//! call answers. It raises `durable` once a durability point has made every transaction up to
//! a number durable. A client whose own data for an `fsync` is durable already (the pages of a
//! file it maps, written back by its own `msync`) has nothing left to ask the daemon for when,
//! having loaded `committed` before it made its data durable, it then loads `durable` and finds
//! it at least as large: every metadata change that completed before its call is durable.
//! Both sides use sequentially consistent accesses.

use core::mem::{offset_of, size_of};
use core::sync::atomic::AtomicU64;

/// Bytes in the durability page's memfd.
pub const DURABLE_PAGE_SIZE: usize = 4096;

/// [`DurablePage::magic`]: the bytes `"MONETADU"`.
pub const DURABLE_MAGIC: u64 = u64::from_le_bytes(*b"MONETADU");

/// The durability page's words, at the start of its memfd (the rest of the page is zero).
#[repr(C)]
pub struct DurablePage {
    /// [`DURABLE_MAGIC`], written before the page is handed out.
    pub magic: AtomicU64,
    /// The sequence number of the last metadata transaction committed that an `fsync` must
    /// keep: every metadata call that has returned made a transaction at or below it (or
    /// none). The daemon's frees of removed files' space, which a crash leaves as orphans
    /// that the next start frees, do not raise it.
    pub committed: AtomicU64,
    /// Every transaction at or below this sequence number is durable on the host's disk.
    /// Never above `committed` when both are loaded in that order.
    pub durable: AtomicU64,
}

const _: () = {
    assert!(offset_of!(DurablePage, magic) == 0);
    assert!(offset_of!(DurablePage, committed) == 8);
    assert!(offset_of!(DurablePage, durable) == 16);
    assert!(size_of::<DurablePage>() == 24);
};
