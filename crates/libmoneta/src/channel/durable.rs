//! The daemon's durability page (docs/abi.md §2.10, `OP_FS_DURABLE`), mapped for reading the
//! first time a file of this channel's connection needs it: at the `host` level it tells
//! whether an `fsync` whose data the client made durable itself (a file read and written in
//! place), or that has no data (a directory's), has any metadata left to make durable.

use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use moneta_abi::{DurablePage, DURABLE_MAGIC, DURABLE_PAGE_SIZE, FS_DURABLE_PAGE};
use rustix::mm::{MapFlags, ProtFlags};

use super::Channel;

/// A read-only mapping of the page.
pub(crate) struct DurableMap(NonNull<DurablePage>);

// SAFETY: the mapping is read through atomics only.
unsafe impl Send for DurableMap {}
// SAFETY: as above.
unsafe impl Sync for DurableMap {}

impl Drop for DurableMap {
    fn drop(&mut self) {
        // SAFETY: the mapping `Channel::durable_page` made; nothing reads it after `self`.
        let _ = unsafe { rustix::mm::munmap(self.0.as_ptr().cast(), DURABLE_PAGE_SIZE) };
    }
}

impl Channel {
    /// The durability page, if the daemon hands one out (`FS_DURABLE_PAGE` in the header's
    /// `fs_flags`): asked for on the first call, and never again if it could not be had.
    pub(crate) fn durable_page(&self) -> Option<&DurablePage> {
        let map = self.durable.get_or_init(|| {
            if self.header().fs_flags.load(Ordering::Acquire) & FS_DURABLE_PAGE == 0 {
                return None;
            }
            let fd = self.control().fs_durable().ok()?;
            if rustix::fs::fstat(&fd).ok()?.st_size < DURABLE_PAGE_SIZE as i64 {
                return None;
            }
            // SAFETY: a new read-only shared mapping of the page, kept until the channel goes.
            let p = unsafe {
                rustix::mm::mmap(
                    std::ptr::null_mut(),
                    DURABLE_PAGE_SIZE,
                    ProtFlags::READ,
                    MapFlags::SHARED,
                    &fd,
                    0,
                )
                .ok()?
            };
            let map = DurableMap(NonNull::new(p.cast())?);
            // SAFETY: just mapped, page-aligned and a page long.
            let page = unsafe { map.0.as_ref() };
            (page.magic.load(Ordering::SeqCst) == DURABLE_MAGIC).then_some(map)
        });
        // SAFETY: the mapping lives as long as the channel that holds it.
        map.as_ref().map(|m| unsafe { m.0.as_ref() })
    }

    /// Whether every metadata change committed so far is durable, by the durability page:
    /// `committed` loaded, then `durable` (both only grow). `false` without a page.
    pub(crate) fn metadata_durable(&self) -> bool {
        self.durable_page().is_some_and(|p| {
            let committed = p.committed.load(Ordering::SeqCst);
            p.durable.load(Ordering::SeqCst) >= committed
        })
    }
}
