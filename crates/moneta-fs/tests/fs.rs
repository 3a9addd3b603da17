//! nvfs behaviour: the POSIX calls and their errors, allocation, persistence, fsck.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use moneta_device::{MappedArray, Media};
use moneta_fs::layout::S_IFMT;
use moneta_fs::{fsck, Cred, Fs, SetTime, Time};

const RW: i32 = libc::O_RDWR;
const CREAT: i32 = libc::O_CREAT | libc::O_RDWR;

fn user(uid: u32) -> Cred {
    Cred {
        uid,
        gid: uid,
        groups: vec![],
    }
}

fn errno<T: std::fmt::Debug>(r: moneta_fs::FsResult<T>) -> i32 {
    r.expect_err("the call should fail").errno
}

fn names(fs: &Fs, root: &Cred, path: &[u8]) -> Vec<String> {
    let o = fs_open_dir(fs, root, path);
    let (entries, end) = fs.readdir(o, 0, 1000).unwrap();
    assert!(end);
    let mut v: Vec<String> = entries
        .iter()
        .map(|e| String::from_utf8(e.name.clone()).unwrap())
        .collect();
    v.sort();
    v
}

fn fs_open_dir(fs: &Fs, root: &Cred, path: &[u8]) -> u64 {
    fs.lookup(root, path, true).unwrap()
}

