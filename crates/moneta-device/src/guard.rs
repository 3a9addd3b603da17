//! A guard against pages taken from under the array's mapping.
//!
//! A file's pages handed to processes as a file of the host's file system (the segments of a
//! persistent array: see [`crate::Media::overlay`]) can be shortened by any process that holds
//! them open for writing, and a load or store of the daemon past the new end would raise
//! `SIGBUS` and kill it. Inside a guarded range (a piece of such a file shown in the array),
//! the handler here maps a page of zeros where the fault was, instead, and the access goes on:
//! the process that shortened the file sees its own file so, and nothing else changes. Faults
//! anywhere else, the array's own pages included, keep the disposition they had.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// Guarded ranges: (start, length) pairs; length 0 is a free slot.
const SLOTS: usize = 65_536;
static RANGES: [(AtomicUsize, AtomicUsize); SLOTS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; SLOTS];
/// Faults the guard has answered.
static FAULTS: AtomicUsize = AtomicUsize::new(0);
static INSTALL: Once = Once::new();
/// The disposition of `SIGBUS` before the guard's, which faults outside the guarded ranges
/// go back to (the standard library's handler of stack overflows, or the default).
static PREVIOUS: std::sync::OnceLock<libc::sigaction> = std::sync::OnceLock::new();

/// Guards `[start, start + len)` (a piece of the array's mapping) until [`unguard`]. Returns
/// false when every slot is taken (the range is then not guarded: the caller must not show
/// the piece).
pub fn guard(start: usize, len: usize) -> bool {
    INSTALL.call_once(install);
    for (s, l) in &RANGES {
        if l.load(Ordering::Acquire) == 0
            && s.compare_exchange(0, start, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            l.store(len, Ordering::Release);
            return true;
        }
    }
    false
}

/// Stops guarding every range inside `[start, start + len)`.
pub fn unguard(start: usize, len: usize) {
    let end = start.saturating_add(len);
    for (s, l) in &RANGES {
        let (rs, rl) = (s.load(Ordering::Acquire), l.load(Ordering::Acquire));
        if rl != 0 && rs >= start && rs + rl <= end {
            l.store(0, Ordering::Release);
            s.store(0, Ordering::Release);
        }
    }
}

/// Faults answered with a page of zeros so far.
pub fn faults() -> usize {
    FAULTS.load(Ordering::Relaxed)
}

fn install() {
    // SAFETY: installing a handler that only makes async-signal-safe calls (mmap, sigaction).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old);
        let _ = PREVIOUS.set(old);
        libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(_sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for (s, l) in &RANGES {
        let (start, len) = (s.load(Ordering::Acquire), l.load(Ordering::Acquire));
        if len != 0 && addr >= start && addr < start + len {
            let page = addr & !4095;
            // SAFETY: replaces one page of a guarded piece of the array's mapping with zeros;
            // mmap is async-signal-safe.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                FAULTS.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
    // Not ours: the disposition from before, when the access runs again.
    // SAFETY: setting a signal's disposition is async-signal-safe; PREVIOUS was set before
    // this handler was installed.
    unsafe {
        match PREVIOUS.get() {
            Some(old) => libc::sigaction(libc::SIGBUS, old, std::ptr::null_mut()),
            None => {
                libc::signal(libc::SIGBUS, libc::SIG_DFL);
                0
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_file_shortened_under_a_guarded_mapping_reads_as_zeros() {
        let path = std::env::temp_dir().join(format!("moneta-guard-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all(&[7u8; 8192]).unwrap();
        // SAFETY: a new shared mapping of our own file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(guard(p as usize, 8192));
        f.set_len(4096).unwrap();
        let before = faults();
        // SAFETY: inside the mapping; the second page is past the file's end now.
        let (a, b) = unsafe {
            (
                std::ptr::read_volatile(p.cast::<u8>()),
                std::ptr::read_volatile(p.cast::<u8>().add(4096)),
            )
        };
        assert_eq!((a, b), (7, 0));
        assert_eq!(faults(), before + 1);
        unguard(p as usize, 8192);
        // SAFETY: our own mapping.
        unsafe { libc::munmap(p, 8192) };
    }
}
