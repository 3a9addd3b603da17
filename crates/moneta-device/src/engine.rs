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
//! CPU.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use moneta_abi::control::{ChannelInfo, StatusReport};
use moneta_abi::{
    Completion, Decoded, ErrorRecord, LookupReply, Opcode, Status, PARKED, POLLING,
    TAGS_PER_CHANNEL,
};
use rustix::event::epoll;
use rustix::event::{eventfd, EventfdFlags};

use crate::channel::{ChannelMem, DmaGeometry};
use crate::clock::Clock;
use crate::command::validate;
use crate::integrity::{Integrity, IntegrityConfig};
use crate::media::Media;
use crate::permission::{PermissionTable, TableError, READ, WRITE};
use crate::retag::Retag;
use crate::scheduler::{Scheduler, Timing};

/// Engine settings. Every one has a daemon flag.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Most channels open at once (1024 in Moneta-D).
    pub max_channels: usize,
    /// Physical tags shared by all channels (64 in Moneta-D).
    pub phys_tags: usize,
    /// Permission table entries (16K in Moneta-D).
    pub table_entries: usize,
    /// Merge adjacent records of one file and rights.
    pub merge: bool,
    /// DMA buffer and slice sizes.
    pub geometry: DmaGeometry,
    /// A channel whose doorbell stays quiet this long is parked; when all are, the poller
    /// sleeps.
    pub park_after: Duration,
    /// Media latencies added per access.
    pub timing: Timing,
    /// Time each read and write's stages (queueing, permission check, data movement, media
    /// latency) into the status counters: a few clock reads per command, off by default.
    pub trace: bool,
    /// The CPU the poller runs on, or `None` to leave it to the scheduler. A poller with a
    /// core of its own never makes the threads it serves (a client between two commands, the
    /// daemon's connection threads answering a soft miss) wait for that core.
    pub poller_cpu: Option<usize>,
    /// Most permission records the channels of one user may hold together (channels opened
    /// with an owner, see [`Device::open_channel_for`]); the rest of the table stays for
    /// others. `None`: half the table.
    pub user_records: Option<usize>,
    /// Data checksums to check on reads and keep on writes (the file system's table), or
    /// `None`.
    pub integrity: Option<IntegrityConfig>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            max_channels: 1024,
            phys_tags: 64,
            table_entries: 16 << 10,
            merge: true,
            geometry: DmaGeometry {
                dma_size: moneta_abi::DEFAULT_DMA_SIZE,
                slice_size: moneta_abi::DEFAULT_SLICE_SIZE,
            },
            park_after: Duration::from_micros(200),
            timing: Timing::default(),
            trace: false,
            poller_cpu: None,
            user_records: None,
            integrity: None,
        }
    }
}

impl DeviceConfig {
    /// Checks every limit; the message says which is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=65536).contains(&self.max_channels) {
            return Err(format!(
                "max channels {} must be between 1 and 65536",
                self.max_channels
            ));
        }
        if !(1..=4096).contains(&self.phys_tags) {
            return Err(format!(
                "physical tags {} must be between 1 and 4096",
                self.phys_tags
            ));
        }
        if !(2..=(1 << 24)).contains(&self.table_entries) {
            return Err(format!(
                "permission table entries {} must be between 2 and 16M",
                self.table_entries
            ));
        }
        if let Some(cpu) = self.poller_cpu {
            let allowed = allowed_cpus();
            if !allowed.contains(&cpu) {
                let list = match cpu_list(&allowed) {
                    l if l.is_empty() => "none".to_string(),
                    l => format!("allowed: {l}"),
                };
                return Err(format!(
                    "poller CPU {cpu} is not one this process may run on ({list})"
                ));
            }
        }
        let share = self.user_share();
        if share == 0 || share > self.table_entries {
            return Err(format!(
                "a user's share of permission records ({share}) must be between 1 and the \
                 table's {} entries",
                self.table_entries
            ));
        }
        if self.timing.read_ns > MAX_LATENCY_NS || self.timing.write_ns > MAX_LATENCY_NS {
            return Err(format!(
                "media latencies must be at most {MAX_LATENCY_NS} ns"
            ));
        }
        self.geometry.validate()
    }

    /// The records one user's channels may hold together: the setting, or half the table.
    pub fn user_share(&self) -> usize {
        self.user_records.unwrap_or((self.table_entries / 2).max(1))
    }
}

/// The CPUs this thread may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The poller's CPU when none is named: the last CPU this process may run on, when it may
/// run on at least two (so one is left for everything else); none on a single CPU.
pub fn default_poller_cpu() -> Option<usize> {
    let allowed = allowed_cpus();
    (allowed.len() >= 2).then(|| allowed[allowed.len() - 1])
}

/// `cpus` (in order) as the kernel lists them in `/proc/*/status`: `0-3,6`; empty for none.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Largest modeled media latency: 10 s.
pub const MAX_LATENCY_NS: u64 = 10_000_000_000;

/// Most extents one `OP_LOOKUP` answers, as `FS_LOOKUP` on the control socket.
pub const MAX_LOOKUP_EXTENTS: usize = 256;

/// What an `OP_LOOKUP` found: the runs of the file from the offset asked for, and how to
/// install their records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupAnswer {
    /// The file's size.
    pub size: u64,
    /// [`READ`] | [`WRITE`]: the rights to install the records with.
    pub rights: u8,
    /// The layout tag the records carry.
    pub file: u64,
    /// (file offset, length, array address, or `None` for a hole).
    pub runs: Vec<(u64, u64, Option<u64>)>,
}

/// The permission manager's side of `OP_LOOKUP`, which the poller calls with a command in
/// hand: it must answer at once, without waiting for any lock, and `None` whenever it cannot
/// (the file system is busy, the handle is unknown): the client then asks on the control
/// socket. The poller installs the records itself, before it completes the command.
pub trait LookupService: Send + Sync {
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
        /// [`READ`] | [`WRITE`].
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
}

/// Counters the poller publishes for `status`.
#[derive(Default)]
struct Shared {
    /// The permission manager's answer to `OP_LOOKUP`, once it is set.
    lookup: std::sync::OnceLock<Arc<dyn LookupService>>,
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
    /// The poller sleeps (in `epoll_wait`) or is about to.
    sleeping: AtomicBool,
    parks: AtomicU64,
    channels_open: AtomicU64,
    channels_reclaimed: AtomicU64,
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
    persistent: bool,
    /// Free channel ids, reused oldest-freed first so a dead client's id is not handed to the
    /// next connection at once.
    free_ids: Mutex<std::collections::VecDeque<u32>>,
    started: Instant,
    thread: Mutex<Option<JoinHandle<()>>>,
}

const WAKER: u64 = u64::MAX;
/// How long a control call polls for the poller's answer before sleeping.
const ACK_SPIN: Duration = Duration::from_micros(50);

