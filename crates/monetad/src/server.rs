//! The control server: `monetad`'s Unix socket.
//!
//! Each connection is served by its own thread. The peer's credentials come from `SO_PEERCRED`
//! at accept time and decide what it may do: anyone may open a channel and read the counters;
//! administrative grants, revocations and shutdown are limited to the daemon's own user and
//! root. Every other user holds at most a share of the channels and connections ([`Shares`]),
//! so no user can lock the others out. A connection owns at most one channel; when the
//! connection closes, for whatever reason
//! (exit, crash, kill), its channel is reclaimed. Nothing a client sends is trusted: every
//! message is decoded from bytes, malformed ones get an `EPROTO` reply, and a connection that
//! keeps sending them is dropped.

use std::collections::HashMap;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use moneta_abi::control::{
    self, decode_request, encode_reply, errno, peek_header, Failure, ReplyBody, Request,
    MAX_MESSAGE,
};
use moneta_abi::fsproto::{FsReply, FsRequest};
use moneta_abi::kfsproto::{KfsReply, KfsRequest};
use moneta_device::{Device, DeviceError, TableOp};

use crate::manager::{Manager, Session};
use rustix::net::{
    RecvAncillaryBuffer, RecvFlags, ReturnFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

/// How long a connection's thread polls for the next request before sleeping.
pub const REQUEST_SPIN: Duration = Duration::from_micros(50);
/// Malformed messages a connection may send before it is dropped.
pub const MAX_PROTOCOL_ERRORS: u32 = 64;
/// Connections served at once beyond the channel limit (status queries, administration).
pub const EXTRA_CONNECTIONS: usize = 64;
/// Connections over the limit being answered `EMFILE` at once; more are closed unanswered.
pub const MAX_REFUSERS: usize = 16;
/// Connections a user may hold beyond their share of channels (status queries, a second
/// connection while one is closing).
pub const EXTRA_USER_CONNECTIONS: usize = 16;

/// How much of the daemon one user may hold, so that no user locks the others out. The
/// daemon's own user and root are not limited by it: they administer the daemon, and a daemon
/// that serves only its own user (the default, see `--socket-mode`) has no one to share with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    /// Channels one user may hold at once.
    pub channels: usize,
    /// Connections one user may hold at once.
    pub connections: usize,
}

impl Shares {
    /// The default for a device of `max_channels`: half the channels each, so one user always
    /// leaves room for others.
    pub fn for_channels(max_channels: usize) -> Shares {
        let channels = (max_channels / 2).max(1);
        Shares {
            channels,
            connections: channels + EXTRA_USER_CONNECTIONS,
        }
    }
}

/// What each user holds now.
#[derive(Default, Debug, Clone, Copy)]
struct Held {
    connections: usize,
    channels: usize,
}

/// Why the daemon stops.
#[derive(Debug)]
pub enum Stop {
    /// A client asked (and the device has already shut down).
    Requested,
    /// A signal.
    Signal(i32),
}

/// The control server.
pub struct Server {
    device: Arc<Device>,
    manager: Option<Arc<Manager>>,
    owner_uid: u32,
    max_connections: usize,
    connections: AtomicUsize,
    shares: Shares,
    held: Mutex<HashMap<u32, Held>>,
    refusers: AtomicUsize,
    stopping: AtomicBool,
    stop: mpsc::Sender<Stop>,
    /// Whether connection threads poll for a client's next request before sleeping
    /// ([`REQUEST_SPIN`]); see [`libmoneta::affinity::worth_polling`].
    poll: bool,
    /// The socket path, for messages.
    pub socket: PathBuf,
    /// The files of a kernel file system on the array (`--kernel-fs`).
    kernel_files: Option<Arc<crate::kernelfs::Files>>,
    /// Names connections for the kernel file system's handles.
    next_conn: std::sync::atomic::AtomicU64,
    /// The shared file system: this host's manager serving the members, or the manager this
    /// member host asks (docs/distributed.md).
    share: Option<Share>,
}

