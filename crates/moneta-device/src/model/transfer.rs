//! A transfer's way through the array: a scheduler buffer, the ring and the link, its memory
//! controller's rows (wear leveling, row buffers, power-down), and the DRAM buffer in front.

use super::*;

impl Model {
    /// The earliest start at or after `from` for which a scheduler buffer is free over the
    /// span `stages` gives: `stages(x)` answers the span `(start, end)` the transfer's
    /// stages would take if they started at `x`. Returns (x, buffer, span).
    #[inline(always)]
    pub(super) fn find_buffer(
        &self,
        from: u64,
        stages: impl Fn(&Model, u64) -> (u64, u64),
    ) -> (u64, usize, (u64, u64)) {
        let mut x = from;
        loop {
            let (s, e) = stages(self, x);
            let mut next = u64::MAX;
            for (b, cal) in self.buffers.iter().enumerate() {
                match cal.conflict(s, e) {
                    None => return (x, b, (s, e)),
                    // Each round moves past a booked span, so this ends.
                    Some(end) => next = next.min(end),
                }
            }
            x = next.max(x + 1);
        }
    }

    /// Books what [`Model::find_buffer`] found.
    pub(super) fn hold_buffer(&mut self, b: usize, (s, e): (u64, u64)) {
        self.buffers[b].book(s, e - s);
        self.buffer_busy += e - s;
        if e > self.sched_busy_until {
            self.sched_busy += e - s.max(self.sched_busy_until);
            self.sched_busy_until = e;
        }
    }

    /// The span a read's data holds a scheduler buffer, from the ring to the end of the DMA,
    /// were it to reach the ring at `x`.
    pub(super) fn read_stages(len_ring: u64, len_link: u64) -> impl Fn(&Model, u64) -> (u64, u64) {
        move |m: &Model, x: u64| {
            let rs = m.ring.fit(x, len_ring);
            let ls = m.link_up.fit(rs + len_ring, len_link);
            (rs, ls + len_link)
        }
    }

    /// The span a write holds a scheduler buffer, from the DMA's start until the ring has
    /// carried the data into its controller's incoming queue (once that has room, `inq`),
    /// were it to start at `x`.
    pub(super) fn write_stages(
        len_ring: u64,
        len_link: u64,
        inq: u64,
    ) -> impl Fn(&Model, u64) -> (u64, u64) {
        move |m: &Model, x: u64| {
            let ls = m.link_down.fit(x, len_link);
            let rs = m.ring.fit((ls + len_link).max(inq), len_ring);
            (ls, rs + len_ring)
        }
    }

    /// Ring and link times of `len` bytes.
    pub(super) fn wire(&self, len: u64) -> (u64, u64) {
        (
            self.ring_ps.dur(len),
            self.link_overhead + self.link_ps.dur(len),
        )
    }

    /// Bytes of the next transfer of `r`.
    pub(super) fn next_len(&self, r: &Req) -> u64 {
        let end = r.s.addr + r.s.len;
        let piece = self.piece;
        let boundary = (piece.div_rem(r.next).0 + 1) * piece.d;
        boundary.min(end) - r.next
    }

