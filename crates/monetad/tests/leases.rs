//! Lock leases (docs/abi.md §3.8) through a real daemon: a process that alone has a file open
//! places and removes its POSIX locks in its channel, and everything that lets another owner
//! see the file's locks takes them back first, exactly: another open, a fork, a racing
//! holder, a holder that stalls in a change or writes garbage in its lease.
//!
//! Separate connections play separate processes. The tests run one at a time: they count the
//! lock calls this process answered in leases, which is one number for the whole process.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use libmoneta::{File, LockCmd, LockInfo, LockKind, LockType, Moneta};
use moneta_abi::control::errno;
use moneta_abi::{
    lease_parts, lease_word, LeaseArea, LEASE_BUSY, LEASE_GONE, LEASE_HELD, LEASE_OFFSET,
    LEASE_SEIZED, LEASE_WRITE,
};

use LockKind::{Ofd, Posix};
use LockType::{Read, Unlock, Write};

fn test(f: &File, ty: LockType, start: u64, len: u64) -> Option<LockInfo> {
    f.lock(Posix, LockCmd::Test, ty, start, len, false)
        .expect("lock test")
}

fn held(ty: LockType, start: u64, len: u64) -> Option<LockInfo> {
    Some(LockInfo {
        ty,
        pid: std::process::id() as i32,
        start,
        len,
    })
}

/// The lease area of `m`'s channel, mapped again as another writer of it would.
struct Area(ChannelMap);

impl Area {
    fn of(m: &Moneta) -> Area {
        Area(ChannelMap::of(m))
    }

    fn area(&self) -> &LeaseArea {
        self.0.at(LEASE_OFFSET)
    }

    /// The codes of the three slots' state words.
    fn codes(&self) -> Vec<u32> {
        self.area()
            .slots
            .iter()
            .map(|s| lease_parts(s.state.load(Ordering::Acquire)).0)
            .collect()
    }
}

#[test]
fn a_lone_process_keeps_its_locks_in_a_lease_and_another_open_takes_them_back() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let fa = a.open("/db", &rw()).unwrap();
    let area = Area::of(&a);
    assert_eq!(area.area().wanted.load(Ordering::Acquire), 1);

    // The first set asks the daemon, which leaves the file's locks with the process.
    set(&fa, Posix, Write, 0, 100).unwrap();
    assert!(area.codes().contains(&LEASE_HELD), "{:?}", area.codes());
    let before = libmoneta::locks_leased();
    set(&fa, Posix, Read, 200, 100).unwrap();
    set(&fa, Posix, Unlock, 50, 10).unwrap();
    set(&fa, Posix, Write, 300, 1).unwrap();
    assert_eq!(test(&fa, Write, 0, 0), None);
    assert_eq!(
        libmoneta::locks_leased(),
        before + 4,
        "answered in the lease"
    );

    // Another process opens the file: the locks are back in the table, as placed.
    let b = Moneta::connect(&d.socket).unwrap();
    let fb = b.open("/db", &rw()).unwrap();
    assert!(area.codes().contains(&LEASE_GONE), "{:?}", area.codes());
    assert_eq!(test(&fb, Write, 0, 0), held(Write, 0, 50));
    assert_eq!(test(&fb, Write, 50, 0), held(Write, 60, 40));
    assert_eq!(test(&fb, Write, 100, 0), held(Read, 200, 100));
    assert_eq!(test(&fb, Read, 300, 0), held(Write, 300, 1));
    assert_eq!(test(&fb, Read, 200, 100), None);
    assert_eq!(set(&fb, Posix, Write, 299, 1), Err(errno::EAGAIN));
    set(&fb, Posix, Read, 250, 10).unwrap();

    // With the file open twice, A asks the daemon from now on, and conflicts are seen.
    let asked = libmoneta::locks_leased();
    assert_eq!(set(&fa, Posix, Write, 255, 1), Err(errno::EAGAIN));
    set(&fa, Posix, Unlock, 0, 0).unwrap();
    set(&fb, Posix, Write, 0, 100).unwrap();
    assert_eq!(libmoneta::locks_leased(), asked);

    // Once B has closed, A may get a lease again; closing drops its locks with it.
    fb.close().unwrap();
    set(&fa, Posix, Write, 0, 10).unwrap();
    set(&fa, Posix, Write, 20, 10).unwrap();
    assert!(libmoneta::locks_leased() > asked);
    fa.close().unwrap();
    let fb = b.open("/db", &rw()).unwrap();
    assert_eq!(test(&fb, Write, 0, 0), None);
}

