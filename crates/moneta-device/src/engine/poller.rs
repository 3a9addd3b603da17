//! The poller's loop and its control side: the pass, the counters it publishes, channels
//! added and removed, permission-table updates and the fences that answer revocations.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use rustix::event::epoll;

use super::*;
use crate::clock::Clock;
use crate::media::Media;
use crate::model::wear::WearSync;

/// Starts the thread that persists flushed ranges, so `msync` never stalls the poller. Jobs
/// are (token, address, length), done in order; each answer wakes the poller.
pub(super) fn spawn_flusher<M: Media>(
    media: Arc<M>,
    waker: OwnedFd,
    wear: Option<WearSync>,
    away: Option<rustix::thread::CpuSet>,
) -> std::io::Result<(FlushJobs, FlushDone)> {
    let (jobs, job_rx) = mpsc::channel::<(u64, u64, u64)>();
    let (done_tx, done) = mpsc::channel();
    std::thread::Builder::new()
        .name("moneta-flusher".into())
        .spawn(move || {
            let _stop = crate::failstop::FailStop::new("device's flusher");
            super::config::run_away_from_poller(away.as_ref());
            let sync_wear = || {
                if let Some(w) = &wear {
                    if let Err(e) = w.sync() {
                        tracing::warn!("cannot write the wear counts back: {e}");
                    }
                }
            };
            loop {
                // Wear counts reach the file as they are counted; writing them back every
                // few seconds bounds what a crash of the machine loses.
                let job = match &wear {
                    Some(_) => match job_rx.recv_timeout(WEAR_SYNC) {
                        Ok(j) => j,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            sync_wear();
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    },
                    None => match job_rx.recv() {
                        Ok(j) => j,
                        Err(_) => break,
                    },
                };
                let (token, addr, len) = job;
                let ok = len == 0 || media.flush(addr, len).is_ok();
                if done_tx.send((token, ok)).is_err() {
                    break;
                }
                let _ = rustix::io::write(&waker, &1u64.to_ne_bytes());
            }
            // The poller has gone: the last counts go back with the array.
            sync_wear();
        })?;
    Ok((jobs, done))
}

/// How often the flusher writes wear counts back to their file.
const WEAR_SYNC: Duration = Duration::from_secs(5);

impl<M: Media, C: Clock> Poller<M, C> {
    pub(super) fn run(mut self) {
        let mut passes: u64 = 0;
        loop {
            // The clock is read only when a pass has something to time: an idle pass is a few
            // loads, so a doorbell is noticed quickly.
            let mut busy = self.apply_controls();
            // The workers' answers before the doorbells: a worker that published its answer
            // itself did not wake a sleeping poller, so the pass a kick brings may find it
            // still counted, and its place at the workers and its tag are free only once it
            // is taken.
            busy |= self.collect_later();
            if self.shutdown.is_none() {
                busy |= self.intake();
            }
            busy |= self.dispatch();
            busy |= self.complete();
            busy |= self.collect_flushes();
            busy |= self.collect_forwards(busy);
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
                && self.flush_wait.is_empty()
                && self.later.is_empty()
                && self.remote.as_ref().is_none_or(|r| r.pending.is_empty())
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

    pub(super) fn publish(&mut self) {
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
        s.fs_calls.store(l.fs_calls, Ordering::Relaxed);
        s.fs_calls_referred
            .store(l.fs_calls_referred, Ordering::Relaxed);
        s.hints.store(l.hints, Ordering::Relaxed);
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
    pub(super) fn tick(&mut self) -> u64 {
        self.now = self.clock.now_ns();
        self.now
    }

    pub(super) fn apply_controls(&mut self) -> bool {
        // Posted records first: whatever a control request was sent after, was posted before.
        // Each queue is looked into only when something was sent to it: most passes find
        // both empty, and a look costs more than comparing two counters.
        let mut touched = Vec::new();
        let mut any = self.shared.posted.load(Ordering::Acquire) != self.applied
            && drain_posts(
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
        if self.shared.controls.load(Ordering::Acquire) == self.taken {
            return any;
        }
        while let Ok(c) = self.rx.try_recv() {
            any = true;
            self.taken += 1;
            // Records posted after the drain above and before this request was sent come
            // before it too: a removal must never be overtaken by an insert posted earlier.
            if self.shared.posted.load(Ordering::Acquire) != self.applied {
                let mut late = Vec::new();
                drain_posts(
                    &self.post_rx,
                    &mut self.table,
                    &self.channels,
                    &mut self.applied,
                    Some(&mut late),
                );
                let now = self.tick();
                for id in late {
                    self.unpark(id, now);
                }
            }
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
                Control::ModelStats { answer } => {
                    let stats = self.model.as_ref().map(|m| (m.stats(now), m.lateness()));
                    let _ = answer.send(stats);
                }
            }
        }
        if any {
            self.publish();
        }
        any
    }

    pub(super) fn add_channel(
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
            order: EpochOrder::default(),
        });
        self.active.push(id);
        self.shared.channels_open.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn open_chan(&self, id: u32) -> Option<&Chan> {
        self.channels
            .get(id as usize)
            .and_then(|c| c.as_ref())
            .filter(|c| !c.closing)
    }

    pub(super) fn remove_channel(&mut self, id: u32, ack: Ack) {
        let Some(ch) = self.channels.get_mut(id as usize).and_then(|c| c.as_mut()) else {
            let _ = ack.send(Err(DeviceError::NoSuchChannel(id)));
            return;
        };
        ch.closing = true;
        self.active.retain(|&a| a != id);
        // Waiting and held requests end here; none is admitted later.
        let mut aborted: Vec<Pending> = ch.order.held.drain(..).collect();
        ch.order.held_tags = 0;
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

    pub(super) fn apply_table(&mut self, ops: Vec<TableOp>, ack: Ack) {
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

    pub(super) fn settle_fences(&mut self) {
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
                    || self.flush_wait.iter().any(|(_, f)| f.channel == id)
                    || self.later.holds(id)
                    || self.forwarding(id)
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

    pub(super) fn finish_shutdown(&mut self) {
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
                Control::ModelStats { answer } => {
                    let _ = answer.send(None);
                }
            }
        }
        if let Some(ack) = self.shutdown.take() {
            let _ = ack.send(Ok(()));
        }
    }
}

/// Counts each evicted record in its channel's `evictions` word (ABI §3.3), whichever way the
/// insert that evicted it came (an administrative grant, a posted soft miss, a LOOKUP).
pub(super) fn count_evictions(channels: &[Option<Chan>], ev: &crate::permission::Evictions) {
    for &victim in &ev.channels {
        if let Some(Some(c)) = channels.get(victim as usize) {
            c.mem.header().evictions.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Applies the posted batches waiting in `rx` ([`Device::post`]); whether there were any.
pub(super) fn drain_posts(
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
