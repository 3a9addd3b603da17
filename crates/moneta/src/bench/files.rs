//! The `moneta` path: files on nvfs through libmoneta, as an application uses them.
//!
//! At queue depth 1 a thread calls `read_at`/`write_at`; deeper, it keeps `--qd` asynchronous
//! requests in flight (each on its own buffer), waits for the oldest, and submits the next in
//! its place.

use std::collections::VecDeque;

use libmoneta::{File, Pending};
use moneta_abi::Completion;
use moneta_device::Clock;

use super::{thread_state, BenchArgs, ThreadOutcome};

pub(super) fn file_thread<'f>(
    a: &BenchArgs,
    size: u64,
    f: &'f File,
    mode: Completion,
    thread: usize,
    stop: &super::Stop,
) -> ThreadOutcome {
    let (mut offs, mut hist, mut buf, clk) = thread_state(a, size, thread);
    let mut ops = 0u64;
    let n = size as usize;
    let check = |r: Result<usize, libmoneta::ClientError>| match r {
        Ok(got) if got == n => Ok(()),
        Ok(got) => Err(format!("short transfer: {got} of {size}")),
        Err(e) => Err(format!("libmoneta: {e}")),
    };
    if a.qd == 1 {
        while !stop.done(ops) {
            let w = offs.is_write(a.op);
            let off = offs.next();
            let t = clk.now_ns();
            let r = if w {
                f.write_at_with(&buf, off, mode)
            } else {
                f.read_at_with(&mut buf, off, mode)
            };
            let ns = clk.now_ns().saturating_sub(t);
            check(r)?;
            hist.record(ns.max(1)).ok();
            ops += 1;
        }
        return Ok((hist, ops));
    }
    let mut bufs: Vec<Vec<u8>> = (0..a.qd).map(|_| vec![0x5au8; n]).collect();
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    let mut q: VecDeque<(Pending<'f>, usize, u64)> = VecDeque::with_capacity(a.qd);
    let fill = |slot: usize,
                q: &mut VecDeque<(Pending<'f>, usize, u64)>,
                offs: &mut super::Offsets|
     -> Result<(), String> {
        let w = offs.is_write(a.op);
        let off = offs.next();
        let t = clk.now_ns();
        // SAFETY: each slot's buffer lives until the end of this function and is used by one
        // request at a time: a slot is submitted again only after its request was waited for.
        let r = unsafe {
            if w {
                f.submit_write_raw(ptrs[slot], n, off, Some(mode))
            } else {
                f.submit_read_raw(ptrs[slot], n, off, Some(mode))
            }
        };
        q.push_back((r.map_err(|e| format!("libmoneta submit: {e}"))?, slot, t));
        Ok(())
    };
    for slot in 0..a.qd {
        fill(slot, &mut q, &mut offs)?;
    }
    while let Some((mut p, slot, t)) = q.pop_front() {
        let r = p.wait();
        let ns = clk.now_ns().saturating_sub(t);
        drop(p);
        check(r)?;
        hist.record(ns.max(1)).ok();
        ops += 1;
        if !stop.done(ops) {
            fill(slot, &mut q, &mut offs)?;
        }
    }
    drop(bufs);
    Ok((hist, ops))
}
