//! Channels, device side: the memfd a client shares with the device (Moneta-D §4.2, Table 1).
//!
//! The device creates the memfd, sizes it, seals it against shrinking and growing (so no client
//! can make a device access fault), maps it, writes the identity words, and hands the fd to the
//! client. From then on it reads only the doorbell, the command words (once per command), the
//! waiter flags and the error queue's consumer index, and treats each as hostile: indices are
//! reduced modulo the queue length, and a tail that leaves no room means "full".

use std::io;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use moneta_abi::{
    channel_size, error_entry_offset, tag_slot_offset, ChannelHeader, ErrorEntry, ErrorRecord,
    TagSlot, ABI_VERSION, CHANNEL_MAGIC, DMA_OFFSET, ERROR_QUEUE_LEN, POLLING, TAGS_PER_CHANNEL,
};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// Geometry of a channel's DMA buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaGeometry {
    /// Bytes in the DMA buffer.
    pub dma_size: usize,
    /// Bytes per tag slice.
    pub slice_size: usize,
}

impl DmaGeometry {
    /// Checks the geometry: the slices of all tags fit in the buffer, sizes are multiples of
    /// 4 KiB, and the buffer is at most 64 MiB.
    pub fn validate(&self) -> Result<(), String> {
        let ok = self.slice_size >= 4096
            && self.slice_size.is_multiple_of(4096)
            && self.dma_size.is_multiple_of(4096)
            && self.dma_size <= 64 << 20
            && self.slice_size.checked_mul(TAGS_PER_CHANNEL) == Some(self.dma_size);
        if ok {
            Ok(())
        } else {
            Err(format!(
                "DMA buffer of {} bytes with {}-byte slices: the buffer must be exactly {} slices, \
                 slices a multiple of 4 KiB, the buffer at most 64 MiB",
                self.dma_size, self.slice_size, TAGS_PER_CHANNEL
            ))
        }
    }
}

/// The device's mapping of one channel.
pub struct ChannelMem {
    base: NonNull<u8>,
    size: usize,
    geometry: DmaGeometry,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or raw-pointer
// copies, none of which is tied to the thread that made the mapping.
unsafe impl Send for ChannelMem {}

impl ChannelMem {
    /// Creates, seals and maps a new channel memfd, and writes its identity words. Returns the
    /// mapping and the fd to hand to the client.
    /// `device_cpu` is the CPU the poller is pinned to, if it is.
    pub fn create(
        id: u32,
        geometry: DmaGeometry,
        array_size: u64,
        device_cpu: Option<usize>,
    ) -> io::Result<(Self, OwnedFd)> {
        geometry
            .validate()
            .map_err(|m| io::Error::new(io::ErrorKind::InvalidInput, m))?;
        let size = channel_size(geometry.dma_size);
        let fd = rustix::fs::memfd_create(
            "moneta-channel",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, size as u64)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        // SAFETY: a fresh shared mapping of the whole memfd; nothing else uses this address
        // range, and the seals keep the file from shrinking under it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )?
        };
        let mem = Self {
            base: NonNull::new(ptr.cast()).expect("mmap returns non-null"),
            size,
            geometry,
        };
        let h = mem.header();
        h.abi_version.store(ABI_VERSION, Ordering::Relaxed);
        h.channel_id.store(id, Ordering::Relaxed);
        h.tags.store(TAGS_PER_CHANNEL as u32, Ordering::Relaxed);
        h.slice_size
            .store(geometry.slice_size as u32, Ordering::Relaxed);
        h.dma_offset.store(DMA_OFFSET as u64, Ordering::Relaxed);
        h.dma_size
            .store(geometry.dma_size as u64, Ordering::Relaxed);
        h.array_size.store(array_size, Ordering::Relaxed);
        h.error_queue_len
            .store(ERROR_QUEUE_LEN as u32, Ordering::Relaxed);
        h.total_size.store(size as u64, Ordering::Relaxed);
        h.device_cpu.store(
            device_cpu.map_or(0, |c| u32::try_from(c + 1).unwrap_or(0)),
            Ordering::Relaxed,
        );
        h.parked.store(POLLING, Ordering::Relaxed);
        h.magic.store(CHANNEL_MAGIC, Ordering::Release);
        Ok((mem, fd))
    }

    /// DMA geometry.
    pub fn geometry(&self) -> DmaGeometry {
        self.geometry
    }

    /// The header and registers.
    #[inline]
    pub fn header(&self) -> &ChannelHeader {
        // SAFETY: the mapping is at least one page and page-aligned; `ChannelHeader` holds only
        // atomics, so a shared reference asserts nothing about what the client writes.
        unsafe { &*self.base.as_ptr().cast::<ChannelHeader>() }
    }

