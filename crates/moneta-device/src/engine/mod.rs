//! The device engine: the poller thread that serves every channel (Moneta-D §4, Figure 2).
//!
//! One pass of the poller: apply queued control updates (channels, permission-table changes),
//! take doorbell bits of the *active* channels, copy each command out of shared memory once and
//! decode it, queue it at the retag unit, give queued requests physical tags, check them against
//! the permission table, move the data between the array and the DMA buffer, hand them to the
//! scheduler, and publish the completions the scheduler says are due.
//!
//! Idle channels are not scanned: a channel whose doorbell stayed quiet for `park_after` is
//! parked (its need-wakeup flag is set) and leaves the active set; a client that rings a parked
//! channel's doorbell writes the channel's kick pipe, which brings the channel back. When
//! nothing is active or in flight the poller sleeps in `epoll_wait`, so an idle daemon uses no
//! CPU; when the active channels wait only for other members' answers, it parks them and
//! sleeps until an answer (or a kick) comes.

mod completion;
mod config;
mod device;
mod forward;
mod idle;
mod intake;
mod issue;
mod later;
mod poller;
mod timing;

pub use device::LeaseAreaRef;
pub use timing::{Lateness, LATE_NS};

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use moneta_abi::control::ChannelInfo;
use moneta_abi::{Decoded, Status};

use crate::channel::ChannelMem;
use crate::integrity::Integrity;
use crate::permission::{PermissionTable, TableError};
use crate::retag::Retag;
use crate::scheduler::{Scheduler, Timing};

pub use config::{allowed_cpus, cpu_list, default_poller_cpu, DeviceConfig, MAX_LATENCY_NS};

/// Nanoseconds of file-system work (LOOKUP and FS commands) the poller does in one pass over
/// the doorbells; commands beyond wait for a later pass (but the first of each channel's in a
/// pass), so that a channel that rings many file calls at once cannot hold up the other
/// channels' data for long.
pub const FILE_CALLS_PER_PASS_NS: u64 = 20_000;

/// Most extents one `OP_LOOKUP` answers, as `FS_LOOKUP` on the control socket.
pub const MAX_LOOKUP_EXTENTS: usize = 256;

/// What an `OP_LOOKUP` found: the runs of the file from the offset asked for, and how to
/// install their records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupAnswer {
    /// The file's size.
    pub size: u64,
    /// [`READ`](crate::READ) | [`WRITE`](crate::WRITE): the rights to install the records with.
    pub rights: u8,
    /// The layout tag the records carry.
    pub file: u64,
    /// (file offset, length, array address, or `None` for a hole).
    pub runs: Vec<(u64, u64, Option<u64>)>,
}

/// What an `OP_FS` call came to: the reply message for the client, and the changes to the
/// calling channel's records the poller makes before it completes the command (records of an
/// extended file to install; records of a closed file to remove).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsAnswer {
    /// The reply message, as the control socket would send it.
    pub reply: Vec<u8>,
    /// [`TableOp::Insert`] and [`TableOp::RemoveRange`] of the calling channel only.
    pub ops: Vec<TableOp>,
}

/// Work a file call leaves for later: it may wait for locks and for the disk, so it runs on one
/// of the device's file-call workers, never on the poller, and gives the call's answer.
pub type FsJob = Box<dyn FnOnce() -> FsAnswer + Send>;

/// How the permission manager takes an `OP_FS` call.
pub enum FsOutcome {
    /// Answered at once.
    Now(FsAnswer),
    /// Answered when the job is done (a durability point that flushes to the host's disk, a
    /// call that waits for locks):
    /// the command stays in flight on its channel meanwhile, and is completed with the job's
    /// answer (by the worker, when the answer changes no records; else by the poller). The job
    /// must not change the channel's records before then: the answer's changes are made by
    /// the poller, as for an answer given at once.
    Later(FsJob),
}

