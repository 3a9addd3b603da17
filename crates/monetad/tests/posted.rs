//! Sole leases and posted writes (docs/abi.md §3.10) through a real daemon: a write through
//! a handle that is its file's only open returns once its command is rung, and every other
//! open, truncation by path, fork and the end of the writer's connection (a killed writer's
//! too) waits for it first, so nobody ever sees the file without a write that returned.
//!
//! To make a posted write that has not landed yet, the writer first rings a barrier write
//! that the array's write latency keeps in flight: the posted write, in the next barrier
//! epoch, cannot move its data before the barrier completes. Separate connections play
//! separate processes. The tests run one at a time: they count the writes this process
//! posted, which is one number for the whole process.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use libmoneta::{Channel, File, Moneta, OpenOptions, Tag};
use moneta_abi::{Command, Completion, Opcode, SoleLeaseArea, SOLE_LEASE_OFFSET};

/// Write latency of the array in these tests: long enough that a write held behind a barrier
/// write is still in flight when the other side looks, short of the daemon's bounded wait.
const LATENCY_NS: &str = "20000000";

fn start() -> Daemon {
    Daemon::start_fs("64M", &["--write-latency-ns", LATENCY_NS])
}

/// [`start`], with a permission table of two records shared by every channel: one client's
/// installs evict another's records.
fn start_with_two_records() -> Daemon {
    Daemon::start_fs(
        "64M",
        &[
            "--write-latency-ns",
            LATENCY_NS,
            "--table-entries",
            "2",
            "--no-merge",
        ],
    )
}

/// The sole-lease area of `m`'s channel, mapped again as another writer of it would.
struct Area(ChannelMap);

impl Area {
    fn of(m: &Moneta) -> Area {
        Area(ChannelMap::of(m))
    }

    fn area(&self) -> &SoleLeaseArea {
        self.0.at(SOLE_LEASE_OFFSET)
    }

    /// Whether a slot names `handle` now.
    fn holds(&self, handle: u64) -> bool {
        self.area().slots.iter().any(|s| {
            s.generation.load(Ordering::SeqCst) & 1 == 0
                && s.handle.load(Ordering::SeqCst) == handle
        })
    }
}

fn bytes(seed: u8, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| seed.wrapping_add((i % 251) as u8) | 1)
        .collect()
}

fn read_at(f: &File, off: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    assert_eq!(f.read_at(&mut out, off).unwrap(), n);
    out
}

/// Makes `path` 8 KiB long through `m` (so its extent is mapped) and returns it open.
fn made(m: &Moneta, path: &str) -> File {
    let f = m.open(path, &rw()).unwrap();
    f.write_at(&[0u8; 8192], 0).unwrap();
    f.sync_all().unwrap();
    f
}