#[test]
fn files_and_directories() {
    let a = formatted(32 << 20);
    let mut fs = mount(&a);
    let root = Cred::root();
    fs.mkdir(&root, b"/d", 0o755).unwrap();
    let o = fs
        .open(&root, b"/d/f", CREAT | libc::O_EXCL, 0o644)
        .unwrap();
    assert!(o.created && o.read && o.write);
    assert_eq!(o.stat.mode, libc::S_IFREG | 0o644);
    assert_eq!(
        errno(fs.open(&root, b"/d/f", CREAT | libc::O_EXCL, 0o644)),
        libc::EEXIST
    );
    assert_eq!(errno(fs.open(&root, b"/d/g", RW, 0)), libc::ENOENT);
    assert_eq!(
        errno(fs.open(&root, b"/d/f/x", CREAT, 0o644)),
        libc::ENOTDIR
    );
    assert_eq!(errno(fs.open(&root, b"/d", RW, 0)), libc::EISDIR);
    assert_eq!(
        errno(fs.open(&root, b"/d/f", libc::O_RDONLY | libc::O_DIRECTORY, 0)),
        libc::ENOTDIR
    );
    assert_eq!(errno(fs.open(&root, b"relative", RW, 0)), libc::EINVAL);
    assert_eq!(
        errno(fs.open(&root, b"/d/new", CREAT | libc::O_DIRECTORY, 0o644)),
        libc::EINVAL
    );
    assert_eq!(errno(fs.stat(&root, b"/d/new", true)), libc::ENOENT);
    assert_eq!(
        errno(fs.open(&root, &[b'/'; 5000], RW, 0)),
        libc::ENAMETOOLONG
    );
    let mut long = b"/".to_vec();
    long.extend([b'x'; 256]);
    assert_eq!(
        errno(fs.open(&root, &long, CREAT, 0o644)),
        libc::ENAMETOOLONG
    );
    // Sequential growth from empty is one extent.
    let (size, m) = fs.extend(o.ino, 0, 3 * CHUNK + 10, 16).unwrap();
    assert_eq!(size, 3 * CHUNK + 10);
    assert_eq!(m.len(), 1, "{m:?}");
    fs.extend(o.ino, 3 * CHUNK + 10, 2 * CHUNK, 16).unwrap();
    let (_, m) = fs.map(o.ino, 0, u64::MAX, 16).unwrap();
    assert_eq!(m.len(), 1, "appending stays one extent: {m:?}");
    assert_eq!(m[0].len, 6 * CHUNK);
    // A hole, then data past it.
    fs.extend(o.ino, 20 * CHUNK, 100, 16).unwrap();
    let (size, m) = fs.map(o.ino, 0, u64::MAX, 16).unwrap();
    assert_eq!(size, 20 * CHUNK + 100);
    assert_eq!(m.len(), 3, "{m:?}");
    assert_eq!(m[1].dev, None);
    assert_eq!((m[1].file_off, m[1].len), (6 * CHUNK, 14 * CHUNK));
    let st = fs.stat(&root, b"/d/f", true).unwrap();
    assert_eq!(st.blocks, 7 * CHUNK / 512);
    // Directories: readdir, nlink, rmdir.
    fs.mkdir(&root, b"/d/sub", 0o700).unwrap();
    assert_eq!(fs.stat(&root, b"/d", true).unwrap().nlink, 3);
    assert_eq!(names(&fs, &root, b"/d"), [".", "..", "f", "sub"]);
    assert_eq!(errno(fs.rmdir(&root, b"/d")), libc::ENOTEMPTY);
    assert_eq!(errno(fs.rmdir(&root, b"/d/f")), libc::ENOTDIR);
    assert_eq!(errno(fs.rmdir(&root, b"/")), libc::EBUSY);
    assert_eq!(errno(fs.rmdir(&root, b"/d/sub/.")), libc::EINVAL);
    assert_eq!(errno(fs.unlink(&root, b"/d/sub")), libc::EISDIR);
    assert_eq!(errno(fs.mkdir(&root, b"/d/sub", 0o755)), libc::EEXIST);
    fs.rmdir(&root, b"/d/sub").unwrap();
    assert_eq!(fs.stat(&root, b"/d", true).unwrap().nlink, 2);
    // Links and symlinks.
    fs.link(&root, b"/d/f", b"/g").unwrap();
    assert_eq!(fs.stat(&root, b"/g", true).unwrap().nlink, 2);
    assert_eq!(errno(fs.link(&root, b"/d", b"/e")), libc::EPERM);
    assert_eq!(errno(fs.link(&root, b"/d/f", b"/g")), libc::EEXIST);
    fs.symlink(&root, b"d/f", b"/s").unwrap();
    fs.symlink(&root, b"/d", b"/sd").unwrap();
    assert_eq!(fs.readlink(&root, b"/s").unwrap(), b"d/f");
    assert_eq!(errno(fs.readlink(&root, b"/g")), libc::EINVAL);
    assert_eq!(fs.stat(&root, b"/s", true).unwrap().ino, o.ino);
    assert_eq!(
        fs.stat(&root, b"/s", false).unwrap().mode & S_IFMT,
        libc::S_IFLNK
    );
    assert_eq!(fs.stat(&root, b"/sd/f", true).unwrap().ino, o.ino);
    fs.symlink(&root, b"/loop", b"/loop").unwrap();
    assert_eq!(errno(fs.stat(&root, b"/loop", true)), libc::ELOOP);
    assert_eq!(
        errno(fs.open(&root, b"/s", RW | libc::O_NOFOLLOW, 0)),
        libc::ELOOP
    );
    // Rename: atomic replace, directory moves, loops refused.
    let other = fs.open(&root, b"/other", CREAT, 0o600).unwrap();
    fs.close(other.ino).unwrap();
    fs.rename(&root, b"/other", b"/g", false).unwrap();
    assert_eq!(fs.stat(&root, b"/g", true).unwrap().ino, other.ino);
    assert_eq!(fs.stat(&root, b"/d/f", true).unwrap().nlink, 1);
    assert_eq!(errno(fs.rename(&root, b"/g", b"/d/f", true)), libc::EEXIST);
    fs.mkdir(&root, b"/d/inner", 0o755).unwrap();
    assert_eq!(
        errno(fs.rename(&root, b"/d", b"/d/inner/x", false)),
        libc::EINVAL
    );
    assert_eq!(errno(fs.rename(&root, b"/g", b"/d", false)), libc::EISDIR);
    assert_eq!(
        errno(fs.rename(&root, b"/d/inner", b"/g", false)),
        libc::ENOTDIR
    );
    fs.rename(&root, b"/d/inner", b"/moved", false).unwrap();
    // Two subdirectories and /lost+found.
    assert_eq!(fs.stat(&root, b"/", true).unwrap().nlink, 5);
    assert_eq!(names(&fs, &root, b"/moved"), [".", ".."]);
    fs.mkdir(&root, b"/empty", 0o755).unwrap();
    fs.rename(&root, b"/moved", b"/empty", false).unwrap();
    assert_eq!(errno(fs.stat(&root, b"/moved", true)), libc::ENOENT);
    // Truncate down and up: the tail reads as zeros.
    let cs = CHUNK as usize;
    let dev = fs.map(o.ino, 0, 1, 1).unwrap().1[0].dev.unwrap();
    // SAFETY: the source is a live buffer of the given length.
    unsafe { a.write(dev, [0xAB; 100].as_ptr(), 100) };
    fs.truncate(&root, b"/d/f", 50).unwrap();
    fs.truncate(&root, b"/d/f", 100).unwrap();
    let mut back = [1u8; 100];
    // SAFETY: `back` is valid for 100 bytes.
    unsafe { a.read(dev, back.as_mut_ptr(), 100) };
    assert_eq!(&back[..50], &[0xAB; 50][..]);
    assert_eq!(
        &back[50..],
        &[0; 50][..],
        "truncated bytes read back as zeros"
    );
    let (_, m) = fs.map(o.ino, 0, u64::MAX, 16).unwrap();
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].len as usize, cs);
    assert_eq!(errno(fs.truncate(&root, b"/d", 0)), libc::EISDIR);
    // Attributes.
    fs.chmod(&root, o.ino, 0o4755).unwrap();
    fs.chown(&root, o.ino, Some(7), None).unwrap();
    let st = fs.stat_ino(o.ino);
    assert_eq!(
        (st.uid, st.mode & 0o7777),
        (7, 0o755),
        "chown clears set-user-ID"
    );
    let t = Time {
        sec: 1_000_000,
        nsec: 5,
    };
    fs.utimes(&root, o.ino, SetTime::At(t), SetTime::Omit)
        .unwrap();
    assert_eq!(fs.stat_ino(o.ino).atime, t);
    let s = fs.statfs();
    assert_eq!(s.chunk_size, CHUNK);
    assert!(s.chunks_free < s.chunks);
    fs.close(o.ino).unwrap();
    let report = fs.check();
    assert_eq!(report.errors(), 0, "{:?}", report.problems);
}

