//! What the model reports: utilisation and queueing per controller, energy (Moneta Table I),
//! wear, and the state wear leveling keeps across restarts.

use super::*;

impl Model {
    /// What the model has done up to `now_ns`: utilisation, energy, wear.
    pub fn stats(&self, now_ns: u64) -> ModelStats {
        let now = (now_ns * PS).max(self.now);
        let origin = self.origin.unwrap_or(now);
        let elapsed = now.saturating_sub(origin);
        let secs = |ps: u64| ps as f64 * 1e-12;
        let t = secs(elapsed);
        let p = &self.cfg.power;
        let comp = |(idle, peak): (f64, f64), busy: u64| idle * t + (peak - idle) * secs(busy);
        let nctrl = self.ctrls.len() as u64;
        let dies_per_ctrl = (self.size.div_ceil(nctrl) * 8).div_ceil(p.die_bits) as f64;
        let mut controllers = Vec::with_capacity(self.ctrls.len());
        let mut e_ctrl = 0.0;
        let mut e_background = 0.0;
        for c in &self.ctrls {
            let mut awake = c.awake_total;
            if c.woken {
                let end = now
                    .min(c.last_end + self.powerdown_after)
                    .max(c.awake_since);
                awake += end - c.awake_since;
            }
            e_ctrl += comp(p.controller_w, c.core.busy) + comp(p.ctrl_buffer_w, c.core.busy);
            e_background += dies_per_ctrl
                * (p.idle_die_w * t + (p.active_die_w - p.idle_die_w) * secs(awake.min(elapsed)));
            controllers.push(ControllerStats {
                busy_ns: c.core.busy / PS,
                transfers: c.transfers,
                queue_wait_ns: c.queue_wait / PS,
                row_hits: c.row_hits,
                row_misses: c.row_misses,
                gap_moves: c.gap_moves,
                utilisation: if elapsed > 0 {
                    (c.core.busy as f64 / elapsed as f64).min(1.0)
                } else {
                    0.0
                },
            });
        }
        let b = self.work.bits;
        let e_array = (b.array_read as f64 * p.array_read_pj
            + b.array_written as f64 * p.array_write_pj
            + b.buffer_read as f64 * p.buffer_read_pj
            + b.buffer_written as f64 * p.buffer_write_pj)
            * 1e-12;
        let link_busy = (self.link_up.busy + self.link_down.busy) / 2;
        let energy = Energy {
            scheduler_j: comp(p.scheduler_w, self.sched_busy),
            buffers_j: self.cfg.sched_buffers as f64 * p.sched_buffer_w.0 * t
                + (p.sched_buffer_w.1 - p.sched_buffer_w.0) * secs(self.buffer_busy),
            ring_j: comp(p.ring_w, self.ring.busy),
            link_j: comp(p.link_w, link_busy),
            controllers_j: e_ctrl,
            array_j: e_array,
            background_j: e_background,
        };
        ModelStats {
            elapsed_ns: elapsed / PS,
            reads: self.work.reads,
            writes: self.work.writes,
            bytes_read: self.work.bytes_read,
            bytes_written: self.work.bytes_written,
            transfers: self.work.transfers,
            link_up_busy_ns: self.link_up.busy / PS,
            link_down_busy_ns: self.link_down.busy / PS,
            ring_busy_ns: self.ring.busy / PS,
            controllers,
            energy,
            wear: self.wear(),
            wear_file: self.wear_file.as_ref().map(|f| f.path().to_path_buf()),
            buffer: self.buffer.as_ref().map(LineBuffer::stats),
        }
    }

    /// The wear of every row so far.
    pub fn wear(&self) -> Wear {
        let mut max = 0u32;
        let mut total = 0u64;
        let mut rows = 0u64;
        let mut hist = [0u64; 16];
        for c in &self.ctrls {
            for &w in c.wear.as_slice() {
                max = max.max(w);
                total += u64::from(w);
                rows += 1;
            }
        }
        for c in &self.ctrls {
            for &w in c.wear.as_slice() {
                let bucket = if max == 0 {
                    0
                } else {
                    ((u64::from(w) * 15).div_ceil(u64::from(max))) as usize
                };
                hist[bucket.min(15)] += 1;
            }
        }
        Wear {
            rows,
            max,
            mean: if rows == 0 {
                0.0
            } else {
                total as f64 / rows as f64
            },
            total,
            histogram: hist,
        }
    }

