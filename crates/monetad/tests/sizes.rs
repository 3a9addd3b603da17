//! Size leases (docs/abi.md §3.9) through a real daemon: a process appending to a file grows
//! it inside the room the daemon allocated past its end with no extend call, everyone else
//! sees the size at once, the room goes back at the last close, and nothing a client writes
//! in its slot grows a file past its room or another file at all.
//!
//! Separate connections play separate processes. The tests run one at a time: they count the
//! writes this process made in leases, which is one number for the whole process.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use libmoneta::{Moneta, OpenOptions};
use moneta_abi::{size_word, SizeLeaseArea, SIZE_LEASE_OFFSET};

/// The size-lease area of `m`'s channel, mapped again as another writer of it would.
struct Area(ChannelMap);

impl Area {
    fn of(m: &Moneta) -> Area {
        Area(ChannelMap::of(m))
    }

    fn area(&self) -> &SizeLeaseArea {
        self.0.at(SIZE_LEASE_OFFSET)
    }

    /// The slot granted now, if one is: (index, generation, limit).
    fn granted(&self) -> Option<(usize, u64, u64)> {
        self.area().slots.iter().enumerate().find_map(|(i, s)| {
            let g = s.generation.load(Ordering::SeqCst);
            let limit = s.limit.load(Ordering::SeqCst);
            (g & 1 == 0 && limit > 0).then_some((i, g, limit))
        })
    }
}

/// Open for writing only (creating): a file's first growth then gets no room.
fn wo() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.write(true).create(true);
    o
}

fn bytes(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| seed.wrapping_add((i % 251) as u8)).collect()
}

fn read_all(m: &Moneta, path: &str) -> Vec<u8> {
    let f = m.open(path, OpenOptions::new().read(true)).unwrap();
    let size = f.stat().unwrap().size as usize;
    let mut out = vec![0u8; size];
    assert_eq!(f.read_at(&mut out, 0).unwrap(), size);
    out
}

const CHUNK: u64 = 4096;

/// `st_blocks` of a file of `size` bytes with no room past its end.
fn whole(size: u64) -> u64 {
    size.div_ceil(CHUNK) * CHUNK / 512
}

