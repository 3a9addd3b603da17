//! The channel driver: tags, submission, completion (Moneta-D §4.2, §4.4).
//!
//! Threads of a process share one channel. A thread takes a free virtual tag (lock-free; when
//! none is free it queues for one, see `channel/tags.rs`), copies its data into the tag's DMA
//! slice for a write, writes the command (with the tag's next sequence number) into the tag's
//! slot and flips the tag's doorbell bit; if the device has parked the channel it also writes
//! the device's kick pipe. It then waits in the way the command asked until the tag's `state`
//! word holds that sequence number: spinning on it and then sleeping (DMA completion),
//! harvesting the tag status register when the completion count moves (forwarding), or
//! sleeping on a futex with the waiter count raised (issue-sleep). On the DMA path
//! the client never writes the status entry, so the only cache lines that cross between the two
//! cores are the command, the doorbell, the status entry and the data.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use moneta_abi::control::ChannelInfo;
use moneta_abi::fsproto::FsExtent;
use moneta_abi::{
    error_entry_offset, tag_slot_offset, ChannelHeader, Command, Completion, ErrorEntry,
    ErrorRecord, Opcode, Status, TagSlot, ABI_VERSION, CHANNEL_MAGIC, DMA_OFFSET, ERROR_QUEUE_LEN,
    PARKED, TAGS_PER_CHANNEL,
};
use rustix::mm::{MapFlags, ProtFlags};

use crate::control::Control;
use crate::ClientError;

pub(crate) mod attrs;
mod closing;
mod durable;
pub(crate) mod fscall;
pub(crate) mod leases;
mod pipeline;
pub(crate) mod reapers;
pub(crate) mod sizes;
pub(crate) mod sole;
mod tags;
mod wait;

use tags::{Tags, Turn, Waiter};
use wait::SPIN_SCORE_MAX;

/// How a completed command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    /// Status the device reported.
    pub status: Status,
    /// Bytes moved.
    pub bytes: u64,
    /// Nanoseconds the device spent on the command.
    pub device_ns: u64,
}

/// A virtual tag held by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag(pub u8);

/// A process's channel to the device.
pub struct Channel {
    control: Control,
    base: NonNull<u8>,
    info: ChannelInfo,
    memfd: OwnedFd,
    kick: OwnedFd,
    tags: Tags,
    /// Tags held by zero-copy requests (asynchronous requests keep a count there).
    pub(crate) pinned: AtomicUsize,
    /// Asynchronous requests not dropped yet, and the tags their commands are on.
    pub(crate) reapers: reapers::Reapers,
    /// Sequence number of the command last submitted on each tag.
    seqs: [AtomicU32; TAGS_PER_CHANNEL],
    /// The barrier epoch commands are submitted in (`moneta_abi::FLAG_BARRIER`): a barrier
    /// carries the current one and moves the channel to the next.
    epoch: std::sync::atomic::AtomicU8,
    /// Serializes consumers of the error queue (rare, off the data path).
    err_lock: std::sync::Mutex<()>,
    /// Threads spinning for a DMA completion now, and how many may (see [`Channel::wait`]).
    spinners: AtomicU32,
    max_spinners: u32,
    /// Threads in [`Channel::wait`] now.
    waiters: AtomicU32,
    /// Set once a wait found the daemon gone: later waits for commands it has not completed
    /// fail at once rather than after another liveness interval each.
    gone: std::sync::atomic::AtomicBool,
    /// How well spinning for DMA completions has paid lately (0 to [`SPIN_SCORE_MAX`]), and a
    /// count of waits that decides when to try again once it has not.
    spin_score: AtomicU32,
    spin_probe: AtomicU32,
    /// Tags whose last command completes with a wake-up of its sleepers (DMA and issue-sleep
    /// completion, not forwarding): what a thread waiting for a tag may sleep on.
    wakeable: AtomicU64,
    /// Answers about attributes kept while the change board says they hold ([`attrs`]).
    pub(crate) attrs: attrs::Attrs,
    /// Closes posted without waiting for their answers ([`closing`]).
    closing: Box<closing::Closing>,
    /// Writes posted under sole leases and not collected yet, by every file ([`sole`]).
    pub(crate) posted: AtomicU32,
    /// The daemon's durability page, once asked for ([`durable`]).
    durable: std::sync::OnceLock<Option<durable::DurableMap>>,
}

// SAFETY: the mapping is shared memory accessed only through atomics and raw copies; tags are
// handed out exclusively by the lock-free free mask.
unsafe impl Send for Channel {}
// SAFETY: as above; every shared field is an atomic.
unsafe impl Sync for Channel {}

impl Channel {
    /// Connects to the daemon at `socket` and opens a channel.
    pub fn open(socket: &Path) -> Result<Channel, ClientError> {
        Self::from_control(Control::connect(socket)?)
    }

