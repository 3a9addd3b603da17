//! Damage and repair: what a damaged sector costs, and that `fsck --repair` keeps data (files
//! without a name go to /lost+found, chunks no file owns are kept unless they hold only zeros),
//! repairs damage larger than its journal in several transactions, and can be interrupted.

mod common;

use std::sync::Arc;

use common::*;
use moneta_device::{MappedArray, Media};
use moneta_fs::layout::{self, BLOCK, DIRENT_SIZE, EXTENT_SIZE};
use moneta_fs::{fsck, tables, Cred, Fix, Fs, MkfsOptions};

const CREAT: i32 = libc::O_CREAT | libc::O_RDWR;

/// The bytes of file `i` of `len` bytes.
fn content(i: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|j| (j.wrapping_mul(31) ^ (i * 7 + j / 997)) as u8 | 1)
        .collect()
}

/// Writes `data` into the file at `path`, growing it first.
fn put(fs: &mut Fs, a: &Arc<MappedArray>, path: &str, data: &[u8]) -> u64 {
    let o = fs
        .open(&Cred::root(), path.as_bytes(), CREAT, 0o644)
        .unwrap();
    let (_, runs) = fs.extend(o.ino, 0, data.len() as u64, 64).unwrap();
    for r in runs {
        let dev = r.dev.expect("allocated");
        let from = r.file_off as usize;
        let to = (from + r.len as usize).min(data.len());
        // SAFETY: the source slice is valid; the range lies inside the file's chunks.
        unsafe { a.write(dev, data[from..to].as_ptr(), to - from) };
    }
    fs.close(o.ino).unwrap();
    o.ino
}

/// The contents of the file at `path`.
fn get(fs: &Fs, a: &Arc<MappedArray>, path: &str) -> Option<Vec<u8>> {
    let ino = fs.lookup(&Cred::root(), path.as_bytes(), true).ok()?;
    let (size, runs) = fs.map(ino, 0, u64::MAX, 1 << 20).unwrap();
    let mut out = vec![0u8; size as usize];
    for r in runs {
        if let Some(dev) = r.dev {
            let from = r.file_off as usize;
            let to = (from + r.len as usize).min(out.len());
            // SAFETY: the destination slice is valid; the range lies inside the array.
            unsafe { a.read(dev, out[from..to].as_mut_ptr(), to - from) };
        }
    }
    Some(out)
}

fn zero(a: &MappedArray, addr: u64, len: u64) {
    let z = vec![0u8; len as usize];
    // SAFETY: the source is valid for `len` bytes; the range lies inside the array.
    unsafe { a.write(addr, z.as_ptr(), z.len()) };
}

fn geometry(a: &MappedArray) -> layout::Geometry {
    tables::load(a).unwrap().sb.geometry
}

/// Files /d/f0../d/f{n-1} of a few chunks each, written in turns so they interleave.
fn populate(a: &Arc<MappedArray>, n: u64) -> Vec<(String, Vec<u8>)> {
    let mut fs = mount(a);
    fs.mkdir(&Cred::root(), b"/d", 0o755).unwrap();
    let mut files = Vec::new();
    for i in 0..n {
        let path = format!("/d/f{i}");
        let data = content(i, CHUNK * (1 + i % 3) + i * 100);
        put(&mut fs, a, &path, &data);
        files.push((path, data));
    }
    // A clean stop: the damage below hits tables that the journal does not cover.
    fs.unmount().unwrap();
    files
}

