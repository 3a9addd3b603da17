//! The manager's host: it answers the members' sessions with the permission manager and
//! revokes space on every member before it is reused.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use moneta_abi::control::{
    decode_request, encode_reply, errno, peek_header, Failure, ReplyBody, Request,
};
use moneta_abi::fsproto::{FsReply, FsRequest};

use super::link::{Key, Link};
use super::{ack_wait, fenced_after, Hello, Note, LEASE};
use crate::manager::{Manager, Session};

/// Malformed requests a session may send before it is dropped.
const MAX_PROTOCOL_ERRORS: u32 = 64;
/// Members joined at once.
const MAX_MEMBERS: usize = 256;
/// Connections in their handshake at once; more are closed at once, so that hosts without the
/// key cannot hold the daemon's threads.
const MAX_HANDSHAKES: usize = 32;

/// A member host as the manager's host sees it.
struct Joined {
    link: Arc<Link>,
    /// The highest revocation it has answered.
    acked: u64,
    /// When it last said anything.
    last_contact: Instant,
    /// Its connection ended: it fences itself, and is counted fenced `fenced` after
    /// `last_contact`.
    gone: bool,
    /// How long after its last word it is surely fenced.
    fenced: Duration,
    /// How long a revocation waits for its answer.
    ack_wait: Duration,
    /// The highest revocation it answered saying it had given up on a forwarded write.
    failed_at: u64,
    /// Its sessions' connections, ended with it.
    sessions: HashMap<u64, Arc<Link>>,
    /// The write ends of the pipes of its clients' fork bundles: a bundle hangs up here (and
    /// is let go) once the member says no process holds its own pipe's write end any more,
    /// or the member goes.
    bundles: HashMap<u64, std::os::fd::OwnedFd>,
    peer: String,
}

#[derive(Default)]
struct Members {
    joined: HashMap<u64, Joined>,
    next_session: u64,
}

/// The manager's side of the shared file system (`monetad --share-listen`).
pub struct Holder {
    key: Key,
    /// The device, whose export channels a cut takes every record from.
    device: Arc<moneta_device::Device>,
    /// Cuts of the members' export connections made (`share.cuts`): an export connection
    /// opened before a cut never writes again.
    cuts: AtomicU64,
    /// The array's size: a member places it at `[0, array_size)`.
    array_size: u64,
    /// Connections in their handshake.
    handshakes: std::sync::atomic::AtomicUsize,
    manager: Arc<Manager>,
    listen: String,
    members: Mutex<Members>,
    changed: Condvar,
    /// Revocations made (the last one's number).
    revocations: AtomicU64,
    /// Members counted fenced after they went.
    fenced: AtomicU64,
    /// Sessions served since the start.
    sessions: AtomicU64,
    /// Calls answered.
    calls: AtomicU64,
    /// Connections refused (no key, a malformed hello, an unknown member).
    refused: AtomicU64,
}