impl Device {
    /// Starts the poller over `media` with `clock`.
    pub fn start<M: Media, C: Clock>(
        config: DeviceConfig,
        media: M,
        clock: C,
    ) -> Result<Device, DeviceError> {
        config.validate().map_err(DeviceError::Config)?;
        let poller_cpu = config.poller_cpu;
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let waker = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        epoll::add(
            &ep,
            &waker,
            epoll::EventData::new_u64(WAKER),
            epoll::EventFlags::IN,
        )?;
        let (tx, rx) = mpsc::channel();
        let (post_tx, post_rx) = mpsc::channel();
        let shared = Arc::new(Shared::default());
        let array_size = media.size();
        let persistent = media.persistent();
        let media = Arc::new(media);
        let (flush_jobs, flush_done) = spawn_flusher(media.clone(), waker.try_clone()?)?;
        let poller = Poller {
            integrity: Integrity::new(config.integrity, array_size).map_err(DeviceError::Config)?,
            table: {
                let mut t =
                    PermissionTable::new(config.table_entries, config.max_channels, config.merge);
                t.set_share(config.user_share());
                t
            },
            retag: Retag::new(config.phys_tags),
            sched: Scheduler::new(),
            channels: (0..config.max_channels).map(|_| None).collect(),
            active: Vec::new(),
            moving: Vec::new(),
            deaf: Vec::new(),
            media,
            clock,
            rx,
            post_rx,
            applied: 0,
            epoll: ep,
            waker: waker.try_clone()?,
            shared: shared.clone(),
            fences: Vec::new(),
            removals: Vec::new(),
            shutdown: None,
            local: Local::default(),
            park_after_ns: config.park_after.as_nanos() as u64,
            timing: config.timing,
            trace: config.trace,
            idle_passes: 0,
            busy_passes: 0,
            done: Vec::new(),
            flushing: Vec::new(),
            next_flush: 0,
            flush_jobs,
            flush_done,
            now: 0,
            last_busy: 0,
            last_control: 0,
        };
        let thread = std::thread::Builder::new()
            .name("moneta-poller".into())
            .spawn(move || {
                if let Some(cpu) = poller_cpu {
                    let mut set = rustix::thread::CpuSet::new();
                    set.set(cpu);
                    // Validated against the allowed set; should the set have changed since,
                    // the poller runs where the scheduler puts it.
                    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
                        tracing::warn!("cannot pin the poller to CPU {cpu}: {e}");
                    }
                }
                poller.run()
            })?;
        Ok(Device {
            tx: Mutex::new(tx),
            post_tx: Mutex::new(post_tx),
            waker,
            shared,
            free_ids: Mutex::new((0..config.max_channels as u32).collect()),
            config,
            array_size,
            persistent,
            started: Instant::now(),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// Bytes in the array.
    pub fn array_size(&self) -> u64 {
        self.array_size
    }

    fn call(&self, make: impl FnOnce(Ack) -> Control) -> Result<(), DeviceError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.tx
            .lock()
            .expect("control sender lock")
            .send(make(ack))
            .map_err(|_| DeviceError::Stopped)?;
        rustix::io::write(&self.waker, &1u64.to_ne_bytes()).ok();
        // The poller answers within microseconds when awake; poll briefly before sleeping.
        let t = Instant::now();
        while t.elapsed() < ACK_SPIN {
            match done.try_recv() {
                Ok(r) => return r,
                Err(mpsc::TryRecvError::Empty) => std::thread::yield_now(),
                Err(mpsc::TryRecvError::Disconnected) => return Err(DeviceError::Stopped),
            }
        }
        done.recv().map_err(|_| DeviceError::Stopped)?
    }

    /// Creates a channel and starts polling it. Fails with [`DeviceError::TooManyChannels`]
    /// when all slots are taken.
    pub fn open_channel(&self) -> Result<OpenedChannel, DeviceError> {
        self.open_channel_for(None)
    }

    /// [`Device::open_channel`] for a channel of user `owner`, whose channels together hold at
    /// most `user_records` permission records (`None`: no share, as for the daemon's own
    /// user).
    pub fn open_channel_for(&self, owner: Option<u32>) -> Result<OpenedChannel, DeviceError> {
        let id = self
            .free_ids
            .lock()
            .expect("id pool lock")
            .pop_front()
            .ok_or(DeviceError::TooManyChannels(self.config.max_channels))?;
        let result = (|| {
            let (mem, memfd) = ChannelMem::create(
                id,
                self.config.geometry,
                self.array_size,
                self.config.poller_cpu,
            )?;
            // A pipe, not an eventfd: the client's end is its own open file description, so
            // nothing it does to it (clearing O_NONBLOCK, reading) can block the poller, which
            // alone holds the non-blocking read end.
            let (kick, client_kick) = rustix::pipe::pipe_with(
                rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
            )?;
            self.call(|ack| Control::AddChannel {
                id,
                mem: Box::new(mem),
                kick,
                owner,
                ack,
            })?;
            Ok(OpenedChannel {
                id,
                memfd,
                kick: client_kick,
                info: ChannelInfo {
                    channel: id,
                    tags: TAGS_PER_CHANNEL as u32,
                    slice_size: self.config.geometry.slice_size as u32,
                    dma_offset: moneta_abi::DMA_OFFSET as u64,
                    dma_size: self.config.geometry.dma_size as u64,
                    array_size: self.array_size,
                    channel_size: moneta_abi::channel_size(self.config.geometry.dma_size) as u64,
                },
            })
        })();
        if result.is_err() {
            self.free_ids.lock().expect("id pool lock").push_back(id);
        }
        result
    }

    /// Reclaims a channel: waits for its requests in flight, drops its waiting ones, removes its
    /// permission records, unmaps it. The id may be reused afterwards.
    pub fn close_channel(&self, id: u32) -> Result<(), DeviceError> {
        self.call(|ack| Control::RemoveChannel { id, ack })?;
        self.free_ids.lock().expect("id pool lock").push_back(id);
        Ok(())
    }

    /// Applies permission-table updates in order. Returns once they are in force and, for
    /// removals, once no request issued before them is still in flight.
    pub fn update(&self, ops: Vec<TableOp>) -> Result<(), DeviceError> {
        for op in &ops {
            if let TableOp::Insert { start, len, .. }
            | TableOp::RemoveRange { start, len, .. }
            | TableOp::RemoveRangeAll { start, len } = *op
            {
                if start.checked_add(len).is_none_or(|e| e > self.array_size) {
                    return Err(DeviceError::OutOfRange {
                        start,
                        len,
                        size: self.array_size,
                    });
                }
            }
        }
        self.call(|ack| Control::Table { ops, ack })
    }

    /// Installs records without waiting for the poller: the soft miss's path, which the
    /// client follows at once with a command on those records. The poller applies posted
    /// records before any control request it takes afterwards (so a later removal always comes
    /// after them), and before it refuses a command with `PERMISSION_MISS` while posts are
    /// outstanding (so a command rung after the post's sender answered always finds them).
    /// Only inserts; a record for a channel already closed is dropped.
    pub fn post(&self, ops: Vec<TableOp>) -> Result<(), DeviceError> {
        for op in &ops {
            match *op {
                TableOp::Insert { start, len, .. } => {
                    if start.checked_add(len).is_none_or(|e| e > self.array_size) {
                        return Err(DeviceError::OutOfRange {
                            start,
                            len,
                            size: self.array_size,
                        });
                    }
                }
                _ => {
                    return Err(DeviceError::Config(
                        "only inserts can be posted without waiting".into(),
                    ))
                }
            }
        }
        // Counted before it is sent: a poller that sees the count ahead looks for it.
        self.shared.posted.fetch_add(1, Ordering::SeqCst);
        self.post_tx
            .lock()
            .expect("post sender lock")
            .send(ops)
            .map_err(|_| DeviceError::Stopped)?;
        // A sleeping poller is woken now, while the answer travels to the client, whose
        // next command on these records then finds it awake (and the channel polled again).
        if self.shared.sleeping.load(Ordering::SeqCst) {
            rustix::io::write(&self.waker, &1u64.to_ne_bytes()).ok();
        }
        Ok(())
    }

    /// Lets the poller answer `OP_LOOKUP` commands through `service` (once; later calls are
    /// ignored). Without it they complete with `Status::Refer`.
    pub fn set_lookup_service(&self, service: Arc<dyn LookupService>) {
        let _ = self.shared.lookup.set(service);
    }

    /// Clean shutdown: intake stops, requests in flight finish, the array is flushed, the
    /// poller exits.
    pub fn shutdown(&self) -> Result<(), DeviceError> {
        let r = self.call(|ack| Control::Shutdown { ack });
        if let Some(t) = self.thread.lock().expect("thread lock").take() {
            let _ = t.join();
        }
        r
    }

    /// A snapshot of the counters, current as of every request completed before the call.
    pub fn report(&self) -> StatusReport {
        // The poller batches its counters; ask it to publish them (after a stop they are
        // final already).
        let _ = self.call(|ack| Control::Publish { ack });
        let s = &self.shared;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StatusReport {
            pid: std::process::id() as u64,
            uptime_ns: self.started.elapsed().as_nanos() as u64,
            array_size: self.array_size,
            persistent: self.persistent as u64,
            channels_open: g(&s.channels_open),
            channels_max: self.config.max_channels as u64,
            phys_tags: self.config.phys_tags as u64,
            phys_tags_in_use: g(&s.phys_in_use),
            retag_stalls: g(&s.retag_stalls),
            table_capacity: self.config.table_entries as u64,
            table_used: g(&s.table_used),
            table_merges: g(&s.table_merges),
            table_evictions: g(&s.table_evictions),
            permission_misses: g(&s.permission_misses),
            permission_denials: g(&s.permission_denials),
            commands: g(&s.commands),
            command_errors: g(&s.command_errors),
            bytes_read: g(&s.bytes_read),
            bytes_written: g(&s.bytes_written),
            flushes: g(&s.flushes),
            error_overflows: g(&s.error_overflows),
            poller_sleeps: g(&s.poller_sleeps),
            poller_wakeups: g(&s.poller_wakeups),
            parks: g(&s.parks),
            table_updates: g(&s.table_updates),
            channels_reclaimed: g(&s.channels_reclaimed),
            traced: g(&s.traced),
            trace_queue_ns: g(&s.trace_queue_ns),
            trace_check_ns: g(&s.trace_check_ns),
            trace_move_ns: g(&s.trace_move_ns),
            trace_media_ns: g(&s.trace_media_ns),
            lookups: g(&s.lookups),
            lookups_referred: g(&s.lookups_referred),
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if self.thread.lock().map(|t| t.is_some()).unwrap_or(false) {
            let _ = self.shutdown();
        }
    }
}

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
    phys: u16,
    cmd: Decoded,
    t0: u64,
    status: Status,
    /// When the data had moved (traced reads and writes only; else 0).
    moved: u64,
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
    next_flush: u64,
    flush_jobs: FlushJobs,
    flush_done: FlushDone,
    /// The clock as last read.
    now: u64,
    /// The clock at the last busy pass.
    last_busy: u64,
}

/// Flush jobs: (token, address, length).
type FlushJobs = mpsc::Sender<(u64, u64, u64)>;
/// Flush answers: (token, persisted).
type FlushDone = mpsc::Receiver<(u64, bool)>;

/// Starts the thread that persists flushed ranges, so `msync` never stalls the poller. Jobs
/// are (token, address, length), done in order; each answer wakes the poller.
fn spawn_flusher<M: Media>(
    media: Arc<M>,
    waker: OwnedFd,
) -> std::io::Result<(FlushJobs, FlushDone)> {
    let (jobs, job_rx) = mpsc::channel::<(u64, u64, u64)>();
    let (done_tx, done) = mpsc::channel();
    std::thread::Builder::new()
        .name("moneta-flusher".into())
        .spawn(move || {
            for (token, addr, len) in job_rx {
                let ok = len == 0 || media.flush(addr, len).is_ok();
                if done_tx.send((token, ok)).is_err() {
                    return;
                }
                let _ = rustix::io::write(&waker, &1u64.to_ne_bytes());
            }
        })?;
    Ok((jobs, done))
}

/// How many busy passes between publications of the counters.
const PUBLISH_PASSES: u64 = 1024;

/// Idle time after which the poller yields its core now and then.
const YIELD_AFTER_NS: u64 = 2_000;

/// Idle passes between looks at the clock (for parking and sleeping).
const IDLE_CHECK_PASSES: u64 = 16;

/// Idle passes after which the counters are published.
const IDLE_PUBLISH_PASSES: u64 = 64;

/// How many passes a busy poller makes between looks at the kick pipes of parked channels.
const KICK_CHECK_PASSES: u64 = 256;

impl<M: Media, C: Clock> Poller<M, C> {
    fn run(mut self) {
        let mut passes: u64 = 0;
        loop {
            // The clock is read only when a pass has something to time: an idle pass is a few
            // loads, so a doorbell is noticed quickly.
            let mut busy = self.apply_controls();
            if self.shutdown.is_none() {
                busy |= self.intake();
            }
            busy |= self.dispatch();
            busy |= self.complete();
            busy |= self.collect_flushes();
            self.settle_fences();
            passes = passes.wrapping_add(1);
            if busy {
                self.last_busy = self.now;
                // Counters reach `status` every so many busy passes and whenever the poller
                // goes idle.
                self.busy_passes = self.busy_passes.wrapping_add(1);
                self.idle_passes = 0;
                if self.busy_passes.is_multiple_of(PUBLISH_PASSES) {
                    self.publish();
                }
            }
            if self.shutdown.is_some()
                && self.retag.waiting() == 0
                && self.moving.is_empty()
                && self.sched.is_empty()
                && self.flushing.is_empty()
            {
                self.finish_shutdown();
                return;
            }
            if busy {
                if passes.is_multiple_of(KICK_CHECK_PASSES) {
                    self.poll_kicks(Some(Duration::ZERO));
                }
                continue;
            }
            self.idle();
        }
    }

