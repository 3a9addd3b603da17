//! Asynchronous reads and writes (Moneta-D §4.2, §5.4).
//!
//! A submitted request is mapped at once (a soft miss, an extend for a write past the end, go
//! to the manager before the call returns), then its device commands go out on free tags, and
//! the call returns a [`Pending`] without waiting for the device. Commands that found no tag go
//! out as earlier ones complete, whenever the request is polled or waited for. A request ends
//! with the bytes moved or an error; a hard miss on the way is retried synchronously when the
//! request is reaped, as in the synchronous calls.
//!
//! Tags: a request keeps up to [`TAGS_PER_REQUEST`] commands in flight, each on a tag of the
//! channel, and a read's tag stays taken until its bytes are copied out of the DMA slice, which
//! happens when the request is polled, waited for or dropped. So that requests the application
//! has not reaped yet never starve the others, a caller that finds no free tag first moves
//! along the requests of the channel that hold a completed command and that nobody is using
//! at that moment (`channel/reapers.rs`): their completed commands are copied out into their
//! buffers and their tags come back. Each request's state
//! carries a busy flag taken by whoever works on it. Zero-copy requests keep their tag until
//! they are dropped; at most [`MAX_PINNED_TAGS`] of the channel's tags may be held that way
//! (`EAGAIN` beyond).
//!
//! ```
//! # let _daemon = monetad::testing::Daemon::start();
//! use libmoneta::{Moneta, OpenOptions};
//! use libmoneta::aio::{wait_all, Pending};
//!
//! let m = Moneta::connect_default()?;
//! let f = m.open("/data", OpenOptions::new().read(true).write(true).create(true))?;
//! f.set_len(32 * 4096)?;
//! let mut reqs: Vec<Pending<'_>> = (0..32u64)
//!     .map(|i| f.submit_read(vec![0u8; 512], i * 4096))
//!     .collect::<Result<_, _>>()?;
//! wait_all(&mut reqs);
//! for r in &mut reqs {
//!     assert_eq!(r.wait()?, 512); // holes read as zeros
//! }
//!
//! // Zero-copy: fill the DMA slice in place, then read the bytes where the device left them.
//! let mut slot = f.write_slot(8)?;
//! slot.buf().copy_from_slice(b"in place");
//! assert_eq!(slot.submit(0)?.wait()?, 8);
//! let mut r = f.submit_read_in_place(0, 8)?;
//! r.wait()?;
//! assert_eq!(r.data(), b"in place");
//! # Ok::<(), libmoneta::ClientError>(())
//! ```

use std::cell::RefCell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Duration;

use moneta_abi::{Completion, Opcode, Status};

use crate::channel::reapers::{Reaper, Ticket};
use crate::channel::{command, Channel, Tag};
use crate::file::{File, Prepared};
use crate::{fork, ClientError};

mod busy;
mod progress;
mod slot;

use busy::Busy;
pub use slot::WriteSlot;

/// Most commands one asynchronous request keeps in flight.
pub const TAGS_PER_REQUEST: usize = 16;
/// Most tags held at once by zero-copy requests and write slots of one channel.
pub const MAX_PINNED_TAGS: usize = 32;

