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
