//! A process's connection to `monetad`: [`Moneta`], shared by every thread and every open
//! [`File`](crate::File) of the process. It owns the control socket and the channel that comes
//! with it, answers the path calls (stat, mkdir, rename, ...; opens are `file/open.rs`'s), carries the connection across
//! `fork` (a child connects anew and claims its parent's handles, see [`crate::fork`]) and
//! across a restart of the daemon (the next call connects anew).

use std::collections::HashMap;
use std::io::{self};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use moneta_abi::fsproto::{
    FsDirEntry, FsReply, FsRequest, FsStat, FsStatFs, Target, WireTime, RENAME_NOREPLACE,
};

use crate::channel::Channel;
use crate::control::Control;
use crate::fork::{self, Ticket};
use crate::generation::GenLock;
use crate::policy::Policy;
use crate::{paths, ClientError};

use crate::{bad_reply, errno};

pub(crate) fn path_bytes<P: AsRef<Path>>(p: &P) -> Vec<u8> {
    p.as_ref().as_os_str().as_bytes().to_vec()
}

fn target<P: AsRef<Path>>(p: &P, follow: bool) -> Target {
    Target::Path {
        path: path_bytes(p),
        follow,
    }
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
pub(crate) struct Counters {
    pub(crate) soft_misses: AtomicU64,
    pub(crate) hard_misses: AtomicU64,
    pub(crate) extends: AtomicU64,
    pub(crate) commands: AtomicU64,
    pub(crate) threads_moved: AtomicU64,
    /// The poller's CPU plus one, as the last channel said (0: not pinned).
    pub(crate) device_cpu: AtomicU64,
}

/// A connection, shared by its [`Moneta`] clones and open files.
///
/// After a `fork` the child's copy is *stale* (its generation is not the process's): its first
/// use detaches the parent's channel, connects anew and claims the parent's handles (see
/// [`crate::fork`]). Every channel the connection ever had stays allocated (inert once
/// detached) until the connection is dropped, so references handed out never dangle.
pub(crate) struct Inner {
    pub(crate) socket: PathBuf,
    /// Makes every control connection of this `Moneta`: the first, after a fork and after the
    /// daemon went away ([`Moneta::connect_through`]).
    connector: Connector,
    pub(crate) policy: Policy,
    pub(crate) counters: Counters,
    /// The current channel (one of `state.chans`).
    pub(crate) cur: AtomicPtr<Channel>,
    /// The fork generation `cur` belongs to.
    pub(crate) gen: AtomicU64,
    /// Index of the current channel in `state.chans`.
    pub(crate) epoch: AtomicU64,
    state: GenLock<ConnState>,
    /// A bundle to claim, left by the fork that made this process.
    pub(crate) ticket: GenLock<Option<Ticket>>,
    /// Files open on the connection (a fork with none asks the daemon for nothing).
    pub(crate) open: AtomicUsize,
    /// Paths whose file this process made, then grew in room a size lease gave it: made
    /// again (a rollback journal is, in each transaction), they ask for room at the open
    /// ([`Moneta::open_flags`]). The most recent [`ROOMY_PATHS`].
    roomy: std::sync::Mutex<std::collections::VecDeque<Box<[u8]>>>,
}

/// Paths remembered as growing files ([`Inner::roomy`]).
const ROOMY_PATHS: usize = 8;

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
    /// Whether `path` names a file this process made and grew before ([`Inner::roomy`]).
    pub(crate) fn roomy(&self, path: &[u8]) -> bool {
        let r = self.roomy.lock().unwrap_or_else(|e| e.into_inner());
        r.iter().any(|p| &**p == path)
    }

    /// Remembers that the file this process made at `path` grew in room a size lease gave.
    pub(crate) fn note_roomy(&self, path: Box<[u8]>) {
        let mut r = self.roomy.lock().unwrap_or_else(|e| e.into_inner());
        if r.iter().any(|p| *p == path) {
            return;
        }
        if r.len() == ROOMY_PATHS {
            r.pop_front();
        }
        r.push_back(path);
    }

    /// The current channel: valid once [`Inner::live`] has succeeded in this generation.
    #[inline]
    pub(crate) fn cur(&self) -> &Channel {
        // SAFETY: `cur` points into a box of `state.chans`, which lives as long as `self`.
        unsafe { &*self.cur.load(Ordering::Acquire) }
    }

    /// Whether the current channel belongs to this process.
    #[inline]
    pub(crate) fn fresh(&self) -> bool {
        self.gen.load(Ordering::Acquire) == fork::generation()
    }

    /// The current channel, connecting first in a forked child.
    #[inline]
    pub(crate) fn live(&self) -> Result<&Channel, ClientError> {
        if !self.fresh() {
            self.refresh()?;
        }
        Ok(self.cur())
    }

    /// In a forked child: detaches the parent's channel, connects, claims the bundle.
    pub(crate) fn refresh(&self) -> Result<(), ClientError> {
        let g = fork::generation();
        let mut st = self.state.lock();
        if self.gen.load(Ordering::Acquire) == g {
            return Ok(());
        }
        st.chans.last().expect("a connection").detach();
        let ch = Channel::from_control((self.connector)(&self.socket)?)?;
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

    /// A handle of the connection of channel `from`, carried to the current connection: the
    /// handle there and the current channel's index, or the error its files get when it was
    /// not carried (see `ConnState::remaps`).
    pub(crate) fn carry_handle(&self, from: u64, handle: u64) -> Result<(u64, u64), ClientError> {
        let st = self.state.lock();
        let now = self.epoch.load(Ordering::Acquire);
        let (mut e, mut h) = (from, handle);
        while e < now {
            h = match st.remaps.get(e as usize) {
                Some(Ok(r)) => r.get(&h).copied().ok_or_else(|| errno(libc::EBADF))?,
                Some(Err(lost)) => return Err(errno(*lost)),
                None => return Err(errno(libc::EBADF)),
            };
            e += 1;
        }
        Ok((h, now))
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
        let ch = Channel::from_control((self.connector)(&self.socket)?)?;
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
    pub(crate) fn fs_call_at(&self, req: FsRequest) -> Result<(FsReply, u64), ClientError> {
        let ch = self.live()?;
        let seen = self.epoch.load(Ordering::Acquire);
        let retry = handle_free(&req).then(|| req.clone());
        match ch.fs(req) {
            Ok(reply) => Ok((reply, seen)),
            Err(ClientError::Disconnected) => {
                self.reconnect(seen)?;
                match retry {
                    Some(req) => {
                        let ch = self.live()?;
                        let now = self.epoch.load(Ordering::Acquire);
                        Ok((ch.fs(req)?, now))
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
}

impl fork::Forkable for Inner {
    /// The descriptors of the current channel and its connection.
    fn descriptors(&self) -> Vec<i32> {
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
    fn detach_current(&self) {
        if !self.fresh() {
            self.cur().detach();
        }
    }

    /// Before a fork: a bundle of this connection's handles for the child, if it has any.
    fn prepare_fork(&self) -> Option<Ticket> {
        if self.open.load(Ordering::Acquire) == 0 {
            return None;
        }
        let ch = self.live().ok()?;
        // Handles whose closes are still in flight would go into the bundle.
        ch.freeze_closes();
        let r = ch.control().fs_fork();
        ch.thaw_closes();
        match r {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("libmoneta: a forked child will not inherit its files: {e}");
                None
            }
        }
    }

    /// In a forked child, right after the fork: the bundle to claim.
    fn set_ticket(&self, t: Ticket) {
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

/// What makes a control connection to the daemon at a socket: [`Control::connect`] unless
/// [`Moneta::connect_through`] gave another.
pub type Connector = Arc<dyn Fn(&Path) -> Result<Control, ClientError> + Send + Sync>;

/// A connection to `monetad` and its channel; cheap to clone and shared by threads.
#[derive(Clone)]
pub struct Moneta {
    pub(crate) inner: Arc<Inner>,
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
    pub(crate) mode: u32,
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
        | FsRequest::OpenRoom { .. }
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
        Self::connect_through(socket, policy, Arc::new(Control::connect))
    }

    /// Connects with `connector` making the control connection, now and whenever the
    /// connection is made anew (in a forked child, after the daemon went away). The daemon
    /// knows a connection by the credentials of whoever made it (`SO_PEERCRED`), so a process
    /// that acts for other users (a file-system server) gives a connector that connects with
    /// theirs, and keeps them across a restart of the daemon.
    pub fn connect_through(
        socket: &Path,
        policy: Policy,
        connector: Connector,
    ) -> Result<Moneta, ClientError> {
        let ch = Box::new(Channel::from_control(connector(socket)?)?);
        let counters = Counters::default();
        make_room_for_device(&ch, &counters);
        let inner = Arc::new(Inner {
            socket: socket.to_owned(),
            connector,
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
            roomy: Default::default(),
        });
        fork::register(Arc::downgrade(&inner) as std::sync::Weak<dyn fork::Forkable>);
        Ok(Moneta { inner })
    }

    /// Copies this connection's open handles into a bundle another program image can claim
    /// (the preload shim does this before `exec`).
    #[doc(hidden)]
    pub fn handover(&self) -> Result<Handover, ClientError> {
        let ch = self.inner.live()?;
        // Handles whose closes are still in flight would go into the bundle.
        ch.freeze_closes();
        let t = ch.control().fs_fork();
        ch.thaw_closes();
        let t = t?;
        // The next program image (started by a `vfork` child, perhaps, whose parent goes on)
        // shares the open files' descriptions from now on: their closes wait for answers.
        crate::generation::note_handover();
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

    pub(crate) fn fs(&self, req: FsRequest) -> Result<FsReply, ClientError> {
        self.inner.fs_call(req)
    }

    pub(crate) fn fs_empty(&self, req: FsRequest) -> Result<(), ClientError> {
        self.fs(req).map(|_| ())
    }

    pub(crate) fn fs_stat_reply(&self, req: FsRequest) -> Result<FsStat, ClientError> {
        match self.fs(req)? {
            FsReply::Stat(s) => Ok(s),
            _ => Err(bad_reply("stat reply")),
        }
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

impl std::fmt::Debug for Moneta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Moneta")
            .field("channel", &self.inner.cur().id())
            .field("policy", &self.inner.policy)
            .finish()
    }
}