/// This daemon's part in a file system shared by several hosts.
#[derive(Clone)]
pub enum Share {
    /// It holds the file system and answers the members.
    Holder(Arc<crate::share::Holder>),
    /// Its clients' file-system calls go to another host's manager.
    Member(Arc<crate::share::Member>),
}

fn fail(errno: i32, message: impl Into<String>) -> Failure {
    Failure {
        errno,
        message: message.into(),
    }
}

fn device_failure(e: DeviceError) -> Failure {
    let errno = match &e {
        DeviceError::TooManyChannels(_) => errno::EMFILE,
        DeviceError::NoSuchChannel(_) => errno::ENOENT,
        DeviceError::OutOfRange { .. } => errno::ERANGE,
        DeviceError::Table(_) | DeviceError::Config(_) => errno::EINVAL,
        DeviceError::Stopped => errno::EBUSY,
        DeviceError::Io(_) | DeviceError::Errno(_) => errno::ENOMEM,
    };
    fail(errno, e.to_string())
}

/// The connection's session; its state stays consistent between calls, so a panic elsewhere
/// leaves it usable.
fn lock_session(s: &Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

struct Conn {
    /// This server's name for the connection.
    id: u64,
    fd: OwnedFd,
    uid: u32,
    pid: i32,
    channel: Option<u32>,
    protocol_errors: u32,
    /// Shared with the poller, which answers some file calls through the channel.
    session: Arc<Mutex<Session>>,
    /// On a member host: the client's calls to the manager's host.
    proxy: Option<crate::share::Proxy>,
}

impl Server {
    /// A server for `device`, answering to `owner_uid` for administration.
    pub fn new(
        device: Arc<Device>,
        manager: Option<Arc<Manager>>,
        owner_uid: u32,
        socket: PathBuf,
        stop: mpsc::Sender<Stop>,
    ) -> Server {
        let max_connections = device.config().max_channels + EXTRA_CONNECTIONS;
        let shares = Shares::for_channels(device.config().max_channels);
        Server {
            device,
            manager,
            owner_uid,
            max_connections,
            connections: AtomicUsize::new(0),
            shares,
            held: Mutex::new(HashMap::new()),
            refusers: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            stop,
            poll: true,
            socket,
            kernel_files: None,
            next_conn: std::sync::atomic::AtomicU64::new(1),
            share: None,
        }
    }

    /// This daemon's part in a shared file system.
    pub fn share(mut self, share: Option<Share>) -> Server {
        self.share = share;
        self
    }

    /// Serves the files of a kernel file system on the array.
    pub fn kernel_files(mut self, files: Option<Arc<crate::kernelfs::Files>>) -> Server {
        self.kernel_files = files;
        self
    }

    /// Each user's share of channels and connections (the daemon's user and root are not
    /// limited).
    pub fn shares(mut self, shares: Shares) -> Server {
        self.shares = shares;
        self
    }

    fn is_admin(&self, uid: u32) -> bool {
        uid == self.owner_uid || uid == 0
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Held>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a connection of `uid` against its share; the message says why not.
    fn take_connection(&self, uid: u32) -> Result<(), String> {
        if self.is_admin(uid) {
            return Ok(());
        }
        let mut held = self.held();
        let h = held.entry(uid).or_default();
        if h.connections >= self.shares.connections {
            return Err(format!(
                "uid {uid} already holds {} connections to monetad, its share \
                 (--user-connections); close some and try again",
                h.connections
            ));
        }
        h.connections += 1;
        Ok(())
    }

    /// Gives back what a closed connection of `uid` held.
    fn give_back(&self, uid: u32, had_channel: bool) {
        if self.is_admin(uid) {
            return;
        }
        let mut held = self.held();
        if let Some(h) = held.get_mut(&uid) {
            h.connections = h.connections.saturating_sub(1);
            if had_channel {
                h.channels = h.channels.saturating_sub(1);
            }
            if h.connections == 0 && h.channels == 0 {
                held.remove(&uid);
            }
        }
    }

    /// Counts a channel of `uid` against its share.
    fn take_channel(&self, uid: u32) -> Result<(), Failure> {
        if self.is_admin(uid) {
            return Ok(());
        }
        let mut held = self.held();
        let h = held.entry(uid).or_default();
        if h.channels >= self.shares.channels {
            return Err(fail(
                errno::EMFILE,
                format!(
                    "uid {uid} already holds {} channels, its share of this daemon's {} \
                     (--user-channels); close files in other processes and try again",
                    h.channels,
                    self.device.config().max_channels
                ),
            ));
        }
        h.channels += 1;
        Ok(())
    }

    /// Returns a channel counted by [`Server::take_channel`] that was not opened after all.
    fn untake_channel(&self, uid: u32) {
        if self.is_admin(uid) {
            return;
        }
        if let Some(h) = self.held().get_mut(&uid) {
            h.channels = h.channels.saturating_sub(1);
        }
    }

    /// Whether connection threads poll for the next request (the default) or sleep at once:
    /// when they share their only CPU with the clients, polling takes it from the client
    /// computing that request.
    pub fn polling(mut self, poll: bool) -> Server {
        self.poll = poll;
        self
    }

    /// Accepts connections on `listener` until the daemon stops.
    pub fn serve(self: Arc<Self>, listener: OwnedFd) {
        loop {
            let conn = match rustix::net::accept_with(&listener, rustix::net::SocketFlags::CLOEXEC)
            {
                Ok(c) => c,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            if self.stopping.load(Ordering::Relaxed) {
                continue;
            }
            let cred = match peer_cred(&conn) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!("no peer credentials: {e}");
                    continue;
                }
            };
            let _ = rustix::net::sockopt::set_socket_timeout(
                &conn,
                rustix::net::sockopt::Timeout::Send,
                Some(Duration::from_secs(5)),
            );
            // The daemon's user and root always get in (up to EXTRA_CONNECTIONS more), so a
            // user holding every slot cannot lock out administration.
            let admin = self.is_admin(cred.uid);
            let limit = if admin {
                self.max_connections + EXTRA_CONNECTIONS
            } else {
                self.max_connections
            };
            if self.connections.fetch_add(1, Ordering::AcqRel) >= limit {
                self.connections.fetch_sub(1, Ordering::AcqRel);
                self.refuse(
                    conn,
                    format!(
                        "monetad serves at most {} connections; try again later",
                        self.max_connections
                    ),
                );
                continue;
            }
            if let Err(why) = self.take_connection(cred.uid) {
                self.connections.fetch_sub(1, Ordering::AcqRel);
                tracing::info!(uid = cred.uid, pid = cred.pid, "connection refused: {why}");
                self.refuse(conn, why);
                continue;
            }
            let me = self.clone();
            let uid = cred.uid;
            let c = Conn {
                id: self.next_conn.fetch_add(1, Ordering::Relaxed),
                fd: conn,
                uid: cred.uid,
                pid: cred.pid,
                channel: None,
                protocol_errors: 0,
                proxy: match &self.share {
                    Some(Share::Member(_)) => Some(crate::share::Proxy::new(
                        moneta_fs::Cred {
                            uid: cred.uid,
                            gid: cred.gid,
                            groups: cred.groups.clone(),
                        },
                        cred.pid,
                    )),
                    _ => None,
                },
                session: Session::new(moneta_fs::Cred {
                    uid: cred.uid,
                    gid: cred.gid,
                    groups: cred.groups,
                })
                .with_pid(cred.pid)
                .shared(),
            };
            let spawned = std::thread::Builder::new()
                .name("moneta-conn".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    let had_channel = me.connection(c);
                    me.give_back(uid, had_channel);
                    me.connections.fetch_sub(1, Ordering::AcqRel);
                });
            if let Err(e) = spawned {
                tracing::error!("cannot start a connection thread: {e}");
                self.give_back(uid, false);
                self.connections.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Answers a connection that may not be served with one `EMFILE` reply, on a short-lived
    /// thread so a silent client cannot stall accepting; past [`MAX_REFUSERS`] at once, it is
    /// just closed.
    fn refuse(self: &Arc<Self>, conn: OwnedFd, why: String) {
        if self.refusers.fetch_add(1, Ordering::AcqRel) < MAX_REFUSERS {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("moneta-refuse".into())
                .stack_size(64 << 10)
                .spawn(move || {
                    refuse_busy(&conn, &why);
                    me.refusers.fetch_sub(1, Ordering::AcqRel);
                });
            if spawned.is_err() {
                self.refusers.fetch_sub(1, Ordering::AcqRel);
            }
        } else {
            self.refusers.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Serves one connection until it closes; whether it held a channel.
    fn connection(&self, mut c: Conn) -> bool {
        tracing::debug!(pid = c.pid, uid = c.uid, "client connected");
        let mut buf = vec![0u8; MAX_MESSAGE + 1];
        loop {
            let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
            let mut cmsg = RecvAncillaryBuffer::new(&mut space);
            // After answering, poll briefly for the next request before sleeping: a client
            // making calls back to back then never waits for this thread to be woken.
            let spin = if self.poll {
                REQUEST_SPIN
            } else {
                Duration::ZERO
            };
            let r = libmoneta::control::recvmsg_polling(&c.fd, &mut buf, &mut cmsg, spin);
            // Descriptors a client sends: only KFS_OPEN takes one; the request's handler drops
            // (closes) any other.
            let mut fds = Vec::new();
            for m in cmsg.drain() {
                if let rustix::net::RecvAncillaryMessage::ScmRights(it) = m {
                    fds.extend(it);
                }
            }
            let Ok(r) = r else { break };
            if r.bytes == 0 {
                break;
            }
            let msg = &buf[..r.bytes];
            let oversize = r.flags.contains(ReturnFlags::TRUNC) || r.bytes > MAX_MESSAGE;
            let decoded = if oversize {
                Err(control::Error::TooLong)
            } else {
                decode_request(msg)
            };
            match decoded {
                Ok((seq, req)) => {
                    let op = req.op();
                    let (result, fds) = self.handle(&mut c, req, fds);
                    if self.reply(&c, op, seq, &result, &fds).is_err() {
                        break;
                    }
                    if op == control::OP_SHUTDOWN && result.is_ok() {
                        let _ = self.stop.send(Stop::Requested);
                    }
                }
                Err(e) => {
                    c.protocol_errors += 1;
                    let (op, seq) = peek_header(msg).unwrap_or((0, 0));
                    tracing::debug!(pid = c.pid, "malformed control message: {e}");
                    let f = Err(fail(errno::EPROTO, format!("malformed request: {e}")));
                    if self
                        .reply(&c, op & !control::REPLY_BIT, seq, &f, &[])
                        .is_err()
                        || c.protocol_errors >= MAX_PROTOCOL_ERRORS
                    {
                        break;
                    }
                }
            }
        }
        if let Some(m) = &self.manager {
            // Before the channel goes: its id may be given to another connection at once.
            m.unpublish(&mut lock_session(&c.session));
        }
        if let Some(files) = &self.kernel_files {
            // Before the channel goes, as its id may be given to another connection at once.
            files.end_connection(c.id, c.channel);
        }
        let had_channel = c.channel.is_some();
        if let Some(id) = c.channel.take() {
            match self.device.close_channel(id) {
                Ok(()) => tracing::debug!(pid = c.pid, channel = id, "channel reclaimed"),
                Err(e) => tracing::debug!(channel = id, "channel reclaim: {e}"),
            }
        }
        if let Some(m) = &self.manager {
            m.end_session(&mut lock_session(&c.session));
        }
        had_channel
    }

    fn reply(
        &self,
        c: &Conn,
        op: u16,
        seq: u32,
        result: &Result<ReplyBody, Failure>,
        fds: &[OwnedFd],
    ) -> rustix::io::Result<()> {
        let bytes = encode_reply(op, seq, result);
        let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        if !borrowed.is_empty() {
            cmsg.push(SendAncillaryMessage::ScmRights(&borrowed));
        }
        rustix::net::sendmsg(
            &c.fd,
            &[IoSlice::new(&bytes)],
            &mut cmsg,
            SendFlags::NOSIGNAL,
        )
        .map(|_| ())
    }

    fn admin(&self, c: &Conn) -> Result<(), Failure> {
        if self.is_admin(c.uid) {
            Ok(())
        } else {
            Err(fail(
                errno::EPERM,
                format!(
                    "administrative requests are limited to the daemon's user (uid {}) and root",
                    self.owner_uid
                ),
            ))
        }
    }

    fn handle(
        &self,
        c: &mut Conn,
        req: Request,
        mut passed: Vec<OwnedFd>,
    ) -> (Result<ReplyBody, Failure>, Vec<OwnedFd>) {
        let empty = |r: Result<(), Failure>| (r.map(|()| ReplyBody::Empty), Vec::new());
        match req {
            Request::Kfs(k) => {
                let Some(files) = &self.kernel_files else {
                    return empty(Err(fail(
                        errno::EOPNOTSUPP,
                        "this daemon serves no kernel file system (start it with --kernel-fs)",
                    )));
                };
                let r = match k {
                    KfsRequest::Open => match (passed.pop(), passed.is_empty()) {
                        (Some(fd), true) => files.open(c.id, fd),
                        _ => Err(fail(
                            errno::EINVAL,
                            "KFS_OPEN carries exactly one descriptor (SCM_RIGHTS)",
                        )),
                    },
                    KfsRequest::Map {
                        handle,
                        offset,
                        len,
                    } => files.map(c.id, c.channel, handle, offset, len),
                    KfsRequest::Allocate {
                        handle,
                        offset,
                        len,
                    } => files.allocate(c.id, c.channel, handle, offset, len),
                    KfsRequest::Close { handle } => files
                        .close(c.id, c.channel, handle)
                        .map(|()| KfsReply::Closed),
                    KfsRequest::Info => Ok(files.info()),
                };
                (r.map(ReplyBody::Kfs), Vec::new())
            }
            Request::Ping => empty(Ok(())),
            Request::Status => (Ok(ReplyBody::Status(self.device.report())), Vec::new()),
            Request::Model => {
                let mut pairs = self.device.model_report();
                match &self.share {
                    Some(Share::Holder(h)) => pairs.extend(h.report()),
                    Some(Share::Member(m)) => pairs.extend(m.report()),
                    None => {}
                }
                (
                    Ok(ReplyBody::Model(moneta_abi::control::ModelReport { pairs })),
                    Vec::new(),
                )
            }
            Request::OpenChannel { abi_version } => {
                if abi_version != moneta_abi::ABI_VERSION {
                    return empty(Err(fail(
                        errno::EPROTONOSUPPORT,
                        format!(
                            "client speaks channel ABI {abi_version}, this daemon speaks {}",
                            moneta_abi::ABI_VERSION
                        ),
                    )));
                }
                if c.channel.is_some() {
                    return empty(Err(fail(
                        errno::EEXIST,
                        "this connection already has a channel; open another connection",
                    )));
                }
                if let Err(f) = self.take_channel(c.uid) {
                    tracing::info!(pid = c.pid, uid = c.uid, "channel refused: {}", f.message);
                    return empty(Err(f));
                }
                // The daemon's own user and root are not held to a share of the table.
                let owner = (!self.is_admin(c.uid)).then_some(c.uid);
                match self.device.open_channel_for(owner) {
                    Ok(opened) => {
                        c.channel = Some(opened.id);
                        tracing::debug!(pid = c.pid, channel = opened.id, "channel opened");
                        (
                            Ok(ReplyBody::Channel(opened.info)),
                            vec![opened.memfd, opened.kick],
                        )
                    }
                    Err(e) => {
                        self.untake_channel(c.uid);
                        tracing::info!(pid = c.pid, "channel refused: {e}");
                        empty(Err(device_failure(e)))
                    }
                }
            }
            Request::Grant(g) => empty(self.admin(c).and_then(|()| {
                if let Some(Share::Member(m)) = &self.share {
                    if m.overlaps(g.start, g.len) {
                        return Err(fail(
                            errno::EPERM,
                            "the range holds the shared file system's array: its manager alone \
                             grants records there",
                        ));
                    }
                }
                self.device
                    .update(vec![TableOp::Insert {
                        channel: g.channel,
                        start: g.start,
                        len: g.len,
                        rights: g.rights as u8,
                        file: g.file,
                    }])
                    .map_err(device_failure)
            })),
            Request::Revoke {
                channel,
                start,
                len,
            } => empty(self.admin(c).and_then(|()| {
                self.device
                    .update(vec![TableOp::RemoveRange {
                        channel,
                        start,
                        len,
                    }])
                    .map_err(device_failure)
            })),
            Request::RevokeFile { channel, file } => empty(self.admin(c).and_then(|()| {
                self.device
                    .update(vec![TableOp::RemoveFile { channel, file }])
                    .map_err(device_failure)
            })),
            Request::Fs(f) if self.manager.is_none() && c.proxy.is_some() => {
                let Some(Share::Member(m)) = &self.share else {
                    unreachable!("a proxy is made for a member host's connections only")
                };
                let proxy = c.proxy.as_mut().expect("checked above");
                match proxy.call(m, c.channel, 0, f) {
                    Ok((reply, pipe)) => (Ok(ReplyBody::Fs(reply)), pipe.into_iter().collect()),
                    Err(f) => empty(Err(f)),
                }
            }
            Request::Fs(f) => {
                let Some(m) = &self.manager else {
                    return empty(Err(fail(
                        errno::EOPNOTSUPP,
                        "this daemon serves no nvfs (it runs with --raw or --kernel-fs)",
                    )));
                };
                // The calls answered with a descriptor, then every other.
                let with_fd = match f {
                    FsRequest::Fork => m.fork(&lock_session(&c.session)),
                    FsRequest::Durable => m.durable_page().map(|fd| (FsReply::Empty, fd)),
                    FsRequest::Map { handle, write } => {
                        m.map(&mut lock_session(&c.session), c.channel, handle, write)
                    }
                    f => {
                        return (
                            m.call(&mut lock_session(&c.session), c.channel, f)
                                .map(ReplyBody::Fs),
                            Vec::new(),
                        )
                    }
                };
                match with_fd {
                    Ok((reply, fd)) => (Ok(ReplyBody::Fs(reply)), vec![fd]),
                    Err(f) => empty(Err(f)),
                }
            }
            Request::Shutdown => empty(self.admin(c).and_then(|()| {
                self.stopping.store(true, Ordering::Relaxed);
                tracing::info!(pid = c.pid, "shutdown requested");
                self.device.shutdown().map_err(device_failure)
            })),
        }
    }
}

/// A peer's credentials as `SO_PEERCRED` and `SO_PEERGROUPS` give them.
struct PeerCred {
    pid: i32,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

fn peer_cred(fd: &OwnedFd) -> std::io::Result<PeerCred> {
    let c = libmoneta::trust::peer_cred(fd)?;
    Ok(PeerCred {
        pid: c.pid,
        uid: c.uid,
        gid: c.gid,
        groups: peer_groups(fd)?,
    })
}

/// Reads `SO_PEERGROUPS`: the peer's supplementary groups at connect time.
fn peer_groups(fd: &OwnedFd) -> std::io::Result<Vec<u32>> {
    use std::os::fd::AsRawFd;
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is valid for writes of `len` bytes; `fd` is an open socket.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = len as usize / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ERANGE) && n > groups.len() && n <= 1 << 16 {
            groups.resize(n, 0);
            continue;
        }
        return Err(err);
    }
}

/// Answers a connection that may not be served with one `EMFILE` reply to its first request.
fn refuse_busy(conn: &OwnedFd, why: &str) {
    let _ = rustix::net::sockopt::set_socket_timeout(
        conn,
        rustix::net::sockopt::Timeout::Recv,
        Some(Duration::from_millis(100)),
    );
    let mut buf = [0u8; 64];
    let (op, seq) = match rustix::net::recv(conn, &mut buf, RecvFlags::empty()) {
        Ok((n, _)) => peek_header(&buf[..n.min(64)]).unwrap_or((0, 0)),
        Err(_) => (0, 0),
    };
    let msg = encode_reply(
        op & !control::REPLY_BIT,
        seq,
        &Err(fail(errno::EMFILE, why)),
    );
    let _ = rustix::net::send(conn, &msg, SendFlags::NOSIGNAL | SendFlags::DONTWAIT);
}
