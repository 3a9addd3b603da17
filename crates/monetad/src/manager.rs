//! The permission manager (Moneta-D §2.1, the kernel's part): it answers file-system calls for
//! a client with the client's credentials, keeps the client's open files (handles), and
//! installs and revokes extent permission records in the client's channel.
//!
//! - A lookup (the soft miss) maps an offset of an open file to its extents and installs them
//!   in the caller's channel with the rights of the caller's open handles of that file (their
//!   union: the channel is the process's, so what one handle allows, the process may do). The
//!   records are posted to the poller without waiting for it (`Device::post`).
//! - An extend allocates (zeroed) chunks for writes past the end or into holes, grows the size
//!   and installs the new extents.
//! - A close removes the channel's records of the file once no other handle of the connection
//!   has the rights they carry.
//! - Freeing space (truncate, unlink of a closed file, the last close of an unlinked file,
//!   rename over a file) first revokes every channel's records over the freed ranges and waits
//!   until the device confirms that no request issued before is in flight; only then does the
//!   change commit and the space become allocatable. This happens under the file-system lock,
//!   so no allocation can slip in between.
//! - `chmod` does not revoke the rights of handles already open: as in POSIX, permission is
//!   checked at open.
//! - A `fork` copies the connection's handles into a *bundle* that the child claims on its own
//!   connection (`OP_FS_FORK`, `OP_FS_INHERIT`), as a forked child inherits its parent's open
//!   files. A bundle holds its files open until it is claimed or until the pipe that comes with
//!   it hangs up, which the kernel reports once no process holds its write end any more; a
//!   reaper thread waits for those hang-ups.
//! - `fsync` at the `Host` durability level is a group commit: each call gathers what it needs
//!   flushed under the file-system lock, and a caller flushes everything gathered so far
//!   outside that lock (one ordered flush, `Media::flush_ranges_in`). A call that comes while
//!   one flush runs starts the next at once rather than waiting for it to end (two flushes at
//!   a time, as the kernel lets two `fdatasync` calls of a file run); later calls share the
//!   one after. Each of the two runs in a flush lane of its own (the backing file opened
//!   again): the kernel tells a write-back error once to each open file description that
//!   looks, so two flushes through one could let one take the other's error and its callers
//!   believe their data durable. Flushes end in order: the metadata up to a flush's plan
//!   counts as durable only once every flush before it has ended. Where the array has one
//!   lane, one flush at a time. The file system's own flushes (checkpoints, under its lock)
//!   go through the array's descriptor, and the engine's FLUSH through a third lane of its
//!   own (`moneta_device::FlushAs::lane`). At the `Device` level it flushes nothing.
//!   (`commit.rs`.)
//! - Advisory locks (`OP_FS_LOCK`) live in their own table ([`crate::locks`]) under their own
//!   mutex, never under the file-system lock. POSIX record locks belong to the session (the
//!   client process) and go when it closes *any* handle of the file, as POSIX requires, or
//!   ends; OFD and `flock` locks belong to an open file description: every open makes one, a
//!   fork bundle's copies of a handle share it (as a forked child shares its parent's open
//!   files), and its locks go when the last handle carrying it is closed or released.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Instant;

use rustix::event::epoll;

use moneta_abi::control::{errno, Failure, RIGHT_READ, RIGHT_WRITE};
use moneta_abi::fsproto::*;
use moneta_device::failstop::FailStop;
use moneta_device::Media;
use moneta_device::{Device, FileService, FsOutcome, LookupAnswer, Refill, TableOp};
use moneta_fs::{Cred, Fs, FsError, Mapping, SetTime, Stat, SyncPlan, Time};

use crate::locks::{Held, LockError, Locks, Mode, Owner, Range};

mod commit;
mod durable;
mod fork;
mod leases;
mod mapping;
mod quick;
mod release;
mod segments;
mod session;
mod sizes;
mod sole;
mod statdir;
mod wire;

use fork::Bundles;
use leases::Leases;
pub use leases::RECALL_WAIT;
use release::{Releases, Revocation};
use segments::{Segments, Store};
pub use session::Session;
use session::*;
use sole::SoleLeases;
use wire::*;

/// Most open handles per connection.
pub const MAX_HANDLES: usize = 65536;
/// Most fork bundles waiting to be claimed, in all.
pub const MAX_BUNDLES: usize = 4096;
/// Most fork bundles waiting to be claimed that one user's connections made.
pub const MAX_BUNDLES_PER_UID: usize = 1024;