    /// Opens a channel on an existing control connection; the channel lives as long as the
    /// connection.
    pub fn from_control(control: Control) -> Result<Channel, ClientError> {
        let (info, memfd, kick) = control.open_channel_raw()?;
        let size = rustix::fs::fstat(&memfd)?.st_size as u64;
        let want = moneta_abi::channel_size(info.dma_size as usize) as u64;
        if size != info.channel_size
            || size != want
            || info.tags as usize != TAGS_PER_CHANNEL
            || info.dma_offset != DMA_OFFSET as u64
            || (info.slice_size as u64).checked_mul(TAGS_PER_CHANNEL as u64) != Some(info.dma_size)
        {
            return Err(ClientError::BadChannel(format!(
                "channel geometry does not match: memfd {size} bytes, {info:?}"
            )));
        }
        // SAFETY: a fresh shared mapping of the whole memfd, which the daemon sealed against
        // shrinking.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                size as usize,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &memfd,
                0,
            )?
        };
        let ch = Channel {
            control,
            base: NonNull::new(ptr.cast()).expect("mmap returns non-null"),
            info,
            memfd,
            kick,
            tags: Tags::new(),
            pinned: AtomicUsize::new(0),
            reapers: reapers::Reapers::new(),
            spinners: AtomicU32::new(0),
            max_spinners: spinner_limit(),
            waiters: AtomicU32::new(0),
            gone: std::sync::atomic::AtomicBool::new(false),
            wakeable: AtomicU64::new(0),
            spin_score: AtomicU32::new(SPIN_SCORE_MAX),
            spin_probe: AtomicU32::new(0),
            seqs: std::array::from_fn(|_| AtomicU32::new(0)),
            epoch: std::sync::atomic::AtomicU8::new(0),
            err_lock: std::sync::Mutex::new(()),
            attrs: Default::default(),
            closing: Default::default(),
            posted: AtomicU32::new(0),
            durable: std::sync::OnceLock::new(),
        };
        let h = ch.header();
        if h.magic.load(Ordering::Acquire) != CHANNEL_MAGIC
            || h.abi_version.load(Ordering::Relaxed) != ABI_VERSION
            || h.channel_id.load(Ordering::Relaxed) != info.channel
        {
            return Err(ClientError::BadChannel(
                "channel header does not carry this ABI's magic and version".into(),
            ));
        }
        ch.want_leases();
        ch.want_size_leases();
        ch.want_sole_leases();
        Ok(ch)
    }

    /// Channel id.
    pub fn id(&self) -> u32 {
        self.info.channel
    }

    /// The CPU the device's poller is pinned to, as the channel header says (`None`: the
    /// scheduler places it).
    pub fn device_cpu(&self) -> Option<usize> {
        match self.header().device_cpu.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n as usize - 1),
        }
    }

    /// Geometry.
    pub fn info(&self) -> &ChannelInfo {
        &self.info
    }

    /// The control connection this channel lives on.
    pub fn control(&self) -> &Control {
        &self.control
    }

    /// The write end of the kick pipe.
    pub fn kick_fd(&self) -> &OwnedFd {
        &self.kick
    }

    /// The channel memfd (sealed by the daemon).
    pub fn memfd(&self) -> &OwnedFd {
        &self.memfd
    }

    /// The start of the channel's memory.
    pub(crate) fn header_ptr(&self) -> *const u8 {
        self.base.as_ptr()
    }

    /// The header and registers.
    pub fn header(&self) -> &ChannelHeader {
        // SAFETY: page-aligned mapping of at least one page; atomics only.
        unsafe { &*self.base.as_ptr().cast::<ChannelHeader>() }
    }

    /// Tag `tag`'s slot.
    pub fn slot(&self, tag: Tag) -> &TagSlot {
        assert!((tag.0 as usize) < TAGS_PER_CHANNEL);
        // SAFETY: in bounds and aligned (layout asserted in moneta-abi); atomics only.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(tag_slot_offset(tag.0 as usize))
                .cast::<TagSlot>()
        }
    }

    /// Bytes of DMA buffer per tag.
    pub fn slice_size(&self) -> usize {
        self.info.slice_size as usize
    }

    /// Takes a free tag, if any.
    pub fn try_tag(&self) -> Option<Tag> {
        self.tags.try_take()
    }

    /// Takes a free tag, waiting until one is. While it waits it moves the process's
    /// asynchronous requests along, which frees the tags of their completed commands; then it
    /// joins the channel's queue of waiting threads, which releases serve in arrival order,
    /// each tag written into its waiter's own futex word (see `channel/tags.rs`). A thread
    /// that finds nobody queued spins briefly first.
    pub fn tag(&self) -> Tag {
        if let Some(t) = self.try_tag() {
            return t;
        }
        if self.reap_others() {
            if let Some(t) = self.try_tag() {
                self.dispatch_free();
                return t;
            }
        }
        if self.closes_out() > 0 {
            // Posted closes hold tags that only a collection frees.
            self.collect_closes(true);
            if let Some(t) = self.try_tag() {
                return t;
            }
        }
        if !self.tags.waiting() {
            for _ in 0..TAG_SPINS {
                std::hint::spin_loop();
                if let Some(t) = self.try_tag() {
                    return t;
                }
            }
        }
        let w = match self.tags.enqueue() {
            Ok(t) => return t,
            Err(w) => w,
        };
        let t = loop {
            match w.turn() {
                Turn::Granted(t) => break t,
                Turn::Watching => {
                    self.watch(&w);
                    if !matches!(w.turn(), Turn::Granted(_)) {
                        // Woken by a completion (or the poll's end): reap what nobody else
                        // does; the tags it frees go to the queue's front.
                        self.reap_others();
                    }
                }
                Turn::Waiting => {
                    let _ = rustix::thread::futex::wait(
                        w.word(),
                        rustix::thread::futex::Flags::PRIVATE,
                        Waiter::value_of(Turn::Waiting),
                        Some(&TAG_WAIT_TIMEOUT),
                    );
                }
            }
        };
        tags::put_back(w);
        t
    }

    /// The watcher's sleep: until its word changes (a tag handed to it) or a command in
    /// flight on the channel completes, whichever comes first (`futex_waitv`, Linux 5.16).
    /// Without a command to sleep on, or without `futex_waitv`, it sleeps on its own word for
    /// at most [`WATCH_POLL`].
    fn watch(&self, w: &Waiter) {
        use rustix::thread::futex;
        let mine = Waiter::value_of(Turn::Watching);
        let Some(t) = self.wakeable_in_flight() else {
            let _ = futex::wait(w.word(), futex::Flags::PRIVATE, mine, Some(&WATCH_POLL));
            return;
        };
        let st = &self.slot(t).status;
        let want = self.seqs[t.0 as usize].load(Ordering::Relaxed);
        // As a completion sleeper does (ABI §7.3): count ourselves in `waiter`, then look
        // at `state` again; the device stores `state`, then reads `waiter`.
        st.waiter.fetch_add(1, Ordering::SeqCst);
        let now = st.state.load(Ordering::SeqCst);
        if now != want && w.turn() == Turn::Watching {
            let mut waits = [futex::Wait::new(), futex::Wait::new()];
            waits[0].uaddr = futex::WaitPtr::new(w.word().as_ptr().cast());
            waits[0].val = u64::from(mine);
            waits[0].flags = futex::WaitFlags::SIZE_U32 | futex::WaitFlags::PRIVATE;
            // Shared, not private: the device wakes it from its own process.
            waits[1].uaddr = futex::WaitPtr::new(st.state.as_ptr().cast());
            waits[1].val = u64::from(now);
            waits[1].flags = futex::WaitFlags::SIZE_U32;
            let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
            let deadline = rustix::time::Timespec {
                tv_sec: now.tv_sec + WATCH_TIMEOUT_SECS,
                tv_nsec: now.tv_nsec,
            };
            if let Err(rustix::io::Errno::NOSYS) = futex::waitv(
                &waits,
                futex::WaitvFlags::empty(),
                Some(&deadline),
                rustix::time::ClockId::Monotonic,
            ) {
                let _ = futex::wait(w.word(), futex::Flags::PRIVATE, mine, Some(&WATCH_POLL));
            }
        }
        st.waiter.fetch_sub(1, Ordering::SeqCst);
    }

    /// A tag whose command is in flight and completes with a wake-up of its sleepers.
    fn wakeable_in_flight(&self) -> Option<Tag> {
        let mut m = !self.tags.free_mask() & self.wakeable.load(Ordering::Relaxed);
        while m != 0 {
            let t = m.trailing_zeros() as usize;
            m &= m - 1;
            let want = self.seqs[t].load(Ordering::Relaxed);
            if self.slot(Tag(t as u8)).status.state.load(Ordering::Relaxed) != want {
                return Some(Tag(t as u8));
            }
        }
        None
    }

    /// Returns a tag: to the thread that has waited longest for one, else to the free mask.
    pub fn release(&self, tag: Tag) {
        self.reapers.disown(tag);
        self.tags.release(tag);
    }

    fn dma_ptr(&self, tag: Tag, off: usize, len: usize) -> *mut u8 {
        let start = tag.0 as usize * self.slice_size() + off;
        assert!(
            start
                .checked_add(len)
                .is_some_and(|e| e <= self.info.dma_size as usize),
            "DMA range outside the buffer"
        );
        // SAFETY: in bounds of the DMA buffer, which lies inside the mapping.
        unsafe { self.base.as_ptr().add(DMA_OFFSET + start) }
    }

    /// The first `len` bytes of tag `tag`'s DMA slice. Only meaningful while the caller holds
    /// the tag with no command in flight on it (the device touches a slice only for the tag's
    /// command).
    pub(crate) fn dma_slice(&self, tag: Tag, len: usize) -> &[u8] {
        assert!(len <= self.slice_size());
        let p = self.dma_ptr(tag, 0, len);
        // SAFETY: in bounds of the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts(p, len) }
    }

    /// The first `len` bytes of tag `tag`'s DMA slice, to fill in place (same rule as
    /// [`Channel::dma_slice`]).
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn dma_slice_mut(&self, tag: Tag, len: usize) -> &mut [u8] {
        assert!(len <= self.slice_size());
        let p = self.dma_ptr(tag, 0, len);
        // SAFETY: in bounds of the mapping; the holder of the tag is the only one who touches
        // its slice while no command is in flight on it.
        unsafe { std::slice::from_raw_parts_mut(p, len) }
    }

    /// Copies `data` into the DMA buffer at `off` bytes past tag `tag`'s slice start.
    pub fn write_dma(&self, tag: Tag, off: usize, data: &[u8]) {
        let dst = self.dma_ptr(tag, off, data.len());
        // SAFETY: `dst` spans data.len() bytes of the mapping; the device reads this range only
        // after the doorbell, so no reference to it exists.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) }
    }

    /// Copies out of the DMA buffer at `off` bytes past tag `tag`'s slice start.
    pub fn read_dma(&self, tag: Tag, off: usize, out: &mut [u8]) {
        let src = self.dma_ptr(tag, off, out.len());
        // SAFETY: `src` spans out.len() bytes of the mapping.
        unsafe { std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len()) }
    }

    /// Writes `cmd` into `tag`'s slot with the tag's next sequence number and rings the
    /// doorbell; kicks the device if it parked the channel. `cmd.seq` is ignored.
    pub fn submit(&self, tag: Tag, cmd: &Command) {
        self.prepare(tag, cmd);
        self.ring(1u64 << tag.0);
    }

    /// Writes `cmd` into `tag`'s slot with the tag's next sequence number, without ringing:
    /// several prepared tags can then be rung at once with [`Channel::ring`]. The command goes
    /// in the channel's current barrier epoch (`cmd.epoch` is ignored); a barrier
    /// (`cmd.barrier`) moves the channel to the next, so every command prepared after it, by
    /// any thread, issues only once the barrier and everything before it have completed,
    /// whatever order the device takes the doorbell bits in.
    pub fn prepare(&self, tag: Tag, cmd: &Command) {
        let seq = self.seqs[tag.0 as usize]
            .load(Ordering::Relaxed)
            .wrapping_add(1);
        let mut c = *cmd;
        c.seq = seq;
        c.epoch = if c.barrier {
            self.epoch.fetch_add(1, Ordering::AcqRel)
        } else {
            self.epoch.load(Ordering::Acquire)
        };
        self.write_slot(tag, &c.to_words());
    }

    /// Writes raw command words into `tag`'s slot and rings its doorbell bit (for tests of the
    /// device's decoder). The sequence number in word 0 becomes the one [`Channel::wait`] waits
    /// for.
    pub fn submit_words(&self, tag: Tag, words: &[u64; 8]) {
        self.write_slot(tag, words);
        self.ring(1u64 << tag.0);
    }

    fn write_slot(&self, tag: Tag, words: &[u64; 8]) {
        let slot = self.slot(tag);
        for (a, &w) in slot.command.words.iter().zip(words) {
            a.store(w, Ordering::Relaxed);
        }
        self.seqs[tag.0 as usize].store((words[0] >> 32) as u32, Ordering::Relaxed);
        let bit = 1u64 << tag.0;
        // Mode 1 is forwarding, which wakes nobody; anything else wakes sleepers (ABI §7).
        if (words[0] >> 16) & 3 == 1 {
            self.wakeable.fetch_and(!bit, Ordering::Relaxed);
        } else {
            self.wakeable.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// Flips doorbell bits (one submission per bit) and kicks the device if it parked the
    /// channel.
    pub fn ring(&self, bits: u64) {
        let h = self.header();
        h.doorbell.fetch_xor(bits, Ordering::SeqCst);
        // Pairs with the device's store of PARKED before its last doorbell read.
        if h.parked.load(Ordering::SeqCst) == PARKED {
            self.kick();
        }
    }

    /// The soft miss through the channel (`OP_LOOKUP`): maps `[off, off + len)` of the file
    /// open as `handle` on this channel's control connection and installs the records, answered
    /// by the device's poller from the permission manager's tables when they are free, without
    /// the control socket's round trip through a daemon thread. `Ok(None)` when the device
    /// referred the lookup to the control socket (`FS_LOOKUP` then answers, or gives the
    /// error).
    pub fn lookup(
        &self,
        handle: u64,
        off: u64,
        len: u64,
    ) -> Result<Option<crate::control::Mapped>, ClientError> {
        let tag = match self.try_tag() {
            Some(t) => t,
            None => self.tag(),
        };
        let cmd = Command {
            opcode: Opcode::Lookup,
            completion: Completion::Dma,
            addr: off,
            len,
            cookie: 0,
            seq: 0,
            file: handle,
            barrier: false,
            epoch: 0,
        };
        self.submit(tag, &cmd);
        let done = self.wait(tag, Completion::Dma);
        let reply = match done {
            Ok(c) if c.status == Status::Ok => {
                let mut head = [0u8; moneta_abi::LOOKUP_HEADER];
                self.read_dma(tag, 0, &mut head);
                let n = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
                let all = n
                    .checked_mul(moneta_abi::LOOKUP_EXTENT)
                    .and_then(|b| b.checked_add(moneta_abi::LOOKUP_HEADER))
                    .filter(|&b| b <= self.slice_size());
                match all {
                    Some(all) => {
                        let mut buf = vec![0u8; all];
                        self.read_dma(tag, 0, &mut buf);
                        moneta_abi::LookupReply::decode(&buf)
                            .map(Some)
                            .ok_or(ClientError::Status(Status::Malformed))
                    }
                    None => Err(ClientError::Status(Status::Malformed)),
                }
            }
            Ok(c) if c.status == Status::Refer => Ok(None),
            Ok(c) => Err(ClientError::Status(c.status)),
            Err(e) => Err(e),
        };
        self.release(tag);
        Ok(reply?.map(|r| crate::control::Mapped {
            size: r.size,
            file: r.file,
            extents: r
                .extents
                .into_iter()
                .map(|(file_off, len, dev)| FsExtent { file_off, len, dev })
                .collect(),
        }))
    }

    /// Writes the kick pipe: the need-wakeup path. A daemon that has gone has closed the
    /// pipe's other end, and a write there raises `SIGPIPE`, which kills a process that has
    /// not set it aside (C programs under the preload shim): the signal is blocked for this
    /// thread around the write and one it raised is taken back, so the caller learns that the
    /// daemon has gone from the completion wait instead.
    pub fn kick(&self) {
        use rustix::io::Errno;
        // SAFETY: sigset and mask calls on local, initialized sets; the previous mask is
        // restored before returning.
        unsafe {
            let mut pipe: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut pipe);
            libc::sigaddset(&mut pipe, libc::SIGPIPE);
            libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old);
            libc::sigpending(&mut pending);
            let was_pending = libc::sigismember(&pending, libc::SIGPIPE) == 1;
            if let Err(Errno::PIPE) = rustix::io::write(&self.kick, &1u64.to_ne_bytes()) {
                // The device's end is closed: nothing rung on this channel will be carried
                // out (a posted write waits for its completion instead, and fails).
                self.gone.store(true, Ordering::Relaxed);
                if !was_pending {
                    let zero = libc::timespec {
                        tv_sec: 0,
                        tv_nsec: 0,
                    };
                    libc::sigtimedwait(&pipe, std::ptr::null_mut(), &zero);
                }
            }
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
    }

    /// Submits one command on a tag of the caller's and waits for it.
    pub fn run(&self, tag: Tag, cmd: &Command) -> Result<Completed, ClientError> {
        self.submit(tag, cmd);
        self.wait(tag, cmd.completion)
    }

    fn checked(c: Completed) -> Result<Completed, ClientError> {
        if c.status == Status::Ok {
            Ok(c)
        } else {
            Err(ClientError::Status(c.status))
        }
    }

    /// Reads `buf.len()` bytes at array address `addr`, in slice-sized commands on one tag.
    pub fn read(&self, addr: u64, buf: &mut [u8], mode: Completion) -> Result<(), ClientError> {
        let tag = self.tag();
        let r = self.read_on(tag, addr, buf, mode);
        self.release(tag);
        r
    }

    /// [`Channel::read`] on a tag the caller holds.
    pub fn read_on(
        &self,
        tag: Tag,
        addr: u64,
        buf: &mut [u8],
        mode: Completion,
    ) -> Result<(), ClientError> {
        let slice = self.slice_size();
        for (i, chunk) in buf.chunks_mut(slice).enumerate() {
            // Wrapping: an address past the end is the device's to refuse (OutOfRange).
            let at = addr.wrapping_add((i * slice) as u64);
            let cmd = command(Opcode::Read, mode, at, chunk.len() as u64, 0);
            Self::checked(self.run(tag, &cmd)?)?;
            self.read_dma(tag, 0, chunk);
        }
        Ok(())
    }

    /// Writes `data` at array address `addr`, in slice-sized commands on one tag.
    pub fn write(&self, addr: u64, data: &[u8], mode: Completion) -> Result<(), ClientError> {
        let tag = self.tag();
        let r = self.write_on(tag, addr, data, mode);
        self.release(tag);
        r
    }

    /// [`Channel::write`] on a tag the caller holds.
    pub fn write_on(
        &self,
        tag: Tag,
        addr: u64,
        data: &[u8],
        mode: Completion,
    ) -> Result<(), ClientError> {
        let slice = self.slice_size();
        for (i, chunk) in data.chunks(slice).enumerate() {
            self.write_dma(tag, 0, chunk);
            let at = addr.wrapping_add((i * slice) as u64);
            let cmd = command(Opcode::Write, mode, at, chunk.len() as u64, 0);
            Self::checked(self.run(tag, &cmd)?)?;
        }
        Ok(())
    }

    /// Barrier, and with `len > 0` persistence of `[addr, addr+len)`.
    pub fn flush(&self, addr: u64, len: u64, mode: Completion) -> Result<(), ClientError> {
        let tag = self.tag();
        let cmd = command(Opcode::Flush, mode, addr, len, 0);
        let r = self.run(tag, &cmd).and_then(Self::checked);
        self.release(tag);
        r.map(|_| ())
    }

    /// A hint that `[addr, addr+len)` will be read soon (`OP_WILLNEED`): the device's DRAM
    /// buffer, if its model has one, fills those lines; it completes at once.
    pub fn will_need(&self, addr: u64, len: u64, mode: Completion) -> Result<(), ClientError> {
        let tag = self.tag();
        let cmd = command(Opcode::WillNeed, mode, addr, len, 0);
        let r = self.run(tag, &cmd).and_then(Self::checked);
        self.release(tag);
        r.map(|_| ())
    }

    /// A barrier (Moneta §IV): completes once every command submitted on this channel before
    /// it has completed, and no command submitted after it issues before then.
    pub fn barrier(&self, mode: Completion) -> Result<(), ClientError> {
        let tag = self.tag();
        let mut cmd = command(Opcode::Nop, mode, 0, 0, 0);
        cmd.barrier = true;
        let r = self.run(tag, &cmd).and_then(Self::checked);
        self.release(tag);
        r.map(|_| ())
    }

    /// A command that does nothing: the channel's round trip.
    pub fn nop(&self, mode: Completion) -> Result<Completed, ClientError> {
        let tag = self.tag();
        let cmd = command(Opcode::Nop, mode, 0, 0, 0);
        let r = self.run(tag, &cmd);
        self.release(tag);
        r
    }

    /// Pops the oldest entry of the channel's error queue.
    /// Safe with several consuming threads: each entry goes to one of them.
    pub fn pop_error(&self) -> Option<ErrorRecord> {
        let h = self.header();
        let _one_consumer = self.err_lock.lock().unwrap_or_else(|e| e.into_inner());
        let tail = h.err_tail.load(Ordering::Relaxed);
        let head = h.err_head.load(Ordering::Acquire);
        if head == tail {
            return None;
        }
        let idx = tail as usize % ERROR_QUEUE_LEN;
        // SAFETY: idx < ERROR_QUEUE_LEN: the entry lies in the error-queue page; atomics only.
        let e = unsafe {
            &*self
                .base
                .as_ptr()
                .add(error_entry_offset(idx))
                .cast::<ErrorEntry>()
        };
        let mut w = [0u64; 4];
        for (o, a) in w.iter_mut().zip(e.words.iter()) {
            *o = a.load(Ordering::Relaxed);
        }
        h.err_tail.store(tail.wrapping_add(1), Ordering::Release);
        Some(ErrorRecord::from_words(w))
    }
}