/// Opens `path` for reading and writing once its last close is done: the close of a file
/// with room past its end leaves the file open to the daemon's releaser a moment longer, and
/// only a file's only open holds a sole lease.
fn alone(m: &Moneta, path: &str) -> File {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let f = m.open(path, &rw()).unwrap();
        if Area::of(m).holds(f.handle()) {
            return f;
        }
        assert!(Instant::now() < deadline, "{path} never got a sole lease");
        f.close().unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Rings, on `f`'s channel, a barrier write of 512 bytes over the file's first bytes, without
/// waiting: it stays in flight for the array's write latency, and every command rung after it
/// waits for it. The tag to collect it from.
fn barrier_write(f: &File) -> Tag {
    let ch: &Channel = f.channel();
    let mapped = ch
        .lookup(f.handle(), 0, 4096)
        .unwrap()
        .expect("the lookup answered through the channel");
    let dev = mapped.extents[0].dev;
    let tag = ch.tag();
    ch.write_dma(tag, 0, &[0x5a; 512]);
    let mut cmd = Command::new(Opcode::Write, Completion::Dma, dev, 512, mapped.file);
    cmd.barrier = true;
    ch.prepare(tag, &cmd);
    ch.ring(1 << tag.0);
    tag
}

fn collect(f: &File, tag: Tag) {
    let ch = f.channel();
    ch.wait(tag, Completion::Dma).unwrap();
    ch.release(tag);
}

/// Entry point of child processes started with `spawn_role`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    match role.as_str() {
        // Posts a write of `bytes(7, 512)` at 1024 of `args[1]` behind a barrier write, and
        // dies at once, without closing anything.
        "post-and-die" => {
            let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
            let f = made(&m, &args[1]);
            let _held = barrier_write(&f);
            let before = libmoneta::writes_posted();
            f.write_at(&bytes(7, 512), 1024).unwrap();
            assert_eq!(
                libmoneta::writes_posted(),
                before + 1,
                "the write was not posted"
            );
            // SAFETY: `kill` on this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!();
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn another_open_waits_for_the_writes_the_only_handle_posted() {
    let _s = serial();
    let d = start();
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    assert_eq!(Area::of(&a).area().wanted.load(Ordering::Acquire), 1);
    let f = made(&a, "/f");
    assert!(Area::of(&a).holds(f.handle()), "the only open got no lease");
    let held = barrier_write(&f);
    let before = libmoneta::writes_posted();
    let want = bytes(3, 512);
    f.write_at(&want, 1024).unwrap();
    assert_eq!(
        libmoneta::writes_posted(),
        before + 1,
        "the write was not posted"
    );
    // Another process opens: the lease ends, and the open's answer waits for the write.
    let g = b.open("/f", OpenOptions::new().read(true)).unwrap();
    assert!(
        !Area::of(&a).holds(f.handle()),
        "the lease stands after another open"
    );
    assert_eq!(read_at(&g, 1024, 512), want);
    // With the file open twice, a write waits for its completion.
    let before = libmoneta::writes_posted();
    f.write_at(&bytes(4, 512), 2048).unwrap();
    assert_eq!(libmoneta::writes_posted(), before);
    assert_eq!(read_at(&g, 2048, 512), bytes(4, 512));
    collect(&f, held);
    g.close().unwrap();
    // The writer's own reads see its posted writes: a file opened alone again posts.
    f.close().unwrap();
    let f = alone(&a, "/f");
    let before = libmoneta::writes_posted();
    for i in 0..40u64 {
        f.write_at(&bytes(i as u8, 100), 4096 + i * 100).unwrap();
    }
    assert!(libmoneta::writes_posted() > before);
    for i in 0..40u64 {
        assert_eq!(read_at(&f, 4096 + i * 100, 100), bytes(i as u8, 100));
    }
}

#[test]
fn a_second_open_in_the_same_process_ends_the_lease_too() {
    let _s = serial();
    let d = start();
    let a = Moneta::connect(&d.socket).unwrap();
    let f = made(&a, "/same");
    let held = barrier_write(&f);
    f.write_at(&bytes(9, 300), 700).unwrap();
    let g = a.open("/same", OpenOptions::new().read(true)).unwrap();
    assert!(!Area::of(&a).holds(f.handle()));
    assert_eq!(read_at(&g, 700, 300), bytes(9, 300));
    collect(&f, held);
}

#[test]
fn the_writer_opening_its_own_file_again_waits_for_nothing_but_its_writes() {
    let _s = serial();
    // No write latency: the posted writes land at once, so nothing should make an open wait.
    let d = Daemon::start_fs("64M", &[]);
    let a = Moneta::connect(&d.socket).unwrap();
    let t0 = Instant::now();
    for i in 0..20u8 {
        let f = made(&a, &format!("/again{i}"));
        f.write_at(&bytes(i, 100), 100).unwrap();
        // Its own open, through the channel: the lease's end must not wait for this very
        // call's command, which stays in flight while the call is answered.
        let g = a
            .open(format!("/again{i}"), OpenOptions::new().read(true))
            .unwrap();
        assert_eq!(read_at(&g, 100, 100), bytes(i, 100));
    }
    // Twenty ends of a lease that waited out their bound would take two seconds.
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "the opens waited {:?}",
        t0.elapsed()
    );
}

#[test]
fn a_truncation_by_path_lands_after_the_writes_posted_before_it() {
    let _s = serial();
    let d = start();
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let f = made(&a, "/t");
    let held = barrier_write(&f);
    f.write_at(&bytes(5, 512), 2048).unwrap();
    // Cut inside the posted write's chunk: the tail is zeroed, and must stay so.
    b.truncate("/t", 2304).unwrap();
    let g = b.open("/t", &rw()).unwrap();
    g.set_len(4096).unwrap();
    let mut want = bytes(5, 512);
    want[256..].fill(0);
    assert_eq!(read_at(&g, 2048, 512), want);
    assert_eq!(read_at(&g, 2560, 1536), vec![0u8; 1536]);
    collect(&f, held);
}

#[test]
fn a_killed_writer_s_posted_writes_are_carried_out() {
    let _s = serial();
    let d = start();
    let mut child = spawn_role(
        "post-and-die",
        &[d.socket.to_string_lossy().into_owned(), "/k".into()],
    );
    let st = child.wait().unwrap();
    assert!(!st.success(), "the writer was to die: {st:?}");
    let b = Moneta::connect(&d.socket).unwrap();
    let g = b.open("/k", OpenOptions::new().read(true)).unwrap();
    assert_eq!(read_at(&g, 1024, 512), bytes(7, 512));
    assert_eq!(read_at(&g, 0, 512), vec![0x5a; 512]);
}

#[test]
fn a_posted_write_the_daemon_took_with_it_fails_the_fsync_after_a_new_connection() {
    let _s = serial();
    let mut d = start();
    let a = Moneta::connect(&d.socket).unwrap();
    let f = made(&a, "/gone");
    let _held = barrier_write(&f);
    let before = libmoneta::writes_posted();
    f.write_at(&bytes(13, 512), 1024).unwrap();
    assert_eq!(libmoneta::writes_posted(), before + 1);
    // The daemon dies with the write held behind the barrier, and another one starts.
    d.kill9();
    d.spawn();
    // A call by path makes the connection anew (the old one's files are gone).
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.stat("/").is_err() {
        assert!(Instant::now() < deadline, "no new connection");
        std::thread::sleep(Duration::from_millis(10));
    }
    // The file is the old connection's: its calls fail, and its close, which collects the
    // write posted on the old channel, cannot say the write was carried out either.
    let e = f.sync_all().unwrap_err();
    assert_eq!(e.errno(), libc::EIO, "{e:?}");
    assert!(f.close().is_err());
    // Nothing of the old channel's reached the new one: its tags and its count of posted
    // writes are its own, and a file made now posts its writes.
    let g = made(&a, "/after");
    assert!(Area::of(&a).holds(g.handle()));
    let before = libmoneta::writes_posted();
    for i in 0..40u64 {
        g.write_at(&bytes(i as u8, 64), 64 * i).unwrap();
    }
    assert_eq!(libmoneta::writes_posted(), before + 40);
    for i in 0..40u64 {
        assert_eq!(read_at(&g, 64 * i, 64), bytes(i as u8, 64));
    }
}

#[test]
fn a_handover_ends_the_leases_after_their_writes() {
    let _s = serial();
    let d = start();
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let f = made(&a, "/h");
    let held = barrier_write(&f);
    f.write_at(&bytes(11, 512), 3000).unwrap();
    // What a fork or an exec does first: the files' handles go into a bundle that another
    // process may claim at once.
    let _bundle = a.handover().unwrap();
    assert!(!Area::of(&a).holds(f.handle()));
    // Nothing waits for the write here but the handover itself.
    let g = b.open("/h", OpenOptions::new().read(true)).unwrap();
    assert_eq!(read_at(&g, 3000, 512), bytes(11, 512));
    collect(&f, held);
}

#[test]
fn a_command_written_and_never_rung_only_delays_another_open() {
    let _s = serial();
    let d = start();
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let f = made(&a, "/stall");
    assert!(Area::of(&a).holds(f.handle()));
    // A hostile holder: a DMA-completion WRITE in a tag's slot that it never rings.
    let ch = f.channel();
    let tag = ch.tag();
    ch.prepare(tag, &Command::new(Opcode::Write, Completion::Dma, 0, 0, 0));
    let t0 = Instant::now();
    let g = b.open("/stall", OpenOptions::new().read(true)).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "the open waited {:?}",
        t0.elapsed()
    );
    assert_eq!(read_at(&g, 0, 16), vec![0u8; 16]);
    // The command rung late completes as any other.
    ch.ring(1 << tag.0);
    ch.wait(tag, Completion::Dma).unwrap();
    ch.release(tag);
}

