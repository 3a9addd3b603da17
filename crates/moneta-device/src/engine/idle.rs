//! Idling: yielding the core, parking quiet channels, sleeping in `epoll_wait` when nothing
//! is active, and bringing channels back when their kick pipe (or doorbell) says so.

use std::os::fd::AsFd;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use moneta_abi::{PARKED, POLLING};
use rustix::event::{epoll, poll, PollFd, PollFlags};

use super::*;
use crate::clock::Clock;
use crate::media::Media;

impl<M: Media, C: Clock> Poller<M, C> {
    pub(super) fn idle(&mut self) {
        self.idle_passes = self.idle_passes.wrapping_add(1);
        if !self.idle_passes.is_multiple_of(IDLE_CHECK_PASSES) {
            return;
        }
        let now = self.tick();
        // A completion (or a decision of the model on a request in flight) due within a
        // syscall or two is waited for on the clock: a yield or a look at the kick pipes could
        // publish it late. Nothing in flight, nothing is waited for.
        let due_soon =
            !self.sched.is_empty() && self.next_due().is_some_and(|t| t <= now + DUE_SOON_NS);
        if !due_soon && now.saturating_sub(self.last_busy) >= YIELD_AFTER_NS {
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
            // Commands held for a later epoch wait for others of the channel, which keep it
            // active while they are in flight; alone they do not.
            let working = ch.in_flight & !ch.order.held_tags;
            if working == 0 && now.saturating_sub(ch.last_active) >= park_after {
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
        let calm = now.saturating_sub(self.last_control) >= park_after
            && self.retag.waiting() == 0
            && self.flushing.is_empty()
            && self.flush_wait.is_empty()
            && self.fences.is_empty()
            && self.removals.is_empty()
            && self.shutdown.is_none();
        if calm && !due_soon && self.active.is_empty() {
            self.sleep(now);
        } else if calm && !due_soon && self.waits_elsewhere_only(now) {
            self.sleep_for_answers(now);
        } else if !due_soon && self.idle_passes.is_multiple_of(KICK_CHECK_PASSES) {
            self.poll_kicks(Some(Duration::ZERO));
        }
    }

    /// Sleeps until a kick, a control request, an answer of a member to a request out, or
    /// the next thing due (woken a little early, to wait out the rest on the clock).
    fn sleep(&mut self, now: u64) {
        let mut timeout = self
            .next_due()
            .map(|t| Duration::from_nanos(t.saturating_sub(now + DUE_SOON_NS)));
        let deadline = self
            .remote
            .as_ref()
            .and_then(|r| r.links.iter().filter_map(|l| l.next_deadline()).min());
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        self.shared.poller_sleeps.fetch_add(1, Ordering::Relaxed);
        self.publish();
        // Pairs with a poster's load of `sleeping` after it sent (Dekker): either it sees
        // the flag and writes the waker, or this sees its post.
        self.shared.sleeping.store(true, Ordering::SeqCst);
        if self.shared.posted.load(Ordering::SeqCst) == self.applied {
            self.wait_for_events(timeout);
        }
        self.shared.sleeping.store(false, Ordering::SeqCst);
        self.shared.poller_wakeups.fetch_add(1, Ordering::Relaxed);
    }

    /// Waits in `epoll_wait` for kicks and the waker, and, while requests are out at members,
    /// for their links' sockets too (one `poll` over the epoll descriptor and the sockets).
    fn wait_for_events(&mut self, timeout: Option<Duration>) {
        let ts = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        let kicked = {
            let mut fds = vec![PollFd::new(&self.epoll, PollFlags::IN)];
            if let Some(r) = &self.remote {
                fds.extend(
                    r.links
                        .iter()
                        .filter_map(|l| l.wait_on())
                        .map(|(fd, flags)| PollFd::from_borrowed_fd(fd, flags)),
                );
            }
            if fds.len() == 1 {
                None
            } else if poll(&mut fds, ts.as_ref()).is_err() {
                Some(false)
            } else {
                Some(!fds[0].revents().is_empty())
            }
        };
        match kicked {
            // No link to wait for: the kicks alone.
            None => self.poll_kicks(timeout),
            Some(true) => self.poll_kicks(Some(Duration::ZERO)),
            Some(false) => {
                let now = self.tick();
                self.look_at_deaf(now);
            }
        }
    }

    /// Whether the poller has nothing to do but wait for answers made elsewhere, and has had
    /// nothing else for [`MEMBER_SLEEP_AFTER_NS`]: every active channel's commands in flight
    /// are at members or at the file-call workers (`later.rs`), and each channel can kick (a
    /// channel without a kick pipe could not wake the poller with its next command) and is not
    /// closing.
    fn waits_elsewhere_only(&self, now: u64) -> bool {
        let members = self.remote.as_ref().filter(|r| !r.pending.is_empty());
        if (members.is_none() && self.later.is_empty())
            || now.saturating_sub(self.last_busy) < MEMBER_SLEEP_AFTER_NS
        {
            return false;
        }
        self.active.iter().all(|&id| {
            self.channels[id as usize].as_ref().is_some_and(|ch| {
                let working = ch.in_flight & !ch.order.held_tags;
                let away = members.map_or(0, |r| r.tags_of(id)) | self.later.tags_of(id);
                !ch.deaf && !ch.closing && working & !away == 0
            })
        })
    }

    /// Parks the active channels, whose commands are all at members or at the workers, and
    /// sleeps until a member or a worker answers (or a kick, or anything else that wakes a
    /// sleeping poller; not a worker that gave the client its answer itself, see `later.rs`);
    /// then polls them again. A spinning poller would take, on a machine
    /// with few CPUs, the CPU the network, a member on the same machine or a worker's flush
    /// needs; the one wake-up this costs is the one a client of the network, or of the
    /// control socket, pays anyway. If a channel was rung meanwhile, nothing sleeps.
    fn sleep_for_answers(&mut self, now: u64) {
        let mut parked = Vec::with_capacity(self.active.len());
        let mut rung = false;
        for &id in &self.active {
            let ch = self.channels[id as usize].as_mut().expect("active channel");
            let h = ch.mem.header();
            h.parked.store(PARKED, Ordering::SeqCst);
            // Pairs with the client's doorbell flip before it reads `parked`.
            if h.doorbell.load(Ordering::SeqCst) != ch.seen {
                h.parked.store(POLLING, Ordering::SeqCst);
                rung = true;
                break;
            }
            ch.parked = true;
            parked.push(id);
        }
        if !rung {
            self.active.clear();
            self.sleep(now);
        }
        let now = self.tick();
        for id in parked {
            if rung {
                // Still in the active set: only the flags go back.
                let ch = self.channels[id as usize].as_mut().expect("active channel");
                ch.parked = false;
                ch.mem.header().parked.store(POLLING, Ordering::SeqCst);
            } else {
                // Unless a kick brought it back already.
                self.unpark(id, now);
            }
        }
    }

    /// When the poller next has something to do without being asked: a scheduled completion
    /// or a decision of the array's model.
    fn next_due(&self) -> Option<u64> {
        let next = self.sched.next_ready();
        let model_next = self.model.as_ref().and_then(|m| m.next_event());
        match (next, model_next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Waits up to `timeout` (forever with `None`) for kicks of parked channels or the control
    /// waker, and brings kicked channels back into the active set.
    pub(super) fn poll_kicks(&mut self, timeout: Option<Duration>) {
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
    pub(super) fn look_at_deaf(&mut self, now: u64) {
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
    pub(super) fn unpark(&mut self, id: u32, now: u64) {
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
