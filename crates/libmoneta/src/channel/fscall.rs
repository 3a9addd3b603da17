//! File-system calls through the channel (`OP_FS`, docs/abi.md §4.1): the request message the
//! control socket would carry goes into a tag's slice of the DMA buffer, and the device's
//! poller answers it in the pass that takes it, with no daemon thread to wake. A call the
//! device cannot answer at once (a busy lock, a call that would wait for the disk or free
//! space) comes back `Refer`, and is then sent on the control socket, which answers it the
//! same way.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use moneta_abi::control::{decode_reply, encode_request, ReplyBody, Request};
use moneta_abi::fsproto::{FsReply, FsRequest, FsStat, Target};
use moneta_abi::{Command, Completion, Opcode, Status};

use super::attrs::Key;
use super::Channel;
use crate::ClientError;

/// Set once a daemon did not know `OP_FS` (it answers `Malformed`): this process then sends
/// its calls on the socket only.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// File-system calls this process made, by operation (`op - OP_FS_OPEN`), whichever way
/// they went.
static CALLS: [AtomicU64; 32] = [const { AtomicU64::new(0) }; 32];

/// Where stats of open handles are counted in [`CALLS`] (past every operation).
const FSTAT: usize = 24;

/// `STAT` calls answered from what was kept ([`crate::channel::attrs`]), counted in
/// [`CALLS`] too.
static KEPT: AtomicU64 = AtomicU64::new(0);

/// How many `STAT` calls were answered without asking the daemon.
pub fn stats_kept() -> u64 {
    KEPT.load(Ordering::Relaxed)
}

/// Closes posted without waiting for their answers ([`crate::File::close_soon`]), counted in
/// [`CALLS`] too.
pub(crate) static POSTED: AtomicU64 = AtomicU64::new(0);

/// How many closes were posted without waiting for their answers.
pub fn closes_posted() -> u64 {
    POSTED.load(Ordering::Relaxed)
}

/// The file-system calls this process has made so far, by name (those made at least once),
/// in the order of their operation numbers: what `MONETA_REPORT` prints.
pub fn calls_made() -> Vec<(&'static str, u64)> {
    const NAMES: [&str; 25] = [
        "open", "close", "lookup", "extend", "fsync", "stat", "truncate", "chmod", "chown",
        "utimes", "mkdir", "rmdir", "unlink", "rename", "link", "symlink", "readlink", "readdir",
        "statfs", "fork", "inherit", "lock", "map", "statdir", "fstat",
    ];
    NAMES
        .iter()
        .zip(CALLS.iter())
        .map(|(n, c)| (*n, c.load(Ordering::Relaxed)))
        .filter(|&(_, c)| c > 0)
        .collect()
}

/// A switch read once from the environment: `on` (the default) or `off`.
fn switch(name: &str, warned: &'static std::sync::Once, cell: &std::sync::OnceLock<bool>) -> bool {
    *cell.get_or_init(|| {
        !crate::env_setting(
            name,
            |v| match v {
                "on" => Some(false),
                "off" => Some(true),
                _ => None,
            },
            "on or off",
            warned,
        )
    })
}

/// The handle a request names, if any.
fn handle_named(req: &FsRequest) -> Option<u64> {
    match req {
        FsRequest::Close { handle }
        | FsRequest::Lookup { handle, .. }
        | FsRequest::Extend { handle, .. }
        | FsRequest::Fsync { handle }
        | FsRequest::Readdir { handle, .. }
        | FsRequest::Map { handle, .. }
        | FsRequest::Lock { handle, .. } => Some(*handle),
        FsRequest::Stat { target }
        | FsRequest::Truncate { target, .. }
        | FsRequest::Chmod { target, .. }
        | FsRequest::Chown { target, .. }
        | FsRequest::Utimes { target, .. } => match target {
            Target::Handle(h) => Some(*h),
            Target::Path { .. } => None,
        },
        _ => None,
    }
}