/// Waits until `path` holds no room past its end: the last close of a file with room leaves
/// the freeing to the daemon's releaser thread, a moment later.
fn room_gone(m: &Moneta, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = m.stat(path).unwrap();
        if st.blocks == whole(st.size) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the room never went back: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Entry point of child processes started with `spawn_role`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    match role.as_str() {
        // Appends `args[2]` records to `args[1]` and dies without closing anything.
        "append-and-die" => {
            let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
            let f = m.open(&args[1], &rw()).unwrap();
            let n: u8 = args[2].parse().unwrap();
            let mut at = 0u64;
            for i in 0..n {
                let rec = bytes(i, 700);
                f.write_at(&rec, at).unwrap();
                at += rec.len() as u64;
            }
            assert!(libmoneta::sizes_leased() > 0, "no append went in the room");
            // SAFETY: `kill` on this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!();
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn appends_grow_a_file_in_its_room_with_no_call_and_every_reader_sees_them_at_once() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    assert_eq!(Area::of(&a).area().wanted.load(Ordering::Acquire), 1);
    // A file opened for reading and writing (a journal) gets room at its first growth.
    let f = a.open("/journal", &rw()).unwrap();
    let extends = a.stats().extends;
    let mut want = bytes(1, 512);
    f.write_at(&want, 0).unwrap();
    assert_eq!(a.stats().extends, extends + 1);
    assert!(Area::of(&a).granted().is_some());
    // B keeps an answer about the file: the growth below must make B ask again.
    assert_eq!(b.stat("/journal").unwrap().size, 512);
    let grown = libmoneta::sizes_leased();
    let rec = bytes(2, 4104);
    f.write_at(&rec, 512).unwrap();
    want.extend_from_slice(&rec);
    assert_eq!(b.stat("/journal").unwrap().size, want.len() as u64);
    for i in 0..4u8 {
        let rec = bytes(10 + i, 1000 + i as usize * 7);
        f.write_at(&rec, want.len() as u64).unwrap();
        want.extend_from_slice(&rec);
        // Every other connection sees the new size and bytes at once, as after an extend.
        assert_eq!(b.stat("/journal").unwrap().size, want.len() as u64);
    }
    assert_eq!(
        a.stats().extends,
        extends + 1,
        "no extend call inside the room"
    );
    assert_eq!(libmoneta::sizes_leased(), grown + 5);
    assert_eq!(f.stat().unwrap().size, want.len() as u64);
    assert_eq!(read_all(&b, "/journal"), want);
    let mut back = vec![0u8; want.len()];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), want.len());
    assert_eq!(back, want);

    // The room is the file's own space until the last close gives it back.
    let size = want.len() as u64;
    assert!(b.stat("/journal").unwrap().blocks > whole(size));
    let other = b.open("/journal", OpenOptions::new().read(true)).unwrap();
    f.close().unwrap();
    assert!(
        b.stat("/journal").unwrap().blocks > whole(size),
        "another handle is open"
    );
    other.close().unwrap();
    room_gone(&b, "/journal");
    assert_eq!(b.stat("/journal").unwrap().size, size);
    assert_eq!(read_all(&b, "/journal"), want);

    // Opened for writing only, one append per open (a log written by `>>`) gets no room to
    // give back; a file opened again gets room at its second growth, and the third is inside
    // it.
    let c = Moneta::connect(&d.socket).unwrap();
    let g = c.open("/journal", &wo()).unwrap();
    g.write_at(b"w", size).unwrap();
    assert_eq!(Area::of(&c).granted(), None);
    g.close().unwrap();
    let st = c.stat("/journal").unwrap();
    assert_eq!((st.size, st.blocks), (size + 1, whole(size + 1)));
    let g = c.open("/journal", &wo()).unwrap();
    let e = c.stats().extends;
    g.write_at(b"x", size + 1).unwrap();
    g.write_at(b"y", size + 2).unwrap();
    assert_eq!(c.stats().extends, e + 2);
    g.write_at(b"z", size + 3).unwrap();
    assert_eq!(c.stats().extends, e + 2, "the third growth is in the room");
    assert_eq!(b.stat("/journal").unwrap().size, size + 4);
    g.close().unwrap();
    room_gone(&c, "/journal");
}

#[test]
fn a_truncate_elsewhere_ends_the_grant_and_the_next_append_asks_again() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let area = Area::of(&a);
    let f = a.open("/log", &rw()).unwrap();
    f.write_at(&bytes(1, 100), 0).unwrap();
    f.write_at(&bytes(2, 100), 100).unwrap();
    let (_, _, limit) = area.granted().expect("the second append got a grant");
    assert!(limit >= 200 + 16 * 1024, "room of at least 16 KiB: {limit}");
    f.write_at(&bytes(3, 100), 200).unwrap();
    assert_eq!(b.stat("/log").unwrap().size, 300);

    // Another process shortens the file: the grant ends (what was published counts first).
    b.truncate("/log", 150).unwrap();
    assert_eq!(area.granted(), None, "the grant ended");
    assert_eq!(b.stat("/log").unwrap().size, 150);
    let extends = a.stats().extends;
    f.write_at(&bytes(4, 50), 400).unwrap();
    assert!(a.stats().extends > extends, "past the end again: an extend");
    let mut want = bytes(1, 100);
    want.extend_from_slice(&bytes(2, 50));
    want.resize(400, 0);
    want.extend_from_slice(&bytes(4, 50));
    assert_eq!(read_all(&b, "/log"), want);
    f.close().unwrap();
}