#[test]
fn credentials_are_checked() {
    let a = formatted(32 << 20);
    let mut fs = mount(&a);
    let root = Cred::root();
    let (alice, bob) = (user(1000), user(1001));
    fs.mkdir(&root, b"/home", 0o1777).unwrap();
    let f = fs.open(&alice, b"/home/secret", CREAT, 0o600).unwrap();
    fs.close(f.ino).unwrap();
    assert_eq!(f.stat.uid, 1000);
    assert_eq!(
        errno(fs.open(&bob, b"/home/secret", libc::O_RDONLY, 0)),
        libc::EACCES
    );
    assert_eq!(errno(fs.truncate(&bob, b"/home/secret", 0)), libc::EACCES);
    assert_eq!(
        errno(fs.unlink(&bob, b"/home/secret")),
        libc::EPERM,
        "sticky directory"
    );
    assert_eq!(
        errno(fs.rename(&bob, b"/home/secret", b"/home/mine", false)),
        libc::EPERM
    );
    assert_eq!(errno(fs.chmod(&bob, f.ino, 0o666)), libc::EPERM);
    assert_eq!(
        errno(fs.chown(&alice, f.ino, Some(1001), None)),
        libc::EPERM
    );
    assert_eq!(errno(fs.chown(&alice, f.ino, None, Some(5))), libc::EPERM);
    assert_eq!(
        errno(fs.utimes(&bob, f.ino, SetTime::Now, SetTime::Now)),
        libc::EACCES
    );
    assert_eq!(errno(fs.mkdir(&bob, b"/nope", 0o755)), libc::EACCES);
    // Read-only for the group, through a supplementary group.
    fs.chmod(&alice, f.ino, 0o640).unwrap();
    fs.chown(&root, f.ino, None, Some(50)).unwrap();
    let carol = Cred {
        uid: 1002,
        gid: 1002,
        groups: vec![50],
    };
    let o = fs.open(&carol, b"/home/secret", libc::O_RDONLY, 0).unwrap();
    assert!(o.read && !o.write);
    fs.close(o.ino).unwrap();
    assert_eq!(
        errno(fs.open(&carol, b"/home/secret", libc::O_WRONLY, 0)),
        libc::EACCES
    );
    // Search permission on the way.
    fs.mkdir(&alice, b"/home/private", 0o700).unwrap();
    let g = fs.open(&alice, b"/home/private/x", CREAT, 0o666).unwrap();
    fs.close(g.ino).unwrap();
    assert_eq!(errno(fs.stat(&bob, b"/home/private/x", true)), libc::EACCES);
    assert!(
        fs.stat(&root, b"/home/private/x", true).is_ok(),
        "root bypasses"
    );
    // Setgid directories pass their group on.
    fs.mkdir(&root, b"/shared", 0o2777).unwrap();
    fs.chown(
        &root,
        fs.lookup(&root, b"/shared", true).unwrap(),
        None,
        Some(77),
    )
    .unwrap();
    let h = fs.open(&bob, b"/shared/x", CREAT, 0o644).unwrap();
    assert_eq!(h.stat.gid, 77);
    fs.close(h.ino).unwrap();
    let d = fs.mkdir(&bob, b"/shared/dir", 0o755).unwrap();
    assert_eq!((d.gid, d.mode & 0o2000), (77, 0o2000));
}

/// The kernel's `fs.protected_hardlinks`, `fs.protected_symlinks` and `fs.protected_regular`
/// rules, which nvfs applies whatever the host's settings.
#[test]
fn links_and_sticky_directories_follow_the_kernels_protections() {
    let a = formatted(32 << 20);
    let mut fs = mount(&a);
    let root = Cred::root();
    let (alice, bob) = (user(1000), user(1001));
    fs.mkdir(&root, b"/tmp", 0o1777).unwrap();
    fs.mkdir(&bob, b"/tmp/bob", 0o700).unwrap();
    // Hard links: another user's private file cannot be pinned, a shared one can.
    let secret = fs
        .open(&alice, b"/tmp/secret", CREAT | libc::O_EXCL, 0o600)
        .unwrap();
    fs.close(secret.ino).unwrap();
    assert_eq!(
        errno(fs.link(&bob, b"/tmp/secret", b"/tmp/bob/mine")),
        libc::EPERM
    );
    assert!(fs.lookup(&root, b"/tmp/bob/mine", false).is_err());
    fs.chmod(&alice, secret.ino, 0o644).unwrap();
    assert_eq!(
        errno(fs.link(&bob, b"/tmp/secret", b"/tmp/bob/mine")),
        libc::EPERM,
        "readable but not writable"
    );
    fs.chmod(&alice, secret.ino, 0o666).unwrap();
    fs.link(&bob, b"/tmp/secret", b"/tmp/bob/mine").unwrap();
    fs.unlink(&bob, b"/tmp/bob/mine").unwrap();
    fs.chmod(&alice, secret.ino, 0o4666).unwrap();
    assert_eq!(
        errno(fs.link(&bob, b"/tmp/secret", b"/tmp/bob/mine")),
        libc::EPERM,
        "set-user-ID"
    );
    fs.chmod(&alice, secret.ino, 0o2676).unwrap();
    assert_eq!(
        errno(fs.link(&bob, b"/tmp/secret", b"/tmp/bob/mine")),
        libc::EPERM,
        "executable set-group-ID"
    );
    fs.chmod(&alice, secret.ino, 0o600).unwrap();
    fs.link(&alice, b"/tmp/secret", b"/tmp/alice-too").unwrap();
    fs.link(&root, b"/tmp/secret", b"/tmp/root-too").unwrap();
    // Symlinks in a sticky world-writable directory: followed by their owner only, unless the
    // directory's owner owns them; root included.
    fs.symlink(&bob, b"/tmp/secret", b"/tmp/trap").unwrap();
    assert_eq!(errno(fs.stat(&alice, b"/tmp/trap", true)), libc::EACCES);
    assert_eq!(
        errno(fs.open(&root, b"/tmp/trap", libc::O_RDONLY, 0)),
        libc::EACCES
    );
    assert_eq!(
        errno(fs.stat(&root, b"/tmp/trap/", true)),
        libc::EACCES,
        "in the middle of a path too"
    );
    assert!(
        fs.stat(&alice, b"/tmp/trap", false).is_ok(),
        "lstat is fine"
    );
    assert!(
        fs.stat(&bob, b"/tmp/trap", true).is_ok(),
        "the owner follows"
    );
    fs.symlink(&root, b"/tmp/secret", b"/tmp/roots").unwrap();
    assert!(
        fs.stat(&alice, b"/tmp/roots", true).is_ok(),
        "the directory's owner's"
    );
    fs.symlink(&bob, b"/tmp/secret", b"/tmp/bob/link").unwrap();
    fs.chmod(&bob, fs.lookup(&bob, b"/tmp/bob", true).unwrap(), 0o755)
        .unwrap();
    assert!(
        fs.stat(&alice, b"/tmp/bob/link", true).is_ok(),
        "a directory that is not sticky and world-writable"
    );
    // O_CREAT on another user's existing file in a sticky world-writable directory.
    fs.chmod(&alice, secret.ino, 0o644).unwrap();
    assert_eq!(
        errno(fs.open(&bob, b"/tmp/secret", libc::O_CREAT | libc::O_RDONLY, 0o644)),
        libc::EACCES
    );
    assert_eq!(
        errno(fs.open(&root, b"/tmp/secret", libc::O_CREAT | libc::O_RDONLY, 0o644)),
        libc::EACCES,
        "root too"
    );
    let o = fs.open(&bob, b"/tmp/secret", libc::O_RDONLY, 0).unwrap();
    fs.close(o.ino).unwrap();
    let o = fs
        .open(&alice, b"/tmp/secret", libc::O_CREAT | libc::O_RDONLY, 0)
        .unwrap();
    fs.close(o.ino).unwrap();
    let r = fs.open(&root, b"/tmp/rootfile", CREAT, 0o666).unwrap();
    fs.close(r.ino).unwrap();
    let o = fs.open(&bob, b"/tmp/rootfile", CREAT, 0).unwrap();
    fs.close(o.ino).unwrap();
    fs.chmod(&root, fs.lookup(&root, b"/tmp", true).unwrap(), 0o1775)
        .unwrap();
    let o = fs
        .open(&root, b"/tmp/secret", libc::O_CREAT | libc::O_RDONLY, 0)
        .unwrap();
    fs.close(o.ino).unwrap();
    assert_eq!(fs.check().errors(), 0);
}