/// Counts a file call for the report (`MONETA_REPORT`).
pub(crate) fn count_call(req: &FsRequest) {
    let op = match req {
        // A stat of an open handle counts apart from one of a path.
        FsRequest::Stat {
            target: moneta_abi::fsproto::Target::Handle(_),
        } => FSTAT,
        // An unlink whose answer about the path is kept is an unlink.
        FsRequest::UnlinkKeep { .. } => {
            usize::from(moneta_abi::fsproto::OP_FS_UNLINK - moneta_abi::fsproto::OP_FS_OPEN)
        }
        // An open that asks for room is an open.
        FsRequest::OpenRoom { .. } => 0,
        _ => usize::from(req.op().wrapping_sub(moneta_abi::fsproto::OP_FS_OPEN)),
    };
    if let Some(c) = CALLS.get(op) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether file calls go through the channel (`MONETA_FS_CHANNEL`, and a device that answers
/// them).
pub(crate) fn on_channel_enabled() -> bool {
    enabled()
}

/// `MONETA_FS_CHANNEL=off` keeps every file-system call on the control socket (to compare
/// the two paths); `on`, the default, tries the channel first.
fn enabled() -> bool {
    static WARNED: std::sync::Once = std::sync::Once::new();
    static SETTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch("MONETA_FS_CHANNEL", &WARNED, &SETTING) && !UNSUPPORTED.load(Ordering::Relaxed)
}

/// `MONETA_KEEP_STATS=off` asks the daemon every `stat` (to compare); `on`, the default, gives
/// again the answers the change board says still hold.
fn keeping() -> bool {
    static WARNED: std::sync::Once = std::sync::Once::new();
    static SETTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch("MONETA_KEEP_STATS", &WARNED, &SETTING)
}

/// `MONETA_LOCK_LEASES=off` asks the daemon for no lock leases (to compare); `on`, the
/// default, takes them (docs/abi.md §3.8).
pub(crate) fn leasing() -> bool {
    static WARNED: std::sync::Once = std::sync::Once::new();
    static SETTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch("MONETA_LOCK_LEASES", &WARNED, &SETTING)
}

/// `MONETA_SIZE_LEASES=off` asks the daemon for no size leases (to compare); `on`, the
/// default, takes them (docs/abi.md §3.9).
pub(crate) fn sizing() -> bool {
    static WARNED: std::sync::Once = std::sync::Once::new();
    static SETTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch("MONETA_SIZE_LEASES", &WARNED, &SETTING)
}

/// `MONETA_POSTED_WRITES=off` asks the daemon for no sole leases, so every write waits for
/// its completion (to compare); `on`, the default, takes them (docs/abi.md §3.10).
pub(crate) fn posting() -> bool {
    static WARNED: std::sync::Once = std::sync::Once::new();
    static SETTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    switch("MONETA_POSTED_WRITES", &WARNED, &SETTING)
}

impl Channel {
    /// A file-system call of this channel's connection: through the channel when the device
    /// may answer it there ([`FsRequest::on_channel`]), on the control socket otherwise and
    /// whenever the device refers it. The reply's payload, or the daemon's errno as
    /// [`ClientError::Refused`].
    pub fn fs(&self, req: FsRequest) -> Result<FsReply, ClientError> {
        count_call(&req);
        // Posted closes are collected as they complete. A lock call waits for them all, as
        // does a `statfs` (the space an unlinked file's last close frees counts at once) and
        // a call naming a handle whose close is in flight (the device takes a pass's commands
        // in the order of their tags, not of their posting).
        let all = matches!(req, FsRequest::Lock { .. } | FsRequest::Statfs)
            || handle_named(&req).is_some_and(|h| self.closing(h));
        self.collect_closes(all);
        if !self.keeps_changes() || !keeping() {
            return self.ask(req);
        }
        match &req {
            FsRequest::Stat { target } => {
                let key = Key::of(target);
                if let Some(kept) = self.kept(&key) {
                    KEPT.fetch_add(1, Ordering::Relaxed);
                    return kept
                        .map(|st| FsReply::Stat(self.with_published_size(target, st)))
                        .map_err(|(errno, message)| ClientError::Refused { errno, message });
                }
                // Another path in a directory this process stats path after path in: the
                // attributes of its entries at once, and this one among them.
                if let Target::Path { path, follow } = target {
                    if let Some(kept) = self.listed(path, *follow, &key) {
                        return kept
                            .map(FsReply::Stat)
                            .map_err(|(errno, message)| ClientError::Refused { errno, message });
                    }
                }
                // The counter before the question: a change after it moves it.
                let count = self.change_count(target);
                let r = self.ask(req);
                match &r {
                    Ok(FsReply::Stat(st)) => self.keep(key, count, Ok(*st)),
                    Err(ClientError::Refused { errno, message }) => {
                        self.keep(key, count, Err((*errno, message.clone())))
                    }
                    _ => {}
                }
                r
            }
            FsRequest::Open { .. } | FsRequest::OpenRoom { .. } => {
                // The new handle's counter is known only from the answer.
                let counts = self.change_counts();
                let r = self.ask(req);
                if let Ok(
                    FsReply::Opened { handle, stat, .. } | FsReply::OpenedRoom { handle, stat, .. },
                ) = &r
                {
                    let t = Target::Handle(*handle);
                    let count = counts[moneta_abi::change_slot(&t)];
                    self.keep(Key::of(&t), count, Ok(*stat));
                }
                r
            }
            FsRequest::Unlink { path } if self.unlink_kept() && self.asked_about(path) => {
                // A path this process has asked about (SQLite's journal, looked for at the
                // start of each transaction): a stat of the name gone answers `ENOENT`, kept
                // from the unlink itself. The daemon watches what that stat depends on as it
                // makes the change (`FS_UNLINK_KEEP`, abi.md §3.7), so the counters read
                // before the call hold while it does. Other unlinks (an `rm -rf`) do not ask
                // it to watch what nobody is likely to ask.
                let targets = [true, false].map(|follow| Target::Path {
                    path: path.clone(),
                    follow,
                });
                let counts = targets.clone().map(|t| self.change_count(&t));
                let r = self.ask(FsRequest::UnlinkKeep { path: path.clone() });
                if r.is_ok() {
                    for (t, count) in targets.iter().zip(counts) {
                        let gone = (libc::ENOENT, "no such file or directory".to_string());
                        self.keep(Key::of(t), count, Err(gone));
                    }
                }
                r
            }
            FsRequest::Close { handle } => {
                self.forget(&Key::Handle(*handle));
                self.ask(req)
            }
            _ => self.ask(req),
        }
    }

    /// A kept answer about `target` as the daemon would give it now: for a handle whose file
    /// this channel holds a size lease on, the size it published counts (the daemon keeps
    /// watching such an answer for the lease's holder alone, docs/abi.md §3.9: nothing else
    /// about the file changes without moving its counter).
    fn with_published_size(&self, target: &Target, mut st: FsStat) -> FsStat {
        if let Target::Handle(h) = target {
            if let Some(p) = self.leased_size(*h) {
                st.size = st.size.max(p);
            }
        }
        st
    }

    /// Asks the daemon, whatever was kept: through the channel when the device may answer
    /// there, on the socket otherwise.
    pub fn ask(&self, req: FsRequest) -> Result<FsReply, ClientError> {
        if req.on_channel() && enabled() {
            if let Some(r) = self.fs_on_channel(&req) {
                return r;
            }
        }
        self.control().fs(req)
    }

    /// `OP_FS`: `None` when the call must go to the socket (referred, too long for a slice,
    /// or the channel is gone: the socket then says so).
    fn fs_on_channel(&self, req: &FsRequest) -> Option<Result<FsReply, ClientError>> {
        if self.known_gone() {
            // Not sent, so not carried out: the caller connects again and may retry it.
            return Some(Err(ClientError::Disconnected));
        }
        let op = req.op();
        let msg = encode_request(0, &Request::Fs(req.clone()));
        if msg.len() > self.slice_size() {
            return None;
        }
        let tag = match self.try_tag() {
            Some(t) => t,
            None => self.tag(),
        };
        self.write_dma(tag, 0, &msg);
        // Most calls are answered in a pass of the poller, and the thread spins for them. A
        // call the device hands to a file-call worker (a durability point that reaches the
        // host's disk, one that waits for a lock) is marked so in its tag, and the thread
        // then sleeps until the worker wakes it (`Channel::wait`): the worker needs the CPU.
        // Sleeping at once instead, before the mark, was measured on two vCPUs: pgbench
        // moved within its spread, and SQLite's updates at the `host` level were slower in
        // seven rounds of eight (docs/performance.md).
        let cmd = Command::new(Opcode::Fs, Completion::Dma, 0, msg.len() as u64, 0);
        self.submit(tag, &cmd);
        let done = self.wait(tag, Completion::Dma);
        let answer = match done {
            Ok(c) if c.status == Status::Ok => {
                let len = c.bytes as usize;
                if len == 0 || len > self.slice_size() {
                    Some(Err(ClientError::Status(Status::Malformed)))
                } else {
                    let mut buf = vec![0u8; len];
                    self.read_dma(tag, 0, &mut buf);
                    Some(decode(&buf, op))
                }
            }
            Ok(c) if c.status == Status::Malformed => {
                // A daemon from before `OP_FS`.
                UNSUPPORTED.store(true, Ordering::Relaxed);
                None
            }
            _ => None,
        };
        self.release(tag);
        answer
    }
}

fn decode(bytes: &[u8], op: u16) -> Result<FsReply, ClientError> {
    let reply = decode_reply(bytes, op).map_err(ClientError::Protocol)?;
    match reply.result {
        Ok(ReplyBody::Fs(r)) => Ok(r),
        Ok(_) => Err(ClientError::Protocol(moneta_abi::control::Error::BadField(
            "fs reply",
        ))),
        Err(f) => Err(ClientError::Refused {
            errno: f.errno,
            message: f.message,
        }),
    }
}