#[test]
fn a_damaged_superblock_is_replaced_by_its_backup() {
    let a = formatted(16 << 20);
    let files = populate(&a, 3);
    let g = geometry(&a);
    // A flipped byte in block 0: fsck reports it and the backup serves.
    let mut b = [0u8; 1];
    // SAFETY: one byte inside the array.
    unsafe { a.read(20, b.as_mut_ptr(), 1) };
    b[0] ^= 4;
    // SAFETY: as above.
    unsafe { a.write(20, b.as_ptr(), 1) };
    let out = fsck(&*a, false).unwrap();
    assert_eq!(out.before.errors(), 1, "{:?}", out.before.problems);
    assert!(out.before.problems[0].text.contains("backup"));
    // Mount uses the backup and mends block 0.
    {
        let fs = mount(&a);
        for (p, d) in &files {
            assert_eq!(get(&fs, &a, p).as_ref(), Some(d));
        }
    }
    assert_eq!(fsck(&*a, false).unwrap().before.errors(), 0);
    // The whole first block zeroed (a stray dd): fsck --repair rewrites it.
    zero(&a, 0, BLOCK);
    let out = fsck(&*a, true).unwrap();
    assert_eq!(out.before.errors(), 1, "{:?}", out.before.problems);
    assert_eq!(out.repaired, vec![Fix::RewriteSuperblock]);
    assert_eq!(out.after.unwrap().errors(), 0);
    // The backup damaged: found, and rewritten.
    zero(&a, g.backup_superblock_addr() + 100, 512);
    let out = fsck(&*a, true).unwrap();
    assert_eq!(out.before.errors(), 1, "{:?}", out.before.problems);
    assert_eq!(fsck(&*a, false).unwrap().before.errors(), 0);
    // Both gone: nothing to go by.
    zero(&a, 0, 512);
    zero(&a, g.backup_superblock_addr(), 512);
    let err = Fs::mount(a.clone() as Arc<dyn Media>).err().unwrap();
    assert!(err.to_string().contains("not an nvfs image"), "{err}");
}

#[test]
fn version_1_images_are_refused_with_what_to_do() {
    let a = formatted(16 << 20);
    populate(&a, 2);
    let before = {
        let mut v = vec![0u8; 16 << 20];
        // SAFETY: `v` holds the whole array.
        unsafe { a.read(0, v.as_mut_ptr(), v.len()) };
        v
    };
    // A version 1 superblock (its own layout; only the version field matters here).
    // SAFETY: four bytes inside the array.
    unsafe { a.write(8, 1u32.to_le_bytes().as_ptr(), 4) };
    let err = Fs::mount(a.clone() as Arc<dyn Media>)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("version 1") && err.contains("moneta mkfs"),
        "{err}"
    );
    let err = fsck(&*a, true).err().unwrap().to_string();
    assert!(err.contains("version 1"), "{err}");
    let mut after = vec![0u8; 16 << 20];
    // SAFETY: `after` holds the whole array.
    unsafe { a.read(0, after.as_mut_ptr(), after.len()) };
    after[8] = before[8];
    assert!(after == before, "a refused image is left as it was");
}

#[test]
fn files_whose_entries_are_damaged_go_to_lost_found_with_their_data() {
    let a = formatted(16 << 20);
    let files = populate(&a, 12);
    let g = geometry(&a);
    let t = tables::load(&*a).unwrap();
    // Zero a sector of directory entries, and flip a byte of another entry.
    zero(&a, g.dirent_off + 1024, 512);
    let damaged = tables::load(&*a).unwrap();
    let victims: Vec<(u64, u64)> = t
        .dirents
        .iter()
        .filter(|(s, _)| damaged.dirents.get(s) != t.dirents.get(s))
        .map(|(s, d)| (*s, d.ino))
        .collect();
    assert!(victims.len() >= 2, "{victims:?}");
    let (slot, flipped) = t
        .dirents
        .iter()
        .find(|(_, d)| d.name == b"f11")
        .map(|(s, d)| (*s, d.ino))
        .unwrap();
    let mut b = [0u8; 1];
    let at = g.dirent_addr(slot) + 30;
    // SAFETY: one byte inside the array.
    unsafe { a.read(at, b.as_mut_ptr(), 1) };
    b[0] ^= 0x40;
    // SAFETY: as above.
    unsafe { a.write(at, b.as_ptr(), 1) };
    let free_before = {
        let t = tables::load(&*a).unwrap();
        t.bitmap.iter().map(|w| w.count_ones()).sum::<u32>()
    };
    let out = fsck(&*a, false).unwrap();
    assert!(out.before.errors() > 0);
    assert!(Fs::mount(a.clone() as Arc<dyn Media>).is_err());
    let out = fsck(&*a, true).unwrap();
    let after = out.after.unwrap();
    assert_eq!(after.errors(), 0, "{:?}", after.problems);
    let fs = mount(&a);
    // Every file is kept: at its name, or in /lost+found as #<ino>.
    let mut in_lost_found = 0;
    for (i, (p, d)) in files.iter().enumerate() {
        match get(&fs, &a, p) {
            Some(got) => assert_eq!(&got, d, "{p}"),
            None => {
                let ino = t
                    .dirents
                    .values()
                    .find(|e| format!("/d/{}", String::from_utf8_lossy(&e.name)) == *p)
                    .unwrap()
                    .ino;
                assert!(
                    victims.iter().any(|v| v.1 == ino) || ino == flipped,
                    "file {i} lost its name without damage"
                );
                let got = get(&fs, &a, &format!("/lost+found/#{ino}"));
                assert_eq!(got.as_ref(), Some(d), "{p} in lost+found");
                in_lost_found += 1;
            }
        }
    }
    assert_eq!(in_lost_found, victims.len() + 1);
    let used: u32 = {
        let t = tables::load(&*a).unwrap();
        t.bitmap.iter().map(|w| w.count_ones()).sum()
    };
    assert_eq!(used, free_before, "no chunk was freed");
}