#[test]
fn a_second_handle_other_kinds_and_forks_take_the_lease_back() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let f = a.open("/f", &rw()).unwrap();
    set(&f, Posix, Write, 0, 10).unwrap();
    set(&f, Posix, Write, 100, 10).unwrap();

    // An OFD lock is the daemon's: it takes the lease back, and then POSIX and OFD locks of
    // the process conflict as they do in the table.
    set(&f, Ofd, Read, 50, 10).unwrap();
    assert_eq!(set(&f, Posix, Write, 55, 1), Err(errno::EAGAIN));
    set(&f, Ofd, Unlock, 0, 0).unwrap();

    // A second open of the file in the same process: the second handle's OFD lock sees the
    // process's POSIX locks.
    set(&f, Posix, Write, 200, 10).unwrap();
    let g = a.open("/f", &rw()).unwrap();
    assert_eq!(set(&g, Ofd, Write, 205, 1), Err(errno::EAGAIN));
    assert_eq!(set(&g, Ofd, Write, 105, 1), Err(errno::EAGAIN));
    g.close().unwrap();
    // Closing g dropped the process's POSIX locks (POSIX: any close of the file does).
    let b = Moneta::connect(&d.socket).unwrap();
    let fb = b.open("/f", &rw()).unwrap();
    assert_eq!(test(&fb, Write, 0, 0), None);

    // A fork: the child sees the parent's lock at once.
    let f = a.open("/g", &rw()).unwrap();
    set(&f, Posix, Write, 0, 1).unwrap();
    set(&f, Posix, Write, 5, 1).unwrap();
    let parent = std::process::id() as i32;
    // SAFETY: the child runs a few checks and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = match f.lock(Posix, LockCmd::Test, Read, 5, 1, false) {
            Ok(Some(l)) if l.pid == parent && l.start == 5 && l.ty == Write => 0,
            other => {
                eprintln!("child saw {other:?}");
                1
            }
        };
        // SAFETY: ends the child without the harness.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
}

#[test]
fn a_racing_holder_never_shares_an_exclusive_lock() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let fa = Arc::new(a.open("/race", &rw()).unwrap());
    let inside = Arc::new(AtomicU32::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // A takes and drops a write lock on byte 0 as fast as it can, in and out of its lease.
    let holder = {
        let (fa, inside, stop) = (fa.clone(), inside.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                if set(&fa, Posix, Write, 0, 1).is_ok() {
                    assert_eq!(inside.swap(1, Ordering::SeqCst), 0, "A inside with B");
                    std::hint::spin_loop();
                    inside.store(0, Ordering::SeqCst);
                    set(&fa, Posix, Unlock, 0, 1).unwrap();
                    rounds += 1;
                }
            }
            rounds
        })
    };
    // B opens the file (taking the lease back mid-race), takes the lock, checks, closes:
    // each close lets A have a lease again.
    let b = Moneta::connect(&d.socket).unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut entered = 0;
    while Instant::now() < deadline || entered < 20 {
        let fb = b.open("/race", &rw()).unwrap();
        fb.lock_wait(Posix, Write, 0, 1).unwrap();
        assert_eq!(inside.swap(2, Ordering::SeqCst), 0, "B inside with A");
        std::thread::sleep(Duration::from_micros(50));
        inside.store(0, Ordering::SeqCst);
        fb.close().unwrap();
        entered += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = holder.join().unwrap();
    assert!(rounds > 0 && entered >= 20, "A {rounds}, B {entered}");
}