/// The permission manager's side of `OP_LOOKUP` and `OP_FS`, which the poller calls with a
/// command in hand: it must answer at once, without waiting for any lock or for the disk, and
/// `None` whenever it cannot (the file system is busy, the handle is unknown, the call would
/// wait): the client then asks on the control socket. A file call whose work must wait (for
/// the disk) may instead leave it for later ([`FsOutcome::Later`]). The poller installs the
/// records itself, before it completes the command.
pub trait FileService: Send + Sync {
    /// Maps `[offset, offset + len)` of the file open as `handle` by the connection that owns
    /// `channel`, at most `max` runs.
    fn try_lookup(
        &self,
        channel: u32,
        handle: u64,
        offset: u64,
        len: u64,
        max: usize,
    ) -> Option<LookupAnswer>;

    /// Answers the `FS` request message `request` (copied out of the channel's memory, so
    /// untrusted bytes that no longer change) for the connection that owns `channel`, with a
    /// reply of at most `room` bytes.
    fn try_call(&self, channel: u32, request: &[u8], room: usize) -> Option<FsOutcome>;

    /// A WRITE of `channel` naming the file with layout tag `file` found no record over part
    /// of `[addr, addr + len)`. Where the channel holds a sole lease on that file (docs/abi.md
    /// §3.10), the write may have returned to its program already (a posted write), so it
    /// must not fail for a record the table evicted meanwhile: the manager answers the file's
    /// allocated runs over the range, with the connection's rights, for the poller to
    /// install again before it checks the write once more. The default answers
    /// [`Refill::No`].
    fn try_refill(&self, channel: u32, file: u64, addr: u64, len: u64) -> Refill {
        let _ = (channel, file, addr, len);
        Refill::No
    }
}

/// The permission manager's answer to [`FileService::try_refill`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refill {
    /// Records to install: (array address, length) runs of the file, each with `rights`
    /// ([`READ`](crate::READ) | [`WRITE`](crate::WRITE)) and the file's layout tag.
    Runs {
        /// The connection's rights on the file.
        rights: u8,
        /// (array address, length).
        runs: Vec<(u64, u64)>,
    },
    /// The manager's state is busy at the moment: the poller checks the write again in a
    /// later pass (it stays in flight meanwhile).
    Busy,
    /// No sole lease of the channel covers the file: the write fails with `PermissionMiss`.
    No,
}

/// A change to the permission table, applied by the poller in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableOp {
    /// Install a record (replacing the channel's coverage of the range).
    Insert {
        /// Channel.
        channel: u32,
        /// First byte.
        start: u64,
        /// Bytes.
        len: u64,
        /// [`READ`](crate::READ) | [`WRITE`](crate::WRITE).
        rights: u8,
        /// File id.
        file: u64,
    },
    /// Remove a channel's coverage of a range.
    RemoveRange {
        /// Channel.
        channel: u32,
        /// First byte.
        start: u64,
        /// Bytes.
        len: u64,
    },
    /// Remove every channel's coverage of a range (revocation before the range is reused).
    RemoveRangeAll {
        /// First byte.
        start: u64,
        /// Bytes.
        len: u64,
    },
    /// Remove a channel's records of one file.
    RemoveFile {
        /// Channel.
        channel: u32,
        /// File id.
        file: u64,
    },
}

impl TableOp {
    fn channel(&self) -> Option<u32> {
        match *self {
            TableOp::Insert { channel, .. }
            | TableOp::RemoveRange { channel, .. }
            | TableOp::RemoveFile { channel, .. } => Some(channel),
            TableOp::RemoveRangeAll { .. } => None,
        }
    }
}

