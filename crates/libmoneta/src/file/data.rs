//! The data path of a [`File`]: soft and hard misses, extends, planning a request over the
//! translation map and moving it through the channel in commands of at most a DMA slice, with
//! up to [`MAX_INFLIGHT`] in flight (Moneta-D §4.2, §4.3).

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::Ordering;

use moneta_abi::fsproto::{FsRequest, HOLE};
use moneta_abi::{Completion, Opcode, Status};

use crate::channel::{command, Channel, Tag};
use crate::ClientError;

use super::map::{Map, Plan, Prepared, Seg};
use super::File;
use crate::errno;

/// Bytes a read-side lookup asks for beyond the request, so that a sequential reader takes one
/// soft miss per extent run rather than one per request.
const LOOKUP_AHEAD: u64 = 64 << 20;
/// Most commands one request keeps in flight (each on its own tag).
const MAX_INFLIGHT: usize = 16;
/// Consecutive hard misses without progress before a request gives up with `EIO`: the
/// permission table is too small for even one command's records.
const MAX_FRUITLESS_MISSES: u32 = 1000;

fn gather(bufs: &[IoSlice<'_>]) -> Vec<u8> {
    let mut v = Vec::with_capacity(bufs.iter().map(|b| b.len()).sum());
    for b in bufs {
        v.extend_from_slice(b);
    }
    v
}

/// The user's buffer of one request.
enum Io<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

/// How a run of commands ended short of success.
enum Fail {
    /// A command met `PERMISSION_MISS`; the bytes before buffer offset `.0` completed.
    Miss(usize),
    /// Anything else.
    Err(ClientError),
}

impl File {
    // ----- data path -----

    /// Asks the manager for the extents from file offset `off` (a soft miss), or with
    /// `extend` allocates and grows (`off == APPEND` appends). Returns the lookup's generation
    /// and the size it reported.
    pub(super) fn lookup(
        &self,
        off: u64,
        len: u64,
        extend: bool,
    ) -> Result<(u64, u64), ClientError> {
        let handle = self.h()?;
        let _g = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        let c = &self.m.inner.counters;
        let ctl = self.ch().control();
        let m = if extend {
            c.extends.fetch_add(1, Ordering::Relaxed);
            crate::control::mapped(self.ch().fs(FsRequest::Extend {
                handle,
                offset: off,
                len,
            })?)?
        } else {
            c.soft_misses.fetch_add(1, Ordering::Relaxed);
            // Ahead of the request, only up to what the map already translates: after a hard
            // miss (an evicted record) that is the one extent whose record went, so a table
            // under pressure is not flooded with the records of extents still installed.
            let ahead = {
                let map = self.map.read().unwrap_or_else(|e| e.into_inner());
                let i = map.ext.partition_point(|&(k, _)| k <= off);
                map.ext.get(i).map_or(LOOKUP_AHEAD, |&(k, _)| k - off)
            };
            let ask = len.max(ahead.min(LOOKUP_AHEAD));
            match self.channel_lookup(handle, off, ask) {
                Some(m) => m,
                None => ctl.fs_lookup_mapped(handle, off, ask)?,
            }
        };
        let r = self.apply_mapped(m);
        if extend {
            self.note_growth(handle);
        }
        Ok(r)
    }

    /// Takes a lookup's or an extend's answer into the map (the caller holds `miss`): its
    /// generation and the size it reported.
    pub(super) fn apply_mapped(&self, m: crate::control::Mapped) -> (u64, u64) {
        let (size, exts) = (m.size, m.extents);
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if m.file != map.file {
            // Space left the file since the map was made: what it translates may now be
            // another file's (commands with the old tag could not reach it, but they would
            // miss again and again).
            map.ext.clear();
            map.file = m.file;
        }
        map.gen += 1;
        let gen = map.gen;
        map.size = size;
        for x in &exts {
            if x.len > 0 {
                map.insert(x, gen);
            }
        }
        (gen, size)
    }

    /// The soft miss through the channel ([`Channel::lookup`]); `None` when the device
    /// referred it to the control socket.
    fn channel_lookup(&self, handle: u64, off: u64, len: u64) -> Option<crate::control::Mapped> {
        self.ch().lookup(handle, off, len).ok().flatten()
    }

    /// A hard miss at file offset `at`: forget the translation of that offset, whose records
    /// are gone, so the retry looks it up again. The rest of the map stays: a record evicted
    /// from a full table says nothing about the others, and should space have left the file
    /// (a truncate elsewhere), the other translations cannot reach it (their commands carry
    /// the old layout tag) and the lookup, answering with the new tag, empties the map.
    pub(super) fn hard_miss_at(&self, at: u64, fruitless: &mut u32) -> Result<(), ClientError> {
        self.count_hard_miss(fruitless)?;
        let _g = self.miss.lock().unwrap_or_else(|e| e.into_inner());
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        if let Some((k, _)) = map.at(at) {
            let i = map.ext.partition_point(|&(s, _)| s < k);
            map.ext.remove(i);
        }
        map.gen += 1;
        Ok(())
    }

    /// Counts a hard miss; fails with `EIO` after too many without progress.
    fn count_hard_miss(&self, fruitless: &mut u32) -> Result<(), ClientError> {
        self.m
            .inner
            .counters
            .hard_misses
            .fetch_add(1, Ordering::Relaxed);
        *fruitless += 1;
        if *fruitless > MAX_FRUITLESS_MISSES {
            return Err(ClientError::Refused {
                errno: libc::EIO,
                message: "the permission table cannot hold this request's records".into(),
            });
        }
        if *fruitless > 8 {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Plans `[off, off + len)` from the map into slice-sized segments; for reads, hole runs
    /// looked up by generation `fresh` go to `holes` (buffer offset, length).
    fn plan(
        &self,
        map: &Map,
        off: u64,
        len: usize,
        fresh: Option<u64>,
        segs: &mut Vec<Seg>,
        holes: &mut Vec<(usize, usize)>,
    ) -> Plan {
        segs.clear();
        holes.clear();
        let slice = self.ch().slice_size() as u64;
        let end = off + len as u64;
        let mut at = off;
        while at < end {
            let Some((k, e)) = map.at(at) else {
                return Plan::Miss((at - off) as usize);
            };
            let run_end = end.min(k + e.len);
            if e.dev == HOLE {
                if fresh.is_none_or(|f| e.gen < f) {
                    return Plan::Miss((at - off) as usize);
                }
                holes.push(((at - off) as usize, (run_end - at) as usize));
            } else {
                let mut p = at;
                while p < run_end {
                    let n = (run_end - p).min(slice);
                    segs.push(Seg {
                        dev: e.dev + (p - k),
                        len: n as usize,
                        at: (p - off) as usize,
                        file: map.file,
                    });
                    p += n;
                }
            }
            at = run_end;
        }
        Plan::Ready
    }

    /// Runs `segs` against `io`, up to [`MAX_INFLIGHT`] at once on tags of the channel, each
    /// completed in `mode`.
    fn transfer(&self, io: &mut Io<'_>, segs: &[Seg], mode: Completion) -> Result<(), Fail> {
        let ch = self.ch();
        self.m
            .inner
            .counters
            .commands
            .fetch_add(segs.len() as u64, Ordering::Relaxed);
        let mut spare: [Tag; MAX_INFLIGHT] = [Tag(0); MAX_INFLIGHT];
        let mut nspare = 0usize;
        let mut held = 0usize;
        // Ring of (tag, segment index) in submission order.
        let mut ring: [(Tag, usize); MAX_INFLIGHT] = [(Tag(0), 0); MAX_INFLIGHT];
        let (mut head, mut inflight) = (0usize, 0usize);
        let mut fail: Option<Fail> = None;
        let finish = |tag: Tag, i: usize, io: &mut Io<'_>, fail: &mut Option<Fail>| {
            let seg = segs[i];
            match ch.wait(tag, mode) {
                Ok(c) => match c.status {
                    Status::Ok => {
                        if let Io::Read(buf) = io {
                            ch.read_dma(tag, 0, &mut buf[seg.at..seg.at + seg.len]);
                        }
                    }
                    Status::PermissionMiss => {
                        fail.get_or_insert(Fail::Miss(seg.at));
                    }
                    Status::PermissionDenied => {
                        fail.get_or_insert(Fail::Err(errno(libc::EBADF)));
                    }
                    s => {
                        fail.get_or_insert(Fail::Err(ClientError::Status(s)));
                    }
                },
                Err(e) => {
                    fail.get_or_insert(Fail::Err(e));
                }
            }
        };
        for (i, seg) in segs.iter().enumerate() {
            if fail.is_some() {
                break;
            }
            let tag = if nspare > 0 {
                nspare -= 1;
                spare[nspare]
            } else if held == 0 {
                held += 1;
                ch.tag()
            } else if let Some(t) = (held < MAX_INFLIGHT).then(|| ch.try_tag()).flatten() {
                held += 1;
                t
            } else {
                let (t, j) = ring[head];
                head = (head + 1) % MAX_INFLIGHT;
                inflight -= 1;
                finish(t, j, io, &mut fail);
                if fail.is_some() {
                    spare[nspare] = t;
                    nspare += 1;
                    break;
                }
                t
            };
            let opcode = match io {
                Io::Read(_) => Opcode::Read,
                Io::Write(buf) => {
                    ch.write_dma(tag, 0, &buf[seg.at..seg.at + seg.len]);
                    Opcode::Write
                }
            };
            ch.submit(
                tag,
                &command(opcode, mode, seg.dev, seg.len as u64, seg.file),
            );
            ring[(head + inflight) % MAX_INFLIGHT] = (tag, i);
            inflight += 1;
        }
        while inflight > 0 {
            let (t, j) = ring[head];
            head = (head + 1) % MAX_INFLIGHT;
            inflight -= 1;
            finish(t, j, io, &mut fail);
            spare[nspare] = t;
            nspare += 1;
        }
        for &t in &spare[..nspare] {
            ch.release(t);
        }
        match fail {
            None => Ok(()),
            Some(f) => Err(f),
        }
    }

    /// One command on one tag: the path of a small request inside one extent, kept short
    /// (Moneta-D's point is the instructions between the application and the device).
    ///
    /// `t0` is the request's first stamp when stage timing is on ([`crate::trace`]), else 0.
    #[inline]
    fn one(
        &self,
        io: &mut Io<'_>,
        (dev, file): (u64, u64),
        mode: Completion,
        t0: u64,
    ) -> Result<(), Fail> {
        if t0 != 0 {
            return self.one_traced(io, (dev, file), mode, t0);
        }
        let ch = self.ch();
        let tag = self.command_tag();
        let (opcode, len) = match io {
            Io::Read(b) => (Opcode::Read, b.len()),
            Io::Write(b) => {
                ch.write_dma(tag, 0, b);
                (Opcode::Write, b.len())
            }
        };
        ch.submit(tag, &command(opcode, mode, dev, len as u64, file));
        let r = match ch.wait(tag, mode) {
            Ok(c) => Self::ended(c.status, || {
                if let Io::Read(b) = io {
                    ch.read_dma(tag, 0, b);
                }
            }),
            Err(e) => Err(Fail::Err(e)),
        };
        ch.release(tag);
        r
    }

    /// A tag for one more command of this file's (counted), taken at once when one is free.
    #[inline]
    pub(super) fn command_tag(&self) -> Tag {
        self.command_tag_on(self.ch())
    }

    /// [`File::command_tag`] on `ch`, a channel of this file's connection the caller already
    /// holds (so that the tag is that channel's, whatever a reconnection does meanwhile).
    #[inline]
    pub(super) fn command_tag_on(&self, ch: &Channel) -> Tag {
        self.m
            .inner
            .counters
            .commands
            .fetch_add(1, Ordering::Relaxed);
        match ch.try_tag() {
            Some(t) => t,
            None => ch.tag(),
        }
    }

    /// What a completed command's status means for the request; `copy_out` runs on success.
    #[inline]
    fn ended(status: Status, copy_out: impl FnOnce()) -> Result<(), Fail> {
        match status {
            Status::Ok => {
                copy_out();
                Ok(())
            }
            Status::PermissionMiss => Err(Fail::Miss(0)),
            Status::PermissionDenied => Err(Fail::Err(errno(libc::EBADF))),
            st => Err(Fail::Err(ClientError::Status(st))),
        }
    }

    /// [`File::one`] with a stamp between stages, recorded in the thread's sums.
    #[inline(never)]
    fn one_traced(
        &self,
        io: &mut Io<'_>,
        (dev, file): (u64, u64),
        mode: Completion,
        t0: u64,
    ) -> Result<(), Fail> {
        use crate::trace::{record, stamp, Breakdown};
        let mapped = stamp();
        let ch = self.ch();
        let tag = self.command_tag();
        let mut copy = 0;
        let (opcode, len) = match io {
            Io::Read(b) => (Opcode::Read, b.len()),
            Io::Write(b) => {
                let c0 = stamp();
                ch.write_dma(tag, 0, b);
                copy = stamp() - c0;
                (Opcode::Write, b.len())
            }
        };
        ch.submit(tag, &command(opcode, mode, dev, len as u64, file));
        let submitted = stamp();
        let waited_for = ch.wait(tag, mode);
        let waited = stamp();
        let mut device_ns = 0;
        let mut copied = waited;
        let r = match waited_for {
            Ok(c) => {
                device_ns = c.device_ns;
                Self::ended(c.status, || {
                    if let Io::Read(b) = io {
                        ch.read_dma(tag, 0, b);
                        copied = stamp();
                        copy = copied - waited;
                    }
                })
            }
            Err(e) => Err(Fail::Err(e)),
        };
        ch.release(tag);
        let end = stamp();
        if r.is_ok() {
            record(&Breakdown {
                ops: 1,
                lookup_ns: mapped.saturating_sub(t0),
                submit_ns: submitted
                    .saturating_sub(mapped)
                    .saturating_sub(if opcode == Opcode::Write { copy } else { 0 }),
                copy_ns: copy,
                wait_ns: waited.saturating_sub(submitted),
                device_ns,
                finish_ns: end.saturating_sub(copied),
            });
        }
        r
    }

    /// `pread(2)`: reads at `off` without moving the position; returns bytes read (0 at the
    /// end of the file).
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> Result<usize, ClientError> {
        let mode = self.mode_for(buf.len());
        self.read_at_with(buf, off, mode)
    }

    /// [`File::read_at`] with the completion mode chosen by the caller.
    pub fn read_at_with(
        &self,
        buf: &mut [u8],
        off: u64,
        mode: Completion,
    ) -> Result<usize, ClientError> {
        let t0 = if crate::trace::enabled() {
            crate::trace::stamp()
        } else {
            0
        };
        self.check_access(false)?;
        if buf.is_empty() {
            return Ok(0);
        }
        self.check_range(off, buf.len() as u64, false)?;
        self.h()?;
        // What this file posted lands before the read looks at data (a read answered from
        // the size alone, at or past the end, needs none of it: a posted write published
        // its size first).
        if self.in_place_possible() {
            self.settle()?;
        }
        if let Some(n) = self.read_in_place(buf, off) {
            return Ok(n);
        }
        let slice = self.ch().slice_size();
        // Fast path: all of it inside the known size, one mapped extent, one slice. A read
        // the cached size would cut short takes the slow path, which asks for the size: the
        // file may have grown through another descriptor.
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if off + buf.len() as u64 <= map.size {
                let n = buf.len();
                if n <= slice {
                    if let Some(dev) = map.single(off, n as u64) {
                        drop(map);
                        self.settle()?;
                        match self.one(&mut Io::Read(&mut buf[..n]), dev, mode, t0) {
                            Ok(()) => return Ok(n),
                            Err(Fail::Err(e)) => return Err(e),
                            Err(Fail::Miss(_)) => {
                                let mut f = 0;
                                self.hard_miss_at(off, &mut f)?;
                            }
                        }
                    }
                }
            }
        }
        let mut done = 0usize;
        let mut fruitless = 0u32;
        loop {
            let p = self.prepare_read(off + done as u64, buf.len() - done, &mut fruitless)?;
            if p.len == 0 {
                return Ok(done);
            }
            let part = &mut buf[done..done + p.len];
            for &(h, len) in &p.holes {
                part[h..h + len].fill(0);
            }
            if !p.segs.is_empty() {
                self.settle()?;
            }
            match self.transfer(&mut Io::Read(part), &p.segs, mode) {
                Ok(()) => return Ok(done + p.len),
                Err(Fail::Err(e)) => return Err(e),
                Err(Fail::Miss(i)) => {
                    if i > 0 {
                        fruitless = 0;
                    }
                    done += i;
                    self.hard_miss_at(off + done as u64, &mut fruitless)?;
                }
            }
        }
    }

    /// Maps `[at, at + want)` for a read, looking up what the map lacks: the segments, the
    /// holes to zero, and the bytes the read returns (clipped to the size; 0 at the end).
    pub(crate) fn prepare_read(
        &self,
        at: u64,
        want: usize,
        fruitless: &mut u32,
    ) -> Result<Prepared, ClientError> {
        let mut p = Prepared::default();
        self.prepare_read_into(at, want, fruitless, &mut p)?;
        Ok(p)
    }

    /// [`File::prepare_read`] into `p`, reusing its vectors.
    pub(crate) fn prepare_read_into(
        &self,
        at: u64,
        want: usize,
        fruitless: &mut u32,
        p: &mut Prepared,
    ) -> Result<(), ClientError> {
        // Generation of this request's first lookup: holes looked up since then are trusted.
        let mut fresh: Option<u64> = None;
        let mut asked: Option<u64> = None;
        loop {
            let miss = {
                let map = self.map.read().unwrap_or_else(|e| e.into_inner());
                // Under a size lease the size is known exactly: nobody else moves it. Only a
                // handle open for writing can hold one.
                let leased = self
                    .writable
                    .then(|| self.h().ok())
                    .flatten()
                    .and_then(|h| self.ch().leased_size(h));
                let size = leased.map_or(map.size, |p| p.max(map.size));
                if at >= size {
                    if fresh.is_some() || leased.is_some() {
                        p.len = 0;
                        p.segs.clear();
                        p.holes.clear();
                        return Ok(());
                    }
                    0
                } else {
                    p.len = (want as u64).min(size - at) as usize;
                    match self.plan(&map, at, p.len, fresh, &mut p.segs, &mut p.holes) {
                        // The cached size only cuts a read short once a lookup made for this
                        // read confirmed it, as the kernel reads up to the size of the moment.
                        Plan::Ready if p.len < want && fresh.is_none() && leased.is_none() => p.len,
                        Plan::Ready => return Ok(()),
                        Plan::Miss(i) => i,
                    }
                }
            };
            let from = at + miss as u64;
            if asked.is_some_and(|a| from <= a) {
                // Looked up here already and still unmapped: another thread's hard miss
                // cleared the map in between.
                self.no_progress(fruitless)?;
            }
            asked = Some(from);
            let (gen, _) = self.lookup(from, (want - miss) as u64, false)?;
            fresh.get_or_insert(gen);
        }
    }

    /// Maps `[off, off + len)` for a write, extending the file (allocating holes, growing the
    /// size) where needed: the segments.
    pub(crate) fn prepare_write(
        &self,
        off: u64,
        len: usize,
        fruitless: &mut u32,
    ) -> Result<Prepared, ClientError> {
        let mut p = Prepared::default();
        self.prepare_write_into(off, len, fruitless, &mut p)?;
        Ok(p)
    }

    /// [`File::prepare_write`] into `p`, reusing its vectors.
    pub(crate) fn prepare_write_into(
        &self,
        off: u64,
        len: usize,
        fruitless: &mut u32,
        p: &mut Prepared,
    ) -> Result<(), ClientError> {
        p.len = len;
        let end = off + len as u64;
        let mut asked: Option<u64> = None;
        loop {
            let miss = {
                let map = self.map.read().unwrap_or_else(|e| e.into_inner());
                match self.plan(&map, off, len, None, &mut p.segs, &mut p.holes) {
                    Plan::Ready if end <= map.size || self.grow_in_room(end) => return Ok(()),
                    Plan::Ready => 0,
                    Plan::Miss(i) => i,
                }
            };
            // Past the end or unmapped: the extend call maps what is allocated, allocates the
            // holes and grows the size, in one round trip.
            let from = off + miss as u64;
            if asked.is_some_and(|a| from <= a) {
                self.no_progress(fruitless)?;
            }
            asked = Some(from);
            self.lookup(from, (len - miss) as u64, true)?;
        }
    }

    /// Grows the file to `end` inside the room a size lease gives it, with no call (the
    /// range is mapped already): whether a lease covers it. The size is published before the
    /// write is issued, so a write that returns is inside the size others see.
    fn grow_in_room(&self, end: u64) -> bool {
        let Ok(handle) = self.h() else {
            return false;
        };
        let grown = self.ch().publish_size(handle, end);
        if grown {
            self.grown.store(true, Ordering::Release);
        }
        grown
    }

    fn no_progress(&self, fruitless: &mut u32) -> Result<(), ClientError> {
        *fruitless += 1;
        if *fruitless > MAX_FRUITLESS_MISSES {
            return Err(ClientError::Refused {
                errno: libc::EIO,
                message: "the file's mapping keeps changing under this request".into(),
            });
        }
        std::thread::yield_now();
        Ok(())
    }

    /// `pwrite(2)`: writes all of `data` at `off` without moving the position (on a file
    /// opened for appending, at the end, as Linux does).
    pub fn write_at(&self, data: &[u8], off: u64) -> Result<usize, ClientError> {
        let mode = self.mode_for(data.len());
        self.write_at_with(data, off, mode)
    }

    /// [`File::write_at`] with the completion mode chosen by the caller.
    pub fn write_at_with(
        &self,
        data: &[u8],
        off: u64,
        mode: Completion,
    ) -> Result<usize, ClientError> {
        let at = if self.appends() { None } else { Some(off) };
        self.write_inner(data, at, mode).map(|_| data.len())
    }

    /// Writes `data` at `off`, or at the end with `None`; returns where it landed.
    pub(super) fn write_inner(
        &self,
        data: &[u8],
        off: Option<u64>,
        mode: Completion,
    ) -> Result<u64, ClientError> {
        self.write_with(data, off, mode, true)
    }

    /// Writes `data` at `off` waiting for it, without collecting the writes posted before:
    /// the redo of a posted write, during their collection ([`File::settle`]).
    pub(super) fn write_unposted(&self, data: &[u8], off: u64) -> Result<(), ClientError> {
        let mode = self.mode_for(data.len());
        self.write_with(data, Some(off), mode, false).map(|_| ())
    }

    /// [`File::write_inner`]; with `post`, the write may be posted (under a sole lease), and
    /// one that is not collects those posted before, so that they land first.
    fn write_with(
        &self,
        data: &[u8],
        off: Option<u64>,
        mode: Completion,
        post: bool,
    ) -> Result<u64, ClientError> {
        let t0 = if crate::trace::enabled() {
            crate::trace::stamp()
        } else {
            0
        };
        self.check_access(true)?;
        let len = data.len() as u64;
        let positioned = off.is_some();
        let mut off = match off {
            Some(o) => {
                self.check_range(o, len, true)?;
                o
            }
            None => self.append_at(len)?,
        };
        if data.is_empty() {
            return Ok(off);
        }
        let handle = self.h()?;
        let slice = self.ch().slice_size();
        // Posted under a sole lease where it can be (not once the file is in place: an access
        // in place waits for no command, and the mapping that puts it there ends the lease,
        // after the writes posted before have landed). A write that is not posted collects
        // those posted before, so that they land first.
        let may_post = post && mode != Completion::Forward && t0 == 0 && !self.in_place();
        if !may_post {
            if post {
                self.settle_reporting()?;
            }
            if positioned && self.write_in_place(data, off) {
                return Ok(off);
            }
        }
        let start = off;
        // Fast path: inside the known size (or a size lease's room), one mapped extent, one
        // slice.
        if data.len() <= slice {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(dev) = map.single(off, len) {
                if off + len <= map.size || self.grow_in_room(off + len) {
                    drop(map);
                    if may_post {
                        if let Some(r) = self.post_write(data, dev, off, handle) {
                            return r.map(|()| off);
                        }
                        self.settle_reporting()?;
                    }
                    match self.one(&mut Io::Write(data), dev, mode, t0) {
                        Ok(()) => return Ok(start),
                        Err(Fail::Err(e)) => return Err(e),
                        Err(Fail::Miss(_)) => {
                            let mut f = 0;
                            self.hard_miss_at(off, &mut f)?;
                        }
                    }
                }
            }
        }
        if may_post {
            self.settle_reporting()?;
        }
        let mut data = data;
        let mut fruitless = 0u32;
        loop {
            let p = self.prepare_write(off, data.len(), &mut fruitless)?;
            match self.transfer(&mut Io::Write(data), &p.segs, mode) {
                Ok(()) => return Ok(start),
                Err(Fail::Err(e)) => return Err(e),
                Err(Fail::Miss(i)) => {
                    if i > 0 {
                        fruitless = 0;
                    }
                    off += i as u64;
                    data = &data[i..];
                    self.hard_miss_at(off, &mut fruitless)?;
                }
            }
        }
    }

    /// `read(2)`: reads at the position and advances it.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, ClientError> {
        let mut pos = self.pos.lock();
        let n = self.read_at(buf, pos.get())?;
        pos.set(pos.get() + n as u64);
        Ok(n)
    }

    /// `write(2)`: writes at the position (at the end when appending) and advances it.
    pub fn write(&self, data: &[u8]) -> Result<usize, ClientError> {
        let mut pos = self.pos.lock();
        let mode = self.mode_for(data.len());
        let at = self.write_inner(data, (!self.appends()).then_some(pos.get()), mode)?;
        pos.set(at + data.len() as u64);
        Ok(data.len())
    }

    /// `preadv(2)`: fills the buffers in order from `off`; stops at the end of the file.
    pub fn read_vectored_at(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        off: u64,
    ) -> Result<usize, ClientError> {
        let mut total = 0usize;
        for b in bufs.iter_mut() {
            if b.is_empty() {
                continue;
            }
            let n = self.read_at(b, off + total as u64)?;
            total += n;
            if n < b.len() {
                break;
            }
        }
        Ok(total)
    }

    /// `pwritev(2)`: writes the buffers in order from `off` (as one write, so an appending
    /// writer's buffers stay together).
    pub fn write_vectored_at(&self, bufs: &[IoSlice<'_>], off: u64) -> Result<usize, ClientError> {
        match bufs.iter().filter(|b| !b.is_empty()).count() {
            0 => Ok(0),
            1 => {
                let b = bufs.iter().find(|b| !b.is_empty()).expect("one buffer");
                self.write_at(b, off)
            }
            _ => self.write_at(&gather(bufs), off),
        }
    }

    /// `readv(2)`.
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> Result<usize, ClientError> {
        let mut pos = self.pos.lock();
        let n = self.read_vectored_at(bufs, pos.get())?;
        pos.set(pos.get() + n as u64);
        Ok(n)
    }

    /// `writev(2)`.
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> Result<usize, ClientError> {
        let data = gather(bufs);
        self.write(&data)
    }
}
