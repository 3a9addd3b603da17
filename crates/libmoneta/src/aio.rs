//! Asynchronous reads and writes (Moneta-D §4.2, §5.4).
//!
//! A submitted request is mapped at once (a soft miss, an extend for a write past the end, go
//! to the manager before the call returns), then its device commands go out on as many free tags
//! as there are, and the call returns a [`Pending`] without waiting for the device. Commands
//! that found no free tag go out as earlier ones complete, whenever the request is polled or
//! waited for. A request ends with the bytes moved or an error; a hard miss on the way is
//! retried synchronously when the request is reaped, as in the synchronous calls.
//!
//! ```no_run
//! use libmoneta::{Moneta, OpenOptions};
//! use libmoneta::aio::{wait_all, Pending};
//!
//! let m = Moneta::connect_default()?;
//! let f = m.open("/data", OpenOptions::new().read(true))?;
//! let mut reqs: Vec<Pending<'_>> = (0..32u64)
//!     .map(|i| f.submit_read(vec![0u8; 512], i * 4096))
//!     .collect::<Result<_, _>>()?;
//! wait_all(&mut reqs);
//! for r in &mut reqs {
//!     let n = r.wait()?;
//!     assert!(n <= 512);
//! }
//! # Ok::<(), libmoneta::ClientError>(())
//! ```

use std::collections::VecDeque;
use std::time::Duration;

use moneta_abi::{Completion, Opcode, Status};

use crate::channel::{command, Channel, Tag};
use crate::file::{File, Prepared};
use crate::{fork, ClientError};

enum Buf {
    Owned(Vec<u8>),
    /// A caller's buffer that stays valid until the request ends (C callers).
    Raw(*mut u8, usize),
    /// The request's own DMA slice: the tag stays held until the request is dropped.
    InPlace(usize),
}

/// An asynchronous request in flight (or ended, until its result is taken and it is dropped).
///
/// Dropping a request that has not ended waits for its commands (their tags cannot be reused
/// before the device is done with them).
pub struct Pending<'f> {
    file: &'f File,
    /// The channel the commands went to, and the fork generation it belongs to: in a forked
    /// child, a request of the parent ends with `ECANCELED` without touching its tags.
    ch: &'f Channel,
    gen: u64,
    write: bool,
    off: u64,
    buf: Buf,
    mode: Completion,
    prep: Prepared,
    next: usize,
    inflight: VecDeque<(Tag, usize)>,
    /// Earliest buffer offset whose command met a permission miss.
    miss: Option<usize>,
    err: Option<ClientError>,
    result: Option<Result<usize, ClientError>>,
    /// The tag whose DMA slice holds an in-place request's data.
    held: Option<Tag>,
    /// Bytes moved, once ended well.
    moved: usize,
    /// Ended (the result may have been taken since).
    ended: bool,
}

