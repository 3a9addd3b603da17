//! A member host: its clients' file-system calls go to the manager's host, and the records
//! the answers allow are installed in the clients' channels here.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use moneta_abi::control::{
    decode_reply, encode_request, errno, Failure, ReplyBody, Request, RIGHT_READ, RIGHT_WRITE,
};
use moneta_abi::fsproto::{FsReply, FsRequest, HOLE};
use moneta_device::{Device, TableOp};
use rustix::event::epoll;

use super::link::{Key, Link};
use super::{Hello, Note, LEASE, PING_EVERY};

/// How long a connection to the manager's host may take.
const CONNECT_WAIT: Duration = Duration::from_secs(2);
/// Between attempts to reach the manager's host.
const RETRY: Duration = Duration::from_millis(500);

/// The member's own connection, while it stands.
struct Joined {
    id: u64,
    link: Arc<Link>,
    /// Counts the member's connections: a session belongs to one.
    epoch: u64,
    /// The last revocation being applied or applied on this connection: no answer decided
    /// before it installs records any more.
    revoking: u64,
    sessions: Vec<Weak<Link>>,
}

#[derive(Default)]
struct State {
    joined: Option<Joined>,
    epoch: u64,
    last_error: String,
}

/// The member's side of the shared file system (`monetad --share-from`).
pub struct Member {
    key: Key,
    manager: String,
    device: Arc<Device>,
    /// The address space's ranges other members hold: records of the shared file system lie
    /// only there, and a fence removes every record over them.
    ranges: Vec<(u64, u64)>,
    state: Mutex<State>,
    revocations: AtomicU64,
    fences: AtomicU64,
    connects: AtomicU64,
    calls: AtomicU64,
    stop: AtomicBool,
    /// The longest a command of this member waits for the manager's array: its fence's bound,
    /// which the manager's host is told.
    fence_bound: Duration,
    /// Forwarded writes given up on while they may have been on their way
    /// ([`moneta_device::Device::forward_uncertain_writes`]) when the last revocation was
    /// answered.
    uncertain_told: AtomicU64,
    /// Pings sent and when, for the lease: it runs from the sending of the last one answered.
    pings: Mutex<std::collections::VecDeque<(u64, Instant)>>,
    /// This host's side of its clients' fork bundles, by bundle.
    forks: Mutex<HashMap<u64, Fork>>,
    /// Hang-ups of the bundles' pipes (read ends), by bundle.
    hangups: OwnedFd,
}

/// A fork bundle of a client of this host: the pipe whose write end the forking process and
/// its child hold, and what each bundled handle was, for the child's claim.
struct Fork {
    read: OwnedFd,
    uid: u32,
    handles: HashMap<u64, (u64, u32)>,
}

/// Most fork bundles of this host's clients waiting at once, in all and per user (as the
/// manager's host counts its own).
const MAX_FORKS: usize = 4096;
const MAX_FORKS_PER_UID: usize = 1024;

impl Member {
    /// Joins the file system whose manager listens at `manager` (HOST:PORT), over a link keyed
    /// with `key`; `ranges` are the parts of `device`'s address space that members hold.
    pub fn start(
        manager: &str,
        key: Key,
        device: Arc<Device>,
        ranges: Vec<(u64, u64)>,
        fence_bound: Duration,
    ) -> Result<Arc<Member>, String> {
        if ranges.is_empty() {
            return Err(
                "--share-from needs --member: the manager's array must be in the address space"
                    .into(),
            );
        }
        let m = Arc::new(Member {
            key,
            manager: manager.to_string(),
            device,
            ranges,
            state: Mutex::new(State::default()),
            revocations: AtomicU64::new(0),
            fences: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            fence_bound,
            uncertain_told: AtomicU64::new(0),
            pings: Mutex::new(std::collections::VecDeque::new()),
            forks: Mutex::new(HashMap::new()),
            hangups: epoll::create(epoll::CreateFlags::CLOEXEC)
                .map_err(|e| format!("epoll_create: {e}"))?,
        });
        let me = m.clone();
        std::thread::Builder::new()
            .name("moneta-share".into())
            .spawn(move || me.run())
            .map_err(|e| format!("cannot start the share link: {e}"))?;
        let me = m.clone();
        std::thread::Builder::new()
            .name("moneta-share-forks".into())
            .spawn(move || me.reap())
            .map_err(|e| format!("cannot start the fork-bundle watcher: {e}"))?;
        Ok(m)
    }

