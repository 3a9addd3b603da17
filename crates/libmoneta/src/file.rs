//! Files on nvfs through the channel (Moneta-D §2.2, §4.2, §4.3).
//!
//! A [`Moneta`] is a process's connection: one control socket to `monetad` and the channel that
//! comes with it, shared by every thread and every open [`File`]. Opening a file asks the
//! permission manager for a handle; after that, reads and writes inside the file go straight to
//! the device through the channel, without a system call. Each open file keeps a *translation
//! map* from file offsets to array addresses, filled on demand:
//!
//! - an offset the map does not cover is a **soft miss**: the library asks the manager for the
//!   extents there (`FS_LOOKUP`), which also installs their permission records in the channel;
//! - a command that completes with `PERMISSION_MISS` (the record was evicted, or revoked by a
//!   truncate) is a **hard miss**: the library forgets that offset's translation, asks again
//!   and retries from the first byte that did not complete;
//! - a write past the end or into a hole goes through the manager's extend call, which
//!   allocates whole chunks, zeroed, and grows the file.
//!
//! Commands carry the file's layout tag from the last lookup, and the device lets them use only
//! records with that tag; a lookup answering with a new tag (space has left the file since)
//! empties the map. So a translation made before another process truncated the file never
//! reaches the freed space once it belongs to another file, even when this process's channel
//! holds records over it for that file.
//!
//! The cached size is a hint. It can be too large only while the map holds no records past the
//! true end: a truncate in any process revokes every channel's records from the chunk of the
//! new end on, so a stale larger size always meets a hard miss first. It can be too small (the
//! file grew through another descriptor), so a read that the cached size would cut short asks
//! the manager first (a lookup, which answers with the size of the moment).
//!
//! ```
//! # let _daemon = monetad::testing::Daemon::start();
//! use libmoneta::{Moneta, OpenOptions};
//!
//! let m = Moneta::connect_default()?;
//! let f = m.open("/notes.txt", OpenOptions::new().read(true).write(true).create(true))?;
//! f.write_at(b"hello, nvm", 0)?;
//! let mut buf = [0u8; 5];
//! assert_eq!(f.read_at(&mut buf, 0)?, 5);
//! assert_eq!(&buf, b"hello");
//! # Ok::<(), libmoneta::ClientError>(())
//! ```

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use moneta_abi::control::{RIGHT_READ, RIGHT_WRITE};
use moneta_abi::fsproto::{
    FsDirEntry, FsExtent, FsReply, FsRequest, FsStat, FsStatFs, Target, WireTime, APPEND, HOLE,
    RENAME_NOREPLACE,
};
use moneta_abi::{Completion, Opcode, Status};

use crate::channel::{command, Channel, Tag};
use crate::control::Control;
use crate::fork::{self, GenLock, Ticket};
use crate::policy::Policy;
use crate::position::Position;
use crate::{paths, ClientError};

/// Bytes a read-side lookup asks for beyond the request, so that a sequential reader takes one
/// soft miss per extent run rather than one per request.
const LOOKUP_AHEAD: u64 = 64 << 20;
/// Most commands one request keeps in flight (each on its own tag).
const MAX_INFLIGHT: usize = 16;
/// Consecutive hard misses without progress before a request gives up with `EIO`: the
/// permission table is too small for even one command's records.
const MAX_FRUITLESS_MISSES: u32 = 1000;

fn errno(e: i32) -> ClientError {
    ClientError::Io(io::Error::from_raw_os_error(e))
}

fn path_bytes<P: AsRef<Path>>(p: &P) -> Vec<u8> {
    p.as_ref().as_os_str().as_bytes().to_vec()
}

fn target<P: AsRef<Path>>(p: &P, follow: bool) -> Target {
    Target::Path {
        path: path_bytes(p),
        follow,
    }
}

fn gather(bufs: &[IoSlice<'_>]) -> Vec<u8> {
    let mut v = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
    for b in bufs {
        v.extend_from_slice(b);
    }
    v
}

fn bad_reply(what: &'static str) -> ClientError {
    ClientError::Protocol(moneta_abi::control::Error::BadField(what))
}

impl From<ClientError> for io::Error {
    fn from(e: ClientError) -> io::Error {
        match e {
            ClientError::Io(e) => e,
            other => io::Error::from_raw_os_error(other.errno()),
        }
    }
}

/// Counters of one connection, for tests and reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups sent to the manager because the translation map did not cover an access.
    pub soft_misses: u64,
    /// Commands that completed with `PERMISSION_MISS` and were retried.
    pub hard_misses: u64,
    /// Extend calls (writes past the end or into holes).
    pub extends: u64,
    /// Device commands issued.
    pub commands: u64,
    /// The CPU the device's poller has to itself, if the daemon pinned it.
    pub device_cpu: Option<usize>,
    /// Threads of this process moved off that CPU (see [`crate::affinity`]).
    pub threads_moved: u64,
}

#[derive(Default)]
struct Counters {
    soft_misses: AtomicU64,
    hard_misses: AtomicU64,
    extends: AtomicU64,
    commands: AtomicU64,
    threads_moved: AtomicU64,
    /// The poller's CPU plus one, as the last channel said (0: not pinned).
    device_cpu: AtomicU64,
}

/// A connection, shared by its [`Moneta`] clones and open files.
///
/// After a `fork` the child's copy is *stale* (its generation is not the process's): its first
/// use detaches the parent's channel, connects anew and claims the parent's handles (see
/// [`crate::fork`]). Every channel the connection ever had stays allocated (inert once
/// detached) until the connection is dropped, so references handed out never dangle.
pub(crate) struct Inner {
    socket: PathBuf,
    policy: Policy,
    counters: Counters,
    /// The current channel (one of `state.chans`).
    cur: AtomicPtr<Channel>,
    /// The fork generation `cur` belongs to.
    gen: AtomicU64,
    /// Index of the current channel in `state.chans`.
    epoch: AtomicU64,
    state: GenLock<ConnState>,
    /// A bundle to claim, left by the fork that made this process.
    ticket: GenLock<Option<Ticket>>,
    /// Files open on the connection (a fork with none asks the daemon for nothing).
    open: AtomicUsize,
}

struct ConnState {
    // Boxed: `cur` and references handed out point at a channel while the vector grows.
    #[allow(clippy::vec_box)]
    chans: Vec<Box<Channel>>,
    /// `remaps[k]`: handles of channel `k`'s connection to those of `k + 1`, or the errno a
    /// file of channel `k` gets when nothing was carried over (`EBADF` after a fork whose
    /// bundle was lost, `EIO` after the daemon went away and the connection was made anew).
    remaps: Vec<Result<HashMap<u64, u64>, i32>>,
}

impl Inner {
    /// The current channel: valid once [`Inner::live`] has succeeded in this generation.
    #[inline]
    fn cur(&self) -> &Channel {
        // SAFETY: `cur` points into a box of `state.chans`, which lives as long as `self`.
        unsafe { &*self.cur.load(Ordering::Acquire) }
    }

    /// Whether the current channel belongs to this process.
    #[inline]
    fn fresh(&self) -> bool {
        self.gen.load(Ordering::Acquire) == fork::generation()
    }

    /// The current channel, connecting first in a forked child.
    #[inline]
    fn live(&self) -> Result<&Channel, ClientError> {
        if !self.fresh() {
            self.refresh()?;
        }
        Ok(self.cur())
    }

    /// In a forked child: detaches the parent's channel, connects, claims the bundle.
    fn refresh(&self) -> Result<(), ClientError> {
        let g = fork::generation();
        let mut st = self.state.lock();
        if self.gen.load(Ordering::Acquire) == g {
            return Ok(());
        }
        st.chans.last().expect("a connection").detach();
        let ch = Channel::from_control(Control::connect(&self.socket)?)?;
        make_room_for_device(&ch, &self.counters);
        let ticket = self.ticket.lock().take();
        let remap = match ticket {
            Some(t) => {
                let r = ch.control().fs_inherit(t.bundle, t.secret);
                t.close_pipe();
                match r {
                    Ok(pairs) => Ok(pairs.into_iter().collect()),
                    Err(e) => {
                        eprintln!("libmoneta: the files of the parent process are lost: {e}");
                        Err(libc::EBADF)
                    }
                }
            }
            None => Err(libc::EBADF),
        };
        self.install(&mut st, ch, remap);
        self.gen.store(g, Ordering::Release);
        Ok(())
    }