    fn publish(&mut self) {
        let s = &self.shared;
        let l = self.local;
        s.commands.store(l.commands, Ordering::Relaxed);
        s.command_errors.store(l.command_errors, Ordering::Relaxed);
        s.bytes_read.store(l.bytes_read, Ordering::Relaxed);
        s.bytes_written.store(l.bytes_written, Ordering::Relaxed);
        s.flushes.store(l.flushes, Ordering::Relaxed);
        s.permission_misses
            .store(l.permission_misses, Ordering::Relaxed);
        s.permission_denials
            .store(l.permission_denials, Ordering::Relaxed);
        s.error_overflows
            .store(l.error_overflows, Ordering::Relaxed);
        s.traced.store(l.traced, Ordering::Relaxed);
        s.trace_queue_ns.store(l.trace_queue_ns, Ordering::Relaxed);
        s.trace_check_ns.store(l.trace_check_ns, Ordering::Relaxed);
        s.trace_move_ns.store(l.trace_move_ns, Ordering::Relaxed);
        s.trace_media_ns.store(l.trace_media_ns, Ordering::Relaxed);
        s.lookups.store(l.lookups, Ordering::Relaxed);
        s.lookups_referred
            .store(l.lookups_referred, Ordering::Relaxed);
        s.retag_stalls.store(self.retag.stalls(), Ordering::Relaxed);
        s.phys_in_use
            .store(self.retag.in_use() as u64, Ordering::Relaxed);
        let t = self.table.counters();
        s.table_used.store(t.used, Ordering::Relaxed);
        s.table_merges.store(t.merges, Ordering::Relaxed);
        s.table_evictions.store(t.evictions, Ordering::Relaxed);
    }

