//! libmoneta's file API against a real daemon: every call and its errors, a randomized
//! comparison with the kernel on tmpfs, threads sharing one channel, hard misses forced by a
//! tiny permission table, and size coherence between connections.

mod common;

use std::io::{IoSlice, IoSliceMut, Read, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::*;
use libmoneta::{ClientError, Moneta, OpenOptions, Policy};
use moneta_abi::fsproto::{WireTime, UTIME_OMIT};
use moneta_abi::Completion;
use rand::{Rng, SeedableRng};

fn errno_of<T: std::fmt::Debug>(r: Result<T, ClientError>) -> i32 {
    match r {
        Err(e) => e.errno(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

#[test]
fn every_call_and_its_errors() {
    let d = Daemon::start_fs("64M", &["--chunk-size", "64K"]);
    let m = Moneta::connect(&d.socket).unwrap();

    // open/create and the access checks of the data path.
    assert_eq!(
        errno_of(m.open("/missing", OpenOptions::new().read(true))),
        libc::ENOENT
    );
    let f = m.open("/a", &rw()).unwrap();
    assert_eq!(f.write_at(b"hello world", 0).unwrap(), 11);
    let mut buf = [0u8; 64];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 11);
    assert_eq!(&buf[..11], b"hello world");
    assert_eq!(f.read_at(&mut buf, 11).unwrap(), 0, "at the end");
    assert_eq!(f.read_at(&mut buf, 1 << 40).unwrap(), 0, "past the end");
    assert_eq!(f.read_at(&mut buf[..0], 0).unwrap(), 0);
    assert_eq!(
        errno_of(m.open("/a", OpenOptions::new().write(true).create_new(true))),
        libc::EEXIST
    );
    let ro = m.open("/a", OpenOptions::new().read(true)).unwrap();
    assert_eq!(errno_of(ro.write_at(b"x", 0)), libc::EBADF);
    assert_eq!(errno_of(ro.set_len(0)), libc::EINVAL);
    let wo = m.open("/a", OpenOptions::new().write(true)).unwrap();
    assert_eq!(errno_of(wo.read_at(&mut buf, 0)), libc::EBADF);
    assert_eq!(errno_of(f.write_at(b"x", u64::MAX - 1)), libc::EFBIG);
    assert_eq!(errno_of(f.read_at(&mut buf, u64::MAX - 1)), libc::EINVAL);

    // read/write/seek move the position; the std traits agree.
    let mut g = m.open("/b", &rw()).unwrap();
    g.write_all(b"0123456789").unwrap();
    assert_eq!(g.position(), 10);
    assert_eq!(g.seek(SeekFrom::Start(2)).unwrap(), 2);
    let mut three = [0u8; 3];
    g.read_exact(&mut three).unwrap();
    assert_eq!(&three, b"234");
    assert_eq!(g.seek(SeekFrom::Current(-1)).unwrap(), 4);
    assert_eq!(g.seek(SeekFrom::End(-2)).unwrap(), 8);
    assert_eq!(errno_of(g.seek(SeekFrom::Current(-100))), libc::EINVAL);
    let mut rest = Vec::new();
    g.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"89");

    // Vectored calls.
    let n = g
        .write_vectored_at(
            &[IoSlice::new(b"ab"), IoSlice::new(b""), IoSlice::new(b"cd")],
            20,
        )
        .unwrap();
    assert_eq!(n, 4);
    let (mut x, mut y) = ([0u8; 3], [0u8; 10]);
    let n = g
        .read_vectored_at(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)], 19)
        .unwrap();
    assert_eq!(n, 5);
    assert_eq!(&x, b"\0ab");
    assert_eq!(&y[..2], b"cd");
    g.seek(SeekFrom::Start(0)).unwrap();
    assert_eq!(
        g.write_vectored(&[IoSlice::new(b"AB"), IoSlice::new(b"CD")])
            .unwrap(),
        4
    );
    g.seek(SeekFrom::Start(0)).unwrap();
    let (mut p, mut q) = ([0u8; 1], [0u8; 3]);
    assert_eq!(
        g.read_vectored(&mut [IoSliceMut::new(&mut p), IoSliceMut::new(&mut q)])
            .unwrap(),
        4
    );
    assert_eq!((&p, &q), (b"A", b"BCD"));

    // Append: writes land at the end whatever the position or offset.
    let ap = m
        .open("/b", OpenOptions::new().read(true).append(true))
        .unwrap();
    ap.write(b"XY").unwrap();
    assert_eq!(ap.position(), 26);
    ap.write_at(b"Z", 0).unwrap();
    assert_eq!(ap.stat().unwrap().size, 27);
    let mut all = vec![0u8; 27];
    assert_eq!(ap.read_at(&mut all, 0).unwrap(), 27);
    assert_eq!(&all[22..], b"cdXYZ");

    // Truncate (by handle and by path), fsync, stat, attributes.
    g.set_len(3).unwrap();
    assert_eq!(g.len().unwrap(), 3);
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 3);
    g.set_len(100).unwrap();
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 64);
    assert!(
        buf[3..64].iter().all(|&b| b == 0),
        "a grown file reads zeros"
    );
    m.truncate("/b", 5).unwrap();
    assert_eq!(m.stat("/b").unwrap().size, 5);
    g.sync_all().unwrap();
    g.sync_data().unwrap();
    g.chmod(0o640).unwrap();
    assert_eq!(m.stat("/b").unwrap().mode & 0o7777, 0o640);
    m.chmod("/b", 0o600).unwrap();
    assert_eq!(g.stat().unwrap().mode & 0o7777, 0o600);
    let t = WireTime {
        sec: 1_000_000,
        nsec: 5,
    };
    let omit = WireTime {
        sec: 0,
        nsec: UTIME_OMIT,
    };
    m.utimes("/b", t, omit, true).unwrap();
    assert_eq!(m.stat("/b").unwrap().atime, t);
    g.utimes(omit, t).unwrap();
    assert_eq!(g.stat().unwrap().mtime, t);
    let me = rustix::process::geteuid().as_raw();
    g.chown(me, u32::MAX).unwrap();
    m.chown("/b", u32::MAX, u32::MAX, false).unwrap();

    // Directories and names.
    m.mkdir("/d", 0o755).unwrap();
    assert_eq!(errno_of(m.mkdir("/d", 0o755)), libc::EEXIST);
    let dir = m
        .open_flags("/d", libc::O_RDONLY | libc::O_DIRECTORY, 0)
        .unwrap();
    assert_eq!(errno_of(dir.read_at(&mut buf, 0)), libc::EISDIR);
    drop(dir);
    m.rename("/b", "/d/b2", false).unwrap();
    assert_eq!(errno_of(m.stat("/b")), libc::ENOENT);
    m.link("/d/b2", "/d/b3").unwrap();
    m.symlink(b"/d/b2", "/s").unwrap();
    assert_eq!(m.readlink("/s").unwrap(), b"/d/b2");
    assert_eq!(m.stat("/s").unwrap().size, 5);
    assert_eq!(m.lstat("/s").unwrap().mode & libc::S_IFMT, libc::S_IFLNK);
    assert_eq!(errno_of(m.rename("/d/b3", "/d/b2", true)), libc::EEXIST);
    let mut names: Vec<Vec<u8>> = m
        .read_dir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            b".".to_vec(),
            b"..".to_vec(),
            b"b2".to_vec(),
            b"b3".to_vec()
        ]
    );
    assert_eq!(errno_of(m.rmdir("/d")), libc::ENOTEMPTY);
    m.unlink("/d/b3").unwrap();
    m.unlink("/d/b2").unwrap();
    m.rmdir("/d").unwrap();
    // The unlinked file stays readable through its open handle.
    assert_eq!(g.read_at(&mut buf, 0).unwrap(), 5);
    let sf = m.statfs().unwrap();
    assert_eq!(sf.chunk_size, 64 << 10);
    assert!(sf.chunks_free < sf.chunks);
    drop(g);
    f.close().unwrap();
    assert!(m.stats().soft_misses > 0);
}