impl Channel {
    /// In a forked child: makes the parent's channel inert. Its descriptors (control socket,
    /// channel memory, kick pipe) are replaced by `/dev/null`, so the parent's connection ends
    /// when the parent closes it, and its mapping by private zeroed memory, so nothing this
    /// process does can reach the parent's tags. The object stays valid for references held
    /// elsewhere, which check the fork generation before use.
    pub(crate) fn detach(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain system calls on descriptors this object owns; `dup3` replaces each
        // atomically, so the numbers stay owned by it and are closed once, at drop.
        unsafe {
            // Raw system calls: under the preload shim the C library's names are its hooks.
            let null = libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                c"/dev/null".as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC,
            ) as i32;
            if null >= 0 {
                for fd in [
                    self.control.fd().as_raw_fd(),
                    self.memfd.as_raw_fd(),
                    self.kick.as_raw_fd(),
                ] {
                    libc::syscall(libc::SYS_dup3, null, fd, libc::O_CLOEXEC);
                }
                libc::syscall(libc::SYS_close, null);
            }
        }
        // SAFETY: replaces exactly this channel's mapping, in place, with anonymous memory;
        // `Drop` unmaps it as before.
        unsafe {
            libc::syscall(
                libc::SYS_mmap,
                self.base.as_ptr(),
                self.info.channel_size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            );
        }
    }
}

