//! What damage does: on a populated image, single bytes flipped and whole 512-byte sectors
//! zeroed at many positions (a fixed seed), in the metadata and in file data, each followed by
//! `fsck`, `fsck --repair`, a mount and a read of every file through the device's read path
//! (with data checksums, the same integrity unit the engine copies through). Each trial is
//! counted as
//!
//! - *no effect*: nothing found, every file reads back as written (the bytes were unused);
//! - *repaired*: `fsck` found it and after `--repair` every file reads back as written, at its
//!   own path;
//! - *reported*: found (by `fsck`, `fsck --data` or a read failing with an error), and some file
//!   is not given back whole at its path (moved to /lost+found, or a read fails) — but no read
//!   returned wrong bytes as good ones;
//! - *silently wrong*: a read returned bytes other than those written, or a file vanished,
//!   with nothing reported.
//!
//! `MONETA_DAMAGE_TRIALS` sets the trials per class (default 60); `-- --nocapture` prints the
//! table that `docs/nvfs.md` quotes. Silently wrong must be 0 for metadata, and for data when
//! the image keeps data checksums.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use moneta_device::{Integrity, MappedArray, Media};
use moneta_fs::layout::{self, DIRENT_SIZE, EXTENT_SIZE, INODE_SIZE};
use moneta_fs::{check_data, fsck, mkfs, tables, Cred, Fs, MkfsOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SIZE: u64 = 8 << 20;
const SEED: u64 = 0x6e76_6673;

struct Image {
    bytes: Vec<u8>,
    files: Vec<(String, Vec<u8>)>,
    links: Vec<(String, Vec<u8>)>,
    /// Live metadata by region: name and byte ranges.
    meta: Vec<(&'static str, Vec<(u64, u64)>)>,
    /// File data ranges on the array.
    data: Vec<(u64, u64)>,
}

fn array() -> Arc<MappedArray> {
    Arc::new(MappedArray::volatile(SIZE).unwrap())
}

/// A file system of directories, files of assorted sizes (written in turns, so their extents
/// interleave), hard links and symlinks.
fn build(checksums: bool) -> Image {
    let a = array();
    let o = MkfsOptions {
        chunk_size: 16 << 10,
        inode_count: Some(256),
        dirent_count: Some(512),
        data_checksums: checksums,
        ..Default::default()
    };
    mkfs(&*a, &o).unwrap();
    let mut fs = Fs::mount(a.clone() as Arc<dyn Media>).unwrap();
    let mut unit = Integrity::new(fs.integrity(), SIZE).unwrap();
    let root = Cred::root();
    let mut rng = StdRng::seed_from_u64(SEED);
    for d in ["/a", "/a/b", "/c"] {
        fs.mkdir(&root, d.as_bytes(), 0o755).unwrap();
    }
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut inos = Vec::new();
    for i in 0..24 {
        let dir = ["/a", "/a/b", "/c", ""][i % 4];
        let path = format!("{dir}/f{i}");
        let o = fs
            .open(&root, path.as_bytes(), libc::O_CREAT | libc::O_RDWR, 0o644)
            .unwrap();
        inos.push(o.ino);
        let len = rng.gen_range(1..70_000);
        files.push((path, (0..len).map(|_| rng.gen()).collect()));
    }
    // Grow the files a piece at a time, in turns.
    let mut done = vec![0usize; files.len()];
    while done.iter().zip(&files).any(|(d, f)| *d < f.1.len()) {
        for (i, (_, data)) in files.iter().enumerate() {
            let from = done[i];
            let to = (from + 20_000).min(data.len());
            if from == to {
                continue;
            }
            let (_, runs) = fs
                .extend(inos[i], from as u64, (to - from) as u64, 64)
                .unwrap();
            for r in runs {
                let lo = r.file_off.max(from as u64) as usize;
                let hi = (r.file_off + r.len).min(to as u64) as usize;
                let dev = r.dev.unwrap() + (lo as u64 - r.file_off);
                // SAFETY: the source slice is valid; the range lies inside the file's chunks.
                unsafe { unit.write(&*a, dev, data[lo..hi].as_ptr(), hi - lo) }.unwrap();
            }
            done[i] = to;
        }
    }
    for ino in inos {
        fs.close(ino).unwrap();
    }
    fs.link(&root, b"/a/f0", b"/c/hard").unwrap();
    files.push(("/c/hard".into(), files[0].1.clone()));
    let links = vec![
        ("/s1".to_string(), b"a/b/f1".to_vec()),
        ("/c/s2".to_string(), b"/a/f4".to_vec()),
    ];
    for (p, t) in &links {
        fs.symlink(&root, t, p.as_bytes()).unwrap();
    }
    drop(fs);
    let t = tables::load(&*a).unwrap();
    let g = t.sb.geometry;
    let mut meta: Vec<(&'static str, Vec<(u64, u64)>)> = vec![
        ("superblock", vec![(0, 512)]),
        ("backup superblock", vec![(g.backup_superblock_addr(), 512)]),
    ];
    // The journal's head and the log from its tail (which the mount's checkpoint put at the
    // log's start) to its end: the transactions since the mount.
    let r = moneta_fs::journal::Journal::recover(&*a, &g);
    assert!(r.transactions > 0 && r.live == r.end, "{r:?}");
    meta.push((
        "journal",
        vec![
            (g.journal_off, moneta_fs::journal::HEAD),
            (g.journal_off + layout::BLOCK, r.end),
        ],
    ));
    let used: Vec<u64> = (1..=g.inode_count)
        .filter(|i| t.inodes[(i - 1) as usize].is_used())
        .collect();
    meta.push((
        "inodes",
        used.iter()
            .map(|i| (g.inode_addr(*i), INODE_SIZE))
            .collect(),
    ));
    meta.push((
        "inode copies",
        used.iter()
            .map(|i| (g.mirror_of(g.inode_addr(*i)).unwrap(), INODE_SIZE))
            .collect(),
    ));
    meta.push((
        "directory entries",
        t.dirents
            .keys()
            .map(|s| (g.dirent_addr(*s), DIRENT_SIZE))
            .collect(),
    ));
    meta.push((
        "extents",
        t.extents
            .keys()
            .map(|s| (g.extent_addr(*s), EXTENT_SIZE))
            .collect(),
    ));
    meta.push((
        "extent copies",
        t.extents
            .keys()
            .map(|s| (g.mirror_of(g.extent_addr(*s)).unwrap(), EXTENT_SIZE))
            .collect(),
    ));
    meta.push((
        "bitmap",
        vec![(g.bitmap_off, g.chunk_count.div_ceil(64) * 8)],
    ));
    let mut data = Vec::new();
    let mut sums = Vec::new();
    {
        let fs = Fs::mount(a.clone() as Arc<dyn Media>).unwrap();
        for (p, d) in &files[..files.len() - 1] {
            let ino = fs.lookup(&root, p.as_bytes(), true).unwrap();
            for r in fs.map(ino, 0, u64::MAX, 1 << 20).unwrap().1 {
                let len = r.len.min(d.len() as u64 - r.file_off);
                data.push((r.dev.unwrap(), len));
                let first = (r.dev.unwrap() - g.data_off) / 4096;
                let blocks = len.div_ceil(4096);
                sums.push((g.sums_off + first * 4, blocks * 4));
            }
        }
    }
    if checksums {
        meta.push(("data checksums", sums));
    }
    let mut bytes = vec![0u8; SIZE as usize];
    // SAFETY: `bytes` holds the whole array.
    unsafe { a.read(0, bytes.as_mut_ptr(), bytes.len()) };
    Image {
        bytes,
        files,
        links,
        meta,
        data,
    }
}

/// A byte uniformly among `ranges`.
fn pick(rng: &mut StdRng, ranges: &[(u64, u64)]) -> u64 {
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    let mut at = rng.gen_range(0..total);
    for &(start, len) in ranges {
        if at < len {
            return start + at;
        }
        at -= len;
    }
    unreachable!()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    NoEffect,
    Repaired,
    Reported,
    SilentlyWrong,
}

/// Damages a fresh copy of `img` at `addr` (a flipped byte, or its sector zeroed), then checks,
/// repairs, mounts and reads everything back.
fn trial(img: &Image, addr: u64, sector: bool) -> Outcome {
    let a = array();
    for (i, page) in img.bytes.chunks(4096).enumerate() {
        if page.iter().any(|b| *b != 0) {
            // SAFETY: the page lies inside the array.
            unsafe { a.write(i as u64 * 4096, page.as_ptr(), page.len()) };
        }
    }
    if sector {
        let z = [0u8; 512];
        // SAFETY: the sector lies inside the array.
        unsafe { a.write(addr / 512 * 512, z.as_ptr(), 512) };
    } else {
        let mut b = [0u8];
        // SAFETY: one byte inside the array.
        unsafe {
            a.read(addr, b.as_mut_ptr(), 1);
            b[0] ^= 1 << (addr % 8);
            a.write(addr, b.as_ptr(), 1);
        }
    }
    let mut found = false;
    match fsck(&*a, false) {
        Ok(out) => found |= out.before.errors() > 0,
        Err(_) => return Outcome::Reported,
    }
    if let Ok(Some(bad)) = check_data(&*a) {
        found |= !bad.is_empty();
    }
    let mut clean_after = true;
    if found {
        let out = fsck(&*a, true).unwrap();
        clean_after = out.after.is_none_or(|r| r.errors() == 0);
    }
    let Ok(fs) = Fs::mount(a.clone() as Arc<dyn Media>) else {
        return if found {
            Outcome::Reported
        } else {
            Outcome::SilentlyWrong
        };
    };
    let mut unit = Integrity::new(fs.integrity(), SIZE).unwrap();
    let root = Cred::root();
    let (mut wrong, mut missing, mut errors) = (0, 0, 0);
    for (p, want) in &img.files {
        let Ok(ino) = fs.lookup(&root, p.as_bytes(), true) else {
            missing += 1;
            continue;
        };
        let Ok((size, runs)) = fs.map(ino, 0, u64::MAX, 1 << 20) else {
            wrong += 1;
            continue;
        };
        let mut got = vec![0u8; size as usize];
        let mut failed = false;
        for r in runs {
            if let Some(dev) = r.dev {
                let lo = r.file_off as usize;
                let hi = (r.file_off + r.len).min(size) as usize;
                // SAFETY: the destination slice is valid; the range lies inside the array.
                failed |=
                    unsafe { unit.read(&*a, dev, got[lo..hi].as_mut_ptr(), hi - lo) }.is_err();
            }
        }
        if failed {
            errors += 1;
        } else if got != *want {
            wrong += 1;
        }
    }
    for (p, target) in &img.links {
        match fs.readlink(&root, p.as_bytes()) {
            Ok(t) if t == *target => {}
            Ok(_) => wrong += 1,
            Err(_) => missing += 1,
        }
    }
    if wrong > 0 || (!found && missing + errors > 0) {
        Outcome::SilentlyWrong
    } else if missing + errors > 0 || !clean_after {
        Outcome::Reported
    } else if found {
        Outcome::Repaired
    } else {
        Outcome::NoEffect
    }
}

#[test]
fn damage_is_repaired_or_reported_never_returned_as_data() {
    let trials: usize = std::env::var("MONETA_DAMAGE_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut table: BTreeMap<String, [usize; 4]> = BTreeMap::new();
    let mut by_region: BTreeMap<String, [usize; 4]> = BTreeMap::new();
    for checksums in [true, false] {
        let img = build(checksums);
        let sums = if checksums {
            "with data checksums"
        } else {
            "without data checksums"
        };
        for sector in [false, true] {
            let what = if sector {
                "sector zeroed"
            } else {
                "byte flipped"
            };
            // Metadata classes on the image with data checksums (whose table is metadata too).
            if checksums {
                for i in 0..trials {
                    let (region, ranges) = &img.meta[i % img.meta.len()];
                    let at = pick(&mut rng, ranges);
                    let o = trial(&img, at, sector);
                    table.entry(format!("metadata, {what}")).or_default()[o as usize] += 1;
                    by_region.entry(format!("{region}, {what}")).or_default()[o as usize] += 1;
                }
            }
            for _ in 0..trials {
                let at = pick(&mut rng, &img.data);
                let o = trial(&img, at, sector);
                table.entry(format!("data {sums}, {what}")).or_default()[o as usize] += 1;
            }
        }
    }
    println!("damage trials (seed {SEED:#x}, {trials} per class)");
    println!("| class | no effect | repaired | reported | silently wrong |");
    println!("|---|---|---|---|---|");
    for (k, v) in table.iter().chain(by_region.iter()) {
        println!("| {k} | {} | {} | {} | {} |", v[0], v[1], v[2], v[3]);
    }
    for (k, v) in &table {
        if !k.contains("without data checksums") {
            assert_eq!(v[3], 0, "{k}: silently wrong");
        }
    }
    for (k, v) in &by_region {
        assert_eq!(v[3], 0, "{k}: silently wrong");
    }
}
