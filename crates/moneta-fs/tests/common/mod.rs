//! Shared helpers: arrays to format, and an array that "crashes" after a number of stores.
#![allow(dead_code, missing_docs)]

use std::io;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use moneta_device::{MappedArray, Media};
use moneta_fs::{mkfs, Fs, MkfsOptions};

pub const CHUNK: u64 = 64 << 10;

pub fn options() -> MkfsOptions {
    MkfsOptions {
        chunk_size: CHUNK,
        inode_count: Some(256),
        dirent_count: Some(512),
        root_mode: 0o755,
        ..Default::default()
    }
}

/// A volatile array of `size` bytes formatted with [`options`].
pub fn formatted(size: u64) -> Arc<MappedArray> {
    let a = Arc::new(MappedArray::volatile(size).unwrap());
    mkfs(&*a, &options()).unwrap();
    a
}

pub fn mount(a: &Arc<MappedArray>) -> Fs {
    Fs::mount(a.clone() as Arc<dyn Media>).unwrap()
}

/// An array that stops storing after `budget` more writes or zeroings (the process died
/// there): later stores are dropped, as if they never ran.
pub struct Dying {
    pub inner: Arc<MappedArray>,
    pub budget: AtomicI64,
}

impl Dying {
    pub fn new(inner: Arc<MappedArray>, budget: i64) -> Dying {
        Dying {
            inner,
            budget: AtomicI64::new(budget),
        }
    }
    fn alive(&self) -> bool {
        self.budget.fetch_sub(1, Ordering::SeqCst) > 0
    }
    pub fn died(&self) -> bool {
        self.budget.load(Ordering::SeqCst) < 0
    }
}

impl Media for Dying {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn persistent(&self) -> bool {
        true
    }
    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.read(addr, dst, len) }
    }
    unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
        if self.alive() {
            // SAFETY: the caller's contract, passed on.
            unsafe { self.inner.write(addr, src, len) }
        }
    }
    fn flush(&self, _addr: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn zero(&self, addr: u64, len: u64) -> io::Result<()> {
        if self.alive() {
            self.inner.zero(addr, len)
        } else {
            Ok(())
        }
    }
}

/// An array that keeps what a crash of the machine would leave of it: the bytes of each page
/// as last flushed ([`Media::flush`], [`Media::flush_ranges`]; a flush writes whole pages, as
/// `msync` does). [`HostCrash::crash`] makes the image a crash would leave: each page changed
/// since its last flush either as then or, when the kernel happened to write it back, as now.
pub struct HostCrash {
    pub inner: Arc<MappedArray>,
    durable: std::sync::Mutex<Vec<u8>>,
    /// Calls of `flush` and `flush_ranges`: each is one wait for the disk.
    pub flushes: std::sync::atomic::AtomicU64,
}

pub const PAGE: u64 = 4096;

impl HostCrash {
    /// Over `inner`, whose present contents count as durable.
    pub fn new(inner: Arc<MappedArray>) -> HostCrash {
        let mut d = vec![0u8; inner.size() as usize];
        // SAFETY: `d` holds the whole array.
        unsafe { inner.read(0, d.as_mut_ptr(), d.len()) };
        HostCrash {
            inner,
            durable: std::sync::Mutex::new(d),
            flushes: Default::default(),
        }
    }

    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::SeqCst)
    }

    fn keep(&self, addr: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = addr / PAGE * PAGE;
        let end = (addr + len).div_ceil(PAGE) * PAGE;
        let end = end.min(self.inner.size());
        let mut d = self.durable.lock().unwrap();
        // SAFETY: the range lies inside the array and inside `d`.
        unsafe {
            self.inner.read(
                first,
                d[first as usize..end as usize].as_mut_ptr(),
                (end - first) as usize,
            )
        };
    }

    /// The image a crash of the machine would leave now, as a new volatile array: each page
    /// that differs from its flushed bytes is kept as it is now with probability `kept`.
    pub fn crash(&self, seed: u64, kept: f64) -> Arc<MappedArray> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let size = self.inner.size();
        let mut now = vec![0u8; size as usize];
        // SAFETY: `now` holds the whole array.
        unsafe { self.inner.read(0, now.as_mut_ptr(), now.len()) };
        let d = self.durable.lock().unwrap();
        let out = Arc::new(MappedArray::volatile(size).unwrap());
        for p in 0..(size / PAGE) as usize {
            let r = p * PAGE as usize..(p + 1) * PAGE as usize;
            let page = if now[r.clone()] != d[r.clone()] && !rng.gen_bool(kept) {
                &d[r]
            } else {
                &now[r]
            };
            // SAFETY: one page, inside the array.
            unsafe { out.write((p as u64) * PAGE, page.as_ptr(), PAGE as usize) };
        }
        out
    }
}

impl Media for HostCrash {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn persistent(&self) -> bool {
        true
    }
    unsafe fn read(&self, addr: u64, dst: *mut u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.read(addr, dst, len) }
    }
    unsafe fn write(&self, addr: u64, src: *const u8, len: usize) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.write(addr, src, len) }
    }
    fn flush(&self, addr: u64, len: u64) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.keep(addr, len);
        Ok(())
    }
    fn flush_ranges(&self, ranges: &[(u64, u64)]) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        for &(a, l) in ranges {
            self.keep(a, l);
        }
        Ok(())
    }
    fn zero(&self, addr: u64, len: u64) -> io::Result<()> {
        self.inner.zero(addr, len)
    }
}