#[test]
fn extents_are_kept_by_their_copy_or_in_lost_found() {
    let a = formatted(16 << 20);
    let files = populate(&a, 10);
    let g = geometry(&a);
    let blob = {
        let mut v = vec![0u8; (16 << 20) as usize];
        // SAFETY: `v` holds the whole array.
        unsafe { a.read(0, v.as_mut_ptr(), v.len()) };
        v
    };
    let restore = || {
        // SAFETY: `blob` holds the whole array.
        unsafe { a.write(0, blob.as_ptr(), blob.len()) };
    };
    // One copy of the extent table's first block zeroed: repaired exactly from the other.
    for table in [g.extent_off, g.extent_mirror_off] {
        restore();
        zero(&a, table, BLOCK);
        let out = fsck(&*a, true).unwrap();
        assert!(out.before.errors() > 0);
        assert!(
            out.repaired
                .iter()
                .all(|f| matches!(f, Fix::RewriteExtent(_))),
            "{:?}",
            out.repaired
        );
        let fs = mount(&a);
        for (p, d) in &files {
            assert_eq!(get(&fs, &a, p).as_ref(), Some(d), "{p}");
        }
    }
    // Both copies zeroed: the files lose those extents (reported), but no chunk is freed:
    // what they held is in /lost+found.
    restore();
    zero(&a, g.extent_off, EXTENT_SIZE * 2);
    zero(&a, g.extent_mirror_off, EXTENT_SIZE * 2);
    let used_before: u32 = tables::load(&*a)
        .unwrap()
        .bitmap
        .iter()
        .map(|w| w.count_ones())
        .sum();
    let out = fsck(&*a, true).unwrap();
    assert!(out.before.errors() > 0);
    assert_eq!(out.after.unwrap().errors(), 0);
    let t = tables::load(&*a).unwrap();
    let used: u32 = t.bitmap.iter().map(|w| w.count_ones()).sum();
    assert_eq!(used, used_before, "no chunk was freed");
    let fs = mount(&a);
    let lf = fs.lookup(&Cred::root(), b"/lost+found", true).unwrap();
    let (found, _) = fs.readdir(lf, 2, 100).unwrap();
    assert!(!found.is_empty(), "the orphaned chunks became files");
    let kept: Vec<u8> = found
        .iter()
        .flat_map(|e| {
            get(
                &fs,
                &a,
                &format!("/lost+found/{}", String::from_utf8_lossy(&e.name)),
            )
            .unwrap()
        })
        .collect();
    // The first file's first chunk is among them.
    let first = &files[0].1[..CHUNK as usize];
    assert!(
        kept.windows(first.len()).any(|w| w == first),
        "the data is kept"
    );
}

#[test]
fn inodes_are_kept_by_their_copy_or_rebuilt() {
    let a = formatted(16 << 20);
    let files = populate(&a, 6);
    let g = geometry(&a);
    let ino = tables::load(&*a)
        .unwrap()
        .dirents
        .values()
        .find(|d| d.name == b"f4")
        .unwrap()
        .ino;
    let sector = g.inode_addr(ino) / 512 * 512;
    zero(&a, sector, 512);
    let out = fsck(&*a, true).unwrap();
    assert!(out
        .repaired
        .iter()
        .all(|f| matches!(f, Fix::RewriteInode(_))));
    let mut fs = mount(&a);
    for (p, d) in &files {
        assert_eq!(get(&fs, &a, p).as_ref(), Some(d), "{p}");
    }
    // (A change, so that the journal no longer holds the repaired records.)
    fs.mkdir(&Cred::root(), b"/x", 0o755).unwrap();
    drop(fs);
    // Both copies: rebuilt from what refers to it, data kept, size to the chunk.
    zero(&a, g.inode_addr(ino), 128);
    zero(&a, g.mirror_of(g.inode_addr(ino)).unwrap(), 128);
    let out = fsck(&*a, true).unwrap();
    assert!(out
        .repaired
        .contains(&Fix::RebuildInode(ino, layout::S_IFREG)));
    assert_eq!(out.after.unwrap().errors(), 0);
    let fs = mount(&a);
    let got = get(&fs, &a, "/d/f4").unwrap();
    let want = &files[4].1;
    assert_eq!(&got[..want.len()], &want[..]);
    assert!(got[want.len()..].iter().all(|b| *b == 0));
}