impl File {
    /// Submits a read of `buf.len()` bytes at `off` into an owned buffer; get it back with
    /// [`Pending::into_buffer`] once the request ended.
    pub fn submit_read(&self, buf: Vec<u8>, off: u64) -> Result<Pending<'_>, ClientError> {
        let mode = self.policy().mode(buf.len());
        self.submit(false, Some(off), Buf::Owned(buf), mode, &mut 0)
    }

    /// Submits a write of `data` at `off` (at the end on a file opened for appending).
    pub fn submit_write(&self, data: Vec<u8>, off: u64) -> Result<Pending<'_>, ClientError> {
        let mode = self.policy().mode(data.len());
        self.submit(true, self.write_offset(off), Buf::Owned(data), mode, &mut 0)
    }

    /// Submits a read into caller memory.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for writes of `len` bytes, and not otherwise accessed, until the
    /// request has ended (its result taken) or been dropped.
    pub unsafe fn submit_read_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        off: u64,
        mode: Option<Completion>,
    ) -> Result<Pending<'_>, ClientError> {
        let mode = mode.unwrap_or_else(|| self.policy().mode(len));
        self.submit(false, Some(off), Buf::Raw(ptr, len), mode, &mut 0)
    }

    /// Submits a write from caller memory.
    ///
    /// # Safety
    ///
    /// `ptr` must be valid for reads of `len` bytes, and not modified, until the request has
    /// ended or been dropped.
    pub unsafe fn submit_write_raw(
        &self,
        ptr: *const u8,
        len: usize,
        off: u64,
        mode: Option<Completion>,
    ) -> Result<Pending<'_>, ClientError> {
        let mode = mode.unwrap_or_else(|| self.policy().mode(len));
        self.submit(
            true,
            self.write_offset(off),
            Buf::Raw(ptr as *mut u8, len),
            mode,
            &mut 0,
        )
    }

    /// Submits a zero-copy read of at most one DMA slice: the device leaves the bytes in the
    /// request's slice, where [`Pending::data`] shows them, without a copy. (A range that spans
    /// two extents or a hole is read into a private buffer instead, transparently.)
    pub fn submit_read_in_place(&self, off: u64, len: usize) -> Result<Pending<'_>, ClientError> {
        self.h()?;
        if len > self.channel().slice_size() {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        let mode = self.policy().mode(len);
        self.submit(false, Some(off), Buf::InPlace(len), mode, &mut 0)
    }

    /// A DMA slice to fill in place for a zero-copy write of `len` bytes (at most one slice);
    /// [`WriteSlot::submit`] sends it.
    pub fn write_slot(&self, len: usize) -> Result<WriteSlot<'_>, ClientError> {
        self.h()?;
        if len > self.channel().slice_size() {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        self.check_access(true)?;
        let ch = self.channel();
        Ok(WriteSlot {
            file: self,
            ch,
            gen: fork::generation(),
            tag: Some(ch.tag()),
            len,
        })
    }

    /// Submits several requests and rings the doorbell once for all of their first commands.
    /// Each element is `(write, buffer, offset)`; results come back in the same order.
    pub fn submit_batch(
        &self,
        ops: Vec<(bool, Vec<u8>, u64)>,
    ) -> Vec<Result<Pending<'_>, ClientError>> {
        let mut bits = 0u64;
        let out: Vec<_> = ops
            .into_iter()
            .map(|(write, buf, off)| {
                let mode = self.policy().mode(buf.len());
                let off = if write {
                    self.write_offset(off)
                } else {
                    Some(off)
                };
                self.submit(write, off, Buf::Owned(buf), mode, &mut bits)
            })
            .collect();
        if bits != 0 {
            self.channel().ring(bits);
        }
        out
    }

    /// Maps the request and issues what it can. With `bits` non-zero on entry the caller rings
    /// the doorbell (a batch); otherwise this does.
    fn submit(
        &self,
        write: bool,
        off: Option<u64>,
        buf: Buf,
        mode: Completion,
        bits: &mut u64,
    ) -> Result<Pending<'_>, ClientError> {
        self.check_access(write)?;
        self.h()?;
        let len = match buf {
            Buf::Owned(ref v) => v.len(),
            Buf::Raw(_, n) | Buf::InPlace(n) => n,
        };
        let mut fruitless = 0;
        let off = match off {
            None => self.append_at(len as u64)?,
            Some(off) => {
                self.check_range(off, len as u64, write)?;
                off
            }
        };
        let prep = if len == 0 {
            Prepared::default()
        } else if write {
            self.prepare_write(off, len, &mut fruitless)?
        } else {
            self.prepare_read(off, len, &mut fruitless)?
        };
        let mut p = Pending {
            file: self,
            ch: self.channel(),
            gen: fork::generation(),
            write,
            off,
            buf,
            mode,
            prep,
            next: 0,
            inflight: VecDeque::new(),
            miss: None,
            err: None,
            result: None,
            held: None,
            moved: 0,
            ended: false,
        };
        p.own_if_in_place_unfit();
        let holes = std::mem::take(&mut p.prep.holes);
        {
            let data = p.bytes_mut();
            for &(h, n) in &holes {
                data[h..h + n].fill(0);
            }
        }
        let batch = *bits != 0;
        let mut mine = 0u64;
        p.issue(&mut mine);
        *bits |= mine;
        if !batch && *bits != 0 {
            self.channel().ring(std::mem::take(bits));
        }
        Ok(p)
    }
}

