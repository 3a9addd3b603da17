//! Allocation in 4 KiB chunks: small files take space near their size, appending files keep a
//! reservation ahead of them and give it back at close, freed space is revoked in chunks of
//! its own size, and files with more extents than a transaction can hold are freed in
//! several, across crashes too.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use moneta_device::{MappedArray, Media};
use moneta_fs::{mkfs, Cred, Fs, MkfsOptions, MountOptions};

const CREAT: i32 = libc::O_CREAT | libc::O_RDWR;
const BLOCK: u64 = 4096;

/// The default chunk (4 KiB) on a small array (with 4,096 extent records).
fn blocks(size: u64) -> Arc<MappedArray> {
    let a = Arc::new(MappedArray::volatile(size).unwrap());
    let o = MkfsOptions {
        inode_count: Some(2048),
        ..Default::default()
    };
    mkfs(&*a, &o).unwrap();
    a
}

/// Mounts an array formatted just now (all its free space clean) keeping `reserve` bytes
/// ahead of appends.
fn mount_reserving(a: &Arc<MappedArray>, reserve: u64) -> Fs {
    Fs::mount_with(
        a.clone() as Arc<dyn Media>,
        MountOptions {
            append_reserve: reserve,
            fresh: true,
            ..Default::default()
        },
    )
    .unwrap()
}

fn mount_fresh(a: &Arc<MappedArray>) -> Fs {
    mount_reserving(a, moneta_fs::fs::DEFAULT_APPEND_RESERVE)
}

#[test]
fn small_files_take_space_near_their_size() {
    let a = blocks(16 << 20);
    let mut fs = mount_fresh(&a);
    let root = Cred::root();
    assert_eq!(fs.statfs().chunk_size, BLOCK);
    let free = fs.statfs().chunks_free;
    let mut used = 0;
    for i in 0..300u64 {
        let size = 1 + i * 97 % 9000;
        let o = fs
            .open(&root, format!("/f{i}").as_bytes(), CREAT, 0o644)
            .unwrap();
        let (_, m) = fs.extend(o.ino, 0, size, 8).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[0].len,
            size.div_ceil(BLOCK) * BLOCK,
            "one extent of whole blocks"
        );
        fs.close(o.ino).unwrap();
        let st = fs.stat_ino(o.ino);
        assert_eq!(st.blocks, size.div_ceil(BLOCK) * BLOCK / 512);
        used += size.div_ceil(BLOCK);
    }
    assert_eq!(
        fs.statfs().chunks_free,
        free - used,
        "reserves went back at close"
    );
    assert_eq!(fs.space_states().3, 0);
    // Files written one after the other lie one after the other.
    let mut starts: Vec<u64> = (0..300)
        .map(|i| {
            let ino = fs.lookup(&root, format!("/f{i}").as_bytes(), true).unwrap();
            fs.map(ino, 0, 1, 1).unwrap().1[0].dev.unwrap()
        })
        .collect();
    let sorted = starts.windows(2).all(|w| w[0] < w[1]);
    starts.dedup();
    assert!(sorted && starts.len() == 300);
    assert_eq!(fs.check().errors(), 0);
}

/// Two files appended 4 KiB at a time, in turns.
fn interleave(fs: &mut Fs, rounds: u64) -> (u64, u64) {
    let root = Cred::root();
    let x = fs.open(&root, b"/x", CREAT, 0o644).unwrap().ino;
    let y = fs.open(&root, b"/y", CREAT, 0o644).unwrap().ino;
    for r in 0..rounds {
        fs.extend(x, r * BLOCK, BLOCK, 1).unwrap();
        fs.extend(y, u64::MAX, BLOCK, 1).unwrap();
    }
    (x, y)
}

fn extents(fs: &Fs, ino: u64) -> usize {
    fs.map(ino, 0, u64::MAX, usize::MAX).unwrap().1.len()
}