    fn forks(&self) -> MutexGuard<'_, HashMap<u64, Fork>> {
        self.forks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A bundle the manager's host made for a client here: its pipe, watched for the hang-up
    /// that lets the manager's host free it, and what its handles are. The pipe's write end,
    /// for the client.
    fn forked(
        &self,
        bundle: u64,
        uid: u32,
        handles: HashMap<u64, (u64, u32)>,
    ) -> Result<OwnedFd, Failure> {
        let r = self.watch_fork(bundle, uid, handles);
        if r.is_err() {
            // The manager's host made the bundle: it must hear that nobody here will claim it.
            self.release(bundle);
        }
        r
    }

    fn watch_fork(
        &self,
        bundle: u64,
        uid: u32,
        handles: HashMap<u64, (u64, u32)>,
    ) -> Result<OwnedFd, Failure> {
        let mut forks = self.forks();
        if forks.len() >= MAX_FORKS
            || forks.values().filter(|f| f.uid == uid).count() >= MAX_FORKS_PER_UID
        {
            return Err(fail(
                errno::EAGAIN,
                "too many fork bundles wait to be claimed; try again later",
            ));
        }
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(|e| fail(errno::EMFILE, format!("cannot make a pipe: {e}")))?;
        epoll::add(
            &self.hangups,
            &read,
            epoll::EventData::new_u64(bundle),
            epoll::EventFlags::empty(),
        )
        .map_err(|e| fail(errno::EIO, format!("cannot watch a bundle's pipe: {e}")))?;
        forks.insert(bundle, Fork { read, uid, handles });
        Ok(write)
    }

    /// Tells the manager's host that nobody here holds bundle `bundle` any more.
    fn release(&self, bundle: u64) {
        let link = self.state().joined.as_ref().map(|j| j.link.clone());
        if let Some(l) = link {
            let _ = l.send(&Note::Release { bundle }.encode());
        }
    }

    /// Lets bundles go whose pipes hung up (every process holding the write end is gone, or
    /// closed it after claiming), telling the manager's host.
    fn reap(self: Arc<Self>) {
        let mut space = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 64];
        loop {
            let ids: Vec<u64> = match epoll::wait(&self.hangups, &mut space, None) {
                Ok((events, _)) => events.iter().map(|ev| ev.data.u64()).collect(),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    tracing::error!("the fork-bundle watcher stops: {e}");
                    return;
                }
            };
            for bundle in ids {
                if let Some(f) = self.forks().remove(&bundle) {
                    let _ = epoll::delete(&self.hangups, &f.read);
                }
                self.release(bundle);
            }
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn connect(&self) -> Result<Link, String> {
        let addrs: Vec<SocketAddr> = self
            .manager
            .to_socket_addrs()
            .map_err(|e| format!("{}: {e}", self.manager))?
            .collect();
        let mut last = format!("{}: no address", self.manager);
        for a in addrs {
            match TcpStream::connect_timeout(&a, CONNECT_WAIT) {
                Ok(s) => return Link::connect(s, &self.key).map_err(|e| format!("{a}: {e}")),
                Err(e) => last = format!("{a}: {e}"),
            }
        }
        Err(last)
    }

    /// The member's own connection, made again whenever it fails.
    fn run(self: Arc<Self>) {
        while !self.stop.load(Ordering::Relaxed) {
            let link = match self.connect() {
                Ok(l) => Arc::new(l),
                Err(e) => {
                    self.state().last_error = e;
                    std::thread::sleep(RETRY);
                    continue;
                }
            };
            let id = loop {
                let mut b = [0u8; 8];
                if rustix::rand::getrandom(&mut b, rustix::rand::GetRandomFlags::empty()).is_ok() {
                    break u64::from_le_bytes(b);
                }
            };
            let hello = Hello::Member {
                id,
                fence_ms: self.fence_bound.as_millis() as u64,
            };
            let hello_at = Instant::now();
            if let Err(e) = self.welcome(&link, hello) {
                link.shutdown();
                self.state().last_error = e;
                std::thread::sleep(RETRY);
                continue;
            }
            self.pings().clear();
            // Writes given up before this connection were the manager's to cut off when it
            // counted the last one gone.
            self.uncertain_told
                .store(self.device.forward_uncertain_writes(), Ordering::SeqCst);
            // The lease runs from the hello, which the manager's host heard before it counted
            // this member in.
            self.device.lease_forwarding(hello_at + LEASE);
            {
                let mut st = self.state();
                st.epoch += 1;
                let epoch = st.epoch;
                st.joined = Some(Joined {
                    id,
                    link: link.clone(),
                    epoch,
                    revoking: 0,
                    sessions: Vec::new(),
                });
                st.last_error.clear();
            }
            self.connects.fetch_add(1, Ordering::Relaxed);
            tracing::info!(manager = %self.manager, "joined the shared file system");
            let pinger = {
                let link = link.clone();
                std::thread::Builder::new()
                    .name("moneta-share-ping".into())
                    .spawn({
                        let me = self.clone();
                        move || {
                            for n in 1.. {
                                me.pings().push_back((n, Instant::now()));
                                if me.pings().len() > 64 {
                                    me.pings().pop_front();
                                }
                                if link.send(&Note::Ping { n }.encode()).is_err() {
                                    break;
                                }
                                std::thread::sleep(PING_EVERY);
                            }
                        }
                    })
            };
            let why = self.listen(&link, hello_at);
            link.shutdown();
            self.fence(&why);
            if let Ok(p) = pinger {
                let _ = p.join();
            }
            std::thread::sleep(RETRY);
        }
    }

