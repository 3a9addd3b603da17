//! Closes posted without waiting. A close whose answer changes nothing the program can see
//! need not keep it waiting: its command goes on the channel, and a later file call of the
//! process (or the next close past [`MAX_POSTED`]) collects the completion and frees the
//! tag. Which closes qualify is the caller's to decide (`File::close_soon`): never one that
//! releases locks, since another process may be waiting for them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use moneta_abi::control::{decode_reply, encode_request, Request};
use moneta_abi::fsproto::FsRequest;
use moneta_abi::{Command, Completion, Opcode, Status};

use super::{Channel, Tag};

/// Closes in flight at once on a channel; the next waits for them first.
const MAX_POSTED: usize = 4;

/// The closes posted on a channel, and the inodes its process has locked.
#[derive(Default)]
pub(crate) struct Closing {
    /// (tag, handle) of each close in flight.
    posted: Mutex<Vec<(Tag, u64)>>,
    /// How many there are (read without the lock on every file call).
    count: AtomicUsize,
    /// Inodes this process has asked to lock through the channel: closing any handle of
    /// one may release its locks, which another process may wait for.
    locked: Mutex<HashSet<u64>>,
}

impl Channel {
    /// Notes that the process asks for locks on inode `ino` (see [`Channel::may_post_close`]).
    pub(crate) fn note_locking(&self, ino: u64) {
        let mut l = self
            .closing
            .locked
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        l.insert(ino);
    }

    /// Whether a close of a handle of `ino` may be posted: the process never asked to lock it.
    pub(crate) fn may_post_close(&self, ino: u64) -> bool {
        let l = self
            .closing
            .locked
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        !l.contains(&ino)
    }

    /// Posts `FS_CLOSE` of `handle` and returns without its answer; false when it cannot (no
    /// free tag, the request goes to the socket, or the channel is gone), and then nothing
    /// was sent.
    pub(crate) fn post_close(&self, handle: u64) -> bool {
        if !super::super::fscall::on_channel_enabled() || self.known_gone() {
            return false;
        }
        if self.closing.count.load(Ordering::Acquire) >= MAX_POSTED {
            self.collect_closes(true);
        }
        let msg = encode_request(0, &Request::Fs(FsRequest::Close { handle }));
        if msg.len() > self.slice_size() {
            return false;
        }
        let Some(tag) = self.try_tag() else {
            return false;
        };
        super::super::fscall::count_call(&FsRequest::Close { handle });
        super::super::fscall::POSTED.fetch_add(1, Ordering::Relaxed);
        self.forget(&super::attrs::Key::Handle(handle));
        self.write_dma(tag, 0, &msg);
        let cmd = Command::new(Opcode::Fs, Completion::Dma, 0, msg.len() as u64, 0);
        let mut p = self
            .closing
            .posted
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        self.submit(tag, &cmd);
        p.push((tag, handle));
        self.closing.count.fetch_add(1, Ordering::Release);
        true
    }

    /// Collects the posted closes that have completed, or all of them (waiting) with `all`.
    /// A close the device referred is made on the socket; any failure is dropped, as the
    /// program was told the close succeeded.
    pub(crate) fn collect_closes(&self, all: bool) {
        if self.closing.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut p = self
            .closing
            .posted
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut i = 0;
        while i < p.len() {
            let (tag, handle) = p[i];
            if !all && !self.completed(tag) {
                i += 1;
                continue;
            }
            p.swap_remove(i);
            self.closing.count.fetch_sub(1, Ordering::Release);
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
        }
    }
}