    /// The controller's work on one transfer, booked from `ready`: opens, moves and (for
    /// writes) writes back each row; returns (start, when the data has left or entered the
    /// queue, end).
    #[inline(always)]
    pub(super) fn controller_work(
        &mut self,
        ci: usize,
        local: u64,
        len: u64,
        write: bool,
        ready: u64,
    ) -> (u64, u64, u64) {
        let row = self.cfg.row;
        let row_bits = row * 8;
        let selective = self.cfg.power.selective_writes;
        let (banks, row_div, ctrl_ps) = (self.banks, self.row, self.ctrl_ps);
        let (read_lat, write_lat) = (self.read_lat, self.write_lat);
        let (wake, after, clock) = (self.wake, self.powerdown_after, self.clock);
        let c = &mut self.ctrls[ci];
        // The time the work takes, and its effect on rows, wear and energy.
        let mut d = 0u64;
        let mut moved = 0u64;
        let mut bits = Bits::default();
        let end = local + len;
        let mut at = local;
        // The first rows a write wears (a transfer of the usual geometry wears one), counted
        // once the work is booked so that the count's cache miss overlaps it.
        let mut worn = [0usize; 4];
        let mut rows_worn = 0;
        while at < end {
            let r = row_div.div_rem(at).0;
            let n = ((r + 1) * row).min(end) - at;
            at += n;
            let p = c.wear_level.map(r);
            let bank = banks.div_rem(p).1 as usize;
            let open = c.open[bank] == Some(p);
            if write {
                if n < row && !open {
                    // A partial row is read in before it is written back whole.
                    c.row_misses += 1;
                    d += read_lat;
                    bits.array_read += row_bits;
                } else {
                    c.row_hits += u64::from(open);
                }
                d += ctrl_ps.dur(n);
                moved = d;
                bits.buffer_written += n * 8;
                d += write_lat;
                bits.array_written += if selective { n * 8 } else { row_bits };
                c.open[bank] = None;
                if rows_worn < worn.len() {
                    c.wear.prefetch(p as usize);
                    worn[rows_worn] = p as usize;
                    rows_worn += 1;
                } else {
                    c.wear.bump(p as usize);
                }
                let moved = c.wear_level.wrote();
                c.wear.save_registers(c.wear_level.registers());
                if let Some(m) = moved {
                    // The gap move copies one row inside the memory: read it, write it back.
                    c.gap_moves += 1;
                    d += read_lat + write_lat;
                    bits.array_read += row_bits;
                    bits.array_written += row_bits;
                    c.wear.bump(m.to as usize);
                    for slot in c.open.iter_mut() {
                        if *slot == Some(m.from) || *slot == Some(m.to) {
                            *slot = None;
                        }
                    }
                }
            } else {
                if open {
                    c.row_hits += 1;
                } else {
                    c.row_misses += 1;
                    c.open[bank] = Some(p);
                    d += read_lat;
                    bits.array_read += row_bits;
                }
                d += ctrl_ps.dur(n);
                moved = d;
                bits.buffer_read += n * 8;
            }
        }
        c.core.prune(clock);
        let mut start = c.core.fit(ready, d);
        // The memory wakes for the access if it powered down.
        let woke = if !c.woken {
            c.woken = true;
            c.awake_since = start;
            start + wake
        } else if start > c.last_end + after {
            // It powered down `after` past its last access.
            c.awake_total += c.last_end + after - c.awake_since;
            c.awake_since = start;
            start + wake
        } else {
            start
        };
        if woke > start {
            start = c.core.fit(woke, d);
        }
        let end = c.core.book(start, d);
        c.queue_wait += start - ready;
        c.transfers += 1;
        c.last_end = c.last_end.max(end);
        for &p in &worn[..rows_worn] {
            c.wear.bump(p);
        }
        let w = &mut self.work.bits;
        w.array_read += bits.array_read;
        w.array_written += bits.array_written;
        w.buffer_read += bits.buffer_read;
        w.buffer_written += bits.buffer_written;
        (start, start + moved, end)
    }

    /// A read transfer issued at `t` (its controller's outgoing queue has room): returns when
    /// it ends, its data in the host.
    pub(super) fn read_transfer(&mut self, ci: usize, local: u64, len: u64, t: u64) -> u64 {
        let (_, data, _) = self.controller_work(ci, local, len, false, t);
        let (ring_d, link_d) = self.wire(len);
        let (_, b, span) = self.find_buffer(data, Model::read_stages(ring_d, link_d));
        self.hold_buffer(b, span);
        // The span is the ring's start to the link's end, as the stages found them free.
        let ring_end = self.ring.book(span.0, ring_d);
        let link_end = self.link_up.book(span.1 - link_d, link_d);
        self.ctrls[ci].outq_free = ring_end;
        link_end
    }

    /// A read transfer issued at `t` with a DRAM buffer: a hit (every line it covers in the
    /// buffer) waits for its lines' data, then costs the buffer's latency and rate and the
    /// link; a miss reads the lines it covers whole from the array into the buffer (the ring
    /// carries them all, the link what was asked). Returns when it ends, its data in the host.
    pub(super) fn buffered_read(
        &mut self,
        ci: usize,
        local: u64,
        addr: u64,
        len: u64,
        t: u64,
    ) -> u64 {
        let buf = self.buffer.as_mut().expect("a buffer");
        let (first, last) = (buf.line_of(addr), buf.line_of(addr + len - 1));
        if buf.holds(first, last) {
            let ready = buf.read(first, last);
            buf.stats.hits += 1;
            buf.stats.waited += u64::from(ready > t);
            let data = t.max(ready) + self.buffer_lat + self.buffer_ps.dur(len);
            let link_d = self.link_overhead + self.link_ps.dur(len);
            let ls = self.link_up.fit(data, link_d);
            return self.link_up.book(ls, link_d);
        }
        buf.stats.misses += 1;
        // The lines lie in the transfer's stripe (a line divides the stripe and the largest
        // transfer), so in its controller.
        let lo = buf.start_of(first);
        let hi = buf.start_of(last + 1);
        let (_, data, _) = self.controller_work(ci, local - (addr - lo), hi - lo, false, t);
        let ring_d = self.ring_ps.dur(hi - lo);
        let link_d = self.link_overhead + self.link_ps.dur(len);
        let (_, b, span) = self.find_buffer(data, Model::read_stages(ring_d, link_d));
        self.hold_buffer(b, span);
        let ring_end = self.ring.book(span.0, ring_d);
        let link_end = self.link_up.book(span.1 - link_d, link_d);
        self.ctrls[ci].outq_free = ring_end;
        let buf = self.buffer.as_mut().expect("a buffer");
        for l in first..=last {
            buf.fill(l, ring_end, Fill::Demand);
        }
        link_end
    }