#[test]
fn a_hostile_slot_grows_only_its_own_file_and_only_over_its_zeroed_room() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let area = Area::of(&a);
    let other = b.open("/theirs", &rw()).unwrap();
    other.write_at(b"theirs", 0).unwrap();
    // Opened for writing only: the second write gets the grant, with the size it extends to
    // applied (a read-write file's would be published in the slot the test then scribbles).
    let f = a.open("/mine", &wo()).unwrap();
    f.write_at(&bytes(1, 10), 0).unwrap();
    f.write_at(&bytes(2, 10), 10).unwrap();
    let (slot, generation, limit) = area.granted().expect("a grant");
    let s = &area.area().slots[slot];

    // A size under another generation counts for nothing.
    s.published
        .store(size_word(generation + 2, 5000), Ordering::SeqCst);
    assert_eq!(b.stat("/mine").unwrap().size, 20);
    // A huge size counts up to the room's end, and the room reads as zeros.
    s.published
        .store(size_word(generation, 1 << 40), Ordering::SeqCst);
    assert_eq!(b.stat("/mine").unwrap().size, limit);
    let got = read_all(&b, "/mine");
    assert_eq!(&got[..20], &[bytes(1, 10), bytes(2, 10)].concat()[..]);
    assert!(got[20..].iter().all(|&x| x == 0), "the room was zeroed");
    // Free slots count for nothing either, and no other file moved.
    for (i, t) in area.area().slots.iter().enumerate() {
        if i != slot {
            t.handle.store(1, Ordering::SeqCst);
            t.published.store(
                size_word(t.generation.load(Ordering::SeqCst), 1 << 30),
                Ordering::SeqCst,
            );
        }
    }
    assert_eq!(b.stat("/theirs").unwrap().size, 6);
    assert_eq!(a.stat("/theirs").unwrap().size, 6);
    // The size stays where the grant left it once the handle is closed.
    f.close().unwrap();
    room_gone(&b, "/mine");
    assert_eq!(b.stat("/mine").unwrap().size, limit);
    other.close().unwrap();
}

#[test]
fn what_was_published_survives_a_killed_client_and_an_fsync_survives_a_killed_daemon() {
    let _s = serial();
    let dir = TempDir::new("sizes");
    let img = dir.0.join("device.img").display().to_string();
    let mut d = Daemon::start_raw(&["--device", &img, "--size", "64M"], dir);

    // A client killed in the middle of its appends: what it grew the file to stays, and the
    // room goes back when the daemon notices the connection's end.
    let n = 5u8;
    let mut child = spawn_role(
        "append-and-die",
        &[
            d.socket.display().to_string(),
            "/killed".into(),
            n.to_string(),
        ],
    );
    let status = child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let want: Vec<u8> = (0..n).flat_map(|i| bytes(i, 700)).collect();
    let b = Moneta::connect(&d.socket).unwrap();
    room_gone(&b, "/killed");
    assert_eq!(read_all(&b, "/killed"), want);

    // An fsync applies the published size: a kill of the daemon right after keeps it.
    let f = b.open("/synced", &rw()).unwrap();
    let mut synced = Vec::new();
    for i in 0..6u8 {
        let rec = bytes(40 + i, 1500);
        f.write_at(&rec, synced.len() as u64).unwrap();
        synced.extend_from_slice(&rec);
    }
    f.sync_all().unwrap();
    let st = b.stat("/synced").unwrap();
    assert!(st.blocks > whole(st.size), "room past the end: {st:?}");
    // Room given at an open (a file made again where one grew) and a write in it with no
    // fsync: the kill leaves the room allocated past a size of 0.
    let j = b.open("/again", &rw()).unwrap();
    j.write_at(b"first", 0).unwrap();
    j.close().unwrap();
    b.unlink("/again").unwrap();
    let j = b.open("/again", &rw()).unwrap();
    assert!(b.stat("/again").unwrap().blocks > 0, "room at the open");
    j.write_at(b"second", 0).unwrap();
    assert_eq!(b.stat("/again").unwrap().size, 6);
    d.kill9();
    // The image as the kill left it checks clean, the room still allocated past the end: it
    // continues the file's last extent, which nvfs allows.
    let img = d.dir.0.join("device.img");
    let arr = std::sync::Arc::new(moneta_device::MappedArray::open_file(&img, None).unwrap());
    let out = moneta_fs::fsck(&*arr, false).unwrap();
    assert_eq!(out.before.errors(), 0, "{:?}", out.before.problems);
    drop(arr);
    d.spawn();
    let c = Moneta::connect(&d.socket).unwrap();
    // The room the kill left allocated went back at the mount.
    let st = c.stat("/synced").unwrap();
    assert_eq!((st.size, st.blocks), (synced.len() as u64, whole(st.size)));
    assert_eq!(read_all(&c, "/synced"), synced);
    assert_eq!(read_all(&c, "/killed"), want);
    // A size published and never applied was not the file system's; the room went back.
    let st = c.stat("/again").unwrap();
    assert_eq!((st.size, st.blocks), (0, 0));
    drop((f, j));
}