#[test]
fn appending_files_keep_a_reserve_and_give_it_back_at_close() {
    let a = blocks(16 << 20);
    let mut fs = mount_fresh(&a);
    let free = fs.statfs().chunks_free;
    let (x, y) = interleave(&mut fs, 64);
    assert_eq!(
        (extents(&fs, x), extents(&fs, y)),
        (1, 1),
        "each file stays one extent"
    );
    let (_, _, _, held) = fs.space_states();
    // The first extend of each took one chunk and reserved 1 MiB after it; 63 came from there.
    assert_eq!(
        held,
        2 * (256 - 63),
        "1 MiB ahead of each, less what they used"
    );
    assert_eq!(
        fs.statfs().chunks_free,
        free - 128,
        "a reserve is free space"
    );
    // Appending past the reserve moves it.
    for r in 64..300 {
        fs.extend(x, r * BLOCK, BLOCK, 1).unwrap();
    }
    assert!(extents(&fs, x) <= 2);
    fs.close(x).unwrap();
    fs.close(y).unwrap();
    assert_eq!(fs.space_states().3, 0, "closing gives the reserves back");
    assert_eq!(fs.statfs().chunks_free, free - 364);
    assert_eq!(fs.check().errors(), 0);

    // Without reserves the two files interleave.
    let b = blocks(16 << 20);
    let mut fs = mount_reserving(&b, 0);
    let (x, y) = interleave(&mut fs, 64);
    assert_eq!((extents(&fs, x), extents(&fs, y)), (64, 64));
    // When space runs short, reserves are taken back rather than failing.
    let z = fs.open(&Cred::root(), b"/z", CREAT, 0o644).unwrap().ino;
    let left = fs.statfs().chunks_free;
    fs.extend(z, 0, left * BLOCK, 1).unwrap();
    assert_eq!(fs.statfs().chunks_free, 0);
}

#[test]
fn reserves_are_taken_back_when_space_runs_short() {
    let a = blocks(8 << 20);
    let mut fs = mount_fresh(&a);
    let (x, _) = interleave(&mut fs, 4);
    assert!(fs.space_states().3 > 0);
    let root = Cred::root();
    let z = fs.open(&root, b"/z", CREAT, 0o644).unwrap().ino;
    let left = fs.statfs().chunks_free;
    fs.extend(z, 0, left * BLOCK, 1).unwrap();
    assert_eq!(fs.statfs().chunks_free, 0);
    assert_eq!(fs.space_states(), (0, 0, 0, 0));
    let err = fs.extend(x, 4 * BLOCK, BLOCK, 1).unwrap_err();
    assert_eq!(err.errno, libc::ENOSPC);
    assert_eq!(fs.check().errors(), 0);
}

#[test]
fn freed_blocks_are_revoked_in_their_own_size_before_reuse() {
    let a = blocks(16 << 20);
    let mut fs = mount_fresh(&a);
    let root = Cred::root();
    let revoked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let r2 = revoked.clone();
    fs.set_revoker(Box::new(move |r| {
        r2.lock().unwrap().extend_from_slice(r);
        Ok(())
    }));
    let o = fs.open(&root, b"/small", CREAT, 0o644).unwrap();
    let (_, m) = fs.extend(o.ino, 0, 5000, 4).unwrap();
    fs.close(o.ino).unwrap();
    fs.unlink(&root, b"/small").unwrap();
    assert_eq!(
        *revoked.lock().unwrap(),
        vec![(m[0].dev.unwrap(), 2 * BLOCK)],
        "the file's two blocks, nothing more"
    );
    // A truncate within the file revokes from the block that holds the new end.
    revoked.lock().unwrap().clear();
    let o = fs.open(&root, b"/t", CREAT, 0o644).unwrap();
    let (_, m) = fs.extend(o.ino, 0, 5 * BLOCK, 4).unwrap();
    fs.truncate_open(o.ino, BLOCK + 10).unwrap();
    let dev = m[0].dev.unwrap();
    assert_eq!(*revoked.lock().unwrap(), vec![(dev + BLOCK, 4 * BLOCK)]);
    fs.close(o.ino).unwrap();
}