/// A command with no cookie; its sequence number is set at submission. `file` is the layout
/// tag its records must carry (0: any).
pub(crate) fn command(
    opcode: Opcode,
    completion: Completion,
    addr: u64,
    len: u64,
    file: u64,
) -> Command {
    Command::new(opcode, completion, addr, len, file)
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `from_control`; no reference into it
        // outlives `self`.
        let _ = unsafe {
            rustix::mm::munmap(self.base.as_ptr().cast(), self.info.channel_size as usize)
        };
    }
}

/// Spins of a thread that found no tag free and nobody waiting for one, before it queues.
const TAG_SPINS: u32 = 64;

/// Longest sleep of a thread waiting for a tag before it looks again (a safety net: a release
/// wakes it).
const TAG_WAIT_TIMEOUT: rustix::time::Timespec = rustix::time::Timespec {
    tv_sec: 0,
    tv_nsec: 100_000_000,
};

/// Longest sleep of the watcher on a command in flight before it looks again.
const WATCH_TIMEOUT_SECS: i64 = 1;

/// The watcher's sleep when no command it could sleep on is in flight (or the kernel has no
/// `futex_waitv`): how late a completion of an asynchronous request nobody reaps may be seen.
const WATCH_POLL: rustix::time::Timespec = rustix::time::Timespec {
    tv_sec: 0,
    tv_nsec: 1_000_000,
};

