//! Issue: queued requests get physical tags, are checked against the permission table, move
//! their data between the array and the DMA buffer and go to the scheduler, which says when
//! they complete; flushes go to the flusher thread.

use std::sync::atomic::Ordering;

use moneta_abi::Opcode;

use super::forward::Place;
use super::poller::{count_evictions, drain_posts};
use super::*;
use crate::clock::Clock;
use crate::media::Media;
use crate::permission::{READ, WRITE};
use crate::scheduler::UNDECIDED;

impl<M: Media, C: Clock> Poller<M, C> {
    /// Gives waiting requests physical tags, checks permission, moves data, schedules.
    ///
    /// A pass serves the channels in turn, one request each (those with a large request still
    /// moving wait for it), after moving each large request on by one piece: a client with
    /// 64 tags of large requests delays another's request by a piece, not by all of it.
    pub(super) fn dispatch(&mut self) -> bool {
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
    pub(super) fn start(&mut self, phys: u16, p: Pending, now: u64) {
        let cmd = p.cmd;
        let need = match cmd.opcode {
            Opcode::Read | Opcode::WillNeed => READ,
            Opcode::Write => WRITE,
            _ => 0,
        };
        let check = |t: &PermissionTable| match cmd.opcode {
            Opcode::Read | Opcode::Write | Opcode::WillNeed => {
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
        if checked == Err(Status::PermissionMiss) && cmd.opcode == Opcode::Write && cmd.file != 0 {
            // Perhaps a posted write under a sole lease whose record was evicted.
            match self.refill(p.channel, &cmd) {
                Some(true) => checked = check(&self.table),
                Some(false) => {
                    // Checked again in a later pass; the command stays in flight.
                    self.retag.release(phys);
                    self.retag.enqueue(p.channel, p);
                    return;
                }
                None => {}
            }
        }
        let t_checked = if traced { self.clock.now_ns() } else { 0 };
        if checked.is_ok() && matches!(cmd.opcode, Opcode::Read | Opcode::Write | Opcode::WillNeed)
        {
            if let Some(remote) = &self.remote {
                match remote.place(self.media.size(), &cmd) {
                    Place::Local(_) => {}
                    Place::Member(member, offset) => {
                        self.forward(Issued::new(&p, phys, Status::Ok), member, offset);
                        return;
                    }
                    Place::Nowhere => checked = Err(Status::OutOfRange),
                }
            }
        }
        let status = match checked {
            Ok(()) => {
                if matches!(cmd.opcode, Opcode::Read | Opcode::Write) && cmd.len > MOVE_PIECE {
                    // A large request moves a piece per pass, taking turns with the other
                    // channels' requests (Moneta §IV: round-robin in bounded pieces).
                    self.moving.push(Moving {
                        issued: Issued::new(&p, phys, Status::Ok),
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
        let issued = Issued {
            moved,
            ..Issued::new(&p, phys, status)
        };
        if cmd.opcode == Opcode::Flush && self.channel_in_flight(p.channel, self.sched.fence()) {
            // A FLUSH completes after every earlier request of its channel (and after its
            // earlier flushes, which wait here or at the flusher in order).
            self.flush_wait.push((self.sched.fence(), issued));
            return;
        }
        self.schedule(issued, now);
    }

    /// Asks the permission manager to install again the records a WRITE of `channel` under a
    /// sole lease missed ([`FileService::try_refill`]): `Some(true)` once installed,
    /// `Some(false)` when the manager is busy (try again later), `None` when the channel holds
    /// no sole lease on the file or the records cannot be installed.
    fn refill(&mut self, channel: u32, cmd: &Decoded) -> Option<bool> {
        let service = self.shared.files.get().cloned()?;
        let (rights, runs) = match service.try_refill(channel, cmd.file, cmd.addr, cmd.len) {
            Refill::Runs { rights, runs } => (rights, runs),
            Refill::Busy => return Some(false),
            Refill::No => return None,
        };
        let size = self.media.size();
        // The manager is trusted, but not past the array's bounds.
        if rights & !(READ | WRITE) != 0
            || runs
                .iter()
                .any(|&(a, l)| l == 0 || a.checked_add(l).is_none_or(|e| e > size))
        {
            return None;
        }
        for (addr, len) in runs {
            match self.table.insert(channel, addr, len, rights, cmd.file) {
                Ok(ev) => count_evictions(&self.channels, &ev),
                Err(_) => return None,
            }
        }
        Some(true)
    }

    /// Hands a request whose data has moved to the scheduler, at the time the media model
    /// says: the array's timing model for reads and writes when one is configured, else now
    /// plus the fixed latency, completing in this pass when that is now.
    fn schedule(&mut self, issued: Issued, now: u64) {
        let media = issued.status == Status::Ok
            && matches!(issued.cmd.opcode, Opcode::Read | Opcode::Write);
        if media {
            let reach = self.reach(&issued);
            if let Some(model) = self.model.as_mut() {
                // The model's time starts once the emulator has moved the data, so what a
                // client sees beyond an unmodelled device is the model's time.
                let t = super::timing::moved_ns(&self.clock);
                model.submit(&mut self.sched, issued, reach, t);
                self.publish_etas();
                return;
            }
        }
        if issued.status == Status::Ok && issued.cmd.opcode == Opcode::WillNeed {
            self.will_need(&issued.cmd);
        }
        let ready = now
            + match (media, issued.cmd.opcode) {
                (true, Opcode::Read) => self.timing.read_ns,
                (true, _) => self.timing.write_ns,
                _ => 0,
            };
        if ready <= now {
            // The data moved since the pass began: the completion's `device_ns` (intake to
            // completion) counts that too.
            self.tick();
            self.finish(issued);
        } else {
            self.sched.issue(ready, issued);
        }
    }

    /// Tells the clients waiting for DMA completions of requests whose completion time the
    /// model has just decided when that will be (the tag's `eta_ns`, in `CLOCK_MONOTONIC`
    /// ns), so that they may spin until then rather than sleep and pay a wake-up after it.
    pub(super) fn publish_etas(&mut self) {
        let Some(model) = self.model.as_mut() else {
            return;
        };
        if model.decided.is_empty() {
            return;
        }
        let mut decided = std::mem::take(&mut model.decided);
        let mono = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        let mono_ns = mono.tv_sec as u64 * 1_000_000_000 + mono.tv_nsec as u64;
        let offset = mono_ns as i128 - i128::from(self.clock.now_ns());
        for &(seq, done) in &decided {
            let Some(r) = self.sched.find(seq) else {
                continue;
            };
            if r.cmd.completion != moneta_abi::Completion::Dma {
                continue;
            }
            let Some(ch) = self.channels[r.channel as usize].as_ref() else {
                continue;
            };
            let st = &ch.mem.slot(r.tag as usize).status;
            st.eta_ns
                .store((i128::from(done) + offset).max(0) as u64, Ordering::Relaxed);
            st.eta_seq.store(r.cmd.seq, Ordering::Release);
        }
        decided.clear();
        if let Some(model) = self.model.as_mut() {
            model.decided = decided;
        }
    }

    /// How far a read's extent reaches, for the model's read-ahead: the end of the records of
    /// its channel and file contiguous with the one covering its last byte (0 where the model
    /// reads nothing ahead).
    fn reach(&self, issued: &Issued) -> u64 {
        match &self.model {
            Some(m) if m.reads_ahead() && issued.cmd.opcode == Opcode::Read => {
                let last = issued.cmd.addr + issued.cmd.len.max(1) - 1;
                self.table
                    .reach(issued.channel, last, READ, issued.cmd.file)
            }
            _ => 0,
        }
    }

    /// A hint that a range the channel may read will be read soon (`OP_WILLNEED`): the
    /// model's DRAM buffer fills its lines, and the media reads the range in where it lives in
    /// a file (a persistent array). It completes at once; neither waits.
    fn will_need(&mut self, cmd: &Decoded) {
        if let Some(model) = self.model.as_mut() {
            let t = self.clock.now_ns();
            model.hint(&mut self.sched, cmd.addr - self.local_at, cmd.len, t);
            self.publish_etas();
        }
        self.media.will_need(cmd.addr - self.local_at, cmd.len);
        self.local.hints += 1;
    }

    /// Whether a request of channel `id` issued before `fence` is still in flight: in the
    /// scheduler, moving its data, or a flush waiting for others.
    fn channel_in_flight(&self, id: u32, fence: u64) -> bool {
        self.sched.any_before(fence, |r| r.channel == id)
            || self.forwarding(id)
            || self
                .moving
                .iter()
                .any(|m| m.issued.channel == id && m.seq < fence)
            || self.flush_wait.iter().any(|(_, f)| f.channel == id)
    }

    /// Flushes whose channel has nothing earlier in flight any more go on, in order.
    fn settle_flush_waits(&mut self) -> bool {
        if self.flush_wait.is_empty() {
            return false;
        }
        let mut any = false;
        let mut i = 0;
        while i < self.flush_wait.len() {
            let (fence, ch) = (self.flush_wait[i].0, self.flush_wait[i].1.channel);
            let earlier_flush = self.flush_wait[..i].iter().any(|(_, f)| f.channel == ch);
            let busy = self.sched.any_before(fence, |r| r.channel == ch)
                || self.forwarding(ch)
                || self
                    .moving
                    .iter()
                    .any(|m| m.issued.channel == ch && m.seq < fence);
            if earlier_flush || busy {
                i += 1;
                continue;
            }
            let (_, f) = self.flush_wait.remove(i);
            any = true;
            self.finish(f);
        }
        any
    }

    /// Copies `[from, to)` of command `cmd`'s bytes between the array and tag `tag`'s DMA
    /// range of channel `id`, through the integrity unit: `MediaError` when a block fails its
    /// checksum.
    pub(super) fn copy(&mut self, id: u32, tag: u8, cmd: &Decoded, from: u64, to: u64) -> Status {
        let ch = self.channels[id as usize]
            .as_ref()
            .expect("a request's channel stays until it completes");
        let dma_off = u64::from(tag) * ch.mem.geometry().slice_size as u64 + from;
        let len = to - from;
        // A READ or WRITE lies in the array (placed so where the address space has members).
        let at = || {
            let at = cmd.addr - self.local_at + from;
            debug_assert!(at + len <= self.media.size(), "placed in the array");
            at
        };
        match cmd.opcode {
            Opcode::Read => {
                let dst = ch.mem.dma(dma_off, len).expect("validated at intake");
                let at = at();
                // SAFETY: `dst` spans `len` bytes inside the sealed channel mapping and the
                // array range was bounds-checked at intake and placed in the array.
                let r = unsafe { self.integrity.read(&*self.media, at, dst, len as usize) };
                if r.is_err() {
                    return Status::MediaError;
                }
                self.local.bytes_read += len;
            }
            Opcode::Write => {
                let src = ch.mem.dma(dma_off, len).expect("validated at intake");
                let at = at();
                // SAFETY: as for reads; the client may change the buffer while we copy, which
                // only changes what it writes to its own range.
                let r = unsafe { self.integrity.write(&*self.media, at, src, len as usize) };
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
    pub(super) fn move_piece(&mut self, i: usize) {
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
    pub(super) fn move_pieces(&mut self) -> bool {
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
            let reach = self.reach(&issued);
            if let Some(model) = self.model.as_mut().filter(|_| issued.status == Status::Ok) {
                self.sched.issue_reserved(UNDECIDED, m.seq, issued);
                let t = super::timing::moved_ns(&self.clock);
                model.submit_issued(&mut self.sched, m.seq, reach, t);
                self.publish_etas();
                continue;
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
    pub(super) fn collect_flushes(&mut self) -> bool {
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

    /// Publishes completions the scheduler says are due, lets the timing model decide what it
    /// can, and settles flushes whose channel has caught up.
    pub(super) fn complete(&mut self) -> bool {
        let flushed = self.settle_flush_waits();
        if self.sched.is_empty() {
            return flushed;
        }
        let now = self.tick();
        // What is due goes out before the model decides more: its decisions at `now` concern
        // requests still to complete, and its work would only delay the completions due now
        // (by its cost per request, a tenth of a microsecond, on every modelled request).
        let mut any = self.complete_due(now);
        if let Some(model) = self.model.as_mut() {
            if model.due(now) {
                model.advance(&mut self.sched, now);
                // A decision taken late may be due already.
                any |= self.complete_due(now);
            }
        }
        self.publish_etas();
        any || flushed
    }

    /// Publishes the completions due by `now`; whether there were any.
    fn complete_due(&mut self, now: u64) -> bool {
        if self.model.is_some() {
            return self.complete_due_modelled(now);
        }
        let mut done = std::mem::take(&mut self.done);
        self.sched.complete_ready(now, |_, r| done.push(r));
        let any = !done.is_empty();
        for r in done.drain(..) {
            self.finish(r);
        }
        self.done = done;
        any
    }

    /// [`Poller::complete_due`] under the model: publishes the completions due within its lead
    /// of `now` (see [`super::timing::Timed::publish_cost`]), counts how late each was, and
    /// times the first one's publication.
    #[inline(never)]
    fn complete_due_modelled(&mut self, now: u64) -> bool {
        let Some(model) = self.model.as_mut() else {
            return false;
        };
        let by = now + model.lead();
        let mut done = std::mem::take(&mut self.done);
        self.sched.complete_ready(by, |ready, r| {
            if r.status == Status::Ok && matches!(r.cmd.opcode, Opcode::Read | Opcode::Write) {
                model.completed(ready, by);
            }
            done.push(r)
        });
        let any = !done.is_empty();
        let mut timing = true;
        for r in done.drain(..) {
            let timed = timing
                && r.status == Status::Ok
                && matches!(r.cmd.opcode, Opcode::Read | Opcode::Write)
                && r.cmd.completion != moneta_abi::Completion::Forward;
            self.finish(r);
            if timed {
                timing = false;
                let cost = self.clock.now_ns().saturating_sub(now);
                if let Some(m) = self.model.as_mut() {
                    m.publish_cost(cost);
                }
            }
        }
        self.done = done;
        any
    }

    /// Ends a request that held a physical tag.
    pub(super) fn finish(&mut self, r: Issued) {
        let status = r.status;
        if status == Status::Ok && r.cmd.opcode == Opcode::Flush {
            self.local.flushes += 1;
            let queued_behind = self.flushing.iter().any(|(_, f)| f.channel == r.channel);
            if r.cmd.len > 0 {
                // A FLUSH of a range another member holds is that member's to do.
                if let Some(remote) = &self.remote {
                    match remote.place(self.media.size(), &r.cmd) {
                        Place::Local(_) => {}
                        Place::Member(member, offset) => {
                            self.forward(r, member, offset);
                            return;
                        }
                        Place::Nowhere => {
                            self.publish_end(r, Status::OutOfRange);
                            return;
                        }
                    }
                }
            }
            if r.cmd.len > 0 || queued_behind {
                // msync can take milliseconds: it runs on the flusher thread, in order, and the
                // request keeps its physical tag until it is done.
                let token = self.next_flush;
                self.next_flush += 1;
                let at = r.cmd.addr.saturating_sub(self.local_at);
                if self.flush_jobs.send((token, at, r.cmd.len)).is_ok() {
                    self.mark_away(r.channel, r.tag as usize, &r.cmd);
                    self.flushing.push((token, r));
                    return;
                }
                self.publish_end(r, Status::MediaError);
                return;
            }
        }
        self.publish_end(r, status);
    }
}