    /// Each controller's start-gap registers and row wear, to persist.
    pub fn wear_state(&self) -> Vec<ControllerWear> {
        self.ctrls
            .iter()
            .map(|c| {
                let (start, gap, writes) = c.wear_level.registers();
                ControllerWear {
                    start,
                    gap,
                    writes,
                    rows: c.wear.as_slice().to_vec(),
                }
            })
            .collect()
    }

    /// Restores what [`Model::wear_state`] gave (of a model with the same configuration,
    /// array size and seed); `false`, changing nothing, if it does not fit.
    pub fn restore_wear(&mut self, state: &[ControllerWear]) -> bool {
        let fits = state.len() == self.ctrls.len()
            && state.iter().zip(&self.ctrls).all(|(w, c)| {
                w.rows.len() == c.wear.len()
                    && w.start < c.wear_level.lines()
                    && w.gap <= c.wear_level.lines()
            });
        if !fits {
            return false;
        }
        for (w, c) in state.iter().zip(&mut self.ctrls) {
            c.wear_level.restore(w.start, w.gap, w.writes);
            c.wear.copy_from(&w.rows);
            c.wear.save_registers(c.wear_level.registers());
        }
        true
    }
}

/// One controller's wear-leveling registers and the writes each of its rows has taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerWear {
    /// Start-gap's start register.
    pub start: u64,
    /// Its gap register.
    pub gap: u64,
    /// Writes since the gap last moved.
    pub writes: u64,
    /// Writes per physical row.
    pub rows: Vec<u32>,
}

/// Energy by part of the device (joules), integrated from idle and peak power over what each
/// part did (Moneta Table I).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Energy {
    /// Scheduler and DMA engine.
    pub scheduler_j: f64,
    /// Scheduler buffers.
    pub buffers_j: f64,
    /// The ring.
    pub ring_j: f64,
    /// The host link.
    pub link_j: f64,
    /// Memory controllers and their queues.
    pub controllers_j: f64,
    /// Array and row-buffer reads and writes.
    pub array_j: f64,
    /// Memory background power.
    pub background_j: f64,
}

impl Energy {
    /// Everything.
    pub fn total_j(&self) -> f64 {
        self.scheduler_j
            + self.buffers_j
            + self.ring_j
            + self.link_j
            + self.controllers_j
            + self.array_j
            + self.background_j
    }
}

/// Wear of the array's rows.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Wear {
    /// Rows (with each controller's gap row).
    pub rows: u64,
    /// Most writes of any row.
    pub max: u32,
    /// Mean writes per row.
    pub mean: f64,
    /// All row writes.
    pub total: u64,
    /// Rows by wear in sixteen buckets: bucket 0 holds rows never written, bucket k rows
    /// written up to k/15 of the maximum.
    pub histogram: [u64; 16],
}

/// One controller's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ControllerStats {
    /// Time the controller was busy.
    pub busy_ns: u64,
    /// Transfers it served.
    pub transfers: u64,
    /// Time transfers waited for it.
    pub queue_wait_ns: u64,
    /// Accesses that found their row open.
    pub row_hits: u64,
    /// Accesses that opened a row.
    pub row_misses: u64,
    /// Start-gap moves.
    pub gap_moves: u64,
    /// Busy time over elapsed time.
    pub utilisation: f64,
}

/// What the model has done.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelStats {
    /// From the first request to now.
    pub elapsed_ns: u64,
    /// Read requests issued.
    pub reads: u64,
    /// Write requests issued.
    pub writes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Transfers issued.
    pub transfers: u64,
    /// Link busy towards the host.
    pub link_up_busy_ns: u64,
    /// Link busy from the host.
    pub link_down_busy_ns: u64,
    /// Ring busy.
    pub ring_busy_ns: u64,
    /// Per controller.
    pub controllers: Vec<ControllerStats>,
    /// Energy so far.
    pub energy: Energy,
    /// Row wear.
    pub wear: Wear,
    /// The file the wear is kept in, if any.
    pub wear_file: Option<std::path::PathBuf>,
    /// The DRAM buffer's figures, if there is one.
    pub buffer: Option<BufferStats>,
}

impl ModelStats {
    /// Average power (W) over the elapsed time.
    pub fn watts(&self) -> f64 {
        if self.elapsed_ns == 0 {
            0.0
        } else {
            self.energy.total_j() / (self.elapsed_ns as f64 * 1e-9)
        }
    }
}