/// How many of a process's threads may spin for DMA completions at once: one fewer than the
/// CPUs it may run on (the device's poller needs one), and at least one.
fn spinner_limit() -> u32 {
    let n = rustix::thread::sched_getaffinity(None)
        .map(|set| set.count())
        .unwrap_or(1);
    n.saturating_sub(1).max(1)
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::{Moneta, OpenOptions, Policy};

    /// How long a test waits for something that must happen before it calls it a hang.
    const HANG: Duration = Duration::from_secs(120);

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < HANG, "hung waiting for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A file of `len` bytes whose every 8-byte word holds its own offset.
    fn patterned(m: &Moneta, path: &str, len: usize) -> crate::File {
        let f = m
            .open(path, OpenOptions::new().read(true).write(true).create(true))
            .unwrap();
        let data: Vec<u8> = (0..len as u64 / 8)
            .flat_map(|w| (w * 8).to_le_bytes())
            .collect();
        f.write_at(&data, 0).unwrap();
        f
    }

    fn check(buf: &[u8], off: u64) {
        for (i, w) in buf.chunks_exact(8).enumerate() {
            let want = off + 8 * i as u64;
            assert_eq!(
                u64::from_le_bytes(w.try_into().unwrap()),
                want,
                "wrong data"
            );
        }
    }

    /// Threads blocked in `Channel::tag` get the released tags in the order they came.
    #[test]
    fn tags_go_to_waiting_threads_in_arrival_order() {
        let d = monetad::testing::Daemon::start();
        let m = Moneta::connect(&d.socket).unwrap();
        let ch = m.channel();
        let all: Vec<Tag> = std::iter::from_fn(|| ch.try_tag()).collect();
        assert_eq!(all.len(), TAGS_PER_CHANNEL);
        let served = Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for i in 0..6 {
                let served = &served;
                s.spawn(move || {
                    let t = ch.tag();
                    served.lock().unwrap().push((i, t));
                });
                until("the thread to queue", || ch.tags.queued() == i + 1);
            }
            for (k, &t) in all.iter().take(6).enumerate() {
                ch.release(t);
                until("the hand-off", || served.lock().unwrap().len() == k + 1);
                assert_eq!(served.lock().unwrap()[k], (k, t), "served out of order");
            }
        });
        for &t in &all[6..] {
            ch.release(t);
        }
        for (_, t) in served.into_inner().unwrap() {
            ch.release(t);
        }
        assert_eq!(ch.tags.free_mask(), u64::MAX);
    }

    /// Many more threads than tags read through one channel, each request several commands,
    /// half spinning and half sleeping for completions: every read completes with the right
    /// bytes, and every tag comes back.
    #[test]
    fn more_threads_than_tags_all_complete() {
        const THREADS: usize = 96;
        const READS: usize = 40;
        const LEN: usize = 4 << 20;
        let d = monetad::testing::Daemon::start();
        let m = Moneta::connect(&d.socket).unwrap();
        let f = patterned(&m, "/many", LEN);
        std::thread::scope(|s| {
            for i in 0..THREADS {
                let f = &f;
                s.spawn(move || {
                    let mode = if i % 2 == 0 {
                        Completion::Dma
                    } else {
                        Completion::Sleep
                    };
                    let mut buf = vec![0u8; 64 << 10];
                    for r in 0..READS {
                        let off = (((i * READS + r) * 7919) % (LEN / buf.len())) * buf.len();
                        let n = f.read_at_with(&mut buf, off as u64, mode).unwrap();
                        assert_eq!(n, buf.len());
                        check(&buf, off as u64);
                    }
                });
            }
        });
        assert!(!m.channel().tags.waiting());
        assert_eq!(m.channel().tags.free_mask(), u64::MAX);
    }

    /// Threads keeping several asynchronous reads each, of several commands each, so that far
    /// more requests wait for tags than there are: every read gets its own bytes, and once all
    /// are dropped every tag is back and no request is counted as waiting.
    #[test]
    fn asynchronous_reads_beyond_the_tags_all_get_their_bytes() {
        const THREADS: usize = 24;
        const DEPTH: usize = 8;
        const READS: usize = 48;
        const LEN: usize = 4 << 20;
        let d = monetad::testing::Daemon::start();
        let m = Moneta::connect(&d.socket).unwrap();
        let f = patterned(&m, "/async-many", LEN);
        let size = 4 * m.channel().slice_size();
        std::thread::scope(|s| {
            for i in 0..THREADS {
                let f = &f;
                s.spawn(move || {
                    let at = |r: usize| (((i * READS + r) * 7919) % (LEN / size) * size) as u64;
                    let mut q = std::collections::VecDeque::new();
                    for r in 0..READS {
                        q.push_back((f.submit_read(vec![0u8; size], at(r)).unwrap(), at(r)));
                        if q.len() == DEPTH || r == READS - 1 {
                            while let Some((mut p, off)) = q.pop_front() {
                                assert_eq!(p.wait().unwrap(), size);
                                check(&p.into_buffer(), off);
                                if q.len() < DEPTH / 2 {
                                    break;
                                }
                            }
                        }
                    }
                    for (mut p, off) in q {
                        assert_eq!(p.wait().unwrap(), size);
                        check(&p.into_buffer(), off);
                    }
                });
            }
        });
        let ch = m.channel();
        assert!(!ch.tags.waiting());
        assert_eq!(ch.tags.free_mask(), u64::MAX);
        assert!(!ch.reapers.backlogged());
        assert_eq!(ch.reapers.backlog.load(Ordering::Relaxed), 0);
    }

    /// A thread that needs a tag reaps a completed request nobody reaps, takes one of the tags
    /// it freed and issues the command of a request waiting for tags on the other, without
    /// that request's owner doing anything.
    #[test]
    fn a_thread_that_reaps_hands_the_tags_it_frees_to_waiting_requests() {
        let d = monetad::testing::Daemon::start();
        let m = Moneta::connect(&d.socket).unwrap();
        let f = patterned(&m, "/dispatch", 1 << 20);
        let ch = m.channel();
        let slice = ch.slice_size();
        f.set_policy(Some(Policy::Fixed(Completion::Dma)));
        let mut held: Vec<Tag> = std::iter::from_fn(|| ch.try_tag()).collect();
        assert_eq!(held.len(), TAGS_PER_CHANNEL);
        // A: two commands on the two tags given back, completed and left unreaped.
        let two = [held.pop().unwrap(), held.pop().unwrap()];
        for t in two {
            ch.release(t);
        }
        let mut a = f.submit_read(vec![0u8; 2 * slice], 0).unwrap();
        let began = Instant::now();
        for t in two {
            let st = &ch.slot(t).status;
            while st.state.load(Ordering::Acquire) != ch.seqs[t.0 as usize].load(Ordering::Relaxed)
            {
                assert!(began.elapsed() < HANG, "A's commands never completed");
                std::thread::yield_now();
            }
        }
        // B: no tag for it, so it waits for one.
        let b_off = 4 * slice as u64;
        let mut b = f.submit_read(vec![0u8; slice], b_off).unwrap();
        assert_eq!(ch.tags.free_mask(), 0);
        assert_eq!(ch.reapers.backlog.load(Ordering::Relaxed), 1);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut buf = vec![0u8; 4096];
                let n = f.read_at_with(&mut buf, 8192, Completion::Dma).unwrap();
                check(&buf[..n], 8192);
            })
            .join()
            .unwrap();
        });
        // The reader gave its tag back; B's command holds the other unless the reader already
        // reaped it too (B completes at once, so either may be seen).
        assert!(ch.tags.free_mask().count_ones() >= 1);
        assert_eq!(ch.reapers.backlog.load(Ordering::Relaxed), 0);
        assert_eq!(b.wait().unwrap(), slice);
        check(&b.into_buffer(), b_off);
        assert_eq!(a.wait().unwrap(), 2 * slice);
        check(&a.into_buffer(), 0);
        for t in held {
            ch.release(t);
        }
        assert_eq!(ch.tags.free_mask(), u64::MAX);
        f.set_policy(None);
    }

    /// Every tag is held, one of them by an asynchronous read nobody reaps; a thread that then
    /// needs a tag gets the read's once its command completes (the watcher, or the thread
    /// itself before it queues, reaps it), whatever the read's completion mode.
    #[test]
    fn a_waiter_gets_the_tag_of_an_unreaped_request() {
        let d = monetad::testing::Daemon::start();
        let m = Moneta::connect(&d.socket).unwrap();
        let f = patterned(&m, "/unreaped", 1 << 20);
        let ch = m.channel();
        let slice = ch.slice_size();
        for round in 0..60 {
            let mode = [Completion::Dma, Completion::Sleep, Completion::Forward][round % 3];
            f.set_policy(Some(Policy::Fixed(mode)));
            let held: Vec<Tag> = std::iter::from_fn(|| ch.try_tag()).collect();
            assert_eq!(
                held.len(),
                TAGS_PER_CHANNEL,
                "every tag free between rounds"
            );
            // Give one back for the asynchronous read to take.
            let (last, held) = held.split_last().unwrap();
            ch.release(*last);
            let off = (round * slice) as u64 % (1 << 20);
            let mut p = f.submit_read(vec![0u8; slice], off).unwrap();
            let (tx, rx) = mpsc::channel();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let mut buf = vec![0u8; 4096];
                    let n = f.read_at_with(&mut buf, 8192, mode).unwrap();
                    check(&buf[..n], 8192);
                    tx.send(()).unwrap();
                });
                rx.recv_timeout(HANG)
                    .expect("the waiting thread never got the unreaped request's tag");
            });
            assert_eq!(p.wait().unwrap(), slice);
            check(&p.into_buffer(), off);
            for &t in held {
                ch.release(t);
            }
        }
        f.set_policy(None);
    }
}
