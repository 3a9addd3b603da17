//! File calls answered later: the work of an `OP_FS` call that waits for the disk or for
//! locks (a durability point at the `host` level, a call the poller could not make at once:
//! a lock it needed was busy, or the call frees or zeroes space) runs on a few worker threads,
//! never on the poller.
//! The command stays in flight on its channel meanwhile (so the channel stays active, and its
//! next command is taken without a kick), and the pass that finds the work done completes it
//! with the answer, as if it had been given at once.

use std::os::fd::OwnedFd;
use std::sync::{mpsc, Arc, Mutex};

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
}

/// The workers and the commands waiting for them.
pub(super) struct Later {
    /// Jobs for the workers, once the first is started.
    jobs: Option<mpsc::Sender<(u64, FsJob)>>,
    /// Answers: (token, answer).
    answers: mpsc::Receiver<(u64, FsAnswer)>,
    answer_tx: mpsc::Sender<(u64, FsAnswer)>,
    /// Written after each answer, to wake a sleeping poller.
    waker: OwnedFd,
    waiting: Vec<Waiting>,
    next: u64,
}

impl Later {
    pub(super) fn new(waker: OwnedFd) -> Later {
        let (answer_tx, answers) = mpsc::channel();
        Later {
            jobs: None,
            answers,
            answer_tx,
            waker,
            waiting: Vec::new(),
            next: 0,
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

    /// The sender of jobs, starting the workers the first time (a device whose calls never
    /// wait has none).
    fn jobs(&mut self) -> Option<&mpsc::Sender<(u64, FsJob)>> {
        if self.jobs.is_none() {
            let (tx, rx) = mpsc::channel::<(u64, FsJob)>();
            let rx = Arc::new(Mutex::new(rx));
            for _ in 0..WORKERS {
                let rx = rx.clone();
                let answers = self.answer_tx.clone();
                let waker = self.waker.try_clone().ok()?;
                std::thread::Builder::new()
                    .name("moneta-files".into())
                    .spawn(move || {
                        let _stop = crate::failstop::FailStop::new("device's file-call worker");
                        loop {
                            // One worker at a time waits on the queue; the lock is free again
                            // once it has its job.
                            let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                            let Ok((token, job)) = job else { break };
                            if answers.send((token, job())).is_err() {
                                break;
                            }
                            let _ = rustix::io::write(&waker, &1u64.to_ne_bytes());
                        }
                    })
                    .ok()?;
            }
            self.jobs = Some(tx);
        }
        self.jobs.as_ref()
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
        let token = l.next;
        let Some(jobs) = l.jobs() else {
            return false;
        };
        if jobs.send((token, job)).is_err() {
            return false;
        }
        l.next += 1;
        l.waiting.push(Waiting {
            token,
            channel: id,
            tag: tag as u8,
            cmd: *cmd,
            t0: now,
        });
        if let Some(ch) = self.channels[id as usize].as_mut() {
            ch.in_flight |= 1u64 << tag;
        }
        true
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
