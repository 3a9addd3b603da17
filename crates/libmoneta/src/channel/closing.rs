//! Closes posted without waiting. A close whose answer changes nothing the program can see
//! need not keep it waiting: its command goes on the channel, and a later file call of the
//! process (a thread waiting for a tag, or the next close past [`MAX_POSTED`]) collects the
//! completion and frees the tag. Which closes qualify is the caller's to decide
//! (`File::close_soon`): never one that releases locks, since another process may be waiting
//! for them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;

use moneta_abi::control::{decode_reply, encode_request, Request};
use moneta_abi::fsproto::FsRequest;
use moneta_abi::{Command, Completion, Opcode, Status};

use super::{Channel, Tag};

/// Closes in flight at once on a channel; the next waits for them first.
const MAX_POSTED: u32 = 4;

/// The closes posted on a channel, and the inodes its process has locked.
#[derive(Default)]
pub(crate) struct Closing {
    /// (tag, handle) of each close in flight. Posting and the lock-state checks that decide
    /// it happen under this lock.
    posted: Mutex<Vec<(Tag, u64)>>,
    /// Closes in flight or about to be (reserved before a tag is taken), at most
    /// [`MAX_POSTED`]; read without the lock on every file call.
    count: AtomicU32,
    /// Closes taken out of `posted` by a collecting thread and not yet finished.
    collecting: AtomicU32,
    /// Inodes this process has asked to lock through the channel: closing any handle of
    /// one may release its locks, which another process may wait for.
    locked: Mutex<HashSet<u64>>,
    /// Set while the connection's handles are bundled for a fork or an `exec`: closes are
    /// not posted meanwhile (a handle whose close is in flight would go into the bundle).
    frozen: AtomicBool,
}

impl Channel {
    /// Notes that the process asks for locks on inode `ino`, and waits for the closes in
    /// flight (one of them may be of `ino`, and must not release the lock about to be set).
    pub(crate) fn note_locking(&self, ino: u64) {
        let p = self
            .closing
            .posted
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.closing
            .locked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino);
        drop(p);
        self.collect_closes(true);
    }

    /// Whether a close of `handle` is in flight.
    pub(crate) fn closing(&self, handle: u64) -> bool {
        self.closing.count.load(Ordering::Acquire) > 0
            && self
                .closing
                .posted
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|&(_, h)| h == handle)
    }

    /// Closes in flight (their tags are taken, and nobody waits on them).
    pub(crate) fn closes_out(&self) -> u32 {
        self.closing.count.load(Ordering::Relaxed)
    }

    /// Waits for every close in flight and keeps new ones from being posted until
    /// [`Channel::thaw_closes`]: for bundling the connection's handles.
    pub(crate) fn freeze_closes(&self) {
        self.closing.frozen.store(true, Ordering::SeqCst);
        self.collect_closes(true);
    }

    /// Lets closes be posted again after [`Channel::freeze_closes`].
    pub(crate) fn thaw_closes(&self) {
        self.closing.frozen.store(false, Ordering::SeqCst);
    }

    /// Posts `FS_CLOSE` of `handle`, of a file of inode `ino`, and returns without its
    /// answer; false when it may not or cannot (the process asked to lock `ino`, no free tag,
    /// the request goes to the socket, handles are being bundled, or the channel is gone),
    /// and then nothing was sent.
    pub(crate) fn post_close(&self, handle: u64, ino: u64) -> bool {
        if !super::fscall::on_channel_enabled() || self.known_gone() {
            return false;
        }
        // A place among the closes in flight, taken before the tag: so concurrent closers
        // never hold more than [`MAX_POSTED`] tags between them.
        loop {
            if self
                .closing
                .count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < MAX_POSTED).then_some(n + 1)
                })
                .is_ok()
            {
                break;
            }
            self.collect_closes(true);
        }
        let unreserve = || {
            self.closing.count.fetch_sub(1, Ordering::AcqRel);
            false
        };
        let msg = encode_request(0, &Request::Fs(FsRequest::Close { handle }));
        if msg.len() > self.slice_size() {
            return unreserve();
        }
        let Some(tag) = self.try_tag() else {
            return unreserve();
        };
        let mut p = self
            .closing
            .posted
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Under the lock that `note_locking` takes: a lock asked for meanwhile either is
        // seen here or waits for this close.
        let locked = self
            .closing
            .locked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ino);
        if locked || self.closing.frozen.load(Ordering::SeqCst) {
            drop(p);
            self.release(tag);
            return unreserve();
        }
        super::fscall::count_call(&FsRequest::Close { handle });
        super::fscall::POSTED.fetch_add(1, Ordering::Relaxed);
        self.forget(&super::attrs::Key::Handle(handle));
        self.write_dma(tag, 0, &msg);
        let cmd = Command::new(Opcode::Fs, Completion::Dma, 0, msg.len() as u64, 0);
        self.submit(tag, &cmd);
        p.push((tag, handle));
        true
    }

    /// Collects the posted closes that have completed, or all of them (waiting) with `all`.
    /// A close the device referred is made on the socket; any failure is dropped, as the
    /// program was told the close succeeded.
    pub(crate) fn collect_closes(&self, all: bool) {
        if self.closing.count.load(Ordering::Acquire) == 0 {
            return;
        }
        // Taken out under the lock, answered without it: the waits and the socket calls
        // below hold up no other thread's file calls.
        let mine: Vec<(Tag, u64)> = {
            let mut p = self
                .closing
                .posted
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut out = Vec::new();
            let mut i = 0;
            while i < p.len() {
                if all || self.completed(p[i].0) {
                    out.push(p.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            self.closing
                .collecting
                .fetch_add(out.len() as u32, Ordering::AcqRel);
            out
        };
        for (tag, handle) in mine {
            let answered = match self.wait(tag, Completion::Dma) {
                Ok(c) if c.status == Status::Ok => {
                    let len = (c.bytes as usize).min(self.slice_size());
                    let mut buf = vec![0u8; len];
                    self.read_dma(tag, 0, &mut buf);
                    decode_reply(&buf, moneta_abi::fsproto::OP_FS_CLOSE).is_ok()
                }
                _ => false,
            };
            self.release(tag);
            if !answered && !self.known_gone() {
                let _ = self.control().fs(FsRequest::Close { handle });
            }
            self.closing.count.fetch_sub(1, Ordering::AcqRel);
            self.closing.collecting.fetch_sub(1, Ordering::AcqRel);
        }
        // All of them: those another thread took out are finished too.
        while all && self.closing.collecting.load(Ordering::Acquire) > 0 {
            std::thread::yield_now();
        }
    }
}