#[test]
fn damage_larger_than_the_journal_is_repaired_in_several_transactions() {
    // A small journal (64 KiB) and many files whose entries are all lost.
    let a = Arc::new(MappedArray::volatile(64 << 20).unwrap());
    let o = MkfsOptions {
        chunk_size: 64 << 10,
        inode_count: Some(1024),
        dirent_count: Some(2048),
        ..Default::default()
    };
    moneta_fs::mkfs(&*a, &o).unwrap();
    let g = geometry(&a);
    assert_eq!(g.journal_len - BLOCK, 64 << 10);
    let n = 400;
    {
        let mut fs = mount(&a);
        for i in 0..n {
            put(&mut fs, &a, &format!("/f{i}"), &content(i, 100));
        }
        fs.unmount().unwrap();
    }
    // Every entry but /lost+found's.
    zero(&a, g.dirent_addr(1), (g.dirent_count - 1) * DIRENT_SIZE);
    let out = fsck(&*a, true).unwrap();
    let reattached = out
        .repaired
        .iter()
        .filter(|f| matches!(f, Fix::Reattach(_)))
        .count();
    assert_eq!(reattached, n as usize);
    assert_eq!(out.after.unwrap().errors(), 0);
    let fs = mount(&a);
    let found = (0..n)
        .filter(|i| {
            let ino = fs
                .lookup(
                    &Cred::root(),
                    format!("/lost+found/#{}", i + 3).as_bytes(),
                    true,
                )
                .unwrap();
            get(&fs, &a, &format!("/lost+found/#{}", i + 3)) == Some(content(*i, 100))
                && ino == i + 3
        })
        .count();
    assert_eq!(found, n as usize, "every file, its data intact");
}

#[test]
fn an_interrupted_repair_is_finished_by_the_next() {
    let a = formatted(16 << 20);
    let files = populate(&a, 8);
    let g = geometry(&a);
    zero(&a, g.dirent_off, 2048);
    zero(&a, g.extent_off, 64);
    zero(&a, g.extent_mirror_off, 64);
    let mut blob = vec![0u8; 16 << 20];
    // SAFETY: `blob` holds the whole array.
    unsafe { a.read(0, blob.as_mut_ptr(), blob.len()) };
    let used = |a: &MappedArray| -> u32 {
        tables::load(a)
            .unwrap()
            .bitmap
            .iter()
            .map(|w| w.count_ones())
            .sum()
    };
    let used_before = used(&a);
    let mut budget = 0;
    loop {
        // SAFETY: `blob` holds the whole array.
        unsafe { a.write(0, blob.as_ptr(), blob.len()) };
        let dying = Dying::new(a.clone(), budget);
        let _ = fsck(&dying, true);
        let finished = !dying.died();
        let out = fsck(&*a, true).unwrap();
        let left = out
            .after
            .as_ref()
            .map_or(out.before.errors(), |r| r.errors());
        assert_eq!(left, 0, "after a crash at store {budget}: {:?}", out.after);
        assert_eq!(
            used(&a),
            used_before,
            "crash at store {budget}: chunks freed"
        );
        let fs = mount(&a);
        let lf = fs.lookup(&Cred::root(), b"/lost+found", true).unwrap();
        let (entries, _) = fs.readdir(lf, 2, 1000).unwrap();
        let kept: usize = entries
            .iter()
            .filter(|e| e.kind == layout::DT_REG)
            .map(|e| {
                let p = format!("/lost+found/{}", String::from_utf8_lossy(&e.name));
                let d = get(&fs, &a, &p).unwrap();
                files.iter().filter(|(_, f)| *f == d).count()
            })
            .sum();
        assert!(
            kept >= 1,
            "crash at store {budget}: files kept whole in lost+found"
        );
        if finished {
            break;
        }
        budget += 3;
    }
    assert!(budget > 6, "the repair took several stores ({budget})");
}