#[test]
fn room_held_ahead_of_appends_is_taken_back_before_another_file_is_refused_space() {
    let _s = serial();
    let d = Daemon::start_fs("16M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let area = Area::of(&a);
    let f = a.open("/growing", &wo()).unwrap();
    f.write_at(&bytes(1, 1 << 20), 0).unwrap();
    let free = b.statfs().unwrap().chunks_free;
    // The second growth leaves up to 1 MiB of room past the end.
    f.write_at(b"+", 1 << 20).unwrap();
    let (_, _, limit) = area.granted().expect("a grant");
    let room = (limit - (1 << 20)) / CHUNK;
    assert!(room >= 64, "{limit}");
    assert!(b.statfs().unwrap().chunks_free + room <= free);
    // Another file takes every chunk but the one the append took: only the room makes that
    // possible, and it is taken back rather than the write refused.
    let g = b.open("/filler", &rw()).unwrap();
    let want = (free - 1) * CHUNK;
    g.write_at(&vec![7u8; want as usize], 0).unwrap();
    assert_eq!(g.stat().unwrap().size, want);
    assert_eq!(area.granted(), None, "the grant ended with its room");
    let st = b.stat("/growing").unwrap();
    assert_eq!((st.size, st.blocks), ((1 << 20) + 1, whole((1 << 20) + 1)));
    // The holder's next append past its last chunk asks, and the device is full.
    let e = f
        .write_at(&[9u8; CHUNK as usize], (1 << 20) + 1)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
    let mut last = [0u8; 1];
    assert_eq!(g.read_at(&mut last, 0).unwrap(), 1);
    assert_eq!(&last, &[7]);
    let back = b.open("/growing", OpenOptions::new().read(true)).unwrap();
    assert_eq!(back.read_at(&mut last, 1 << 20).unwrap(), 1);
    assert_eq!(&last, b"+");
    g.close().unwrap();
    f.close().unwrap();
}

#[test]
fn readers_racing_an_appender_see_sizes_only_grow_and_bytes_only_of_the_appender() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let f = a.open("/race", &rw()).unwrap();
    const REC: usize = 100;
    const N: usize = 2000;
    let record = |i: usize| -> Vec<u8> { (0..REC).map(|k| (i * 7 + k) as u8 | 1).collect() };
    let started = std::sync::atomic::AtomicU64::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for i in 0..N {
                let at = (i * REC) as u64;
                started.store(at + REC as u64, Ordering::SeqCst);
                f.write_at(&record(i), at).unwrap();
                if i % 500 == 499 {
                    f.sync_all().unwrap();
                }
            }
            done.store(true, Ordering::SeqCst);
        });
        let b = Moneta::connect(&d.socket).unwrap();
        let g = b.open("/race", OpenOptions::new().read(true)).unwrap();
        let mut last = 0u64;
        let mut buf = vec![0u8; N * REC];
        while !done.load(Ordering::SeqCst) {
            let size = g.stat().unwrap().size;
            assert!(size >= last, "the size went back from {last} to {size}");
            assert!(
                size <= started.load(Ordering::SeqCst),
                "a size nobody wrote up to"
            );
            last = size;
            let n = g.read_at(&mut buf[..size as usize], 0).unwrap();
            assert_eq!(n as u64, size);
            for (i, r) in buf[..n].chunks(REC).enumerate() {
                // A record is whole, or (being written now) zeros or part of it.
                let want = record(i);
                assert!(
                    r.iter().zip(&want).all(|(x, y)| x == y || *x == 0),
                    "record {i} holds bytes nobody wrote"
                );
            }
            // Two CPUs: leave the appender (and the device) room to run.
            std::thread::sleep(Duration::from_micros(300));
        }
        g.close().unwrap();
    });
    assert!(libmoneta::sizes_leased() > 0);
    let want: Vec<u8> = (0..N).flat_map(record).collect();
    f.close().unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    assert_eq!(read_all(&b, "/race"), want);
}

