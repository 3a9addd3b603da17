//! How a request moves along: its commands issued on free tags (or queued with the channel
//! for tags), its completed commands reaped (a read's bytes copied out), and its end, through
//! the synchronous path after a permission miss.

use super::*;

impl<'f> State<'f> {
    pub(super) fn ch(&self) -> &'f Channel {
        self.ch
    }

    /// A request of the parent process seen in a forked child.
    pub(super) fn orphaned(&self) -> bool {
        self.gen != fork::generation()
    }

    /// An in-place read that does not fit one command on one tag becomes an owned one.
    pub(super) fn own_if_in_place_unfit(&mut self) {
        if let Buf::InPlace(n) = self.buf {
            let fits = self.prep.holes.is_empty()
                && self.prep.segs.len() == 1
                && self.prep.segs[0].at == 0;
            if !fits {
                self.buf = Buf::Owned(vec![0u8; n]);
            }
        }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Buf::Owned(v) => v,
            // SAFETY: the submitter promised `ptr` valid for `n` bytes until the request ends.
            Buf::Raw(ptr, n) => unsafe { std::slice::from_raw_parts_mut(*ptr, *n) },
            Buf::InPlace(_) => &mut [],
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match &self.buf {
            Buf::Owned(v) => v,
            // SAFETY: as in `bytes_mut`.
            Buf::Raw(ptr, n) => unsafe { std::slice::from_raw_parts(*ptr, *n) },
            Buf::InPlace(_) => &[],
        }
    }

    pub(super) fn stopped(&self) -> bool {
        self.err.is_some() || self.miss.is_some()
    }

    /// Tags this request holds now.
    pub(super) fn holding(&self) -> usize {
        self.inflight.len() + self.held.is_some() as usize
    }

    /// Puts commands on free tags (without ringing: the caller rings `bits`).
    pub(super) fn issue(&mut self, bits: &mut u64) {
        self.issue_from(None, bits);
    }

    /// [`State::issue`], the first command on `first` when given (a tag the caller waited
    /// for; released if nothing is left to issue).
    pub(super) fn issue_from(&mut self, mut first: Option<Tag>, bits: &mut u64) {
        let ch = self.ch();
        let opcode = if self.write {
            Opcode::Write
        } else {
            Opcode::Read
        };
        while self.next < self.prep.segs.len()
            && !self.stopped()
            && self.inflight.len() < TAGS_PER_REQUEST
        {
            let Some(tag) = first.take().or_else(|| ch.try_tag()) else {
                break;
            };
            let seg = self.prep.segs[self.next];
            if self.write {
                ch.write_dma(tag, 0, &self.bytes()[seg.at..seg.at + seg.len]);
            }
            ch.prepare(
                tag,
                &command(opcode, self.mode, seg.dev, seg.len as u64, seg.file),
            );
            *bits |= 1u64 << tag.0;
            if let Some(t) = self.ticket {
                ch.reapers.own(tag, t);
            }
            self.inflight.push_back((tag, self.next));
            self.next += 1;
        }
        if let Some(t) = first {
            ch.release(t);
        }
        self.want_tags();
    }

    /// No longer counted by the channel as waiting for tags (the request ended).
    pub(super) fn unbacklog(&mut self) {
        if self.backlogged {
            self.backlogged = false;
            self.ch.reapers.backlog(false);
        }
    }

    /// Queues the request with its channel for tags if it has commands that found none, and
    /// keeps the channel's count of such requests.
    pub(super) fn want_tags(&mut self) {
        let Some(t) = self.ticket else { return };
        let wants = self.next < self.prep.segs.len()
            && !self.stopped()
            && self.inflight.len() < TAGS_PER_REQUEST
            && !self.orphaned();
        if wants != self.backlogged {
            self.backlogged = wants;
            self.ch.reapers.backlog(wants);
        }
        if wants && !self.wanting {
            self.wanting = true;
            self.ch.reapers.want(t, self.again);
        }
    }

    /// Takes completed commands off the front, waiting for the first when `block` (only the
    /// first: the caller issues the next command on its tag while the others complete).
    pub(super) fn reap(&mut self, mut block: bool) {
        let ch = self.ch();
        while let Some(&(tag, i)) = self.inflight.front() {
            let c = if block {
                block = false;
                Some(ch.wait(tag, self.mode))
            } else {
                ch.poll(tag, self.mode).map(Ok)
            };
            let Some(c) = c else { break };
            self.inflight.pop_front();
            let seg = self.prep.segs[i];
            let mut keep = false;
            match c {
                Ok(c) => match c.status {
                    Status::Ok => {
                        if !self.write {
                            if matches!(self.buf, Buf::InPlace(_)) {
                                keep = true;
                            } else {
                                let dst = &mut self.bytes_mut()[seg.at..seg.at + seg.len];
                                ch.read_dma(tag, 0, dst);
                            }
                        }
                    }
                    Status::PermissionMiss => {
                        self.miss = Some(self.miss.map_or(seg.at, |m| m.min(seg.at)));
                    }
                    Status::PermissionDenied => {
                        self.err
                            .get_or_insert(ClientError::Io(std::io::Error::from_raw_os_error(
                                libc::EBADF,
                            )));
                    }
                    s => {
                        self.err.get_or_insert(ClientError::Status(s));
                    }
                },
                Err(e) => {
                    self.err.get_or_insert(e);
                }
            }
            if keep {
                ch.reapers.disown(tag);
                self.held = Some(tag);
            } else {
                ch.release(tag);
            }
        }
    }

    /// Moves the request along; returns whether it has ended. Never blocks unless `block`.
    pub(super) fn progress(&mut self, block: bool) -> bool {
        if self.ended {
            return true;
        }
        if self.orphaned() {
            // POSIX: a child does not inherit its parent's asynchronous requests.
            self.inflight.clear();
            self.held = None;
            self.result = Some(Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::ECANCELED,
            ))));
            self.ended = true;
            return true;
        }
        let mut waited: Option<Tag> = None;
        loop {
            let mut bits = 0u64;
            self.issue_from(waited.take(), &mut bits);
            if bits != 0 {
                self.ch().ring(bits);
            }
            let issued = bits != 0;
            self.reap(block && !self.inflight.is_empty());
            let all_out = self.next == self.prep.segs.len() || self.stopped();
            if self.inflight.is_empty() && all_out {
                self.finish();
                return true;
            }
            if !block {
                return false;
            }
            if !issued && self.inflight.is_empty() {
                // No free tag: wait for one (moving the channel's other requests along, whose
                // completed commands hold some).
                waited = Some(self.ch.tag());
            }
        }
    }

    pub(super) fn finish(&mut self) {
        self.unbacklog();
        let r = if let Some(e) = self.err.take() {
            Err(e)
        } else if let Some(m) = self.miss {
            self.finish_after_miss(m)
        } else {
            Ok(self.prep.len)
        };
        if let Ok(n) = r {
            self.moved = n;
        }
        self.result = Some(r);
        self.ended = true;
    }

    /// A hard miss: the bytes from `m` on go through the synchronous path, which looks up
    /// again and retries.
    pub(super) fn finish_after_miss(&mut self, m: usize) -> Result<usize, ClientError> {
        if let Some(t) = self.held.take() {
            self.ch().release(t);
        }
        if let Buf::InPlace(n) = self.buf {
            self.buf = Buf::Owned(vec![0u8; n]);
            return self.finish_after_miss(0);
        }
        let (off, mode, len) = (self.off + m as u64, self.mode, self.prep.len);
        self.file.forget_at(off);
        if self.write {
            let data = self.bytes()[m..len].to_vec();
            self.file.write_exact_at_with(&data, off, mode)?;
            Ok(len)
        } else {
            let file = self.file;
            let dst = &mut self.bytes_mut()[m..len];
            let mut done = 0;
            while done < dst.len() {
                match file.read_at_with(&mut dst[done..], off + done as u64, mode)? {
                    0 => break,
                    n => done += n,
                }
            }
            Ok(m + done)
        }
    }
}