impl<'f> Pending<'f> {
    fn ch(&self) -> &'f Channel {
        self.ch
    }

    /// A request of the parent process seen in a forked child.
    fn orphaned(&self) -> bool {
        self.gen != fork::generation()
    }

    /// An in-place read that does not fit one command on one tag becomes an owned one.
    fn own_if_in_place_unfit(&mut self) {
        if let Buf::InPlace(n) = self.buf {
            let fits = self.prep.holes.is_empty()
                && self.prep.segs.len() == 1
                && self.prep.segs[0].at == 0;
            if !fits {
                self.buf = Buf::Owned(vec![0u8; n]);
            }
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Buf::Owned(v) => v,
            // SAFETY: the submitter promised `ptr` valid for `n` bytes until the request ends.
            Buf::Raw(ptr, n) => unsafe { std::slice::from_raw_parts_mut(*ptr, *n) },
            Buf::InPlace(_) => &mut [],
        }
    }

    fn bytes(&self) -> &[u8] {
        match &self.buf {
            Buf::Owned(v) => v,
            // SAFETY: as in `bytes_mut`.
            Buf::Raw(ptr, n) => unsafe { std::slice::from_raw_parts(*ptr, *n) },
            Buf::InPlace(_) => &[],
        }
    }

    fn stopped(&self) -> bool {
        self.err.is_some() || self.miss.is_some()
    }

    /// Puts commands on free tags (without ringing: the caller rings `bits`).
    fn issue(&mut self, bits: &mut u64) {
        let ch = self.ch();
        let opcode = if self.write {
            Opcode::Write
        } else {
            Opcode::Read
        };
        while self.next < self.prep.segs.len() && !self.stopped() {
            let Some(tag) = ch.try_tag() else { break };
            let seg = self.prep.segs[self.next];
            if self.write {
                ch.write_dma(tag, 0, &self.bytes()[seg.at..seg.at + seg.len]);
            }
            ch.prepare(tag, &command(opcode, self.mode, seg.dev, seg.len as u64));
            *bits |= 1u64 << tag.0;
            self.inflight.push_back((tag, self.next));
            self.next += 1;
        }
    }

    /// Takes completed commands off the front, waiting for the first when `block`.
    fn reap(&mut self, block: bool) {
        let ch = self.ch();
        while let Some(&(tag, i)) = self.inflight.front() {
            let c = if block {
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
                self.held = Some(tag);
            } else {
                ch.release(tag);
            }
        }
    }

    /// Moves the request along; returns whether it has ended. Never blocks unless `block`.
    fn progress(&mut self, block: bool) -> bool {
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
        loop {
            let mut bits = 0u64;
            self.issue(&mut bits);
            if bits != 0 {
                self.ch().ring(bits);
            }
            self.reap(block && !self.inflight.is_empty());
            let all_out = self.next == self.prep.segs.len() || self.stopped();
            if self.inflight.is_empty() && all_out {
                self.finish();
                return true;
            }
            if !block {
                return false;
            }
            if self.inflight.is_empty() {
                // Every tag is taken by other requests: wait for one to come back.
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    fn finish(&mut self) {
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
    fn finish_after_miss(&mut self, m: usize) -> Result<usize, ClientError> {
        if let Some(t) = self.held.take() {
            self.ch().release(t);
        }
        if let Buf::InPlace(n) = self.buf {
            self.buf = Buf::Owned(vec![0u8; n]);
            return self.finish_after_miss(0);
        }
        self.file.forget_map();
        let (off, mode, len) = (self.off + m as u64, self.mode, self.prep.len);
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

    /// Whether the request has ended, moving it along without blocking.
    pub fn poll(&mut self) -> bool {
        self.progress(false)
    }

    /// Waits for the request to end; the bytes moved (a read may be short at the end of the
    /// file) or the error. The result can be taken once; later calls answer `EINVAL`.
    pub fn wait(&mut self) -> Result<usize, ClientError> {
        self.progress(true);
        self.result.take().unwrap_or_else(|| {
            Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::EINVAL,
            )))
        })
    }

    /// Whether the request has ended and its result has not been taken.
    pub fn is_done(&self) -> bool {
        self.result.is_some()
    }

    /// Bytes moved by a request that ended well (0 before, or after an error).
    pub fn moved(&self) -> usize {
        self.moved
    }

    /// The bytes of an ended read: the DMA slice itself for an in-place read, else the owned
    /// buffer (empty for a caller's raw buffer).
    pub fn data(&self) -> &[u8] {
        let n = self.moved;
        match (&self.buf, self.held) {
            (Buf::InPlace(_), Some(tag)) => self.ch().dma_slice(tag, n),
            (Buf::Owned(v), _) => &v[..n.min(v.len())],
            _ => &[],
        }
    }

    /// The owned buffer back, once the request ended (waits for it otherwise).
    pub fn into_buffer(mut self) -> Vec<u8> {
        self.progress(true);
        match std::mem::replace(&mut self.buf, Buf::Owned(Vec::new())) {
            Buf::Owned(v) => v,
            _ => Vec::new(),
        }
    }
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("write", &self.write)
            .field("off", &self.off)
            .field("len", &self.prep.len)
            .field("in_flight", &self.inflight.len())
            .field("done", &self.result.is_some())
            .finish()
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.orphaned() {
            return;
        }
        // Stop issuing and let the device finish what it has.
        self.next = self.prep.segs.len();
        let ch = self.ch();
        while let Some((tag, _)) = self.inflight.pop_front() {
            let _ = ch.wait(tag, self.mode);
            ch.release(tag);
        }
        if let Some(t) = self.held.take() {
            ch.release(t);
        }
    }
}