    /// Makes `ch` the current channel; files of the previous one map their handles through
    /// `remap`.
    fn install(&self, st: &mut ConnState, ch: Channel, remap: Result<HashMap<u64, u64>, i32>) {
        let b = Box::new(ch);
        self.cur
            .store(&*b as *const Channel as *mut Channel, Ordering::Release);
        st.chans.push(b);
        st.remaps.push(remap);
        self.epoch
            .store(st.chans.len() as u64 - 1, Ordering::Release);
    }

    /// After the daemon closed the connection of channel `seen` (it stopped, crashed or was
    /// restarted): connects anew, so that new opens and path calls work again. Files open on
    /// the old connection are gone with it: their calls fail with `EIO`. The old channel
    /// stays allocated, and threads still waiting on it learn that its daemon has gone.
    fn reconnect(&self, seen: u64) -> Result<(), ClientError> {
        let mut st = self.state.lock();
        if self.epoch.load(Ordering::Acquire) != seen || !self.fresh() {
            // Another thread reconnected first, or a fork's child connects its own way.
            return Ok(());
        }
        let ch = Channel::from_control(Control::connect(&self.socket)?)?;
        make_room_for_device(&ch, &self.counters);
        self.install(&mut st, ch, Err(libc::EIO));
        Ok(())
    }

    /// A file-system call on the current connection. When the daemon has closed it, the
    /// connection is made anew; a call that was never sent (the daemon was gone before it)
    /// is then sent again on the new connection if it names no handle of the old one, and
    /// any other fails with `EIO` (it may or may not have been carried out).
    fn fs_call(&self, req: FsRequest) -> Result<FsReply, ClientError> {
        self.fs_call_at(req).map(|(reply, _)| reply)
    }

    /// [`Inner::fs_call`], also giving the index of the channel whose connection answered.
    fn fs_call_at(&self, req: FsRequest) -> Result<(FsReply, u64), ClientError> {
        let ch = self.live()?;
        let seen = self.epoch.load(Ordering::Acquire);
        let retry = handle_free(&req).then(|| req.clone());
        match ch.control().fs(req) {
            Ok(reply) => Ok((reply, seen)),
            Err(ClientError::Disconnected) => {
                self.reconnect(seen)?;
                match retry {
                    Some(req) => {
                        let ch = self.live()?;
                        let now = self.epoch.load(Ordering::Acquire);
                        Ok((ch.control().fs(req)?, now))
                    }
                    None => Err(ClientError::DeviceGone),
                }
            }
            Err(ClientError::DeviceGone) => {
                // Best effort: the next call finds a connection if the daemon is back.
                let _ = self.reconnect(seen);
                Err(ClientError::DeviceGone)
            }
            Err(e) => Err(e),
        }
    }

    /// The descriptors of the current channel and its connection.
    pub(crate) fn descriptors(&self) -> Vec<i32> {
        use std::os::fd::AsRawFd;
        let ch = self.cur();
        vec![
            ch.control().fd().as_raw_fd(),
            ch.memfd().as_raw_fd(),
            ch.kick_fd().as_raw_fd(),
        ]
    }

    /// In a forked child, right after the fork: makes the parent's channel inert (only
    /// system calls: no lock, no allocation).
    pub(crate) fn detach_current(&self) {
        if !self.fresh() {
            self.cur().detach();
        }
    }

    /// Before a fork: a bundle of this connection's handles for the child, if it has any.
    pub(crate) fn prepare_fork(&self) -> Option<Ticket> {
        if self.open.load(Ordering::Acquire) == 0 {
            return None;
        }
        let ch = self.live().ok()?;
        match ch.control().fs_fork() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("libmoneta: a forked child will not inherit its files: {e}");
                None
            }
        }
    }

    /// In a forked child, right after the fork: the bundle to claim.
    pub(crate) fn set_ticket(&self, t: Ticket) {
        *self.ticket.lock() = Some(t);
    }
}

/// What another program image needs to take over a connection's open files across `exec`
/// (the preload shim's business; see `docs/abi.md` §2.10, `FS_FORK`).
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Handover {
    /// Bundle id.
    pub bundle: u64,
    /// Its secret.
    pub secret: [u64; 2],
    /// The bundle pipe's write end (close-on-exec; the caller clears that flag).
    pub pipe: i32,
}

/// An open file as another program image rebuilds it after `exec`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct FileState {
    /// The handle on the connection that handed it over.
    pub handle: u64,
    /// Inode.
    pub ino: u64,
    /// Open for reading.
    pub readable: bool,
    /// Open for writing.
    pub writable: bool,
    /// `O_APPEND`.
    pub append: bool,
    /// A directory.
    pub is_dir: bool,
    /// The position's shared cell (segment memfd, index), when it can be handed on.
    pub position_cell: Option<(i32, u32)>,
    /// The position now.
    pub position: u64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.lock().take() {
            t.close_pipe();
        }
    }
}

/// A connection to `monetad` and its channel; cheap to clone and shared by threads.
#[derive(Clone)]
pub struct Moneta {
    inner: Arc<Inner>,
}

/// A directory entry.
pub type DirEntry = FsDirEntry;

/// Options for [`Moneta::open`], as in `std::fs::OpenOptions`.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: u32,
    custom_flags: i32,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl OpenOptions {
    /// No access, mode 0666 for new files.
    pub fn new() -> OpenOptions {
        OpenOptions {
            read: false,
            write: false,
            append: false,
            truncate: false,
            create: false,
            create_new: false,
            mode: 0o666,
            custom_flags: 0,
        }
    }
    /// Open for reading.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Every write goes to the end of the file (implies write).
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    /// Truncate to zero on open.
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    /// Create if missing.
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Create, failing with `EEXIST` if it exists.
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Permission bits for a created file (before the umask of the daemon's policy: none).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = mode;
        self
    }
    /// Extra `O_*` bits (`O_DIRECTORY`, `O_NOFOLLOW`, ...).
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }
    /// The `open(2)` flags these options mean.
    pub fn flags(&self) -> i32 {
        let acc = match (self.read, self.write || self.append) {
            (true, true) => libc::O_RDWR,
            (false, true) => libc::O_WRONLY,
            _ => libc::O_RDONLY,
        };
        let mut f = acc | self.custom_flags;
        if self.append {
            f |= libc::O_APPEND;
        }
        if self.truncate {
            f |= libc::O_TRUNC;
        }
        if self.create || self.create_new {
            f |= libc::O_CREAT;
        }
        if self.create_new {
            f |= libc::O_EXCL;
        }
        f
    }
}

/// Whether `req` names nothing of its connection's own (no handle), so that it means the same
/// on another connection.
fn handle_free(req: &FsRequest) -> bool {
    match req {
        FsRequest::Open { .. }
        | FsRequest::Mkdir { .. }
        | FsRequest::Rmdir { .. }
        | FsRequest::Unlink { .. }
        | FsRequest::Rename { .. }
        | FsRequest::Link { .. }
        | FsRequest::Symlink { .. }
        | FsRequest::Readlink { .. }
        | FsRequest::Statfs => true,
        FsRequest::Stat { target }
        | FsRequest::Truncate { target, .. }
        | FsRequest::Chmod { target, .. }
        | FsRequest::Chown { target, .. }
        | FsRequest::Utimes { target, .. } => matches!(target, Target::Path { .. }),
        _ => false,
    }
}

/// Moves this process's threads off the poller's CPU, if the channel names one and
/// `MONETA_AFFINITY` does not say `any` (failing leaves the masks as they were, with a
/// message), and decides whether control replies are polled for
/// ([`crate::affinity::worth_polling`]).
fn make_room_for_device(ch: &Channel, counters: &Counters) {
    let cpu = ch.device_cpu();
    counters
        .device_cpu
        .store(cpu.map_or(0, |c| c as u64 + 1), Ordering::Relaxed);
    if let Some(cpu) = cpu {
        if crate::affinity::Affinity::from_env() != crate::affinity::Affinity::Any {
            match crate::affinity::keep_threads_off(cpu) {
                Ok(n) => {
                    counters
                        .threads_moved
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    eprintln!("libmoneta: cannot keep threads off the device's CPU {cpu}: {e}")
                }
            }
        }
    }
    ch.control()
        .set_polling(crate::affinity::worth_polling(cpu));
}

