//! File calls answered later: the work of an `OP_FS` call that waits for the disk or for
//! locks (a durability point at the `host` level, a call the poller could not make at once:
//! a lock it needed was busy, or the call frees or zeroes space) runs on a few worker threads,
//! never on the poller.
//! The command stays in flight on its channel meanwhile (so the channel stays active, and its
//! next command is taken without a kick), and the pass that finds the work done completes it
//! with the answer, as if it had been given at once. An answer that changes no records (a
//! durability point's, a lock's) the worker publishes itself, the moment it has it: the
//! client waiting for it then pays one wake-up (the worker's), not a wake-up of the poller
//! and another from it; the poller's pass that takes the answer only ends the command. So a
//! sleeping poller is not woken for such an answer at all: nothing of the poller's waits for
//! it (a file call takes no part in barrier epochs, and a channel's removal, a stop or a
//! flush waiting for the channel's commands keep the poller awake), and the client's next
//! ring wakes it, as any ring of a parked channel does, and it ends the command then.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Instant;

use moneta_abi::{Completion, TagStatus};

use super::*;
use crate::clock::Clock;
use crate::media::Media;

/// Worker threads. Calls that wait for one flush share it (the permission manager's group
/// commit), so more than one runs at a time.
const WORKERS: usize = 4;

/// Most calls of one channel at the workers at once; the channel's next ones are referred to
/// the control socket, so that one client's calls cannot hold every worker.
const LATER_PER_CHANNEL: usize = 2;

/// Most calls at the workers at once, of all channels: one each. More are referred to the
/// control socket, whose callers share a flush however many they are (a worker's call joins
/// the flush of the moment only when it starts), so a queue never forms behind the workers.
const LATER_IN_ALL: usize = WORKERS;

/// A command whose answer a worker is making.
struct Waiting {
    token: u64,
    channel: u32,
    tag: u8,
    cmd: Decoded,
    t0: u64,
    /// Set by the worker once it has published the completion itself.
    published: Arc<AtomicBool>,
}

/// What a worker needs to publish a call's completion itself: the tag's status entry and
/// slice in the channel's mapping, which stays mapped while the call is in flight (a channel
/// is not removed, nor the poller stopped, while a command of it waits here).
struct Direct {
    status: *const TagStatus,
    slice: *mut u8,
    slice_len: usize,
    seq: u32,
    cookie: u64,
    mode: Completion,
    /// Device time before the hand-off, and when the hand-off was.
    before_ns: u64,
    handed: Instant,
    published: Arc<AtomicBool>,
    /// The device's counters, where the worker counts what it completes.
    shared: Arc<Shared>,
}

// SAFETY: the pointers are into the channel's shared mapping, which outlives the job (see
// `Direct`); every store through them is atomic or a byte copy into the tag's own slice,
// which the client does not read before the completion is published.
unsafe impl Send for Direct {}

impl Direct {
    /// Publishes the answer the way the command asked, when the answer changes no records
    /// and fits the slice, marks it published and says so; otherwise leaves it to the poller.
    fn publish(&self, answer: &FsAnswer) -> bool {
        if !answer.ops.is_empty()
            || answer.reply.is_empty()
            || answer.reply.len() > self.slice_len
            || !matches!(self.mode, Completion::Dma | Completion::Sleep)
        {
            return false;
        }
        // SAFETY: see `Direct`; `reply.len() <= slice_len` was checked above.
        unsafe {
            std::ptr::copy_nonoverlapping(answer.reply.as_ptr(), self.slice, answer.reply.len())
        };
        // SAFETY: see `Direct`.
        let st = unsafe { &*self.status };
        let device_ns = self.before_ns + self.handed.elapsed().as_nanos() as u64;
        st.result.store(Status::Ok as u32, Ordering::Relaxed);
        st.bytes.store(answer.reply.len() as u64, Ordering::Relaxed);
        st.cookie.store(self.cookie, Ordering::Relaxed);
        st.device_ns.store(device_ns, Ordering::Relaxed);
        // Before the publication: a client that has seen it may ring the tag again at once,
        // and the poller must then know that the command it still counts in flight is done;
        // or ask for `status`, which must count it.
        self.shared
            .fs_calls_by_workers
            .fetch_add(1, Ordering::SeqCst);
        self.published.store(true, Ordering::Release);
        super::completion::publish_state(st, self.seq);
        true
    }
}

