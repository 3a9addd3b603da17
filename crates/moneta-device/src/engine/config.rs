//! The engine's settings and the CPUs it may run on.

use std::time::Duration;

use crate::channel::DmaGeometry;
use crate::integrity::IntegrityConfig;
use crate::model::ModelConfig;
use crate::scheduler::Timing;

/// Engine settings. Every one has a daemon flag.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Most channels open at once (1024 in Moneta-D).
    pub max_channels: usize,
    /// Physical tags shared by all channels (64 in Moneta-D).
    pub phys_tags: usize,
    /// Permission table entries (16K in Moneta-D).
    pub table_entries: usize,
    /// Merge adjacent records of one file and rights.
    pub merge: bool,
    /// DMA buffer and slice sizes.
    pub geometry: DmaGeometry,
    /// A channel whose doorbell stays quiet this long is parked; when all are, the poller
    /// sleeps.
    pub park_after: Duration,
    /// Media latencies added per access.
    pub timing: Timing,
    /// Time each read and write's stages (queueing, permission check, data movement, media
    /// latency) into the status counters: a few clock reads per command, off by default.
    pub trace: bool,
    /// The CPU the poller runs on, or `None` to leave it to the scheduler. A poller with a
    /// core of its own never makes the threads it serves (a client between two commands, the
    /// daemon's connection threads answering a soft miss) wait for that core.
    pub poller_cpu: Option<usize>,
    /// Most permission records the channels of one user may hold together (channels opened
    /// with an owner, see [`Device::open_channel_for`](crate::Device::open_channel_for)); the rest of the table stays for
    /// others. `None`: half the table.
    pub user_records: Option<usize>,
    /// The array's timing and power model (Moneta §II, §V); `None` completes requests as
    /// fast as the host moves their data, plus [`DeviceConfig::timing`].
    pub model: Option<ModelConfig>,
    /// Chooses the model's address randomization for wear leveling.
    pub model_seed: u64,
    /// A persistent array's path: the model keeps its wear in a file beside it
    /// (`PATH.wear-GEOMETRY`); `None` keeps it in memory.
    pub wear_base: Option<std::path::PathBuf>,
    /// Data checksums to check on reads and keep on writes (the file system's table), or
    /// `None`.
    pub integrity: Option<IntegrityConfig>,
    /// Ranges of the address space other members hold, apart from the array (see
    /// [`crate::remote`]); commands on them are forwarded over NBD links.
    pub members: Vec<crate::remote::MemberConfig>,
    /// Where the array lies in the address space, `[local_at, local_at + size)`: 0 unless
    /// members hold the addresses before it, so that every member can see the same address
    /// space.
    pub local_at: u64,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            max_channels: 1024,
            phys_tags: 64,
            table_entries: 16 << 10,
            merge: true,
            geometry: DmaGeometry {
                dma_size: moneta_abi::DEFAULT_DMA_SIZE,
                slice_size: moneta_abi::DEFAULT_SLICE_SIZE,
            },
            park_after: Duration::from_micros(200),
            timing: Timing::default(),
            trace: false,
            poller_cpu: None,
            user_records: None,
            model: None,
            model_seed: 0x6d6f_6e65_7461,
            wear_base: None,
            integrity: None,
            members: Vec::new(),
            local_at: 0,
        }
    }
}

