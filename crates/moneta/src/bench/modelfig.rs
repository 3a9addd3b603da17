//! What the array model says about a run: its power and energy while the run lasted, and the
//! wear of its rows at the end (Moneta §V-D and §II), from the daemon's `OP_MODEL` report read
//! before and after the run.

use serde::Serialize;

use super::*;

/// The model's counters at one moment.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ModelSnap {
    energy_j: f64,
    elapsed_ns: f64,
    ops: f64,
    bytes: f64,
    wear_max: f64,
    wear_mean: f64,
    wear_max_over_mean: f64,
    gap_moves: f64,
}

/// The model's counters now; `None` without a model.
pub(crate) fn snap(c: &Control) -> Option<ModelSnap> {
    let m = c.model().ok()?;
    if m.get("model").is_none_or(|n| n == "none") {
        return None;
    }
    let f = |k: &str| m.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    Some(ModelSnap {
        energy_j: f("energy.total_j"),
        elapsed_ns: f("elapsed_ns"),
        ops: f("reads") + f("writes"),
        bytes: f("bytes_read") + f("bytes_written"),
        wear_max: f("wear.max"),
        wear_mean: f("wear.mean"),
        wear_max_over_mean: f("wear.max_over_mean"),
        gap_moves: (0..)
            .map_while(|i| m.get(&format!("controllers.{i}.gap_moves")))
            .filter_map(|v| v.parse::<f64>().ok())
            .sum(),
    })
}

/// The model's figures for a run.
#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct ModelFigures {
    /// Average power of the modelled device during the run (W).
    pub power_w: f64,
    /// Energy per request (J).
    pub energy_per_op_j: f64,
    /// Energy per byte moved (J).
    pub energy_per_byte_j: f64,
    /// The run's bandwidth (MB/s, the model's bytes over the model's time) per watt.
    pub mb_s_per_w: f64,
    /// Writes of the most written row after the configuration's last run (the device's life
    /// so far).
    pub wear_max: f64,
    /// Mean writes per row.
    pub wear_mean: f64,
    /// Their ratio: 1 is perfectly even wear; the fraction of the ideal lifetime a device
    /// reaches is its inverse.
    pub wear_max_over_mean: f64,
    /// Start-gap moves of all controllers since the daemon started.
    pub gap_moves: f64,
}

impl ModelSnap {
    /// What grows with every row write counted (the mean: the rows do not change).
    pub(crate) fn wear_total(&self) -> f64 {
        self.wear_mean
    }
}

/// The figures of the span between `before` and `after`, with the wear as `latest` found it.
pub(crate) fn figures(before: ModelSnap, after: ModelSnap, latest: ModelSnap) -> ModelFigures {
    let de = after.energy_j - before.energy_j;
    let dt = (after.elapsed_ns - before.elapsed_ns) * 1e-9;
    let ops = after.ops - before.ops;
    let bytes = after.bytes - before.bytes;
    let watts = if dt > 0.0 { de / dt } else { 0.0 };
    let mb_s = if dt > 0.0 { bytes / dt / 1e6 } else { 0.0 };
    ModelFigures {
        power_w: watts,
        energy_per_op_j: if ops > 0.0 { de / ops } else { 0.0 },
        energy_per_byte_j: if bytes > 0.0 { de / bytes } else { 0.0 },
        mb_s_per_w: if watts > 0.0 { mb_s / watts } else { 0.0 },
        wear_max: latest.wear_max,
        wear_mean: latest.wear_mean,
        wear_max_over_mean: latest.wear_max_over_mean,
        gap_moves: latest.gap_moves,
    }
}