    // ---- control updates -------------------------------------------------------------------

    /// Reads the clock.
    fn tick(&mut self) -> u64 {
        self.now = self.clock.now_ns();
        self.now
    }

    fn apply_controls(&mut self) -> bool {
        // Posted records first: whatever a control request was sent after, was posted before.
        let mut touched = Vec::new();
        let mut any = drain_posts(
            &self.post_rx,
            &mut self.table,
            &self.channels,
            &mut self.applied,
            Some(&mut touched),
        );
        if !touched.is_empty() {
            // Records posted for a channel come before a command on them: poll it again now
            // rather than wait for the client's kick.
            let now = self.tick();
            for id in touched {
                self.unpark(id, now);
            }
        }
        while let Ok(c) = self.rx.try_recv() {
            any = true;
            let now = self.tick();
            self.last_control = now;
            match c {
                Control::AddChannel {
                    id,
                    mem,
                    kick,
                    owner,
                    ack,
                } => {
                    let r = self.add_channel(id, mem, kick, now);
                    if r.is_ok() {
                        self.table.set_owner(id, owner);
                    }
                    let _ = ack.send(r);
                }
                Control::RemoveChannel { id, ack } => self.remove_channel(id, ack),
                Control::Table { ops, ack } => self.apply_table(ops, ack),
                Control::Shutdown { ack } => self.shutdown = Some(ack),
                Control::Publish { ack } => {
                    self.publish();
                    let _ = ack.send(Ok(()));
                }
            }
        }
        if any {
            self.publish();
        }
        any
    }