#[test]
fn under_a_lease_a_read_past_the_end_needs_no_call_and_another_extend_ends_the_lease() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let area = Area::of(&a);
    let f = a.open("/f", &rw()).unwrap();
    f.write_at(&bytes(1, 100), 0).unwrap();
    f.write_at(&bytes(2, 100), 100).unwrap();
    f.write_at(&bytes(3, 50), 200).unwrap();
    assert!(area.granted().is_some());
    // SQLite reads 8 bytes past its journal's end to check for a stale header: the lease
    // says where the end is, so that read asks nothing.
    let misses = a.stats().soft_misses;
    let mut buf = [0u8; 8];
    assert_eq!(f.read_at(&mut buf, 1000).unwrap(), 0);
    assert_eq!(f.read_at(&mut buf, 246).unwrap(), 4);
    assert_eq!(&buf[..4], &bytes(3, 50)[46..]);
    assert_eq!(a.stats().soft_misses, misses, "no lookup");
    // Another process grows the file: the lease ends first, so the holder asks again and
    // sees the new end.
    let g = b.open("/f", &rw()).unwrap();
    g.write_at(b"theirs", 2000).unwrap();
    assert_eq!(area.granted(), None, "another extend ended the lease");
    let mut theirs = [0u8; 6];
    assert_eq!(f.read_at(&mut theirs, 2000).unwrap(), 6);
    assert_eq!(&theirs, b"theirs");
    assert!(a.stats().soft_misses > misses);
    // Its next append past the new end asks too, and lands there.
    f.write_at(b"mine", 2006).unwrap();
    let got = read_all(&b, "/f");
    assert_eq!(got.len(), 2010);
    assert_eq!(&got[2000..], b"theirsmine");
    assert!(got[250..2000].iter().all(|&x| x == 0));
    g.close().unwrap();
    f.close().unwrap();
}

#[test]
fn a_file_made_again_where_one_grew_gets_room_at_its_open_and_its_stat_counts_what_it_published() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let area = Area::of(&a);
    // The first journal: a plain open, whose first write extends and gets room.
    let f = a.open("/db-journal", &rw()).unwrap();
    assert_eq!(area.granted(), None, "no room before the first growth");
    let e = a.stats().extends;
    f.write_at(&bytes(1, 512), 0).unwrap();
    assert_eq!(a.stats().extends, e + 1);
    assert!(area.granted().is_some());
    f.close().unwrap();
    a.unlink("/db-journal").unwrap();

    // Made again at that path: the open brings the room and the lease.
    let f = a.open("/db-journal", &rw()).unwrap();
    let (_, _, limit) = area.granted().expect("room at the open");
    assert!(limit >= 16 * 1024, "{limit}");
    let st = b.stat("/db-journal").unwrap();
    assert_eq!(st.size, 0);
    assert!(st.blocks * 512 >= limit, "the room is the file's: {st:?}");
    // Read through a handle of B's without a stat of it (which would end A's grant: the
    // last test), the room is past the end.
    let r = b
        .open("/db-journal", OpenOptions::new().read(true))
        .unwrap();
    assert_eq!(r.read_at(&mut [0u8; 16], 0).unwrap(), 0);
    r.close().unwrap();
    let (e, kept) = (a.stats().extends, libmoneta::stats_kept());
    assert_eq!(f.stat().unwrap().size, 0, "kept from the open");
    let other = a
        .open("/db-journal", OpenOptions::new().read(true))
        .unwrap();
    let mut want = Vec::new();
    for i in 0..5u8 {
        let rec = bytes(i, 1000 + i as usize);
        f.write_at(&rec, want.len() as u64).unwrap();
        want.extend_from_slice(&rec);
        // The holder's own stat of its handle is kept and counts what it published; another
        // handle's (of this process or another) asks, and sees the same.
        assert_eq!(f.stat().unwrap().size, want.len() as u64);
        assert_eq!(other.stat().unwrap().size, want.len() as u64);
        assert_eq!(b.stat("/db-journal").unwrap().size, want.len() as u64);
    }
    assert_eq!(a.stats().extends, e, "every write inside the room");
    assert_eq!(
        libmoneta::stats_kept(),
        kept + 6,
        "the holder's stats were kept, the other handle's asked"
    );
    assert_eq!(read_all(&b, "/db-journal"), want);
    // A change by another process moves the kept answer.
    b.chmod("/db-journal", 0o600).unwrap();
    assert_eq!(f.stat().unwrap().mode & 0o777, 0o600);
    assert_eq!(f.stat().unwrap().size, want.len() as u64);
    other.close().unwrap();
    f.close().unwrap();
    room_gone(&b, "/db-journal");
    assert_eq!(read_all(&b, "/db-journal"), want);

    // No room for a file with data, for an open for writing only, or on another connection
    // (which never grew a file at that path).
    let g = a.open("/db-journal", &rw()).unwrap();
    assert_eq!(area.granted(), None);
    g.close().unwrap();
    a.unlink("/db-journal").unwrap();
    let g = a.open("/db-journal", &wo()).unwrap();
    assert_eq!(area.granted(), None);
    g.close().unwrap();
    a.unlink("/db-journal").unwrap();
    let g = b.open("/db-journal", &rw()).unwrap();
    assert_eq!(Area::of(&b).granted(), None);
    g.close().unwrap();
    b.unlink("/db-journal").unwrap();
    // The room of a file closed without a write goes back too.
    let g = a.open("/db-journal", &rw()).unwrap();
    assert!(area.granted().is_some());
    g.close().unwrap();
    room_gone(&b, "/db-journal");
    assert_eq!(b.stat("/db-journal").unwrap().size, 0);
}