#[test]
fn unlinked_files_live_until_closed_and_space_is_reused() {
    let a = formatted(16 << 20);
    let mut fs = mount(&a);
    let root = Cred::root();
    let freed: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let f2 = freed.clone();
    fs.set_revoker(Box::new(move |r| {
        f2.lock().unwrap().extend_from_slice(r);
        Ok(())
    }));
    let free0 = fs.statfs().chunks_free;
    let o = fs.open(&root, b"/f", CREAT, 0o644).unwrap();
    fs.extend(o.ino, 0, 4 * CHUNK, 8).unwrap();
    fs.unlink(&root, b"/f").unwrap();
    assert_eq!(errno(fs.stat(&root, b"/f", true)), libc::ENOENT);
    assert_eq!(
        fs.statfs().chunks_free,
        free0 - 4,
        "still held by the open handle"
    );
    assert!(freed.lock().unwrap().is_empty());
    // It can still grow through its handle.
    fs.extend(o.ino, 4 * CHUNK, CHUNK, 8).unwrap();
    assert_eq!(fs.stat_ino(o.ino).nlink, 0);
    fs.close(o.ino).unwrap();
    assert_eq!(fs.statfs().chunks_free, free0);
    let total: u64 = freed.lock().unwrap().iter().map(|r| r.1).sum();
    assert_eq!(total, 5 * CHUNK, "every freed range was revoked first");
    // Fill the device: ENOSPC, nothing written before is lost.
    let p = fs.open(&root, b"/p", CREAT, 0o644).unwrap();
    fs.extend(p.ino, 0, 10, 1).unwrap();
    let big = fs.open(&root, b"/big", CREAT, 0o644).unwrap();
    let free = fs.statfs().chunks_free;
    assert_eq!(
        errno(fs.extend(big.ino, 0, (free + 1) * CHUNK, 1)),
        libc::ENOSPC
    );
    assert_eq!(
        fs.statfs().chunks_free,
        free,
        "a refused extend takes nothing"
    );
    fs.extend(big.ino, 0, free * CHUNK, 1).unwrap();
    assert_eq!(errno(fs.extend(p.ino, 10, CHUNK, 1)), libc::ENOSPC);
    assert_eq!(fs.stat_ino(p.ino).size, 10);
    fs.truncate_open(big.ino, 0).unwrap();
    assert_eq!(fs.statfs().chunks_free, free);
    fs.extend(p.ino, 10, CHUNK, 1).unwrap();
    fs.close(p.ino).unwrap();
    fs.close(big.ino).unwrap();
    assert_eq!(fs.check().errors(), 0);
}

