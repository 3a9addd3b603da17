//! Who a request through the mount acts for, and the daemon connections it acts through.
//!
//! The permission manager decides every right from the credentials of the connection
//! (`SO_PEERCRED`, `SO_PEERGROUPS`, taken when the connection is made). So the server keeps one
//! libmoneta connection per set of credentials (uid, gid, supplementary groups) that its
//! callers present, made with those credentials: a server run as root switches the connecting
//! thread's effective ids and groups (Linux keeps them per thread) for the `connect(2)` and
//! switches back. A caller then gets through the mount exactly what libmoneta would give a
//! process of theirs, no more. A server run as another user can only connect as itself, and so
//! serves only its own user (the kernel lets no one else in without `allow_other`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use libmoneta::trust::Trust;
use libmoneta::{ClientError, Control, Moneta, Policy};
use rustix::process::{Gid, Uid};

/// Most supplementary groups a caller may present (Linux's `NGROUPS_MAX`).
const GROUPS_MAX: usize = 65536;

/// The credentials one request acts with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// File-system user id of the calling thread.
    pub uid: u32,
    /// File-system group id.
    pub gid: u32,
    /// Supplementary groups, sorted, without duplicates.
    pub groups: Vec<u32>,
}

impl Caller {
    /// The caller of a request from thread `pid` with file-system ids `uid` and `gid`: its
    /// supplementary groups are read from `/proc/PID/status`, and only if that thread still
    /// has the same ids there (a thread that went, or a pid reused since, gives none: fewer
    /// rights, never more).
    pub fn of_request(uid: u32, gid: u32, pid: u32) -> Caller {
        let groups = (pid != 0)
            .then(|| proc_status(pid))
            .flatten()
            .filter(|s| s.fsuid == uid && s.fsgid == gid)
            .map(|s| s.groups)
            .unwrap_or_default();
        Caller { uid, gid, groups }
    }

    /// This process's own credentials.
    pub fn own() -> Caller {
        let mut groups: Vec<u32> = rustix::process::getgroups()
            .unwrap_or_default()
            .into_iter()
            .map(|g| g.as_raw())
            .collect();
        groups.sort_unstable();
        groups.dedup();
        Caller {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            groups,
        }
    }
}

/// What `/proc/PID/status` says of a thread's credentials and signals.
pub struct ProcStatus {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<u32>,
    /// Signals pending for the thread or its process and not blocked by the thread.
    pub deliverable: u64,
}

/// Reads `/proc/PID/status` (PID may be a thread id).
pub fn proc_status(pid: u32) -> Option<ProcStatus> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let mut st = ProcStatus {
        fsuid: u32::MAX,
        fsgid: u32::MAX,
        groups: Vec::new(),
        deliverable: 0,
    };
    let (mut pending, mut blocked) = (0u64, 0u64);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let mut fields = value.split_whitespace();
        match key {
            // Real, effective, saved, file-system.
            "Uid" => st.fsuid = fields.nth(3)?.parse().ok()?,
            "Gid" => st.fsgid = fields.nth(3)?.parse().ok()?,
            "Groups" => {
                st.groups = fields
                    .take(GROUPS_MAX)
                    .map(|g| g.parse().ok())
                    .collect::<Option<Vec<u32>>>()?;
            }
            "SigPnd" | "ShdPnd" => pending |= u64::from_str_radix(fields.next()?, 16).ok()?,
            "SigBlk" => blocked = u64::from_str_radix(fields.next()?, 16).ok()?,
            _ => {}
        }
    }
    st.groups.sort_unstable();
    st.groups.dedup();
    st.deliverable = pending & !blocked;
    (st.fsuid != u32::MAX && st.fsgid != u32::MAX).then_some(st)
}

/// The calling thread's effective ids and groups switched to a caller's, until dropped.
struct ActingAs {
    groups: Vec<Gid>,
    egid: Gid,
}

