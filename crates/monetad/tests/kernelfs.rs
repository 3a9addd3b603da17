//! ext4 and XFS on the array (`monetad --kernel-fs`): files opened through the kernel, read and
//! written through channels at the addresses of their extent maps, checked byte for byte
//! against the kernel's view; a truncate and a reuse of the freed blocks racing a channel
//! reader (no bytes of the other file reach it); preallocated, reflinked and hole extents;
//! forged and misdirected requests; and a clean `e2fsck -fn` / `xfs_repair -n` afterwards.
//! Needs root (a loop device and a mount); CI runs it as root.

mod common;

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Daemon, TempDir};
use libmoneta::{Channel, ClientError, KernelFile};
use moneta_abi::control::{ReplyBody, Request};
use moneta_abi::kfsproto::{kind, KfsReply, KfsRequest};
use moneta_abi::{Completion, Status};

/// Whether the test can run; without root it says why (and fails under CI, which must run it).
fn root() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "the kernel file system tests need root, and CI must run them"
    );
    eprintln!("SKIPPED: --kernel-fs needs root (a loop device and a mount)");
    false
}

/// A daemon serving a kernel file system on a persistent array; stopped cleanly on drop (its
/// mount goes with it).
struct Kfs {
    daemon: Daemon,
    mount: PathBuf,
    image: PathBuf,
    kind: &'static str,
}