#[test]
fn unlinked_files_closed_together_are_revoked_once_and_all_freed() {
    let a = formatted(64 << 20);
    let mut fs = mount(&a);
    let root = Cred::root();
    type Revocations = Arc<Mutex<Vec<Vec<(u64, u64)>>>>;
    let calls: Revocations = Arc::default();
    let c2 = calls.clone();
    fs.set_revoker(Box::new(move |r| {
        c2.lock().unwrap().push(r.to_vec());
        Ok(())
    }));
    let free0 = fs.statfs().chunks_free;
    // Enough files for several transactions' worth of frees, each held open and unlinked.
    let n = 200u64;
    let mut inos = Vec::new();
    for i in 0..n {
        let name = format!("/f{i}");
        let o = fs.open(&root, name.as_bytes(), CREAT, 0o644).unwrap();
        fs.extend(o.ino, 0, (1 + i % 3) * CHUNK, 8).unwrap();
        fs.unlink(&root, name.as_bytes()).unwrap();
        inos.push(o.ino);
    }
    // One still has a second handle: closing one of its two frees nothing yet.
    fs.reopen(inos[0]).unwrap();
    let held: u64 = 1;
    let seq = fs.journal_seq();
    let stray = 999_999;
    inos.push(stray);
    assert_eq!(fs.close_many(&inos).unwrap(), vec![stray]);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "one revocation for all of them");
    let revoked: u64 = calls[0].iter().map(|r| r.1).sum();
    let sizes: u64 = (1..n).map(|i| (1 + i % 3) * CHUNK).sum();
    assert_eq!(
        revoked, sizes,
        "every freed range, and only those, revoked first"
    );
    assert_eq!(fs.statfs().chunks_free, free0 - held);
    assert!(
        fs.journal_seq() > seq + 1,
        "the frees took several transactions"
    );
    fs.close(inos[0]).unwrap();
    assert_eq!(fs.statfs().chunks_free, free0);
    let report = fs.check();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
    // After a remount nothing is left either.
    drop(fs);
    let fs = mount(&a);
    assert_eq!(fs.statfs().chunks_free, free0);
}

