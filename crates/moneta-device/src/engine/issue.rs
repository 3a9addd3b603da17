//! Issue: queued requests get physical tags, are checked against the permission table, move
//! their data between the array and the DMA buffer and go to the scheduler, which says when
//! they complete; flushes go to the flusher thread.

use std::sync::atomic::Ordering;

use moneta_abi::Opcode;

use super::poller::drain_posts;
use super::*;
use crate::clock::Clock;
use crate::media::Media;
use crate::permission::{READ, WRITE};

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
                self.copy(p.channel, p.tag, &cmd, 0, cmd.len);
                Status::Ok
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
    /// range of channel `id`.
    pub(super) fn copy(&mut self, id: u32, tag: u8, cmd: &Decoded, from: u64, to: u64) {
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
                unsafe { self.media.read(cmd.addr + from, dst, len as usize) };
                self.local.bytes_read += len;
            }
            Opcode::Write => {
                let src = ch.mem.dma(dma_off, len).expect("validated at intake");
                // SAFETY: as for reads; the client may change the buffer while we copy, which
                // only changes what it writes to its own range.
                unsafe { self.media.write(cmd.addr + from, src, len as usize) };
                self.local.bytes_written += len;
            }
            _ => {}
        }
    }

    /// Moves the next piece of large request `i` of `moving`.
    pub(super) fn move_piece(&mut self, i: usize) {
        let (id, tag, cmd, from) = {
            let m = &self.moving[i];
            (m.issued.channel, m.issued.tag, m.issued.cmd, m.done)
        };
        let to = (from + MOVE_PIECE).min(cmd.len);
        self.copy(id, tag, &cmd, from, to);
        self.moving[i].done = to;
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

    /// Publishes completions the scheduler says are due.
    pub(super) fn complete(&mut self) -> bool {
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
    pub(super) fn finish(&mut self, r: Issued) {
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
}
