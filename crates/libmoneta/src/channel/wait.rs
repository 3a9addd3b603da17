//! Waiting for a command's completion, in the three ways the device publishes one (Moneta-D
//! §4.4): spinning on the tag's status entry (DMA completion) and then sleeping on it, reading
//! the completion count and harvesting the tag status register (forwarding), or sleeping on
//! the entry's futex (issue-sleep). How long a wait spins, and when it stops spinning, is
//! decided here.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use moneta_abi::{Completion, Status, TAGS_PER_CHANNEL};

use super::{Channel, Completed, Tag};
use crate::ClientError;

/// How long a waiter spins before it checks that the daemon is still there.
const LIVENESS_INTERVAL: Duration = Duration::from_millis(200);

impl Channel {
    /// Non-blocking check of `tag`; for forwarding it also harvests the tag status register.
    pub fn poll(&self, tag: Tag, mode: Completion) -> Option<Completed> {
        if mode == Completion::Forward {
            self.harvest();
        }
        let want = self.seqs[tag.0 as usize].load(Ordering::Relaxed);
        if self.slot(tag).status.state.load(Ordering::Acquire) == want {
            Some(self.take_completion(tag))
        } else {
            None
        }
    }

    /// Waits for `tag`'s command to complete, in the way `mode` says.
    pub fn wait(&self, tag: Tag, mode: Completion) -> Result<Completed, ClientError> {
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let r = self.wait_counted(tag, mode);
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        r
    }

    /// Whether the command last submitted on `tag` has completed (a look, no wait).
    pub(crate) fn completed(&self, tag: Tag) -> bool {
        let want = self.seqs[tag.0 as usize].load(Ordering::Relaxed);
        self.slot(tag).status.state.load(Ordering::Acquire) == want
    }

    fn wait_counted(&self, tag: Tag, mode: Completion) -> Result<Completed, ClientError> {
        let st = &self.slot(tag).status;
        let want = self.seqs[tag.0 as usize].load(Ordering::Relaxed);
        if self.gone.load(Ordering::Relaxed) && st.state.load(Ordering::Acquire) != want {
            return Err(ClientError::DeviceGone);
        }
        match mode {
            Completion::Dma => {
                // The only command in flight on the channel (one tag taken, no thread queued
                // for one): no other thread of the process waits on it for the CPU this one
                // would give up, and a sleep and a wake-up cost ten times what the device
                // takes for most commands (a file call that commits, a 64 KiB copy), so it
                // spins, offering the core now and then, until the completion comes.
                // (Tags held by posted closes do not count: nobody waits on them.)
                if self.spinners.fetch_add(1, Ordering::Relaxed) == 0
                    && self.tags.free_mask().count_ones() + self.closes_out()
                        == TAGS_PER_CHANNEL as u32 - 1
                    && !self.tags.waiting()
                {
                    // Unless the device says the command waits for the host's disk or a
                    // lock on a thread of its own: that thread needs a CPU, and the wait
                    // is long enough to pay for a wake-up.
                    let mut spins = 0u32;
                    let mut since = None;
                    let r = loop {
                        if st.state.load(Ordering::Acquire) == want {
                            break Ok(true);
                        }
                        spins = spin_once(spins, st, want);
                        if spins.is_multiple_of(AWAY_CHECK_SPINS) && away(st, want) {
                            break Ok(false);
                        }
                        if spins.is_multiple_of(4096) {
                            if let Err(e) = self.check_alive(&mut since) {
                                break Err(e);
                            }
                        }
                    };
                    self.spinners.fetch_sub(1, Ordering::Relaxed);
                    if !r? {
                        self.sleep_until(tag, want)?;
                    }
                    return Ok(self.take_completion(tag));
                }
                self.spinners.fetch_sub(1, Ordering::Relaxed);
                // Spinning threads beyond the CPUs there are only take turns with each other
                // and with the device's poller, which on a machine with few CPUs is what
                // they wait for: past the limit, a thread sleeps at once (the device wakes a
                // sleeper of a DMA completion too). A spin that ends in a sleep anyway only
                // takes a CPU from the threads with work to do, so once spins have stopped
                // paying the threads sleep at once, trying a spin again now and then. Nor
                // does a thread spin while more requests wait for tags than the channel has:
                // the device has work for a good while whichever completion comes first, and
                // a spinning thread only delays the threads that would reap and issue it
                // (with 64 threads on two CPUs, spinning doubled the worst request's time).
                //
                // Nor when more threads wait than there are CPUs for them and the poller: the
                // device serves them at the same pace whichever way they wait (the mean wait
                // is what is in flight over the device's rate), but a thread that spins and
                // issues again at once keeps its CPU while the threads the device woke queue
                // behind it, some of them for a hundred milliseconds; sleeping, they take
                // turns.
                let score = self.spin_score.load(Ordering::Relaxed);
                let try_spin = !away(st, want)
                    && !self.reapers.backlogged()
                    && self.waiters.load(Ordering::Relaxed) <= self.max_spinners + 1
                    && (score > 0
                        || self
                            .spin_probe
                            .fetch_add(1, Ordering::Relaxed)
                            .is_multiple_of(SPIN_PROBE_EVERY));
                if try_spin && self.spinners.fetch_add(1, Ordering::Relaxed) < self.max_spinners {
                    let mut spins = 0u32;
                    let began = std::time::Instant::now();
                    let done = loop {
                        if st.state.load(Ordering::Acquire) == want {
                            break true;
                        }
                        spins = spins.wrapping_add(1);
                        if spins.is_multiple_of(SPINS_PER_CLOCK)
                            && began.elapsed() >= SPIN_BEFORE_SLEEP
                            && !ends_soon(st, want)
                        {
                            break false;
                        }
                        std::hint::spin_loop();
                    };
                    self.spinners.fetch_sub(1, Ordering::Relaxed);
                    if done {
                        if score != SPIN_SCORE_MAX {
                            self.spin_score.store(SPIN_SCORE_MAX, Ordering::Relaxed);
                        }
                        return Ok(self.take_completion(tag));
                    }
                    // A command that went to the device's disk or lock thread says nothing
                    // of whether spinning pays for the others.
                    if !away(st, want) {
                        self.spin_score.store(score / 2, Ordering::Relaxed);
                    }
                } else if try_spin {
                    self.spinners.fetch_sub(1, Ordering::Relaxed);
                }
                self.sleep_until(tag, want)?;
            }
            Completion::Forward => {
                let count = &self.header().completion_count;
                let mut seen = u64::MAX;
                let mut spins = 0u32;
                let mut since = None;
                loop {
                    let c = count.load(Ordering::Acquire);
                    if c != seen {
                        seen = c;
                        self.harvest();
                    }
                    if st.state.load(Ordering::Acquire) == want {
                        break;
                    }
                    spins = spin_once(spins, st, want);
                    if spins.is_multiple_of(4096) {
                        self.check_alive(&mut since)?;
                    }
                }
            }
            Completion::Sleep => self.sleep_until(tag, want)?,
        }
        Ok(self.take_completion(tag))
    }

