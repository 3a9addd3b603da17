//! The durability page (`OP_FS_DURABLE`, docs/abi.md §2.10): one page the daemon writes and
//! every client that asks maps for reading, showing how far the file system's metadata
//! transactions are committed and durable at the `host` level. The file system's journal
//! raises its words as it commits and as durability points end
//! ([`moneta_fs::Progress`]), so a client that made a mapped file's data durable itself can
//! tell whether its `fsync` has any metadata left to make durable.
//!
//! The memfd is sealed against writes made after the daemon's own mapping
//! (`F_SEAL_FUTURE_WRITE`), against resizing, and against further seals: no client, whatever
//! descriptor of it it gets or reopens, can change a word another client reads.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use moneta_abi::{DurablePage, DURABLE_MAGIC, DURABLE_PAGE_SIZE};
use rustix::fs::{MemfdFlags, Mode, OFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// The daemon's durability page: its memfd and the daemon's writable mapping of it.
pub(crate) struct Durable {
    fd: OwnedFd,
    page: NonNull<DurablePage>,
}

// SAFETY: the mapping is shared memory that the words' atomics alone touch.
unsafe impl Send for Durable {}
// SAFETY: as above.
unsafe impl Sync for Durable {}

impl Durable {
    /// A new page, its magic written, sealed.
    pub fn create() -> io::Result<Durable> {
        let fd = rustix::fs::memfd_create(
            "moneta-durable",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::fchmod(&fd, Mode::RUSR)?;
        rustix::fs::ftruncate(&fd, DURABLE_PAGE_SIZE as u64)?;
        // SAFETY: a fresh shared mapping of the whole memfd, which the seals below keep from
        // shrinking; it is never unmapped while `Durable` lives (and `Drop` unmaps it).
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                DURABLE_PAGE_SIZE,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let page = NonNull::new(p.cast::<DurablePage>()).expect("mmap returns non-null");
        // Only this mapping may write from now on.
        rustix::fs::fcntl_add_seals(
            &fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
        )?;
        let d = Durable { fd, page };
        d.words().magic.store(DURABLE_MAGIC, Ordering::SeqCst);
        Ok(d)
    }

    fn words(&self) -> &DurablePage {
        // SAFETY: the mapping is page-aligned, as long as the page, and lives as `self` does.
        unsafe { self.page.as_ref() }
    }

    /// A descriptor for a client: a new open file description of the memfd, for reading only.
    pub fn give(&self) -> io::Result<OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        Ok(rustix::fs::open(
            path.as_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }
}

impl moneta_fs::Progress for Durable {
    fn committed(&self, seq: u64) {
        self.words().committed.fetch_max(seq, Ordering::SeqCst);
    }

    fn durable(&self, seq: u64) {
        self.words().durable.fetch_max(seq, Ordering::SeqCst);
    }
}

impl Drop for Durable {
    fn drop(&mut self) {
        // SAFETY: the mapping `create` made; nothing uses it after `self`.
        let _ = unsafe { rustix::mm::munmap(self.page.as_ptr().cast(), DURABLE_PAGE_SIZE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moneta_fs::Progress;
    use std::os::fd::AsFd;

    /// A shared mapping of the page through `fd` with `prot`.
    fn map(fd: impl AsFd, prot: ProtFlags) -> rustix::io::Result<*mut std::ffi::c_void> {
        // SAFETY: a new mapping the kernel places; the callers unmap it or never get one.
        unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                DURABLE_PAGE_SIZE,
                prot,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
    }

    #[test]
    fn clients_get_a_page_they_can_read_and_never_write() {
        let d = Durable::create().unwrap();
        d.committed(7);
        d.durable(5);
        let fd = d.give().unwrap();
        let p = map(&fd, ProtFlags::READ).unwrap();
        // SAFETY: a page-aligned read-only mapping of the page, unmapped below.
        let w = unsafe { &*p.cast::<DurablePage>() };
        assert_eq!(w.magic.load(Ordering::SeqCst), DURABLE_MAGIC);
        assert_eq!(w.committed.load(Ordering::SeqCst), 7);
        assert_eq!(w.durable.load(Ordering::SeqCst), 5);
        d.durable(7);
        assert_eq!(
            w.durable.load(Ordering::SeqCst),
            7,
            "the client sees the daemon's stores"
        );
        // SAFETY: unmaps the mapping above, which `w` no longer reads.
        unsafe { rustix::mm::munmap(p, DURABLE_PAGE_SIZE).unwrap() };

        // No writable mapping, no write, no reopening for writing, no resizing.
        let rw = ProtFlags::READ | ProtFlags::WRITE;
        assert!(
            map(&fd, rw).is_err(),
            "a read-only descriptor gave a writable mapping"
        );
        assert!(rustix::io::write(&fd, b"x").is_err());
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Ok(again) = rustix::fs::open(path.as_str(), OFlags::RDWR, Mode::empty()) {
            // (Root may reopen it so.) The seal still refuses a writable mapping and writes.
            assert!(
                map(&again, rw).is_err(),
                "a reopened descriptor gave a writable mapping"
            );
            assert!(rustix::io::pwrite(&again, b"x", 8).is_err());
            assert!(rustix::fs::ftruncate(&again, 0).is_err());
        }
        assert_eq!(d.words().committed.load(Ordering::SeqCst), 7);
    }
}