/// Errors of the device's control interface.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// All channel slots are taken.
    #[error("all {0} channels are in use; close a client or raise --max-channels")]
    TooManyChannels(usize),
    /// No open channel has that id.
    #[error("no open channel {0}")]
    NoSuchChannel(u32),
    /// The record is outside the array.
    #[error("range {start:#x}+{len:#x} is outside the {size}-byte array")]
    OutOfRange {
        /// First byte.
        start: u64,
        /// Bytes.
        len: u64,
        /// Array size.
        size: u64,
    },
    /// The permission table rejected the update.
    #[error("permission table: {0}")]
    Table(#[from] TableError),
    /// The device is shutting down or has stopped.
    #[error("the device has stopped")]
    Stopped,
    /// A system call failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// A system call failed.
    #[error("{0}")]
    Errno(#[from] rustix::io::Errno),
    /// Invalid configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
}

type Ack = mpsc::SyncSender<Result<(), DeviceError>>;

enum Control {
    AddChannel {
        id: u32,
        mem: Box<ChannelMem>,
        kick: OwnedFd,
        /// The user whose share of records the channel counts against.
        owner: Option<u32>,
        ack: Ack,
    },
    RemoveChannel {
        id: u32,
        ack: Ack,
    },
    Table {
        ops: Vec<TableOp>,
        ack: Ack,
    },
    Shutdown {
        ack: Ack,
    },
    Publish {
        ack: Ack,
    },
    /// The timing model's figures (none without a model).
    ModelStats {
        answer: mpsc::SyncSender<Option<(crate::model::ModelStats, timing::Lateness)>>,
    },
}

/// Counters the poller publishes for `status`.
#[derive(Default)]
struct Shared {
    /// The permission manager's answer to `OP_LOOKUP`, once it is set.
    files: std::sync::OnceLock<Arc<dyn FileService>>,
    commands: AtomicU64,
    command_errors: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    flushes: AtomicU64,
    permission_misses: AtomicU64,
    permission_denials: AtomicU64,
    error_overflows: AtomicU64,
    traced: AtomicU64,
    trace_queue_ns: AtomicU64,
    trace_check_ns: AtomicU64,
    trace_move_ns: AtomicU64,
    trace_media_ns: AtomicU64,
    lookups: AtomicU64,
    lookups_referred: AtomicU64,
    fs_calls: AtomicU64,
    fs_calls_referred: AtomicU64,
    /// File calls whose workers published their completions (`later.rs`): counted by the
    /// worker before the client can see the completion, so that a `status` the client asks
    /// for afterwards counts them (the poller's own counts reach `status` later).
    fs_calls_by_workers: AtomicU64,
    hints: AtomicU64,
    retag_stalls: AtomicU64,
    phys_in_use: AtomicU64,
    table_used: AtomicU64,
    table_merges: AtomicU64,
    table_evictions: AtomicU64,
    table_updates: AtomicU64,
    poller_sleeps: AtomicU64,
    poller_wakeups: AtomicU64,
    /// Batches of records posted with [`Device::post`] (counted before they are sent).
    posted: AtomicU64,
    /// Control requests sent to the poller (counted before they are sent): a pass looks in
    /// its queue only when more were sent than it has taken.
    controls: AtomicU64,
    /// The poller sleeps (in `epoll_wait`) or is about to.
    sleeping: AtomicBool,
    parks: AtomicU64,
    channels_open: AtomicU64,
    channels_reclaimed: AtomicU64,
    /// Forwarding is leased ([`Device::lease_forwarding`]): commands for members are refused
    /// past `forward_until_ns` (`CLOCK_MONOTONIC`).
    forward_leased: AtomicBool,
    forward_until_ns: AtomicU64,
}

/// `CLOCK_MONOTONIC` in nanoseconds (the clock of [`std::time::Instant`] on Linux).
pub(crate) fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(t.tv_nsec as u64)
}

#[derive(Default, Clone, Copy)]
struct Local {
    commands: u64,
    command_errors: u64,
    bytes_read: u64,
    bytes_written: u64,
    flushes: u64,
    permission_misses: u64,
    permission_denials: u64,
    error_overflows: u64,
    traced: u64,
    trace_queue_ns: u64,
    trace_check_ns: u64,
    trace_move_ns: u64,
    trace_media_ns: u64,
    lookups: u64,
    lookups_referred: u64,
    fs_calls: u64,
    fs_calls_referred: u64,
    hints: u64,
}

/// An opened channel, for the control server to hand to its client.
pub struct OpenedChannel {
    /// Channel id.
    pub id: u32,
    /// The channel memfd (sealed).
    pub memfd: OwnedFd,
    /// The client's end of the kick pipe (write end).
    pub kick: OwnedFd,
    /// Geometry to tell the client.
    pub info: ChannelInfo,
}