    /// Sleeps on `tag`'s status word until it shows `want` (issue-sleep, §7.3 of the ABI).
    pub(super) fn sleep_until(&self, tag: Tag, want: u32) -> Result<(), ClientError> {
        let st = &self.slot(tag).status;
        // A count rather than a flag: a thread waiting for a tag may sleep on this command too
        // (see `Channel::tag`), and neither may clear the other's mark.
        st.waiter.fetch_add(1, Ordering::SeqCst);
        let timeout = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        let mut since = None;
        // Pairs with the device's store of `state` before it reads the waiter flag.
        loop {
            let now = st.state.load(Ordering::SeqCst);
            if now == want {
                break;
            }
            match rustix::thread::futex::wait(
                &st.state,
                rustix::thread::futex::Flags::empty(),
                now,
                Some(&timeout),
            ) {
                Ok(()) | Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::TIMEDOUT) => {
                    if let Err(e) = self.check_alive(&mut since) {
                        st.waiter.fetch_sub(1, Ordering::SeqCst);
                        return Err(e);
                    }
                }
                Err(e) => {
                    st.waiter.fetch_sub(1, Ordering::SeqCst);
                    return Err(e.into());
                }
            }
        }
        st.waiter.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }

    /// Whether a wait has already found the daemon gone: a command submitted now cannot be
    /// carried out.
    pub(crate) fn known_gone(&self) -> bool {
        self.gone.load(Ordering::Relaxed)
    }

    pub(super) fn check_alive(&self, since: &mut Option<Instant>) -> Result<(), ClientError> {
        if self.gone.load(Ordering::Relaxed) {
            return Err(ClientError::DeviceGone);
        }
        let start = *since.get_or_insert_with(Instant::now);
        if start.elapsed() >= LIVENESS_INTERVAL {
            if !self.control.alive() {
                self.gone.store(true, Ordering::Relaxed);
                return Err(ClientError::DeviceGone);
            }
            *since = Some(Instant::now());
        }
        Ok(())
    }

    /// Forwarding: takes the tag status register's bits and publishes each of those tags'
    /// sequence numbers in its status entry, for whichever thread waits on it.
    pub(super) fn harvest(&self) {
        let mut b = self.header().tag_status_register.swap(0, Ordering::Acquire);
        while b != 0 {
            let t = b.trailing_zeros() as usize;
            b &= b - 1;
            let seq = self.seqs[t].load(Ordering::Relaxed);
            self.slot(Tag(t as u8))
                .status
                .state
                .store(seq, Ordering::Release);
        }
    }

    pub(super) fn take_completion(&self, tag: Tag) -> Completed {
        let st = &self.slot(tag).status;
        let raw = st.result.load(Ordering::Relaxed);
        Completed {
            status: Status::from_u32(raw).unwrap_or(Status::Malformed),
            bytes: st.bytes.load(Ordering::Relaxed),
            device_ns: st.device_ns.load(Ordering::Relaxed),
        }
    }
}