    fn pings(&self) -> MutexGuard<'_, std::collections::VecDeque<(u64, Instant)>> {
        self.pings.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Says hello and waits for the manager's host to register this member; checks that its
    /// array is where this device's member ranges put it.
    fn welcome(&self, link: &Link, hello: Hello) -> Result<(), String> {
        link.send(&hello.encode())
            .map_err(|e| format!("the manager's host: {e}"))?;
        let note = link
            .receive(Some(super::link::HANDSHAKE))
            .map_err(|e| format!("the manager's host did not take this member: {e}"))?;
        match Note::decode(&note) {
            Some(Note::Welcome { array_size }) if self.inside(0, array_size) => Ok(()),
            Some(Note::Welcome { array_size }) => Err(format!(
                "the manager's array is {array_size} bytes, at [0, {array_size}) of the address \
                 space, which this device's --member ranges do not hold"
            )),
            _ => Err("the manager's host answered no welcome".into()),
        }
    }

    /// Takes the manager's notes until the connection fails or no ping has been answered for
    /// a lease (counted from the sending of the last ping answered, so a member never believes
    /// in a lease longer than the manager's host counts it).
    fn listen(&self, link: &Link, joined_at: Instant) -> String {
        let mut since = joined_at;
        loop {
            let left = LEASE.saturating_sub(since.elapsed());
            let note = match link.receive(Some(left.max(Duration::from_millis(1)))) {
                Ok(b) => Note::decode(&b),
                // Frames already queued are read before the lease is judged, so a revocation
                // that took long to apply does not count against it.
                Err(super::link::LinkError::Quiet) if since.elapsed() >= LEASE => {
                    return "no ping was answered for a lease".into()
                }
                Err(super::link::LinkError::Quiet) => continue,
                Err(e) => return format!("the link to the manager's host failed: {e}"),
            };
            match note {
                Some(Note::Pong { n }) => {
                    let sent = self.pings().iter().find(|p| p.0 == n).map(|p| p.1);
                    if let Some(t) = sent {
                        since = since.max(t);
                        self.device.lease_forwarding(since + LEASE);
                    }
                }
                Some(Note::Revoke { seq, ranges }) => {
                    let ops = ranges
                        .iter()
                        .map(|&(start, len)| TableOp::RemoveRangeAll { start, len })
                        .collect();
                    // From here no answer decided before this revocation installs a record;
                    // the records installed before are posted before the removal, which the
                    // device applies after them.
                    if let Some(j) = self.state().joined.as_mut() {
                        j.revoking = j.revoking.max(seq);
                    }
                    if let Err(e) = self.device.update(ops) {
                        return format!("cannot apply a revocation: {e}");
                    }
                    self.revocations.fetch_add(1, Ordering::Relaxed);
                    // Every request issued before the revocation has completed by now, the
                    // writes given up on counted.
                    let uncertain = self.device.forward_uncertain_writes();
                    let failed = self.uncertain_told.swap(uncertain, Ordering::SeqCst) < uncertain;
                    if link.send(&Note::Ack { seq, failed }.encode()).is_err() {
                        return "the link to the manager's host failed".into();
                    }
                }
                _ => return "the manager's host sent what it does not send".into(),
            }
        }
    }