/// The permission manager: the mounted file system and the device whose tables it fills.
pub struct Manager {
    fs: Arc<Mutex<Fs>>,
    /// Handles published for the poller's `OP_LOOKUP`.
    registry: Registry,
    device: Arc<Device>,
    bundles: Mutex<Bundles>,
    /// Hang-ups of the bundles' pipes (read ends), keyed by bundle id.
    hangups: OwnedFd,
    locks: Mutex<LockState>,
    /// The array, for flushes made outside the file-system lock.
    media: Arc<dyn Media>,
    /// The flush lanes of `media` the group commit takes turns in (`0..commit_lanes`).
    commit_lanes: u64,
    /// The file system's durability level (fixed at mount).
    durability: moneta_fs::Durability,
    syncs: commit::Syncs,
    /// Files whose last name or handle a quick call dropped, for the releaser thread to close
    /// (see `quick.rs`).
    releases: Mutex<Releases>,
    release_wake: Condvar,
    /// Signalled when a settler that revoked without the file-system lock is done
    /// (`Releases::settling`).
    settled: Condvar,
    /// Revokes freed space everywhere (the file system's revoker, which the releaser also
    /// calls without the file-system lock).
    revocation: Arc<Revocation>,
    /// Work is queued in `releases` (a hint that spares a socket call the locks).
    work_queued: std::sync::atomic::AtomicBool,
    /// The pages of mapped files (taken after the file-system lock, never before it).
    segments: Arc<Mutex<Segments>>,
    /// The member hosts sharing the file system, whose records every revocation reaches.
    members: Arc<std::sync::OnceLock<Weak<crate::share::Holder>>>,
    /// The durability page, at the `host` level (`OP_FS_DURABLE`).
    durable: Option<Arc<durable::Durable>>,
}

/// Advisory locks and what owns them.
#[derive(Default)]
struct LockState {
    table: Locks,
    /// Per open-file-description id: the handles carrying it, in sessions and in bundles.
    ofds: HashMap<u64, usize, moneta_fs::idhash::IdHash>,
    next_ofd: u64,
    /// Lock leases out in channels (`leases.rs`).
    leases: Leases,
    /// Sole leases out in channels (`sole.rs`).
    sole: SoleLeases,
}

impl LockState {
    /// One handle carrying `ofd` fewer; the last one takes its locks along.
    fn close_ofd(&mut self, ofd: u64) {
        match self.ofds.get_mut(&ofd) {
            Some(n) if *n > 1 => *n -= 1,
            _ => {
                self.ofds.remove(&ofd);
                self.table.release_owner(Owner::Ofd(ofd));
            }
        }
    }
}

/// The poller's side of the soft miss (`OP_LOOKUP`) and of file calls through the channel
/// (`OP_FS`): answers from the published handles and the file system when both are free at
/// once, and otherwise not at all.
struct Front {
    registry: Registry,
    manager: Weak<Manager>,
}

impl FileService for Front {
    fn try_call(&self, channel: u32, request: &[u8], room: usize) -> Option<FsOutcome> {
        let session = {
            let registry = self.registry.try_lock().ok()?;
            registry.get(&channel)?.session.upgrade()?
        };
        self.manager
            .upgrade()?
            .quick_request(&session, channel, request, room)
    }

    fn try_refill(&self, channel: u32, file: u64, addr: u64, len: u64) -> Refill {
        self.refill(channel, file, addr, len)
    }

    fn try_lookup(
        &self,
        channel: u32,
        handle: u64,
        offset: u64,
        len: u64,
        max: usize,
    ) -> Option<LookupAnswer> {
        // The poller installs the answer's records before it takes its next control request.
        // A close takes the handle out of the registry before it sends the removal of the
        // file's records, and a truncate revokes freed space under the file-system lock: so
        // either this sees neither lock free or no handle, or the removal comes after the
        // records it would have to remove.
        let registry = self.registry.try_lock().ok()?;
        let (ino, rights) = registry.get(&channel)?.get(handle)?;
        let m = self.manager.upgrade()?;
        let mut fs = m.fs.try_lock().ok()?;
        let (size, maps) = fs.map(ino, offset, len, max).ok()?;
        let file = fs.layout_tag(ino);
        Some(LookupAnswer {
            size,
            rights: rights as u8,
            file,
            runs: maps.iter().map(|m| (m.file_off, m.len, m.dev)).collect(),
        })
    }
}

impl Front {
    /// [`FileService::try_refill`]: the runs of the file with layout tag `file` over
    /// `[addr, addr + len)` when the connection of `channel` holds a sole lease on it (out,
    /// or ended with its writes still waited for), with the connection's rights. Read under
    /// the locks a lookup takes, so a revocation of the file's space (under the file-system
    /// lock) or a close (which withdraws the handle first) is never undone by it. The lease
    /// is looked at first, so a channel without one is answered at once.
    fn refill(&self, channel: u32, file: u64, addr: u64, len: u64) -> Refill {
        use std::sync::TryLockError;
        let Some(m) = self.manager.upgrade() else {
            return Refill::No;
        };
        // The lock table and the registry stay consistent across a panic (their updates are
        // single steps), as their other users assume.
        let locks = match m.locks.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return Refill::Busy,
        };
        let inos: Vec<u64> = locks.sole.inos_of(channel).collect();
        if inos.is_empty() {
            return Refill::No;
        }
        let registry = match self.registry.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return Refill::Busy,
        };
        let Some(published) = registry.get(&channel) else {
            return Refill::No;
        };
        let mut fs = match m.fs.try_lock() {
            Ok(g) => g,
            // A poisoned file system stops the daemon (`Manager::fs`).
            Err(TryLockError::Poisoned(_)) => return Refill::No,
            Err(TryLockError::WouldBlock) => return Refill::Busy,
        };
        let Some(ino) = inos
            .into_iter()
            .find(|&ino| fs.exists(ino) && fs.layout_tag(ino) == file)
        else {
            return Refill::No;
        };
        let rights = published.rights.get(&ino).copied().unwrap_or(0) as u8;
        if rights & moneta_device::WRITE == 0 {
            return Refill::No;
        }
        // A bounded look on the poller, whatever the client's command names.
        match fs.allocated_over(ino, addr, len, REFILL_EXTENTS) {
            Some(runs) if !runs.is_empty() => Refill::Runs { rights, runs },
            _ => Refill::No,
        }
    }
}