#[test]
fn fragmented_files_are_freed_in_several_transactions() {
    // A 64 KiB journal; two files of 1,500 one-block extents each.
    let a = blocks(32 << 20);
    let mut fs = mount_reserving(&a, 0);
    let root = Cred::root();
    let free = fs.statfs().chunks_free;
    let (x, y) = interleave(&mut fs, 1500);
    assert_eq!(extents(&fs, x), 1500);
    fs.close(x).unwrap();
    let seq = fs.journal_seq();
    fs.unlink(&root, b"/x").unwrap();
    assert!(
        fs.journal_seq() - seq >= 3,
        "{} transactions",
        fs.journal_seq() - seq
    );
    assert_eq!(fs.check().errors(), 0);
    // A truncate of the other: the file shrinks in steps, and ends at its new size.
    let seq = fs.journal_seq();
    fs.truncate_open(y, 3 * BLOCK).unwrap();
    assert!(fs.journal_seq() - seq >= 3);
    assert_eq!(fs.stat_ino(y).size, 3 * BLOCK);
    assert_eq!(extents(&fs, y), 3);
    fs.close(y).unwrap();
    assert_eq!(fs.statfs().chunks_free, free - 3);
    assert_eq!(fs.check().errors(), 0);
}

#[test]
fn a_crash_while_freeing_a_fragmented_file_leaves_an_orphan_the_mount_frees() {
    let root = Cred::root();
    let a = blocks(32 << 20);
    let free = {
        let mut fs = mount_reserving(&a, 0);
        let free = fs.statfs().chunks_free;
        let (x, y) = interleave(&mut fs, 1200);
        fs.close(x).unwrap();
        fs.close(y).unwrap();
        fs.unmount().unwrap();
        free
    };
    let mut image = vec![0u8; a.size() as usize];
    // SAFETY: `image` holds the whole array.
    unsafe { a.read(0, image.as_mut_ptr(), image.len()) };
    let mut budget = 0;
    let mut states = std::collections::BTreeSet::new();
    loop {
        // SAFETY: `image` holds the whole array.
        unsafe { a.write(0, image.as_ptr(), image.len()) };
        let dying = Arc::new(Dying::new(a.clone(), budget));
        {
            let mut fs = Fs::mount(dying.clone() as Arc<dyn Media>).unwrap();
            let _ = fs.unlink(&root, b"/x");
        }
        let finished = !dying.died();
        let fs = mount(&a);
        assert_eq!(fs.check().errors(), 0, "crash after {budget} stores");
        let x = fs.stat(&root, b"/x", true);
        let free_now = fs.statfs().chunks_free;
        match x {
            Ok(st) => {
                assert_eq!(st.size, 1200 * BLOCK, "crash after {budget} stores");
                assert_eq!(free_now, free - 2400);
                states.insert("old");
            }
            Err(_) => {
                assert_eq!(
                    free_now,
                    free - 1200,
                    "crash after {budget} stores: the mount freed it"
                );
                states.insert("new");
            }
        }
        if finished {
            break;
        }
        budget += 97;
    }
    assert_eq!(states.len(), 2);
}

#[test]
fn a_full_extent_table_refuses_extends_and_takes_nothing() {
    let a = Arc::new(MappedArray::volatile(8 << 20).unwrap());
    let o = MkfsOptions {
        inode_count: Some(16),
        ..Default::default()
    };
    let g = mkfs(&*a, &o).unwrap();
    assert!(g.extent_count < g.chunk_count);
    let mut fs = mount_reserving(&a, 0);
    let root = Cred::root();
    let x = fs.open(&root, b"/x", CREAT, 0o644).unwrap().ino;
    let y = fs.open(&root, b"/y", CREAT, 0o644).unwrap().ino;
    let mut refused = None;
    'fill: for r in 0..g.extent_count {
        for f in [x, y] {
            let (free, size) = (fs.statfs().chunks_free, fs.stat_ino(f).size);
            if let Err(e) = fs.extend(f, r * BLOCK, BLOCK, 1) {
                assert_eq!(fs.statfs().chunks_free, free, "a refusal takes nothing");
                assert_eq!(fs.stat_ino(f).size, size);
                refused = Some(e);
                break 'fill;
            }
        }
    }
    let e = refused.expect("the extent table filled up");
    assert_eq!(e.errno, libc::ENOSPC);
    assert!(e.message.contains("extent records"), "{}", e.message);
    assert_eq!(fs.check().errors(), 0);
}

