//! The measuring threads: offsets, targets, and the loops that time each request on a Moneta
//! channel, a libmoneta file or a kernel file.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use libmoneta::{Channel, Control, Tag};
use moneta_abi::{Command, Completion, Opcode};
use moneta_device::Clock;
use rand::{Rng, SeedableRng};

use super::*;

/// Picks request offsets.
///
/// With several files the region is split into equal parts, one per file, each holding whole
/// requests; a sequential pattern goes through the files one after the other.
pub(crate) struct Offsets {
    pub(crate) rng: rand::rngs::StdRng,
    pub(crate) size: u64,
    pub(crate) slots: u64,
    pub(crate) per_file: u64,
    pub(crate) next: u64,
    pub(crate) sequential: bool,
}

impl Offsets {
    pub(crate) fn new(
        seed: u64,
        size: u64,
        region: u64,
        files: usize,
        sequential: bool,
        thread: usize,
    ) -> Self {
        let files = files.max(1) as u64;
        let per_file = (region / files / size).max(1);
        let slots = per_file * files;
        Offsets {
            rng: rand::rngs::StdRng::seed_from_u64(seed ^ (thread as u64).wrapping_mul(0x9e37)),
            size,
            slots,
            per_file,
            next: (thread as u64 * slots / 8) % slots,
            sequential,
        }
    }
    pub(crate) fn slot(&mut self) -> u64 {
        if self.sequential {
            let s = self.next;
            self.next = (self.next + 1) % self.slots;
            s
        } else {
            self.rng.gen_range(0..self.slots)
        }
    }
    /// The next request's offset (one file).
    pub(crate) fn next(&mut self) -> u64 {
        self.slot() * self.size
    }
    /// The next request's file and offset in it.
    pub(crate) fn next_in(&mut self) -> (usize, u64) {
        let s = self.slot();
        (
            (s / self.per_file) as usize,
            (s % self.per_file) * self.size,
        )
    }
    pub(crate) fn is_write(&mut self, op: Op) -> bool {
        match op {
            Op::Read | Op::Seqread | Op::Nop => false,
            Op::Write | Op::Seqwrite => true,
            Op::Randrw => self.rng.gen_bool(0.5),
        }
    }
}

/// The clock every path's latencies are taken with (the TSC where invariant: cheaper to read
/// than `Instant`, and the same for every path).
pub(crate) fn clock() -> &'static moneta_device::SystemClock {
    static CLOCK: std::sync::OnceLock<moneta_device::SystemClock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(moneta_device::SystemClock::best)
}

pub(crate) fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// A target a run drives: everything set up once per configuration.
pub(crate) enum Target {
    Moneta {
        ch: Arc<RawChannel>,
        daemon_pid: u32,
        completion: CompletionArg,
    },
    File {
        files: Arc<Vec<Arc<libmoneta::File>>>,
        zero_copy: bool,
        daemon_pid: u32,
        completion: CompletionArg,
        /// The daemon's socket, for its trace counters.
        socket: PathBuf,
    },
    Kernel {
        fds: Arc<Vec<OwnedFd>>,
    },
    Uring {
        fds: Arc<Vec<OwnedFd>>,
        sqpoll: bool,
    },
    /// Files mapped into memory: requests are loads and stores.
    Mapped(Arc<Maps>),
    /// Files of a kernel file system on the array through a channel (`KernelFile`); before
    /// each run a read every MiB takes their leases and records back.
    KernelFs {
        files: Arc<Vec<Arc<libmoneta::KernelFile>>>,
        daemon_pid: u32,
        /// The daemon's socket, for its byte counters.
        socket: PathBuf,
        /// Bytes of the region each file holds.
        per_file: u64,
    },
    /// Those files through the kernel's mount, opened for each run and closed after it (an
    /// open descriptor would keep them from the channels).
    KernelReopen {
        paths: Arc<Vec<PathBuf>>,
        direct: bool,
    },
}