/// Most extents of a file the poller looks through to install a posted write's records again
/// ([`Front::refill`]); a file in more pieces than that gets the miss.
const REFILL_EXTENTS: usize = 1024;

/// A handle the connection does not hold.
fn no_handle() -> Failure {
    fail(errno::EBADF, "no such handle on this connection")
}

/// The records to install in `channel` for the mapped runs of `h`'s file, with the session's
/// rights on it.
fn inserts(s: &Session, channel: u32, h: &Handle, maps: &[Mapping], file: u64) -> Vec<TableOp> {
    let rights = s.rights(h.ino) as u8;
    maps.iter()
        .filter_map(|m| {
            m.dev.map(|start| TableOp::Insert {
                channel,
                start,
                len: m.len,
                rights,
                file,
            })
        })
        .collect()
}

/// The attributes of a target: an open handle of `s`, or a path looked up with `s`'s
/// credentials. A connection with a channel may keep the answer (an error too): its
/// change-board counter for the target is watched on every inode the answer depended on
/// (docs/abi.md §3.7).
fn stat_target(
    fs: &mut Fs,
    cred: &Cred,
    handle_ino: impl FnOnce(u64) -> Result<u64, Failure>,
    channel: Option<u32>,
    target: &Target,
) -> Result<FsReply, Failure> {
    // A path's dependencies: two for each directory searched, and the inode reached.
    let mut seen = Vec::with_capacity(16);
    let mut watched = channel.is_some();
    let st = match target {
        Target::Handle(h) => handle_ino(*h).map(|ino| {
            seen.push(ino);
            if let Some(c) = channel {
                sizes::read_by_another(fs, c, ino);
            }
            fs.stat_ino(ino)
        }),
        Target::Path { path, follow } => {
            // A channel without room for what the answer depends on (two things for each
            // directory searched, and what it reached; links followed add more, and the
            // watch checks exactly) gets it unwatched, so the walk need not list them.
            let deps = 2 * path.iter().filter(|&&b| b == b'/').count() + 2;
            if channel.is_some_and(|c| fs.watch_room(c) < deps) {
                watched = false;
                fs.stat(cred, path, *follow).map_err(failure)
            } else {
                fs.stat_seen(cred, path, *follow, &mut seen)
                    .map_err(failure)
            }
        }
    };
    if let Some(channel) = channel {
        let slot = moneta_abi::change_slot(target) as u16;
        if let (true, Target::Handle(h), &[ino]) = (watched, target, seen.as_slice()) {
            watch_handle(fs, channel, *h, ino);
        } else if watched {
            fs.watch(channel, slot, &seen);
        } else {
            fs.unkept(channel, slot);
        }
    }
    Ok(FsReply::Stat(wire_stat(&st?)))
}

/// After an unlink of `path` that succeeded, on a connection whose channel is `channel`, and
/// under the same lock of the file system: watches what a stat of the path (either follow
/// flag) depends on now, as if that stat had been asked, so that the client may keep `ENOENT`
/// as its answer (docs/abi.md §3.7). An answer that is not `ENOENT` (none can be, so soon
/// after the name went) moves its counter instead.
fn watch_unlinked(fs: &mut Fs, cred: &Cred, channel: Option<u32>, path: &[u8]) {
    let Some(c) = channel else { return };
    let slots = [true, false].map(|follow| {
        moneta_abi::change_slot(&Target::Path {
            path: path.to_vec(),
            follow,
        }) as u16
    });
    // With its last name missing, the path's walk is the same for both follow flags: one
    // walk, watched under both counters (room for both, as `stat_target` counts it).
    let deps = 2 * path.iter().filter(|&&b| b == b'/').count() + 2;
    let mut seen = Vec::with_capacity(16);
    let gone = fs.watch_room(c) >= 2 * deps
        && matches!(
            fs.stat_seen(cred, path, false, &mut seen),
            Err(e) if e.errno == libc::ENOENT
        );
    for slot in slots {
        if gone {
            fs.watch(c, slot, &seen);
        } else {
            fs.unkept(c, slot);
        }
    }
}