/// How long a DMA completion wait spins before it sleeps until the device wakes it: longer
/// than the device takes for a command of a DMA slice when it is not queued behind others,
/// the array model's time included (a 4 KiB read of the `pcm` model and the channel's round
/// trip take about 6 µs), and short enough that a device poller the scheduler woke onto this
/// CPU (by this thread's kick: a wakee is placed near its waker) gets the CPU soon. A time,
/// not a count of `pause` instructions: one `pause` takes 15 ns on some processors and 40 on
/// others, and a count tuned on one made waits of 4.2 µs sleep on another, paying a wake-up
/// of 20-25 µs. The wait does not offer the CPU with `sched_yield` instead: each yield puts
/// the thread behind every other runnable thread of the process (the fair scheduler moves its
/// deadline a time slice later), so with more threads than CPUs a spinner that yielded saw
/// its completion 6-21 ms after the device had published it.
const SPIN_BEFORE_SLEEP: std::time::Duration = std::time::Duration::from_micros(10);

/// Spins between two looks at the clock while waiting ([`SPIN_BEFORE_SLEEP`]).
const SPINS_PER_CLOCK: u32 = 32;

/// A wait past [`SPIN_BEFORE_SLEEP`] goes on spinning while the device has said the command
/// completes within this long (an array model's completion time, the tag's `eta_ns`): a
/// sleep would be seen only after a wake-up, which on a virtual machine costs tens of
/// microseconds, and the emulated device's latency is what the client came to see.
const ETA_SPIN_MAX_NS: u64 = 2_000_000;

/// How long past the time the device gave a wait still spins before it sleeps.
const ETA_SLACK_NS: u64 = 50_000;

/// Whether the device said that the command `want` of this tag completes soon
/// ([`ETA_SPIN_MAX_NS`]), and it is not yet long past that time.
fn ends_soon(st: &moneta_abi::TagStatus, want: u32) -> bool {
    due_within(st, want, ETA_SPIN_MAX_NS)
}

/// [`Channel::wait`]: a spin that saw its completion sets the score to this; one that ended
/// in a sleep halves it, and at 0 threads sleep at once (four fruitless spins in a row).
pub(super) const SPIN_SCORE_MAX: u32 = 8;

/// With a score of 0, one wait in this many spins all the same, to notice when spinning pays
/// again.
const SPIN_PROBE_EVERY: u32 = 64;

/// Spins before a forwarding wait starts offering the core (about 6 µs of `pause`).
const SPINS_BEFORE_YIELD: u32 = 256;

/// Spins between offers of the core once a wait has gone on that long.
const SPINS_PER_YIELD: u32 = 64;

/// One step of a spinning completion wait; returns the new count. A wait longer than a few
/// microseconds yields now and then: the device's poller may have been woken onto this core
/// (by this thread's kick, the scheduler places it near its waker) and would otherwise wait
/// for this thread's time slice to end, milliseconds later. With nothing else runnable the
/// yield returns at once, but it is still a system call: a completion published during it is
/// seen a few hundred nanoseconds late, so the wait does not yield while the device has said
/// the command completes within [`YIELD_HORIZON_NS`] (an array model's time, `eta_ns`).
fn spin_once(spins: u32, st: &moneta_abi::TagStatus, want: u32) -> u32 {
    let spins = spins.wrapping_add(1);
    if spins >= SPINS_BEFORE_YIELD
        && spins.is_multiple_of(SPINS_PER_YIELD)
        && !due_within(st, want, YIELD_HORIZON_NS)
    {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
    spins
}

/// A spinning wait does not offer the core while its command is due this soon.
const YIELD_HORIZON_NS: u64 = 20_000;

/// Spins of a lone DMA wait between two looks at whether the device said its command waits
/// on a thread of its own ([`away`]): a few hundred nanoseconds of `pause`.
const AWAY_CHECK_SPINS: u32 = 16;

/// Whether the device said that the command `want` of this tag waits for the host's disk or
/// a lock on a thread of the device that sleeps meanwhile ([`moneta_abi::ETA_AWAY`]): it has
/// no completion time, and a spinning waiter only takes the CPU that thread needs.
fn away(st: &moneta_abi::TagStatus, want: u32) -> bool {
    st.eta_seq.load(Ordering::Acquire) == want
        && st.eta_ns.load(Ordering::Relaxed) == moneta_abi::ETA_AWAY
}

/// Whether the device said that the command `want` of this tag completes within `ns`, and it
/// is not yet long past that time ([`ETA_SLACK_NS`]).
fn due_within(st: &moneta_abi::TagStatus, want: u32, ns: u64) -> bool {
    if st.eta_seq.load(Ordering::Acquire) != want {
        return false;
    }
    let eta = st.eta_ns.load(Ordering::Relaxed);
    let now = monotonic_ns();
    now < eta.saturating_add(ETA_SLACK_NS) && eta.saturating_sub(now) <= ns
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of the device's `eta_ns`.
fn monotonic_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}