/// Files mapped `MAP_SHARED`, read and write, pages populated: (address, length) each,
/// unmapped on drop.
pub(crate) struct Maps(Vec<(usize, usize)>);

impl Maps {
    /// Maps `len` bytes of each of `fds` from offset 0.
    pub(crate) fn of(fds: &[OwnedFd], len: u64) -> Result<Arc<Maps>, String> {
        let mut maps = Maps(Vec::with_capacity(fds.len()));
        for fd in fds {
            let len = len as usize;
            // SAFETY: a new mapping chosen by the kernel, of a file the bench owns.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_POPULATE,
                    std::os::fd::AsRawFd::as_raw_fd(fd),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(format!("mmap: {}", std::io::Error::last_os_error()));
            }
            maps.0.push((p as usize, len));
        }
        Ok(Arc::new(maps))
    }
}

impl Drop for Maps {
    fn drop(&mut self) {
        for &(p, len) in &self.0 {
            // SAFETY: our own mappings, no thread uses them any more.
            unsafe { libc::munmap(p as *mut libc::c_void, len) };
        }
    }
}

/// The raw path's channel and where its region starts on the array.
pub(crate) struct RawChannel {
    pub(crate) ch: ChannelOwner,
    pub(crate) base: u64,
}

pub(crate) enum ChannelOwner {
    /// A connection of its own, granted the region (a `--raw` daemon).
    Bare(Box<Channel>),
    /// The channel of a connection holding the region's file open (the file is kept so its
    /// records stay installed).
    Files(libmoneta::Moneta, #[allow(dead_code)] Box<libmoneta::File>),
}

impl RawChannel {
    pub(crate) fn ch(&self) -> &Channel {
        match &self.ch {
            ChannelOwner::Bare(c) => c,
            ChannelOwner::Files(m, _) => m.channel(),
        }
    }
}

/// When a bench thread stops: at the end of the run's time, or after a number of operations.
pub(crate) struct Stop {
    pub(crate) flag: AtomicBool,
    pub(crate) limit: Option<u64>,
}

impl Stop {
    /// Whether a thread that has completed `ops` operations stops now.
    #[inline]
    pub(crate) fn done(&self, ops: u64) -> bool {
        self.flag.load(Ordering::Relaxed) || self.limit.is_some_and(|l| ops >= l)
    }