/// The same random operations on an nvfs file through libmoneta and on a tmpfs file through
/// the kernel; every result and, regularly, the whole contents must agree byte for byte.
#[test]
fn randomized_against_the_kernel() {
    let seed: u64 = std::env::var("MONETA_FILES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("randomized_against_the_kernel: MONETA_FILES_SEED={seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let d = Daemon::start_fs("256M", &["--chunk-size", "64K"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let shm = std::path::Path::new("/dev/shm");
    let kdir = TempDir(shm.join(format!("moneta-files-{}-{seed}", std::process::id())));
    std::fs::create_dir_all(&kdir.0).unwrap();
    // Two files written in turn, so that each one's extents interleave on the array.
    let nf: Vec<libmoneta::File> = (0..2)
        .map(|i| m.open(format!("/f{i}"), &rw()).unwrap())
        .collect();
    let kf: Vec<std::fs::File> = (0..2)
        .map(|i| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(kdir.0.join(format!("f{i}")))
                .unwrap()
        })
        .collect();
    let size_of = |rng: &mut rand::rngs::StdRng| -> usize {
        match rng.gen_range(0..10) {
            0..=4 => rng.gen_range(1..=600),
            5..=7 => rng.gen_range(1..=70_000),
            _ => rng.gen_range(1..=3 << 20),
        }
    };
    for step in 0..400 {
        let i = rng.gen_range(0..2);
        let (n, k) = (&nf[i], &kf[i]);
        let limit = 8u64 << 20;
        let ctx = format!("seed {seed} step {step} file {i}");
        match rng.gen_range(0..10) {
            0..=3 => {
                let len = size_of(&mut rng);
                let off = rng.gen_range(0..limit);
                let mut data = vec![0u8; len];
                rng.fill(&mut data[..]);
                assert_eq!(n.write_at(&data, off).unwrap(), len, "{ctx}");
                k.write_all_at(&data, off).unwrap();
            }
            4..=6 => {
                let len = size_of(&mut rng);
                let off = rng.gen_range(0..limit + (1 << 20));
                let mut a = vec![0xAAu8; len];
                let mut b = vec![0x55u8; len];
                let na = n.read_at(&mut a, off).unwrap();
                let nb = read_full_at(k, &mut b, off);
                assert_eq!(na, nb, "{ctx}: read length at {off}+{len}");
                assert!(a[..na] == b[..nb], "{ctx}: read bytes at {off}+{len}");
            }
            7 => {
                let size = match rng.gen_range(0..3) {
                    0 => 0,
                    1 => rng.gen_range(0..limit),
                    _ => rng.gen_range(0..(1 << 20)),
                };
                n.set_len(size).unwrap();
                k.set_len(size).unwrap();
            }
            8 => {
                let bufs: Vec<Vec<u8>> = (0..rng.gen_range(1..4))
                    .map(|_| {
                        let mut b = vec![0u8; rng.gen_range(0..5000)];
                        rng.fill(&mut b[..]);
                        b
                    })
                    .collect();
                let slices: Vec<IoSlice> = bufs.iter().map(|b| IoSlice::new(b)).collect();
                let off = rng.gen_range(0..limit);
                let total: usize = bufs.iter().map(|b| b.len()).sum();
                assert_eq!(n.write_vectored_at(&slices, off).unwrap(), total, "{ctx}");
                k.write_all_at(&bufs.concat(), off).unwrap();
            }
            _ => compare_whole(n, k, &ctx),
        }
    }
    for i in 0..2 {
        compare_whole(&nf[i], &kf[i], &format!("seed {seed} final file {i}"));
    }
    let s = m.stats();
    assert!(
        s.extends > 0 && s.soft_misses > 0 && s.commands > 0,
        "{s:?}"
    );
}

fn read_full_at(k: &std::fs::File, buf: &mut [u8], off: u64) -> usize {
    let mut done = 0;
    while done < buf.len() {
        match k.read_at(&mut buf[done..], off + done as u64).unwrap() {
            0 => break,
            n => done += n,
        }
    }
    done
}

fn compare_whole(n: &libmoneta::File, k: &std::fs::File, ctx: &str) {
    let ks = k.metadata().unwrap().len();
    assert_eq!(n.len().unwrap(), ks, "{ctx}: size");
    let mut a = vec![0u8; ks as usize + 1];
    let mut b = vec![0u8; ks as usize + 1];
    assert_eq!(
        n.read_at(&mut a, 0).unwrap(),
        ks as usize,
        "{ctx}: whole read"
    );
    assert_eq!(read_full_at(k, &mut b, 0), ks as usize);
    if a != b {
        let p = a.iter().zip(&b).position(|(x, y)| x != y);
        panic!("{ctx}: contents differ first at byte {p:?}");
    }
}

/// Many threads of one process share its channel: disjoint ranges keep their own bytes, and
/// overlapping 4 KiB writes (one command each) are never torn.
#[test]
fn threads_share_one_channel() {
    let d = Daemon::start_fs("128M", &["--chunk-size", "64K"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = Arc::new(m.open("/shared", &rw()).unwrap());
    let threads = 8u64;
    let per = 256u64 << 10;
    f.set_len(threads * per).unwrap();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let base = t * per;
                for round in 0..40u64 {
                    let len = rng.gen_range(1..=40_000usize);
                    let off = base + rng.gen_range(0..per - len as u64);
                    let data = pattern((t * 7 + round) as u8, off, len);
                    f.write_at(&data, off).unwrap();
                    let mut back = vec![0u8; len];
                    assert_eq!(f.read_at(&mut back, off).unwrap(), len);
                    assert!(back == data, "thread {t} round {round}");
                    // Overlapping area: uniform 4 KiB blocks at the front of the file.
                    let blk = rng.gen_range(0..16u64) * 4096;
                    let fill = vec![(t * 16 + round % 16) as u8; 4096];
                    f.write_at(&fill, threads * per + blk).unwrap();
                    let mut got = vec![0u8; 4096];
                    f.read_at(&mut got, threads * per + rng.gen_range(0..16u64) * 4096)
                        .unwrap();
                    assert!(got.iter().all(|&b| b == got[0]), "torn block");
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    let mut got = vec![0u8; 4096];
    for b in 0..16u64 {
        f.read_at(&mut got, threads * per + b * 4096).unwrap();
        assert!(got.iter().all(|&x| x == got[0]), "block {b} torn");
    }
}

/// A permission table of 8 entries for 24 files read in turn: records are evicted all the time
/// and every read still returns the right bytes, through hard misses.
#[test]
fn hard_misses_from_a_tiny_table() {
    let d = Daemon::start_fs("64M", &["--chunk-size", "64K", "--table-entries", "8"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let files: Vec<_> = (0..24)
        .map(|i| {
            let f = m.open(format!("/h{i}"), &rw()).unwrap();
            f.write_at(&pattern(i as u8, 0, 100_000), 0).unwrap();
            f
        })
        .collect();
    let mut want: Vec<Vec<u8>> = (0..24).map(|i| pattern(i as u8, 0, 100_000)).collect();
    for round in 0..3 {
        for (i, f) in files.iter().enumerate() {
            let mut buf = vec![0u8; 100_000];
            assert_eq!(f.read_at(&mut buf, 0).unwrap(), 100_000);
            assert!(buf == want[i], "round {round} file {i}");
            want[i][5] = round as u8;
            f.write_at(&[round as u8], 5).unwrap();
            let mut one = [0u8; 1];
            f.read_at(&mut one, 5).unwrap();
            assert_eq!(one[0], round as u8);
        }
    }
    assert!(m.stats().hard_misses > 0, "{:?}", m.stats());
}

/// A hard miss (a record evicted from a full table) costs one lookup of the one extent whose
/// record went: the rest of the file's map stays, and the lookup does not reinstall records
/// that are still there (which would evict others in turn).
#[test]
fn a_hard_miss_looks_up_only_the_missing_extent() {
    const CHUNK: usize = 64 << 10;
    let d = Daemon::start_fs(
        "64M",
        &[
            "--chunk-size",
            "64K",
            "--table-entries",
            "16",
            "--no-merge",
            "--append-reserve",
            "0",
        ],
    );
    {
        // Files of single-chunk extents: each chunk written in turn with a spacer's (no
        // reserves keep them apart).
        let w = Moneta::connect(&d.socket).unwrap();
        for (name, extents) in [("/a", 12u8), ("/b", 8)] {
            let f = w.open(name, &rw()).unwrap();
            let spacer = w.open(format!("{name}-spacer"), &rw()).unwrap();
            for i in 0..extents {
                let at = u64::from(i) * CHUNK as u64;
                f.write_at(&pattern(i, at, CHUNK), at).unwrap();
                spacer.write_at(&[0; CHUNK], at).unwrap();
            }
        }
    }
    let m = Moneta::connect(&d.socket).unwrap();
    let a = m.open("/a", OpenOptions::new().read(true)).unwrap();
    let b = m.open("/b", OpenOptions::new().read(true)).unwrap();
    let mut whole = vec![0u8; 12 * CHUNK];
    assert_eq!(a.read_at(&mut whole, 0).unwrap(), whole.len());
    assert_eq!(m.stats().soft_misses, 1, "one lookup maps the whole file");
    // Reading /b installs 8 more records in a table of 16: 4 of /a's go.
    let mut bb = vec![0u8; 8 * CHUNK];
    assert_eq!(b.read_at(&mut bb, 0).unwrap(), bb.len());
    let ctl = d.control();
    let (ev0, s0) = (ctl.status().unwrap().table_evictions, m.stats());
    assert!(ev0 >= 4, "the table overflowed");
    for i in 0..12u8 {
        let at = u64::from(i) * CHUNK as u64;
        let mut buf = [0u8; 512];
        assert_eq!(a.read_at(&mut buf, at).unwrap(), 512);
        assert_eq!(&buf[..], &pattern(i, at, CHUNK)[..512], "extent {i}");
    }
    let (ev1, s1) = (ctl.status().unwrap().table_evictions, m.stats());
    let lookups = s1.soft_misses - s0.soft_misses;
    assert!(s1.hard_misses > s0.hard_misses, "{s0:?} {s1:?}");
    assert_eq!(
        lookups,
        s1.hard_misses - s0.hard_misses,
        "one lookup per hard miss"
    );
    // The table is full, so every record installed evicted one: one record per lookup.
    assert_eq!(ev1 - ev0, lookups, "records installed by {lookups} lookups");
    // The channel's own `evictions` word counts its records evicted by installs of every kind
    // (here the lookups of soft misses): all the table's evictions, as it is the only channel
    // with records once the writer has gone.
    let own = m.channel().header().evictions.load(Ordering::Relaxed);
    assert!(
        own >= ev1 - ev0 && own > 0,
        "channel evictions {own}, table {ev0}..{ev1}"
    );
}

/// Sizes between connections: a reader that cached a larger size sees a truncate by another
/// process at once (its records were revoked), and appenders in two connections never overlap.
#[test]
fn size_coherence_between_connections() {
    let d = Daemon::start_fs("64M", &["--chunk-size", "64K"]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let fa = a.open("/c", &rw()).unwrap();
    fa.write_at(&vec![7u8; 10_000], 0).unwrap();
    let fb = b.open("/c", &rw()).unwrap();
    let mut buf = vec![0u8; 10_000];
    assert_eq!(fb.read_at(&mut buf, 0).unwrap(), 10_000);
    fa.set_len(100).unwrap();
    assert_eq!(
        fb.read_at(&mut buf, 0).unwrap(),
        100,
        "stale size after truncate"
    );
    assert_eq!(fb.read_at(&mut buf, 200).unwrap(), 0);
    // Growth by another connection is seen too.
    fa.write_at(b"tail", 50_000).unwrap();
    assert_eq!(fb.read_at(&mut buf[..4], 50_000).unwrap(), 4);
    assert_eq!(&buf[..4], b"tail");
    assert_eq!(fb.read_at(&mut buf[..100], 150).unwrap(), 100);
    assert!(buf[..100].iter().all(|&x| x == 0), "the gap reads zeros");

    // A read that starts inside the size this connection knows and ends past it returns the
    // bytes written since through another connection, as through the kernel; so does one
    // through another descriptor of the same connection.
    let ga = a.open("/grow", &rw()).unwrap();
    ga.write_at(&[1u8; 100], 0).unwrap();
    let gb = b.open("/grow", &rw()).unwrap();
    let mut small = vec![0u8; 1000];
    assert_eq!(gb.read_at(&mut small, 0).unwrap(), 100);
    ga.write_at(&[2u8; 100], 100).unwrap();
    assert_eq!(gb.stat().unwrap().size, 200);
    assert_eq!(
        gb.read_at(&mut small, 0).unwrap(),
        200,
        "pread after growth"
    );
    assert_eq!(&small[100..200], &[2u8; 100]);
    let ga2 = a.open("/grow", &rw()).unwrap();
    ga2.write_at(&[3u8; 4096], 200).unwrap();
    assert_eq!(ga.read_at(&mut small, 0).unwrap(), 1000, "same connection");
    ga.write_at(&[4u8; 3 << 20], 4296).unwrap();
    let mut big = vec![0u8; 4 << 20];
    assert_eq!(gb.read_at(&mut big, 0).unwrap(), 4296 + (3 << 20));
    assert!(big[4296..4296 + (3 << 20)].iter().all(|&x| x == 4));

    let mut o = OpenOptions::new();
    o.append(true).create(true);
    let pa = a.open("/log", &o).unwrap();
    let pb = b.open("/log", &o).unwrap();
    let h: Vec<_> = [(pa, b'a'), (pb, b'b')]
        .into_iter()
        .map(|(f, c)| {
            std::thread::spawn(move || {
                for _ in 0..200 {
                    f.write(&[c; 100]).unwrap();
                }
            })
        })
        .collect();
    for t in h {
        t.join().unwrap();
    }
    let r = a.open("/log", OpenOptions::new().read(true)).unwrap();
    let mut all = vec![0u8; 40_001];
    assert_eq!(r.read_at(&mut all, 0).unwrap(), 40_000);
    for rec in all[..40_000].chunks(100) {
        assert!(rec.iter().all(|&x| x == rec[0]), "interleaved appends");
    }
}

/// Many more threads than CPUs share one channel and its 64 tags: each makes progress (tags
/// go to waiting threads in turn, and threads beyond the CPUs sleep instead of spinning, so
/// the device's poller keeps a CPU). Before, some threads did nothing for seconds.
#[test]
fn many_threads_on_one_channel_all_make_progress() {
    let d = Daemon::start_fs("256M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/shared", &rw()).unwrap();
    f.write_at(&vec![3u8; 16 << 20], 0).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let counts: Vec<std::sync::atomic::AtomicU64> = (0..32)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    std::thread::scope(|s| {
        for (i, c) in counts.iter().enumerate() {
            let (f, stop) = (&f, &stop);
            s.spawn(move || {
                let mut buf = vec![0u8; 64 << 10];
                let mut off = (i as u64 * 977 * 4096) % (15 << 20);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    assert_eq!(f.read_at(&mut buf, off).unwrap(), buf.len());
                    assert!(buf.iter().all(|&b| b == 3));
                    c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    off = (off + 64 * 4096 + 4096) % (15 << 20);
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let n: Vec<u64> = counts
        .iter()
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    let mean = n.iter().sum::<u64>() as f64 / n.len() as f64;
    let min = *n.iter().min().unwrap();
    assert!(
        min as f64 >= mean / 10.0 && min > 0,
        "a thread starved: {min} reads against a mean of {mean:.0} ({n:?})"
    );
}

/// `fallocate` takes the space at once: a full device answers `ENOSPC` then, not at a later
/// write, and space taken stays writable whatever else fills the device.
#[test]
fn allocate_takes_the_space_at_once() {
    let d = Daemon::start_fs("16M", &["--chunk-size", "64K"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/reserved", &rw()).unwrap();
    f.allocate(0, 4 << 20, false).unwrap();
    assert_eq!(f.len().unwrap(), 4 << 20);
    // A read-write file's first growth leaves room past its end (docs/abi.md §3.9), which
    // another file's allocation takes back before it is refused: it counts as free here.
    let room = f.stat().unwrap().blocks * 512 / (64 << 10) - 64;
    let free = m.statfs().unwrap().chunks_free + room;
    // More than is left fails at once and changes nothing.
    let g = m.open("/greedy", &rw()).unwrap();
    assert_eq!(
        errno_of(g.allocate(0, (free + 1) * (64 << 10), false)),
        libc::ENOSPC
    );
    assert_eq!(g.len().unwrap(), 0);
    assert_eq!(m.statfs().unwrap().chunks_free, free);
    assert_eq!(
        errno_of(g.allocate(0, (free + 1) * (64 << 10), true)),
        libc::ENOSPC,
        "keep-size checks the room too"
    );
    // Another file takes all the rest; the reserved range still takes its writes.
    let mut at = 0u64;
    while g.write_at(&[9u8; 64 << 10], at).is_ok() {
        at += 64 << 10;
    }
    assert_eq!(m.statfs().unwrap().chunks_free, 0);
    f.write_at(&vec![5u8; 4 << 20], 0).unwrap();
    let mut back = vec![0u8; 4 << 20];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), 4 << 20);
    assert!(back.iter().all(|&x| x == 5));
    // Keep-size inside the size fills holes without growing the file.
    let h = m.open("/sparse", &rw()).unwrap();
    assert_eq!(errno_of(h.allocate(0, 64 << 10, true)), libc::ENOSPC);
    h.set_len(1 << 20).unwrap();
    assert_eq!(errno_of(h.allocate(0, 64 << 10, true)), libc::ENOSPC);
    assert_eq!(h.len().unwrap(), 1 << 20);
    g.close().unwrap();
    m.unlink("/greedy").unwrap();
    let before = m.statfs().unwrap().chunks_free;
    h.allocate(64 << 10, 128 << 10, true).unwrap();
    assert_eq!(m.statfs().unwrap().chunks_free, before - 2);
    assert_eq!(h.len().unwrap(), 1 << 20);
    assert_eq!(errno_of(h.allocate(0, 0, false)), libc::EINVAL);
    let r = m.open("/reserved", OpenOptions::new().read(true)).unwrap();
    assert_eq!(errno_of(r.allocate(0, 1, false)), libc::EBADF);
}

/// Completion policies: every mode moves the same bytes, per call, per file and per connection.
#[test]
fn completion_modes() {
    let d = Daemon::start_fs("64M", &["--chunk-size", "64K"]);
    let m = Moneta::connect_with(&d.socket, Policy::Fixed(Completion::Sleep)).unwrap();
    assert_eq!(m.policy(), Policy::Fixed(Completion::Sleep));
    let f = m.open("/p", &rw()).unwrap();
    let data = pattern(3, 0, 300_000);
    for (i, mode) in [Completion::Dma, Completion::Forward, Completion::Sleep]
        .into_iter()
        .enumerate()
    {
        let off = i as u64 * 400_000;
        f.write_at_with(&data, off, mode).unwrap();
        let mut back = vec![0u8; data.len()];
        assert_eq!(f.read_at_with(&mut back, off, mode).unwrap(), data.len());
        assert!(back == data);
    }
    f.set_policy(Some(Policy::Auto { spin_max: 1024 }));
    assert_eq!(f.policy(), Policy::Auto { spin_max: 1024 });
    f.write_at(&data[..100], 0).unwrap();
    f.set_policy(None);
    assert_eq!(f.policy(), Policy::Fixed(Completion::Sleep));
}

/// The asynchronous API: more requests than tags in flight, wait any / all, batches, polling,
/// zero-copy reads and writes, appends, errors.
#[test]
fn asynchronous_requests() {
    use libmoneta::aio::{wait_all, wait_any};
    let d = Daemon::start_fs("64M", &["--chunk-size", "64K"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/q", &rw()).unwrap();
    let body = pattern(9, 0, 2 << 20);
    f.write_at(&body, 0).unwrap();

    // 200 reads of assorted sizes and offsets, far more than the channel's 64 tags.
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let asks: Vec<(u64, usize)> = (0..200)
        .map(|_| {
            let len = [1usize, 512, 4096, 20_000, 100_000][rng.gen_range(0..5)];
            (rng.gen_range(0..(2u64 << 20) + 1000), len)
        })
        .collect();
    let mut reqs: Vec<_> = asks
        .iter()
        .map(|&(off, len)| f.submit_read(vec![0u8; len], off).unwrap())
        .collect();
    let mut seen = 0;
    while !reqs.is_empty() {
        let i = wait_any(&mut reqs).unwrap();
        let mut r = reqs.swap_remove(i);
        let n = r.wait().unwrap();
        assert!(r.data().len() == n);
        seen += 1;
        let _ = r.into_buffer();
    }
    assert_eq!(seen, 200);
    // Each result checked against the file.
    let mut reqs: Vec<_> = asks
        .iter()
        .map(|&(off, len)| f.submit_read(vec![0u8; len], off).unwrap())
        .collect();
    wait_all(&mut reqs);
    for (r, &(off, len)) in reqs.iter_mut().zip(&asks) {
        assert!(r.is_done());
        let n = r.wait().unwrap();
        let want = len.min((body.len() as u64).saturating_sub(off) as usize);
        assert_eq!(n, want, "read at {off}+{len}");
        assert!(r.data() == &body[off as usize..off as usize + n]);
        assert_eq!(
            errno_of(r.wait()),
            libc::EINVAL,
            "a result is taken only once"
        );
    }
    drop(reqs);

    // Writes, batched, then read back synchronously.
    let ops: Vec<(bool, Vec<u8>, u64)> = (0..40u64)
        .map(|i| (true, pattern(i as u8, i, 3000), 3_000_000 + i * 3000))
        .collect();
    let mut ws: Vec<_> = f
        .submit_batch(ops)
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    while ws.iter_mut().any(|w| !w.poll()) {
        std::hint::spin_loop();
    }
    for w in &mut ws {
        assert_eq!(w.wait().unwrap(), 3000);
    }
    drop(ws);
    for i in 0..40u64 {
        let mut back = vec![0u8; 3000];
        f.read_at(&mut back, 3_000_000 + i * 3000).unwrap();
        assert!(back == pattern(i as u8, i, 3000), "batched write {i}");
    }

    // Zero-copy: a write filled in its DMA slice, a read left in its slice; also across an
    // extent boundary (64 KiB chunks), where the library copies instead.
    for off in [8192u64, 65_536 - 100] {
        let mut slot = f.write_slot(1000).unwrap();
        slot.buf().copy_from_slice(&pattern(77, off, 1000));
        let mut w = slot.submit(off).unwrap();
        assert_eq!(w.wait().unwrap(), 1000);
        drop(w);
        let mut r = f.submit_read_in_place(off, 1000).unwrap();
        assert_eq!(r.wait().unwrap(), 1000);
        assert!(r.data() == pattern(77, off, 1000), "in place at {off}");
    }
    assert_eq!(
        errno_of(f.submit_read_in_place(0, 1 << 20)),
        libc::EINVAL,
        "more than a slice"
    );

    // Append and access errors.
    let mut o = OpenOptions::new();
    o.append(true);
    let ap = m.open("/q", &o).unwrap();
    let size = f.len().unwrap();
    let mut a = ap.submit_write(b"end".to_vec(), 0).unwrap();
    assert_eq!(a.wait().unwrap(), 3);
    drop(a);
    let mut tail = [0u8; 3];
    f.read_at(&mut tail, size).unwrap();
    assert_eq!(&tail, b"end");
    assert_eq!(errno_of(ap.submit_read(vec![0; 10], 0)), libc::EBADF);
    let ro = m.open("/q", OpenOptions::new().read(true)).unwrap();
    assert_eq!(errno_of(ro.submit_write(vec![1], 0)), libc::EBADF);
    // A read past the end ends at once with 0 bytes.
    let mut r = ro.submit_read(vec![0; 10], 1 << 30).unwrap();
    assert_eq!(r.wait().unwrap(), 0);
    // Dropping requests in flight is safe, and the tags come back.
    let inflight: Vec<_> = (0..100u64)
        .map(|i| ro.submit_read(vec![0u8; 16384], i * 16384).unwrap())
        .collect();
    drop(inflight);
    let mut again = ro.submit_read(vec![0u8; 4096], 0).unwrap();
    assert_eq!(again.wait().unwrap(), 4096);
}

/// Requests the application has not reaped yet hold tags, and never starve the others: a
/// request waited for before older ones, and a synchronous call in another thread, move the
/// older requests along to free their tags. Zero-copy requests hold theirs up to a limit.
#[test]
fn unreaped_requests_do_not_starve_others() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/s", &rw()).unwrap();
    let body = pattern(3, 0, 8 << 20);
    f.write_at(&body, 0).unwrap();

    // 20 reads of 256 KiB need 320 commands, five times the tags: the last one waited for
    // first still ends.
    let mut reqs: Vec<_> = (0..20u64)
        .map(|i| {
            f.submit_read(vec![0u8; 256 << 10], i * (256 << 10))
                .unwrap()
        })
        .collect();
    for (i, r) in reqs.iter_mut().enumerate().rev() {
        assert_eq!(r.wait().unwrap(), 256 << 10);
        let off = i * (256 << 10);
        assert!(r.data() == &body[off..off + (256 << 10)], "request {i}");
    }
    drop(reqs);

    // One thread leaves 40 requests unreaped; another reads synchronously meanwhile.
    std::thread::scope(|sc| {
        let mut mine: Vec<_> = (0..40u64)
            .map(|i| f.submit_read(vec![0u8; 64 << 10], i * (64 << 10)).unwrap())
            .collect();
        let other = sc.spawn(|| {
            let mut big = vec![0u8; 4 << 20];
            assert_eq!(f.read_at(&mut big, 1 << 20).unwrap(), 4 << 20);
            assert!(big == body[1 << 20..5 << 20]);
        });
        other.join().unwrap();
        for (i, r) in mine.iter_mut().enumerate() {
            assert_eq!(r.wait().unwrap(), 64 << 10);
            assert!(r.data() == &body[i * (64 << 10)..(i + 1) * (64 << 10)]);
        }
    });

    // Requests can be waited for on another thread than the one that submitted them.
    let mut r = f.submit_read(vec![0u8; 100], 7).unwrap();
    let want = &body[7..107];
    std::thread::scope(|sc| {
        sc.spawn(move || {
            assert_eq!(r.wait().unwrap(), 100);
            assert!(r.data() == want);
        });
    });

    // Zero-copy requests keep their tags until dropped, up to the limit.
    let mut pinned: Vec<_> = (0..libmoneta::aio::MAX_PINNED_TAGS as u64)
        .map(|i| f.submit_read_in_place(i * 4096, 4096).unwrap())
        .collect();
    assert_eq!(errno_of(f.submit_read_in_place(0, 4096)), libc::EAGAIN);
    assert_eq!(errno_of(f.write_slot(10)), libc::EAGAIN);
    // Synchronous calls still find tags.
    let mut b = vec![0u8; 1 << 20];
    assert_eq!(f.read_at(&mut b, 0).unwrap(), 1 << 20);
    pinned.pop();
    let mut again = f.submit_read_in_place(0, 4096).unwrap();
    assert_eq!(again.wait().unwrap(), 4096);
    assert!(again.data() == &body[..4096]);
}

/// The C example, compiled against `include/moneta.h` with warnings as errors and linked with
/// `libmoneta.so`, runs its synchronous and asynchronous checks against a real daemon.
#[test]
fn c_example_program() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = std::path::Path::new(env!("CARGO_BIN_EXE_monetad"))
        .parent()
        .unwrap()
        .to_path_buf();
    let so = dir.join("libmoneta.so");
    {
        // `cargo test` does not build the C library, or leaves it as the last `cargo build`
        // made it: bring it up to date.
        let mut c = std::process::Command::new(env!("CARGO"));
        c.args(["build", "--quiet", "-p", "libmoneta-c"]);
        if dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(c.status().unwrap().success(), "cargo build -p libmoneta-c");
    }
    assert!(so.exists(), "{} missing", so.display());
    let tmp = TempDir::new("cex");
    let exe = tmp.0.join("moneta_example");
    let out = std::process::Command::new("cc")
        .args([
            "-std=c11",
            "-D_GNU_SOURCE",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O1",
            "-I",
        ])
        .arg(root.join("include"))
        .arg(root.join("examples/c/moneta_example.c"))
        .arg("-L")
        .arg(&dir)
        .arg("-lmoneta")
        .arg(format!("-Wl,-rpath,{}", dir.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = Daemon::start_fs("64M", &[]);
    let run = std::process::Command::new(&exe)
        .env("MONETA_SOCKET", &d.socket)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success() && stdout.contains("moneta_example: ok"),
        "example failed: {}\n{}{}",
        run.status,
        stdout,
        String::from_utf8_lossy(&run.stderr)
    );
}

/// A connection keeps a file's extents in its map; another connection truncates the file and
/// the freed space goes to another file, which the first connection then opens and reads (so
/// its channel holds records for that space again). Reading and writing the first file must
/// not reach the second file's bytes.
#[test]
fn a_stale_map_never_reaches_space_given_to_another_file() {
    let d = Daemon::start_fs("8M", &["--chunk-size", "64K"]);
    let a = Moneta::connect(&d.socket).unwrap();
    let b = Moneta::connect(&d.socket).unwrap();
    let fa = a.open("/f", &rw()).unwrap();
    fa.write_at(&[b'F'; 4096], 0).unwrap();
    let mut buf = [0u8; 4096];
    assert_eq!(fa.read_at(&mut buf, 0).unwrap(), 4096);
    // The other connection frees the file's only chunk and gives space to new files until
    // the device is full, so the freed chunk is certainly among them.
    b.open("/f", &rw()).unwrap().set_len(0).unwrap();
    let mut others = Vec::new();
    for i in 0.. {
        let g = b.open(format!("/g{i}"), &rw()).unwrap();
        if g.write_at(&[b'G'; 4096], 0).is_err() {
            break;
        }
        others.push(format!("/g{i}"));
    }
    // The first connection reads every new file and keeps it open: its channel now holds
    // their records.
    let mut held = Vec::new();
    for name in &others {
        let g = a.open(name, OpenOptions::new().read(true)).unwrap();
        assert_eq!(g.read_at(&mut buf, 0).unwrap(), 4096);
        assert_eq!(buf, [b'G'; 4096]);
        held.push(g);
    }
    // The truncated file is empty: nothing to read, and a write lands in the file itself.
    assert_eq!(
        fa.read_at(&mut buf, 0).unwrap(),
        0,
        "read the other file's bytes"
    );
    // Room for the write: one of the new files goes (closed here first, so its space is freed).
    held.pop();
    b.unlink(others.pop().unwrap()).unwrap();
    fa.write_at(&[b'f'; 16], 0).unwrap();
    for name in &others {
        let g = a.open(name, OpenOptions::new().read(true)).unwrap();
        g.read_at(&mut buf, 0).unwrap();
        assert_eq!(
            buf, [b'G'; 4096],
            "{name} was written through the other file's map"
        );
    }
    assert_eq!(fa.read_at(&mut buf[..16], 0).unwrap(), 16);
    assert_eq!(&buf[..16], &[b'f'; 16]);
}

/// Closes posted without waiting (docs/libmoneta.md, "Closes posted"), from many threads of
/// one connection at once, mixed with lock calls: every close is made (the files' space, all
/// unlinked, is free again at the next `statfs`), and a lock released by a close is free for
/// another owner as soon as the close returned.
#[test]
fn closes_posted_from_many_threads_are_all_made_and_release_locks_at_once() {
    let d = Daemon::start_fs("64M", &["--chunk-size", "4K"]);
    let m = Arc::new(Moneta::connect(&d.socket).unwrap());
    let other = Moneta::connect(&d.socket).unwrap();
    m.mkdir("/t", 0o755).unwrap();
    let posted0 = libmoneta::closes_posted();
    let free0 = m.statfs().unwrap().chunks_free;
    let inodes0 = m.statfs().unwrap().inodes_free;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                let data = vec![t as u8; 8192];
                for i in 0..300 {
                    let path = format!("/t/{t}-{i}");
                    let f = m.open(&path, &rw()).unwrap();
                    assert_eq!(f.write_at(&data, 0).unwrap(), data.len());
                    // Dropped: the close is posted. A file unlinked while open, too.
                    if i % 3 == 0 {
                        m.unlink(&path).unwrap();
                        drop(f);
                    } else {
                        drop(f);
                        let g = m.open(&path, OpenOptions::new().read(true)).unwrap();
                        let mut back = vec![0u8; 8192];
                        assert_eq!(g.read_at(&mut back, 0).unwrap(), back.len());
                        assert_eq!(back, data);
                        drop(g);
                        m.unlink(&path).unwrap();
                    }
                }
            })
        })
        .collect();
    // Meanwhile: a file this connection locks and closes, and another owner that must find
    // the lock free once the close has returned.
    use libmoneta::{LockCmd, LockKind, LockType};
    for _ in 0..200 {
        let f = m.open("/t/locked", &rw()).unwrap();
        f.lock(LockKind::Posix, LockCmd::Set, LockType::Write, 0, 0, false)
            .unwrap();
        drop(f);
        let g = other.open("/t/locked", &rw()).unwrap();
        g.lock(LockKind::Posix, LockCmd::Set, LockType::Write, 0, 0, false)
            .expect("the lock is released by the close that returned");
        drop(g);
    }
    for t in threads {
        t.join().unwrap();
    }
    m.unlink("/t/locked").unwrap();
    // `statfs` waits for the posted closes: every unlinked file's space and inode is back.
    let st = m.statfs().unwrap();
    assert_eq!(st.chunks_free, free0);
    assert_eq!(st.inodes_free, inodes0);
    // The 1,200 files' and 800 readers' closes were posted (one that found no free tag
    // would have waited instead); the locked file's 200 were not.
    assert!(
        libmoneta::closes_posted() - posted0 >= 1000,
        "{} closes posted",
        libmoneta::closes_posted() - posted0
    );
}