    fn add_channel(
        &mut self,
        id: u32,
        mem: Box<ChannelMem>,
        kick: OwnedFd,
        now: u64,
    ) -> Result<(), DeviceError> {
        if self.shutdown.is_some() {
            return Err(DeviceError::Stopped);
        }
        let slot = self
            .channels
            .get_mut(id as usize)
            .ok_or(DeviceError::NoSuchChannel(id))?;
        epoll::add(
            &self.epoll,
            &kick,
            epoll::EventData::new_u64(u64::from(id)),
            epoll::EventFlags::IN,
        )?;
        *slot = Some(Chan {
            mem,
            kick,
            in_flight: 0,
            seen: 0,
            last_active: now,
            parked: false,
            closing: false,
            deaf: false,
        });
        self.active.push(id);
        self.shared.channels_open.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn open_chan(&self, id: u32) -> Option<&Chan> {
        self.channels
            .get(id as usize)
            .and_then(|c| c.as_ref())
            .filter(|c| !c.closing)
    }

    fn remove_channel(&mut self, id: u32, ack: Ack) {
        let Some(ch) = self.channels.get_mut(id as usize).and_then(|c| c.as_mut()) else {
            let _ = ack.send(Err(DeviceError::NoSuchChannel(id)));
            return;
        };
        ch.closing = true;
        self.active.retain(|&a| a != id);
        let mut aborted = Vec::new();
        self.retag.drain_channel(id, |p| aborted.push(p));
        for p in aborted {
            self.publish_completion(
                p.channel,
                p.tag,
                p.cmd.completion,
                Status::Aborted,
                &p.cmd,
                0,
                p.t0,
            );
            if let Some(c) = self.channels[id as usize].as_mut() {
                c.in_flight &= !(1u64 << p.tag);
            }
        }
        let _ = self.table.remove_channel(id);
        self.removals.push((id, ack));
        self.settle_fences();
    }

    fn apply_table(&mut self, ops: Vec<TableOp>, ack: Ack) {
        let mut removal = false;
        for op in &ops {
            let Some(ch) = op.channel() else { continue };
            if self.open_chan(ch).is_none() {
                let _ = ack.send(Err(DeviceError::NoSuchChannel(ch)));
                return;
            }
        }
        for op in ops {
            let r = match op {
                TableOp::Insert {
                    channel,
                    start,
                    len,
                    rights,
                    file,
                } => self.table.insert(channel, start, len, rights, file),
                TableOp::RemoveRange {
                    channel,
                    start,
                    len,
                } => {
                    removal = true;
                    self.table.remove_range(channel, start, len)
                }
                TableOp::RemoveRangeAll { start, len } => {
                    removal = true;
                    let mut r = Ok(Default::default());
                    for ch in 0..self.channels.len() as u32 {
                        if self.channels[ch as usize].is_some() {
                            if let Err(e) = self.table.remove_range(ch, start, len) {
                                r = Err(e);
                                break;
                            }
                        }
                    }
                    r
                }
                TableOp::RemoveFile { channel, file } => {
                    removal = true;
                    self.table
                        .remove_file(channel, file)
                        .map(|_| Default::default())
                }
            };
            match r {
                Ok(ev) => count_evictions(&self.channels, &ev),
                Err(e) => {
                    let _ = ack.send(Err(e.into()));
                    return;
                }
            }
        }
        self.shared.table_updates.fetch_add(1, Ordering::Relaxed);
        if removal {
            // Revocation before reuse: answer once nothing issued before now is in flight.
            self.fences.push((self.sched.fence(), ack));
            self.settle_fences();
        } else {
            let _ = ack.send(Ok(()));
        }
    }

    fn settle_fences(&mut self) {
        if !self.fences.is_empty() {
            let sched = &self.sched;
            self.fences.retain(|(fence, ack)| {
                if sched.passed(*fence) {
                    let _ = ack.send(Ok(()));
                    false
                } else {
                    true
                }
            });
        }
        if !self.removals.is_empty() {
            let mut i = 0;
            while i < self.removals.len() {
                let id = self.removals[i].0;
                if self.sched.any(|r| r.channel == id)
                    || self.moving.iter().any(|m| m.issued.channel == id)
                    || self.flushing.iter().any(|(_, f)| f.channel == id)
                {
                    i += 1;
                    continue;
                }
                let (id, ack) = self.removals.swap_remove(i);
                if let Some(ch) = self.channels[id as usize].take() {
                    let _ = epoll::delete(&self.epoll, &ch.kick);
                }
                self.shared.channels_open.fetch_sub(1, Ordering::Relaxed);
                self.shared
                    .channels_reclaimed
                    .fetch_add(1, Ordering::Relaxed);
                let _ = ack.send(Ok(()));
            }
        }
    }

    fn finish_shutdown(&mut self) {
        let _ = self.media.flush(0, self.media.size());
        self.publish();
        for (_, ack) in self.fences.drain(..) {
            let _ = ack.send(Ok(()));
        }
        for (_, ack) in self.removals.drain(..) {
            let _ = ack.send(Ok(()));
        }
        // Refuse anything still queued, then answer the shutdown itself.
        while let Ok(c) = self.rx.try_recv() {
            match c {
                Control::AddChannel { ack, .. }
                | Control::RemoveChannel { ack, .. }
                | Control::Table { ack, .. }
                | Control::Shutdown { ack }
                | Control::Publish { ack } => {
                    let _ = ack.send(Err(DeviceError::Stopped));
                }
            }
        }
        if let Some(ack) = self.shutdown.take() {
            let _ = ack.send(Ok(()));
        }
    }

    // ---- the data path ---------------------------------------------------------------------

    /// Takes new commands from the doorbells of the active channels.
    fn intake(&mut self) -> bool {
        let mut busy = false;
        for i in 0..self.active.len() {
            let id = self.active[i];
            let Some(ch) = self.channels[id as usize].as_mut() else {
                continue;
            };
            let bell = ch.mem.header().doorbell.load(Ordering::Acquire);
            let mut bits = bell ^ ch.seen;
            if bits == 0 {
                continue;
            }
            ch.seen = bell;
            let now = if busy { self.now } else { self.clock.now_ns() };
            self.now = now;
            let ch = self.channels[id as usize].as_mut().expect("active channel");
            busy = true;
            ch.last_active = now;
            while bits != 0 {
                let tag = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                self.take_command(id, tag, now);
            }
        }
        busy
    }

    fn take_command(&mut self, id: u32, tag: usize, now: u64) {
        let ch = self.channels[id as usize].as_mut().expect("active channel");
        let bit = 1u64 << tag;
        let slot = ch.mem.slot(tag);
        // Copy the command out once; nothing below reads the slot again.
        let mut words = [0u64; 8];
        for (w, a) in words.iter_mut().zip(slot.command.words.iter()) {
            *w = a.load(Ordering::Relaxed);
        }
        if ch.in_flight & bit != 0 {
            // The tag's status belongs to the earlier command: report in the error queue only.
            let rec = ErrorRecord {
                channel: id,
                tag: tag as u16,
                opcode: words[0] as u16,
                status: Status::TagBusy as u32,
                cookie: words[3],
                addr: words[1],
            };
            self.local.command_errors += 1;
            if !ch.mem.push_error(&rec) {
                self.local.error_overflows += 1;
            }
            return;
        }
        let cmd = match validate(&words, tag, ch.mem.geometry(), self.media.size()) {
            Ok(cmd) => cmd,
            Err(r) => {
                self.publish_completion(id, tag as u8, r.completion, r.status, &r.cmd, 0, now);
                return;
            }
        };
        if cmd.opcode == Opcode::Lookup {
            // Answered in this pass: no data moves, so no physical tag.
            let status = self.serve_lookup(id, tag, &cmd);
            if status == Status::Ok {
                self.local.lookups += 1;
            } else {
                self.local.lookups_referred += 1;
            }
            self.publish_completion(id, tag as u8, cmd.completion, status, &cmd, 0, now);
            return;
        }
        let ch = self.channels[id as usize].as_mut().expect("active channel");
        ch.in_flight |= bit;
        self.retag.enqueue(
            id,
            Pending {
                channel: id,
                tag: tag as u8,
                cmd,
                t0: now,
            },
        );
    }

    /// The soft miss on the channel: asks the permission manager's lookup service, installs
    /// the records it answers and writes the answer into the tag's slice. `Status::Refer`
    /// whenever that cannot be done now.
    fn serve_lookup(&mut self, id: u32, tag: usize, cmd: &Decoded) -> Status {
        let Some(service) = self.shared.lookup.get().cloned() else {
            return Status::Refer;
        };
        let Some(ch) = self.channels[id as usize].as_ref() else {
            return Status::Refer;
        };
        let slice = ch.mem.geometry().slice_size;
        let max = LookupReply::capacity(slice).min(MAX_LOOKUP_EXTENTS);
        let Some(answer) = service.try_lookup(id, cmd.file, cmd.addr, cmd.len, max) else {
            return Status::Refer;
        };
        let size = self.media.size();
        if answer.runs.len() > max
            || answer.rights & !(READ | WRITE) != 0
            || answer.runs.iter().any(|&(_, len, dev)| {
                dev.is_some_and(|d| len == 0 || d.checked_add(len).is_none_or(|e| e > size))
            })
        {
            // The manager's answer is trusted, but not past the array's bounds.
            return Status::Refer;
        }
        for &(_, len, dev) in &answer.runs {
            if let Some(dev) = dev {
                match self.table.insert(id, dev, len, answer.rights, answer.file) {
                    Ok(ev) => count_evictions(&self.channels, &ev),
                    Err(_) => return Status::Refer,
                }
            }
        }
        let reply = LookupReply {
            size: answer.size,
            rights: u32::from(answer.rights),
            file: answer.file,
            extents: answer
                .runs
                .iter()
                .map(|&(off, len, dev)| (off, len, dev.unwrap_or(u64::MAX)))
                .collect(),
        }
        .encode();
        let ch = self.channels[id as usize].as_ref().expect("checked above");
        let Some(dst) = ch.mem.dma((tag * slice) as u64, reply.len() as u64) else {
            return Status::Refer;
        };
        // SAFETY: `dst` spans `reply.len()` bytes of the tag's slice inside the sealed channel
        // mapping (the answer is capped to the slice).
        unsafe { std::ptr::copy_nonoverlapping(reply.as_ptr(), dst, reply.len()) };
        Status::Ok
    }

    /// Gives waiting requests physical tags, checks permission, moves data, schedules.
    ///
    /// A pass serves the channels in turn, one request each (those with a large request still
    /// moving wait for it), after moving each large request on by one piece: a client with
    /// 64 tags of large requests delays another's request by a piece, not by all of it.
    fn dispatch(&mut self) -> bool {
        let mut busy = self.move_pieces();
        if self.retag.waiting() == 0 {
            return busy;
        }
        let now = self.tick();
        for _ in 0..self.retag.channels_waiting() {
            let moving = &self.moving;
            let Some((phys, p)) = self
                .retag
                .take(|c| moving.iter().any(|m| m.issued.channel == c))
            else {
                break;
            };
            busy = true;
            self.start(phys, p, now);
        }
        busy
    }

    /// Checks one request that got physical tag `phys` and moves its data (all of it, or the
    /// first piece of a large one), then completes or schedules it.
    fn start(&mut self, phys: u16, p: Pending, now: u64) {
        let cmd = p.cmd;
        let need = match cmd.opcode {
            Opcode::Read => READ,
            Opcode::Write => WRITE,
            _ => 0,
        };
        let check = |t: &PermissionTable| match cmd.opcode {
            Opcode::Read | Opcode::Write => {
                t.check_file(p.channel, cmd.addr, cmd.len, need, cmd.file)
            }
            Opcode::Flush if cmd.len > 0 => t.check_file(p.channel, cmd.addr, cmd.len, 0, cmd.file),
            _ => Ok(()),
        };
        // Traced: stamps around the check and the data movement (`now` is when the pass
        // began; the request waited for a physical tag since `t0`).
        let traced = self.trace && matches!(cmd.opcode, Opcode::Read | Opcode::Write);
        let t_check = if traced { self.clock.now_ns() } else { 0 };
        let mut checked = check(&self.table);
        if checked == Err(Status::PermissionMiss)
            && self.shared.posted.load(Ordering::Acquire) != self.applied
        {
            // Records posted for this command may still be on their way: take them in.
            drain_posts(
                &self.post_rx,
                &mut self.table,
                &self.channels,
                &mut self.applied,
                None,
            );
            checked = check(&self.table);
        }
        let t_checked = if traced { self.clock.now_ns() } else { 0 };
        let status = match checked {
            Ok(()) => {
                if matches!(cmd.opcode, Opcode::Read | Opcode::Write) && cmd.len > MOVE_PIECE {
                    // A large request moves a piece per pass, taking turns with the other
                    // channels' requests (Moneta §IV: round-robin in bounded pieces).
                    self.moving.push(Moving {
                        issued: Issued {
                            channel: p.channel,
                            tag: p.tag,
                            phys,
                            cmd,
                            t0: p.t0,
                            status: Status::Ok,
                            moved: 0,
                        },
                        done: 0,
                        seq: self.sched.reserve(),
                        traced,
                        t_checked,
                    });
                    let last = self.moving.len() - 1;
                    self.move_piece(last);
                    if traced {
                        let l = &mut self.local;
                        l.trace_queue_ns += t_check.saturating_sub(p.t0);
                        l.trace_check_ns += t_checked.saturating_sub(t_check);
                    }
                    return;
                }
                self.copy(p.channel, p.tag, &cmd, 0, cmd.len)
            }
            Err(s) => s,
        };
        let moved = if traced {
            let t = self.clock.now_ns();
            let l = &mut self.local;
            l.traced += 1;
            l.trace_queue_ns += t_check.saturating_sub(p.t0);
            l.trace_check_ns += t_checked.saturating_sub(t_check);
            l.trace_move_ns += t.saturating_sub(t_checked);
            t
        } else {
            0
        };
        let mut ready = now
            + match (status, cmd.opcode) {
                (Status::Ok, Opcode::Read) => self.timing.read_ns,
                (Status::Ok, Opcode::Write) => self.timing.write_ns,
                _ => 0,
            };
        let mut deferred = false;
        if cmd.opcode == Opcode::Flush {
            // A barrier completes after every earlier request of its channel: after those
            // still in the scheduler (issued behind them, so published after them) and after
            // its earlier flushes (queued behind them at the flusher).
            let latest = self.sched.latest_for(|r| r.channel == p.channel);
            deferred = latest.is_some();
            ready = ready.max(latest.unwrap_or(0));
        }
        let issued = Issued {
            channel: p.channel,
            tag: p.tag,
            phys,
            cmd,
            t0: p.t0,
            status,
            moved,
        };
        if ready <= now && !deferred {
            // Due already (no modeled latency): complete in this pass.
            self.finish(issued);
        } else {
            self.sched.issue(ready, issued);
        }
    }

    /// Copies `[from, to)` of command `cmd`'s bytes between the array and tag `tag`'s DMA
    /// range of channel `id`, through the integrity unit: `MediaError` when a block fails its
    /// checksum.
    fn copy(&mut self, id: u32, tag: u8, cmd: &Decoded, from: u64, to: u64) -> Status {
        let ch = self.channels[id as usize]
            .as_ref()
            .expect("a request's channel stays until it completes");
        let dma_off = u64::from(tag) * ch.mem.geometry().slice_size as u64 + from;
        let len = to - from;
        match cmd.opcode {
            Opcode::Read => {
                let dst = ch.mem.dma(dma_off, len).expect("validated at intake");
                // SAFETY: `dst` spans `len` bytes inside the sealed channel mapping and the
                // array range was bounds-checked at intake.
                let r = unsafe {
                    self.integrity
                        .read(&*self.media, cmd.addr + from, dst, len as usize)
                };
                if r.is_err() {
                    return Status::MediaError;
                }
                self.local.bytes_read += len;
            }
            Opcode::Write => {
                let src = ch.mem.dma(dma_off, len).expect("validated at intake");
                // SAFETY: as for reads; the client may change the buffer while we copy, which
                // only changes what it writes to its own range.
                let r = unsafe {
                    self.integrity
                        .write(&*self.media, cmd.addr + from, src, len as usize)
                };
                if r.is_err() {
                    return Status::MediaError;
                }
                self.local.bytes_written += len;
            }
            _ => {}
        }
        Status::Ok
    }

    /// Moves the next piece of large request `i` of `moving`.
    fn move_piece(&mut self, i: usize) {
        let (id, tag, cmd, from) = {
            let m = &self.moving[i];
            (m.issued.channel, m.issued.tag, m.issued.cmd, m.done)
        };
        let to = (from + MOVE_PIECE).min(cmd.len);
        let status = self.copy(id, tag, &cmd, from, to);
        let m = &mut self.moving[i];
        m.done = if status == Status::Ok { to } else { cmd.len };
        if status != Status::Ok {
            m.issued.status = status;
        }
    }

    /// Moves every large request on by one piece; those done go to the scheduler.
    fn move_pieces(&mut self) -> bool {
        if self.moving.is_empty() {
            return false;
        }
        let now = self.tick();
        let mut i = 0;
        while i < self.moving.len() {
            if self.moving[i].done < self.moving[i].issued.cmd.len {
                self.move_piece(i);
            }
            if self.moving[i].done < self.moving[i].issued.cmd.len {
                i += 1;
                continue;
            }
            let m = self.moving.remove(i);
            let mut issued = m.issued;
            if m.traced {
                let t = self.clock.now_ns();
                self.local.traced += 1;
                self.local.trace_move_ns += t.saturating_sub(m.t_checked);
                issued.moved = t;
            }
            let ready = now
                + match issued.cmd.opcode {
                    Opcode::Read => self.timing.read_ns,
                    _ => self.timing.write_ns,
                };
            if ready <= now {
                self.sched.forget(m.seq);
                self.finish(issued);
            } else {
                self.sched.issue_reserved(ready, m.seq, issued);
            }
        }
        true
    }

    /// Publishes flushes the flusher thread has finished.
    fn collect_flushes(&mut self) -> bool {
        if self.flushing.is_empty() {
            return false;
        }
        let mut any = false;
        while let Ok((token, ok)) = self.flush_done.try_recv() {
            let Some(pos) = self.flushing.iter().position(|(t, _)| *t == token) else {
                continue;
            };
            let (_, r) = self.flushing.swap_remove(pos);
            any = true;
            self.publish_end(r, if ok { Status::Ok } else { Status::MediaError });
        }
        any
    }

    /// Publishes completions the scheduler says are due.
    fn complete(&mut self) -> bool {
        if self.sched.is_empty() {
            return false;
        }
        let now = self.tick();
        let mut done = std::mem::take(&mut self.done);
        self.sched.complete_ready(now, |r| done.push(r));
        let any = !done.is_empty();
        for r in done.drain(..) {
            self.finish(r);
        }
        self.done = done;
        any
    }

    /// Ends a request that held a physical tag.
    fn finish(&mut self, r: Issued) {
        let status = r.status;
        if status == Status::Ok && r.cmd.opcode == Opcode::Flush {
            self.local.flushes += 1;
            let queued_behind = self.flushing.iter().any(|(_, f)| f.channel == r.channel);
            if r.cmd.len > 0 || queued_behind {
                // msync can take milliseconds: it runs on the flusher thread, in order, and the
                // request keeps its physical tag until it is done.
                let token = self.next_flush;
                self.next_flush += 1;
                if self.flush_jobs.send((token, r.cmd.addr, r.cmd.len)).is_ok() {
                    self.flushing.push((token, r));
                    return;
                }
                self.publish_end(r, Status::MediaError);
                return;
            }
        }
        self.publish_end(r, status);
    }

    /// Releases a request's physical tag and publishes its completion.
    fn publish_end(&mut self, r: Issued, status: Status) {
        if r.moved != 0 {
            // Traced: the modeled media latency waited out after the data moved.
            self.local.trace_media_ns += self.clock.now_ns().saturating_sub(r.moved);
        }
        let bytes = match (status, r.cmd.opcode) {
            (Status::Ok, Opcode::Read | Opcode::Write) => r.cmd.len,
            _ => 0,
        };
        self.retag.release(r.phys);
        if let Some(ch) = self.channels[r.channel as usize].as_mut() {
            ch.in_flight &= !(1u64 << r.tag);
        }
        self.publish_completion(
            r.channel,
            r.tag,
            r.cmd.completion,
            status,
            &r.cmd,
            bytes,
            r.t0,
        );
    }

    /// Writes a completion the way the command asked (Moneta-D §4.4).
    #[allow(clippy::too_many_arguments)]
    fn publish_completion(
        &mut self,
        id: u32,
        tag: u8,
        mode: Completion,
        status: Status,
        cmd: &Decoded,
        bytes: u64,
        t0: u64,
    ) {
        self.local.commands += 1;
        match status {
            Status::Ok => {}
            Status::PermissionMiss => self.local.permission_misses += 1,
            Status::PermissionDenied => self.local.permission_denials += 1,
            _ => {}
        }
        if status != Status::Ok {
            self.local.command_errors += 1;
        }
        let device_ns = self.now.saturating_sub(t0);
        let Some(ch) = self.channels[id as usize].as_ref() else {
            return;
        };
        let st = &ch.mem.slot(tag as usize).status;
        st.result.store(status as u32, Ordering::Relaxed);
        st.bytes.store(bytes, Ordering::Relaxed);
        st.cookie.store(cmd.cookie, Ordering::Relaxed);
        st.device_ns.store(device_ns, Ordering::Relaxed);
        let h = ch.mem.header();
        if status != Status::Ok && mode != Completion::Dma {
            let rec = ErrorRecord {
                channel: id,
                tag: u16::from(tag),
                opcode: cmd.opcode.to_u16(),
                status: status as u32,
                cookie: cmd.cookie,
                addr: cmd.addr,
            };
            if !ch.mem.push_error(&rec) {
                self.local.error_overflows += 1;
            }
        }
        match mode {
            Completion::Dma => {
                st.state.store(cmd.seq, Ordering::SeqCst);
                // A client may sleep on a DMA completion too (one of more waiting threads
                // than it has CPUs): the same Dekker pairing as for issue-sleep.
                if st.waiter.load(Ordering::SeqCst) != 0 {
                    let _ = rustix::thread::futex::wake(
                        &st.state,
                        rustix::thread::futex::Flags::empty(),
                        i32::MAX as u32,
                    );
                }
            }
            Completion::Forward => {
                h.tag_status_register
                    .fetch_or(1u64 << tag, Ordering::Release);
                h.completion_count.fetch_add(1, Ordering::Release);
            }
            Completion::Sleep => {
                st.state.store(cmd.seq, Ordering::SeqCst);
                // Pairs with the client's store of `waiter` before it re-reads `state` and
                // sleeps: either it sees its sequence number or we see its flag.
                if st.waiter.load(Ordering::SeqCst) != 0 {
                    let _ = rustix::thread::futex::wake(
                        &st.state,
                        rustix::thread::futex::Flags::empty(),
                        // FUTEX_WAKE takes a signed count: i32::MAX means "all".
                        i32::MAX as u32,
                    );
                }
            }
        }
    }

    // ---- idling ----------------------------------------------------------------------------

    fn idle(&mut self) {
        self.idle_passes = self.idle_passes.wrapping_add(1);
        if !self.idle_passes.is_multiple_of(IDLE_CHECK_PASSES) {
            return;
        }
        let now = self.tick();
        if now.saturating_sub(self.last_busy) >= YIELD_AFTER_NS {
            // Idle for a while (not between two commands of a busy client): let another thread
            // have the core, since on a machine with few cores the threads this poller waits for
            // (a client, the daemon's connection threads) may need it. With nothing else
            // runnable this returns at once.
            std::thread::yield_now();
        }
        if self.idle_passes == IDLE_PUBLISH_PASSES {
            self.publish();
        }
        // Park channels that have been quiet long enough.
        let park_after = self.park_after_ns;
        let mut i = 0;
        while i < self.active.len() {
            let id = self.active[i];
            let ch = self.channels[id as usize].as_mut().expect("active channel");
            if ch.in_flight == 0 && now.saturating_sub(ch.last_active) >= park_after {
                let h = ch.mem.header();
                h.parked.store(PARKED, Ordering::SeqCst);
                // Pairs with the client's doorbell flip before it reads `parked`.
                if h.doorbell.load(Ordering::SeqCst) != ch.seen {
                    h.parked.store(POLLING, Ordering::SeqCst);
                    i += 1;
                    continue;
                }
                ch.parked = true;
                self.shared.parks.fetch_add(1, Ordering::Relaxed);
                self.active.swap_remove(i);
                continue;
            }
            i += 1;
        }
        // Control requests come in bursts (a client's soft misses): stay awake a while after
        // one, as after channel activity, so the next is not delayed by a wake-up.
        let quiet = self.active.is_empty()
            && now.saturating_sub(self.last_control) >= park_after
            && self.retag.waiting() == 0
            && self.flushing.is_empty()
            && self.fences.is_empty()
            && self.removals.is_empty()
            && self.shutdown.is_none();
        if quiet {
            let timeout = self
                .sched
                .next_ready()
                .map(|t| Duration::from_nanos(t.saturating_sub(now)));
            self.shared.poller_sleeps.fetch_add(1, Ordering::Relaxed);
            self.publish();
            // Pairs with a poster's load of `sleeping` after it sent (Dekker): either it sees
            // the flag and writes the waker, or this sees its post.
            self.shared.sleeping.store(true, Ordering::SeqCst);
            if self.shared.posted.load(Ordering::SeqCst) == self.applied {
                self.poll_kicks(timeout);
            }
            self.shared.sleeping.store(false, Ordering::SeqCst);
            self.shared.poller_wakeups.fetch_add(1, Ordering::Relaxed);
        } else if self.idle_passes.is_multiple_of(KICK_CHECK_PASSES) {
            self.poll_kicks(Some(Duration::ZERO));
        }
    }

    /// Waits up to `timeout` (forever with `None`) for kicks of parked channels or the control
    /// waker, and brings kicked channels back into the active set.
    fn poll_kicks(&mut self, timeout: Option<Duration>) {
        let ts = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        let mut space = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 64];
        let Ok((events, _)) = epoll::wait(&self.epoll, &mut space, ts.as_ref()) else {
            return;
        };
        let keys: Vec<(u64, bool)> = events
            .iter()
            .map(|ev| {
                let flags = ev.flags;
                let gone = flags.intersects(epoll::EventFlags::HUP | epoll::EventFlags::ERR);
                (ev.data.u64(), gone)
            })
            .collect();
        let now = self.tick();
        let mut buf = [0u8; 8];
        for (key, mut gone) in keys {
            if key == WAKER {
                let _ = rustix::io::read(&self.waker, &mut buf);
                continue;
            }
            let id = key as u32;
            let Some(ch) = self.channels.get_mut(id as usize).and_then(|c| c.as_mut()) else {
                continue;
            };
            // Drain what the client wrote, within a bound; the rest waits for the next look.
            let mut drain = [0u8; 512];
            for _ in 0..16 {
                match rustix::io::read(ch.kick.as_fd(), &mut drain) {
                    Ok(n) if n == drain.len() => continue,
                    // End of file: no writer is left.
                    Ok(0) => {
                        gone = true;
                        break;
                    }
                    _ => break,
                }
            }
            if gone && !ch.deaf {
                // Level-triggered, a pipe without writers is ready forever: stop watching it,
                // or a client could keep the poller from ever sleeping.
                let _ = epoll::delete(&self.epoll, &ch.kick);
                ch.deaf = true;
                self.deaf.push(id);
            }
            if ch.parked && !ch.closing {
                ch.parked = false;
                ch.last_active = now;
                ch.mem.header().parked.store(POLLING, Ordering::SeqCst);
                self.active.push(id);
            }
        }
        self.look_at_deaf(now);
    }