    /// Whether a thread that has issued `issued` requests may issue another: with an
    /// operation count, exactly that many complete.
    #[inline]
    pub(crate) fn may_issue(&self, issued: u64) -> bool {
        !self.done(issued)
    }
}

/// One bench thread's work: its latency histogram and operation count.
pub(crate) type ThreadOutcome = Result<(Histogram<u64>, u64), String>;
pub(crate) type Job = Box<dyn FnOnce() -> ThreadOutcome + Send>;

pub(crate) fn run_threads(
    a: &BenchArgs,
    size: u64,
    target: &Target,
    seconds: f64,
    limit: Option<u64>,
) -> Result<RunResult, String> {
    let stop = Arc::new(Stop {
        flag: AtomicBool::new(false),
        limit,
    });
    // The recycled file system's kernel paths hold their descriptors for this run only: they
    // close when `reopened` goes, after the threads are joined.
    let reopened;
    let target = match target {
        Target::KernelReopen { paths, direct } => {
            reopened = Target::Kernel {
                fds: super::kfs::open_kernel(paths, *direct)?,
            };
            &reopened
        }
        t => t,
    };
    let channel0 = match target {
        Target::KernelFs {
            files,
            socket,
            per_file,
            ..
        } => {
            super::kfs::prime(files, *per_file)?;
            let c = Control::connect(socket).map_err(|e| e.to_string())?;
            let st = c.status().map_err(|e| e.to_string())?;
            Some((c, st.bytes_read + st.bytes_written))
        }
        _ => None,
    };
    let cpu0 = rusage_self();
    let dev0 = match target {
        Target::Moneta { daemon_pid, .. }
        | Target::File { daemon_pid, .. }
        | Target::KernelFs { daemon_pid, .. } => proc_cpu(*daemon_pid),
        _ => None,
    };
    let traced = match target {
        Target::File { socket, .. } if a.breakdown => {
            let c = Control::connect(socket).map_err(|e| e.to_string())?;
            let before = c.status().map_err(|e| e.to_string())?;
            breakdown::begin();
            Some((c, before))
        }
        _ => None,
    };
    let stats = |t: &Target| match t {
        Target::File { files, .. } => files.first().map(|f| f.moneta().stats()),
        _ => None,
    };
    let stats0 = stats(target);
    let start = Instant::now();
    let mut handles = Vec::new();
    for t in 0..a.threads {
        let stop = stop.clone();
        let count = a.count_instructions;
        let a = a.clone();
        let job: Job = match target {
            Target::Moneta { ch, completion, .. } => {
                let ch = ch.clone();
                let mode = completion.mode(size);
                Box::new(move || moneta_thread(&a, size, &ch, mode, t, &stop))
            }
            Target::File {
                files,
                completion,
                zero_copy,
                ..
            } => {
                let files = files.clone();
                let mode = completion.mode(size);
                let zc = *zero_copy;
                Box::new(move || files::file_thread(&a, size, &files, mode, zc, t, &stop))
            }
            Target::Kernel { fds } => {
                let fds = fds.clone();
                Box::new(move || kernel_thread(&a, size, &fds, t, &stop))
            }
            Target::Uring { fds, sqpoll } => {
                let fds = fds.clone();
                let sqpoll = *sqpoll;
                Box::new(move || uring::uring_thread(&a, size, &fds[0], sqpoll, t, &stop))
            }
            Target::Mapped(maps) => {
                let maps = maps.clone();
                Box::new(move || mapped_thread(&a, size, &maps, t, &stop))
            }
            Target::KernelFs { files, .. } => {
                let files = files.clone();
                Box::new(move || super::kfs::kfs_thread(&a, size, &files, t, &stop))
            }
            Target::KernelReopen { .. } => unreachable!("opened above"),
        };
        handles.push(std::thread::spawn(move || {
            let counter = count.then(instructions::Counter::start);
            let out = job();
            (out, counter.map(|c| c.finish()))
        }));
    }
    if limit.is_none() {
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.flag.store(true, Ordering::Relaxed);
    }
    let mut hist = new_hist();
    let mut ops = 0;
    let mut counted: Option<Result<instructions::Count, String>> = None;
    for h in handles {
        let (out, count) = h
            .join()
            .map_err(|_| "a bench thread panicked".to_string())?;
        let (th, n) = out?;
        hist.add(&th).map_err(|e| e.to_string())?;
        ops += n;
        counted = match (counted, count) {
            (None, c) => c,
            (Some(Ok(a)), Some(Ok(b))) => Some(Ok(a.add(b))),
            (Some(Err(e)), _) | (_, Some(Err(e))) => Some(Err(e)),
            (c, None) => c,
        };
    }
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = sub(rusage_self(), cpu0);
    let misses = match (stats0, stats(target)) {
        (Some(a), Some(b)) => Some((b.soft_misses - a.soft_misses, b.hard_misses - a.hard_misses)),
        _ => None,
    };
    let trace = match traced {
        Some((c, before)) => {
            let after = c.status().map_err(|e| e.to_string())?;
            Some(breakdown::end(&before, &after))
        }
        None => None,
    };
    let device_cpu = match (target, dev0) {
        (
            Target::Moneta { daemon_pid, .. }
            | Target::File { daemon_pid, .. }
            | Target::KernelFs { daemon_pid, .. },
            Some(d0),
        ) => proc_cpu(*daemon_pid).map(|d| sub(d, d0)),
        _ => None,
    };
    let channel_bytes = match channel0 {
        Some((c, before)) => {
            let st = c.status().map_err(|e| e.to_string())?;
            Some((st.bytes_read + st.bytes_written).saturating_sub(before))
        }
        None => None,
    };
    Ok(RunResult {
        hist,
        ops,
        seconds: elapsed,
        cpu,
        device_cpu,
        trace,
        misses,
        instructions: counted,
        model: None,
        neighbour_mib_s: None,
        channel_bytes,
    })
}

/// What every bench thread starts with: its offsets, histogram, buffer and the clock.
pub(crate) fn thread_state(
    a: &BenchArgs,
    size: u64,
    thread: usize,
) -> (
    Offsets,
    Histogram<u64>,
    Vec<u8>,
    &'static moneta_device::SystemClock,
) {
    let sequential = matches!(a.op, Op::Seqread | Op::Seqwrite);
    let offs = Offsets::new(a.seed, size, a.region, a.open_files, sequential, thread);
    (offs, new_hist(), vec![0x5au8; size as usize], clock())
}

/// Slices of the DMA buffer each request slot of the raw path may use: the channel's 64
/// shared evenly by every thread's slots.
pub(crate) fn raw_slot_slices(a: &BenchArgs) -> usize {
    (moneta_abi::TAGS_PER_CHANNEL / (a.threads * a.qd)).max(1)
}

/// The raw path: one command per request where it fits the slot's share of the DMA buffer,
/// else consecutive commands of that share (as a driver splits a large request), the request
/// ending with the last.
pub(crate) fn moneta_thread(
    a: &BenchArgs,
    size: u64,
    raw: &RawChannel,
    mode: Completion,
    thread: usize,
    stop: &Stop,
) -> Result<(Histogram<u64>, u64), String> {
    let ch = raw.ch();
    let base = raw.base;
    let qd = a.qd;
    let slot_slices = raw_slot_slices(a);
    let piece = (slot_slices * ch.slice_size()) as u64;
    let pieces = size.div_ceil(piece);
    let first = thread * qd * slot_slices;
    let tags: Vec<Tag> = (0..qd)
        .map(|i| Tag((first + i * slot_slices) as u8))
        .collect();
    let (mut offs, mut hist, mut buf, clk) = thread_state(a, size, thread);
    let mut ops = 0u64;
    let nop = a.op == Op::Nop;
    // Per slot: started, write, request address, next piece.
    let mut started = vec![0u64; qd];
    let mut writes = vec![false; qd];
    let mut addrs = vec![0u64; qd];
    let mut next = vec![0u64; qd];
    let send = |i: usize, k: u64, w: bool, addr: u64, buf: &[u8]| {
        let at = k * piece;
        let len = piece.min(size - at);
        if w && !nop {
            ch.write_dma(tags[i], 0, &buf[at as usize..(at + len) as usize]);
        }
        let opcode = match (nop, w) {
            (true, _) => Opcode::Nop,
            (false, true) => Opcode::Write,
            (false, false) => Opcode::Read,
        };
        ch.submit(
            tags[i],
            &Command {
                opcode,
                completion: mode,
                addr: if nop { 0 } else { base + addr + at },
                len: if nop { 0 } else { len },
                cookie: 0,
                seq: 0,
                // Raw commands: the records' file is not asked for.
                file: 0,
                barrier: false,
                epoch: 0,
            },
        );
    };
    let start = |i: usize,
                 offs: &mut Offsets,
                 buf: &[u8],
                 started: &mut [u64],
                 writes: &mut [bool],
                 addrs: &mut [u64],
                 next: &mut [u64]| {
        let w = offs.is_write(a.op);
        let addr = offs.next();
        started[i] = clk.now_ns();
        writes[i] = w;
        addrs[i] = addr;
        next[i] = 1;
        send(i, 0, w, addr, buf);
    };
    let (mut issued, mut live) = (0u64, 0usize);
    for i in 0..qd {
        if stop.may_issue(issued) {
            start(
                i,
                &mut offs,
                &buf,
                &mut started,
                &mut writes,
                &mut addrs,
                &mut next,
            );
            issued += 1;
            live += 1;
        }
    }
    let mut i = 0;
    while live > 0 {
        if next[i] == 0 {
            // This slot finished its last request.
            i = (i + 1) % qd;
            continue;
        }
        let c = ch.wait(tags[i], mode).map_err(|e| e.to_string())?;
        if c.status != moneta_abi::Status::Ok {
            return Err(format!("device status {}", c.status.name()));
        }
        let k = next[i] - 1;
        if !writes[i] && !nop {
            let at = (k * piece) as usize;
            let len = piece.min(size - k * piece) as usize;
            ch.read_dma(tags[i], 0, &mut buf[at..at + len]);
        }
        if next[i] < pieces {
            send(i, next[i], writes[i], addrs[i], &buf);
            next[i] += 1;
            continue;
        }
        let ns = clk.now_ns().saturating_sub(started[i]);
        hist.record(ns.max(1)).ok();
        ops += 1;
        if stop.may_issue(issued) {
            start(
                i,
                &mut offs,
                &buf,
                &mut started,
                &mut writes,
                &mut addrs,
                &mut next,
            );
            issued += 1;
        } else {
            next[i] = 0;
            live -= 1;
        }
        i = (i + 1) % qd;
    }
    Ok((hist, ops))
}

pub(crate) fn kernel_thread(
    a: &BenchArgs,
    size: u64,
    fds: &[OwnedFd],
    thread: usize,
    stop: &Stop,
) -> Result<(Histogram<u64>, u64), String> {
    let (mut offs, mut hist, _, clk) = thread_state(a, size, thread);
    // Aligned for O_DIRECT (the kernel-odirect paths); the same for every kernel path.
    let mut buf = crate::loopfs::aligned_buffer(size as usize);
    buf.fill(0x5a);
    let mut ops = 0u64;
    while !stop.done(ops) {
        let w = offs.is_write(a.op);
        let (i, addr) = offs.next_in();
        let fd = &fds[i];
        let t = clk.now_ns();
        let r = if w {
            rustix::io::pwrite(fd, &buf, addr)
        } else {
            rustix::io::pread(fd, &mut buf[..], addr)
        };
        let ns = clk.now_ns().saturating_sub(t);
        match r {
            Ok(n) if n as u64 == size => {}
            Ok(n) => return Err(format!("short transfer: {n} of {size}")),
            Err(e) => return Err(format!("kernel I/O failed: {e}")),
        }
        hist.record(ns.max(1)).ok();
        ops += 1;
    }
    Ok((hist, ops))
}

/// The mapped paths: a read copies from the mapping, a write copies into it.
pub(crate) fn mapped_thread(
    a: &BenchArgs,
    size: u64,
    maps: &Maps,
    thread: usize,
    stop: &Stop,
) -> Result<(Histogram<u64>, u64), String> {
    let (mut offs, mut hist, mut buf, clk) = thread_state(a, size, thread);
    let mut ops = 0u64;
    while !stop.done(ops) {
        let w = offs.is_write(a.op);
        let (i, addr) = offs.next_in();
        let (base, len) = maps.0[i];
        if addr + size > len as u64 {
            return Err(format!("offset {addr} past the mapping's {len} bytes"));
        }
        let p = (base + addr as usize) as *mut u8;
        let t = clk.now_ns();
        // SAFETY: inside the mapping (checked above); `buf` holds `size` bytes.
        unsafe {
            if w {
                std::ptr::copy_nonoverlapping(buf.as_ptr(), p, size as usize);
            } else {
                std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), size as usize);
            }
        }
        std::hint::black_box(&mut buf);
        let ns = clk.now_ns().saturating_sub(t);
        hist.record(ns.max(1)).ok();
        ops += 1;
    }
    Ok((hist, ops))
}