/// A job, with where to publish its answer when the worker may.
type Job = (u64, FsJob, Direct);

/// The workers' queue. A worker waits on the condition variable, not on the lock, and the
/// poller signals after it has let the lock go: the woken worker takes its job without
/// waking another, and its call starts one wake-up after the poller handed it over.
#[derive(Default)]
struct Queue {
    jobs: Mutex<(VecDeque<Job>, bool)>,
    ready: Condvar,
}

impl Queue {
    fn push(&self, job: Job) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .push_back(job);
        self.ready.notify_one();
    }

    /// The next job; `None` once the queue is closed.
    fn pop(&self) -> Option<Job> {
        let mut q = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(job) = q.0.pop_front() {
                return Some(job);
            }
            if q.1 {
                return None;
            }
            q = self.ready.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Closes the queue, dropping the jobs not yet taken: their channels' mappings go with
    /// the poller.
    fn close(&self) {
        let mut q = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        q.0.clear();
        q.1 = true;
        drop(q);
        self.ready.notify_all();
    }
}

/// The workers and the commands waiting for them.
pub(super) struct Later {
    /// The workers' queue, once the first is started.
    queue: Option<Arc<Queue>>,
    /// Answers: (token, answer).
    answers: mpsc::Receiver<(u64, FsAnswer)>,
    answer_tx: mpsc::Sender<(u64, FsAnswer)>,
    /// Written after each answer the poller must give itself, to wake a sleeping poller.
    waker: OwnedFd,
    waiting: Vec<Waiting>,
    next: u64,
    /// Where the workers run when the poller has a CPU of its own: elsewhere.
    away: Option<rustix::thread::CpuSet>,
}

impl Drop for Later {
    fn drop(&mut self) {
        if let Some(q) = &self.queue {
            q.close();
        }
    }
}

impl Later {
    pub(super) fn new(waker: OwnedFd, away: Option<rustix::thread::CpuSet>) -> Later {
        let (answer_tx, answers) = mpsc::channel();
        Later {
            queue: None,
            answers,
            answer_tx,
            waker,
            waiting: Vec::new(),
            next: 0,
            away,
        }
    }