impl Holder {
    /// Listens at `addr` for members holding `key`, sharing `manager`'s file system on an
    /// array of `array_size` bytes.
    pub fn start(
        addr: &str,
        key: Key,
        manager: Arc<Manager>,
        device: Arc<moneta_device::Device>,
        array_size: u64,
    ) -> Result<Arc<Holder>, String> {
        let listener =
            TcpListener::bind(addr).map_err(|e| format!("--share-listen {addr}: {e}"))?;
        let listen = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| addr.to_string());
        let holder = Arc::new(Holder {
            key,
            device,
            cuts: AtomicU64::new(0),
            array_size,
            handshakes: std::sync::atomic::AtomicUsize::new(0),
            manager,
            listen,
            members: Mutex::new(Members::default()),
            changed: Condvar::new(),
            revocations: AtomicU64::new(0),
            fenced: AtomicU64::new(0),
            sessions: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        // Every revocation reaches the members from before the first can join.
        holder.manager.share_revocations(holder.clone());
        let h = holder.clone();
        std::thread::Builder::new()
            .name("moneta-share".into())
            .spawn(move || h.accept(listener))
            .map_err(|e| format!("cannot start the share listener: {e}"))?;
        Ok(holder)
    }

    fn members(&self) -> MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn accept(self: Arc<Self>, listener: TcpListener) {
        for conn in listener.incoming() {
            let Ok(conn) = conn else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            if self.handshakes.fetch_add(1, Ordering::AcqRel) >= MAX_HANDSHAKES {
                self.handshakes.fetch_sub(1, Ordering::AcqRel);
                self.refused.fetch_add(1, Ordering::Relaxed);
                drop(conn);
                continue;
            }
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name("moneta-share-conn".into())
                .stack_size(256 << 10)
                .spawn(move || me.serve(conn));
            if let Err(e) = spawned {
                self.handshakes.fetch_sub(1, Ordering::AcqRel);
                tracing::error!("cannot start a share connection's thread: {e}");
            }
        }
    }

    fn serve(&self, conn: TcpStream) {
        let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        let accepted = Link::accept(conn, &self.key);
        let hello = accepted.as_ref().ok().and_then(|link| {
            link.receive(Some(super::link::HANDSHAKE))
                .ok()
                .and_then(|b| Hello::decode(&b))
        });
        self.handshakes.fetch_sub(1, Ordering::AcqRel);
        let link = match accepted {
            Ok(l) => Arc::new(l),
            Err(e) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, "a connection to the shared file system refused: {e}");
                return;
            }
        };
        match hello {
            Some(Hello::Member { id, fence_ms }) => {
                let fence = Duration::from_millis(fence_ms.min(3_600_000));
                self.member(id, fence, link, peer)
            }
            Some(Hello::Session {
                member,
                uid,
                gid,
                pid,
                groups,
            }) => self.session(member, link, moneta_fs::Cred { uid, gid, groups }, pid),
            None => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, "a member's connection began with no hello");
            }
        }
    }

    /// A member's own connection: answers its pings and takes its answers to revocations
    /// until it goes quiet for a lease or the connection ends.
    fn member(&self, id: u64, fence: Duration, link: Arc<Link>, peer: String) {
        {
            let mut m = self.members();
            // Members gone long enough to be surely fenced are forgotten.
            let before = m.joined.len();
            m.joined
                .retain(|_, j| !(j.gone && j.last_contact.elapsed() >= j.fenced));
            self.fenced
                .fetch_add((before - m.joined.len()) as u64, Ordering::Relaxed);
            if m.joined.len() >= MAX_MEMBERS || m.joined.contains_key(&id) {
                self.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, "a member refused: too many members, or a name in use");
                return;
            }
            m.joined.insert(
                id,
                Joined {
                    link: link.clone(),
                    acked: 0,
                    last_contact: Instant::now(),
                    gone: false,
                    fenced: fenced_after(fence),
                    ack_wait: ack_wait(fence),
                    failed_at: 0,
                    sessions: HashMap::new(),
                    bundles: HashMap::new(),
                    peer: peer.clone(),
                },
            );
            // Registered: the member may open sessions from now on. Sent under the lock, so
            // that it comes before any revocation this member is asked (a new connection's
            // buffers take it at once).
            let welcome = Note::Welcome {
                array_size: self.array_size,
            };
            if link.send(&welcome.encode()).is_err() {
                m.joined.remove(&id);
                return;
            }
        }
        tracing::info!(%peer, "a member joined the shared file system");
        loop {
            let note = match link.receive(Some(LEASE)) {
                Ok(b) => Note::decode(&b),
                Err(e) => {
                    tracing::warn!(%peer, "a member's connection ended: {e}");
                    break;
                }
            };
            let mut m = self.members();
            let Some(j) = m.joined.get_mut(&id) else {
                break;
            };
            j.last_contact = Instant::now();
            match note {
                Some(Note::Ping { n }) => {
                    drop(m);
                    if link.send(&Note::Pong { n }.encode()).is_err() {
                        break;
                    }
                }
                Some(Note::Ack { seq, failed }) => {
                    j.acked = j.acked.max(seq);
                    if failed {
                        j.failed_at = j.failed_at.max(seq);
                    }
                    drop(m);
                    self.changed.notify_all();
                }
                Some(Note::Release { bundle }) => {
                    j.bundles.remove(&bundle);
                }
                _ => {
                    tracing::warn!(%peer, "a member sent what members do not send");
                    break;
                }
            }
        }
        self.gone(id);
    }

    /// Cuts every export connection of the members off: what a member sent before and has
    /// not reached the array yet never will. The count moves first, then every record of the
    /// array goes from every channel (waiting for the commands in flight); an export
    /// connection that then misses sees the count moved and ends itself, and the members'
    /// links connect again. The manager's own clients' records come back with their next
    /// lookups.
    pub fn cut(&self, why: &str) {
        self.cuts.fetch_add(1, Ordering::SeqCst);
        tracing::warn!("the members' export connections are cut off: {why}");
        if let Err(e) = self
            .device
            .update(vec![moneta_device::TableOp::RemoveRangeAll {
                start: 0,
                len: self.array_size,
            }])
        {
            tracing::error!("cannot cut the members' export connections off: {e}");
        }
    }

    /// Member `id` is gone: its connection and its sessions end, and so do the export
    /// connections (a member stopped mid-request may still have some on their way). It fences
    /// itself; until it is surely fenced, revocations wait for that.
    fn gone(&self, id: u64) {
        let mut m = self.members();
        let mut cut = false;
        if let Some(j) = m.joined.get_mut(&id) {
            if !j.gone {
                cut = true;
                j.gone = true;
                j.link.shutdown();
                for s in j.sessions.values() {
                    s.shutdown();
                }
                j.bundles.clear();
                tracing::warn!(peer = %j.peer, "a member left the shared file system");
            }
        }
        drop(m);
        if cut {
            self.cut("a member left");
        }
        self.changed.notify_all();
    }

    /// One client of a member host: its calls answered with its credentials, as the Unix
    /// socket's connections are, until it or its member goes.
    fn session(&self, member: u64, link: Arc<Link>, cred: moneta_fs::Cred, pid: i32) {
        let sid = {
            let mut m = self.members();
            m.next_session += 1;
            let sid = m.next_session;
            match m.joined.get_mut(&member) {
                Some(j) if !j.gone => {
                    j.sessions.insert(sid, link.clone());
                }
                _ => {
                    drop(m);
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("a session of a member not joined refused");
                    return;
                }
            }
            sid
        };
        self.sessions.fetch_add(1, Ordering::Relaxed);
        let session = Session::new(cred).with_pid(pid).shared();
        let mut errors = 0;
        while let Ok(msg) = link.receive(None) {
            let (op, seq, result) = match decode_request(&msg) {
                Ok((seq, req)) => {
                    let op = req.op();
                    // Every answer says how many revocations came before it was decided: the
                    // member installs no record from an answer that a later revocation may
                    // have overtaken.
                    let before = self.revocations.load(Ordering::SeqCst);
                    let result = self.call(member, &session, req);
                    (op, seq, result.map(|r| (before, r)))
                }
                Err(e) => {
                    errors += 1;
                    let (op, seq) = peek_header(&msg).unwrap_or((0, 0));
                    let f = Failure {
                        errno: errno::EPROTO,
                        message: format!("malformed request: {e}"),
                    };
                    (op & !moneta_abi::control::REPLY_BIT, seq, Err(f))
                }
            };
            let (before, result) = match result {
                Ok((b, r)) => (b, r),
                Err(f) => (self.revocations.load(Ordering::SeqCst), Err(f)),
            };
            let mut frame = before.to_le_bytes().to_vec();
            frame.extend_from_slice(&encode_reply(op, seq, &result));
            if link.send(&frame).is_err() || errors >= MAX_PROTOCOL_ERRORS {
                break;
            }
        }
        link.shutdown();
        let mut s = session.lock().unwrap_or_else(|e| e.into_inner());
        self.manager.end_session(&mut s);
        drop(s);
        if let Some(j) = self.members().joined.get_mut(&member) {
            j.sessions.remove(&sid);
        }
    }

    fn call(
        &self,
        member: u64,
        session: &Arc<Mutex<Session>>,
        req: Request,
    ) -> Result<Result<ReplyBody, Failure>, Failure> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let f = match req {
            Request::Fs(FsRequest::Durable) => {
                return Ok(Err(Failure {
                    errno: errno::EOPNOTSUPP,
                    message: "a member host's clients have no durability page \
                              (docs/distributed.md)"
                        .into(),
                }))
            }
            Request::Fs(FsRequest::Map { .. }) => {
                return Ok(Err(Failure {
                    errno: errno::EOPNOTSUPP,
                    message: "a member host's clients cannot map files of the shared file \
                              system (docs/distributed.md)"
                        .into(),
                }))
            }
            Request::Fs(FsRequest::Fork) => {
                let s = session.lock().unwrap_or_else(|e| e.into_inner());
                let (reply, pipe) = match self.manager.fork(&s) {
                    Ok(r) => r,
                    Err(f) => return Ok(Err(f)),
                };
                drop(s);
                let FsReply::Forked { bundle, .. } = reply else {
                    unreachable!("a fork answers a bundle")
                };
                // The bundle's pipe stays open here until the member says its own hung up.
                let mut m = self.members();
                match m.joined.get_mut(&member) {
                    Some(j) if !j.gone => {
                        j.bundles.insert(bundle, pipe);
                    }
                    // Its member went meanwhile: the bundle hangs up at once.
                    _ => drop(pipe),
                }
                return Ok(Ok(ReplyBody::Fs(reply)));
            }
            Request::Fs(f) => f,
            _ => {
                return Ok(Err(Failure {
                    errno: errno::EOPNOTSUPP,
                    message: "a member's session carries file-system calls only".into(),
                }))
            }
        };
        let mut s = session.lock().unwrap_or_else(|e| e.into_inner());
        // No channel of this daemon: the member installs the records in its own.
        Ok(self.manager.call(&mut s, None, f).map(ReplyBody::Fs))
    }

    /// Revokes `ranges` on every member (with the file-system lock held, before the space is
    /// reused): returns once each member has answered that it removed every record over them
    /// and saw every command issued before complete, or is surely fenced.
    pub fn revoke(&self, ranges: &[(u64, u64)]) {
        // The members that may hold records now; one that joins while this waits can have
        // none over these ranges (its sessions' calls wait for the file-system lock).
        let asked: Vec<(u64, Arc<Link>)> = self
            .members()
            .joined
            .iter()
            .filter(|(_, j)| !j.gone)
            .map(|(&id, j)| (id, j.link.clone()))
            .collect();
        let any_gone = self.members().joined.values().any(|j| j.gone);
        if asked.is_empty() && !any_gone {
            return;
        }
        let seq = self.revocations.fetch_add(1, Ordering::SeqCst) + 1;
        let note = Note::Revoke {
            seq,
            ranges: ranges.to_vec(),
        }
        .encode();
        // Sent without the members' lock: a send that waits for room (bounded) must not keep
        // the members' own threads from answering pings or going.
        let mut cut: Vec<u64> = asked
            .iter()
            .filter(|(_, link)| link.send(&note).is_err())
            .map(|&(id, _)| id)
            .collect();
        let sent = Instant::now();
        let mut m = self.members();
        loop {
            for id in cut.drain(..) {
                drop(m);
                self.gone(id);
                m = self.members();
            }
            let now = Instant::now();
            let mut wait = Duration::from_millis(100);
            let mut done = true;
            // Gone members too (those not asked): their records are surely gone only once
            // they are surely fenced.
            for (&id, j) in m.joined.iter() {
                let was_asked = asked.iter().any(|&(a, _)| a == id);
                if was_asked && j.acked >= seq {
                    continue;
                }
                if j.gone {
                    let fenced = j.last_contact + j.fenced;
                    if now < fenced {
                        done = false;
                        wait = wait.min(fenced - now);
                    }
                } else if !was_asked {
                    // Joined after the revocation began: it holds nothing of these ranges.
                } else if now.duration_since(sent) >= j.ack_wait {
                    tracing::warn!(peer = %j.peer, "a member did not answer a revocation: cut off");
                    cut.push(id);
                    done = false;
                } else {
                    done = false;
                }
            }
            if done {
                break;
            }
            if !cut.is_empty() {
                continue;
            }
            m = self
                .changed
                .wait_timeout(m, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        // A member that gave up on a forwarded write may still have it on its way to the array:
        // cut the export connections off before the space is reused.
        let failed = asked
            .iter()
            .any(|(id, _)| m.joined.get(id).is_some_and(|j| j.failed_at >= seq));
        let before = m.joined.len();
        m.joined
            .retain(|_, j| !(j.gone && j.last_contact.elapsed() >= j.fenced));
        let fenced = (before - m.joined.len()) as u64;
        self.fenced.fetch_add(fenced, Ordering::Relaxed);
        drop(m);
        if failed {
            self.cut("a member gave up on a forwarded write");
        } else if fenced > 0 {
            // Cut again now that it is surely fenced: the cut when it went took the connections
            // it had, but until its fence it may have connected again and sent writes that are
            // still on their way.
            self.cut("a member that left is fenced");
        }
    }

    /// `share.*` pairs for `moneta status`.
    pub fn report(&self) -> Vec<(String, String)> {
        let m = self.members();
        let live = m.joined.values().filter(|j| !j.gone).count();
        let sessions: usize = m.joined.values().map(|j| j.sessions.len()).sum();
        let mut pairs = vec![
            ("share.role".into(), "manager".into()),
            ("share.listen".into(), self.listen.clone()),
            ("share.members".into(), live.to_string()),
            ("share.sessions".into(), sessions.to_string()),
            (
                "share.bundles".into(),
                m.joined
                    .values()
                    .map(|j| j.bundles.len())
                    .sum::<usize>()
                    .to_string(),
            ),
            (
                "share.sessions_served".into(),
                self.sessions.load(Ordering::Relaxed).to_string(),
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
                "share.cuts".into(),
                self.cuts.load(Ordering::Relaxed).to_string(),
            ),
            (
                "share.fenced".into(),
                self.fenced.load(Ordering::Relaxed).to_string(),
            ),
            (
                "share.refused".into(),
                self.refused.load(Ordering::Relaxed).to_string(),
            ),
        ];
        let mut peers: Vec<_> = m
            .joined
            .values()
            .filter(|j| !j.gone)
            .map(|j| j.peer.clone())
            .collect();
        peers.sort();
        pairs.push(("share.peers".into(), peers.join(" ")));
        pairs
    }
}