#[test]
fn a_holder_that_stalls_or_scribbles_is_seized_after_a_bounded_wait() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let fa = a.open("/x", &rw()).unwrap();
    let area = Area::of(&a);
    set(&fa, Posix, Write, 0, 10).unwrap();
    let i = area.codes().iter().position(|&c| c == LEASE_HELD).unwrap();
    let slot = &area.area().slots[i];

    // A writes a change into the other list and then stalls with the slot taken.
    let (_, list, len) = lease_parts(slot.state.load(Ordering::Acquire));
    let e = &slot.lists[1 - list][0];
    e.start.store(1000, Ordering::Relaxed);
    e.end.store(1009, Ordering::Relaxed);
    e.mode.store(LEASE_WRITE, Ordering::Relaxed);
    slot.state.store(
        lease_word(LEASE_BUSY, list as u32, len as u32),
        Ordering::Release,
    );
    let b = Moneta::connect(&d.socket).unwrap();
    let t = Instant::now();
    let fb = b.open("/x", &rw()).unwrap();
    let waited = t.elapsed();
    assert!(
        waited >= monetad::manager::RECALL_WAIT / 2 && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(
        lease_parts(slot.state.load(Ordering::Acquire)).0,
        LEASE_SEIZED
    );
    // The list current before the stalled change counts; the change does not.
    assert_eq!(test(&fb, Write, 0, 0), held(Write, 0, 10));
    assert_eq!(test(&fb, Write, 100, 0), None);
    // A asks the daemon, and the seized slot is not granted again (the file's next lease,
    // once B has closed it, is in another slot).
    fb.close().unwrap();
    set(&fa, Posix, Unlock, 0, 0).unwrap();
    set(&fa, Posix, Write, 0, 1).unwrap();
    assert_eq!(
        lease_parts(slot.state.load(Ordering::Acquire)).0,
        LEASE_SEIZED
    );
    assert_eq!(area.codes().iter().filter(|&&c| c == LEASE_HELD).count(), 1);

    // Garbage in a held lease: lengths past the list, modes that are no lock, ranges
    // backwards or past the largest offset. Only the entries that are locks count.
    let fa2 = a.open("/y", &rw()).unwrap();
    set(&fa2, Posix, Read, 0, 1).unwrap();
    let slot = area
        .area()
        .slots
        .iter()
        .find(|s| {
            s.handle.load(Ordering::Relaxed) == fa2.handle()
                && lease_parts(s.state.load(Ordering::Acquire)).0 == LEASE_HELD
        })
        .expect("a lease on /y");
    let bad = [
        (5u64, 1u64, LEASE_WRITE),
        (10, 19, 77),
        (u64::MAX - 1, u64::MAX, LEASE_WRITE),
        (40, 49, LEASE_WRITE),
    ];
    for (e, (s, end, mode)) in slot.lists[0].iter().zip(bad) {
        e.start.store(s, Ordering::Relaxed);
        e.end.store(end, Ordering::Relaxed);
        e.mode.store(mode, Ordering::Relaxed);
    }
    slot.state
        .store(lease_word(LEASE_HELD, 0, 255), Ordering::Release);
    let fb2 = b.open("/y", &rw()).unwrap();
    assert_eq!(test(&fb2, Write, 0, 0), held(Write, 40, 10));
    assert_eq!(test(&fb2, Write, 0, 40), None);
    set(&fb2, Posix, Write, 0, 40).unwrap();
    drop(fa);
}

#[test]
fn a_lease_too_small_for_the_locks_gives_them_all_back() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let fa = a.open("/many", &rw()).unwrap();
    // Eleven disjoint locks, of types in turn: the list holds ten, so the last one asks the
    // daemon, which takes the lease back first and keeps them all in its table.
    for i in 0..11u64 {
        let ty = if i % 2 == 0 { Write } else { Read };
        set(&fa, Posix, ty, i * 10, 5).unwrap();
    }
    let b = Moneta::connect(&d.socket).unwrap();
    let fb = b.open("/many", &rw()).unwrap();
    for i in 0..11u64 {
        let ty = if i % 2 == 0 { Write } else { Read };
        assert_eq!(test(&fb, Write, i * 10, 5), held(ty, i * 10, 5), "lock {i}");
        assert_eq!(test(&fb, Write, i * 10 + 5, 5), None);
    }
}
