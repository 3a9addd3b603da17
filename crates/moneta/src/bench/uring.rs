//! The `kernel-uring` paths: io_uring on the kernel's file, with the settings that make it
//! fastest here, so the comparison is with the kernel at its best.
//!
//! Every thread has its own ring with the file registered (fixed file) and one registered
//! buffer per request slot (`READ_FIXED`/`WRITE_FIXED`, no page pinning per request).
//! - `kernel-uring`: `SINGLE_ISSUER | DEFER_TASKRUN`; completions are reaped with
//!   `io_uring_enter(GETEVENTS)` (one system call submits and waits).
//! - `kernel-uring-sqpoll`: a kernel thread polls the submission queue (`SQPOLL`, idle after
//!   2 s); the application never enters the kernel while that thread is awake, and spins on
//!   the completion queue, as a Moneta client spins on its tag.

use std::os::fd::{AsRawFd, OwnedFd};

use io_uring::{opcode, types, IoUring};
use moneta_device::Clock;

use super::{thread_state, BenchArgs, ThreadOutcome};

/// Milliseconds an idle SQPOLL thread keeps polling before it sleeps.
const SQPOLL_IDLE_MS: u32 = 2000;

pub(super) fn uring_thread(
    a: &BenchArgs,
    size: u64,
    fd: &OwnedFd,
    sqpoll: bool,
    thread: usize,
    stop: &super::Stop,
) -> ThreadOutcome {
    let qd = a.qd;
    // Room for a full queue of new entries while the kernel still holds the slots of the
    // ones it completed (it releases them at the end of a submission batch).
    let entries = (2 * qd as u32).next_power_of_two().max(8);
    let mut b = IoUring::builder();
    if sqpoll {
        b.setup_sqpoll(SQPOLL_IDLE_MS);
    } else if std::env::var("URING_PLAIN").is_err() {
        b.setup_single_issuer().setup_defer_taskrun();
    }
    let mut ring = b
        .build(entries)
        .map_err(|e| format!("io_uring_setup: {e}"))?;
    ring.submitter()
        .register_files(&[fd.as_raw_fd()])
        .map_err(|e| format!("register files: {e}"))?;
    let (mut offs, mut hist, _, clk) = thread_state(a, size, thread);
    let mut bufs: Vec<Vec<u8>> = (0..qd).map(|_| vec![0x5au8; size as usize]).collect();
    let iov: Vec<libc::iovec> = bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        })
        .collect();
    // SAFETY: the buffers live until the ring is dropped at the end of this function.
    unsafe { ring.submitter().register_buffers(&iov) }
        .map_err(|e| format!("register buffers: {e}"))?;
    let mut started = vec![0u64; qd];
    let mut ops = 0u64;
    let mut inflight = 0usize;
    let len = size as u32;
    let push = |ring: &mut IoUring, i: usize, offs: &mut super::Offsets, started: &mut [u64]| {
        let w = offs.is_write(a.op);
        let off = offs.next();
        let ptr = iov[i].iov_base.cast::<u8>();
        let sqe = if w {
            opcode::WriteFixed::new(types::Fixed(0), ptr, len, i as u16)
                .offset(off)
                .build()
        } else {
            opcode::ReadFixed::new(types::Fixed(0), ptr, len, i as u16)
                .offset(off)
                .build()
        }
        .user_data(i as u64);
        started[i] = clk.now_ns();
        // SAFETY: the entry names a registered buffer that stays alive and untouched until
        // its completion is reaped.
        unsafe { ring.submission().push(&sqe) }.map_err(|_| "submission queue full".to_string())
    };
    let mut issued = 0u64;
    for i in 0..qd {
        if stop.may_issue(issued) {
            push(&mut ring, i, &mut offs, &mut started)?;
            inflight += 1;
            issued += 1;
        }
    }
    // Completions of one reap (kept across reaps: no allocation on the path).
    let mut done: Vec<(usize, i32)> = Vec::with_capacity(2 * qd);
    while inflight > 0 {
        if sqpoll {
            // Wakes the polling thread only if it went to sleep.
            ring.submit().map_err(|e| format!("io_uring_enter: {e}"))?;
            let mut spins = 0u32;
            while ring.completion().is_empty() {
                spins += 1;
                if spins.is_multiple_of(1 << 16) {
                    ring.submit().map_err(|e| format!("io_uring_enter: {e}"))?;
                }
                std::hint::spin_loop();
            }
        } else {
            ring.submit_and_wait(1)
                .map_err(|e| format!("io_uring_enter: {e}"))?;
        }
        done.clear();
        done.extend(
            ring.completion()
                .map(|c| (c.user_data() as usize, c.result())),
        );
        let now = clk.now_ns();
        for &(i, res) in &done {
            inflight -= 1;
            if res < 0 {
                return Err(format!(
                    "io_uring request failed: {}",
                    std::io::Error::from_raw_os_error(-res)
                ));
            }
            if res as u64 != size {
                return Err(format!("short transfer: {res} of {size}"));
            }
            hist.record(now.saturating_sub(started[i]).max(1)).ok();
            ops += 1;
            if stop.may_issue(issued) {
                push(&mut ring, i, &mut offs, &mut started)?;
                inflight += 1;
                issued += 1;
            }
        }
    }
    Ok((hist, ops))
}