    /// Cut off from the manager's host: every record over the shared ranges goes (waiting for
    /// the commands in flight), and every session with it, before anything else may happen.
    fn fence(&self, why: &str) {
        tracing::warn!(manager = %self.manager, "left the shared file system: {why}");
        // Nothing more goes to the manager's array through this device until it joins again.
        self.device.lease_forwarding(Instant::now());
        {
            // No answer installs a record from here (no connection to be current for), and
            // what was posted before comes before the removal below.
            let mut st = self.state();
            if let Some(j) = st.joined.take() {
                for s in j.sessions.iter().filter_map(Weak::upgrade) {
                    s.shutdown();
                }
            }
            st.last_error = why.to_string();
        }
        let ops = self
            .ranges
            .iter()
            .map(|&(start, len)| TableOp::RemoveRangeAll { start, len })
            .collect();
        if let Err(e) = self.device.update(ops) {
            tracing::error!("cannot remove the shared file system's records: {e}");
        }
        self.fences.fetch_add(1, Ordering::Relaxed);
    }

    /// Stops reconnecting (the daemon stops).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// `share.*` pairs for `moneta status`.
    pub fn report(&self) -> Vec<(String, String)> {
        let st = self.state();
        vec![
            ("share.role".into(), "member".into()),
            ("share.manager".into(), self.manager.clone()),
            (
                "share.state".into(),
                if st.joined.is_some() { "up" } else { "down" }.into(),
            ),
            (
                "share.sessions".into(),
                st.joined
                    .as_ref()
                    .map_or(0, |j| {
                        j.sessions.iter().filter(|s| s.strong_count() > 0).count()
                    })
                    .to_string(),
            ),
            (
                "share.connects".into(),
                self.connects.load(Ordering::Relaxed).to_string(),
            ),
            (
                "share.calls".into(),
                self.calls.load(Ordering::Relaxed).to_string(),
            ),
            (
                "share.revocations".into(),
                self.revocations.load(Ordering::Relaxed).to_string(),
            ),
            (
                "share.fences".into(),
                self.fences.load(Ordering::Relaxed).to_string(),
            ),
            ("share.last_error".into(), st.last_error.clone()),
        ]
    }

    /// Whether `[start, start + len)` touches the shared ranges.
    pub fn overlaps(&self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        self.ranges
            .iter()
            .any(|&(s, l)| start < s.saturating_add(l) && s < end)
    }

    fn inside(&self, start: u64, len: u64) -> bool {
        self.ranges
            .iter()
            .any(|&(s, l)| start >= s && len <= l && start - s <= l - len)
    }
}

fn fail(errno: i32, message: impl Into<String>) -> Failure {
    Failure {
        errno,
        message: message.into(),
    }
}

/// A client connection's calls to the manager's host: its session there, and what its
/// handles allow here.
pub struct Proxy {
    cred: moneta_fs::Cred,
    pid: i32,
    /// The session's connection and the member connection it belongs to.
    link: Option<(Arc<Link>, u64)>,
    /// handle → inode.
    handles: HashMap<u64, (u64, u32)>,
    /// inode → handles open for reading, for writing.
    per_file: HashMap<u64, (u32, u32)>,
    /// inode → the tags its records carry (a file's tag changes when it shrinks).
    tags: HashMap<u64, Vec<u64>>,
}

impl Proxy {
    /// The calls of a client with these credentials.
    pub fn new(cred: moneta_fs::Cred, pid: i32) -> Proxy {
        Proxy {
            cred,
            pid,
            link: None,
            handles: HashMap::new(),
            per_file: HashMap::new(),
            tags: HashMap::new(),
        }
    }

    fn rights(&self, ino: u64) -> u32 {
        match self.per_file.get(&ino) {
            Some(&(r, w)) => {
                (if r > 0 { RIGHT_READ } else { 0 }) | if w > 0 { RIGHT_WRITE } else { 0 }
            }
            None => 0,
        }
    }

    /// Forgets the session: its handles are gone at the manager's host too.
    fn lost(&mut self, m: &Member, channel: Option<u32>) {
        if let Some((l, _)) = self.link.take() {
            l.shutdown();
        }
        self.handles.clear();
        self.per_file.clear();
        self.tags.clear();
        if let Some(channel) = channel {
            let ops = m
                .ranges
                .iter()
                .map(|&(start, len)| TableOp::RemoveRange {
                    channel,
                    start,
                    len,
                })
                .collect();
            let _ = m.device.update(ops);
        }
    }