    /// Read-ahead after a read ending at `from`: the lines of the next
    /// [`ModelConfig::readahead`] bytes that lie before `reach` (the end of the read's extent)
    /// and are not in the buffer are filled from the array, from `t`.
    pub(super) fn read_ahead(&mut self, from: u64, reach: u64, t: u64) {
        let end = from
            .saturating_add(self.cfg.readahead)
            .min(reach)
            .min(self.size);
        if end > from {
            self.fill_lines(from, end, t, Fill::Ahead);
        }
    }

    /// A client's hint that `[addr, addr + len)` will be read soon, arriving at `now_ns`: the
    /// lines of the range not in the buffer are filled from the array (at most
    /// [`HINT_LINES`] of them, and at most as many as the buffer holds, from the range's
    /// start); those in it become recent. Without a buffer the hint has nothing to fill.
    pub fn hint(&mut self, addr: u64, len: u64, now_ns: u64) {
        let Some(buf) = self.buffer.as_ref() else {
            return;
        };
        let t = (now_ns * PS).max(self.clock);
        self.now = self.now.max(now_ns * PS);
        self.origin.get_or_insert(t);
        let most = (buf.capacity() as u64).min(HINT_LINES) * self.cfg.buffer_line;
        let end = addr.saturating_add(len.min(most)).min(self.size);
        if end > addr {
            // What it books can change when the next transfer issues.
            self.next_cache = None;
            self.fill_lines(addr, end, t, Fill::Hint);
        }
    }

    /// Fills the lines of `[from, to)` that the buffer lacks, from `t`: each run of missing
    /// lines within a stripe is one read of the array, carried by the ring into the buffer
    /// (the link is not used). Lines already there become recent.
    pub(super) fn fill_lines(&mut self, from: u64, to: u64, t: u64, how: Fill) {
        // It books the ring: what the gate found for a write may no longer hold.
        self.write_fit.set(None);
        let Some(buf) = self.buffer.as_mut() else {
            return;
        };
        let (first, last) = (buf.line_of(from), buf.line_of(to - 1));
        let mut l = first;
        while l <= last {
            let buf = self.buffer.as_mut().expect("a buffer");
            if buf.has(l) {
                buf.touch(l);
                l += 1;
                continue;
            }
            // A run of missing lines, to the end of the stripe at most.
            let lo = buf.start_of(l);
            let stripe_end = (self.stripe.div_rem(lo).0 + 1) * self.cfg.stripe;
            let mut run_end = l + 1;
            while run_end <= last && !buf.has(run_end) && buf.start_of(run_end) < stripe_end {
                run_end += 1;
            }
            let hi = buf.start_of(run_end);
            let (ci, local) = self.place(lo);
            let (_, data, _) = self.controller_work(ci, local, hi - lo, false, t);
            let ring_d = self.ring_ps.dur(hi - lo);
            let rs = self.ring.fit(data, ring_d);
            let ready = self.ring.book(rs, ring_d);
            let buf = self.buffer.as_mut().expect("a buffer");
            for x in l..run_end {
                buf.fill(x, ready, how);
            }
            l = run_end;
        }
    }

    /// A write transfer issued at `t`: returns when it ends, its row written back (durable).
    /// `fit` is the buffer and span the gate found for it, if they still hold.
    pub(super) fn write_transfer(
        &mut self,
        ci: usize,
        local: u64,
        len: u64,
        t: u64,
        fit: Option<(usize, (u64, u64))>,
    ) -> u64 {
        let (ring_d, link_d) = self.wire(len);
        let inq = self.ctrls[ci].inq_free;
        let (b, span) = fit.unwrap_or_else(|| {
            let (_, b, span) = self.find_buffer(t, Model::write_stages(ring_d, link_d, inq));
            (b, span)
        });
        self.hold_buffer(b, span);
        // The span is the link's start to the ring's end, as the stages found them free.
        self.link_down.book(span.0, link_d);
        let ring_end = self.ring.book(span.1 - ring_d, ring_d);
        let (_, drained, end) = self.controller_work(ci, local, len, true, ring_end);
        self.ctrls[ci].inq_free = drained;
        end
    }
}