/// The change-board counters of the connection's channel: a client may keep the attributes
/// an `OPEN` answered with as the answer to a `STAT` of the new handle.
fn watch_opened(fs: &mut Fs, channel: Option<u32>, reply: &FsReply) {
    let (
        Some(channel),
        FsReply::Opened { handle, stat, .. } | FsReply::OpenedRoom { handle, stat, .. },
    ) = (channel, reply)
    else {
        return;
    };
    watch_handle(fs, channel, *handle, stat.ino);
}

/// Watches the answer about `handle` (of `ino`) that `channel`'s process may keep: also while
/// the file has a size grant, if that handle of that channel holds it (docs/abi.md §3.9).
fn watch_handle(fs: &mut Fs, channel: u32, handle: u64, ino: u64) {
    let slot = moneta_abi::change_slot(&Target::Handle(handle)) as u16;
    if sizes::holds_grant(fs, ino, channel, handle) {
        fs.watch_holder(channel, slot, &[ino]);
    } else {
        fs.watch(channel, slot, &[ino]);
    }
}

/// Announces changes on the channels' change boards (docs/abi.md §3.7).
pub(crate) struct Board(pub Arc<Device>);

impl moneta_fs::ChangeSink for Board {
    fn changed(&self, channel: u32, slot: u16) {
        self.0.bump_change(channel, slot);
    }
}

/// The removals of `channel`'s records of `ino`: they lie inside its extents, since they were
/// installed over extents and space that left the file was revoked from every channel then.
/// (A directory has no extents and no records.)
fn removals(fs: &Fs, ino: u64, channel: u32) -> Vec<TableOp> {
    let maps = fs
        .map(ino, 0, u64::MAX, usize::MAX)
        .map(|(_, m)| m)
        .unwrap_or_default();
    maps.iter()
        .filter_map(|m| {
            m.dev.map(|start| TableOp::RemoveRange {
                channel,
                start,
                len: m.len,
            })
        })
        .collect()
}

impl Manager {
    /// A manager over `fs` for `device`; installs the revocation hook and answers the
    /// poller's file calls. Mapped files of a persistent array keep their pages in `pages`
    /// (a directory beside the backing file; without it they cannot be mapped), where
    /// whatever a killed daemon left is folded back into the array first. The group commit
    /// flushes through the array's flush lanes `0..commit_lanes` (`Media::flush_ranges_in`):
    /// the others are left to other flushers.
    pub fn new(
        mut fs: Fs,
        device: Arc<Device>,
        pages: Option<std::path::PathBuf>,
        commit_lanes: usize,
    ) -> Result<Arc<Manager>, FsError> {
        let d = device.clone();
        let store = if fs.integrity().is_some() {
            Store::Refused(
                "files of an array with data checksums cannot be mapped: stores through a \
                 mapping would bypass the checksums",
            )
        } else if !fs.media().persistent() {
            Store::Memory
        } else {
            match pages {
                Some(path) => Store::Dir {
                    path,
                    host: fs.durability() == moneta_fs::Durability::Host,
                },
                None => Store::Refused("this array has no place for mapped files' pages"),
            }
        };
        let segments = Segments::new(fs.media(), device.clone(), store);
        let folded = segments
            .recover(|ino| {
                (fs.exists(ino) && fs.stat_ino(ino).mode & libc::S_IFMT == libc::S_IFREG)
                    .then(|| fs.allocated(ino))
            })
            .map_err(|f| FsError {
                errno: f.errno,
                message: f.message,
            })?;
        if folded > 0 {
            tracing::info!(
                files = folded,
                "pages of mapped files folded back into the array"
            );
        }
        let segments = Arc::new(Mutex::new(segments));
        let members = Arc::new(std::sync::OnceLock::<Weak<crate::share::Holder>>::new());
        let revocation = Arc::new(Revocation {
            device: d.clone(),
            segments: segments.clone(),
            members: members.clone(),
        });
        let revoker = revocation.clone();
        fs.set_revoker(Box::new(move |ranges| revoker.revoke(ranges)));
        // Clients keep answers about attributes while their change-board counters stay put.
        fs.set_change_sink(Arc::new(Board(device.clone())));
        // At the `device` level an fsync has nothing to make durable, and on a volatile array
        // nothing is durable past the daemon at all: clients answer it.
        let mut flags = moneta_abi::FS_CHANGE_BOARD
            | moneta_abi::FS_LOCK_LEASES
            | moneta_abi::FS_SIZE_LEASES
            | moneta_abi::FS_UNLINK_KEPT
            | moneta_abi::FS_ROOM_AT_OPEN;
        if !fs.geometry().data_checksums() {
            // A write into a damaged checksummed block fails, and must say so when it
            // returns: with checksums, no write is posted.
            flags |= moneta_abi::FS_SOLE_LEASES;
        }
        if fs.durability() == moneta_fs::Durability::Device {
            flags |= moneta_abi::FS_FSYNC_IS_ORDER;
        }
        if fs.volatile() {
            flags |= moneta_abi::FS_VOLATILE;
        }
        let durable_page = if fs.durability() == moneta_fs::Durability::Host {
            match durable::Durable::create() {
                Ok(page) => {
                    let page = Arc::new(page);
                    fs.set_progress(page.clone());
                    flags |= moneta_abi::FS_DURABLE_PAGE;
                    Some(page)
                }
                Err(e) => {
                    tracing::warn!("no durability page for clients: {e}");
                    None
                }
            }
        } else {
            None
        };
        device.set_fs_flags(flags);
        let media = fs.media();
        let durability = fs.durability();
        let fs = Arc::new(Mutex::new(fs));
        let registry = Registry::default();
        Ok(Arc::new_cyclic(|me| {
            device.set_file_service(Arc::new(Front {
                registry: registry.clone(),
                manager: me.clone(),
            }));
            Manager {
                fs,
                registry,
                device,
                bundles: Mutex::new(Bundles::default()),
                hangups: epoll::create(epoll::CreateFlags::CLOEXEC).expect("epoll_create"),
                locks: Mutex::new(LockState::default()),
                media,
                commit_lanes: commit_lanes.max(1) as u64,
                durability,
                syncs: commit::Syncs::default(),
                releases: Mutex::new(Releases::default()),
                release_wake: Condvar::new(),
                settled: Condvar::new(),
                revocation,
                work_queued: std::sync::atomic::AtomicBool::new(false),
                segments,
                members,
                durable: durable_page,
            }
        }))
    }

