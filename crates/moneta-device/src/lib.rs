//! The emulated Moneta device.
//!
//! A fast non-volatile memory array ([`media`]) served to untrusted client processes through
//! per-process channels in shared memory ([`channel`]), every request checked against an extent
//! permission table ([`permission`]), virtual tags retagged onto a bounded pool of physical tags
//! ([`retag`]), completions timed by the [`scheduler`], all driven by the poller of [`engine`],
//! which checks and keeps data checksums through [`integrity`] when the file system has them.
//! The engine is generic over the media and the [`clock`], so tests can put their own under it.

pub mod channel;
pub mod clock;
pub mod command;
pub mod engine;
pub mod failstop;
pub mod guard;
pub mod integrity;
pub mod media;
pub mod model;
pub mod permission;
pub mod remote;
pub mod retag;
pub mod scheduler;

pub use channel::{ChannelMem, DmaGeometry};
pub use clock::{Clock, MonotonicClock, SystemClock};
pub use engine::{
    allowed_cpus, cpu_list, default_poller_cpu, Device, DeviceConfig, DeviceError, FileService,
    FsAnswer, FsJob, FsOutcome, LeaseAreaRef, LookupAnswer, OpenedChannel, Refill, TableOp,
    FILE_CALLS_PER_PASS_NS, MAX_LOOKUP_EXTENTS,
};
pub use integrity::{Integrity, IntegrityConfig};
pub use media::{FlushAs, MappedArray, Media, MediaError};
pub use permission::{PermissionTable, READ, WRITE};
pub use scheduler::Timing;