#[test]
fn posted_writes_that_meet_evicted_records_are_carried_out_in_order() {
    let _s = serial();
    // A permission table of a few records, shared by every channel: the files' records evict
    // one another, so posted writes meet misses, and the device installs the records again.
    let d = Daemon::start_fs("64M", &["--table-entries", "2", "--no-merge"]);
    let a = Moneta::connect(&d.socket).unwrap();
    let files: Vec<File> = (0..4).map(|i| made(&a, &format!("/e{i}"))).collect();
    let posted = libmoneta::writes_posted();
    let misses = a.stats().hard_misses;
    for round in 0..30u64 {
        for (i, f) in files.iter().enumerate() {
            let seed = (round * 4 + i as u64) as u8;
            f.write_at(&bytes(seed, 64), (round % 8) * 64).unwrap();
        }
    }
    assert!(libmoneta::writes_posted() > posted, "nothing was posted");
    for f in &files {
        // None of them was lost (a lost posted write fails the next fsync).
        f.sync_all().unwrap();
    }
    for (i, f) in files.iter().enumerate() {
        for slot in 0..8u64 {
            // The last round that wrote this slot.
            let round = (0..30u64).rev().find(|r| r % 8 == slot).unwrap();
            let seed = (round * 4 + i as u64) as u8;
            assert_eq!(
                read_at(f, slot * 64, 64),
                bytes(seed, 64),
                "file {i} slot {slot}"
            );
        }
    }
    assert!(a.stats().hard_misses > misses, "no record was evicted");
}

