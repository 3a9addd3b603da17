//! Intake: new commands taken from the doorbells of the active channels, copied out of shared
//! memory once, decoded and validated, then queued at the retag unit; LOOKUP commands are
//! answered here, in the pass that takes them.

use std::sync::atomic::Ordering;

use moneta_abi::{ErrorRecord, LookupReply, Opcode};

use super::poller::count_evictions;
use super::*;
use crate::clock::Clock;
use crate::command::validate;
use crate::media::Media;
use crate::permission::{READ, WRITE};

impl<M: Media, C: Clock> Poller<M, C> {
    /// Takes new commands from the doorbells of the active channels.
    pub(super) fn intake(&mut self) -> bool {
        let mut busy = false;
        self.file_budget = FILE_CALLS_PER_PASS_NS;
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
            self.file_first = true;
            while bits != 0 {
                let tag = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                self.take_command(id, tag, now);
            }
        }
        busy
    }

    pub(super) fn take_command(&mut self, id: u32, tag: usize, now: u64) {
        let ch = self.channels[id as usize].as_mut().expect("active channel");
        let bit = 1u64 << tag;
        let slot = ch.mem.slot(tag);
        // Copy the command out once; nothing below reads the slot again.
        let mut words = [0u64; 8];
        for (w, a) in words.iter_mut().zip(slot.command.words.iter()) {
            *w = a.load(Ordering::Relaxed);
        }
        if ch.in_flight & bit != 0 && self.later.published(id, tag) {
            // The earlier command's worker published its completion and its answer is on the
            // way here (`later.rs`): the new command waits for the pass that has taken it.
            ch.seen ^= bit;
            return;
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
        let cmd = match validate(&words, tag, ch.mem.geometry(), self.space_size) {
            Ok(cmd) => cmd,
            Err(r) => {
                self.publish_completion(id, tag as u8, r.completion, r.status, &r.cmd, 0, now);
                return;
            }
        };
        if matches!(cmd.opcode, Opcode::Lookup | Opcode::Fs) && !self.file_call_now() {
            // This pass has spent its time on file calls, and this channel has had one: the
            // command waits for a later pass, which sees its doorbell bit again.
            let ch = self.channels[id as usize].as_mut().expect("active channel");
            ch.seen ^= bit;
            return;
        }
        if cmd.opcode == Opcode::Lookup {
            // Answered in this pass: no data moves, so no physical tag.
            let status = self.file_call(|p| p.serve_lookup(id, tag, &cmd));
            if status == Status::Ok {
                self.local.lookups += 1;
            } else {
                self.local.lookups_referred += 1;
            }
            self.publish_completion(id, tag as u8, cmd.completion, status, &cmd, 0, now);
            return;
        }
        if cmd.opcode == Opcode::Fs {
            // Answered in this pass, as a lookup, or by a worker when its work waits.
            let (status, bytes) = match self.file_call(|p| p.serve_fs(id, tag, &cmd, now)) {
                Some(Served::Now(bytes)) => {
                    self.local.fs_calls += 1;
                    (Status::Ok, bytes)
                }
                Some(Served::Later) => return,
                None => {
                    self.local.fs_calls_referred += 1;
                    (Status::Refer, 0)
                }
            };
            self.publish_completion(id, tag as u8, cmd.completion, status, &cmd, bytes, now);
            return;
        }
        let ch = self.channels[id as usize].as_mut().expect("active channel");
        ch.in_flight |= bit;
        let p = Pending {
            channel: id,
            tag: tag as u8,
            cmd,
            t0: now,
        };
        if ch.order.holds(cmd.epoch) {
            // A later epoch: it waits until the barrier of the current one has completed
            // with everything else of that epoch.
            ch.order.held_tags |= bit;
            ch.order.held.push_back(p);
            return;
        }
        self.admit(p);
    }

    /// Whether a file call (LOOKUP, FS) may be answered in this pass: while the pass's budget
    /// for them lasts, and the first of each channel's in the pass whatever is left, so that
    /// no channel waits pass after pass behind others' calls.
    fn file_call_now(&mut self) -> bool {
        let now = self.file_budget > 0 || self.file_first;
        self.file_first = false;
        now
    }

    /// Runs one file call and charges its time to the pass's budget.
    fn file_call<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> T {
        let t0 = self.clock.now_ns();
        let r = f(self);
        let spent = self.clock.now_ns().saturating_sub(t0).max(1);
        self.file_budget = self.file_budget.saturating_sub(spent);
        r
    }

    /// Queues a command of the channel's current epoch at the retag unit.
    pub(super) fn admit(&mut self, p: Pending) {
        let ch = self.channels[p.channel as usize]
            .as_mut()
            .expect("a command's channel is open");
        ch.order.open += 1;
        ch.order.barrier |= p.cmd.barrier;
        self.retag.enqueue(p.channel, p);
    }

    /// A command of the channel's current epoch has ended: when that closes the epoch (its
    /// barrier and everything else of it done), the channel moves to the next and the held
    /// commands of that one are admitted, in the order they were taken.
    pub(super) fn epoch_done(&mut self, id: u32) {
        let Some(ch) = self.channels[id as usize].as_mut() else {
            return;
        };
        let o = &mut ch.order;
        o.open = o.open.saturating_sub(1);
        if o.barrier && o.open == 0 {
            o.epoch = o.epoch.wrapping_add(1);
            o.barrier = false;
            let mut admit = Vec::new();
            let mut keep = std::collections::VecDeque::new();
            for p in o.held.drain(..) {
                if p.cmd.epoch == o.epoch {
                    o.held_tags &= !(1u64 << p.tag);
                    o.open += 1;
                    o.barrier |= p.cmd.barrier;
                    admit.push(p);
                } else {
                    keep.push_back(p);
                }
            }
            o.held = keep;
            // The next epoch cannot close here: it is either empty (no barrier taken yet) or
            // holds the commands just admitted.
            for p in admit {
                self.retag.enqueue(id, p);
            }
        }
    }

    /// The soft miss on the channel: asks the permission manager's lookup service, installs
    /// the records it answers and writes the answer into the tag's slice. `Status::Refer`
    /// whenever that cannot be done now.
    pub(super) fn serve_lookup(&mut self, id: u32, tag: usize, cmd: &Decoded) -> Status {
        let Some(service) = self.shared.files.get().cloned() else {
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

    /// A file-system call on the channel: copies the request out of the tag's slice (the
    /// client may change its memory meanwhile; the service sees one copy), asks the permission
    /// manager, makes the answer's changes to this channel's records and writes the reply into
    /// the slice. The reply's length; or the call left to a worker (`later.rs`); or `None` to
    /// refer the call to the control socket.
    pub(super) fn serve_fs(
        &mut self,
        id: u32,
        tag: usize,
        cmd: &Decoded,
        now: u64,
    ) -> Option<Served> {
        let service = self.shared.files.get().cloned()?;
        let ch = self.channels[id as usize].as_ref()?;
        let slice = ch.mem.geometry().slice_size;
        // Validation bounded `len` by the slice.
        let src = ch.mem.dma((tag * slice) as u64, cmd.len)?;
        let mut request = vec![0u8; cmd.len as usize];
        // SAFETY: `src` spans `cmd.len` bytes of the tag's slice inside the sealed mapping; the
        // bytes are copied once, whatever the client writes meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src, request.as_mut_ptr(), request.len()) };
        match service.try_call(id, &request, slice)? {
            FsOutcome::Now(answer) => self.apply_fs_answer(id, tag, answer).map(Served::Now),
            FsOutcome::Later(job) => self
                .answer_later(id, tag, cmd, job, now)
                .then_some(Served::Later),
        }
    }

    /// Makes an answer's changes to channel `id`'s records and writes its reply into the
    /// slice of `tag`: the reply's length, or `None` when the answer is out of bounds.
    pub(super) fn apply_fs_answer(&mut self, id: u32, tag: usize, answer: FsAnswer) -> Option<u64> {
        let slice = self.channels[id as usize]
            .as_ref()?
            .mem
            .geometry()
            .slice_size;
        let size = self.media.size();
        // The manager is trusted, but its changes may touch only this channel's records and
        // the array.
        let fits =
            |start: u64, len: u64| len > 0 && start.checked_add(len).is_some_and(|e| e <= size);
        if answer.reply.is_empty()
            || answer.reply.len() > slice
            || !answer.ops.iter().all(|op| match *op {
                TableOp::Insert {
                    channel,
                    start,
                    len,
                    rights,
                    ..
                } => channel == id && fits(start, len) && rights & !(READ | WRITE) == 0,
                TableOp::RemoveRange {
                    channel,
                    start,
                    len,
                    ..
                } => channel == id && fits(start, len),
                _ => false,
            })
        {
            tracing::error!(channel = id, "the file service's answer was out of bounds");
            return None;
        }
        for op in answer.ops {
            let r = match op {
                TableOp::Insert {
                    start,
                    len,
                    rights,
                    file,
                    ..
                } => self.table.insert(id, start, len, rights, file),
                TableOp::RemoveRange { start, len, .. } => self.table.remove_range(id, start, len),
                _ => unreachable!("checked above"),
            };
            match r {
                Ok(ev) => count_evictions(&self.channels, &ev),
                // The call is done: a record that could not be installed is a miss later.
                Err(e) => tracing::warn!(channel = id, "a file call's record: {e}"),
            }
        }
        let ch = self.channels[id as usize].as_ref()?;
        let dst = ch
            .mem
            .dma((tag * slice) as u64, answer.reply.len() as u64)?;
        // SAFETY: `dst` spans the reply's bytes inside the tag's slice (checked above).
        unsafe { std::ptr::copy_nonoverlapping(answer.reply.as_ptr(), dst, answer.reply.len()) };
        Some(answer.reply.len() as u64)
    }
}

/// How [`Poller::serve_fs`] took a file call.
pub(super) enum Served {
    /// Answered: the reply's length.
    Now(u64),
    /// Left to a worker: the command stays in flight.
    Later,
}
