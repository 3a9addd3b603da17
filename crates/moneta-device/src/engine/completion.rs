//! Completion: a request's physical tag released and its status published the way the
//! command asked (Moneta-D §4.4): DMA completion, forwarding, or issue-sleep.

use std::sync::atomic::Ordering;

use moneta_abi::{Completion, ErrorRecord, Opcode};

use super::*;
use crate::clock::Clock;
use crate::media::Media;

impl<M: Media, C: Clock> Poller<M, C> {
    /// Releases a request's physical tag and publishes its completion.
    pub(super) fn publish_end(&mut self, r: Issued, status: Status) {
        if r.moved != 0 {
            // Traced: the modeled media latency waited out after the data moved.
            self.local.trace_media_ns += self.clock.now_ns().saturating_sub(r.moved);
        }
        let bytes = match (status, r.cmd.opcode) {
            (Status::Ok, Opcode::Read | Opcode::Write) => r.cmd.len,
            _ => 0,
        };
        // The client first, the device's own books after: this thread reads them next, and
        // the client's wait is the latency the device is measured by.
        self.publish_completion(
            r.channel,
            r.tag,
            r.cmd.completion,
            status,
            &r.cmd,
            bytes,
            r.t0,
        );
        if r.phys != NO_PHYS {
            self.retag.release(r.phys);
        }
        if let Some(ch) = self.channels[r.channel as usize].as_mut() {
            ch.in_flight &= !(1u64 << r.tag);
            // A channel is quiet from its last completion on, not from its last doorbell: a
            // request that the array model kept longer than `park_after` must not get its
            // channel parked the moment it completes, so that the client's next request
            // (rung at once) waits for a kick and a wake-up.
            ch.last_active = ch.last_active.max(self.now);
        }
        self.epoch_done(r.channel);
    }

    /// Writes a completion the way the command asked (Moneta-D §4.4).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish_completion(
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
            // A client may sleep on a DMA completion too (one of more waiting threads than it
            // has CPUs, or a command at a sleeping thread of the device): published alike.
            Completion::Dma => publish_state(st, cmd.seq),
            Completion::Forward => {
                h.tag_status_register
                    .fetch_or(1u64 << tag, Ordering::Release);
                h.completion_count.fetch_add(1, Ordering::Release);
            }
            Completion::Sleep => publish_state(st, cmd.seq),
        }
    }
}

/// Publishes `seq` in a tag's `state` and wakes the threads sleeping on it (DMA completion and
/// issue-sleep, abi.md §7.1 and §7.3). The load of `waiter` pairs with the client's store of
/// it before it re-reads `state` and sleeps: either it sees its sequence number or this sees
/// its mark.
pub(super) fn publish_state(st: &moneta_abi::TagStatus, seq: u32) {
    st.state.store(seq, Ordering::SeqCst);
    if st.waiter.load(Ordering::SeqCst) != 0 {
        let _ = rustix::thread::futex::wake(
            &st.state,
            rustix::thread::futex::Flags::empty(),
            // FUTEX_WAKE takes a signed count: i32::MAX means "all".
            i32::MAX as u32,
        );
    }
}