    /// Revokes freed space on the member hosts of `holder` too, from now on.
    pub fn share_revocations(&self, holder: Arc<crate::share::Holder>) {
        let _ = self.members.set(Arc::downgrade(&holder));
    }

    /// Folds the mapped files' pages back into the array and checkpoints the file system's
    /// journal (a clean stop, after the device's): everything is durable and the tables stand
    /// without the journal.
    pub fn unmount(&self) -> Result<(), FsError> {
        self.settle_releases();
        {
            // The array holds every byte of the mapped files again (the device has stopped:
            // nothing reaches them meanwhile).
            let _fs = self.fs();
            self.segments().retire_all().map_err(|f| FsError {
                errno: f.errno,
                message: f.message,
            })?;
        }
        self.fs().unmount()
    }

    fn locks(&self) -> MutexGuard<'_, LockState> {
        // The table is consistent between calls: no update panics half-way by design, and
        // one that did would at worst leave a count off, not a dangling reference.
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the thread that releases fork bundles whose pipes hung up, and the one that
    /// finishes what quick calls leave (see `quick.rs`).
    pub fn start_reaper(self: &Arc<Self>) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("moneta-reaper".into())
            .spawn(move || {
                let _stop = FailStop::new("reaper of fork bundles");
                me.reap()
            })?;
        let me = self.clone();
        std::thread::Builder::new()
            .name("moneta-releaser".into())
            .spawn(move || {
                let _stop = FailStop::new("releaser of freed files");
                me.release_loop()
            })
            .map(|_| ())
    }

    fn fs(&self) -> MutexGuard<'_, Fs> {
        // A panic while holding the lock leaves the mirror unknown; the daemon must not go on.
        self.fs.lock().unwrap_or_else(|_| {
            tracing::error!("the file system lock is poisoned; stopping");
            std::process::abort()
        })
    }

    /// Publishes the session's handles for `OP_LOOKUP` on `channel`, the connection's channel,
    /// once it has one.
    fn publish(&self, s: &mut Session, channel: Option<u32>) {
        let Some(channel) = channel else { return };
        if s.published.is_some() || s.ending {
            return;
        }
        let mut p = Published {
            session: s.me.clone(),
            cred: Arc::new(s.cred.clone()),
            ..Default::default()
        };
        for (&handle, h) in &s.handles {
            p.insert(handle, h.ino, s.rights(h.ino));
        }
        lock_registry(&self.registry).insert(channel, p);
        s.published = Some((channel, self.registry.clone()));
    }

    /// Withdraws the session's handles from `OP_LOOKUP`: before its channel is closed, whose
    /// id another connection may get next. The session ends with it: it is not published
    /// again.
    pub fn unpublish(&self, s: &mut Session) {
        s.ending = true;
        if let Some((channel, _)) = &s.published {
            // The connection lives on: its locks come back to the table.
            let channel = *channel;
            self.recall_session(s.id);
            Self::forget_channel(&mut self.locks(), channel);
        }
        if let Some((channel, r)) = s.published.take() {
            // What the channel rang under sole leases is carried out before it goes.
            self.recall_sole_channel(channel);
            lock_registry(&r).remove(&channel);
            // Another connection may get the id: it must not inherit these watches, nor
            // these size grants (what they published counts).
            let mut fs = self.fs();
            self.end_channel_grants(&mut fs, channel);
            fs.unwatch(channel);
        }
    }

    /// Releases everything a closing connection held. Its channel is already gone.
    pub fn end_session(&self, s: &mut Session) {
        {
            let mut locks = self.locks();
            for ino in locks.leases.of_session(s.id) {
                self.drop_lease(&mut locks, ino);
            }
            if let Some((channel, _)) = &s.published {
                Self::forget_channel(&mut locks, *channel);
            }
            locks.table.release_owner(Owner::Session(s.id));
            for h in s.handles.values() {
                locks.close_ofd(h.ofd);
            }
        }
        self.unpublish(s);
        let mut fs = self.fs();
        s.per_file.clear();
        for (_, h) in s.handles.drain() {
            if let Err(e) = fs.close(h.ino) {
                tracing::warn!(ino = h.ino, "closing a handle of a finished session: {e}");
            }
        }
    }

    /// A new handle of `s` for a file just opened, with an open file description of its own.
    fn opened(s: &mut Session, locks: &mut LockState, o: moneta_fs::Opened) -> FsReply {
        locks.next_ofd += 1;
        let ofd = locks.next_ofd;
        locks.ofds.insert(ofd, 1);
        let handle = s.next;
        s.next += 1;
        s.add(
            handle,
            Handle {
                ino: o.ino,
                read: o.read,
                write: o.write,
                ofd,
            },
        );
        let rights = if o.read { RIGHT_READ } else { 0 } | if o.write { RIGHT_WRITE } else { 0 };
        FsReply::Opened {
            handle,
            rights,
            stat: wire_stat(&o.stat),
        }
    }

    fn handle(s: &Session, h: u64) -> Result<Handle, Failure> {
        s.handles.get(&h).copied().ok_or_else(no_handle)
    }

    fn target_ino(&self, fs: &Fs, s: &Session, t: &Target) -> Result<u64, Failure> {
        match t {
            Target::Handle(h) => Ok(Self::handle(s, *h)?.ino),
            Target::Path { path, follow } => fs.lookup(&s.cred, path, *follow).map_err(failure),
        }
    }

    /// Installs records for the mapped runs in `channel` with the session's rights on `h`'s
    /// file. Called with the file-system lock held, so the extents cannot be freed meanwhile.
    fn install(
        &self,
        s: &Session,
        channel: Option<u32>,
        h: &Handle,
        maps: &[Mapping],
        file: u64,
    ) -> Result<(), Failure> {
        let Some(channel) = channel else {
            return Ok(());
        };
        let ops = inserts(s, channel, h, maps, file);
        if ops.is_empty() {
            return Ok(());
        }
        // Posted, not waited for: the poller takes them in before any later control request
        // and before refusing a command for want of them (see `Device::post`).
        self.device
            .post(ops)
            .map_err(|e| fail(errno::EIO, &format!("cannot install records: {e}")))
    }

    /// `OP_FS_LOCK` on handle `h` of session `s`.
    #[allow(clippy::too_many_arguments)]
    fn lock(
        locks: &mut LockState,
        s: &Session,
        h: &Handle,
        kind: LockKind,
        cmd: LockCmd,
        ty: LockType,
        wait: bool,
        start: u64,
        len: u64,
    ) -> Result<FsReply, Failure> {
        let mode = match ty {
            LockType::Read => Some(Mode::Read),
            LockType::Write => Some(Mode::Write),
            LockType::Unlock => None,
        };
        let owner = match kind {
            LockKind::Posix => Owner::Session(s.id),
            LockKind::Ofd | LockKind::Flock => Owner::Ofd(h.ofd),
        };
        match (kind, cmd) {
            (LockKind::Flock, LockCmd::Test) => Err(fail(
                errno::EINVAL,
                "flock locks cannot be tested; try a set without waiting instead",
            )),
            // flock does not care how the file was opened, and reports no deadlocks.
            (LockKind::Flock, LockCmd::Set) => {
                locks
                    .table
                    .flock(h.ino, h.ofd, s.pid, mode)
                    .map_err(lock_failure)?;
                Ok(FsReply::Empty)
            }
            (_, LockCmd::Test) => {
                let range = lock_range(start, len)?;
                let Some(mode) = mode else {
                    return Err(fail(
                        errno::EINVAL,
                        "a lock test needs a read or write type",
                    ));
                };
                let found = locks.table.test(h.ino, owner, mode, range);
                Ok(FsReply::Lock(match found {
                    Some(held) => wire_lock(&held),
                    None => FsLock {
                        ty: LockType::Unlock,
                        pid: 0,
                        start,
                        len,
                    },
                }))
            }
            (_, LockCmd::Set) => {
                let range = lock_range(start, len)?;
                // As fcntl: a read lock needs a handle open for reading, a write lock one open
                // for writing.
                match mode {
                    Some(Mode::Read) if !h.read => {
                        return Err(fail(
                            errno::EBADF,
                            "a read lock needs a handle open for reading",
                        ))
                    }
                    Some(Mode::Write) if !h.write => {
                        return Err(fail(
                            errno::EBADF,
                            "a write lock needs a handle open for writing",
                        ))
                    }
                    _ => {}
                }
                locks
                    .table
                    .set(h.ino, owner, s.pid, mode, range, wait, Instant::now())
                    .map_err(lock_failure)?;
                Ok(FsReply::Empty)
            }
        }
    }

    /// Answers one file-system call of session `s`, whose channel (if it opened one) is
    /// `channel`.
    pub fn call(
        &self,
        s: &mut Session,
        channel: Option<u32>,
        req: FsRequest,
    ) -> Result<FsReply, Failure> {
        self.publish(s, channel);
        // What quick calls left is done first: a call here sees every unlinked file freed.
        self.settle_releases();
        let cred = s.cred.clone();
        let room_asked = matches!(req, FsRequest::OpenRoom { .. });
        match req {
            FsRequest::Open { flags, mode, path } | FsRequest::OpenRoom { flags, mode, path } => {
                if s.handles.len() >= MAX_HANDLES {
                    return Err(fail(
                        errno::EMFILE,
                        "too many open files on this connection",
                    ));
                }
                let mut fs = self.open_truncating(&cred, &path, flags as i32);
                let o = fs.open(&cred, &path, flags as i32, mode).map_err(failure)?;
                let ino = o.ino;
                let mut reply = {
                    let mut locks = self.locks();
                    let reply = Self::opened(s, &mut locks, o);
                    if let (Some(c), FsReply::Opened { handle, .. }) = (channel, &reply) {
                        if let Some(h) = s.handles.get(handle).copied() {
                            let sole = fs.open_count(ino) == 1 && !self.segments().has(ino);
                            self.try_grant_sole(&mut locks, s, c, *handle, &h, sole);
                        }
                    }
                    reply
                };
                if room_asked {
                    let mapped = |ino| self.segments().has(ino);
                    let (r, given) =
                        self.opened_room(&mut fs, s, channel, mapped, reply, MAX_EXTENTS);
                    reply = r;
                    if let Some((h, maps, file)) = given {
                        // The open stands whatever happens to its room; a client without the
                        // records extends as after a plain open.
                        if let Err(e) = self.install(s, channel, &h, &maps, file) {
                            tracing::warn!("installing the records of room at open: {}", e.message);
                        }
                    }
                }
                // After the room's transaction, which fires the file's watches.
                watch_opened(&mut fs, channel, &reply);
                drop(fs);
                // The file is open twice now, so no lease on it can be granted again: take
                // back the one out, before the new handle can see the file's locks, and end
                // a sole lease once its holder's writes are in the array, before the new
                // handle can read.
                self.recall_waiting(ino);
                let mine = match &reply {
                    FsReply::Opened { handle, .. } | FsReply::OpenedRoom { handle, .. } => {
                        self.holds_sole(ino, channel, *handle)
                    }
                    _ => false,
                };
                if !mine {
                    self.recall_sole(ino);
                }
                Ok(reply)
            }
            FsRequest::Close { handle } => {
                let h = Self::handle(s, handle)?;
                let before = s.rights(h.ino);
                s.remove(handle);
                {
                    // POSIX: closing any descriptor of a file drops the process's locks on it,
                    // those in a lease too.
                    let mut locks = self.locks();
                    self.drop_lease(&mut locks, h.ino);
                    self.drop_sole(&mut locks, channel, handle, h.ino);
                    locks.table.release(h.ino, Owner::Session(s.id));
                    locks.close_ofd(h.ofd);
                }
                let after = s.rights(h.ino);
                let mut fs = self.fs();
                self.end_size_grant(&mut fs, channel, handle);
                if let (Some(channel), true) = (channel, after != before) {
                    // The channel's records of the file lie inside its extents: they were
                    // installed over extents, and space that left the file was revoked from
                    // every channel then. Under the file-system lock, so none can be added
                    // meanwhile (the poller's lookups give up on a busy lock).
                    let ops = removals(&fs, h.ino, channel);
                    if !ops.is_empty() {
                        self.device.update(ops).map_err(|e| {
                            fail(errno::EIO, &format!("cannot revoke records: {e}"))
                        })?;
                    }
                }
                fs.close(h.ino).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Lookup {
                handle,
                offset,
                len,
            } => {
                let h = Self::handle(s, handle)?;
                let mut fs = self.fs();
                let (size, maps) = fs.map(h.ino, offset, len, MAX_EXTENTS).map_err(failure)?;
                let file = fs.layout_tag(h.ino);
                self.install(s, channel, &h, &maps, file)?;
                Ok(extents(size, file, &maps))
            }
            FsRequest::Extend {
                handle,
                offset,
                len,
            } => {
                let h = Self::handle(s, handle)?;
                if !h.write {
                    return Err(fail(errno::EBADF, "the handle is not open for writing"));
                }
                let mut fs = self.fs();
                let mapped = self.segments().has(h.ino);
                let (size, maps) = self.extend_with_room(
                    &mut fs,
                    channel,
                    mapped,
                    &h,
                    handle,
                    offset,
                    len,
                    MAX_EXTENTS,
                )?;
                self.show_grown(&mut fs, h.ino, size)?;
                let file = fs.layout_tag(h.ino);
                self.install(s, channel, &h, &maps, file)?;
                Ok(extents(size, file, &maps))
            }
            FsRequest::Fsync { handle } => {
                let h = Self::handle(s, handle)?;
                self.fsync(h.ino).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Stat { target } => stat_target(
                &mut self.fs(),
                &s.cred,
                |h| Self::handle(s, h).map(|h| h.ino),
                channel,
                &target,
            ),
            FsRequest::Truncate { target, size } => {
                let mut fs = self.fs();
                let ino = match &target {
                    Target::Handle(h) => {
                        let h = Self::handle(s, *h)?;
                        if !h.write {
                            return Err(fail(errno::EINVAL, "the handle is not open for writing"));
                        }
                        fs.truncate_open(h.ino, size).map_err(failure)?;
                        h.ino
                    }
                    Target::Path { path, .. } => {
                        drop(fs);
                        fs = self.open_truncating(&cred, path, libc::O_TRUNC);
                        fs.truncate(&cred, path, size).map_err(failure)?;
                        fs.lookup(&cred, path, true).map_err(failure)?
                    }
                };
                // What the truncation added is part of the mapped pages.
                self.show_grown(&mut fs, ino, size)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Chmod { target, mode } => {
                let mut fs = self.fs();
                let ino = self.target_ino(&fs, s, &target)?;
                fs.chmod(&cred, ino, mode).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Chown { target, uid, gid } => {
                let mut fs = self.fs();
                let ino = self.target_ino(&fs, s, &target)?;
                let opt = |v: u32| (v != u32::MAX).then_some(v);
                fs.chown(&cred, ino, opt(uid), opt(gid)).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Utimes {
                target,
                atime,
                mtime,
            } => {
                let mut fs = self.fs();
                let ino = self.target_ino(&fs, s, &target)?;
                fs.utimes(&cred, ino, set_time(atime), set_time(mtime))
                    .map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Mkdir { mode, path } => {
                let st = self.fs().mkdir(&cred, &path, mode).map_err(failure)?;
                Ok(FsReply::Stat(wire_stat(&st)))
            }
            FsRequest::Rmdir { path } => {
                self.fs().rmdir(&cred, &path).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Unlink { path } => {
                self.fs().unlink(&cred, &path).map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::UnlinkKeep { path } => {
                let mut fs = self.fs();
                fs.unlink(&cred, &path).map_err(failure)?;
                watch_unlinked(&mut fs, &cred, channel, &path);
                Ok(FsReply::Empty)
            }
            FsRequest::Rename { flags, from, to } => {
                self.fs()
                    .rename(&cred, &from, &to, flags & RENAME_NOREPLACE != 0)
                    .map_err(failure)?;
                Ok(FsReply::Empty)
            }
            FsRequest::Link { from, to } => {
                let st = self.fs().link(&cred, &from, &to).map_err(failure)?;
                Ok(FsReply::Stat(wire_stat(&st)))
            }
            FsRequest::Symlink { target, path } => {
                let st = self.fs().symlink(&cred, &target, &path).map_err(failure)?;
                Ok(FsReply::Stat(wire_stat(&st)))
            }
            FsRequest::Readlink { path } => {
                let t = self.fs().readlink(&cred, &path).map_err(failure)?;
                Ok(FsReply::Bytes(t))
            }
            FsRequest::Readdir { handle, cookie } => {
                let h = Self::handle(s, handle)?;
                if !h.read {
                    return Err(fail(errno::EBADF, "the handle is not open for reading"));
                }
                let (list, end) = self.fs().readdir(h.ino, cookie, 1024).map_err(failure)?;
                // Fill the reply up to the message limit.
                Ok(dir_reply(
                    list,
                    end,
                    moneta_abi::control::MAX_MESSAGE - moneta_abi::control::HEADER_LEN - 16,
                ))
            }
            FsRequest::StatDir {
                path,
                cookie,
                follow,
            } => statdir::stat_dir(
                &mut self.fs(),
                &cred,
                channel,
                &path,
                cookie,
                follow,
                statdir::MOST_ENTRIES,
                moneta_abi::control::MAX_MESSAGE
                    - moneta_abi::control::HEADER_LEN
                    - 16
                    - FsReply::STATS_HEAD,
            ),
            FsRequest::Fork => Err(fail(
                errno::EPROTO,
                "fork is answered by the server, with a descriptor",
            )),
            FsRequest::Inherit {
                bundle,
                secret,
                from,
            } => self.inherit(s, bundle, secret, from),
            FsRequest::Lock {
                handle,
                kind,
                cmd,
                ty,
                wait,
                start,
                len,
            } => {
                let h = Self::handle(s, handle)?;
                self.recall_waiting(h.ino);
                Self::lock(&mut self.locks(), s, &h, kind, cmd, ty, wait, start, len)
            }
            FsRequest::Statfs => Ok(statfs_reply(&self.fs())),
            FsRequest::Map { .. } | FsRequest::Durable => Err(fail(
                errno::EPROTO,
                "this call is answered with a descriptor, not here",
            )),
        }
    }
}