    /// Takes parked channels without a kick pipe back into the active set when their doorbell
    /// changed: they cannot wake the poller, so they are looked at whenever it wakes.
    fn look_at_deaf(&mut self, now: u64) {
        let mut i = 0;
        while i < self.deaf.len() {
            let id = self.deaf[i];
            let Some(ch) = self.channels.get_mut(id as usize).and_then(|c| c.as_mut()) else {
                // Closed: its id may be reused by a channel with a pipe of its own.
                self.deaf.swap_remove(i);
                continue;
            };
            if !ch.deaf {
                self.deaf.swap_remove(i);
                continue;
            }
            if ch.parked
                && !ch.closing
                && ch.mem.header().doorbell.load(Ordering::SeqCst) != ch.seen
            {
                ch.parked = false;
                ch.last_active = now;
                ch.mem.header().parked.store(POLLING, Ordering::SeqCst);
                self.active.push(id);
            }
            i += 1;
        }
    }

    /// Polls a parked channel again.
    fn unpark(&mut self, id: u32, now: u64) {
        let Some(ch) = self.channels.get_mut(id as usize).and_then(|c| c.as_mut()) else {
            return;
        };
        if ch.parked && !ch.closing {
            ch.parked = false;
            ch.last_active = now;
            ch.mem.header().parked.store(POLLING, Ordering::SeqCst);
            self.active.push(id);
        }
    }
}

/// Counts each evicted record in its channel's `evictions` word (ABI §3.3), whichever way the
/// insert that evicted it came (an administrative grant, a posted soft miss, a LOOKUP).
fn count_evictions(channels: &[Option<Chan>], ev: &crate::permission::Evictions) {
    for &victim in &ev.channels {
        if let Some(Some(c)) = channels.get(victim as usize) {
            c.mem.header().evictions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Applies the posted batches waiting in `rx` ([`Device::post`]); whether there were any.
fn drain_posts(
    rx: &mpsc::Receiver<Vec<TableOp>>,
    table: &mut PermissionTable,
    channels: &[Option<Chan>],
    applied: &mut u64,
    mut touched: Option<&mut Vec<u32>>,
) -> bool {
    let mut any = false;
    while let Ok(ops) = rx.try_recv() {
        any = true;
        *applied = applied.wrapping_add(1);
        for op in ops {
            if let TableOp::Insert {
                channel,
                start,
                len,
                rights,
                file,
            } = op
            {
                let open = channels
                    .get(channel as usize)
                    .and_then(|c| c.as_ref())
                    .is_some_and(|c| !c.closing);
                if open {
                    // A full table evicts; nothing else can fail for a valid insert.
                    if let Ok(ev) = table.insert(channel, start, len, rights, file) {
                        count_evictions(channels, &ev);
                    }
                    if let Some(t) = touched.as_deref_mut() {
                        if !t.contains(&channel) {
                            t.push(channel);
                        }
                    }
                }
            }
        }
    }
    any
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_share_follows_the_table_it_is_given() {
        // Unset, the share is half of whatever table the device gets, so a small table (as
        // tests and fuzz targets use) is valid without naming a share.
        let small = DeviceConfig {
            table_entries: 64,
            ..Default::default()
        };
        assert_eq!(small.validate(), Ok(()));
        assert_eq!(small.user_share(), 32);
        assert_eq!(DeviceConfig::default().user_share(), 8 << 10);
        // A share named explicitly must fit the table.
        let too_big = DeviceConfig {
            table_entries: 64,
            user_records: Some(65),
            ..Default::default()
        };
        assert!(too_big
            .validate()
            .unwrap_err()
            .contains("share of permission records"));
        let zero = DeviceConfig {
            user_records: Some(0),
            ..Default::default()
        };
        assert!(zero.validate().is_err());
    }
}