impl Moneta {
    /// Connects to the daemon at `socket` and opens this process's channel. The completion
    /// policy comes from `MONETA_COMPLETION` (see [`Policy::from_env`]).
    pub fn connect(socket: &Path) -> Result<Moneta, ClientError> {
        Self::connect_with(socket, Policy::from_env())
    }

    /// Connects to the daemon at the default socket ([`paths::default_socket`]).
    pub fn connect_default() -> Result<Moneta, ClientError> {
        Self::connect(&paths::default_socket())
    }

    /// Connects with an explicit completion policy. If the daemon's poller has a CPU of its
    /// own, the process's threads are moved off it unless `MONETA_AFFINITY=any` (see
    /// [`crate::affinity`]).
    pub fn connect_with(socket: &Path, policy: Policy) -> Result<Moneta, ClientError> {
        let ch = Box::new(Channel::open(socket)?);
        let counters = Counters::default();
        make_room_for_device(&ch, &counters);
        let inner = Arc::new(Inner {
            socket: socket.to_owned(),
            policy,
            counters,
            cur: AtomicPtr::new(&*ch as *const Channel as *mut Channel),
            gen: AtomicU64::new(fork::generation()),
            epoch: AtomicU64::new(0),
            state: GenLock::new(ConnState {
                chans: vec![ch],
                remaps: Vec::new(),
            }),
            ticket: GenLock::new(None),
            open: AtomicUsize::new(0),
        });
        fork::register(&inner);
        Ok(Moneta { inner })
    }

    /// Copies this connection's open handles into a bundle another program image can claim
    /// (the preload shim does this before `exec`).
    #[doc(hidden)]
    pub fn handover(&self) -> Result<Handover, ClientError> {
        let t = self.inner.live()?.control().fs_fork()?;
        Ok(Handover {
            bundle: t.bundle,
            secret: t.secret,
            pipe: t.pipe,
        })
    }

    /// Connects and claims a bundle handed over by the previous program image: the new
    /// connection and the pairs (old handle, new handle).
    #[doc(hidden)]
    pub fn adopt(
        socket: &Path,
        bundle: u64,
        secret: [u64; 2],
    ) -> Result<(Moneta, HashMap<u64, u64>), ClientError> {
        let m = Moneta::connect(socket)?;
        let pairs = m
            .inner
            .live()?
            .control()
            .fs_inherit(bundle, secret)?
            .into_iter()
            .collect();
        Ok((m, pairs))
    }

    /// The channel (in a forked child, its own: connecting on first use). If a forked child
    /// cannot reach the daemon, this is its parent's channel made inert, whose requests
    /// never complete: use the file calls, which report the error.
    pub fn channel(&self) -> &Channel {
        let _ = self.inner.live();
        self.inner.cur()
    }

