//! Forwarding: requests whose range another member holds (see [`crate::remote`]) go, once the
//! permission table has allowed them, out on that member's link, which the poller drives itself;
//! the pass that reads the answer completes the request like any other.
//!
//! A forwarded request keeps a reserved place in the scheduler's issue order until the member
//! answers, so a revocation waits for it as for a local request (revocation before reuse), a
//! FLUSH of its channel waits for it, and its channel is not removed under it. It gives its
//! physical tag back when it leaves for the link: the physical tags are the local array's
//! request slots, and a member that is slow to answer must not hold them from every other
//! channel's local requests. The array's timing model is the local array's: forwarded requests take
//! the member's time, not the model's.

use std::sync::atomic::Ordering;

use moneta_abi::Opcode;

use super::*;
use crate::clock::Clock;
use crate::media::Media;
use crate::remote::link::{Answer, Job, Op};
pub(super) use crate::remote::Place;
use crate::remote::{locate, Link, MemberConfig};

/// The token of a hint sent to member `token & !HINT`. A hint (WILLNEED) on a member's range
/// completes at once, as a local one does, and goes on to the member as `NBD_CMD_CACHE` beside
/// it: nothing waits for the answer, so at most [`MAX_HINTS`] per member are on their way, and
/// a hint past that is dropped.
const HINT: u64 = 1 << 63;

/// Hints on their way to one member at most.
const MAX_HINTS: u32 = 16;

/// The most one hint asks a member to read ahead (an NBD command's length is 32 bits).
const HINT_LEN: u64 = 32 << 20;

/// How often a pass with other work looks at the links (see [`Poller::collect_forwards`]).
const LOOK_EVERY_BUSY: u64 = 4;

/// The poller's side of the members.
pub(super) struct Remote {
    pub links: Vec<Link>,
    configs: Vec<MemberConfig>,
    /// Where the local array lies in the address space.
    local_at: u64,
    /// Answers given and not yet applied.
    answers: Vec<Answer>,
    /// Requests at a member: (token, reserved place, request).
    pub pending: Vec<(u64, u64, Issued)>,
    /// Hints sent to each member and not yet answered (see [`HINT`]).
    hints: Vec<u32>,
    next: u64,
    /// Passes that came to the links (see [`Poller::collect_forwards`]).
    looks: u64,
}

impl Remote {
    pub fn new(links: Vec<Link>, local_at: u64) -> Remote {
        Remote {
            configs: links.iter().map(|l| l.config.clone()).collect(),
            local_at,
            hints: vec![0; links.len()],
            links,
            answers: Vec::new(),
            pending: Vec::new(),
            next: 0,
            looks: 0,
        }
    }

    /// Where `cmd`'s range lies.
    pub fn place(&self, array_size: u64, cmd: &Decoded) -> Place {
        locate(
            &self.configs,
            self.local_at,
            array_size,
            cmd.addr,
            cmd.len.max(1),
        )
    }

    /// Whether a request of channel `id` is at a member.
    pub fn holds(&self, id: u32) -> bool {
        self.pending.iter().any(|(_, _, r)| r.channel == id)
    }

    /// The tags of channel `id` whose requests are at a member.
    pub fn tags_of(&self, id: u32) -> u64 {
        self.pending
            .iter()
            .filter(|(_, _, r)| r.channel == id)
            .fold(0, |m, (_, _, r)| m | 1u64 << r.tag)
    }
}

