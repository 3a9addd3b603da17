//! Helpers for tests that run real `monetad` processes and real client processes.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use libmoneta::{Channel, Control};
use moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};

/// A private directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "moneta-test-{tag}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `monetad` process, killed on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub dir: TempDir,
    pub args: Vec<String>,
}

impl Daemon {
    /// Starts a daemon on a volatile 64 MiB raw array (no file system) with extra `args`.
    pub fn start(args: &[&str]) -> Daemon {
        let mut all = vec!["--volatile", "--size", "64M", "--raw"];
        all.extend_from_slice(args);
        Self::start_raw(&all, TempDir::new("d"))
    }

    /// Starts a daemon serving a fresh file system on a volatile array of `size`.
    pub fn start_fs(size: &str, args: &[&str]) -> Daemon {
        let mut all = vec!["--volatile", "--size", size];
        all.extend_from_slice(args);
        Self::start_raw(&all, TempDir::new("fs"))
    }

    /// Starts a daemon with exactly `args` (plus --socket) in `dir`.
    pub fn start_raw(args: &[&str], dir: TempDir) -> Daemon {
        let socket = dir.0.join("monetad.sock");
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut d = Daemon {
            child: None,
            socket,
            dir,
            args,
        };
        d.spawn();
        d
    }

    /// (Re)starts the process with the same arguments.
    pub fn spawn(&mut self) {
        let child = Command::new(env!("CARGO_BIN_EXE_monetad"))
            .args(&self.args)
            .arg("--socket")
            .arg(&self.socket)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn monetad");
        self.child = Some(child);
        wait_for_socket(&self.socket, self.child.as_mut().unwrap());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn control(&self) -> Control {
        Control::connect(&self.socket).expect("connect")
    }

    pub fn channel(&self) -> Channel {
        Channel::open(&self.socket).expect("open channel")
    }

    /// Kills with SIGKILL and reaps.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let c = self.child.as_mut()?;
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Some(s) = c.try_wait().unwrap() {
                self.child = None;
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// The daemon's CPU time (user + system) in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        cpu_ticks(self.pid())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

pub fn wait_for_socket(socket: &Path, child: &mut Child) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20) {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("monetad exited early: {s}");
        }
        if Control::connect(socket).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("monetad did not come up at {}", socket.display());
}

pub fn grant(ctl: &Control, channel: u32, start: u64, len: u64, rw: bool, file: u64) {
    ctl.grant(Grant {
        channel,
        rights: if rw {
            RIGHT_READ | RIGHT_WRITE
        } else {
            RIGHT_READ
        },
        start,
        len,
        file,
    })
    .expect("grant");
}

/// Re-runs this test binary as a separate process playing `role` (see [`child_role`]).
pub fn spawn_role(role: &str, args: &[String]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("MONETA_TEST_ROLE", role)
        .env("MONETA_TEST_ARGS", args.join("\u{1f}"))
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn child role")
}

/// In a child started by [`spawn_role`]: its role and arguments.
pub fn child_role() -> Option<(String, Vec<String>)> {
    let role = std::env::var("MONETA_TEST_ROLE").ok()?;
    let args = std::env::var("MONETA_TEST_ARGS").unwrap_or_default();
    Some((role, args.split('\u{1f}').map(String::from).collect()))
}

/// A deterministic byte pattern for address `addr` under `seed`.
pub fn pattern(seed: u8, addr: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let a = addr + i;
            (a as u8) ^ ((a >> 8) as u8).wrapping_mul(31) ^ seed
        })
        .collect()
}

/// Raises this process's open-file soft limit to the hard limit.
pub fn raise_nofile() {
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        },
    );
}

/// Whether this process may change its uid. In CI (`CI=true`) tests that need it must not be
/// skipped, so this panics there instead of returning false.
pub fn can_setuid(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} needs root, and CI must run it");
    }
    eprintln!("SKIPPED {test}: needs root to run a client as another user");
    false
}

/// A copy of the executable `exe` that other users can run (the build directory may not be
/// reachable by them), made once per process and executable: copying over a running copy
/// would fail with `ETXTBSY`.
pub fn reachable_copy(exe: &Path) -> PathBuf {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static COPIES: Mutex<Option<HashMap<PathBuf, PathBuf>>> = Mutex::new(None);
    let mut copies = COPIES.lock().unwrap();
    let copies = copies.get_or_insert_with(HashMap::new);
    if let Some(c) = copies.get(exe) {
        return c.clone();
    }
    let copy = std::env::temp_dir().join(format!(
        "moneta-role-{}-{}",
        std::process::id(),
        exe.file_name().unwrap().to_string_lossy()
    ));
    std::fs::copy(exe, &copy).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    copies.insert(exe.to_owned(), copy.clone());
    copy
}

/// Re-runs this test binary as `uid` in `role` (see `child_role`).
pub fn spawn_role_as(uid: u32, role: &str, args: &[String]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let copy = reachable_copy(&std::env::current_exe().unwrap());
    let child = std::process::Command::new(&copy)
        .args(["--exact", "child_process_entry", "--nocapture"])
        .env("MONETA_TEST_ROLE", role)
        .env("MONETA_TEST_ARGS", args.join("\u{1f}"))
        .uid(uid)
        .gid(uid)
        .spawn()
        .unwrap();
    child
}