#[test]
fn an_image_persists_and_fsck_finds_damage() {
    let dir = std::env::temp_dir().join(format!("nvfs-persist-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("image");
    let _ = std::fs::remove_file(&path);
    let root = Cred::root();
    {
        let a = Arc::new(MappedArray::open_file(&path, Some(32 << 20)).unwrap());
        moneta_fs::mkfs(&*a, &options()).unwrap();
        let mut fs = mount(&a);
        fs.mkdir(&root, b"/a", 0o755).unwrap();
        let o = fs.open(&root, b"/a/f", CREAT, 0o644).unwrap();
        fs.extend(o.ino, 0, 12345, 4).unwrap();
        // Unlinked while open when the "daemon" goes away: freed at the next mount.
        let orphan = fs.open(&root, b"/a/orphan", CREAT, 0o644).unwrap();
        fs.extend(orphan.ino, 0, CHUNK, 4).unwrap();
        fs.unlink(&root, b"/a/orphan").unwrap();
        fs.fsync(o.ino).unwrap();
    }
    let a = Arc::new(MappedArray::open_file(&path, None).unwrap());
    let out = fsck(&*a, false).unwrap();
    assert_eq!(out.before.errors(), 0, "{:?}", out.before.problems);
    assert_eq!(
        out.before.problems.len(),
        1,
        "one orphan note: {:?}",
        out.before.problems
    );
    {
        let fs = mount(&a);
        assert_eq!(fs.stat(&root, b"/a/f", true).unwrap().size, 12345);
        assert_eq!(fs.statfs().chunks_free, fs.statfs().chunks - 1);
        assert!(fs.check().problems.is_empty());
    }
    // Damage: a bitmap bit nobody owns, a wrong link count.
    let t = moneta_fs::tables::load(&*a).unwrap();
    let g = t.sb.geometry;
    let last = g.chunk_count - 1;
    let mut w = [0u8; 8];
    // SAFETY: `w` is valid for 8 bytes.
    unsafe { a.read(g.bitmap_off + last / 64 * 8, w.as_mut_ptr(), 8) };
    let v = u64::from_le_bytes(w) | 1 << (last % 64);
    // SAFETY: as above.
    unsafe { a.write(g.bitmap_off + last / 64 * 8, v.to_le_bytes().as_ptr(), 8) };
    let mut n = t.inodes[0];
    n.nlink = 9;
    for at in [g.inode_addr(1), g.mirror_of(g.inode_addr(1)).unwrap()] {
        // SAFETY: the record is 128 bytes.
        unsafe { a.write(at, n.encode(1).as_ptr(), 128) };
    }
    let out = fsck(&*a, false).unwrap();
    assert_eq!(out.before.errors(), 2, "{:?}", out.before.problems);
    let refused = Fs::mount(a.clone() as Arc<dyn Media>);
    assert!(refused.is_err(), "an inconsistent image is not mounted");
    let out = fsck(&*a, true).unwrap();
    assert_eq!(out.repaired.len(), 2);
    assert_eq!(out.after.unwrap().errors(), 0);
    let fs = mount(&a);
    assert_eq!(
        fs.stat(&root, b"/", true).unwrap().nlink,
        4,
        "/a and /lost+found"
    );
    drop(fs);
    drop(a);
    // A foreign image is refused with a clear message.
    std::fs::write(dir.join("foreign"), vec![0x55u8; 1 << 20]).unwrap();
    let f = Arc::new(MappedArray::open_file(&dir.join("foreign"), None).unwrap());
    let err = Fs::mount(f as Arc<dyn Media>).err().unwrap().to_string();
    assert!(err.contains("not an nvfs image"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs `op` against an array that dies after each possible number of stores in turn, and
/// checks that remounting always finds a consistent image in either the old or the new state.
fn crash_everywhere(
    setup: impl Fn(&mut Fs),
    op: impl Fn(&mut Fs),
    old: impl Fn(&Fs) -> bool,
    new: impl Fn(&Fs) -> bool,
) {
    let mut budget = 0;
    loop {
        let a = formatted(16 << 20);
        {
            let mut fs = mount(&a);
            setup(&mut fs);
        }
        let dying = Arc::new(Dying::new(a.clone(), budget));
        {
            let mut fs = Fs::mount(dying.clone() as Arc<dyn Media>).unwrap();
            op(&mut fs);
        }
        let finished = !dying.died();
        let fs = mount(&a);
        let report = fs.check();
        assert_eq!(
            report.errors(),
            0,
            "crash after {budget} stores: {:?}",
            report.problems
        );
        if finished {
            assert!(new(&fs), "the completed change is all there");
            break;
        }
        assert!(
            old(&fs) || new(&fs),
            "crash after {budget} stores: neither old nor new state"
        );
        budget += 1;
    }
    assert!(budget > 3, "the change took several stores ({budget})");
}

#[test]
fn renames_replacing_a_file_are_atomic_across_crashes() {
    let root = Cred::root();
    crash_everywhere(
        |fs| {
            for name in [&b"/a"[..], b"/b"] {
                let o = fs.open(&root, name, CREAT, 0o644).unwrap();
                fs.extend(o.ino, 0, 2 * CHUNK, 4).unwrap();
                fs.close(o.ino).unwrap();
            }
        },
        |fs| {
            let _ = fs.rename(&root, b"/a", b"/b", false);
        },
        |fs| {
            fs.stat(&root, b"/a", true).is_ok() && fs.statfs().chunks_free == fs.statfs().chunks - 4
        },
        |fs| {
            fs.stat(&root, b"/a", true).is_err()
                && fs.statfs().chunks_free == fs.statfs().chunks - 2
        },
    );
}

#[test]
fn creates_and_extends_are_atomic_across_crashes() {
    let root = Cred::root();
    crash_everywhere(
        |fs| {
            fs.mkdir(&root, b"/d", 0o755).unwrap();
        },
        |fs| {
            if let Ok(o) = fs.open(&root, b"/d/f", CREAT, 0o644) {
                let _ = fs.extend(o.ino, 0, 3 * CHUNK, 4);
            }
        },
        |fs| fs.stat(&root, b"/d/f", true).is_err(),
        |fs| {
            fs.stat(&root, b"/d/f", true)
                .is_ok_and(|s| s.size == 3 * CHUNK || s.size == 0)
        },
    );
}

#[test]
fn files_freed_together_are_freed_consistently_across_crashes() {
    let root = Cred::root();
    let names: [&[u8]; 3] = [b"/a", b"/b", b"/c"];
    let sizes = [CHUNK, 3 * CHUNK, 2 * CHUNK];
    crash_everywhere(
        |fs| {
            for (name, size) in names.iter().zip(sizes) {
                let o = fs.open(&root, name, CREAT, 0o644).unwrap();
                fs.extend(o.ino, 0, size, 4).unwrap();
                fs.close(o.ino).unwrap();
            }
        },
        |fs| {
            let mut inos = Vec::new();
            for name in names {
                let Ok(o) = fs.open(&root, name, RW, 0) else {
                    return;
                };
                if fs.unlink(&root, name).is_err() {
                    return;
                }
                inos.push(o.ino);
            }
            let _ = fs.close_many(&inos);
        },
        // Every file is there whole or gone (a crash leaves the unlinked ones orphans, which
        // the mount frees), and the free space counts exactly the ones still there.
        |fs| {
            let mut used = 0;
            for (name, size) in names.iter().zip(sizes) {
                match fs.stat(&root, name, true) {
                    Ok(st) if st.size == size => used += size / CHUNK,
                    Ok(_) => return false,
                    Err(_) => {}
                }
            }
            fs.statfs().chunks_free == fs.statfs().chunks - used
        },
        |fs| {
            names.iter().all(|n| fs.stat(&root, n, true).is_err())
                && fs.statfs().chunks_free == fs.statfs().chunks
        },
    );
}

#[test]
fn truncates_are_atomic_across_crashes() {
    let root = Cred::root();
    crash_everywhere(
        |fs| {
            let o = fs.open(&root, b"/f", CREAT, 0o644).unwrap();
            fs.extend(o.ino, 0, 5 * CHUNK, 4).unwrap();
            fs.close(o.ino).unwrap();
        },
        |fs| {
            let _ = fs.truncate(&root, b"/f", CHUNK + 1);
        },
        |fs| fs.stat(&root, b"/f", true).unwrap().size == 5 * CHUNK,
        |fs| {
            let s = fs.stat(&root, b"/f", true).unwrap();
            s.size == CHUNK + 1 && s.blocks == 2 * CHUNK / 512
        },
    );
}

#[test]
fn fsck_finds_a_directory_cycle_and_walks_a_deep_chain() {
    let a = formatted(32 << 20);
    let root = Cred::root();
    {
        let mut fs = mount(&a);
        // A chain 200 directories deep checks clean.
        let mut path = String::new();
        for _ in 0..200 {
            path.push_str("/d");
            fs.mkdir(&root, path.as_bytes(), 0o755).unwrap();
        }
        fs.mkdir(&root, b"/x", 0o755).unwrap();
        fs.mkdir(&root, b"/x/y", 0o755).unwrap();
        assert_eq!(fs.check().errors(), 0);
        // A clean stop: the log holds nothing to lay over the damage below.
        fs.unmount().unwrap();
    }
    // Make /x a child of /x/y: a cycle cut off from the root.
    let t = moneta_fs::tables::load(&*a).unwrap();
    let g = t.sb.geometry;
    let find = |name: &[u8]| {
        t.dirents
            .iter()
            .find(|(_, d)| d.name == name)
            .map(|(s, d)| (*s, d.clone()))
            .unwrap()
    };
    let (xs, mut x) = find(b"x");
    let (_, y) = find(b"y");
    x.parent = y.ino;
    // SAFETY: the record is DIRENT_SIZE bytes.
    unsafe { a.write(g.dirent_addr(xs), x.encode(xs).as_ptr(), x.encode(xs).len()) };
    let out = fsck(&*a, false).unwrap();
    let unreachable = out
        .before
        .problems
        .iter()
        .filter(|p| p.text.contains("not reachable"))
        .count();
    assert_eq!(unreachable, 2, "{:?}", out.before.problems);
    assert!(Fs::mount(a.clone() as Arc<dyn Media>).is_err());
}

/// Watches on what a stat depended on fire at the commit of any change to it, once.
#[test]
fn watches_fire_when_what_an_answer_depended_on_changes() {
    #[derive(Default)]
    struct Log(Mutex<Vec<(u32, u16)>>);
    impl moneta_fs::ChangeSink for Log {
        fn changed(&self, observer: u32, slot: u16) {
            self.0.lock().unwrap().push((observer, slot));
        }
    }
    let a = formatted(64 << 20);
    let mut fs = mount(&a);
    let log = Arc::new(Log::default());
    fs.set_change_sink(log.clone());
    let root = Cred::root();
    fs.mkdir(&root, b"/d", 0o755).unwrap();
    let f = fs.open(&root, b"/d/f", CREAT, 0o644).unwrap();
    fs.close(f.ino).unwrap();
    let fired = |log: &Log| std::mem::take(&mut *log.0.lock().unwrap());
    let watch = |fs: &mut Fs, path: &[u8], slot: u16| {
        let mut seen = Vec::new();
        let r = fs.stat_seen(&root, path, true, &mut seen);
        fs.watch(1, slot, &seen);
        (r.map(|s| s.ino), seen)
    };
    // A path's answer depends on the search of the root and of the directory, the two names
    // looked up, and the file reached.
    let (ino, seen) = watch(&mut fs, b"/d/f", 7);
    assert_eq!(seen.len(), 5, "{seen:?}");
    assert_eq!(ino.unwrap(), f.ino);
    fired(&log);
    // Another name added beside it changes neither: nothing fires.
    let g = fs.open(&root, b"/d/g", CREAT, 0o644).unwrap();
    fs.close(g.ino).unwrap();
    assert!(fired(&log).is_empty());
    // A change of the file fires it, once.
    fs.chmod(&root, f.ino, 0o600).unwrap();
    assert_eq!(fired(&log), [(1, 7)]);
    fs.chmod(&root, f.ino, 0o600).unwrap();
    assert!(fired(&log).is_empty(), "fired already");
    // So does a change of who may search the directory.
    watch(&mut fs, b"/d/f", 7).0.unwrap();
    let d = fs.lookup(&root, b"/d", true).unwrap();
    fs.chmod(&root, d, 0o700).unwrap();
    assert_eq!(fired(&log), [(1, 7)]);
    // And the name going.
    watch(&mut fs, b"/d/f", 8).0.unwrap();
    fs.unlink(&root, b"/d/f").unwrap();
    assert!(fired(&log).contains(&(1, 8)));
    // A missing name: its directory is watched, and creating the name fires it.
    fs.unwatch(1);
    let (missing, seen) = watch(&mut fs, b"/d/new", 9);
    assert_eq!(missing.unwrap_err().errno, libc::ENOENT);
    assert_eq!(seen.len(), 4, "two searches and two names: {seen:?}");
    let n = fs.open(&root, b"/d/new", CREAT, 0o644).unwrap();
    fs.close(n.ino).unwrap();
    assert_eq!(fired(&log), [(1, 9)]);
    // Growing a file changes its attributes.
    fs.unwatch(1);
    watch(&mut fs, b"/d/new", 3).0.unwrap();
    let h = fs.open(&root, b"/d/new", RW, 0).unwrap();
    fs.extend(h.ino, 0, 8192, 16).unwrap();
    assert!(fired(&log).contains(&(1, 3)));
    fs.close(h.ino).unwrap();
    // A renamed directory fires what went through it; forgotten watches never fire.
    watch(&mut fs, b"/d/g", 4).0.unwrap();
    fs.unwatch(1);
    fs.rename(&root, b"/d", b"/e", false).unwrap();
    assert!(fired(&log).is_empty());
    watch(&mut fs, b"/e/g", 5).0.unwrap();
    fs.rename(&root, b"/e", b"/d", false).unwrap();
    assert_eq!(fired(&log), [(1, 5)]);
    fs.unwatch(1);
    assert_eq!(fs.watch_count(), 0);
}

/// Walks of paths in one directory after another see every change on the way at once: of a
/// directory's names, of who may search it, of where a link leads, of who asks.
#[test]
fn walks_in_one_directory_after_another_see_every_change_on_the_way() {
    let a = formatted(32 << 20);
    let mut fs = mount(&a);
    let root = Cred::root();
    let alice = user(1000);
    let bob = user(1001);
    fs.mkdir(&root, b"/a", 0o755).unwrap();
    fs.mkdir(&root, b"/a/b", 0o755).unwrap();
    for f in [&b"/a/b/f1"[..], b"/a/b/f2", b"/a/b/f3"] {
        let o = fs.open(&root, f, CREAT, 0o644).unwrap();
        fs.close(o.ino).unwrap();
    }
    assert!(fs.stat(&alice, b"/a/b/f1", true).is_ok());
    // The same directory, other names.
    let f2 = fs.stat(&alice, b"/a/b/f2", true).unwrap().ino;
    assert_eq!(errno(fs.stat(&alice, b"/a/b/none", true)), libc::ENOENT);
    // Who may search a directory on the way changes.
    let a_ino = fs.lookup(&root, b"/a", true).unwrap();
    fs.chmod(&root, a_ino, 0o700).unwrap();
    assert_eq!(errno(fs.stat(&alice, b"/a/b/f3", true)), libc::EACCES);
    assert!(fs.stat(&root, b"/a/b/f3", true).is_ok());
    // Another caller in the same directory is checked as itself.
    assert_eq!(errno(fs.stat(&bob, b"/a/b/f1", true)), libc::EACCES);
    fs.chmod(&root, a_ino, 0o755).unwrap();
    assert!(fs.stat(&bob, b"/a/b/f1", true).is_ok());
    // The directory is renamed away and another takes its name.
    fs.rename(&root, b"/a/b", b"/a/c", false).unwrap();
    assert_eq!(errno(fs.stat(&bob, b"/a/b/f1", true)), libc::ENOENT);
    assert_eq!(fs.stat(&bob, b"/a/c/f2", true).unwrap().ino, f2);
    fs.mkdir(&root, b"/a/b", 0o755).unwrap();
    assert_eq!(errno(fs.stat(&bob, b"/a/b/f2", true)), libc::ENOENT);
    let o = fs.open(&root, b"/a/b/f2", CREAT, 0o644).unwrap();
    fs.close(o.ino).unwrap();
    assert_ne!(fs.stat(&bob, b"/a/b/f2", true).unwrap().ino, f2);
    // A link on the way is followed anew each time.
    fs.symlink(&root, b"/a/c", b"/l").unwrap();
    assert_eq!(fs.stat(&bob, b"/l/f2", true).unwrap().ino, f2);
    fs.unlink(&root, b"/l").unwrap();
    fs.symlink(&root, b"/a/b", b"/l").unwrap();
    assert_ne!(fs.stat(&bob, b"/l/f2", true).unwrap().ino, f2);
    // `..` on the way, after its directory moved.
    assert_eq!(fs.stat(&bob, b"/a/c/../c/f2", true).unwrap().ino, f2);
    fs.mkdir(&root, b"/x", 0o755).unwrap();
    fs.rename(&root, b"/a/c", b"/x/c", false).unwrap();
    assert_eq!(errno(fs.stat(&bob, b"/a/c/../c/f2", true)), libc::ENOENT);
    assert_eq!(fs.stat(&bob, b"/x/c/../c/f2", true).unwrap().ino, f2);
}

#[test]
fn space_only_holds_can_reach_is_listed_for_revocation_and_not_revoked_twice() {
    let a = formatted(16 << 20);
    let mut fs = mount(&a);
    let root = Cred::root();
    let revoked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let r2 = revoked.clone();
    fs.set_revoker(Box::new(move |r| {
        r2.lock().unwrap().extend_from_slice(r);
        Ok(())
    }));
    let free0 = fs.statfs().chunks_free;
    let make = |fs: &mut Fs, name: &[u8], chunks: u64| {
        let o = fs.open(&root, name, CREAT, 0o644).unwrap();
        fs.extend(o.ino, 0, chunks * CHUNK, 8).unwrap();
        o.ino
    };
    // `a`: unlinked, open through two holds (a close left for later, an unlink's hold).
    let a_ino = make(&mut fs, b"/a", 2);
    fs.hold(a_ino).unwrap();
    fs.unlink(&root, b"/a").unwrap();
    // `b`: unlinked but open through a handle besides the hold; `c`: still linked.
    let b_ino = make(&mut fs, b"/b", 3);
    fs.hold(b_ino).unwrap();
    fs.unlink(&root, b"/b").unwrap();
    let c_ino = make(&mut fs, b"/c", 1);
    let queue = [a_ino, b_ino, c_ino, a_ino];
    let (files, ranges) = fs.unreachable(&queue);
    assert_eq!(
        files,
        vec![a_ino],
        "only a's space is out of everyone's reach"
    );
    assert_eq!(ranges.iter().map(|r| r.1).sum::<u64>(), 2 * CHUNK);
    // The caller revokes a's space itself; closing the queue revokes nothing of it again.
    let closed = fs.close_many_revoked(&queue, &files).unwrap();
    assert!(closed.is_empty());
    assert!(
        revoked.lock().unwrap().is_empty(),
        "a's space was not revoked twice"
    );
    assert_eq!(fs.statfs().chunks_free, free0 - 4, "a freed, b and c kept");
    assert_eq!(fs.stat_ino(b_ino).nlink, 0);
    // b's last handle: its space is revoked as any.
    fs.close(b_ino).unwrap();
    assert_eq!(
        revoked.lock().unwrap().iter().map(|r| r.1).sum::<u64>(),
        3 * CHUNK
    );
    assert_eq!(fs.statfs().chunks_free, free0 - 1);
    assert_eq!(fs.check().errors(), 0);
}