/// The running device: its control interface. The poller thread holds the rest.
pub struct Device {
    tx: Mutex<mpsc::Sender<Control>>,
    /// Records to install without waiting ([`Device::post`]).
    post_tx: Mutex<mpsc::Sender<Vec<TableOp>>>,
    waker: OwnedFd,
    shared: Arc<Shared>,
    config: DeviceConfig,
    array_size: u64,
    /// The end of the address space (past the array when other members hold ranges).
    space_size: u64,
    /// The links to the other members, for `status`.
    links: Vec<(crate::remote::MemberConfig, Arc<crate::remote::LinkStats>)>,
    persistent: bool,
    /// Free channel ids, reused oldest-freed first so a dead client's id is not handed to the
    /// next connection at once.
    free_ids: Mutex<std::collections::VecDeque<u32>>,
    started: Instant,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// Each open channel's header page, mapped again for the threads that announce retired
    /// pages ([`Device::retire_pages`]) and changes ([`Device::bump_change`]) beside the
    /// poller: read without a lock (a change may be announced from the poller's own file
    /// calls), replaced whole under `headers_lock` when a channel opens or closes.
    headers: arc_swap::ArcSwap<std::collections::HashMap<u32, Arc<memmap2::MmapRaw>>>,
    headers_lock: Mutex<()>,
    /// Pages retired so far ([`moneta_abi::ChannelHeader`]'s `retired`).
    retired: AtomicU64,
    /// What new channels' headers say of the file system behind the device (`fs_flags`).
    fs_flags: std::sync::atomic::AtomicU32,
}

const WAKER: u64 = u64::MAX;
/// How long a control call polls for the poller's answer before sleeping.
const ACK_SPIN: Duration = Duration::from_micros(50);

struct Chan {
    mem: Box<ChannelMem>,
    kick: OwnedFd,
    /// Tags taken from the doorbell and not yet completed.
    in_flight: u64,
    /// The doorbell as last read: a bit that differs now is a new command.
    seen: u64,
    last_active: u64,
    parked: bool,
    closing: bool,
    /// The client closed every copy of the kick pipe's write end: the pipe is out of the
    /// epoll set (it would report the hang-up on every wait, keeping the poller awake), and
    /// the doorbell of this channel, when parked, is looked at whenever the poller wakes.
    deaf: bool,
    /// Barrier order (Moneta §IV): the epoch the channel is in, the commands of that epoch
    /// taken and not yet completed, whether one of them is a barrier, and the commands of
    /// later epochs, held (in the order taken) until the barrier closes the current one.
    order: EpochOrder,
}

/// A channel's barrier epochs (see `moneta_abi::FLAG_BARRIER`).
#[derive(Default)]
struct EpochOrder {
    epoch: u8,
    open: u32,
    barrier: bool,
    held: std::collections::VecDeque<Pending>,
    /// Tags of the held commands.
    held_tags: u64,
}

impl EpochOrder {
    /// Whether a command of `epoch` waits for a later epoch of the channel: epochs up to 127
    /// ahead do; the rest are behind (a command that raced its own barrier) and count as
    /// current.
    fn holds(&self, epoch: u8) -> bool {
        (1..128).contains(&epoch.wrapping_sub(self.epoch))
    }
}

struct Pending {
    channel: u32,
    tag: u8,
    cmd: Decoded,
    t0: u64,
}

struct Issued {
    channel: u32,
    tag: u8,
    /// Its physical tag, or [`NO_PHYS`] once given back (a request at another member).
    phys: u16,
    cmd: Decoded,
    t0: u64,
    status: Status,
    /// When the data had moved (traced reads and writes only; else 0).
    moved: u64,
}

/// [`Issued::phys`] of a request that holds no physical tag.
const NO_PHYS: u16 = u16::MAX;

impl Issued {
    /// Request `p`, holding physical tag `phys`, checked with `status`.
    fn new(p: &Pending, phys: u16, status: Status) -> Issued {
        Issued {
            channel: p.channel,
            tag: p.tag,
            phys,
            cmd: p.cmd,
            t0: p.t0,
            status,
            moved: 0,
        }
    }
}