    fn session(&mut self, m: &Member, channel: Option<u32>) -> Result<Arc<Link>, Failure> {
        let (id, epoch) = {
            let st = m.state();
            match &st.joined {
                Some(j) => (j.id, j.epoch),
                None => {
                    let why = st.last_error.clone();
                    drop(st);
                    if self.link.is_some() {
                        self.lost(m, channel);
                    }
                    return Err(fail(
                        errno::EIO,
                        format!("the shared file system's manager is unreachable: {why}"),
                    ));
                }
            }
        };
        if let Some((l, e)) = &self.link {
            if *e == epoch {
                return Ok(l.clone());
            }
            // The member's connection was made again: the old session's files are gone.
            let had = !self.handles.is_empty();
            self.lost(m, channel);
            if had {
                return Err(fail(
                    errno::EIO,
                    "the link to the shared file system's manager failed: this process's open \
                     files on it are lost",
                ));
            }
        }
        let link = Arc::new(
            m.connect()
                .map_err(|e| fail(errno::EIO, format!("cannot reach the manager: {e}")))?,
        );
        let hello = Hello::Session {
            member: id,
            uid: self.cred.uid,
            gid: self.cred.gid,
            pid: self.pid,
            groups: self.cred.groups.clone(),
        };
        link.send(&hello.encode())
            .map_err(|e| fail(errno::EIO, format!("cannot reach the manager: {e}")))?;
        let mut st = m.state();
        match st.joined.as_mut() {
            Some(j) if j.epoch == epoch => {
                j.sessions.retain(|s| s.strong_count() > 0);
                j.sessions.push(Arc::downgrade(&link));
            }
            _ => {
                link.shutdown();
                return Err(fail(
                    errno::EIO,
                    "the link to the shared file system's manager failed",
                ));
            }
        }
        drop(st);
        self.link = Some((link.clone(), epoch));
        Ok(link)
    }

    /// One file-system call of the client, whose channel here is `channel`; a fork's answer
    /// comes with the write end of the bundle's pipe.
    pub fn call(
        &mut self,
        m: &Member,
        channel: Option<u32>,
        seq: u32,
        req: FsRequest,
    ) -> Result<(FsReply, Option<OwnedFd>), Failure> {
        if matches!(req, FsRequest::Map { .. }) {
            return Err(fail(
                errno::EOPNOTSUPP,
                "a member host's clients cannot map files of the shared file system \
                 (docs/distributed.md)",
            ));
        }
        if matches!(req, FsRequest::Durable) {
            return Err(fail(
                errno::EOPNOTSUPP,
                "a member host has no durability page: the sharing host's journal is not here",
            ));
        }
        if let FsRequest::OpenRoom { flags, mode, path } = req {
            // Room and size leases are the sharing host's own channels' (this host's channels
            // do not offer `FS_ROOM_AT_OPEN`): the open is made plainly, with no room.
            let (reply, pipe) =
                self.call(m, channel, seq, FsRequest::Open { flags, mode, path })?;
            let reply = match reply {
                FsReply::Opened {
                    handle,
                    rights,
                    stat,
                } => FsReply::OpenedRoom {
                    handle,
                    rights,
                    stat,
                    file: 0,
                    extents: Vec::new(),
                },
                other => other,
            };
            return Ok((reply, pipe));
        }
        m.calls.fetch_add(1, Ordering::Relaxed);
        let link = self.session(m, channel)?;
        let epoch = self.link.as_ref().map_or(0, |l| l.1);
        let op = req.op();
        let asked = Request::Fs(req.clone());
        let answer = link
            .send(&encode_request(seq, &asked))
            .and_then(|()| link.receive(None));
        let bytes = match answer {
            Ok(b) => b,
            Err(e) => {
                self.lost(m, channel);
                return Err(fail(
                    errno::EIO,
                    format!("the shared file system's manager did not answer: {e}"),
                ));
            }
        };
        let decoded = bytes
            .split_first_chunk::<8>()
            .and_then(|(b, rest)| Some((u64::from_le_bytes(*b), decode_reply(rest, op).ok()?)));
        let Some((before, reply)) = decoded else {
            self.lost(m, channel);
            return Err(fail(
                errno::EIO,
                "the shared file system's manager answered nonsense",
            ));
        };
        let reply = match reply.result {
            Ok(ReplyBody::Fs(r)) => r,
            Ok(_) => {
                self.lost(m, channel);
                return Err(fail(errno::EIO, "the manager answered another call"));
            }
            Err(f) => return Err(f),
        };
        self.after(m, channel, epoch, before, &req, &reply)?;
        let pipe = match &reply {
            FsReply::Forked { bundle, .. } => {
                Some(m.forked(*bundle, self.cred.uid, self.handles.clone())?)
            }
            _ => None,
        };
        Ok((reply, pipe))
    }