impl ActingAs {
    /// Takes on `c`'s credentials in this thread only (the real and saved ids stay root's,
    /// which is what lets [`Drop`] switch back).
    fn enter(c: &Caller) -> std::io::Result<ActingAs> {
        let saved = ActingAs {
            groups: rustix::process::getgroups()?,
            egid: rustix::process::getegid(),
        };
        let groups: Vec<Gid> = c.groups.iter().map(|&g| Gid::from_raw(g)).collect();
        rustix::thread::set_thread_groups(&groups)?;
        if let Err(e) = rustix::thread::set_thread_res_gid(None, Gid::from_raw(c.gid), None) {
            drop(saved);
            return Err(e.into());
        }
        if let Err(e) = rustix::thread::set_thread_res_uid(None, Uid::from_raw(c.uid), None) {
            drop(saved);
            return Err(e.into());
        }
        Ok(saved)
    }
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        // A thread left with another user's ids would serve later requests with them: there
        // is no safe way to go on, so the server stops.
        let back = rustix::thread::set_thread_res_uid(None, Uid::ROOT, None)
            .and_then(|()| rustix::thread::set_thread_res_gid(None, self.egid, None))
            .and_then(|()| rustix::thread::set_thread_groups(&self.groups));
        if let Err(e) = back {
            eprintln!("moneta mount: cannot restore the server's credentials: {e}");
            std::process::abort();
        }
    }
}

/// Connects to the daemon at `socket` as `c` (see the module's documentation).
fn connect_as(socket: &Path, trust: &Trust, c: &Caller) -> Result<Control, ClientError> {
    let _as = ActingAs::enter(c)?;
    Control::connect_trusting(socket, trust)
}

/// Most credential sets whose connections are kept (each holds a channel of the daemon's).
pub const MAX_CALLERS: usize = 64;

/// The connections of the server, one per credential set.
pub struct Pool {
    socket: PathBuf,
    /// The daemons the server trusts, decided as the server (root and its own users, and
    /// `MONETA_DAEMON_UID`), whoever it connects for.
    trust: Trust,
    /// The server may act as others (it runs as root).
    root: bool,
    own: Caller,
    conns: Mutex<HashMap<Caller, (Moneta, Instant)>>,
}

impl Pool {
    /// A pool for the daemon at `socket`.
    pub fn new(socket: &Path) -> Result<Pool, String> {
        let trust = Trust::from_env().map_err(|e| e.why)?;
        Ok(Pool {
            socket: socket.to_owned(),
            trust,
            root: rustix::process::geteuid().is_root(),
            own: Caller::own(),
            conns: Mutex::new(HashMap::new()),
        })
    }

    /// Whether the server acts for every user with their own credentials.
    pub fn acts_for_others(&self) -> bool {
        self.root
    }

    /// The connection for `c`, made now if there is none.
    pub fn get(&self, c: &Caller) -> Result<Moneta, ClientError> {
        let key = if self.root {
            c.clone()
        } else if c.uid == self.own.uid {
            // Not root: the server's own credentials are all it can present. The kernel sends
            // it nothing from other users (no allow_other), so `c` is the mounting user,
            // perhaps with other groups (see docs/mount.md).
            self.own.clone()
        } else {
            return Err(ClientError::Refused {
                errno: libc::EACCES,
                message: format!(
                    "the mount's server runs as uid {} and cannot act for uid {}",
                    self.own.uid, c.uid
                ),
            });
        };
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((m, used)) = conns.get_mut(&key) {
            *used = Instant::now();
            return Ok(m.clone());
        }
        if conns.len() >= MAX_CALLERS {
            // The connection lives on in the files opened through it.
            if let Some(oldest) = conns.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| k) {
                let oldest = oldest.clone();
                conns.remove(&oldest);
            }
        }
        let m = if self.root {
            let (trust, who) = (self.trust.clone(), key.clone());
            let connector: libmoneta::Connector =
                Arc::new(move |socket: &Path| connect_as(socket, &trust, &who));
            Moneta::connect_through(&self.socket, Policy::from_env(), connector)?
        } else {
            let trust = self.trust.clone();
            Moneta::connect_through(
                &self.socket,
                Policy::from_env(),
                Arc::new(move |socket: &Path| Control::connect_trusting(socket, &trust)),
            )?
        };
        conns.insert(key, (m.clone(), Instant::now()));
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_status_is_read() {
        let st = proc_status(std::process::id()).expect("own status");
        assert_eq!(st.fsuid, rustix::process::geteuid().as_raw());
        assert_eq!(st.fsgid, rustix::process::getegid().as_raw());
        let c = Caller::of_request(st.fsuid, st.fsgid, std::process::id());
        assert_eq!(c.groups, Caller::own().groups);
        // Other ids than the thread's: no groups taken from it.
        let other = Caller::of_request(st.fsuid.wrapping_add(1), st.fsgid, std::process::id());
        assert!(other.groups.is_empty());
        assert!(Caller::of_request(st.fsuid, st.fsgid, 0).groups.is_empty());
    }
}