/// [`Reaper::claim`] for a request's state: takes its busy flag if free.
///
/// # Safety
///
/// `p` is a registered state (alive: its owner unregisters it before freeing it).
unsafe fn claim(p: NonNull<()>) -> bool {
    // SAFETY: alive, as the caller promised. Only the flag is referred to (an atomic): its
    // holder may hold the rest of the state mutably meanwhile.
    let busy = unsafe { &*std::ptr::addr_of!((*p.cast::<State<'static>>().as_ptr()).busy) };
    busy.try_take()
}

/// [`Reaper::advance`] for a request's state: reaps its completed commands (issuing more on
/// free tags), then gives its busy flag back. Returns whether it holds fewer tags.
///
/// # Safety
///
/// The caller claimed `p` (holds its busy flag).
unsafe fn advance(p: NonNull<()>, dequeued: bool) -> bool {
    // SAFETY: we hold its busy flag, which its owner takes before freeing it.
    let st = unsafe { &mut *p.cast::<State<'static>>().as_ptr() };
    let mut freed = false;
    // An ended request is left as it is: its owner reads it without the flag (`data`). (Its
    // place in the queue, if this was it, is gone, and it never asks for tags again.)
    if !st.ended && !st.orphaned() {
        if dequeued {
            st.wanting = false;
            st.again = true;
        }
        let before = st.holding();
        st.progress(false);
        freed = st.holding() < before;
        st.again = false;
    }
    st.busy.give();
    freed
}

/// A request's allocation and vectors, kept by a thread for its next request: a submitted
/// request then allocates nothing.
struct Spare {
    slot: Option<Box<MaybeUninit<State<'static>>>>,
    prep: Prepared,
    inflight: VecDeque<(Tag, usize)>,
}

/// Spares a thread keeps.
const SPARES_KEPT: usize = 64;

thread_local! {
    static SPARES: RefCell<Vec<Spare>> = const { RefCell::new(Vec::new()) };
}

fn spare() -> Spare {
    SPARES
        .try_with(|s| s.borrow_mut().pop())
        .ok()
        .flatten()
        .unwrap_or_else(|| Spare {
            slot: None,
            prep: Prepared::default(),
            inflight: VecDeque::new(),
        })
}

fn keep(mut sp: Spare) {
    sp.prep.segs.clear();
    sp.prep.holes.clear();
    sp.inflight.clear();
    let _ = SPARES.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARES_KEPT {
            s.push(sp);
        }
    });
}

fn take_pinned(ch: &Channel) -> Result<(), ClientError> {
    let mut cur = ch.pinned.load(Ordering::Relaxed);
    loop {
        if cur >= MAX_PINNED_TAGS {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::EAGAIN,
            )));
        }
        match ch
            .pinned
            .compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed)
        {
            Ok(_) => return Ok(()),
            Err(now) => cur = now,
        }
    }
}

fn give_pinned(ch: &Channel) {
    ch.pinned.fetch_sub(1, Ordering::AcqRel);
}

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
    st: NonNull<State<'f>>,
    ticket: Ticket,
    _borrows: PhantomData<&'f File>,
}

struct State<'f> {
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
    /// An in-place request counts against [`MAX_PINNED_TAGS`].
    pinned: bool,
    /// Bytes moved, once ended well.
    moved: usize,
    /// Ended (the result may have been taken since).
    ended: bool,
    /// The number the channel knows the request by, once registered.
    ticket: Option<Ticket>,
    /// Queued with the channel for tags ([`crate::channel::reapers::Reapers::want`]).
    wanting: bool,
    /// Counted by the channel as having commands that wait for a tag.
    backlogged: bool,
    /// Being moved along after it was taken off the queue for tags: if it still wants tags
    /// it goes back to the queue's front.
    again: bool,
    /// Taken by whoever uses the state: its request's calls, or a thread that reaps it while
    /// waiting for a tag ([`Channel::reap_others`]).
    busy: Busy,
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
    /// two extents or a hole is read into a private buffer instead, transparently.) The slice's
    /// tag stays taken until the request is dropped; `EAGAIN` when [`MAX_PINNED_TAGS`] are.
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
        // Asynchronous requests do not post: what this file posted lands before them.
        if write {
            self.settle_reporting()?;
        } else {
            self.settle()?;
        }
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
        let mut sp = spare();
        let r = if len == 0 {
            sp.prep.len = 0;
            Ok(())
        } else if write {
            self.prepare_write_into(off, len, &mut fruitless, &mut sp.prep)
        } else {
            self.prepare_read_into(off, len, &mut fruitless, &mut sp.prep)
        };
        if let Err(e) = r {
            keep(sp);
            return Err(e);
        }
        let ch = self.channel();
        let slot = sp.slot.take();
        let mut st = State::new(self, ch, fork::generation(), write, off, buf, mode);
        st.prep = std::mem::take(&mut sp.prep);
        st.inflight = std::mem::take(&mut sp.inflight);
        st.own_if_in_place_unfit();
        if matches!(st.buf, Buf::InPlace(_)) {
            take_pinned(ch)?;
            st.pinned = true;
        }
        for i in 0..st.prep.holes.len() {
            let (h, n) = st.prep.holes[i];
            st.bytes_mut()[h..h + n].fill(0);
        }
        let batch = *bits != 0;
        let mut mine = 0u64;
        st.issue(&mut mine);
        *bits |= mine;
        if !batch && *bits != 0 {
            ch.ring(std::mem::take(bits));
        }
        Ok(Pending::new(st, slot))
    }
}