impl<M: Media, C: Clock> Poller<M, C> {
    /// Sends a checked request to member `member`, at address `offset` there. It completes
    /// when the member answers ([`Poller::collect_forwards`]).
    pub(super) fn forward(&mut self, mut issued: Issued, member: usize, offset: u64) {
        if self.shared.forward_leased.load(Ordering::Relaxed)
            && super::monotonic_ns() > self.shared.forward_until_ns.load(Ordering::Relaxed)
        {
            // The lease on the members' ranges ran out: nothing goes to them until it is
            // extended (see `Device::lease_forwarding`).
            self.publish_end(issued, Status::MediaError);
            return;
        }
        let op = match issued.cmd.opcode {
            Opcode::Read => Op::Read,
            Opcode::Write => Op::Write,
            Opcode::Flush => Op::Flush,
            Opcode::WillNeed => {
                // A hint moves nothing: it completes at once, and goes on if there is room.
                let len = issued.cmd.len.min(HINT_LEN) as usize;
                self.publish_end(issued, Status::Ok);
                let remote = self.remote.as_mut().expect("a member placed the request");
                if remote.hints[member] < MAX_HINTS {
                    let job = Job {
                        token: HINT | member as u64,
                        op: Op::Cache,
                        buf: std::ptr::null_mut(),
                        len,
                        offset,
                    };
                    remote.hints[member] += 1;
                    remote.links[member].send(job, &mut remote.answers);
                }
                return;
            }
            _ => {
                self.publish_end(issued, Status::Ok);
                return;
            }
        };
        let buf = match op {
            Op::Flush => std::ptr::null_mut(),
            _ => {
                let ch = self.channels[issued.channel as usize]
                    .as_ref()
                    .expect("a request's channel stays until it completes");
                let dma_off = u64::from(issued.tag) * ch.mem.geometry().slice_size as u64;
                ch.mem
                    .dma(dma_off, issued.cmd.len)
                    .expect("validated at intake")
            }
        };
        let seq = self.sched.reserve();
        if issued.phys != NO_PHYS {
            self.retag.release(issued.phys);
            issued.phys = NO_PHYS;
        }
        let remote = self.remote.as_mut().expect("a member placed the request");
        let token = remote.next;
        remote.next += 1;
        let job = Job {
            token,
            op,
            buf,
            len: issued.cmd.len as usize,
            offset,
        };
        remote.pending.push((token, seq, issued));
        remote.links[member].send(job, &mut remote.answers);
    }

    /// Completes the requests the members have answered. A pass that had other work (`busy`)
    /// looks at the links' sockets only one time in [`LOOK_EVERY_BUSY`]: a look is a system
    /// call, and an answer takes tens of microseconds over the network anyway.
    pub(super) fn collect_forwards(&mut self, busy: bool) -> bool {
        let Some(remote) = self.remote.as_mut() else {
            return false;
        };
        remote.looks = remote.looks.wrapping_add(1);
        if !busy || remote.looks.is_multiple_of(LOOK_EVERY_BUSY) {
            for link in remote.links.iter_mut().filter(|l| l.busy()) {
                link.drive(&mut remote.answers);
            }
        }
        if remote.answers.is_empty() {
            return false;
        }
        let mut answered = Vec::new();
        for (token, ok) in std::mem::take(&mut remote.answers) {
            if token & HINT != 0 {
                if let Some(h) = remote.hints.get_mut((token & !HINT) as usize) {
                    *h = h.saturating_sub(1);
                }
                continue;
            }
            if let Some(i) = remote.pending.iter().position(|p| p.0 == token) {
                let (_, seq, r) = remote.pending.swap_remove(i);
                answered.push((seq, r, ok));
            }
        }
        let any = !answered.is_empty();
        if any {
            // The channels are quiet from this completion on (see `publish_end`), not from
            // whenever the clock was last read: their next request should find the poller
            // awake.
            self.tick();
        }
        for (seq, r, ok) in answered {
            self.sched.forget(seq);
            if ok {
                match r.cmd.opcode {
                    Opcode::Read => self.local.bytes_read += r.cmd.len,
                    Opcode::Write => self.local.bytes_written += r.cmd.len,
                    _ => {}
                }
            }
            self.publish_end(r, if ok { Status::Ok } else { Status::MediaError });
        }
        any
    }

    /// Whether a request of channel `id` is at a member.
    pub(super) fn forwarding(&self, id: u32) -> bool {
        self.remote.as_ref().is_some_and(|r| r.holds(id))
    }
}
