//! A connection's session (its credentials and open handles) and the handles each channel
//! publishes for the poller's `OP_LOOKUP` and `OP_FS`.

use super::*;
use moneta_fs::idhash::IdHash;

#[derive(Clone, Copy, Debug)]
pub(super) struct Handle {
    pub(super) ino: u64,
    pub(super) read: bool,
    pub(super) write: bool,
    /// The open file description: OFD and `flock` locks belong to it.
    pub(super) ofd: u64,
}

/// A claimed bundle: id, secret, pairs of (old handle, new handle).
pub(super) type Claimed = (u64, [u64; 2], Vec<(u64, u64)>);

/// Session ids, unique in the daemon's life (POSIX locks belong to sessions).
static SESSIONS: AtomicU64 = AtomicU64::new(1);

/// A connection's view: its credentials and open handles.
pub struct Session {
    /// Credentials from `SO_PEERCRED` and `SO_PEERGROUPS`.
    pub cred: Cred,
    /// The peer's process id from `SO_PEERCRED` (0 for a process in another pid namespace),
    /// reported as the owner of its POSIX locks.
    pub pid: i32,
    /// Owns the session's POSIX locks.
    pub(super) id: u64,
    pub(super) handles: HashMap<u64, Handle, IdHash>,
    /// Per inode: handles open for reading, for writing (so a lookup finds its rights at once).
    pub(super) per_file: HashMap<u64, (u32, u32), IdHash>,
    /// The channel whose `OP_LOOKUP` and `OP_FS` commands see this session's handles, and
    /// where they are published for the poller.
    pub(super) published: Option<(u32, Registry)>,
    /// This session as the server shares it with the poller ([`Session::shared`]).
    pub(super) me: Weak<Mutex<Session>>,
    pub(super) next: u64,
    /// The last bundle claimed, with its pairs, for reading them in pages.
    pub(super) claimed: Option<Claimed>,
    /// The connection is ending: its handles are withdrawn from its channel, whose id another
    /// connection may get at once, so nothing is published for that channel again (a call a
    /// worker makes meanwhile is refused).
    pub(super) ending: bool,
}

impl Session {
    /// A session with no open files.
    pub fn new(cred: Cred) -> Session {
        Session {
            cred,
            pid: 0,
            id: SESSIONS.fetch_add(1, Ordering::Relaxed),
            handles: HashMap::default(),
            per_file: HashMap::default(),
            published: None,
            me: Weak::new(),
            next: 1,
            claimed: None,
            ending: false,
        }
    }

    /// The session of process `pid`.
    pub fn with_pid(mut self, pid: i32) -> Session {
        self.pid = pid;
        self
    }

    /// The session behind a mutex that the connection's thread and the poller's quick calls
    /// share (the poller only ever tries it).
    pub fn shared(mut self) -> Arc<Mutex<Session>> {
        Arc::new_cyclic(|me| {
            self.me = me.clone();
            Mutex::new(self)
        })
    }

    /// The rights this connection's handles of `ino` carry together.
    pub(super) fn rights(&self, ino: u64) -> u32 {
        match self.per_file.get(&ino) {
            Some(&(readers, writers)) => {
                (if readers > 0 { RIGHT_READ } else { 0 })
                    | if writers > 0 { RIGHT_WRITE } else { 0 }
            }
            None => 0,
        }
    }

    pub(super) fn add(&mut self, handle: u64, h: Handle) {
        let c = self.per_file.entry(h.ino).or_default();
        c.0 += h.read as u32;
        c.1 += h.write as u32;
        self.handles.insert(handle, h);
        if let Some((channel, r)) = &self.published {
            if let Some(p) = lock_registry(r).get_mut(channel) {
                p.insert(handle, h.ino, self.rights(h.ino));
            }
        }
    }

    pub(super) fn remove(&mut self, handle: u64) -> Option<Handle> {
        let h = self.handles.remove(&handle)?;
        let c = self.per_file.get_mut(&h.ino).expect("counted at open");
        c.0 -= h.read as u32;
        c.1 -= h.write as u32;
        if *c == (0, 0) {
            self.per_file.remove(&h.ino);
        }
        if let Some((channel, r)) = &self.published {
            if let Some(p) = lock_registry(r).get_mut(channel) {
                p.remove(handle, h.ino, self.rights(h.ino));
            }
        }
        Some(h)
    }
}

/// Per channel, the handles of the connection that owns it: (handle → (inode, the rights of
/// the connection's handles of that inode together)). What the poller's `OP_LOOKUP` may
/// serve; a connection's entry exists from its first file call after it opened its channel
/// until just before the channel is closed, so a channel id, once reused, never sees another
/// connection's handles.
pub(super) type Registry = Arc<Mutex<HashMap<u32, Published>>>;

/// One channel's published handles.
#[derive(Default)]
pub(super) struct Published {
    /// Handle to inode.
    pub(super) handles: HashMap<u64, u64, IdHash>,
    /// Inode to the rights of the connection's handles of it together (kept per inode, so
    /// that an open or a close changes one entry, however many files the connection holds).
    pub(super) rights: HashMap<u64, u32, IdHash>,
    /// The connection's session, for the poller's `OP_FS` calls.
    pub(super) session: Weak<Mutex<Session>>,
    /// The connection's credentials, for the calls the poller answers without the session.
    pub(super) cred: Arc<Cred>,
}

impl Published {
    /// Publishes `handle` of `ino`, whose handles together carry `rights` now.
    pub(super) fn insert(&mut self, handle: u64, ino: u64, rights: u32) {
        self.handles.insert(handle, ino);
        self.set_rights(ino, rights);
    }

    /// Withdraws `handle`; the handles of `ino` left carry `rights` (0 when none is left).
    pub(super) fn remove(&mut self, handle: u64, ino: u64, rights: u32) {
        self.handles.remove(&handle);
        self.set_rights(ino, rights);
    }

    /// The inode of `handle` and the connection's rights on it.
    pub(super) fn get(&self, handle: u64) -> Option<(u64, u32)> {
        let ino = *self.handles.get(&handle)?;
        Some((ino, self.rights.get(&ino).copied().unwrap_or(0)))
    }

    fn set_rights(&mut self, ino: u64, rights: u32) {
        if rights == 0 {
            self.rights.remove(&ino);
        } else {
            self.rights.insert(ino, rights);
        }
    }
}

pub(super) fn lock_registry(r: &Registry) -> MutexGuard<'_, HashMap<u32, Published>> {
    // Plain maps, updated in one step each: a panic elsewhere leaves them consistent.
    r.lock().unwrap_or_else(|e| e.into_inner())
}
