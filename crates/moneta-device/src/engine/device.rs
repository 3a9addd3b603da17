//! The device's control interface: what the daemon calls to open and close channels, change
//! the permission table, read the counters and stop. Each call is a message to the poller,
//! answered once the poller has applied it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use moneta_abi::control::{ChannelInfo, StatusReport};
use moneta_abi::TAGS_PER_CHANNEL;
use rustix::event::epoll;
use rustix::event::{eventfd, EventfdFlags};

use super::poller::spawn_flusher;
use super::timing::Timed;
use super::*;
use crate::clock::Clock;
use crate::media::Media;
use crate::model::{Model, ModelStats};

impl Device {
    /// Starts the poller over `media` with `clock`.
    pub fn start<M: Media, C: Clock>(
        config: DeviceConfig,
        media: M,
        clock: C,
    ) -> Result<Device, DeviceError> {
        config.validate().map_err(DeviceError::Config)?;
        let poller_cpu = config.poller_cpu;
        let away = super::config::away_from_poller(poller_cpu);
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
        if config.members.is_empty() && config.local_at != 0 {
            return Err(DeviceError::Config(
                "the array lies at address 0 unless other members hold the addresses before it"
                    .into(),
            ));
        }
        let space_size = crate::remote::check_members(&config.members, config.local_at, array_size)
            .map_err(DeviceError::Config)?;
        let remote = if config.members.is_empty() {
            None
        } else {
            crate::remote::nbd::available().map_err(DeviceError::Config)?;
            let links = config
                .members
                .iter()
                .map(|m| crate::remote::Link::spawn(m.clone(), waker.try_clone()?))
                .collect::<std::io::Result<Vec<_>>>()?;
            Some(forward::Remote::new(links, config.local_at))
        };
        let links = remote
            .as_ref()
            .map(|r| {
                r.links
                    .iter()
                    .map(|l| (l.config.clone(), l.stats.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let persistent = media.persistent();
        let media = Arc::new(media);
        let model = match &config.model {
            Some(m) => {
                let mut model = Model::new(m.clone(), array_size, config.model_seed)
                    .map_err(DeviceError::Config)?;
                if let Some(base) = &config.wear_base {
                    let f = model.keep_wear_in(base).map_err(DeviceError::Config)?;
                    tracing::info!(
                        "wear of the {} model kept in {}{}",
                        m.name,
                        f.path().display(),
                        if f.restored { " (continued)" } else { "" }
                    );
                }
                Some(Box::new(Timed::new(model, config.local_at)))
            }
            None => None,
        };
        let wear_sync = model
            .as_ref()
            .and_then(|m| m.wear_file())
            .map(|f| f.syncer());
        let (flush_jobs, flush_done) =
            spawn_flusher(media.clone(), waker.try_clone()?, wear_sync, away)?;
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
            taken: 0,
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
            flush_wait: Vec::new(),
            model,
            next_flush: 0,
            flush_jobs,
            flush_done,
            later: super::later::Later::new(waker.try_clone()?, away),
            remote,
            space_size,
            local_at: config.local_at,
            now: 0,
            last_busy: 0,
            file_budget: FILE_CALLS_PER_PASS_NS,
            file_first: true,
            last_control: 0,
        };
        let thread = std::thread::Builder::new()
            .name("moneta-poller".into())
            .spawn(move || {
                let _stop = crate::failstop::FailStop::new("device's poller");
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
            space_size,
            links,
            persistent,
            started: Instant::now(),
            thread: Mutex::new(Some(thread)),
            headers: arc_swap::ArcSwap::from_pointee(std::collections::HashMap::new()),
            headers_lock: Mutex::new(()),
            retired: AtomicU64::new(0),
            fs_flags: std::sync::atomic::AtomicU32::new(0),
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

    /// The end of the address space: the array's size, or past it the end of the last range
    /// another member holds.
    pub fn space_size(&self) -> u64 {
        self.space_size
    }

    /// The other members and their links' counters.
    pub fn links(&self) -> &[(crate::remote::MemberConfig, Arc<crate::remote::LinkStats>)] {
        &self.links
    }

    fn call(&self, make: impl FnOnce(Ack) -> Control) -> Result<(), DeviceError> {
        let (ack, done) = mpsc::sync_channel(1);
        self.shared.controls.fetch_add(1, Ordering::SeqCst);
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
                self.space_size,
                self.config.poller_cpu,
            )?;
            // A pipe, not an eventfd: the client's end is its own open file description, so
            // nothing it does to it (clearing O_NONBLOCK, reading) can block the poller, which
            // alone holds the non-blocking read end.
            let (kick, client_kick) = rustix::pipe::pipe_with(
                rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
            )?;
            // The header again, for announcing retired pages beside the poller (and for the
            // permission manager's lock leases); it starts at
            // the count so far (under the lock, so no announcement is missed).
            // Up to the DMA buffer: the lease area lies in the second page (docs/abi.md
            // §3.8), and a sole lease's end looks at the tag slots (§3.10).
            let header = memmap2::MmapOptions::new()
                .len(moneta_abi::DMA_OFFSET)
                .map_raw(&memfd)?;
            let writers = self.headers_lock.lock().expect("headers lock");
            let h = header_of(&header);
            h.retired
                .store(self.retired.load(Ordering::SeqCst), Ordering::SeqCst);
            h.fs_flags
                .store(self.fs_flags.load(Ordering::SeqCst), Ordering::SeqCst);
            let mut headers = (**self.headers.load()).clone();
            headers.insert(id, Arc::new(header));
            self.headers.store(Arc::new(headers));
            drop(writers);
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
                    array_size: self.space_size,
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
        let writers = self.headers_lock.lock().expect("headers lock");
        let mut headers = (**self.headers.load()).clone();
        headers.remove(&id);
        self.headers.store(Arc::new(headers));
        drop(writers);
        self.free_ids.lock().expect("id pool lock").push_back(id);
        Ok(())
    }

    /// Announces to every channel that pages of a mapped file are being retired (the
    /// `retired` word of each header goes up), then waits until no channel has a thread inside
    /// an access in place (`in_place` zero), for at most `wait` in all: a thread that checked
    /// `retired` before the announcement has finished its access when this returns, unless
    /// its process kept it away longer than that. A client's `in_place` word only delays this
    /// call, never past `wait`.
    pub fn retire_pages(&self, wait: Duration) {
        // The count and the channels together, so that a channel opening now starts from it.
        let writers = self.headers_lock.lock().expect("headers lock");
        let headers = self.headers.load_full();
        let n = self.retired.fetch_add(1, Ordering::SeqCst) + 1;
        for h in headers.values() {
            header_of(h).retired.store(n, Ordering::SeqCst);
        }
        drop(writers);
        let deadline = Instant::now() + wait;
        for h in headers.values() {
            while header_of(h).in_place.load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    /// Something that an answer a client of channel `channel` may have kept depended on has
    /// changed: its change-board counter `slot` goes up (docs/abi.md §3.7). Takes no lock; a
    /// channel that has closed is passed over.
    pub fn bump_change(&self, channel: u32, slot: u16) {
        if let Some(h) = self.headers.load().get(&channel) {
            let slot = usize::from(slot) % moneta_abi::CHANGE_SLOTS;
            // SAFETY: the board lies inside the mapped header page (checked at compile time in
            // moneta_abi), and holds only u64 atomics; the mapping lives as long as `h`.
            let board = unsafe {
                &*h.as_ptr()
                    .add(moneta_abi::CHANGES_OFFSET)
                    .cast::<[std::sync::atomic::AtomicU64; moneta_abi::CHANGE_SLOTS]>()
            };
            board[slot].fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The lease areas of channel `channel` (docs/abi.md §3.8–3.10), while the channel is
    /// open: the permission manager grants and recalls leases there.
    pub fn lease_area(&self, channel: u32) -> Option<LeaseAreaRef> {
        self.headers
            .load()
            .get(&channel)
            .map(|page| LeaseAreaRef { page: page.clone() })
    }

    /// What the headers of channels opened from now on say of the file system behind the
    /// device (`fs_flags`, e.g. [`moneta_abi::FS_FSYNC_IS_ORDER`]).
    pub fn set_fs_flags(&self, flags: u32) {
        self.fs_flags.store(flags, Ordering::SeqCst);
    }

    /// The file system's `fs_flags` given by [`Device::set_fs_flags`].
    pub fn fs_flags(&self) -> u32 {
        self.fs_flags.load(Ordering::SeqCst)
    }

    /// Applies permission-table updates in order. Returns once they are in force and, for
    /// removals, once no request issued before them is still in flight.
    pub fn update(&self, ops: Vec<TableOp>) -> Result<(), DeviceError> {
        for op in &ops {
            if let TableOp::Insert { start, len, .. }
            | TableOp::RemoveRange { start, len, .. }
            | TableOp::RemoveRangeAll { start, len } = *op
            {
                if start.checked_add(len).is_none_or(|e| e > self.space_size) {
                    return Err(DeviceError::OutOfRange {
                        start,
                        len,
                        size: self.space_size,
                    });
                }
            }
        }
        self.call(|ack| Control::Table { ops, ack })
    }

    /// Forwarded writes given up while they may have been on their way to their member (in
    /// flight on a connection that broke or did not answer in time), counted before each such
    /// write completes: they may still land at the member.
    pub fn forward_uncertain_writes(&self) -> u64 {
        self.links
            .iter()
            .map(|(_, s)| s.uncertain_writes.load(Ordering::Relaxed))
            .sum()
    }

    /// Leases forwarding until `until`: from then on, commands for other members' ranges are
    /// refused (`MEDIA_ERROR`) once `until` has passed, until the lease is extended. A member of
    /// a shared file system holds its records only while its lease on the manager stands; a
    /// daemon that was stopped (or starved) past it must not forward a command on them before
    /// it has fenced itself.
    pub fn lease_forwarding(&self, until: std::time::Instant) {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let ns = super::monotonic_ns().saturating_add(left.as_nanos() as u64);
        self.shared.forward_until_ns.store(ns, Ordering::SeqCst);
        self.shared.forward_leased.store(true, Ordering::SeqCst);
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
                    if start.checked_add(len).is_none_or(|e| e > self.space_size) {
                        return Err(DeviceError::OutOfRange {
                            start,
                            len,
                            size: self.space_size,
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

    /// Lets the poller answer `OP_LOOKUP` and `OP_FS` commands through `service` (once; later
    /// calls are ignored). Without it they complete with `Status::Refer`.
    pub fn set_file_service(&self, service: Arc<dyn FileService>) {
        let _ = self.shared.files.set(service);
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

    /// What the array's timing model has done so far (utilisation, queueing, energy, wear),
    /// and how far behind its times the device has published completions; `None` without a
    /// model or once the device has stopped.
    pub fn model_stats(&self) -> Option<(ModelStats, Lateness)> {
        self.config.model.as_ref()?;
        let (answer, rx) = mpsc::sync_channel(1);
        self.shared.controls.fetch_add(1, Ordering::SeqCst);
        self.tx
            .lock()
            .expect("control sender lock")
            .send(Control::ModelStats { answer })
            .ok()?;
        rustix::io::write(&self.waker, &1u64.to_ne_bytes()).ok();
        rx.recv().ok().flatten()
    }

    /// The model's report as `key value` pairs ([`crate::model::report`]), `model none`
    /// without a model; then, when other members hold ranges, the local array's place
    /// (`local.start`, `local.len`) and each member's link (`members.N.start`, `.len`, `.uri`,
    /// `.state`, counters, `.last_error`).
    pub fn model_report(&self) -> Vec<(String, String)> {
        let mut p = self.array_report();
        if !self.links.is_empty() {
            // Where the local array lies among the members' ranges.
            p.extend([
                ("local.start".into(), self.config.local_at.to_string()),
                ("local.len".into(), self.array_size.to_string()),
            ]);
        }
        for (i, (m, s)) in self.links.iter().enumerate() {
            let g = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
            let k = |n: &str| format!("members.{i}.{n}");
            p.extend([
                (k("start"), m.start.to_string()),
                (k("len"), m.len.to_string()),
                (k("uri"), m.uri.clone()),
                (k("state"), s.state().name().to_string()),
                (k("requests"), g(&s.requests)),
                (k("bytes"), g(&s.bytes)),
                (k("failures"), g(&s.failures)),
                (k("uncertain_writes"), g(&s.uncertain_writes)),
                (k("in_flight"), g(&s.in_flight)),
                (k("connects"), g(&s.connects)),
                (k("export_size"), g(&s.remote_size)),
                (k("timeout_ms"), m.timeout.as_millis().to_string()),
                (k("last_error"), s.last_error().replace('\n', " ")),
            ]);
        }
        p
    }

    fn array_report(&self) -> Vec<(String, String)> {
        match (self.config.model.as_ref(), self.model_stats()) {
            (Some(cfg), Some((stats, late))) => {
                let mut p = crate::model::report::pairs(cfg, &stats);
                let mean = late.total_ns.checked_div(late.completions).unwrap_or(0);
                for (k, v) in [
                    ("emulation.completions", late.completions),
                    ("emulation.late", late.late),
                    ("emulation.mean_late_ns", mean),
                    ("emulation.max_late_ns", late.max_ns),
                    ("emulation.lead_ns", late.lead_ns),
                ] {
                    p.push((k.into(), v.to_string()));
                }
                p
            }
            _ => vec![("model".into(), "none".into())],
        }
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
            commands: g(&s.commands) + g(&s.fs_calls_by_workers),
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
            fs_calls: g(&s.fs_calls) + g(&s.fs_calls_by_workers),
            fs_calls_referred: g(&s.fs_calls_referred),
            hints: g(&s.hints),
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

/// The channel header in a mapping of a channel's first page.
/// A channel's lease area, kept mapped for as long as this lives (the channel may close
/// meanwhile: the area is then memory nobody else reads).
#[derive(Clone)]
pub struct LeaseAreaRef {
    page: Arc<memmap2::MmapRaw>,
}

impl LeaseAreaRef {
    /// The area.
    pub fn area(&self) -> &moneta_abi::LeaseArea {
        // SAFETY: the mapping covers the channel up to the tag slots, which holds the lease
        // area (checked at compile time in moneta_abi); the area holds only atomics, so a
        // shared reference asserts nothing about what the client writes there.
        unsafe {
            &*self
                .page
                .as_ptr()
                .add(moneta_abi::LEASE_OFFSET)
                .cast::<moneta_abi::LeaseArea>()
        }
    }

    /// The sole-lease area (docs/abi.md §3.10).
    pub fn sole_area(&self) -> &moneta_abi::SoleLeaseArea {
        // SAFETY: as for [`LeaseAreaRef::area`]: the area lies inside the header's page
        // (checked at compile time in moneta_abi) and holds only atomics.
        unsafe {
            &*self
                .page
                .as_ptr()
                .add(moneta_abi::SOLE_LEASE_OFFSET)
                .cast::<moneta_abi::SoleLeaseArea>()
        }
    }

    /// Waits, for at most `wait`, until every WRITE rung on the channel with DMA or
    /// issue-sleep completion has completed: each tag whose command slot names such a
    /// command shows that command's sequence number in its `state` (docs/abi.md §3.10).
    /// Whether they all had. Called after a sole lease ended (a sequentially consistent
    /// change of its slot), so a write the client posted under it is either among these or
    /// waited for by the client itself. A command written but never rung keeps this waiting
    /// until `wait`, so a client can only delay, never stop, the call that ends its lease.
    pub fn wait_rung(&self, wait: std::time::Duration) -> bool {
        let header = header_of(&self.page);
        // Reading the doorbell orders what follows after every ring that came before the
        // lease's end, with the command words written before each.
        header.doorbell.load(Ordering::SeqCst);
        let deadline = std::time::Instant::now() + wait;
        let mut pause = std::time::Duration::from_micros(2);
        loop {
            if (0..moneta_abi::TAGS_PER_CHANNEL).all(|k| self.tag_done(k)) {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_micros(200));
        }
    }

    /// Whether tag `k`'s last command, if it is a WRITE that completes with DMA or
    /// issue-sleep, has completed. Only writes can be posted; a file call's command is the
    /// client's own to wait for (and may be the very call that ends the lease, answered by a
    /// worker while its command stays in flight), and a forwarded command's `state` is the
    /// client's to write.
    fn tag_done(&self, k: usize) -> bool {
        // SAFETY: the tag slots lie inside the mapping (it reaches the DMA buffer) and hold
        // only atomics.
        let slot = unsafe {
            &*self
                .page
                .as_ptr()
                .add(moneta_abi::tag_slot_offset(k))
                .cast::<moneta_abi::TagSlot>()
        };
        let w0 = slot.command.words[0].load(Ordering::Acquire);
        let opcode = w0 & 0xffff;
        let mode = (w0 >> 16) & u64::from(moneta_abi::FLAG_COMPLETION_MASK);
        opcode != u64::from(moneta_abi::OP_WRITE)
            || mode == 1
            || slot.status.state.load(Ordering::Acquire) == (w0 >> 32) as u32
    }

    /// The size-lease area (docs/abi.md §3.9).
    pub fn size_area(&self) -> &moneta_abi::SizeLeaseArea {
        // SAFETY: as for [`LeaseAreaRef::area`]: the area lies inside the header's page
        // (checked at compile time in moneta_abi) and holds only atomics.
        unsafe {
            &*self
                .page
                .as_ptr()
                .add(moneta_abi::SIZE_LEASE_OFFSET)
                .cast::<moneta_abi::SizeLeaseArea>()
        }
    }
}

fn header_of(page: &memmap2::MmapRaw) -> &moneta_abi::ChannelHeader {
    // SAFETY: a page-aligned mapping of at least one page, of which the header is the start;
    // the header holds only atomics, so a shared reference asserts nothing about what the
    // client writes there.
    unsafe { &*page.as_ptr().cast::<moneta_abi::ChannelHeader>() }
}