    /// Whether a command of `channel` waits for a worker.
    pub(super) fn holds(&self, channel: u32) -> bool {
        self.waiting.iter().any(|w| w.channel == channel)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The tags of `channel` whose commands wait for a worker.
    pub(super) fn tags_of(&self, channel: u32) -> u64 {
        self.waiting
            .iter()
            .filter(|w| w.channel == channel)
            .fold(0, |m, w| m | 1u64 << w.tag)
    }

    /// Whether the command on `tag` of `channel` is here and its worker has published its
    /// completion: the answer is on its way to [`Poller::collect_later`].
    pub(super) fn published(&self, channel: u32, tag: usize) -> bool {
        self.waiting.iter().any(|w| {
            w.channel == channel && usize::from(w.tag) == tag && w.published.load(Ordering::Acquire)
        })
    }

    /// The workers' queue, starting the workers the first time (a device whose calls never
    /// wait has none).
    fn queue(&mut self) -> Option<&Arc<Queue>> {
        if self.queue.is_none() {
            let queue = Arc::new(Queue::default());
            for _ in 0..WORKERS {
                let queue = queue.clone();
                let answers = self.answer_tx.clone();
                let waker = self.waker.try_clone().ok()?;
                let away = self.away;
                std::thread::Builder::new()
                    .name("moneta-files".into())
                    .spawn(move || {
                        let _stop = crate::failstop::FailStop::new("device's file-call worker");
                        // Started by the poller, the worker would share its CPU alone.
                        super::config::run_away_from_poller(away.as_ref());
                        while let Some((token, job, direct)) = queue.pop() {
                            let answer = job();
                            // The client first: the poller's books can wait.
                            let published = direct.publish(&answer);
                            if answers.send((token, answer)).is_err() {
                                break;
                            }
                            if !published {
                                let _ = rustix::io::write(&waker, &1u64.to_ne_bytes());
                            }
                        }
                    })
                    .ok()?;
            }
            self.queue = Some(queue);
        }
        self.queue.as_ref()
    }
}

impl<M: Media, C: Clock> Poller<M, C> {
    /// Leaves the command on `tag` of channel `id` to a worker running `job`; false (the
    /// caller refers the command, and the job is dropped undone) when the channel has its
    /// share of the workers already or they cannot start.
    pub(super) fn answer_later(
        &mut self,
        id: u32,
        tag: usize,
        cmd: &Decoded,
        job: FsJob,
        now: u64,
    ) -> bool {
        let l = &mut self.later;
        if l.waiting.len() >= LATER_IN_ALL
            || l.waiting.iter().filter(|w| w.channel == id).count() >= LATER_PER_CHANNEL
        {
            return false;
        }
        let Some(ch) = self.channels[id as usize].as_mut() else {
            return false;
        };
        let slice_len = ch.mem.geometry().slice_size;
        let Some(slice) = ch.mem.dma((tag * slice_len) as u64, slice_len as u64) else {
            return false;
        };
        let published = Arc::new(AtomicBool::new(false));
        let direct = Direct {
            status: &ch.mem.slot(tag).status,
            slice,
            slice_len,
            seq: cmd.seq,
            cookie: cmd.cookie,
            mode: cmd.completion,
            before_ns: self.clock.now_ns().saturating_sub(now),
            handed: Instant::now(),
            published: published.clone(),
            shared: self.shared.clone(),
        };
        ch.in_flight |= 1u64 << tag;
        let token = self.later.next;
        let Some(queue) = self.later.queue().cloned() else {
            if let Some(ch) = self.channels[id as usize].as_mut() {
                ch.in_flight &= !(1u64 << tag);
            }
            return false;
        };
        // Marked before the worker can publish: a client that sees the mark sleeps, and the
        // worker's publication wakes it.
        self.mark_away(id, tag, cmd);
        queue.push((token, job, direct));
        let l = &mut self.later;
        l.next += 1;
        l.waiting.push(Waiting {
            token,
            channel: id,
            tag: tag as u8,
            cmd: *cmd,
            t0: now,
            published,
        });
        true
    }

    /// Tells a client waiting for the DMA completion of the command on `tag` of channel `id`
    /// that it waits for the host's disk or a lock, on a thread that sleeps meanwhile
    /// ([`moneta_abi::ETA_AWAY`]): a client that spins for it takes the CPU that thread needs.
    pub(super) fn mark_away(&self, id: u32, tag: usize, cmd: &Decoded) {
        if cmd.completion != moneta_abi::Completion::Dma {
            return;
        }
        let Some(ch) = self.channels[id as usize].as_ref() else {
            return;
        };
        let st = &ch.mem.slot(tag).status;
        st.eta_ns.store(moneta_abi::ETA_AWAY, Ordering::Relaxed);
        st.eta_seq.store(cmd.seq, Ordering::Release);
    }

    /// Completes the commands whose workers have answered.
    pub(super) fn collect_later(&mut self) -> bool {
        if self.later.waiting.is_empty() {
            return false;
        }
        let mut any = false;
        while let Ok((token, answer)) = self.later.answers.try_recv() {
            let Some(pos) = self.later.waiting.iter().position(|w| w.token == token) else {
                continue;
            };
            let w = self.later.waiting.swap_remove(pos);
            any = true;
            let now = self.clock.now_ns();
            self.now = now;
            // A channel with a command here is not removed before it completes.
            let Some(ch) = self.channels[w.channel as usize].as_mut() else {
                continue;
            };
            ch.in_flight &= !(1u64 << w.tag);
            ch.last_active = now;
            if w.published.load(Ordering::Acquire) {
                // The worker gave the client its answer, and counted it.
                continue;
            }
            let (status, bytes) = match self.apply_fs_answer(w.channel, w.tag as usize, answer) {
                Some(bytes) => {
                    self.local.fs_calls += 1;
                    (Status::Ok, bytes)
                }
                // The work is done, but the answer cannot be given here: the socket answers
                // the call again.
                None => {
                    self.local.fs_calls_referred += 1;
                    (Status::Refer, 0)
                }
            };
            let mode = w.cmd.completion;
            self.publish_completion(w.channel, w.tag, mode, status, &w.cmd, bytes, w.t0);
        }
        any
    }
}