#[test]
fn free_space_a_mount_knows_nothing_of_is_zeroed_before_it_is_handed_out() {
    let a = blocks(16 << 20);
    let g = moneta_fs::tables::load(&*a).unwrap().sb.geometry;
    // What a crash of the machine may leave in free space: bytes of files whose allocation
    // it undid.
    let junk = vec![0x5au8; (g.chunk_count * BLOCK) as usize];
    // SAFETY: the data region lies inside the array.
    unsafe { a.write(g.data_off, junk.as_ptr(), junk.len()) };
    let mut fs = mount(&a);
    let root = Cred::root();
    for i in 0..40 {
        let o = fs
            .open(&root, format!("/f{i}").as_bytes(), CREAT, 0o644)
            .unwrap();
        let (_, m) = fs.extend(o.ino, 0, 3 * BLOCK + 7, 4).unwrap();
        let mut back = vec![1u8; m[0].len as usize];
        // SAFETY: `back` holds the extent, inside the array.
        unsafe { a.read(m[0].dev.unwrap(), back.as_mut_ptr(), back.len()) };
        assert!(back.iter().all(|b| *b == 0), "file {i} reads only zeros");
        fs.close(o.ino).unwrap();
    }
    let (_, dirty, _, _) = fs.space_states();
    assert!(dirty > 0, "the rest waits for its turn");
}

#[test]
fn room_given_at_an_open_is_allocated_past_a_size_of_0_and_a_crash_at_any_store_leaves_it_free() {
    let root = Cred::root();
    let a = blocks(16 << 20);
    let (free, ino) = {
        let mut fs = mount_fresh(&a);
        let ino = fs.open(&root, b"/j", CREAT, 0o644).unwrap().ino;
        let data = fs.open(&root, b"/d", CREAT, 0o644).unwrap().ino;
        fs.extend(data, 0, 10, 8).unwrap();
        let before = fs.stat_ino(ino);
        // An empty file gets at least the room asked for, from offset 0, as one extent;
        // the size and the times stay.
        let (maps, end) = fs.room_at_open(ino, 16 << 10, 1, 8).unwrap();
        assert!(end >= 16 << 10, "{end}");
        assert_eq!(maps.len(), 1);
        assert_eq!((maps[0].file_off, maps[0].len), (0, end));
        assert!(maps[0].dev.is_some());
        let after = fs.stat_ino(ino);
        assert_eq!(after.size, 0);
        assert_eq!((after.mtime, after.ctime), (before.mtime, before.ctime));
        assert_eq!(after.blocks * 512, end);
        assert_eq!(fs.check().errors(), 0, "room past a size of 0 is allowed");
        // The room reads as zeros.
        let mut buf = vec![1u8; end as usize];
        // SAFETY: `buf` holds `end` bytes.
        unsafe { a.read(maps[0].dev.unwrap(), buf.as_mut_ptr(), buf.len()) };
        assert!(buf.iter().all(|&b| b == 0));
        // A file that holds space, or one that has room already, gets none.
        assert_eq!(fs.room_at_open(data, 16 << 10, 2, 8).unwrap().0.len(), 0);
        assert_eq!(fs.room_at_open(ino, 16 << 10, 3, 8).unwrap().0.len(), 0);
        // The last close gives it back.
        fs.close(ino).unwrap();
        assert_eq!(fs.stat_ino(ino).blocks, 0);
        let free = fs.statfs().chunks_free;
        fs.close(data).unwrap();
        fs.unmount().unwrap();
        (free, ino)
    };
    let mut image = vec![0u8; a.size() as usize];
    // SAFETY: `image` holds the whole array.
    unsafe { a.read(0, image.as_mut_ptr(), image.len()) };
    let mut budget = 0;
    loop {
        // SAFETY: `image` holds the whole array.
        unsafe { a.write(0, image.as_ptr(), image.len()) };
        let dying = Arc::new(Dying::new(a.clone(), budget));
        {
            let mut fs = Fs::mount(dying.clone() as Arc<dyn Media>).unwrap();
            let o = fs.open(&root, b"/j", libc::O_RDWR, 0).unwrap();
            assert_eq!(o.ino, ino);
            let _ = fs.room_at_open(ino, 16 << 10, 1, 8);
        }
        let finished = !dying.died();
        let fs = mount(&a);
        assert_eq!(fs.check().errors(), 0, "crash after {budget} stores");
        let st = fs.stat(&root, b"/j", true).unwrap();
        assert_eq!((st.size, st.blocks), (0, 0), "crash after {budget} stores");
        assert_eq!(fs.statfs().chunks_free, free, "crash after {budget} stores");
        if finished {
            break;
        }
        budget += 1;
    }
    assert!(budget > 0, "the room took stores to give");
}