/// Writes `data` at `off` of an open file: allocates through the control connection, then
/// stores through the channel, piece by piece over the extents.
pub fn file_write(
    ch: &Channel,
    handle: u64,
    off: u64,
    data: &[u8],
) -> Result<(), libmoneta::ClientError> {
    let (_, ext) = ch.control().fs_extend(handle, off, data.len() as u64)?;
    let mut done = 0usize;
    while done < data.len() {
        let at = off + done as u64;
        let x = ext
            .iter()
            .find(|x| x.file_off <= at && at < x.file_off + x.len)
            .expect("extend maps the whole range");
        assert_ne!(x.dev, moneta_abi::fsproto::HOLE);
        let n = ((x.file_off + x.len - at) as usize).min(data.len() - done);
        ch.write(
            x.dev + (at - x.file_off),
            &data[done..done + n],
            moneta_abi::Completion::Dma,
        )?;
        done += n;
    }
    Ok(())
}

/// Reads a whole open file through the channel (holes read as zeros).
pub fn file_read(ch: &Channel, handle: u64) -> Result<Vec<u8>, libmoneta::ClientError> {
    let (size, ext) = ch.control().fs_lookup(handle, 0, u64::MAX)?;
    let mut out = vec![0u8; size as usize];
    for x in ext {
        if x.dev == moneta_abi::fsproto::HOLE || x.file_off >= size {
            continue;
        }
        let n = x.len.min(size - x.file_off) as usize;
        let at = x.file_off as usize;
        ch.read(x.dev, &mut out[at..at + n], moneta_abi::Completion::Dma)?;
    }
    Ok(out)
}

/// Serializes the tests of one binary that must not overlap (a fork copies every open file
/// of the process; a count is one number for the whole process).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Open for reading and writing, created if missing.
pub fn rw() -> libmoneta::OpenOptions {
    let mut o = libmoneta::OpenOptions::new();
    o.read(true).write(true).create(true);
    o
}

/// A non-waiting lock set; the errno on failure.
pub fn set(
    f: &libmoneta::File,
    kind: libmoneta::LockKind,
    ty: libmoneta::LockType,
    start: u64,
    len: u64,
) -> Result<(), i32> {
    f.lock(kind, libmoneta::LockCmd::Set, ty, start, len, false)
        .map(|r| assert_eq!(r, None))
        .map_err(|e| e.errno())
}

/// A connection's channel memory mapped again, as another writer of it (a hostile thread of
/// the same process) would map it; unmapped on drop.
pub struct ChannelMap {
    ptr: *mut u8,
    len: usize,
}

impl ChannelMap {
    pub fn of(m: &libmoneta::Moneta) -> ChannelMap {
        ChannelMap::of_channel(m.channel())
    }

    /// [`ChannelMap::of`] a channel opened by itself.
    pub fn of_channel(ch: &Channel) -> ChannelMap {
        let fd = ch.memfd();
        let len = rustix::fs::fstat(fd).unwrap().st_size as usize;
        // SAFETY: a fresh shared mapping of the channel's memfd, unmapped on drop.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::SHARED,
                fd,
                0,
            )
            .unwrap()
        };
        ChannelMap {
            ptr: ptr.cast(),
            len,
        }
    }

    /// The area of type `T` at byte `offset` of the channel: one the ABI places there, made
    /// of atomics only (so a shared reference asserts nothing about what others write).
    pub fn at<T>(&self, offset: usize) -> &T {
        assert!(offset + std::mem::size_of::<T>() <= self.len);
        assert_eq!(offset % std::mem::align_of::<T>(), 0);
        // SAFETY: inside the mapping, aligned (checked above), and `T` is an ABI area of
        // atomics that lives as long as the mapping.
        unsafe { &*self.ptr.add(offset).cast::<T>() }
    }
}

impl Drop for ChannelMap {
    fn drop(&mut self) {
        // SAFETY: unmaps what `of` mapped.
        unsafe { rustix::mm::munmap(self.ptr.cast(), self.len).unwrap() };
    }
}

/// File calls the daemon has answered, through channels or referred to the socket.
pub fn fs_calls(d: &Daemon) -> u64 {
    let s = d.control().status().unwrap();
    s.fs_calls + s.fs_calls_referred
}

/// [`fs_calls`] once the poller has gone idle and published its counts (it publishes them
/// every so many busy passes and when it goes idle).
pub fn fs_calls_settled(d: &Daemon) -> u64 {
    let mut last = fs_calls(d);
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = fs_calls(d);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// The CPUs each thread named `name` of process `pid` may run on, from `/proc`, as the kernel
/// lists them (`0-3,6`).
pub fn threads_cpus(pid: u32, name: &str) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|task| {
            let dir = task.ok()?.path();
            let comm = std::fs::read_to_string(dir.join("comm")).ok()?;
            if comm.trim() != name {
                return None;
            }
            let status = std::fs::read_to_string(dir.join("status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string())
        })
        .collect()
}

/// The CPUs the first thread named `name` of process `pid` may run on.
pub fn thread_cpus(pid: u32, name: &str) -> Option<String> {
    threads_cpus(pid, name).into_iter().next()
}

/// Whether `cond` becomes true within `limit`, looked at every 5 ms (what the daemon does a
/// moment later: end a session once it reads a hang-up, move a thread as it starts).
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}
