//! The durability levels: what a metadata call and `fsync` flush at each level, and, at the
//! `Host` level, the images a crash of the machine could leave at any point of a random
//! workload (every page changed since its last flush kept or lost, at random): each checks
//! clean, holds every fsync'd file whole, and shows no file another file's bytes.
//!
//! `MONETA_HOST_CRASH_SEED` replays a run of the workload (the seed is printed).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use moneta_device::{MappedArray, Media};
use moneta_fs::layout::{S_IFMT, S_IFREG};
use moneta_fs::{mkfs, Cred, Durability, Fs, MkfsOptions, MountOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CREAT: i32 = libc::O_CREAT | libc::O_RDWR;

/// 4 KiB chunks (the default) on a small array.
fn small(size: u64) -> Arc<MappedArray> {
    let a = Arc::new(MappedArray::volatile(size).unwrap());
    let o = MkfsOptions {
        inode_count: Some(256),
        dirent_count: Some(512),
        ..Default::default()
    };
    mkfs(&*a, &o).unwrap();
    a
}

/// Mounts an array formatted just now (its free space reads as zeros: nothing to zero before
/// the first allocation).
fn mount_at(a: Arc<dyn Media>, durability: Durability) -> Fs {
    Fs::mount_with(
        a,
        MountOptions {
            durability,
            fresh: true,
            ..Default::default()
        },
    )
    .unwrap()
}

/// The word of file data at word index `i` of a file: its inode and generation with the
/// index, so that any word found in a file says which file wrote it.
fn word(ino: u64, generation: u32, i: u64) -> u64 {
    (ino << 40) | ((generation as u64 & 0xf_ffff) << 20) | (i & 0xf_ffff)
}

/// Writes `len` bytes (a multiple of 8) of `ino`'s words at `off` (a multiple of 8), growing
/// the file first, through the array as a client's channel would.
fn write_words(fs: &mut Fs, a: &dyn Media, ino: u64, off: u64, len: u64) {
    let generation = fs.stat_ino(ino).generation;
    fs.extend(ino, off, len, 1 << 20).unwrap();
    let (_, runs) = fs.map(ino, off, len, 1 << 20).unwrap();
    for r in runs {
        let dev = r.dev.expect("allocated");
        let from = r.file_off.max(off);
        let to = (r.file_off + r.len).min(off + len);
        let bytes: Vec<u8> = (from / 8..to / 8)
            .flat_map(|i| word(ino, generation, i).to_le_bytes())
            .collect();
        // SAFETY: the bytes lie inside the file's chunks, inside the array.
        unsafe { a.write(dev + (from - r.file_off), bytes.as_ptr(), bytes.len()) };
    }
}

/// The contents of a file.
fn read_all(fs: &Fs, a: &dyn Media, ino: u64) -> Vec<u8> {
    let (size, runs) = fs.map(ino, 0, u64::MAX, 1 << 20).unwrap();
    let mut out = vec![0u8; size as usize];
    for r in runs {
        if let Some(dev) = r.dev {
            let from = r.file_off as usize;
            let to = (from + r.len as usize).min(out.len());
            // SAFETY: the destination is valid; the range lies inside the array.
            unsafe { a.read(dev, out[from..to].as_mut_ptr(), to - from) };
        }
    }
    out
}

/// Every regular file under `dir`, by path.
fn files(fs: &Fs, dir: &str, out: &mut Vec<(String, u64)>) {
    let root = Cred::root();
    let ino = fs.lookup(&root, dir.as_bytes(), true).unwrap();
    let (entries, end) = fs.readdir(ino, 2, 100_000).unwrap();
    assert!(end);
    for e in entries {
        let path = format!(
            "{}/{}",
            dir.trim_end_matches('/'),
            String::from_utf8_lossy(&e.name)
        );
        let st = fs.stat_ino(e.ino);
        if st.mode & S_IFMT == S_IFREG {
            out.push((path, e.ino));
        } else if st.mode & S_IFMT == libc::S_IFDIR {
            files(fs, &path, out);
        }
    }
}

/// A file that was fsync'd and not changed since: (inode, generation, bytes).
type Durable = BTreeMap<String, (u64, u32, u64)>;

/// Checks the image a crash left: clean, every durable file whole, every word of every file
/// its own (or zero).
fn check_image(img: &Arc<MappedArray>, durable: &Durable, ctx: &str) {
    let out = moneta_fs::fsck(&**img, false).unwrap();
    assert_eq!(out.before.errors(), 0, "{ctx}: {:?}", out.before.problems);
    let fs = Fs::mount(img.clone() as Arc<dyn Media>).unwrap();
    let root = Cred::root();
    for (path, &(ino, generation, len)) in durable {
        let st = fs
            .stat(&root, path.as_bytes(), true)
            .unwrap_or_else(|e| panic!("{ctx}: fsync'd {path} is lost: {e}"));
        assert_eq!(
            (st.ino, st.generation, st.size),
            (ino, generation, len),
            "{ctx}: fsync'd {path}"
        );
        let data = read_all(&fs, &**img, ino);
        for (i, w) in data.chunks(8).enumerate() {
            let got = u64::from_le_bytes(w.try_into().unwrap());
            assert_eq!(
                got,
                word(ino, generation, i as u64),
                "{ctx}: {path} word {i}"
            );
        }
    }
    let mut all = Vec::new();
    files(&fs, "/", &mut all);
    for (path, ino) in all {
        let generation = fs.stat_ino(ino).generation;
        let data = read_all(&fs, &**img, ino);
        for (i, w) in data.chunks_exact(8).enumerate() {
            let got = u64::from_le_bytes(w.try_into().unwrap());
            assert!(
                got == 0 || got >> 20 == word(ino, generation, 0) >> 20,
                "{ctx}: {path} (inode {ino} generation {generation}) word {i} is {got:#x}, \
                 another file's"
            );
        }
    }
}

#[test]
fn metadata_calls_flush_nothing_and_fsync_flushes_once() {
    let a = Arc::new(HostCrash::new(small(32 << 20)));
    let root = Cred::root();
    let mut fs = mount_at(a.clone(), Durability::Host);
    let before = a.flushes();
    fs.mkdir(&root, b"/d", 0o755).unwrap();
    let mut inos = Vec::new();
    for i in 0..20 {
        let o = fs
            .open(&root, format!("/d/f{i}").as_bytes(), CREAT, 0o644)
            .unwrap();
        write_words(&mut fs, &*a, o.ino, 0, 8000 + i * 8);
        write_words(&mut fs, &*a, o.ino, 8000 + i * 8, 16);
        fs.close(o.ino).unwrap();
        inos.push(o.ino);
    }
    fs.rename(&root, b"/d/f1", b"/d/f2", false).unwrap();
    fs.unlink(&root, b"/d/f3").unwrap();
    fs.truncate(&root, b"/d/f4", 10).unwrap();
    assert_eq!(
        a.flushes(),
        before,
        "creates, extends, renames, unlinks and truncates wait for no flush"
    );
    let o = fs.open(&root, b"/d/f5", libc::O_RDWR, 0).unwrap();
    fs.fsync(o.ino).unwrap();
    assert_eq!(a.flushes(), before + 1, "fsync is one ordered flush");
    // The file's data and everything the journal holds are on the disk.
    let img = a.crash(1, 0.0);
    let durable = Durable::from([("/d/f5".to_string(), (o.ino, o.stat.generation, 8056))]);
    check_image(&img, &durable, "after the fsync");
    let fs2 = Fs::mount(img as Arc<dyn Media>).unwrap();
    assert!(fs2.stat(&root, b"/d/f3", true).is_err(), "the unlink too");
    assert_eq!(fs2.stat(&root, b"/d/f4", true).unwrap().size, 10);
    // A directory's fsync (the metadata alone) with nothing new: this array counts the call
    // to flush an empty set of ranges (a real array makes no system call for it).
    let d = fs.lookup(&root, b"/d", true).unwrap();
    fs.fsync(d).unwrap();
    assert_eq!(a.flushes(), before + 2, "one call, with nothing to flush");
    fs.close(o.ino).unwrap();

    // At the device level nothing is flushed, fsync included.
    let b = Arc::new(HostCrash::new(small(32 << 20)));
    let mut fs = mount_at(b.clone(), Durability::Device);
    let before = b.flushes();
    let o = fs.open(&root, b"/f", CREAT, 0o644).unwrap();
    write_words(&mut fs, &*b, o.ino, 0, 4096);
    fs.fsync(o.ino).unwrap();
    fs.close(o.ino).unwrap();
    assert_eq!(b.flushes(), before);
}

#[test]
fn on_a_volatile_array_metadata_stays_in_the_mirror() {
    let a = small(32 << 20);
    let root = Cred::root();
    let mut fs = Fs::mount_with(
        a.clone(),
        MountOptions {
            fresh: true,
            volatile: true,
            ..Default::default()
        },
    )
    .unwrap();
    fs.mkdir(&root, b"/d", 0o755).unwrap();
    for i in 0..40u64 {
        let o = fs
            .open(&root, format!("/d/f{i}").as_bytes(), CREAT, 0o644)
            .unwrap();
        write_words(&mut fs, &*a, o.ino, 0, 4096 + i * 8);
        fs.close(o.ino).unwrap();
    }
    fs.rename(&root, b"/d/f1", b"/d/f2", false).unwrap();
    fs.unlink(&root, b"/d/f3").unwrap();
    fs.truncate(&root, b"/d/f4", 10).unwrap();
    // The mount answers every call's result.
    assert!(fs.stat(&root, b"/d/f1", true).is_err());
    assert!(fs.stat(&root, b"/d/f3", true).is_err());
    assert_eq!(fs.stat(&root, b"/d/f4", true).unwrap().size, 10);
    assert_eq!(fs.stat(&root, b"/d/f2", true).unwrap().size, 4096 + 8);
    let mut names = Vec::new();
    files(&fs, "/d", &mut names);
    assert_eq!(names.len(), 38);
    // Nothing reads a volatile array's tables after the mount, so none of it went there:
    // the image still holds the file system as formatted, and checks clean.
    let out = moneta_fs::fsck(&*a, false).unwrap();
    assert!(!out.replayed, "nothing was logged");
    assert_eq!(out.before.errors(), 0, "{:?}", out.before.problems);
    drop(fs);
    let fs2 = Fs::mount(a.clone() as Arc<dyn Media>).unwrap();
    assert!(fs2.stat(&root, b"/d", true).is_err());
}

#[test]
fn freed_space_is_reused_only_once_the_free_is_durable() {
    // The first file takes most of the array; once it is unlinked (not durably), the second
    // can only have its space.
    let a = Arc::new(HostCrash::new(small(8 << 20)));
    let root = Cred::root();
    let mut fs = mount_at(a.clone(), Durability::Host);
    let free = fs.statfs().chunks_free;
    let first = fs.open(&root, b"/first", CREAT, 0o644).unwrap();
    let len = (free - 8) * 4096;
    write_words(&mut fs, &*a, first.ino, 0, len);
    fs.fsync(first.ino).unwrap();
    fs.close(first.ino).unwrap();
    fs.unlink(&root, b"/first").unwrap();
    let (_, _, pending, _) = fs.space_states();
    assert_eq!(pending, free - 8, "freed, not yet reusable");
    let second = fs.open(&root, b"/second", CREAT, 0o644).unwrap();
    write_words(&mut fs, &*a, second.ino, 0, len);
    // Whatever the crash keeps, the second file never shows the first one's words.
    for (i, kept) in [0.0, 0.3, 0.7, 1.0].into_iter().enumerate() {
        let img = a.crash(i as u64, kept);
        check_image(&img, &Durable::new(), &format!("pages kept {kept}"));
    }
    fs.fsync(second.ino).unwrap();
    let durable = Durable::from([(
        "/second".to_string(),
        (second.ino, second.stat.generation, len),
    )]);
    check_image(&a.crash(9, 0.0), &durable, "after the second fsync");
}

#[test]
fn crashes_of_the_machine_leave_consistent_images_and_every_fsynced_file() {
    let seed: u64 = std::env::var("MONETA_HOST_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    println!("host crash test: seed {seed} (MONETA_HOST_CRASH_SEED={seed} replays it)");
    let mut rng = StdRng::seed_from_u64(seed);
    let a = Arc::new(HostCrash::new(small(4 << 20)));
    let root = Cred::root();
    let mut fs = mount_at(a.clone(), Durability::Host);
    let mut durable = Durable::new();
    let mut made = 0;
    let mut checks = 0;
    let len8 = |rng: &mut StdRng, max: u64| rng.gen_range(1..max / 8) * 8;
    for step in 0..150 {
        let s = |rng: &mut StdRng| format!("/s{}", rng.gen_range(0..6));
        match rng.gen_range(0..12) {
            0..=3 => {
                let name = s(&mut rng);
                if let Ok(o) = fs.open(&root, name.as_bytes(), CREAT | libc::O_TRUNC, 0o644) {
                    let off = rng.gen_range(0..2048) * 8;
                    let len = len8(&mut rng, 96 << 10);
                    if fs.statfs().chunks_free > (off + len) / 4096 + 2 {
                        write_words(&mut fs, &*a, o.ino, off, len);
                    }
                    if rng.gen_bool(0.3) {
                        fs.truncate_open(o.ino, len8(&mut rng, 64 << 10)).unwrap();
                    }
                    fs.close(o.ino).unwrap();
                }
            }
            4 => {
                let _ = fs.rename(&root, s(&mut rng).as_bytes(), s(&mut rng).as_bytes(), false);
            }
            5 => {
                let _ = fs.unlink(&root, s(&mut rng).as_bytes());
            }
            6 => {
                if let Ok(o) = fs.open(&root, s(&mut rng).as_bytes(), libc::O_RDWR, 0) {
                    fs.fsync(o.ino).unwrap();
                    fs.close(o.ino).unwrap();
                }
            }
            7..=8 => {
                made += 1;
                let name = format!("/k{made}");
                let o = fs
                    .open(&root, name.as_bytes(), CREAT | libc::O_EXCL, 0o600)
                    .unwrap();
                let len = len8(&mut rng, 48 << 10);
                if fs.statfs().chunks_free > len / 4096 + 2 {
                    write_words(&mut fs, &*a, o.ino, 0, len);
                    fs.fsync(o.ino).unwrap();
                    durable.insert(name, (o.ino, o.stat.generation, len));
                }
                fs.close(o.ino).unwrap();
            }
            9 => {
                if durable.len() > 6 {
                    let name = durable.keys().nth(rng.gen_range(0..durable.len())).cloned();
                    let name = name.unwrap();
                    durable.remove(&name);
                    fs.unlink(&root, name.as_bytes()).unwrap();
                }
            }
            _ => {
                let _ = fs.mkdir(&root, b"/d", 0o755);
                let t = format!("/d/t{}", rng.gen_range(0..3));
                if rng.gen_bool(0.5) {
                    if let Ok(o) = fs.open(&root, t.as_bytes(), CREAT, 0o644) {
                        if fs.statfs().chunks_free > 8 {
                            write_words(&mut fs, &*a, o.ino, 0, len8(&mut rng, 12 << 10));
                        }
                        fs.close(o.ino).unwrap();
                    }
                } else {
                    let _ = fs.unlink(&root, t.as_bytes());
                    let _ = fs.rmdir(&root, b"/d");
                }
            }
        }
        for kept in [0.0, 0.5, 1.0] {
            let img = a.crash(seed ^ (step * 3 + checks % 3), kept);
            check_image(
                &img,
                &durable,
                &format!("seed {seed} step {step}, pages kept {kept}"),
            );
            checks += 1;
        }
    }
    assert!(durable.len() > 3, "the workload kept fsync'd files");
}

/// A database's journal: made, written, fsync'd and removed again and again. Its blocks are
/// recycled, so it keeps landing on the same few (at the host level, once its removal is
/// durable: each fsync makes the last removal so), and crashes still show no file another's
/// bytes.
#[test]
fn a_file_made_and_removed_again_and_again_reuses_its_blocks() {
    for level in [Durability::Device, Durability::Host] {
        let a = Arc::new(HostCrash::new(small(32 << 20)));
        let root = Cred::root();
        let mut fs = mount_at(a.clone(), level);
        let db = fs.open(&root, b"/db", CREAT, 0o644).unwrap();
        write_words(&mut fs, &*a, db.ino, 0, 64 << 10);
        let mut places = std::collections::BTreeSet::new();
        for i in 0..40 {
            let j = fs.open(&root, b"/db-journal", CREAT, 0o644).unwrap();
            write_words(&mut fs, &*a, j.ino, 0, 12 << 10);
            let (_, m) = fs.map(j.ino, 0, 1, 1).unwrap();
            places.insert(m[0].dev.unwrap());
            fs.fsync(j.ino).unwrap();
            write_words(&mut fs, &*a, db.ino, (i % 16) * 4096, 4096);
            fs.fsync(db.ino).unwrap();
            fs.close(j.ino).unwrap();
            fs.unlink(&root, b"/db-journal").unwrap();
            if level == Durability::Host && i % 8 == 0 {
                check_image(&a.crash(i, 0.5), &Durable::new(), &format!("{level:?} {i}"));
            }
        }
        assert!(
            places.len() <= 3,
            "{level:?}: the journal landed on {} places",
            places.len()
        );
        assert!(
            fs.space_states().1 < 16,
            "{level:?}: freed blocks were recycled"
        );
    }
}