    /// Tag `tag`'s slot. Panics if `tag >= TAGS_PER_CHANNEL` (the engine only derives tags from
    /// doorbell bit positions).
    #[inline]
    pub fn slot(&self, tag: usize) -> &TagSlot {
        assert!(tag < TAGS_PER_CHANNEL);
        // SAFETY: in bounds (layout asserted in moneta-abi), aligned to 128 bytes, atomics only.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(tag_slot_offset(tag))
                .cast::<TagSlot>()
        }
    }

    /// Pushes an entry onto the channel's error queue; returns false (and counts an overflow)
    /// when the client has let the queue fill.
    pub fn push_error(&self, rec: &ErrorRecord) -> bool {
        let h = self.header();
        let head = h.err_head.load(Ordering::Relaxed);
        let tail = h.err_tail.load(Ordering::Acquire);
        // The tail is client-written: any value that does not leave room counts as full.
        if head.wrapping_sub(tail) >= ERROR_QUEUE_LEN as u32 {
            h.err_overflow.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let idx = head as usize % ERROR_QUEUE_LEN;
        // SAFETY: idx < ERROR_QUEUE_LEN, so the entry lies inside the error-queue page.
        let e = unsafe {
            &*self
                .base
                .as_ptr()
                .add(error_entry_offset(idx))
                .cast::<ErrorEntry>()
        };
        for (w, v) in e.words.iter().zip(rec.to_words()) {
            w.store(v, Ordering::Relaxed);
        }
        h.err_head.store(head.wrapping_add(1), Ordering::Release);
        true
    }

    /// A raw pointer to `[off, off+len)` of the DMA buffer, or `None` if the range does not fit.
    #[inline]
    pub fn dma(&self, off: u64, len: u64) -> Option<*mut u8> {
        let end = off.checked_add(len)?;
        if end > self.geometry.dma_size as u64 {
            return None;
        }
        // SAFETY: DMA_OFFSET + end <= size, so the pointer stays inside the mapping.
        Some(unsafe { self.base.as_ptr().add(DMA_OFFSET + off as usize) })
    }
}

impl Drop for ChannelMem {
    fn drop(&mut self) {
        // Free the pages now: the client may keep the memfd open, and pages the device wrote
        // are charged to the daemon.
        // SAFETY: the range is exactly this mapping, which nothing references any more.
        let _ = unsafe {
            rustix::mm::madvise(
                self.base.as_ptr().cast(),
                self.size,
                rustix::mm::Advice::LinuxRemove,
            )
        };
        // SAFETY: unmapping exactly the mapping made in `create`; no reference into it outlives
        // `self` (all accessors borrow `self`).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.size) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> DmaGeometry {
        DmaGeometry {
            dma_size: 1 << 20,
            slice_size: 16 << 10,
        }
    }

    #[test]
    fn memfd_is_sealed_against_resizing() {
        let (mem, fd) = ChannelMem::create(3, geo(), 1 << 30, None).unwrap();
        assert_eq!(mem.header().channel_id.load(Ordering::Relaxed), 3);
        assert_eq!(mem.header().device_cpu.load(Ordering::Relaxed), 0);
        assert!(rustix::fs::ftruncate(&fd, 4096).is_err());
        assert!(rustix::fs::ftruncate(&fd, 1 << 30).is_err());
        assert!(rustix::fs::fcntl_add_seals(&fd, SealFlags::WRITE).is_err());
    }

    #[test]
    fn geometry_is_checked() {
        assert!(geo().validate().is_ok());
        let bad = DmaGeometry {
            dma_size: 1 << 20,
            slice_size: 8 << 10,
        };
        assert!(bad.validate().is_err());
        assert!(ChannelMem::create(0, bad, 4096, None).is_err());
    }

    #[test]
    fn dma_ranges_are_bounded() {
        let (mem, _fd) = ChannelMem::create(0, geo(), 1 << 30, Some(5)).unwrap();
        assert_eq!(mem.header().device_cpu.load(Ordering::Relaxed), 6);
        assert!(mem.dma(0, 1 << 20).is_some());
        assert!(mem.dma(1, 1 << 20).is_none());
        assert!(mem.dma(u64::MAX, 2).is_none());
    }

    #[test]
    fn error_queue_overflows_cleanly() {
        let (mem, _fd) = ChannelMem::create(0, geo(), 1 << 30, Some(5)).unwrap();
        let rec = ErrorRecord {
            channel: 0,
            tag: 1,
            opcode: 2,
            status: 3,
            cookie: 4,
            addr: 5,
        };
        for _ in 0..ERROR_QUEUE_LEN {
            assert!(mem.push_error(&rec));
        }
        assert!(!mem.push_error(&rec));
        assert_eq!(mem.header().err_overflow.load(Ordering::Relaxed), 1);
        // A hostile tail far ahead of the head also counts as full, never as room.
        mem.header().err_tail.store(u32::MAX / 2, Ordering::Relaxed);
        assert!(!mem.push_error(&rec));
    }
}