#[test]
fn another_process_s_stat_of_its_handle_ends_the_grant_for_good_and_keeps_its_answer() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let area = Area::of(&a);
    let f = a.open("/table", &rw()).unwrap();
    f.write_at(&bytes(1, 100), 0).unwrap();
    f.write_at(&bytes(2, 100), 100).unwrap();
    assert!(area.granted().is_some(), "the second append got a grant");
    let e = a.stats().extends;
    f.write_at(&bytes(3, 100), 200).unwrap();
    assert_eq!(a.stats().extends, e, "inside the room");
    // A stat of a path is an outsider's look: it asks, and the grant stands.
    assert_eq!(b.stat("/table").unwrap().size, 300);
    assert!(area.granted().is_some());

    // Another process with the file open asks its size through its handle (a database's
    // other process before it extends a table): it sees what A published, A's grant ends,
    // and B's answer is kept from then on.
    let g = b.open("/table", OpenOptions::new().read(true)).unwrap();
    assert_eq!(g.stat().unwrap().size, 300);
    assert_eq!(area.granted(), None, "the reader's stat ended the grant");
    let kept = libmoneta::stats_kept();
    for _ in 0..3 {
        assert_eq!(g.stat().unwrap().size, 300);
    }
    assert_eq!(libmoneta::stats_kept(), kept + 3, "kept, not asked");

    // A's appends now ask, and get no grant again while the file stays open: each moves
    // B's kept answer.
    let mut want = [bytes(1, 100), bytes(2, 100), bytes(3, 100)].concat();
    for i in 0..3u8 {
        let rec = bytes(10 + i, 100);
        f.write_at(&rec, want.len() as u64).unwrap();
        want.extend_from_slice(&rec);
        assert_eq!(area.granted(), None, "no grant for a size others read");
        assert_eq!(g.stat().unwrap().size, want.len() as u64);
    }
    assert_eq!(a.stats().extends, e + 3, "an extend each");
    assert_eq!(read_all(&b, "/table"), want);

    // After the last close the file starts afresh: a new open grows in room again.
    g.close().unwrap();
    f.close().unwrap();
    room_gone(&a, "/table");
    let f = a.open("/table", &rw()).unwrap();
    f.write_at(&bytes(20, 100), want.len() as u64).unwrap();
    assert!(area.granted().is_some(), "room again after the last close");
    f.close().unwrap();
}