impl Kfs {
    fn start(kind: &'static str) -> Kfs {
        let dir = TempDir::new(&format!("kfs-{kind}"));
        let mount = dir.0.join("mnt");
        let image = dir.0.join("array.img");
        let args = [
            "--device",
            image.to_str().unwrap(),
            "--size",
            "320M",
            "--kernel-fs",
            kind,
            "--kernel-fs-mount",
            mount.to_str().unwrap(),
        ];
        let daemon = Daemon::start_raw(&args, dir);
        // The socket answers once the server runs, which is after the mount.
        daemon.control().ping().expect("the daemon answers");
        assert!(
            mounted(&mount),
            "the daemon is ready and has not mounted its file system"
        );
        Kfs {
            daemon,
            mount,
            image,
            kind,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    fn channel(&self) -> Arc<Channel> {
        Arc::new(self.daemon.channel())
    }

    /// Stops the daemon and checks the file system on the image.
    fn stop_and_check(mut self) {
        self.stop();
        let out = match self.kind {
            "ext4" => Command::new("e2fsck").arg("-fn").arg(&self.image).output(),
            _ => Command::new("xfs_repair")
                .args(["-n", "-f"])
                .arg(&self.image)
                .output(),
        }
        .expect("run the checker");
        assert!(
            out.status.success(),
            "{} check of the array: {}{}",
            self.kind,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn stop(&mut self) {
        if self.daemon.child.is_none() {
            return;
        }
        let _ = self.daemon.control().shutdown();
        assert!(
            self.daemon.wait_exit(Duration::from_secs(30)).is_some(),
            "the daemon did not stop"
        );
        assert!(!mounted(&self.mount), "the daemon left its mount behind");
    }
}

impl Drop for Kfs {
    fn drop(&mut self) {
        if self.daemon.child.is_some() {
            let _ = self.daemon.control().shutdown();
            let _ = self.daemon.wait_exit(Duration::from_secs(30));
        }
        if mounted(&self.mount) {
            let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        }
    }
}

fn mounted(dir: &Path) -> bool {
    let dir = dir.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(dir))
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn write_through_kernel(path: &Path, data: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

fn bytes_moved(k: &Kfs) -> (u64, u64) {
    let s = k.daemon.control().status().unwrap();
    (s.bytes_read, s.bytes_written)
}

fn reads_and_writes_match_the_kernel(fs: &'static str) {
    let k = Kfs::start(fs);
    // The daemon says what it serves and where.
    let (body, _) = k
        .daemon
        .control()
        .call(&Request::Kfs(KfsRequest::Info))
        .unwrap();
    let ReplyBody::Kfs(KfsReply::Info { kind, mount }) = body else {
        panic!("KFS_INFO answered {body:?}")
    };
    let want = if fs == "xfs" {
        moneta_abi::kfsproto::FS_XFS
    } else {
        moneta_abi::kfsproto::FS_EXT4
    };
    assert_eq!(kind, want);
    assert_eq!(
        Path::new(std::ffi::OsStr::new(std::str::from_utf8(&mount).unwrap())),
        std::fs::canonicalize(&k.mount).unwrap()
    );
    let ch = k.channel();
    let p = k.path("data");
    let mut expect = pattern(1, 3 << 20);
    write_through_kernel(&p, &expect);

    let f = KernelFile::open(&ch, &p, true).unwrap();
    let (r0, w0) = bytes_moved(&k);
    let mut got = vec![0u8; expect.len()];
    assert_eq!(f.read_at(&mut got, 0).unwrap(), expect.len());
    assert!(
        got == expect,
        "a channel read differs from the kernel's bytes"
    );
    // Writes inside the file, at odd offsets and lengths.
    for (i, (off, len)) in [
        (0usize, 512usize),
        (4093, 10_000),
        (1 << 20, 65_536),
        (3_000_000, 145_728),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(10 + i as u8, len);
        f.write_at(&data, off as u64).unwrap();
        expect[off..off + len].copy_from_slice(&data);
    }
    // A read of the last bytes and past the end.
    let mut tail = vec![0u8; 8192];
    let n = f.read_at(&mut tail, expect.len() as u64 - 100).unwrap();
    assert_eq!(n, 100);
    assert_eq!(&tail[..100], &expect[expect.len() - 100..]);
    let (r1, w1) = bytes_moved(&k);
    assert!(
        r1 - r0 >= expect.len() as u64 && w1 - w0 >= 220_000,
        "the bytes did not go through the channel: read {} written {}",
        r1 - r0,
        w1 - w0
    );
    // Appending: the daemon allocates, the channel writes.
    let more = pattern(30, 200_000);
    f.write_at(&more, expect.len() as u64).unwrap();
    expect.extend_from_slice(&more);
    assert_eq!(f.len().unwrap(), expect.len() as u64);
    f.sync().unwrap();
    drop(f);
    // The kernel's view, byte for byte.
    assert!(
        std::fs::read(&p).unwrap() == expect,
        "the kernel reads other bytes than the channel wrote"
    );
    // And the other way: the kernel writes, the channel reads.
    let mut kf = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    use std::io::{Seek, SeekFrom};
    kf.seek(SeekFrom::Start(777)).unwrap();
    kf.write_all(b"written by the kernel").unwrap();
    drop(kf);
    expect[777..777 + 21].copy_from_slice(b"written by the kernel");
    let f = KernelFile::open(&ch, &p, false).unwrap();
    let mut got = vec![0u8; expect.len() + 10];
    assert_eq!(f.read_at(&mut got, 0).unwrap(), expect.len());
    assert!(got[..expect.len()] == expect[..]);
    drop(f);
    drop(ch);
    k.stop_and_check();
}

#[test]
fn ext4_reads_and_writes_match_the_kernel() {
    if root() {
        reads_and_writes_match_the_kernel("ext4");
    }
}

#[test]
fn xfs_reads_and_writes_match_the_kernel() {
    if root() {
        reads_and_writes_match_the_kernel("xfs");
    }
}

/// A reader through the channel while the kernel truncates the file and gives its blocks to
/// another: the reader sees the old bytes, the new ones or the end of the file, never the
/// other file's bytes.
/// How the kernel frees the file's blocks under the reader.
#[derive(Clone, Copy)]
enum Free {
    Truncate,
    /// `fallocate(PUNCH_HOLE)`: the file keeps its size, its blocks go.
    Punch,
}

fn truncate_races_a_reader(fs: &'static str, free: Free) {
    let k = Kfs::start(fs);
    let p = k.path("victim");
    let len = 4 << 20;
    write_through_kernel(&p, &vec![b'A'; len]);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let ch = k.channel();
        let p = p.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let f = KernelFile::open(&ch, &p, false).unwrap();
            let mut buf = vec![0u8; 256 << 10];
            let mut reads = 0u64;
            let mut off = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let n = f.read_at(&mut buf, off).unwrap();
                if let Some(b) = buf[..n].iter().find(|b| !matches!(b, b'A' | b'B' | 0)) {
                    panic!("the reader saw a byte of another file: {b:#x} at {off}");
                }
                reads += 1;
                off = (off + (256 << 10)) % len as u64;
            }
            reads
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    for round in 0..5 {
        // The kernel frees the blocks (the lease breaks first: records revoked) and another
        // file takes them.
        let v = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        match free {
            Free::Truncate => v.set_len(0).unwrap(),
            Free::Punch => {
                use std::os::fd::AsRawFd;
                // SAFETY: a plain system call on our descriptor.
                let r = unsafe {
                    libc::fallocate(
                        v.as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        0,
                        len as i64,
                    )
                };
                assert_eq!(r, 0, "punch: {}", std::io::Error::last_os_error());
            }
        }
        drop(v);
        let other = k.path(&format!("other{round}"));
        write_through_kernel(&other, &vec![b'C'; len]);
        std::fs::remove_file(&other).unwrap();
        write_through_kernel(&p, &vec![b'B'; len]);
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let reads = reader.join().expect("the reader saw wrong bytes");
    assert!(reads > 10, "the reader made only {reads} reads");
    let (read, _) = bytes_moved(&k);
    assert!(
        read >= 4 << 20,
        "the reader's bytes did not come through the channel ({read} bytes did)"
    );
    k.stop_and_check();
}

#[test]
fn ext4_truncate_races_a_reader() {
    if root() {
        truncate_races_a_reader("ext4", Free::Truncate);
    }
}

#[test]
fn xfs_truncate_races_a_reader() {
    if root() {
        truncate_races_a_reader("xfs", Free::Truncate);
    }
}

#[test]
fn ext4_hole_punch_races_a_reader() {
    if root() {
        truncate_races_a_reader("ext4", Free::Punch);
    }
}

#[test]
fn xfs_hole_punch_races_a_reader() {
    if root() {
        truncate_races_a_reader("xfs", Free::Punch);
    }
}

fn kfs_call(ch: &Channel, req: KfsRequest) -> Result<KfsReply, ClientError> {
    match ch.control().call(&Request::Kfs(req))?.0 {
        ReplyBody::Kfs(r) => Ok(r),
        other => panic!("unexpected reply {other:?}"),
    }
}

fn errno_of(r: Result<KfsReply, ClientError>) -> i32 {
    match r {
        Err(ClientError::Refused { errno, .. }) => errno,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Revoked records stop working; a read-only open gets read-only records; another
/// connection's handle, a descriptor from elsewhere, an `O_PATH` one and none at all are
/// refused.
#[test]
fn records_follow_the_kernel_and_forgeries_fail() {
    if !root() {
        return;
    }
    let k = Kfs::start("ext4");
    let p = k.path("f");
    write_through_kernel(&p, &pattern(3, 1 << 20));
    let ch = k.channel();
    let fd = std::fs::File::open(&p).unwrap();
    let (body, _) = ch
        .control()
        .call_passing(&Request::Kfs(KfsRequest::Open), &[fd.as_fd()])
        .unwrap();
    drop(fd);
    let ReplyBody::Kfs(KfsReply::Opened {
        handle,
        size,
        rights,
    }) = body
    else {
        panic!("{body:?}")
    };
    assert_eq!(
        (size, rights),
        (1 << 20, 1),
        "a read-only open gives read rights"
    );
    let KfsReply::Map(m) = kfs_call(
        &ch,
        KfsRequest::Map {
            handle,
            offset: 0,
            len: 1 << 20,
        },
    )
    .unwrap() else {
        panic!()
    };
    let e = m.extents[0];
    assert_eq!((e.kind, e.logical), (kind::CHANNEL, 0));
    let mut buf = vec![0u8; 4096];
    ch.read(e.physical, &mut buf, Completion::Dma).unwrap();
    assert_eq!(buf, pattern(3, 4096));
    // Read-only records refuse writes.
    assert!(matches!(
        ch.write(e.physical, &buf, Completion::Dma),
        Err(ClientError::Status(Status::PermissionDenied))
    ));
    // Allocating needs write rights.
    assert_eq!(
        errno_of(kfs_call(
            &ch,
            KfsRequest::Allocate {
                handle,
                offset: 0,
                len: 10
            }
        )),
        libc::EBADF
    );
    // Another connection cannot use the handle.
    let other = k.channel();
    assert_eq!(
        errno_of(kfs_call(
            &other,
            KfsRequest::Map {
                handle,
                offset: 0,
                len: 10
            }
        )),
        libc::EBADF
    );
    // A kernel open elsewhere revokes the records before it returns.
    let kernel = std::fs::File::open(&p).unwrap();
    assert!(matches!(
        ch.read(e.physical, &mut buf, Completion::Dma),
        Err(ClientError::Status(Status::PermissionMiss))
    ));
    // While it is open, the daemon tells the client to use the kernel.
    assert_eq!(
        errno_of(kfs_call(
            &ch,
            KfsRequest::Map {
                handle,
                offset: 0,
                len: 10
            }
        )),
        libc::EAGAIN
    );
    drop(kernel);
    assert!(matches!(
        kfs_call(
            &ch,
            KfsRequest::Map {
                handle,
                offset: 0,
                len: 10
            }
        ),
        Ok(KfsReply::Map(_))
    ));
    // Descriptors that are not a file of the mount, an O_PATH one, none.
    let outside = std::fs::File::open("/etc/hostname").unwrap();
    let r = ch
        .control()
        .call_passing(&Request::Kfs(KfsRequest::Open), &[outside.as_fd()]);
    assert!(matches!(r, Err(ClientError::Refused { errno, .. }) if errno == libc::EXDEV));
    let opath = rustix::fs::open(
        &p,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let r = ch
        .control()
        .call_passing(&Request::Kfs(KfsRequest::Open), &[opath.as_fd()]);
    assert!(matches!(r, Err(ClientError::Refused { errno, .. }) if errno == libc::EBADF));
    assert_eq!(errno_of(kfs_call(&ch, KfsRequest::Open)), libc::EINVAL);
    // (A descriptor of a file keeps the mount busy, as any open file does.)
    drop((opath, outside));
    // Closing the handle removes the channel's records.
    kfs_call(&ch, KfsRequest::Close { handle }).unwrap();
    assert!(matches!(
        ch.read(e.physical, &mut buf, Completion::Dma),
        Err(ClientError::Status(Status::PermissionMiss))
    ));
    drop((ch, other));
    k.stop_and_check();
}

/// Holes and preallocated extents read as zeros and become written extents when written;
/// on XFS a reflinked copy's shared extents are written through the kernel, which copies
/// them, so the original keeps its bytes.
fn holes_preallocation_and_shared(fs: &'static str) {
    let k = Kfs::start(fs);
    let ch = k.channel();
    let p = k.path("sparse");
    {
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(8 << 20).unwrap();
        // Preallocated (unwritten) in the middle.
        rustix::fs::fallocate(&f, rustix::fs::FallocateFlags::KEEP_SIZE, 2 << 20, 1 << 20).unwrap();
    }
    let f = KernelFile::open(&ch, &p, true).unwrap();
    let mut buf = vec![1u8; 8 << 20];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), 8 << 20);
    assert!(
        buf.iter().all(|b| *b == 0),
        "holes and preallocation read as zeros"
    );
    let a = pattern(40, 300_000);
    let b = pattern(41, 300_000);
    f.write_at(&a, 100_000).unwrap(); // a hole
    f.write_at(&b, (2 << 20) + 5000).unwrap(); // preallocated
    drop(f);
    let all = std::fs::read(&p).unwrap();
    assert_eq!(all.len(), 8 << 20);
    assert!(all[100_000..400_000] == a[..]);
    assert!(all[(2 << 20) + 5000..(2 << 20) + 305_000] == b[..]);
    assert!(all[..100_000].iter().all(|x| *x == 0));

    if fs == "xfs" {
        let orig = k.path("orig");
        let copy = k.path("copy");
        let data = pattern(50, 1 << 20);
        write_through_kernel(&orig, &data);
        let st = Command::new("cp")
            .arg("--reflink=always")
            .arg(&orig)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(st.success(), "cp --reflink=always on XFS");
        let f = KernelFile::open(&ch, &copy, true).unwrap();
        let mut got = vec![0u8; 1 << 20];
        f.read_at(&mut got, 0).unwrap();
        assert!(got == data);
        let new = pattern(51, 8192);
        f.write_at(&new, 4096).unwrap();
        drop(f);
        let c = std::fs::read(&copy).unwrap();
        assert!(c[4096..4096 + 8192] == new[..]);
        assert!(
            std::fs::read(&orig).unwrap() == data,
            "a write to a reflinked copy changed the original"
        );
    }
    drop(ch);
    k.stop_and_check();
}

#[test]
fn ext4_holes_and_preallocation() {
    if root() {
        holes_preallocation_and_shared("ext4");
    }
}

#[test]
fn xfs_holes_preallocation_and_reflinks() {
    if root() {
        holes_preallocation_and_shared("xfs");
    }
}

/// A daemon restarted on the same array mounts the file system it made, without formatting
/// it again; an array holding something else is refused.
#[test]
fn restart_keeps_the_file_system_and_refuses_others() {
    if !root() {
        return;
    }
    let mut k = Kfs::start("ext4");
    write_through_kernel(&k.path("kept"), b"still here");
    k.stop();
    k.daemon.spawn();
    k.daemon.control().ping().unwrap();
    assert_eq!(std::fs::read(k.path("kept")).unwrap(), b"still here");
    k.stop();
    // The same array as XFS: refused, and left as it was.
    let out = Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--device", k.image.to_str().unwrap(), "--kernel-fs", "xfs"])
        .arg("--kernel-fs-mount")
        .arg(&k.mount)
        .arg("--socket")
        .arg(k.daemon.dir.0.join("other.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refusing to format"), "{err}");
    k.stop_and_check();
}

/// A reader's handle leaves a program runnable (the daemon's description of a file no handle
/// may write is read-only); a writer's handle then upgrades it, and both see the same bytes.
#[test]
fn a_reader_cannot_keep_a_program_from_running() {
    if !root() {
        return;
    }
    let k = Kfs::start("ext4");
    let p = k.path("prog.sh");
    write_through_kernel(&p, b"#!/bin/sh\necho ran\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    let ch = k.channel();
    let r = KernelFile::open(&ch, &p, false).unwrap();
    let mut buf = [0u8; 9];
    assert_eq!(r.read_at(&mut buf, 0).unwrap(), 9);
    assert_eq!(&buf, b"#!/bin/sh");
    let out = Command::new(&p).output().expect("run the program");
    assert_eq!(
        out.stdout,
        b"ran\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A writer: the daemon's description becomes writable, the reader reads what it wrote.
    let w = KernelFile::open(&ch, &p, true).unwrap();
    w.write_at(b"echo RAN\n", 10).unwrap();
    let mut got = [0u8; 9];
    assert_eq!(r.read_at(&mut got, 10).unwrap(), 9);
    assert_eq!(&got, b"echo RAN\n");
    drop((r, w, ch));
    assert_eq!(std::fs::read(&p).unwrap(), b"#!/bin/sh\necho RAN\n");
    k.stop_and_check();
}

/// A daemon killed with SIGKILL leaves its file system mounted, and the mount holds the array
/// (no daemon could start on it). The next start takes the stale mount back, unless a program
/// still uses it: then it says so and leaves the mount as it is.
#[test]
fn a_killed_daemons_mount_is_taken_back() {
    if !root() {
        return;
    }
    let mut k = Kfs::start("ext4");
    write_through_kernel(&k.path("kept"), b"still here");
    k.daemon.kill9();
    assert!(
        mounted(&k.mount),
        "the killed daemon's mount is gone already"
    );
    // A program holds a file there: the start is refused with the reason.
    let holder = std::fs::File::open(k.path("kept")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_monetad"))
        .args(["--device", k.image.to_str().unwrap(), "--kernel-fs", "ext4"])
        .arg("--kernel-fs-mount")
        .arg(&k.mount)
        .arg("--socket")
        .arg(k.daemon.dir.0.join("again.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "started over a busy stale mount");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("by a daemon that was killed, and in use"),
        "{err}"
    );
    assert!(mounted(&k.mount));
    assert_eq!(std::fs::read(k.path("kept")).unwrap(), b"still here");
    // Once it is closed, the daemon starts, taking the mount back.
    drop(holder);
    k.daemon.spawn();
    k.daemon.control().ping().unwrap();
    assert_eq!(std::fs::read(k.path("kept")).unwrap(), b"still here");
    k.stop_and_check();
}