    /// The connection's completion policy.
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// Counters so far.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        Stats {
            soft_misses: c.soft_misses.load(Ordering::Relaxed),
            hard_misses: c.hard_misses.load(Ordering::Relaxed),
            extends: c.extends.load(Ordering::Relaxed),
            commands: c.commands.load(Ordering::Relaxed),
            device_cpu: match c.device_cpu.load(Ordering::Relaxed) {
                0 => None,
                n => Some(n as usize - 1),
            },
            threads_moved: c.threads_moved.load(Ordering::Relaxed),
        }
    }

    fn fs(&self, req: FsRequest) -> Result<FsReply, ClientError> {
        self.inner.fs_call(req)
    }

    fn fs_empty(&self, req: FsRequest) -> Result<(), ClientError> {
        self.fs(req).map(|_| ())
    }

    fn fs_stat_reply(&self, req: FsRequest) -> Result<FsStat, ClientError> {
        match self.fs(req)? {
            FsReply::Stat(s) => Ok(s),
            _ => Err(bad_reply("stat reply")),
        }
    }

    /// Opens `path` with `opts`.
    pub fn open<P: AsRef<Path>>(&self, path: P, opts: &OpenOptions) -> Result<File, ClientError> {
        self.open_flags(path, opts.flags(), opts.mode)
    }

    /// Opens `path` with `open(2)` flags and a creation mode.
    pub fn open_flags<P: AsRef<Path>>(
        &self,
        path: P,
        flags: i32,
        mode: u32,
    ) -> Result<File, ClientError> {
        let pos = Position::new()?;
        let (reply, epoch) = self.inner.fs_call_at(FsRequest::Open {
            flags: flags as u32,
            mode,
            path: path_bytes(&path),
        })?;
        let FsReply::Opened {
            handle,
            rights,
            stat,
        } = reply
        else {
            return Err(bad_reply("open reply"));
        };
        self.inner.open.fetch_add(1, Ordering::AcqRel);
        Ok(File {
            m: self.clone(),
            handle: AtomicU64::new(handle),
            epoch: AtomicU64::new(epoch),
            ino: stat.ino,
            readable: rights & RIGHT_READ != 0,
            writable: rights & RIGHT_WRITE != 0,
            append: std::sync::atomic::AtomicBool::new(flags & libc::O_APPEND != 0),
            is_dir: stat.mode & libc::S_IFMT == libc::S_IFDIR,
            pos,
            map: RwLock::new(Map {
                size: stat.size,
                gen: 0,
                file: 0,
                ext: Vec::new(),
            }),
            miss: Mutex::new(()),
            policy: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Creates (or truncates) `path` for writing, like `std::fs::File::create`.
    pub fn create<P: AsRef<Path>>(&self, path: P) -> Result<File, ClientError> {
        self.open(
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
        )
    }

    /// `stat(2)`.
    pub fn stat<P: AsRef<Path>>(&self, path: P) -> Result<FsStat, ClientError> {
        self.fs_stat_reply(FsRequest::Stat {
            target: target(&path, true),
        })
    }

    /// `lstat(2)`.
    pub fn lstat<P: AsRef<Path>>(&self, path: P) -> Result<FsStat, ClientError> {
        self.fs_stat_reply(FsRequest::Stat {
            target: target(&path, false),
        })
    }

    /// `mkdir(2)`.
    pub fn mkdir<P: AsRef<Path>>(&self, path: P, mode: u32) -> Result<FsStat, ClientError> {
        self.fs_stat_reply(FsRequest::Mkdir {
            mode,
            path: path_bytes(&path),
        })
    }

    /// `rmdir(2)`.
    pub fn rmdir<P: AsRef<Path>>(&self, path: P) -> Result<(), ClientError> {
        self.fs_empty(FsRequest::Rmdir {
            path: path_bytes(&path),
        })
    }

    /// `unlink(2)`.
    pub fn unlink<P: AsRef<Path>>(&self, path: P) -> Result<(), ClientError> {
        self.fs_empty(FsRequest::Unlink {
            path: path_bytes(&path),
        })
    }

    /// `rename(2)`; with `noreplace`, `renameat2(RENAME_NOREPLACE)`.
    pub fn rename<P: AsRef<Path>, Q: AsRef<Path>>(
        &self,
        from: P,
        to: Q,
        noreplace: bool,
    ) -> Result<(), ClientError> {
        self.fs_empty(FsRequest::Rename {
            flags: if noreplace { RENAME_NOREPLACE } else { 0 },
            from: path_bytes(&from),
            to: path_bytes(&to),
        })
    }

    /// `link(2)`.
    pub fn link<P: AsRef<Path>, Q: AsRef<Path>>(
        &self,
        from: P,
        to: Q,
    ) -> Result<FsStat, ClientError> {
        self.fs_stat_reply(FsRequest::Link {
            from: path_bytes(&from),
            to: path_bytes(&to),
        })
    }

    /// `symlink(2)`: a link at `path` that points to `target`.
    pub fn symlink<P: AsRef<Path>>(&self, target: &[u8], path: P) -> Result<FsStat, ClientError> {
        self.fs_stat_reply(FsRequest::Symlink {
            target: target.to_vec(),
            path: path_bytes(&path),
        })
    }

    /// `readlink(2)`.
    pub fn readlink<P: AsRef<Path>>(&self, path: P) -> Result<Vec<u8>, ClientError> {
        match self.fs(FsRequest::Readlink {
            path: path_bytes(&path),
        })? {
            FsReply::Bytes(b) => Ok(b),
            _ => Err(bad_reply("readlink reply")),
        }
    }

    /// `chmod(2)`.
    pub fn chmod<P: AsRef<Path>>(&self, path: P, mode: u32) -> Result<(), ClientError> {
        self.fs_empty(FsRequest::Chmod {
            target: target(&path, true),
            mode,
        })
    }

    /// `chown(2)` (`u32::MAX` leaves an id unchanged); `follow` false is `lchown(2)`.
    pub fn chown<P: AsRef<Path>>(
        &self,
        path: P,
        uid: u32,
        gid: u32,
        follow: bool,
    ) -> Result<(), ClientError> {
        self.fs_empty(FsRequest::Chown {
            target: target(&path, follow),
            uid,
            gid,
        })
    }

    /// `utimensat(2)`: nanoseconds may be `UTIME_NOW` or `UTIME_OMIT`.
    pub fn utimes<P: AsRef<Path>>(
        &self,
        path: P,
        atime: WireTime,
        mtime: WireTime,
        follow: bool,
    ) -> Result<(), ClientError> {
        self.fs_empty(FsRequest::Utimes {
            target: target(&path, follow),
            atime,
            mtime,
        })
    }

    /// `truncate(2)`.
    pub fn truncate<P: AsRef<Path>>(&self, path: P, size: u64) -> Result<(), ClientError> {
        self.fs_empty(FsRequest::Truncate {
            target: target(&path, true),
            size,
        })
    }

    /// `statfs(2)`.
    pub fn statfs(&self) -> Result<FsStatFs, ClientError> {
        match self.fs(FsRequest::Statfs)? {
            FsReply::StatFs(s) => Ok(s),
            _ => Err(bad_reply("statfs reply")),
        }
    }

    /// Every entry of a directory, `.` and `..` included.
    pub fn read_dir<P: AsRef<Path>>(&self, path: P) -> Result<Vec<DirEntry>, ClientError> {
        let d = self.open_flags(path, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
        let mut out = Vec::new();
        let mut cookie = 0;
        loop {
            let (entries, end) = d.read_dir_from(cookie)?;
            if let Some(last) = entries.last() {
                cookie = last.next;
            }
            let empty = entries.is_empty();
            out.extend(entries);
            if end || empty {
                break;
            }
        }
        d.close()?;
        Ok(out)
    }
}

#[derive(Clone, Copy, Debug)]
struct Ext {
    len: u64,
    /// Array address, or `HOLE`.
    dev: u64,
    /// The lookup that brought it: a hole is trusted only by the request that looked it up,
    /// since another process may fill it at any time.
    gen: u64,
}

/// A file's translation map: runs sorted by file offset, not overlapping. A sorted vector
/// rather than a tree: most files are one extent (1 MiB chunks allocated contiguously), and the
/// lookup is on every request's path.
struct Map {
    size: u64,
    gen: u64,
    /// The layout tag of the last lookup: every entry was mapped under it (the map is emptied
    /// when a lookup answers with another), and every command on an entry asks for it.
    file: u64,
    ext: Vec<(u64, Ext)>,
}

impl Map {
    /// The entry covering `off`, with its start.
    #[inline]
    fn at(&self, off: u64) -> Option<(u64, Ext)> {
        let i = self.ext.partition_point(|&(k, _)| k <= off);
        let (k, e) = *self.ext.get(i.checked_sub(1)?)?;
        (off < k + e.len).then_some((k, e))
    }

    /// The array address of `[off, off + len)` when one mapped (non-hole) entry covers it,
    /// with the layout tag.
    #[inline]
    fn single(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        let (k, e) = self.at(off)?;
        (e.dev != HOLE && off + len <= k + e.len).then(|| (e.dev + (off - k), self.file))
    }

    fn insert(&mut self, x: &FsExtent, gen: u64) {
        let end = x.file_off.saturating_add(x.len);
        // Entries that overlap the new one go: the first that ends after its start, up to the
        // first that starts at or after its end.
        let lo = self.ext.partition_point(|&(k, e)| k + e.len <= x.file_off);
        let hi = self.ext.partition_point(|&(k, _)| k < end);
        self.ext.splice(
            lo..hi.max(lo),
            [(
                x.file_off,
                Ext {
                    len: x.len,
                    dev: x.dev,
                    gen,
                },
            )],
        );
    }
}

/// One device command of a request: `len` bytes at array address `dev`, for the bytes at `at`
/// in the caller's buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) dev: u64,
    pub(crate) len: usize,
    pub(crate) at: usize,
    /// The layout tag the command asks for.
    pub(crate) file: u64,
}

/// A request mapped onto the array.
#[derive(Default)]
pub(crate) struct Prepared {
    /// Bytes the request moves.
    pub(crate) len: usize,
    /// Its device commands.
    pub(crate) segs: Vec<Seg>,
    /// Runs of the buffer (offset, length) that are holes: zeros.
    pub(crate) holes: Vec<(usize, usize)>,
}

/// What a request plan found.
enum Plan {
    /// Every byte is mapped: segments (and, for reads, holes to zero) are ready.
    Ready,
    /// The first byte (buffer offset) the map does not cover.
    Miss(usize),
}

/// The user's buffer of one request.
enum Io<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// How a run of commands ended short of success.
enum Fail {
    /// A command met `PERMISSION_MISS`; the bytes before buffer offset `.0` completed.
    Miss(usize),
    /// Anything else.
    Err(ClientError),
}

/// An open file on nvfs.
pub struct File {
    m: Moneta,
    /// The daemon's handle, on the connection of channel `epoch` of `m`.
    handle: AtomicU64,
    epoch: AtomicU64,
    ino: u64,
    readable: bool,
    writable: bool,
    append: std::sync::atomic::AtomicBool,
    is_dir: bool,
    pos: Position,
    map: RwLock<Map>,
    /// Serializes this file's lookups and extends, so that sizes from replies apply in order.
    miss: Mutex<()>,
    /// 0: the connection's policy; else [`encode_policy`].
    policy: AtomicU64,
    /// Closed by [`File::close`]: nothing left for `Drop`.
    closed: std::sync::atomic::AtomicBool,
}

fn encode_policy(p: Policy) -> u64 {
    match p {
        Policy::Fixed(Completion::Dma) => 1,
        Policy::Fixed(Completion::Forward) => 2,
        Policy::Fixed(Completion::Sleep) => 3,
        Policy::Auto { spin_max } => 4 + spin_max as u64,
    }
}

fn decode_policy(v: u64) -> Option<Policy> {
    match v {
        0 => None,
        1 => Some(Policy::Fixed(Completion::Dma)),
        2 => Some(Policy::Fixed(Completion::Forward)),
        3 => Some(Policy::Fixed(Completion::Sleep)),
        n => Some(Policy::Auto {
            spin_max: (n - 4) as usize,
        }),
    }
}

impl File {
    /// What another program image needs to rebuild this file (see [`Moneta::handover`]).
    #[doc(hidden)]
    pub fn state(&self) -> Result<FileState, ClientError> {
        Ok(FileState {
            handle: self.h()?,
            ino: self.ino,
            readable: self.readable,
            writable: self.writable,
            append: self.appends(),
            is_dir: self.is_dir,
            position_cell: self.pos.locate(),
            position: self.pos.get(),
        })
    }

    /// Rebuilds a file another program image handed over, with its handle `handle` on `m`.
    #[doc(hidden)]
    pub fn adopt(m: &Moneta, handle: u64, st: &FileState) -> Result<File, ClientError> {
        let pos = match st.position_cell.map(|(fd, i)| Position::adopt(fd, i)) {
            Some(Ok(p)) => p,
            _ => {
                let p = Position::new()?;
                p.lock().set(st.position);
                p
            }
        };
        m.inner.open.fetch_add(1, Ordering::AcqRel);
        Ok(File {
            m: m.clone(),
            handle: AtomicU64::new(handle),
            epoch: AtomicU64::new(m.inner.epoch.load(Ordering::Acquire)),
            ino: st.ino,
            readable: st.readable,
            writable: st.writable,
            append: std::sync::atomic::AtomicBool::new(st.append),
            is_dir: st.is_dir,
            pos,
            map: RwLock::new(Map {
                size: 0,
                gen: 0,
                file: 0,
                ext: Vec::new(),
            }),
            miss: Mutex::new(()),
            policy: AtomicU64::new(0),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The daemon's handle (on this process's connection).
    pub fn handle(&self) -> u64 {
        self.h().unwrap_or(0)
    }

    /// The handle, after making sure it and the channel belong to this process: in a forked
    /// child, the first use connects and maps the parent's handle to the inherited one.
    #[inline]
    pub(crate) fn h(&self) -> Result<u64, ClientError> {
        let i = &self.m.inner;
        if i.fresh() && self.epoch.load(Ordering::Acquire) == i.epoch.load(Ordering::Acquire) {
            return Ok(self.handle.load(Ordering::Relaxed));
        }
        self.rebind()
    }

    #[cold]
    fn rebind(&self) -> Result<u64, ClientError> {
        let i = &self.m.inner;
        i.refresh()?;
        let st = i.state.lock();
        let now = i.epoch.load(Ordering::Acquire);
        let (mut e, mut h) = (
            self.epoch.load(Ordering::Acquire),
            self.handle.load(Ordering::Relaxed),
        );
        if e == now {
            return Ok(h);
        }
        while e < now {
            h = match st.remaps.get(e as usize) {
                Some(Ok(r)) => r.get(&h).copied().ok_or_else(|| errno(libc::EBADF))?,
                Some(Err(lost)) => return Err(errno(*lost)),
                None => return Err(errno(libc::EBADF)),
            };
            e += 1;
        }
        drop(st);
        // The translation map held records of the old channel.
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.ext.clear();
        map.gen += 1;
        self.handle.store(h, Ordering::Relaxed);
        self.epoch.store(now, Ordering::Release);
        Ok(h)
    }

    /// The inode number.
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// The connection the file belongs to.
    pub fn moneta(&self) -> &Moneta {
        &self.m
    }

    /// Overrides the connection's completion policy for this file (`None` restores it).
    pub fn set_policy(&self, p: Option<Policy>) {
        self.policy
            .store(p.map_or(0, encode_policy), Ordering::Relaxed);
    }

    /// The completion policy in force for this file.
    pub fn policy(&self) -> Policy {
        decode_policy(self.policy.load(Ordering::Relaxed)).unwrap_or(self.m.inner.policy)
    }

    #[inline]
    fn mode_for(&self, len: usize) -> Completion {
        self.policy().mode(len)
    }

    /// The channel, once [`File::h`] succeeded.
    #[inline]
    fn ch(&self) -> &Channel {
        self.m.inner.cur()
    }

    /// The connection's channel (see [`Moneta::channel`]).
    pub fn channel(&self) -> &Channel {
        self.m.channel()
    }

    /// Whether writes go to the end (`O_APPEND`).
    pub fn appends(&self) -> bool {
        self.append.load(Ordering::Relaxed)
    }

    /// Turns `O_APPEND` on or off (`fcntl(F_SETFL)`).
    pub fn set_append(&self, on: bool) {
        self.append.store(on, Ordering::Relaxed);
    }

    /// Where a write asked for at `off` goes: `None` means at the end.
    pub(crate) fn write_offset(&self, off: u64) -> Option<u64> {
        (!self.appends()).then_some(off)
    }

    /// Refuses a read on a directory or a handle without the right.
    pub(crate) fn check_access(&self, write: bool) -> Result<(), ClientError> {
        if write {
            if !self.writable {
                return Err(errno(libc::EBADF));
            }
        } else {
            if self.is_dir {
                return Err(errno(libc::EISDIR));
            }
            if !self.readable {
                return Err(errno(libc::EBADF));
            }
        }
        Ok(())
    }

    /// Refuses ranges past the largest file offset.
    pub(crate) fn check_range(&self, off: u64, len: u64, write: bool) -> Result<(), ClientError> {
        match off.checked_add(len) {
            Some(end) if off <= i64::MAX as u64 && end <= i64::MAX as u64 => Ok(()),
            _ => Err(errno(if write { libc::EFBIG } else { libc::EINVAL })),
        }
    }

    /// Reserves `len` bytes at the end of the file (atomically with other appenders, in any
    /// process); returns where they start.
    pub(crate) fn append_at(&self, len: u64) -> Result<u64, ClientError> {
        if len == 0 {
            return self.len();
        }
        let (_, size) = self.lookup(APPEND, len, true)?;
        size.checked_sub(len)
            .ok_or_else(|| bad_reply("append size"))
    }

    /// Drops the translation of `at` (after a hard miss there seen by an asynchronous request).
    pub(crate) fn forget_at(&self, at: u64) {
        let mut f = 0;
        let _ = self.hard_miss_at(at, &mut f);
    }

    /// Writes all of `data` at exactly `off` (no append redirection).
    pub(crate) fn write_exact_at_with(
        &self,
        data: &[u8],
        off: u64,
        mode: Completion,
    ) -> Result<(), ClientError> {
        self.write_inner(data, Some(off), mode).map(|_| ())
    }

    /// Attributes (`fstat(2)`).
    pub fn stat(&self) -> Result<FsStat, ClientError> {
        self.m.fs_stat_reply(FsRequest::Stat {
            target: Target::Handle(self.h()?),
        })
    }

    /// The file's size as the manager knows it now.
    pub fn len(&self) -> Result<u64, ClientError> {
        Ok(self.stat()?.size)
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> Result<bool, ClientError> {
        Ok(self.len()? == 0)
    }

    /// `ftruncate(2)`.
    pub fn set_len(&self, size: u64) -> Result<(), ClientError> {
        if !self.writable {
            return Err(errno(libc::EINVAL));
        }
        let _g = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        self.m.fs_empty(FsRequest::Truncate {
            target: Target::Handle(self.h()?),
            size,
        })?;
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        map.ext.clear();
        map.size = size;
        map.gen += 1;
        Ok(())
    }

    /// `fallocate(2)` mode 0 and `posix_fallocate(3)`: allocates every hole of
    /// `[off, off + len)` (zeroed) and grows the size to `off + len` if that is larger, so
    /// that later writes there cannot fail for want of space. When the device lacks the space
    /// it fails at once with `ENOSPC` and changes nothing.
    ///
    /// With `keep_size` (`FALLOC_FL_KEEP_SIZE`) the size stays as it is: the holes inside it
    /// are allocated; nvfs keeps no space past a file's last chunk, so for the part beyond it
    /// the call only checks that the device has the room now (`ENOSPC` otherwise) and reserves
    /// nothing there.
    pub fn allocate(&self, off: u64, len: u64, keep_size: bool) -> Result<(), ClientError> {
        if self.is_dir {
            return Err(errno(libc::ENODEV));
        }
        self.check_access(true)?;
        if len == 0 {
            return Err(errno(libc::EINVAL));
        }
        self.check_range(off, len, true)?;
        self.h()?;
        let end = off + len;
        if !keep_size {
            self.lookup(off, len, true)?;
            return Ok(());
        }
        let size = self.len()?;
        if off < size {
            self.lookup(off, end.min(size) - off, true)?;
        }
        if end > size {
            let fs = self.m.statfs()?;
            let cs = fs.chunk_size.max(1);
            let first = size.max(off).div_ceil(cs);
            let need = end.div_ceil(cs).saturating_sub(first);
            if need > fs.chunks_free {
                return Err(ClientError::Refused {
                    errno: libc::ENOSPC,
                    message: format!(
                        "no space left: {need} chunks needed, {} free",
                        fs.chunks_free
                    ),
                });
            }
        }
        Ok(())
    }

    /// `fsync(2)`: data and metadata durable against a machine crash.
    pub fn sync_all(&self) -> Result<(), ClientError> {
        self.m.fs_empty(FsRequest::Fsync { handle: self.h()? })
    }

    /// `fdatasync(2)` (nvfs keeps data and metadata together: the same as [`File::sync_all`]).
    pub fn sync_data(&self) -> Result<(), ClientError> {
        self.sync_all()
    }

    /// `fchmod(2)`.
    pub fn chmod(&self, mode: u32) -> Result<(), ClientError> {
        self.m.fs_empty(FsRequest::Chmod {
            target: Target::Handle(self.h()?),
            mode,
        })
    }

    /// `fchown(2)`.
    pub fn chown(&self, uid: u32, gid: u32) -> Result<(), ClientError> {
        self.m.fs_empty(FsRequest::Chown {
            target: Target::Handle(self.h()?),
            uid,
            gid,
        })
    }

    /// `futimens(2)`.
    pub fn utimes(&self, atime: WireTime, mtime: WireTime) -> Result<(), ClientError> {
        self.m.fs_empty(FsRequest::Utimes {
            target: Target::Handle(self.h()?),
            atime,
            mtime,
        })
    }

    /// One batch of directory entries from `cookie` (0 to start, else the `next` of the last
    /// entry seen), and whether the directory is exhausted.
    pub fn read_dir_from(&self, cookie: u64) -> Result<(Vec<DirEntry>, bool), ClientError> {
        match self.m.fs(FsRequest::Readdir {
            handle: self.h()?,
            cookie,
        })? {
            FsReply::Dir { entries, end } => Ok((entries, end)),
            _ => Err(bad_reply("readdir reply")),
        }
    }

    /// Closes the file, reporting the daemon's answer (dropping it closes silently).
    pub fn close(self) -> Result<(), ClientError> {
        self.closed.store(true, Ordering::Relaxed);
        self.m.inner.open.fetch_sub(1, Ordering::AcqRel);
        let handle = self.h()?;
        self.m.fs_empty(FsRequest::Close { handle })
    }

    // ----- data path -----

    /// Asks the manager for the extents from file offset `off` (a soft miss), or with
    /// `extend` allocates and grows (`off == APPEND` appends). Returns the lookup's generation
    /// and the size it reported.
    fn lookup(&self, off: u64, len: u64, extend: bool) -> Result<(u64, u64), ClientError> {
        let handle = self.h()?;
        let _g = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        let c = &self.m.inner.counters;
        let ctl = self.ch().control();
        let m = if extend {
            c.extends.fetch_add(1, Ordering::Relaxed);
            ctl.fs_extend_mapped(handle, off, len)?
        } else {
            c.soft_misses.fetch_add(1, Ordering::Relaxed);
            // Ahead of the request, only up to what the map already translates: after a hard
            // miss (an evicted record) that is the one extent whose record went, so a table
            // under pressure is not flooded with the records of extents still installed.
            let ahead = {
                let map = self.map.read().unwrap_or_else(|e| e.into_inner());
                let i = map.ext.partition_point(|&(k, _)| k <= off);
                map.ext.get(i).map_or(LOOKUP_AHEAD, |&(k, _)| k - off)
            };
            let ask = len.max(ahead.min(LOOKUP_AHEAD));
            match self.channel_lookup(handle, off, ask) {
                Some(m) => m,
                None => ctl.fs_lookup_mapped(handle, off, ask)?,
            }
        };
        let (size, exts) = (m.size, m.extents);
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if m.file != map.file {
            // Space left the file since the map was made: what it translates may now be
            // another file's (commands with the old tag could not reach it, but they would
            // miss again and again).
            map.ext.clear();
            map.file = m.file;
        }
        map.gen += 1;
        let gen = map.gen;
        map.size = size;
        for x in &exts {
            if x.len > 0 {
                map.insert(x, gen);
            }
        }
        Ok((gen, size))
    }

    /// The soft miss through the channel ([`Channel::lookup`]); `None` when the device
    /// referred it to the control socket.
    fn channel_lookup(&self, handle: u64, off: u64, len: u64) -> Option<crate::control::Mapped> {
        self.ch().lookup(handle, off, len).ok().flatten()
    }

    /// A hard miss at file offset `at`: forget the translation of that offset, whose records
    /// are gone, so the retry looks it up again. The rest of the map stays: a record evicted
    /// from a full table says nothing about the others, and should space have left the file
    /// (a truncate elsewhere), the other translations cannot reach it (their commands carry
    /// the old layout tag) and the lookup, answering with the new tag, empties the map.
    fn hard_miss_at(&self, at: u64, fruitless: &mut u32) -> Result<(), ClientError> {
        self.count_hard_miss(fruitless)?;
        let _g = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some((k, _)) = map.at(at) {
            let i = map.ext.partition_point(|&(s, _)| s < k);
            map.ext.remove(i);
        }
        map.gen += 1;
        Ok(())
    }

    /// Counts a hard miss; fails with `EIO` after too many without progress.
    fn count_hard_miss(&self, fruitless: &mut u32) -> Result<(), ClientError> {
        self.m
            .inner
            .counters
            .hard_misses
            .fetch_add(1, Ordering::Relaxed);
        *fruitless += 1;
        if *fruitless > MAX_FRUITLESS_MISSES {
            return Err(ClientError::Refused {
                errno: libc::EIO,
                message: "the permission table cannot hold this request's records".into(),
            });
        }
        if *fruitless > 8 {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Plans `[off, off + len)` from the map into slice-sized segments; for reads, hole runs
    /// looked up by generation `fresh` go to `holes` (buffer offset, length).
    fn plan(
        &self,
        map: &Map,
        off: u64,
        len: usize,
        fresh: Option<u64>,
        segs: &mut Vec<Seg>,
        holes: &mut Vec<(usize, usize)>,
    ) -> Plan {
        segs.clear();
        holes.clear();
        let slice = self.ch().slice_size() as u64;
        let end = off + len as u64;
        let mut at = off;
        while at < end {
            let Some((k, e)) = map.at(at) else {
                return Plan::Miss((at - off) as usize);
            };
            let run_end = end.min(k + e.len);
            if e.dev == HOLE {
                if fresh.is_none_or(|f| e.gen < f) {
                    return Plan::Miss((at - off) as usize);
                }
                holes.push(((at - off) as usize, (run_end - at) as usize));
            } else {
                let mut p = at;
                while p < run_end {
                    let n = (run_end - p).min(slice);
                    segs.push(Seg {
                        dev: e.dev + (p - k),
                        len: n as usize,
                        at: (p - off) as usize,
                        file: map.file,
                    });
                    p += n;
                }
            }
            at = run_end;
        }
        Plan::Ready
    }

    /// Runs `segs` against `io`, up to [`MAX_INFLIGHT`] at once on tags of the channel, each
    /// completed in `mode`.
    fn transfer(&self, io: &mut Io<'_>, segs: &[Seg], mode: Completion) -> Result<(), Fail> {
        let ch = self.ch();
        self.m
            .inner
            .counters
            .commands
            .fetch_add(segs.len() as u64, Ordering::Relaxed);
        let mut spare: [Tag; MAX_INFLIGHT] = [Tag(0); MAX_INFLIGHT];
        let mut nspare = 0usize;
        let mut held = 0usize;
        // Ring of (tag, segment index) in submission order.
        let mut ring: [(Tag, usize); MAX_INFLIGHT] = [(Tag(0), 0); MAX_INFLIGHT];
        let (mut head, mut inflight) = (0usize, 0usize);
        let mut fail: Option<Fail> = None;
        let finish = |tag: Tag, i: usize, io: &mut Io<'_>, fail: &mut Option<Fail>| {
            let seg = segs[i];
            match ch.wait(tag, mode) {
                Ok(c) => match c.status {
                    Status::Ok => {
                        if let Io::Read(buf) = io {
                            ch.read_dma(tag, 0, &mut buf[seg.at..seg.at + seg.len]);
                        }
                    }
                    Status::PermissionMiss => {
                        fail.get_or_insert(Fail::Miss(seg.at));
                    }
                    Status::PermissionDenied => {
                        fail.get_or_insert(Fail::Err(errno(libc::EBADF)));
                    }
                    s => {
                        fail.get_or_insert(Fail::Err(ClientError::Status(s)));
                    }
                },
                Err(e) => {
                    fail.get_or_insert(Fail::Err(e));
                }
            }
        };
        for (i, seg) in segs.iter().enumerate() {
            if fail.is_some() {
                break;
            }
            let tag = if nspare > 0 {
                nspare -= 1;
                spare[nspare]
            } else if held == 0 {
                held += 1;
                ch.tag()
            } else if let Some(t) = (held < MAX_INFLIGHT).then(|| ch.try_tag()).flatten() {
                held += 1;
                t
            } else {
                let (t, j) = ring[head];
                head = (head + 1) % MAX_INFLIGHT;
                inflight -= 1;
                finish(t, j, io, &mut fail);
                if fail.is_some() {
                    spare[nspare] = t;
                    nspare += 1;
                    break;
                }
                t
            };
            let opcode = match io {
                Io::Read(_) => Opcode::Read,
                Io::Write(buf) => {
                    ch.write_dma(tag, 0, &buf[seg.at..seg.at + seg.len]);
                    Opcode::Write
                }
            };
            ch.submit(
                tag,
                &command(opcode, mode, seg.dev, seg.len as u64, seg.file),
            );
            ring[(head + inflight) % MAX_INFLIGHT] = (tag, i);
            inflight += 1;
        }
        while inflight > 0 {
            let (t, j) = ring[head];
            head = (head + 1) % MAX_INFLIGHT;
            inflight -= 1;
            finish(t, j, io, &mut fail);
            spare[nspare] = t;
            nspare += 1;
        }
        for &t in &spare[..nspare] {
            ch.release(t);
        }
        match fail {
            None => Ok(()),
            Some(f) => Err(f),
        }
    }

    /// One command on one tag: the path of a small request inside one extent, kept short
    /// (Moneta-D's point is the instructions between the application and the device).
    ///
    /// `t0` is the request's first stamp when stage timing is on ([`crate::trace`]), else 0.
    #[inline]
    fn one(
        &self,
        io: &mut Io<'_>,
        (dev, file): (u64, u64),
        mode: Completion,
        t0: u64,
    ) -> Result<(), Fail> {
        if t0 != 0 {
            return self.one_traced(io, (dev, file), mode, t0);
        }
        let ch = self.ch();
        self.m
            .inner
            .counters
            .commands
            .fetch_add(1, Ordering::Relaxed);
        let tag = match ch.try_tag() {
            Some(t) => t,
            None => ch.tag(),
        };
        let (opcode, len) = match io {
            Io::Read(b) => (Opcode::Read, b.len()),
            Io::Write(b) => {
                ch.write_dma(tag, 0, b);
                (Opcode::Write, b.len())
            }
        };
        ch.submit(tag, &command(opcode, mode, dev, len as u64, file));
        let r = match ch.wait(tag, mode) {
            Ok(c) => Self::ended(c.status, || {
                if let Io::Read(b) = io {
                    ch.read_dma(tag, 0, b);
                }
            }),
            Err(e) => Err(Fail::Err(e)),
        };
        ch.release(tag);
        r
    }

    /// What a completed command's status means for the request; `copy_out` runs on success.
    #[inline]
    fn ended(status: Status, copy_out: impl FnOnce()) -> Result<(), Fail> {
        match status {
            Status::Ok => {
                copy_out();
                Ok(())
            }
            Status::PermissionMiss => Err(Fail::Miss(0)),
            Status::PermissionDenied => Err(Fail::Err(errno(libc::EBADF))),
            st => Err(Fail::Err(ClientError::Status(st))),
        }
    }

    /// [`File::one`] with a stamp between stages, recorded in the thread's sums.
    #[inline(never)]
    fn one_traced(
        &self,
        io: &mut Io<'_>,
        (dev, file): (u64, u64),
        mode: Completion,
        t0: u64,
    ) -> Result<(), Fail> {
        use crate::trace::{record, stamp, Breakdown};
        let mapped = stamp();
        let ch = self.ch();
        self.m
            .inner
            .counters
            .commands
            .fetch_add(1, Ordering::Relaxed);
        let tag = match ch.try_tag() {
            Some(t) => t,
            None => ch.tag(),
        };
        let mut copy = 0;
        let (opcode, len) = match io {
            Io::Read(b) => (Opcode::Read, b.len()),
            Io::Write(b) => {
                let c0 = stamp();
                ch.write_dma(tag, 0, b);
                copy = stamp() - c0;
                (Opcode::Write, b.len())
            }
        };
        ch.submit(tag, &command(opcode, mode, dev, len as u64, file));
        let submitted = stamp();
        let waited_for = ch.wait(tag, mode);
        let waited = stamp();
        let mut device_ns = 0;
        let mut copied = waited;
        let r = match waited_for {
            Ok(c) => {
                device_ns = c.device_ns;
                Self::ended(c.status, || {
                    if let Io::Read(b) = io {
                        ch.read_dma(tag, 0, b);
                        copied = stamp();
                        copy = copied - waited;
                    }
                })
            }
            Err(e) => Err(Fail::Err(e)),
        };
        ch.release(tag);
        let end = stamp();
        if r.is_ok() {
            record(&Breakdown {
                ops: 1,
                lookup_ns: mapped.saturating_sub(t0),
                submit_ns: submitted
                    .saturating_sub(mapped)
                    .saturating_sub(if opcode == Opcode::Write { copy } else { 0 }),
                copy_ns: copy,
                wait_ns: waited.saturating_sub(submitted),
                device_ns,
                finish_ns: end.saturating_sub(copied),
            });
        }
        r
    }

    /// `pread(2)`: reads at `off` without moving the position; returns bytes read (0 at the
    /// end of the file).
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> Result<usize, ClientError> {
        let mode = self.mode_for(buf.len());
        self.read_at_with(buf, off, mode)
    }

    /// [`File::read_at`] with the completion mode chosen by the caller.
    pub fn read_at_with(
        &self,
        buf: &mut [u8],
        off: u64,
        mode: Completion,
    ) -> Result<usize, ClientError> {
        let t0 = if crate::trace::enabled() {
            crate::trace::stamp()
        } else {
            0
        };
        self.check_access(false)?;
        if buf.is_empty() {
            return Ok(0);
        }
        self.check_range(off, buf.len() as u64, false)?;
        self.h()?;
        let slice = self.ch().slice_size();
        // Fast path: all of it inside the known size, one mapped extent, one slice. A read
        // the cached size would cut short takes the slow path, which asks for the size: the
        // file may have grown through another descriptor.
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if off + buf.len() as u64 <= map.size {
                let n = buf.len();
                if n <= slice {
                    if let Some(dev) = map.single(off, n as u64) {
                        drop(map);
                        match self.one(&mut Io::Read(&mut buf[..n]), dev, mode, t0) {
                            Ok(()) => return Ok(n),
                            Err(Fail::Err(e)) => return Err(e),
                            Err(Fail::Miss(_)) => {
                                let mut f = 0;
                                self.hard_miss_at(off, &mut f)?;
                            }
                        }
                    }
                }
            }
        }
        let mut done = 0usize;
        let mut fruitless = 0u32;
        loop {
            let p = self.prepare_read(off + done as u64, buf.len() - done, &mut fruitless)?;
            if p.len == 0 {
                return Ok(done);
            }
            let part = &mut buf[done..done + p.len];
            for &(h, len) in &p.holes {
                part[h..h + len].fill(0);
            }
            match self.transfer(&mut Io::Read(part), &p.segs, mode) {
                Ok(()) => return Ok(done + p.len),
                Err(Fail::Err(e)) => return Err(e),
                Err(Fail::Miss(i)) => {
                    if i > 0 {
                        fruitless = 0;
                    }
                    done += i;
                    self.hard_miss_at(off + done as u64, &mut fruitless)?;
                }
            }
        }
    }

    /// Maps `[at, at + want)` for a read, looking up what the map lacks: the segments, the
    /// holes to zero, and the bytes the read returns (clipped to the size; 0 at the end).
    pub(crate) fn prepare_read(
        &self,
        at: u64,
        want: usize,
        fruitless: &mut u32,
    ) -> Result<Prepared, ClientError> {
        let mut p = Prepared::default();
        self.prepare_read_into(at, want, fruitless, &mut p)?;
        Ok(p)
    }

    /// [`File::prepare_read`] into `p`, reusing its vectors.
    pub(crate) fn prepare_read_into(
        &self,
        at: u64,
        want: usize,
        fruitless: &mut u32,
        p: &mut Prepared,
    ) -> Result<(), ClientError> {
        // Generation of this request's first lookup: holes looked up since then are trusted.
        let mut fresh: Option<u64> = None;
        let mut asked: Option<u64> = None;
        loop {
            let miss = {
                let map = self.map.read().unwrap_or_else(|e| e.into_inner());
                if at >= map.size {
                    if fresh.is_some() {
                        p.len = 0;
                        p.segs.clear();
                        p.holes.clear();
                        return Ok(());
                    }
                    0
                } else {
                    p.len = (want as u64).min(map.size - at) as usize;
                    match self.plan(&map, at, p.len, fresh, &mut p.segs, &mut p.holes) {
                        // The cached size only cuts a read short once a lookup made for this
                        // read confirmed it, as the kernel reads up to the size of the moment.
                        Plan::Ready if p.len < want && fresh.is_none() => p.len,
                        Plan::Ready => return Ok(()),
                        Plan::Miss(i) => i,
                    }
                }
            };
            let from = at + miss as u64;
            if asked.is_some_and(|a| from <= a) {
                // Looked up here already and still unmapped: another thread's hard miss
                // cleared the map in between.
                self.no_progress(fruitless)?;
            }
            asked = Some(from);
            let (gen, _) = self.lookup(from, (want - miss) as u64, false)?;
            fresh.get_or_insert(gen);
        }
    }

    /// Maps `[off, off + len)` for a write, extending the file (allocating holes, growing the
    /// size) where needed: the segments.
    pub(crate) fn prepare_write(
        &self,
        off: u64,
        len: usize,
        fruitless: &mut u32,
    ) -> Result<Prepared, ClientError> {
        let mut p = Prepared::default();
        self.prepare_write_into(off, len, fruitless, &mut p)?;
        Ok(p)
    }

    /// [`File::prepare_write`] into `p`, reusing its vectors.
    pub(crate) fn prepare_write_into(
        &self,
        off: u64,
        len: usize,
        fruitless: &mut u32,
        p: &mut Prepared,
    ) -> Result<(), ClientError> {
        p.len = len;
        let end = off + len as u64;
        let mut asked: Option<u64> = None;
        loop {
            let miss = {
                let map = self.map.read().unwrap_or_else(|e| e.into_inner());
                match self.plan(&map, off, len, None, &mut p.segs, &mut p.holes) {
                    Plan::Ready if end <= map.size => return Ok(()),
                    Plan::Ready => 0,
                    Plan::Miss(i) => i,
                }
            };
            // Past the end or unmapped: the extend call maps what is allocated, allocates the
            // holes and grows the size, in one round trip.
            let from = off + miss as u64;
            if asked.is_some_and(|a| from <= a) {
                self.no_progress(fruitless)?;
            }
            asked = Some(from);
            self.lookup(from, (len - miss) as u64, true)?;
        }
    }

    fn no_progress(&self, fruitless: &mut u32) -> Result<(), ClientError> {
        *fruitless += 1;
        if *fruitless > MAX_FRUITLESS_MISSES {
            return Err(ClientError::Refused {
                errno: libc::EIO,
                message: "the file's mapping keeps changing under this request".into(),
            });
        }
        std::thread::yield_now();
        Ok(())
    }

    /// `pwrite(2)`: writes all of `data` at `off` without moving the position (on a file
    /// opened for appending, at the end, as Linux does).
    pub fn write_at(&self, data: &[u8], off: u64) -> Result<usize, ClientError> {
        let mode = self.mode_for(data.len());
        self.write_at_with(data, off, mode)
    }

    /// [`File::write_at`] with the completion mode chosen by the caller.
    pub fn write_at_with(
        &self,
        data: &[u8],
        off: u64,
        mode: Completion,
    ) -> Result<usize, ClientError> {
        let at = if self.appends() { None } else { Some(off) };
        self.write_inner(data, at, mode).map(|_| data.len())
    }

    /// Writes `data` at `off`, or at the end with `None`; returns where it landed.
    fn write_inner(
        &self,
        data: &[u8],
        off: Option<u64>,
        mode: Completion,
    ) -> Result<u64, ClientError> {
        let t0 = if crate::trace::enabled() {
            crate::trace::stamp()
        } else {
            0
        };
        self.check_access(true)?;
        let len = data.len() as u64;
        let mut off = match off {
            Some(o) => {
                self.check_range(o, len, true)?;
                o
            }
            None => self.append_at(len)?,
        };
        if data.is_empty() {
            return Ok(off);
        }
        self.h()?;
        let start = off;
        let slice = self.ch().slice_size();
        // Fast path: inside the known size, one mapped extent, one slice.
        if data.len() <= slice {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if off + len <= map.size {
                if let Some(dev) = map.single(off, len) {
                    drop(map);
                    match self.one(&mut Io::Write(data), dev, mode, t0) {
                        Ok(()) => return Ok(start),
                        Err(Fail::Err(e)) => return Err(e),
                        Err(Fail::Miss(_)) => {
                            let mut f = 0;
                            self.hard_miss_at(off, &mut f)?;
                        }
                    }
                }
            }
        }
        let mut data = data;
        let mut fruitless = 0u32;
        loop {
            let p = self.prepare_write(off, data.len(), &mut fruitless)?;
            match self.transfer(&mut Io::Write(data), &p.segs, mode) {
                Ok(()) => return Ok(start),
                Err(Fail::Err(e)) => return Err(e),
                Err(Fail::Miss(i)) => {
                    if i > 0 {
                        fruitless = 0;
                    }
                    off += i as u64;
                    data = &data[i..];
                    self.hard_miss_at(off, &mut fruitless)?;
                }
            }
        }
    }

    /// `read(2)`: reads at the position and advances it.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut pos = self.pos.lock();
        let n = self.read_at(buf, pos.get())?;
        pos.set(pos.get() + n as u64);
        Ok(n)
    }

    /// `write(2)`: writes at the position (at the end when appending) and advances it.
    pub fn write(&self, data: &[u8]) -> Result<usize, ClientError> {
        let mut pos = self.pos.lock();
        let mode = self.mode_for(data.len());
        let at = self.write_inner(data, (!self.appends()).then_some(pos.get()), mode)?;
        pos.set(at + data.len() as u64);
        Ok(data.len())
    }

    /// `preadv(2)`: fills the buffers in order from `off`; stops at the end of the file.
    pub fn read_vectored_at(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        off: u64,
    ) -> Result<usize, ClientError> {
        let mut total = 0usize;
        for b in bufs.iter_mut() {
            if b.is_empty() {
                continue;
            }
            let n = self.read_at(b, off + total as u64)?;
            total += n;
            if n < b.len() {
                break;
            }
        }
        Ok(total)
    }

    /// `pwritev(2)`: writes the buffers in order from `off` (as one write, so an appending
    /// writer's buffers stay together).
    pub fn write_vectored_at(&self, bufs: &[IoSlice<'_>], off: u64) -> Result<usize, ClientError> {
        match bufs.iter().filter(|b| !b.is_empty()).count() {
            0 => Ok(0),
            1 => {
                let b = bufs.iter().find(|b| !b.is_empty()).expect("one buffer");
                self.write_at(b, off)
            }
            _ => self.write_at(&gather(bufs), off),
        }
    }

    /// `readv(2)`.
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize, ClientError> {
        let mut pos = self.pos.lock();
        let n = self.read_vectored_at(bufs, pos.get())?;
        pos.set(pos.get() + n as u64);
        Ok(n)
    }

    /// `writev(2)`.
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> Result<usize, ClientError> {
        let data = gather(bufs);
        self.write(&data)
    }

    /// `lseek(2)`: the new position.
    pub fn seek(&self, to: SeekFrom) -> Result<u64, ClientError> {
        let mut pos = self.pos.lock();
        let new = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::Current(d) => pos.get().checked_add_signed(d),
            SeekFrom::End(d) => self.len()?.checked_add_signed(d),
        };
        match new {
            Some(n) if n <= i64::MAX as u64 => {
                pos.set(n);
                Ok(n)
            }
            _ => Err(errno(libc::EINVAL)),
        }
    }

    /// The position.
    pub fn position(&self) -> u64 {
        self.pos.get()
    }
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("handle", &self.handle.load(Ordering::Relaxed))
            .field("ino", &self.ino)
            .field("read", &self.readable)
            .field("write", &self.writable)
            .field("append", &self.appends())
            .finish()
    }
}

impl std::fmt::Debug for Moneta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moneta")
            .field("channel", &self.inner.cur().id())
            .field("policy", &self.inner.policy)
            .finish()
    }
}

impl Drop for File {
    fn drop(&mut self) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        self.m.inner.open.fetch_sub(1, Ordering::AcqRel);
        // A forked child that never used its connection has nothing to close: the bundle
        // holding its copies goes when the child does.
        if !self.m.inner.fresh() {
            return;
        }
        if let Ok(handle) = self.h() {
            let _ = self.m.fs_empty(FsRequest::Close { handle });
        }
    }
}

impl io::Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        File::read(self, buf).map_err(Into::into)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        File::read_vectored(self, bufs).map_err(Into::into)
    }
}

impl io::Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        File::write(self, buf).map_err(Into::into)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        File::write_vectored(self, bufs).map_err(Into::into)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Seek for &File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        File::seek(self, pos).map_err(Into::into)
    }
}

impl io::Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        File::read(self, buf).map_err(Into::into)
    }
}

impl io::Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        File::write(self, buf).map_err(Into::into)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl io::Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        File::seek(self, pos).map_err(Into::into)
    }
}