#[test]
fn a_posted_write_whose_record_another_channel_evicts_lands_before_another_open_and_never_after() {
    let _s = serial();
    // A table of two records shared by every channel: another client's records evict the
    // writer's while its posted write waits behind a barrier write.
    let d = start_with_two_records();
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    // The other client's files, made first (writes take the array's latency; reads do not).
    let others: Vec<File> = (0..3).map(|i| made(&b, &format!("/o{i}"))).collect();
    let f = made(&a, "/v");
    assert!(Area::of(&a).holds(f.handle()), "the only open got no lease");
    let held = barrier_write(&f);
    let before = libmoneta::writes_posted();
    let want = bytes(9, 512);
    f.write_at(&want, 1024).unwrap();
    assert_eq!(
        libmoneta::writes_posted(),
        before + 1,
        "the write was not posted"
    );
    // Another client's reads take the table's two records: the writer's are evicted before
    // its posted write is checked.
    let evictions = || f.channel().header().evictions.load(Ordering::Relaxed);
    let ev0 = evictions();
    for o in &others {
        assert_eq!(read_at(o, 0, 16), vec![0u8; 16]);
    }
    assert!(evictions() > ev0, "the writer's records were not evicted");
    // Another open waits for the posted write, which the device carried out all the same.
    let g = b.open("/v", &rw()).unwrap();
    assert_eq!(
        read_at(&g, 1024, 512),
        want,
        "the open saw the file without the write"
    );
    // Its own write over the same bytes is the last one: the writer's collection of its
    // posted write does not write it again.
    let newer = bytes(10, 512);
    g.write_at(&newer, 1024).unwrap();
    f.sync_all().unwrap();
    collect(&f, held);
    assert_eq!(
        read_at(&g, 1024, 512),
        newer,
        "an earlier write landed after a later one"
    );
    assert_eq!(read_at(&f, 1024, 512), newer);
}

#[test]
fn a_killed_writer_s_posted_write_whose_record_was_evicted_is_carried_out() {
    let _s = serial();
    let d = start_with_two_records();
    let b = Moneta::connect(&d.socket).unwrap();
    let others: Vec<File> = (0..3).map(|i| made(&b, &format!("/o{i}"))).collect();
    let mut child = spawn_role(
        "post-and-die",
        &[d.socket.to_string_lossy().into_owned(), "/k".into()],
    );
    let st = child.wait().unwrap();
    assert!(!st.success(), "the writer was to die: {st:?}");
    // While the dead writer's posted write waits behind its barrier write, another client's
    // reads take the table's records.
    for o in &others {
        assert_eq!(read_at(o, 0, 16), vec![0u8; 16]);
    }
    let g = b.open("/k", OpenOptions::new().read(true)).unwrap();
    assert_eq!(read_at(&g, 1024, 512), bytes(7, 512));
    assert_eq!(read_at(&g, 0, 512), vec![0x5a; 512]);
}

#[test]
fn a_file_that_may_go_in_place_later_posts_until_it_does() {
    let _s = serial();
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    made(&m, "/db").close().unwrap();
    let f = alone(&m, "/db");
    // It would go in place after many more accesses: until then, its writes are posted.
    f.set_in_place_after(1000);
    // (The first access looks the file's extent up; the posted ones follow.)
    assert_eq!(read_at(&f, 4096, 100), vec![0u8; 100]);
    let before = libmoneta::writes_posted();
    for i in 0..8u64 {
        f.write_at(&bytes(i as u8, 100), i * 100).unwrap();
    }
    assert_eq!(
        libmoneta::writes_posted(),
        before + 8,
        "a write was not posted"
    );
    // In place, it posts nothing, and the mapping holds every write posted before.
    f.set_in_place(true);
    let before = libmoneta::writes_posted();
    f.write_at(&bytes(9, 100), 900).unwrap();
    f.write_at(&bytes(10, 100), 1000).unwrap();
    assert!(f.in_place());
    assert_eq!(
        libmoneta::writes_posted(),
        before,
        "a write in place was posted"
    );
    for i in (0..8u64).chain([9, 10]) {
        assert_eq!(read_at(&f, i * 100, 100), bytes(i as u8, 100), "at {i}");
    }
    let g = m.open("/db", OpenOptions::new().read(true)).unwrap();
    assert_eq!(read_at(&g, 0, 100), bytes(0, 100));
    assert_eq!(read_at(&g, 1000, 100), bytes(10, 100));
}