impl<'f> State<'f> {
    /// A request not yet planned: nothing prepared, nothing in flight, nothing queued.
    fn new(
        file: &'f File,
        ch: &'f Channel,
        gen: u64,
        write: bool,
        off: u64,
        buf: Buf,
        mode: Completion,
    ) -> State<'f> {
        State {
            file,
            ch,
            gen,
            write,
            off,
            buf,
            mode,
            prep: Prepared::default(),
            next: 0,
            inflight: VecDeque::new(),
            miss: None,
            err: None,
            result: None,
            held: None,
            pinned: false,
            moved: 0,
            ended: false,
            ticket: None,
            wanting: false,
            backlogged: false,
            again: false,
            busy: Busy::new(),
        }
    }
}

impl<'f> Pending<'f> {
    fn new(st: State<'f>, slot: Option<Box<MaybeUninit<State<'static>>>>) -> Pending<'f> {
        let ch = st.ch;
        let slot = slot.unwrap_or_else(|| Box::new(MaybeUninit::uninit()));
        // A state's layout does not depend on its lifetime.
        let raw = Box::into_raw(slot).cast::<State<'f>>();
        // SAFETY: `raw` is a fresh, exclusive allocation of the right size and alignment.
        unsafe { raw.write(st) };
        let st = NonNull::new(raw).expect("boxes are non-null");
        // Held while the ticket is written, so no reaping thread sees the state without it.
        // SAFETY: fresh; nobody else can reach it yet.
        let fresh = unsafe { st.as_ref() }.busy.try_take();
        debug_assert!(fresh);
        let ticket = ch.reapers.register(Reaper {
            state: st.cast(),
            claim,
            advance,
        });
        // SAFETY: we hold its busy flag.
        let s = unsafe { &mut *st.as_ptr() };
        s.ticket = Some(ticket);
        for &(tag, _) in &s.inflight {
            ch.reapers.own(tag, ticket);
        }
        s.want_tags();
        s.busy.give();
        Pending {
            st,
            ticket,
            _borrows: PhantomData,
        }
    }

    fn busy(&self) -> &Busy {
        // SAFETY: the state lives as long as `self`; the flag is an atomic.
        unsafe { &self.st.as_ref().busy }
    }

    /// Takes the state's busy flag (a thread reaping it holds it only while it reaps).
    fn acquire(&self) {
        self.busy().take();
    }

    /// Runs `f` on the state with its busy flag held.
    fn with<R>(&mut self, f: impl FnOnce(&mut State<'f>) -> R) -> R {
        self.acquire();
        // SAFETY: the busy flag makes this the only reference to the state while `f` runs.
        let r = f(unsafe { &mut *self.st.as_ptr() });
        self.busy().give();
        r
    }

    /// Reads the state with its busy flag held.
    fn look<R>(&self, f: impl FnOnce(&State<'f>) -> R) -> R {
        self.acquire();
        // SAFETY: as in `with`.
        let r = f(unsafe { self.st.as_ref() });
        self.busy().give();
        r
    }

    /// Whether the request has ended, moving it along without blocking.
    pub fn poll(&mut self) -> bool {
        self.with(|s| s.progress(false))
    }

    /// Waits for the request to end; the bytes moved (a read may be short at the end of the
    /// file) or the error. The result can be taken once; later calls answer `EINVAL`.
    pub fn wait(&mut self) -> Result<usize, ClientError> {
        self.with(|s| {
            s.progress(true);
            s.result.take().unwrap_or_else(|| {
                Err(ClientError::Io(std::io::Error::from_raw_os_error(
                    libc::EINVAL,
                )))
            })
        })
    }

    /// Whether the request has ended and its result has not been taken.
    pub fn is_done(&self) -> bool {
        self.look(|s| s.result.is_some())
    }

    /// Bytes moved by a request that ended well (0 before, or after an error).
    pub fn moved(&self) -> usize {
        self.look(|s| s.moved)
    }

    /// The bytes of an ended read: the DMA slice itself for an in-place read, else the owned
    /// buffer (empty for a caller's raw buffer).
    pub fn data(&self) -> &[u8] {
        let (ended, n, held, owned, ch) = self.look(|s| {
            let owned = match &s.buf {
                Buf::Owned(v) => Some((v.as_ptr(), v.len())),
                _ => None,
            };
            (s.ended, s.moved, s.held, owned, s.ch)
        });
        if !ended {
            return &[];
        }
        match (held, owned) {
            (Some(tag), None) => ch.dma_slice(tag, n),
            // SAFETY: the state lives as long as `self`, and an ended request changes only
            // through `&mut self` calls (a reaping thread leaves it as it is): the owned buffer
            // does not change while `self` is borrowed.
            (_, Some((p, len))) => unsafe { std::slice::from_raw_parts(p, n.min(len)) },
            _ => &[],
        }
    }

    /// The owned buffer back, once the request ended (waits for it otherwise).
    pub fn into_buffer(mut self) -> Vec<u8> {
        self.with(|s| {
            s.progress(true);
            match std::mem::replace(&mut s.buf, Buf::Owned(Vec::new())) {
                Buf::Owned(v) => v,
                _ => Vec::new(),
            }
        })
    }
}

impl std::fmt::Debug for Pending<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.look(|s| {
            f.debug_struct("Pending")
                .field("write", &s.write)
                .field("off", &s.off)
                .field("len", &s.prep.len)
                .field("in_flight", &s.inflight.len())
                .field("done", &s.result.is_some())
                .finish()
        })
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        // SAFETY: the state lives until freed below.
        let p = self.st.as_ptr();
        // SAFETY: the state lives until freed below.
        let (ch, orphaned) = unsafe { ((*p).ch, (*p).orphaned()) };
        if !orphaned {
            // A thread that claimed it lets go when done; one that tries after this fails.
            self.acquire();
            // SAFETY: with its busy flag held, nobody else touches it, and once out of the
            // registry nobody reaches it.
            let st = unsafe { &mut *p };
            ch.reapers.unregister(self.ticket);
            st.unbacklog();
            // Stop issuing and let the device finish what it has.
            st.next = st.prep.segs.len();
            while let Some((tag, _)) = st.inflight.pop_front() {
                let _ = ch.wait(tag, st.mode);
                ch.release(tag);
            }
            if let Some(t) = st.held.take() {
                ch.release(t);
            }
            if st.pinned {
                give_pinned(ch);
            }
        }
        // (A forked child's copy of its parent's request touches neither the parent's channel,
        // inert here, nor its registry.)
        // SAFETY: allocated in `Pending::new` and reached by nobody else now; its contents are
        // dropped once, then the allocation is kept for the next request.
        unsafe {
            let sp = Spare {
                slot: None,
                prep: std::mem::take(&mut (*p).prep),
                inflight: std::mem::take(&mut (*p).inflight),
            };
            std::ptr::drop_in_place(p);
            keep(Spare {
                slot: Some(Box::from_raw(p.cast::<MaybeUninit<State<'static>>>())),
                ..sp
            });
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
            if r.poll() {
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
        r.with(|s| s.progress(true));
    }
}

// SAFETY: a request's state is used only by whoever holds its busy flag, and what it borrows
// (the file, its channel) is `Sync`.
unsafe impl Send for Pending<'_> {}