    /// What an answer changes here: handles, and the channel's records.
    fn after(
        &mut self,
        m: &Member,
        channel: Option<u32>,
        epoch: u64,
        before: u64,
        req: &FsRequest,
        reply: &FsReply,
    ) -> Result<(), Failure> {
        match (req, reply) {
            (
                FsRequest::Open { .. },
                FsReply::Opened {
                    handle,
                    rights,
                    stat,
                },
            ) => {
                let c = self.per_file.entry(stat.ino).or_default();
                c.0 += u32::from(rights & RIGHT_READ != 0);
                c.1 += u32::from(rights & RIGHT_WRITE != 0);
                self.handles.insert(*handle, (stat.ino, *rights));
            }
            (FsRequest::Inherit { bundle, .. }, FsReply::Inherited { pairs, .. }) => {
                // The child's handles are its parent's files, with their rights.
                let forks = m.forks();
                let Some(f) = forks.get(bundle) else {
                    return Ok(());
                };
                for (old, new) in pairs {
                    if let Some(&(ino, rights)) = f.handles.get(old) {
                        // A page asked again names handles already counted.
                        if self.handles.insert(*new, (ino, rights)).is_none() {
                            let c = self.per_file.entry(ino).or_default();
                            c.0 += u32::from(rights & RIGHT_READ != 0);
                            c.1 += u32::from(rights & RIGHT_WRITE != 0);
                        }
                    }
                }
            }
            (FsRequest::Close { handle }, FsReply::Empty) => {
                let Some((ino, rights)) = self.handles.remove(handle) else {
                    return Ok(());
                };
                let was = self.rights(ino);
                if let Some(c) = self.per_file.get_mut(&ino) {
                    c.0 -= u32::from(rights & RIGHT_READ != 0);
                    c.1 -= u32::from(rights & RIGHT_WRITE != 0);
                    if *c == (0, 0) {
                        self.per_file.remove(&ino);
                    }
                }
                let now = self.rights(ino);
                if now != was {
                    // What the handles left allow comes back with the next lookup.
                    let tags = self.tags.remove(&ino).unwrap_or_default();
                    if let Some(channel) = channel {
                        let ops: Vec<TableOp> = tags
                            .into_iter()
                            .map(|file| TableOp::RemoveFile { channel, file })
                            .collect();
                        if !ops.is_empty() {
                            m.device.update(ops).map_err(|e| {
                                fail(errno::EIO, format!("cannot revoke records: {e}"))
                            })?;
                        }
                    }
                }
            }
            (
                FsRequest::Lookup { handle, .. } | FsRequest::Extend { handle, .. },
                FsReply::Extents { file, extents, .. },
            ) => {
                let Some(&(ino, _)) = self.handles.get(handle) else {
                    return Ok(());
                };
                let tags = self.tags.entry(ino).or_default();
                if !tags.contains(file) {
                    tags.push(*file);
                }
                let Some(channel) = channel else {
                    return Ok(());
                };
                let rights = self.rights(ino) as u8;
                let ops: Vec<TableOp> = extents
                    .iter()
                    .filter(|e| e.dev != HOLE && e.len > 0)
                    .map(|e| TableOp::Insert {
                        channel,
                        start: e.dev,
                        len: e.len,
                        rights,
                        file: *file,
                    })
                    .collect();
                if let Some(out) = ops.iter().find(|op| match **op {
                    TableOp::Insert { start, len, .. } => !m.inside(start, len),
                    _ => false,
                }) {
                    return Err(fail(
                        errno::EIO,
                        format!(
                            "the manager answered an extent outside the shared ranges: {out:?}"
                        ),
                    ));
                }
                let st = m.state();
                // Installed only if no revocation decided after the answer has begun here: such
                // a one may have freed these very extents. Without the records the client asks
                // again (a soft miss) and gets a fresh answer.
                let current = st
                    .joined
                    .as_ref()
                    .is_some_and(|j| j.epoch == epoch && j.revoking <= before);
                if current && !ops.is_empty() {
                    // Posted under the state lock: a revocation applied after this is ordered
                    // after the records (the poller takes posts before later updates).
                    m.device
                        .post(ops)
                        .map_err(|e| fail(errno::EIO, format!("cannot install records: {e}")))?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The client is gone: its session at the manager's host ends with the connection.
    pub fn end(&mut self) {
        if let Some((l, _)) = self.link.take() {
            l.shutdown();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.end();
    }
}
