//! Files in memory (`OP_FS_MAP`, memory drives): a mapping is the file's own pages, shared
//! with the channel path and every other mapping with no copy; a read-only open never yields
//! writable pages; space that leaves a mapped file leaves its mappings too. Real daemons, real
//! `mmap`.

mod common;

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;

use common::*;
use libmoneta::{ClientError, Moneta, OpenOptions};

/// Entry point of child processes started with `spawn_role_as`; does nothing in a normal run.
#[test]
fn child_process_entry() {
    let Some((role, args)) = child_role() else {
        return;
    };
    let code = match role.as_str() {
        "reader" => reader_cannot_write(&args),
        "store-and-die" => store_and_die(&args),
        "map-many" => map_many(&args),
        "syncs" => syncs(&args),
        other => panic!("unknown role {other}"),
    };
    std::process::exit(code);
}

fn rw() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

fn ro() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.read(true);
    o
}

/// A mapping of `len` bytes of `fd` from 0, unmapped on drop.
struct Mapped {
    p: *mut u8,
    len: usize,
}

impl Mapped {
    fn new(fd: &OwnedFd, len: usize, prot: i32) -> Result<Mapped, i32> {
        // SAFETY: a new mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap());
        }
        Ok(Mapped { p: p.cast(), len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` mapped bytes; other writers only store bytes.
        unsafe { std::slice::from_raw_parts(self.p, self.len) }
    }

    fn store(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: inside the mapping, which is writable for the callers of this.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.p.add(off), data.len()) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.p.cast(), self.len) };
    }
}

fn read_all(f: &libmoneta::File, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    let n = f.read_at(&mut buf, 0).unwrap();
    buf.truncate(n);
    buf
}

fn errno_of<T>(r: Result<T, ClientError>) -> i32 {
    match r {
        Err(e) => e.errno(),
        Ok(_) => panic!("expected an error"),
    }
}

#[test]
fn a_mapping_is_the_files_own_pages() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/a", &rw()).unwrap();
    let data = pattern(1, 0, 3 * 4096);
    f.write_at(&data, 0).unwrap();

    let (pages, st) = f.pages(true).unwrap();
    assert_eq!(st.size, data.len() as u64);
    let map = Mapped::new(&pages, data.len(), libc::PROT_READ | libc::PROT_WRITE).unwrap();
    assert_eq!(map.bytes(), &data[..], "the mapping holds what was written");

    // A store through the mapping is what the channel reads, at once.
    map.store(5000, b"through the mapping");
    assert_eq!(
        &read_all(&f, data.len())[5000..5019],
        b"through the mapping"
    );

    // A write through another connection's channel is in the mapping, at once.
    let m2 = Moneta::connect(&d.socket).unwrap();
    let g = m2.open("/a", &rw()).unwrap();
    g.write_at(b"through the channel", 100).unwrap();
    assert_eq!(&map.bytes()[100..119], b"through the channel");

    // A second mapping, from the other connection, shares the same pages.
    let (pages2, _) = g.pages(false).unwrap();
    let map2 = Mapped::new(&pages2, data.len(), libc::PROT_READ).unwrap();
    map.store(9000, b"seen by both");
    assert_eq!(&map2.bytes()[9000..9012], b"seen by both");

    // The file grows after it was mapped: its new space is in its pages too.
    let tail = pattern(2, 0, 8192);
    f.write_at(&tail, 40960).unwrap();
    let (pages3, st) = f.pages(true).unwrap();
    assert_eq!(st.size, 40960 + 8192);
    let big = Mapped::new(
        &pages3,
        st.size as usize,
        libc::PROT_READ | libc::PROT_WRITE,
    )
    .unwrap();
    assert_eq!(&big.bytes()[40960..], &tail[..]);
    big.store(45000, b"grown");
    let mut buf = [0u8; 5];
    g.read_at(&mut buf, 45000).unwrap();
    assert_eq!(&buf, b"grown");
    // The hole between the old end and the new data reads as zeros either way.
    assert!(big.bytes()[3 * 4096..40960].iter().all(|&b| b == 0));
}

#[test]
fn read_only_opens_get_read_only_pages() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/a", &rw()).unwrap();
    f.write_at(&pattern(3, 0, 8192), 0).unwrap();
    let r = m.open("/a", &ro()).unwrap();
    assert_eq!(errno_of(r.pages(true)), libc::EBADF);
    let (pages, _) = r.pages(false).unwrap();
    // The kernel refuses writable shared pages of a read-only descriptor, now and later.
    assert_eq!(
        Mapped::new(&pages, 8192, libc::PROT_READ | libc::PROT_WRITE).err(),
        Some(libc::EACCES)
    );
    let map = Mapped::new(&pages, 8192, libc::PROT_READ).unwrap();
    // SAFETY: changing the protection of our own mapping.
    let rc = unsafe { libc::mprotect(map.p.cast(), 8192, libc::PROT_READ | libc::PROT_WRITE) };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    // The pages are the daemon's user's alone, sealed against shrinking.
    let meta = std::fs::metadata(format!("/proc/self/fd/{}", pages.as_raw_fd())).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // SAFETY: a query of our own descriptor.
    let seals = unsafe { libc::fcntl(pages.as_raw_fd(), libc::F_GET_SEALS) };
    assert!(seals >= 0 && seals & libc::F_SEAL_SHRINK != 0);
    // A write-only open cannot map at all (mmap needs a readable descriptor).
    let mut wo = OpenOptions::new();
    wo.write(true);
    let w = m.open("/a", &wo).unwrap();
    assert_eq!(errno_of(w.pages(false)), libc::EACCES);
}

/// As another user: open the file read-only, take its pages, and try every way to write.
fn reader_cannot_write(args: &[String]) -> i32 {
    let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
    let r = m.open("/shared", &ro()).unwrap();
    let (pages, _) = r.pages(false).unwrap();
    let path = format!("/proc/self/fd/{}", pages.as_raw_fd());
    let reopened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path);
    assert_eq!(
        reopened.err().and_then(|e| e.raw_os_error()),
        Some(libc::EACCES),
        "the pages reopened for writing through /proc"
    );
    assert_eq!(
        Mapped::new(&pages, 4096, libc::PROT_READ | libc::PROT_WRITE).err(),
        Some(libc::EACCES)
    );
    let map = Mapped::new(&pages, 4096, libc::PROT_READ).unwrap();
    assert_eq!(&map.bytes()[..6], b"shared");
    0
}

/// Maps the file, stores through the mapping, and dies of SIGKILL.
fn store_and_die(args: &[String]) -> i32 {
    let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
    let f = m.open("/k", &rw()).unwrap();
    let (pages, _) = f.pages(true).unwrap();
    let map = Mapped::new(&pages, 8192, libc::PROT_READ | libc::PROT_WRITE).unwrap();
    map.store(4000, b"stored before the kill");
    // SAFETY: ends this process.
    unsafe { libc::raise(libc::SIGKILL) };
    1
}

/// As another user: takes the pages of `want` files, holding half of them as descriptors and
/// half as mappings (their descriptors closed; the second one written through), and is
/// refused the next file's; once it lets them all go, the next file's pages come (the daemon
/// retires pages nobody holds).
fn map_many(args: &[String]) -> i32 {
    let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
    let want: usize = args[1].parse().unwrap();
    let mut fds = Vec::new();
    let mut maps = Vec::new();
    for i in 0..=want {
        let f = m.open(format!("/u/f{i}"), &rw()).unwrap();
        f.write_at(&[b'x'; 32], 0).unwrap();
        match f.pages(i == 1) {
            Ok((fd, _)) if i % 2 == 0 => fds.push(fd),
            Ok((fd, _)) => {
                let prot = libc::PROT_READ | if i == 1 { libc::PROT_WRITE } else { 0 };
                let map = Mapped::new(&fd, 4096, prot).unwrap();
                if i == 1 {
                    map.store(0, b"through the mapping");
                }
                maps.push(map);
            }
            Err(e) if e.errno() == libc::ENOMEM && i == want => {
                // Refused: what is held as a descriptor, and what is held as a mapping only,
                // counts. Let go, they make room, the bytes stored through a mapping kept.
                fds.clear();
                maps.clear();
                f.pages(false).unwrap();
                let g = m.open("/u/f1", &ro()).unwrap();
                assert_eq!(read_all(&g, 32), b"through the mappingxxxxxxxxxxxxx");
                return 0;
            }
            Err(e) => panic!("file {i}: {e}"),
        }
    }
    panic!("mapped {} files, past a user's share", want + 1);
}

#[test]
fn one_user_cannot_map_every_file_the_daemon_allows() {
    if !can_setuid("one_user_cannot_map_every_file_the_daemon_allows") {
        return;
    }
    // A volatile array (memfds) and a persistent one (files of the host).
    let volatile = Daemon::start_fs("256M", &["--socket-mode", "666"]);
    let on_disk = persistent(&["--socket-mode", "666", "--durability", "device"]);
    for d in [volatile, on_disk] {
        std::fs::set_permissions(&d.dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
        let m = Moneta::connect(&d.socket).unwrap();
        m.mkdir("/u", 0o777).unwrap();
        m.chmod("/u", 0o777).unwrap();
        // A user's share is a quarter of the 8,192 files the daemon maps at once.
        let mut child = spawn_role_as(
            1001,
            "map-many",
            &[d.socket.display().to_string(), "2048".into()],
        );
        assert!(child.wait().unwrap().success());
        // Others still map.
        let f = m.open("/mine", &rw()).unwrap();
        f.write_at(b"mine", 0).unwrap();
        f.pages(false).unwrap();
    }
}

#[test]
fn stores_outlive_a_killed_client() {
    for d in [Daemon::start_fs("64M", &[]), persistent(&[])] {
        let m = Moneta::connect(&d.socket).unwrap();
        let f = m.open("/k", &rw()).unwrap();
        f.write_at(&[b'.'; 8192], 0).unwrap();
        let mut child = spawn_role("store-and-die", &[d.socket.display().to_string()]);
        let st = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
        let got = read_all(&f, 8192);
        assert_eq!(&got[4000..4022], b"stored before the kill");
        assert_eq!(got[3999], b'.');
    }
}

#[test]
fn a_mapped_file_grown_by_truncation_has_no_holes() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/t", &rw()).unwrap();
    f.write_at(b"start", 0).unwrap();
    let (pages, _) = f.pages(true).unwrap();
    f.set_len(64 * 1024).unwrap();
    // The pages taken before the truncation cover what it added.
    let map = Mapped::new(&pages, 64 * 1024, libc::PROT_READ | libc::PROT_WRITE).unwrap();
    // A store where the truncation added is what the channel reads.
    map.store(60_000, b"past the old end");
    let mut buf = [0u8; 16];
    f.read_at(&mut buf, 60_000).unwrap();
    assert_eq!(&buf, b"past the old end");
    assert!(map.bytes()[5..60_000].iter().all(|&b| b == 0));
    // A write far past the end leaves no hole either: a store into the gap is in the array.
    f.write_at(b"far", 200_000).unwrap();
    let big = Mapped::new(&pages, 200_003, libc::PROT_READ | libc::PROT_WRITE).unwrap();
    big.store(100_000, b"in the gap");
    let mut buf = [0u8; 10];
    f.read_at(&mut buf, 100_000).unwrap();
    assert_eq!(&buf, b"in the gap");
    assert_eq!(&big.bytes()[200_000..], b"far");
}

#[test]
fn another_users_read_only_pages_cannot_be_reopened_for_writing() {
    if !can_setuid("another_users_read_only_pages_cannot_be_reopened_for_writing") {
        return;
    }
    let d = Daemon::start_fs("64M", &["--socket-mode", "666"]);
    std::fs::set_permissions(&d.dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = Moneta::connect(&d.socket).unwrap();
    let mut o = rw();
    o.mode(0o644);
    let f = m.open("/shared", &o).unwrap();
    f.write_at(b"shared bytes", 0).unwrap();
    let mut child = spawn_role_as(1001, "reader", &[d.socket.display().to_string()]);
    assert!(child.wait().unwrap().success());
    let mut buf = [0u8; 12];
    f.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"shared bytes");
}

#[test]
fn space_that_leaves_a_mapped_file_leaves_its_mappings() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/a", &rw()).unwrap();
    let old = pattern(4, 0, 16384);
    f.write_at(&old, 0).unwrap();
    let (pages, _) = f.pages(true).unwrap();
    let stale = Mapped::new(&pages, old.len(), libc::PROT_READ | libc::PROT_WRITE).unwrap();
    drop(pages);

    // Truncation frees the file's space: the mapping keeps the bytes as they were, and
    // reaches neither the file nor the space, which another file now takes.
    f.set_len(0).unwrap();
    let other = m.open("/b", &rw()).unwrap();
    let theirs = pattern(5, 0, 1 << 20);
    other.write_at(&theirs, 0).unwrap();
    assert_eq!(
        stale.bytes(),
        &old[..],
        "a stale mapping keeps the old bytes"
    );
    stale.store(0, b"stale store");
    let mut buf = vec![0u8; 1 << 20];
    other.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, theirs, "a stale store reached another file");
    assert!(
        read_all(&f, 16384).is_empty(),
        "the truncated file is empty"
    );

    // The file mapped again gets new pages, with its new contents.
    f.write_at(b"new life", 0).unwrap();
    let (pages, st) = f.pages(true).unwrap();
    assert_eq!(st.size, 8);
    let fresh = Mapped::new(&pages, 4096, libc::PROT_READ | libc::PROT_WRITE).unwrap();
    assert_eq!(&fresh.bytes()[..8], b"new life");
    assert_eq!(&stale.bytes()[..11], b"stale store");

    // Unlinked and closed, its space is freed: mappings keep their bytes, and the space
    // goes to other files untouched by them.
    drop(f);
    m.unlink("/a").unwrap();
    let c = m.open("/c", &rw()).unwrap();
    let more = pattern(6, 0, 1 << 20);
    c.write_at(&more, 0).unwrap();
    fresh.store(100, b"after unlink");
    let mut buf = vec![0u8; 1 << 20];
    c.read_at(&mut buf, 0).unwrap();
    assert_eq!(
        buf, more,
        "a store into an unlinked file's mapping reached another file"
    );
    assert_eq!(&fresh.bytes()[..8], b"new life");
}

#[test]
fn directories_cannot_be_mapped() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    m.mkdir("/dir", 0o755).unwrap();
    let dir = m.open("/dir", &ro()).unwrap();
    assert_eq!(errno_of(dir.pages(false)), libc::ENODEV);
}

/// A persistent daemon in its own directory, with `args`.
fn persistent(args: &[&str]) -> Daemon {
    let dir = TempDir::new("pages");
    let img = dir.0.join("device.img").display().to_string();
    let mut all = vec!["--device", img.as_str(), "--size", "64M"];
    all.extend_from_slice(args);
    Daemon::start_raw(&all, dir)
}

fn pages_dir(d: &Daemon) -> std::path::PathBuf {
    d.dir.0.join("device.img.pages")
}

#[test]
fn a_persistent_arrays_mapped_files_outlive_a_killed_daemon() {
    let mut d = persistent(&[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/a", &rw()).unwrap();
    let data = pattern(7, 0, 3 * 4096);
    f.write_at(&data, 0).unwrap();
    let (pages, _) = f.pages(true).unwrap();
    let map = Mapped::new(&pages, data.len(), libc::PROT_READ | libc::PROT_WRITE).unwrap();
    assert_eq!(map.bytes(), &data[..]);
    // Stores through the mapping and writes through the channel, then the daemon dies.
    map.store(4096, b"stored through the mapping");
    f.write_at(b"written through the channel", 8192).unwrap();
    assert!(pages_dir(&d).join(f.ino().to_string()).exists());
    d.kill9();
    drop(map);
    drop(pages);
    d.spawn();
    // The restarted daemon folded the pages back: both are in the file.
    let m = Moneta::connect(&d.socket).unwrap();
    let g = m.open("/a", &ro()).unwrap();
    let got = read_all(&g, data.len());
    let mut want = data.clone();
    want[4096..4096 + 26].copy_from_slice(b"stored through the mapping");
    want[8192..8192 + 27].copy_from_slice(b"written through the channel");
    assert_eq!(got, want);
    assert!(!pages_dir(&d).exists(), "the pages were folded and removed");
}

#[test]
fn a_clean_stop_folds_mapped_files_back() {
    let mut d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/a", &rw()).unwrap();
    f.write_at(&pattern(8, 0, 8192), 0).unwrap();
    let (pages, _) = f.pages(true).unwrap();
    let map = Mapped::new(&pages, 8192, libc::PROT_READ | libc::PROT_WRITE).unwrap();
    map.store(10, b"kept at the stop");
    // fsync at the host level writes the mapped pages back with the rest.
    f.sync_all().unwrap();
    drop(map);
    drop(pages);
    drop(f);
    d.control().shutdown().unwrap();
    d.wait_exit(std::time::Duration::from_secs(30))
        .expect("the daemon stops");
    assert!(
        !pages_dir(&d).exists(),
        "a clean stop leaves no pages aside"
    );
    d.spawn();
    let m = Moneta::connect(&d.socket).unwrap();
    let g = m.open("/a", &ro()).unwrap();
    assert_eq!(&read_all(&g, 8192)[10..26], b"kept at the stop");
}

/// Files that went in place and are no longer held keep their pages only while the
/// segments fit their budget (an eighth of the array, 64 MiB at least): a new segment past it
/// first retires those nobody holds, their bytes back in the array, and never one a process
/// still holds.
#[test]
fn pages_nobody_holds_go_back_to_the_array_past_the_budget() {
    let dir = TempDir::new("budget");
    let img = dir.0.join("device.img").display().to_string();
    let d = Daemon::start_raw(&["--device", img.as_str(), "--size", "256M"], dir);
    let m = Moneta::connect(&d.socket).unwrap();
    const LEN: usize = 24 << 20;
    let mut inos = Vec::new();
    let mut held = Vec::new();
    for (i, name) in ["/held", "/let-go", "/new"].iter().enumerate() {
        let f = m.open(name, &rw()).unwrap();
        f.write_at(&pattern(40 + i as u8, 0, LEN), 0).unwrap();
        let (pages, _) = f.pages(true).unwrap();
        inos.push(f.ino());
        if i == 0 {
            // Its pages stay open in this process, as a mapping would keep them.
            held.push((f, pages));
        }
    }
    let has = |ino: u64| pages_dir(&d).join(ino.to_string()).exists();
    // The third segment would pass 64 MiB: the one nobody holds went back first.
    assert!(has(inos[0]), "a held segment was retired");
    assert!(!has(inos[1]), "a segment nobody holds outlived the budget");
    assert!(!pages_dir(&d).join(format!("{}.pieces", inos[1])).exists());
    assert!(has(inos[2]));
    // Its bytes are the file's, through the channel and through pages made anew.
    let g = m.open("/let-go", &rw()).unwrap();
    assert!(read_all(&g, LEN) == pattern(41, 0, LEN));
    let (pages, _) = g.pages(false).unwrap();
    let map = Mapped::new(&pages, LEN, libc::PROT_READ).unwrap();
    assert!(map.bytes() == &pattern(41, 0, LEN)[..]);
    drop(held);
}

#[test]
fn a_writer_that_shortens_the_pages_hurts_only_its_file() {
    let d = persistent(&[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/a", &rw()).unwrap();
    f.write_at(&pattern(9, 0, 16384), 0).unwrap();
    let other = m.open("/b", &rw()).unwrap();
    let theirs = pattern(10, 0, 16384);
    other.write_at(&theirs, 0).unwrap();
    let (pages, _) = f.pages(true).unwrap();
    // A hostile writer cuts the pages short; the daemon reads past their end.
    rustix::fs::ftruncate(&pages, 0).unwrap();
    let mut buf = vec![0u8; 16384];
    let r = f.read_at(&mut buf, 0);
    assert!(r.is_ok(), "{r:?}");
    assert!(buf.iter().all(|&b| b == 0), "the cut file reads as zeros");
    // The daemon lives on, and the other file is untouched.
    d.control().ping().unwrap();
    let mut buf = vec![0u8; 16384];
    other.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, theirs);
    // Its truncation retires the cut pages (reading them back as zeros), and the space it
    // frees goes to another file untouched by them.
    f.set_len(0).unwrap();
    let third = m.open("/c", &rw()).unwrap();
    let more = pattern(13, 0, 1 << 20);
    third.write_at(&more, 0).unwrap();
    rustix::fs::ftruncate(&pages, 1 << 20).unwrap();
    let map = Mapped::new(&pages, 16384, libc::PROT_READ | libc::PROT_WRITE).unwrap();
    map.store(0, b"into retired pages");
    let mut buf = vec![0u8; 1 << 20];
    third.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, more);
}

/// `n` reads of 4 KiB at scattered offsets of the first 16 KiB of `f`, each checked against
/// `data`, its contents.
fn reads_match(f: &libmoneta::File, data: &[u8], n: u64) {
    let mut buf = vec![0u8; 4096];
    for i in 0..n {
        let off = (i * 997) % 12288;
        assert_eq!(f.read_at(&mut buf, off).unwrap(), 4096);
        assert_eq!(buf, data[off as usize..off as usize + 4096]);
    }
}

#[test]
fn reads_and_writes_in_place_need_no_command() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/p", &rw()).unwrap();
    let data = pattern(11, 0, 16384);
    f.write_at(&data, 0).unwrap();
    f.set_in_place(true);
    let mut buf = vec![0u8; 4096];
    // The first access maps the pages (and goes through the channel).
    f.read_at(&mut buf, 0).unwrap();
    let ctl = d.control();
    let before = ctl.status().unwrap().commands;
    reads_match(&f, &data, 100);
    f.write_at(b"in place", 5000).unwrap();
    assert_eq!(
        ctl.status().unwrap().commands,
        before,
        "accesses in place sent commands"
    );
    // Another connection's channel sees the write, and the reader sees its writes.
    let m2 = Moneta::connect(&d.socket).unwrap();
    let g = m2.open("/p", &rw()).unwrap();
    let mut got = [0u8; 8];
    g.read_at(&mut got, 5000).unwrap();
    assert_eq!(&got, b"in place");
    g.write_at(b"from the channel", 100).unwrap();
    let mut got = [0u8; 16];
    f.read_at(&mut got, 100).unwrap();
    assert_eq!(&got, b"from the channel");

    // The other connection truncates and writes anew: the pages are retired, and the reader
    // in place never sees the old bytes nor stores into the old pages.
    g.set_len(0).unwrap();
    g.write_at(b"fresh", 0).unwrap();
    let mut big = vec![0u8; 4096];
    assert_eq!(
        f.read_at(&mut big, 0).unwrap(),
        5,
        "the read learned the new size"
    );
    assert_eq!(&big[..5], b"fresh");
    f.write_at(b"F", 0).unwrap();
    let mut got = [0u8; 5];
    g.read_at(&mut got, 0).unwrap();
    assert_eq!(&got, b"Fresh");
    // And it goes in place again, on the new pages.
    let before = ctl.status().unwrap().commands;
    for _ in 0..10 {
        f.read_at(&mut got, 0).unwrap();
        assert_eq!(&got, b"Fresh");
    }
    assert!(ctl.status().unwrap().commands <= before + 2);
}

#[test]
fn a_file_read_and_written_again_goes_in_place_by_itself() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    let ctl = d.control();
    let f = m.open("/db", &rw()).unwrap();
    let data = pattern(21, 0, 16384);
    f.write_at(&data, 0).unwrap();
    f.set_in_place_after(8);
    let mut buf = vec![0u8; 4096];
    // Seven reads inside the size: each a command, and still not in place.
    let before = ctl.status().unwrap().commands;
    for i in 0..7u64 {
        let off = i * 1000;
        f.read_at(&mut buf, off).unwrap();
        assert_eq!(buf, data[off as usize..off as usize + 4096]);
    }
    assert!(ctl.status().unwrap().commands >= before + 7);
    assert!(!f.in_place());
    // The eighth turns it on; the next maps the pages; from then on, no command.
    f.read_at(&mut buf, 0).unwrap();
    assert!(f.in_place());
    f.read_at(&mut buf, 0).unwrap();
    let before = ctl.status().unwrap().commands;
    reads_match(&f, &data, 100);
    f.write_at(b"in place by itself", 3000).unwrap();
    assert_eq!(
        ctl.status().unwrap().commands,
        before,
        "accesses in place sent commands"
    );
    let m2 = Moneta::connect(&d.socket).unwrap();
    let mut got = [0u8; 18];
    m2.open("/db", &rw())
        .unwrap()
        .read_at(&mut got, 3000)
        .unwrap();
    assert_eq!(&got, b"in place by itself");

    // A file written as it grows and removed, as a rollback journal is, never counts an
    // access inside its size: it stays on the channel, unmapped.
    let j = m.open("/db-journal", &rw()).unwrap();
    j.set_in_place_after(8);
    for i in 0..32u64 {
        j.write_at(&[i as u8; 512], i * 512).unwrap();
    }
    assert!(!j.in_place());
    drop(j);
    m.unlink("/db-journal").unwrap();

    // Chosen off, a file stays off.
    let g = m.open("/db", &rw()).unwrap();
    g.set_in_place_after(2);
    g.set_in_place(false);
    for _ in 0..8 {
        g.read_at(&mut buf, 0).unwrap();
    }
    assert!(!g.in_place());
}

#[test]
fn a_file_made_durable_again_and_again_goes_in_place_at_the_host_level() {
    let d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/wal", &rw()).unwrap();
    let mut data = pattern(23, 0, 64 << 10);
    f.write_at(&data, 0).unwrap();
    f.set_in_place_after_syncs(4);
    // Four fsyncs through the daemon (the writes meanwhile are posted: posted.rs checks
    // that): nothing is in place yet.
    for i in 0..4usize {
        assert!(!f.in_place(), "in place after {i} fsyncs");
        let at = i * 8192;
        data[at..at + 4096].fill(b'a' + i as u8);
        f.write_at(&data[at..at + 4096], at as u64).unwrap();
        f.sync_all().unwrap();
    }
    assert!(f.in_place());
    // The next access maps the pages (every posted write has landed in them); from then on
    // a write and its fsync ask the daemon nothing.
    let mut got = vec![0u8; data.len()];
    f.read_at(&mut got, 0).unwrap();
    assert_eq!(got, data);
    f.sync_all().unwrap();
    let calls = fs_calls_settled(&d);
    for i in 0..4u64 {
        f.write_at(b"in place and durable", 20000 + i * 100)
            .unwrap();
        f.sync_all().unwrap();
    }
    assert_eq!(
        fs_calls_settled(&d),
        calls,
        "an fsync in place called the daemon"
    );
    let g = Moneta::connect(&d.socket)
        .unwrap()
        .open("/wal", &ro())
        .unwrap();
    let mut got = [0u8; 20];
    g.read_at(&mut got, 20300).unwrap();
    assert_eq!(&got, b"in place and durable");

    // Made durable once and removed, a file never goes in place; nor does one at a level
    // where an fsync flushes nothing.
    let j = m.open("/journal", &rw()).unwrap();
    j.set_in_place_after_syncs(4);
    j.write_at(&[1; 4096], 0).unwrap();
    j.sync_all().unwrap();
    assert!(!j.in_place());
    drop(j);
    m.unlink("/journal").unwrap();
    let v = Daemon::start_fs("64M", &[]);
    let vm = Moneta::connect(&v.socket).unwrap();
    let h = vm.open("/db", &rw()).unwrap();
    h.set_in_place_after_syncs(2);
    for _ in 0..4 {
        h.write_at(&[2; 4096], 0).unwrap();
        h.sync_all().unwrap();
    }
    assert!(!h.in_place());
}

/// Writes and `fsync`s a file twelve times, with the library's settings left to the
/// environment: 0 if it went in place, 3 if not.
fn syncs(args: &[String]) -> i32 {
    let m = Moneta::connect(std::path::Path::new(&args[0])).unwrap();
    let f = m.open(&args[1], &rw()).unwrap();
    for i in 0..12u64 {
        f.write_at(&[i as u8 + 1; 4096], i * 4096).unwrap();
        f.sync_all().unwrap();
    }
    let mut got = vec![0u8; 12 * 4096];
    f.read_at(&mut got, 0).unwrap();
    assert!((0..12).all(|i| got[i * 4096..(i + 1) * 4096]
        .iter()
        .all(|&b| b == i as u8 + 1)));
    if f.in_place() {
        0
    } else {
        3
    }
}

/// At the `host` level a file goes in place by itself after eight `fsync`s unless the
/// environment says `MONETA_MODE=channel`; at the `device` level it never does.
#[test]
fn files_made_durable_again_and_again_go_in_place_by_default_at_the_host_level() {
    let host = persistent(&["--durability", "host"]);
    let device = persistent(&["--durability", "device"]);
    for (d, mode, want) in [
        (&host, None, 0),
        (&host, Some("channel"), 3),
        (&host, Some("sync"), 0),
        (&device, None, 3),
    ] {
        let mut c = std::process::Command::new(std::env::current_exe().unwrap());
        c.args(["--exact", "child_process_entry", "--nocapture"])
            .env("MONETA_TEST_ROLE", "syncs")
            .env(
                "MONETA_TEST_ARGS",
                [d.socket.display().to_string(), format!("/f-{mode:?}")].join("\u{1f}"),
            )
            .env_remove("MONETA_MODE")
            .stdin(std::process::Stdio::null());
        if let Some(mode) = mode {
            c.env("MONETA_MODE", mode);
        }
        let code = c.status().unwrap().code();
        assert_eq!(code, Some(want), "MONETA_MODE={mode:?}");
    }
}

#[test]
fn an_inode_number_given_to_a_new_file_brings_no_old_pages() {
    let d = Daemon::start_fs("64M", &[]);
    let m = Moneta::connect(&d.socket).unwrap();
    // An empty file, mapped (its pages kept open), then unlinked and closed: nothing of it
    // needs space, so nothing of it is revoked.
    let f = m.open("/old", &rw()).unwrap();
    let old_ino = f.ino();
    let (old_pages, _) = f.pages(true).unwrap();
    drop(f);
    m.unlink("/old").unwrap();
    // New files until one gets the old inode number.
    let mut new = None;
    for i in 0..64 {
        let g = m.open(format!("/new{i}"), &rw()).unwrap();
        if g.ino() == old_ino {
            new = Some(g);
            break;
        }
    }
    let g = new.expect("nvfs gives a freed inode number to a new file");
    let theirs = pattern(12, 0, 8192);
    g.write_at(&theirs, 0).unwrap();
    let (pages, _) = g.pages(true).unwrap();
    let fresh = Mapped::new(&pages, 8192, libc::PROT_READ | libc::PROT_WRITE).unwrap();
    assert_eq!(fresh.bytes(), &theirs[..]);
    // The new file has pages of its own; the old ones never grew to hold its bytes.
    let (old, now) = (
        rustix::fs::fstat(&old_pages).unwrap(),
        rustix::fs::fstat(&pages).unwrap(),
    );
    assert_ne!(
        old.st_ino, now.st_ino,
        "the new file got the old file's pages"
    );
    assert_eq!(
        old.st_size, 0,
        "the old file's pages grew with the new file"
    );
    // Growing it again (through the socket, as a mapped file does) changes nothing of that.
    g.write_at(&theirs, 8192).unwrap();
    assert_eq!(rustix::fs::fstat(&old_pages).unwrap().st_size, 0);
}

/// What the page cache holds of `f`'s pages that is dirty or under write-back, from the
/// kernel's `cachestat` (Linux 6.5); `None` on a kernel without it.
fn dirty_pages(f: &std::fs::File) -> Option<(u64, u64)> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        cache: u64,
        dirty: u64,
        writeback: u64,
        evicted: u64,
        recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451;
    let range = Range { off: 0, len: 0 };
    let mut st = Stat::default();
    // SAFETY: both structures live across the call, as the kernel's layout defines them.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            &range as *const Range,
            &mut st as *mut Stat,
            0,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSYS), "cachestat: {e}");
        eprintln!("NOTE: this kernel has no cachestat: the pages' write-back is not looked at");
        return None;
    }
    Some((st.dirty, st.writeback))
}

/// A file on a `host`-level daemon, written, mapped in place and made durable once.
fn in_place_at_host(d: &Daemon, m: &Moneta, path: &str) -> libmoneta::File {
    let f = m.open(path, &rw()).unwrap();
    f.write_at(&pattern(31, 0, 64 << 10), 0).unwrap();
    f.set_in_place(true);
    let mut buf = [0u8; 8];
    // The first access maps the pages; the mapping ends the file's size lease, a change the
    // next durability point keeps.
    f.read_at(&mut buf, 0).unwrap();
    f.write_at(b"in place", 100).unwrap();
    assert!(pages_dir(d).join(f.ino().to_string()).exists());
    f.sync_all().unwrap();
    f
}

#[test]
fn a_files_pages_reach_the_hosts_disk_before_their_list_names_them() {
    // A start after a crash of the machine folds every piece the list names back into the
    // array from the pages' file: pages not yet written back would bring zeros over the
    // file's bytes.
    let d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = m.open("/db", &rw()).unwrap();
    f.write_at(&pattern(5, 0, 256 << 10), 0).unwrap();
    f.sync_all().unwrap();
    let _pages = f.pages(false).unwrap();
    let dir = pages_dir(&d);
    let list = std::fs::read_to_string(dir.join(format!("{}.pieces", f.ino()))).unwrap();
    assert!(!list.is_empty(), "no piece listed");
    let seg = std::fs::File::open(dir.join(f.ino().to_string())).unwrap();
    if let Some(left) = dirty_pages(&seg) {
        assert_eq!(
            left,
            (0, 0),
            "pieces listed before their pages were written back"
        );
    }
}

#[test]
fn an_fsync_in_place_at_the_host_level_writes_the_pages_back_with_no_call() {
    let d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = in_place_at_host(&d, &m, "/db");
    let pages = std::fs::File::open(pages_dir(&d).join(f.ino().to_string())).unwrap();
    for round in 0..3u8 {
        f.write_at(&[b'a' + round; 4096], 8192 * u64::from(round))
            .unwrap();
        if let Some((dirty, _)) = dirty_pages(&pages) {
            assert!(dirty >= 1, "the store left no dirty page");
        }
        let calls = fs_calls_settled(&d);
        f.sync_all().unwrap();
        assert_eq!(
            fs_calls_settled(&d),
            calls,
            "an fsync with nothing but the file's pages to make durable called the daemon"
        );
        if let Some(left) = dirty_pages(&pages) {
            assert_eq!(left, (0, 0), "the fsync left pages to write back");
        }
    }
    // And the bytes are the file's, as every other reader sees them.
    let g = Moneta::connect(&d.socket)
        .unwrap()
        .open("/db", &ro())
        .unwrap();
    let mut got = [0u8; 4096];
    g.read_at(&mut got, 16384).unwrap();
    assert_eq!(got, [b'c'; 4096]);
}

#[test]
fn an_fsync_in_place_with_metadata_to_make_durable_asks_the_daemon() {
    let d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = in_place_at_host(&d, &m, "/db");

    // Another file made since the last durability point: the fsync must keep it too.
    m.open("/other", &rw()).unwrap();
    f.write_at(b"after a create", 0).unwrap();
    let calls = fs_calls_settled(&d);
    f.sync_all().unwrap();
    assert_eq!(
        fs_calls_settled(&d),
        calls + 1,
        "the fsync skipped a create"
    );
    // That point made everything durable: the next one needs no call.
    f.write_at(b"and again", 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(fs_calls_settled(&d), calls + 1);

    // Pages retired under the mapping (another process shortened the file): the daemon
    // holds the bytes in the array now, and makes them durable there.
    let g = Moneta::connect(&d.socket)
        .unwrap()
        .open("/db", &rw())
        .unwrap();
    g.set_len(4096).unwrap();
    let calls = fs_calls_settled(&d);
    f.sync_all().unwrap();
    assert_eq!(fs_calls_settled(&d), calls + 1, "an fsync of retired pages");
}

#[test]
fn only_the_host_level_hands_out_the_durability_page_and_nobody_writes_it() {
    use libmoneta::control::Control;
    use moneta_abi::control::{ReplyBody, Request};
    use moneta_abi::fsproto::{FsReply, FsRequest};
    use moneta_abi::{DurablePage, DURABLE_MAGIC, DURABLE_PAGE_SIZE, FS_DURABLE_PAGE};
    use std::sync::atomic::Ordering;

    let ask = |c: &Control| c.call(&Request::Fs(FsRequest::Durable));
    for volatile in [
        Daemon::start_fs("16M", &[]),
        persistent(&["--durability", "device"]),
    ] {
        let ch = volatile.channel();
        assert_eq!(
            ch.header().fs_flags.load(Ordering::Acquire) & FS_DURABLE_PAGE,
            0
        );
        assert_eq!(errno_of(ask(ch.control())), libc::EOPNOTSUPP);
    }

    let d = persistent(&["--durability", "host"]);
    let ch = d.channel();
    assert_ne!(
        ch.header().fs_flags.load(Ordering::Acquire) & FS_DURABLE_PAGE,
        0
    );
    let (body, mut fds) = ask(ch.control()).unwrap();
    assert!(matches!(body, ReplyBody::Fs(FsReply::Empty)));
    assert_eq!(fds.len(), 1);
    let fd = fds.pop().unwrap();
    assert_eq!(
        Mapped::new(&fd, DURABLE_PAGE_SIZE, libc::PROT_READ | libc::PROT_WRITE).err(),
        Some(libc::EACCES),
        "a writable mapping of the durability page"
    );
    let map = Mapped::new(&fd, DURABLE_PAGE_SIZE, libc::PROT_READ).unwrap();
    // SAFETY: a page-aligned mapping of the page, read through atomics only.
    let page = unsafe { &*map.p.cast::<DurablePage>() };
    assert_eq!(page.magic.load(Ordering::SeqCst), DURABLE_MAGIC);

    // A change is committed before its call returns, durable after an fsync.
    let m = Moneta::connect(&d.socket).unwrap();
    let before = page.committed.load(Ordering::SeqCst);
    m.mkdir("/dir", 0o755).unwrap();
    let committed = page.committed.load(Ordering::SeqCst);
    assert!(committed > before, "a mkdir committed nothing");
    assert!(page.durable.load(Ordering::SeqCst) < committed);
    let f = m.open("/f", &rw()).unwrap();
    f.sync_all().unwrap();
    assert!(page.durable.load(Ordering::SeqCst) >= committed);
    assert!(page.durable.load(Ordering::SeqCst) <= page.committed.load(Ordering::SeqCst));
}

#[test]
fn a_directorys_fsync_asks_the_daemon_only_for_changes_not_yet_durable() {
    let d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    m.mkdir("/dir", 0o755).unwrap();
    let dir = m.open("/dir", &ro()).unwrap();
    assert!(dir.is_dir());
    // The mkdir is not durable yet: the daemon makes it so.
    let calls = fs_calls_settled(&d);
    dir.sync_all().unwrap();
    assert_eq!(
        fs_calls_settled(&d),
        calls + 1,
        "the mkdir was left to chance"
    );
    // Nothing changed since: a directory has no data of its own, and nothing is asked.
    dir.sync_all().unwrap();
    dir.sync_data().unwrap();
    assert_eq!(fs_calls_settled(&d), calls + 1);
    // A name made in it: the daemon again.
    m.open("/dir/name", &rw()).unwrap();
    let calls = fs_calls_settled(&d);
    dir.sync_all().unwrap();
    assert_eq!(
        fs_calls_settled(&d),
        calls + 1,
        "a create was left to chance"
    );
}

#[test]
fn freeing_a_removed_file_leaves_a_directorys_fsync_nothing_to_ask() {
    use moneta_abi::control::Request;
    use moneta_abi::fsproto::FsRequest;
    use moneta_abi::{DurablePage, DURABLE_PAGE_SIZE};
    use std::sync::atomic::Ordering::SeqCst;

    let d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let ch = d.channel();
    let (_, mut fds) = ch.control().call(&Request::Fs(FsRequest::Durable)).unwrap();
    let map = Mapped::new(&fds.pop().unwrap(), DURABLE_PAGE_SIZE, libc::PROT_READ).unwrap();
    // SAFETY: a page-aligned mapping of the page, read through atomics only.
    let page = unsafe { &*map.p.cast::<DurablePage>() };
    m.mkdir("/dir", 0o755).unwrap();
    let other = m.open("/other", &rw()).unwrap();
    let dir = m.open("/dir", &ro()).unwrap();

    // A rollback journal's life: made, written, made durable, closed and removed. The
    // removal is a change of the directory, which its fsync makes durable. Its space is freed
    // a moment later, in a transaction of its own, when the poller made the removal; when the
    // file-system lock was busy (the releaser zeroing free space ahead, at this level with a
    // flush) a worker made it, freeing the space in the removal's own transaction. So the
    // journal lives again until one removal was the poller's: each round checks what holds
    // either way.
    let mut deferred = 0;
    for round in 0..20 {
        let name = format!("/dir/journal{round}");
        let j = m.open(&name, &rw()).unwrap();
        j.write_at(&pattern(7, 0, 64 << 10), 0).unwrap();
        j.sync_all().unwrap();
        // Closed for good before the removal (a close posted could come after it, and free
        // the file later than this test looks).
        j.close().unwrap();
        m.unlink(&name).unwrap();
        dir.sync_all().unwrap();
        let shown = page.committed.load(SeqCst);
        assert!(page.durable.load(SeqCst) >= shown);

        // A call on the control socket frees whatever is still waiting. A crash that lost
        // the free would leave an orphan the next mount frees, so the page does not count it
        // as a change to wait for...
        ch.control().call(&Request::Fs(FsRequest::Statfs)).unwrap();
        assert_eq!(
            page.committed.load(SeqCst),
            shown,
            "the free was shown as a change to make durable"
        );
        let calls = fs_calls_settled(&d);
        dir.sync_all().unwrap();
        assert_eq!(
            fs_calls_settled(&d),
            calls,
            "a directory's fsync asked for the free of a removed file"
        );
        // ...and it is a transaction all the same, which the next durability point makes
        // durable (or the directory's fsync above, if the free came before it).
        let before = page.durable.load(SeqCst);
        other.sync_all().unwrap();
        assert_eq!(page.committed.load(SeqCst), shown);
        assert!(page.durable.load(SeqCst) >= shown);
        if before > shown || page.durable.load(SeqCst) > shown {
            deferred += 1;
            break;
        }
    }
    assert_eq!(
        deferred, 1,
        "no removed file's space was freed in a transaction of its own"
    );
}

#[test]
fn an_fsync_in_place_after_the_daemon_died_fails() {
    let mut d = persistent(&["--durability", "host"]);
    let m = Moneta::connect(&d.socket).unwrap();
    let f = in_place_at_host(&d, &m, "/db");
    f.write_at(b"before", 0).unwrap();
    f.sync_all().unwrap();
    f.write_at(b"after the kill", 0).unwrap();
    d.kill9();
    // The pages still take the store, and their write-back works, but a daemon started
    // meanwhile may have folded them back into the array and removed them: a store there
    // reaches nothing, and the call must not call it durable.
    f.write_at(b"after the kill", 0).unwrap();
    assert_eq!(errno_of(f.sync_all()), libc::EIO);
}