/// A large read or write whose data moves a piece per pass (see `Poller::dispatch`).
struct Moving {
    issued: Issued,
    /// Bytes moved so far.
    done: u64,
    /// Its place in the scheduler's issue order, taken when it started.
    seq: u64,
    traced: bool,
    t_checked: u64,
}

/// Bytes of a large request moved in one pass.
const MOVE_PIECE: u64 = 64 << 10;

struct Poller<M, C> {
    media: Arc<M>,
    integrity: Integrity,
    clock: C,
    table: PermissionTable,
    retag: Retag<Pending>,
    sched: Scheduler<Issued>,
    channels: Vec<Option<Chan>>,
    active: Vec<u32>,
    /// Large requests whose data is moving, a piece per pass.
    moving: Vec<Moving>,
    /// Channels whose kick pipe has no writer left (see `Chan::deaf`).
    deaf: Vec<u32>,
    rx: mpsc::Receiver<Control>,
    post_rx: mpsc::Receiver<Vec<TableOp>>,
    /// Posted batches applied (compared with `shared.posted`).
    applied: u64,
    /// Control requests taken (compared with `shared.controls`).
    taken: u64,
    epoll: OwnedFd,
    waker: OwnedFd,
    shared: Arc<Shared>,
    /// When the last control request was applied.
    last_control: u64,
    fences: Vec<(u64, Ack)>,
    removals: Vec<(u32, Ack)>,
    shutdown: Option<Ack>,
    local: Local,
    park_after_ns: u64,
    timing: Timing,
    trace: bool,
    idle_passes: u64,
    busy_passes: u64,
    done: Vec<Issued>,
    /// Flushes at the flusher thread, by token.
    flushing: Vec<(u64, Issued)>,
    /// Flushes waiting for the earlier requests of their channel: (scheduler fence, flush).
    flush_wait: Vec<(u64, Issued)>,
    /// The array's timing model, when one is configured.
    model: Option<Box<timing::Timed>>,
    next_flush: u64,
    flush_jobs: FlushJobs,
    flush_done: FlushDone,
    /// File calls whose work runs on the workers (see `later.rs`).
    later: later::Later,
    /// The other members' links, when the address space has any (see `forward`).
    remote: Option<forward::Remote>,
    /// The end of the address space: the array's size, or the end of the last member's range.
    space_size: u64,
    /// Where the array lies in the address space: commands and permission records speak of
    /// the address space, the media and the model of the array.
    local_at: u64,
    /// The clock as last read.
    now: u64,
    /// The clock at the last busy pass.
    last_busy: u64,
    /// Nanoseconds this pass may still spend answering LOOKUP and FS commands (see
    /// [`FILE_CALLS_PER_PASS_NS`]).
    file_budget: u64,
    /// The channel being taken has had no file call answered in this pass yet.
    file_first: bool,
}

/// Flush jobs: (token, address, length).
type FlushJobs = mpsc::Sender<(u64, u64, u64)>;
/// Flush answers: (token, persisted).
type FlushDone = mpsc::Receiver<(u64, bool)>;

/// How many busy passes between publications of the counters.
const PUBLISH_PASSES: u64 = 1024;

/// Idle time after which the poller yields its core now and then.
const YIELD_AFTER_NS: u64 = 2_000;

/// How close a scheduled completion must be for the idle poller to wait for it on the clock
/// rather than yield its core or look at kick pipes (either can take a few microseconds).
const DUE_SOON_NS: u64 = 20_000;

/// How long a poller whose channels wait only for members' or workers' answers goes on
/// polling before it parks them and sleeps until an answer comes (see
/// `Poller::sleep_for_answers`): the next request of a client that just had its answer finds
/// the poller awake.
const MEMBER_SLEEP_AFTER_NS: u64 = 10_000;

/// Idle passes between looks at the clock (for parking and sleeping).
const IDLE_CHECK_PASSES: u64 = 16;

/// Idle passes after which the counters are published.
const IDLE_PUBLISH_PASSES: u64 = 64;

/// How many passes a busy poller makes between looks at the kick pipes of parked channels.
const KICK_CHECK_PASSES: u64 = 256;
