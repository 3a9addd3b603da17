//! The `moneta` paths: files on nvfs through libmoneta, as an application uses them.
//!
//! At queue depth 1 a thread calls `read_at`/`write_at`; deeper, it keeps `--qd` asynchronous
//! requests in flight (each on its own buffer), waits for the oldest, and submits the next in
//! its place. `moneta-zero-copy` moves no bytes through the caller's memory: a read leaves its
//! data in the request's DMA slice (`submit_read_in_place`), a write is submitted from a DMA
//! slice the application fills in place (`write_slot`; here the slice keeps the bytes it
//! has, as the other paths write a buffer prepared once).

use std::collections::VecDeque;

use libmoneta::{File, Pending};
use moneta_abi::Completion;
use moneta_device::Clock;

use super::{thread_state, BenchArgs, ThreadOutcome};

pub(super) fn file_thread<'f>(
    a: &BenchArgs,
    size: u64,
    files: &'f [std::sync::Arc<File>],
    mode: Completion,
    zero_copy: bool,
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
    if a.qd == 1 && !zero_copy {
        while !stop.done(ops) {
            let w = offs.is_write(a.op);
            let (i, off) = offs.next_in();
            let f = &files[i];
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
        super::breakdown::hand_in();
        return Ok((hist, ops));
    }
    let mut bufs: Vec<Vec<u8>> = if zero_copy {
        Vec::new()
    } else {
        (0..a.qd).map(|_| vec![0x5au8; n]).collect()
    };
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    let mut q: VecDeque<(Pending<'f>, usize, u64)> = VecDeque::with_capacity(a.qd);
    let fill = |slot: usize,
                q: &mut VecDeque<(Pending<'f>, usize, u64)>,
                offs: &mut super::Offsets|
     -> Result<(), String> {
        let w = offs.is_write(a.op);
        let (i, off) = offs.next_in();
        let f: &'f File = &files[i];
        let t = clk.now_ns();
        let r = if zero_copy {
            if w {
                f.write_slot(n).and_then(|s| s.submit(off))
            } else {
                f.submit_read_in_place(off, n)
            }
        } else {
            // SAFETY: each slot's buffer lives until the end of this function and is used by
            // one request at a time: a slot is submitted again only after its request was
            // waited for.
            unsafe {
                if w {
                    f.submit_write_raw(ptrs[slot], n, off, Some(mode))
                } else {
                    f.submit_read_raw(ptrs[slot], n, off, Some(mode))
                }
            }
        };
        q.push_back((r.map_err(|e| format!("libmoneta submit: {e}"))?, slot, t));
        Ok(())
    };
    let mut issued = 0u64;
    for slot in 0..a.qd {
        if stop.may_issue(issued) {
            fill(slot, &mut q, &mut offs)?;
            issued += 1;
        }
    }
    while let Some((mut p, slot, t)) = q.pop_front() {
        let r = p.wait();
        let ns = clk.now_ns().saturating_sub(t);
        if zero_copy {
            // The application reads its data where the device left it.
            std::hint::black_box(p.data().first());
        }
        drop(p);
        check(r)?;
        hist.record(ns.max(1)).ok();
        ops += 1;
        if stop.may_issue(issued) {
            fill(slot, &mut q, &mut offs)?;
            issued += 1;
        }
    }
    drop(bufs);
    buf.clear();
    Ok((hist, ops))
}