impl DeviceConfig {
    /// Checks every limit; the message says which is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=65536).contains(&self.max_channels) {
            return Err(format!(
                "max channels {} must be between 1 and 65536",
                self.max_channels
            ));
        }
        if !(1..=4096).contains(&self.phys_tags) {
            return Err(format!(
                "physical tags {} must be between 1 and 4096",
                self.phys_tags
            ));
        }
        if !(2..=(1 << 24)).contains(&self.table_entries) {
            return Err(format!(
                "permission table entries {} must be between 2 and 16M",
                self.table_entries
            ));
        }
        if let Some(cpu) = self.poller_cpu {
            let allowed = allowed_cpus();
            if !allowed.contains(&cpu) {
                let list = match cpu_list(&allowed) {
                    l if l.is_empty() => "none".to_string(),
                    l => format!("allowed: {l}"),
                };
                return Err(format!(
                    "poller CPU {cpu} is not one this process may run on ({list})"
                ));
            }
        }
        let share = self.user_share();
        if share == 0 || share > self.table_entries {
            return Err(format!(
                "a user's share of permission records ({share}) must be between 1 and the \
                 table's {} entries",
                self.table_entries
            ));
        }
        if self.timing.read_ns > MAX_LATENCY_NS || self.timing.write_ns > MAX_LATENCY_NS {
            return Err(format!(
                "media latencies must be at most {MAX_LATENCY_NS} ns"
            ));
        }
        if let Some(m) = &self.model {
            m.validate()?;
            if self.timing != Timing::default() {
                return Err(format!(
                    "a fixed media latency and the `{}` model cannot be used together: the \
                     model's read_ns and write_ns set the array's latencies",
                    m.name
                ));
            }
        }
        self.geometry.validate()
    }

    /// The records one user's channels may hold together: the setting, or half the table.
    pub fn user_share(&self) -> usize {
        self.user_records.unwrap_or((self.table_entries / 2).max(1))
    }
}

/// The CPUs this thread may run on, in order.
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&c| set.is_set(c))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The CPUs the device's threads besides the poller run on when the poller has CPU `cpu` to
/// itself: those the calling thread may run on, but that one; `None` when the poller is not
/// pinned or nothing else is left. Taken before the poller starts, since the threads the
/// poller starts would inherit its CPU alone.
pub(crate) fn away_from_poller(cpu: Option<usize>) -> Option<rustix::thread::CpuSet> {
    let cpu = cpu?;
    let mut set = rustix::thread::sched_getaffinity(None).ok()?;
    if cpu >= rustix::thread::CpuSet::MAX_CPU || !set.is_set(cpu) || set.count() < 2 {
        return None;
    }
    set.unset(cpu);
    Some(set)
}

/// Moves the calling thread onto `set` ([`away_from_poller`]), when there is one.
pub(crate) fn run_away_from_poller(set: Option<&rustix::thread::CpuSet>) {
    if let Some(set) = set {
        if let Err(e) = rustix::thread::sched_setaffinity(None, set) {
            tracing::warn!("cannot keep a device thread off the poller's CPU: {e}");
        }
    }
}

/// The poller's CPU when none is named: the last CPU this process may run on, when it may
/// run on at least two (so one is left for everything else); none on a single CPU.
pub fn default_poller_cpu() -> Option<usize> {
    let allowed = allowed_cpus();
    (allowed.len() >= 2).then(|| allowed[allowed.len() - 1])
}

/// `cpus` (in order) as the kernel lists them in `/proc/*/status`: `0-3,6`; empty for none.
pub fn cpu_list(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

/// Largest modeled media latency: 10 s.
pub const MAX_LATENCY_NS: u64 = 10_000_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_share_follows_the_table_it_is_given() {
        // Unset, the share is half of whatever table the device gets, so a small table (as
        // tests and fuzz targets use) is valid without naming a share.
        let small = DeviceConfig {
            table_entries: 64,
            ..Default::default()
        };
        assert_eq!(small.validate(), Ok(()));
        assert_eq!(small.user_share(), 32);
        assert_eq!(DeviceConfig::default().user_share(), 8 << 10);
        // A share named explicitly must fit the table.
        let too_big = DeviceConfig {
            table_entries: 64,
            user_records: Some(65),
            ..Default::default()
        };
        assert!(too_big
            .validate()
            .unwrap_err()
            .contains("share of permission records"));
        let zero = DeviceConfig {
            user_records: Some(0),
            ..Default::default()
        };
        assert!(zero.validate().is_err());
    }
}