/// A DMA slice being filled for a zero-copy write.
pub struct WriteSlot<'f> {
    file: &'f File,
    ch: &'f Channel,
    gen: u64,
    tag: Option<Tag>,
    len: usize,
}

impl<'f> WriteSlot<'f> {
    /// The slice to fill.
    pub fn buf(&mut self) -> &mut [u8] {
        let tag = self.tag.expect("slot holds its tag until submitted");
        self.ch.dma_slice_mut(tag, self.len)
    }

    /// Sends the slice's bytes to `off` (the end on a file opened for appending). When the
    /// range maps to one command, the device takes the bytes straight from the slice.
    pub fn submit(mut self, off: u64) -> Result<Pending<'f>, ClientError> {
        let f = self.file;
        let tag = self.tag.take().expect("slot holds its tag until submitted");
        let len = self.len;
        let ch = self.ch;
        if self.gen != fork::generation() {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::ECANCELED,
            )));
        }
        let mode = f.policy().mode(len);
        let r = (|| {
            let off = if f.appends() {
                f.append_at(len as u64)?
            } else {
                f.check_range(off, len as u64, true)?;
                off
            };
            let prep = f.prepare_write(off, len, &mut 0)?;
            Ok::<_, ClientError>((off, prep))
        })();
        let (off, prep) = match r {
            Ok(x) => x,
            Err(e) => {
                ch.release(tag);
                return Err(e);
            }
        };
        if prep.segs.len() == 1 {
            let seg = prep.segs[0];
            ch.submit(tag, &command(Opcode::Write, mode, seg.dev, seg.len as u64));
            let mut inflight = VecDeque::new();
            inflight.push_back((tag, 0));
            return Ok(Pending {
                file: f,
                ch,
                gen: self.gen,
                write: true,
                off,
                buf: Buf::Owned(Vec::new()),
                mode,
                prep,
                next: 1,
                inflight,
                miss: None,
                err: None,
                result: None,
                held: None,
                moved: 0,
                ended: false,
            });
        }
        // Spans extents: the bytes leave the slice for an ordinary request.
        let data = ch.dma_slice(tag, len).to_vec();
        ch.release(tag);
        f.submit(true, Some(off), Buf::Owned(data), mode, &mut 0)
    }
}

impl Drop for WriteSlot<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.tag.take() {
            if self.gen == fork::generation() {
                self.ch.release(t);
            }
        }
    }
}

/// Waits until one of `reqs` has ended; returns its index (the first ended one, so take its
/// result, or remove it, before asking again).
pub fn wait_any(reqs: &mut [Pending<'_>]) -> Option<usize> {
    if reqs.is_empty() {
        return None;
    }
    let mut rounds = 0u32;
    loop {
        for (i, r) in reqs.iter_mut().enumerate() {
            if r.progress(false) {
                return Some(i);
            }
        }
        rounds += 1;
        if rounds < 2000 {
            std::hint::spin_loop();
        } else if rounds < 2100 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// Waits until every request in `reqs` has ended.
pub fn wait_all(reqs: &mut [Pending<'_>]) {
    for r in reqs.iter_mut() {
        r.progress(true);
    }
}
