//! The group commit of `fsync`s at the `Host` durability level (see the module above): each
//! caller queues what its durability point must flush, and the callers flush what is queued,
//! two flushes at a time at most, each in a flush lane of its own, ending in order.

use super::*;

/// Flushes that outlive this many later ones forget their failure (each waiter reads its
/// own well before).
const SYNC_ERRORS_KEPT: usize = 64;

/// The group commit of `fsync`s.
#[derive(Default)]
pub(super) struct Syncs {
    state: Mutex<SyncState>,
    done: Condvar,
}

#[derive(Default)]
struct SyncState {
    /// What the callers waiting for the next flush need flushed.
    queued: SyncPlan,
    /// Flushes started, and finished (in order): flush `n` carries what was queued until it
    /// started, in lane `n % lanes`.
    started: u64,
    finished: u64,
    /// Flushes that failed, and why.
    failed: BTreeMap<u64, FsError>,
}

impl Manager {
    /// `fsync` of `ino` (or of the metadata alone): a durability point shared with the
    /// callers that come while another's flush runs.
    pub fn fsync(&self, ino: u64) -> Result<(), FsError> {
        let Some(plan) = self.fs().sync_plan(Some(ino))? else {
            return Ok(());
        };
        let s = &self.syncs;
        let mut st = s.state.lock().unwrap_or_else(|e| e.into_inner());
        st.queued.ranges.extend(plan.ranges);
        st.queued.recycled.extend(plan.recycled);
        st.queued.seq = st.queued.seq.max(plan.seq);
        // The flush that will carry this plan: the next one to start.
        let mine = st.started;
        loop {
            if st.finished > mine {
                return match st.failed.get(&mine) {
                    Some(e) => Err(e.clone()),
                    None => Ok(()),
                };
            }
            let lanes = self.commit_lanes;
            if st.started > mine || st.started - st.finished >= lanes {
                // A flush carries this plan already, or as many run as may: wait.
                st = s.done.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            // This caller flushes everything queued, for everyone, beside the flush that may
            // be running (in the other lane: flush `n - lanes` has ended, so its lane is free).
            let n = st.started;
            st.started += 1;
            let mut batch = std::mem::take(&mut st.queued);
            drop(st);
            batch.ranges = moneta_fs::journal::merge(batch.ranges);
            let flushed = self
                .media
                .flush_ranges_in((n % lanes) as usize, &batch.ranges);
            // The flush before this one ends first: its callers' data, and the metadata up to
            // its plan, are durable only once its own flush has ended.
            st = s.state.lock().unwrap_or_else(|e| e.into_inner());
            while st.finished < n {
                st = s.done.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            drop(st);
            let result = self.fs().sync_done(&batch, flushed);
            st = s.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Err(e) = result {
                st.failed.insert(n, e);
                while st.failed.len() > SYNC_ERRORS_KEPT {
                    st.failed.pop_first();
                }
            }
            st.finished = n + 1;
            s.done.notify_all();
        }
    }
}
