//! nvfs, the file system built directly on the Moneta array (seed 004): no block layer and no
//! page cache; it reads and writes its metadata in the array with loads and stores, and hands
//! out extents of the array that clients then reach through their channels.
//!
//! [`layout`] is the on-array format, [`journal`] makes each change atomic, [`alloc`] hands out
//! chunks, [`tables`] loads and checks an image (`fsck`), and [`fs`] is the mounted file system
//! with its POSIX calls.

pub mod alloc;
pub mod fs;
pub mod idhash;
pub mod journal;
pub mod layout;
pub mod repair;
pub mod tables;
pub mod watch;

pub use fs::{
    file_id, mkfs, Cred, DirEntry, Fs, FsError, FsResult, Mapping, MountError, MountOptions,
    Opened, Revoker, SetTime, SizeGrant, Stat, StatFs, SyncPlan,
};
pub use journal::{Durability, Progress};
pub use layout::{FormatError, Geometry, MkfsOptions, Time};
pub use tables::{Fix, Problem, Report, Severity};
pub use watch::ChangeSink;

use moneta_device::Media;

/// Most passes of check and repair one `fsck --repair` makes: a pass's repairs may bring
/// what the next one mends (an entry cleared leaves a file for `/lost+found`), and a pass that
/// cannot make any repair ends it.
pub const MAX_REPAIR_PASSES: usize = 8;

/// What `fsck` found and did.
#[derive(Debug)]
pub struct FsckOutcome {
    /// The check before any repair.
    pub before: Report,
    /// Repairs made, over every pass.
    pub repaired: Vec<Fix>,
    /// The check after repairs (when any were made).
    pub after: Option<Report>,
    /// The journal held a committed change that was (re)applied.
    pub replayed: bool,
    /// The geometry.
    pub geometry: Geometry,
}

fn fixes(r: &Report) -> Vec<Fix> {
    r.problems.iter().filter_map(|p| p.fix.clone()).collect()
}

/// Checks the image on `media` (with the journal's last change laid over it) and, with
/// `repair`, makes the repairs through the journal, in as many transactions and passes as they
/// need (at most [`MAX_REPAIR_PASSES`]), and checks again.
pub fn fsck(media: &dyn Media, repair: bool) -> Result<FsckOutcome, MountError> {
    let t = tables::load(media)?;
    let before = tables::check(&t);
    let geometry = t.sb.geometry;
    let replayed = !t.recovered.records.is_empty();
    if !repair || fixes(&before).is_empty() {
        return Ok(FsckOutcome {
            before,
            repaired: Vec::new(),
            after: None,
            replayed,
            geometry,
        });
    }
    // Offline: every transaction goes to the disk in order (a backing file) or to memory.
    let level = if media.persistent() {
        journal::Durability::Host
    } else {
        journal::Durability::Device
    };
    let mut journal = journal::Journal::open(&geometry, &t.recovered, level);
    journal.replay(media, &t.recovered)?;
    let mut repaired = Vec::new();
    let (mut t, mut report) = (t, None);
    for _ in 0..MAX_REPAIR_PASSES {
        let todo = fixes(report.as_ref().unwrap_or(&before));
        if todo.is_empty() {
            break;
        }
        let done = repair::repair(media, &t, &todo, &mut journal)?;
        let progress = !done.is_empty();
        repaired.extend(done);
        t = tables::load(media)?;
        report = Some(tables::check(&t));
        if !progress {
            break;
        }
    }
    Ok(FsckOutcome {
        before,
        repaired,
        after: report,
        replayed,
        geometry,
    })
}

/// A data block whose contents disagree with its checksum (`fsck --data`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadBlock {
    /// The file holding it (0 when no file does).
    pub ino: u64,
    /// Its path, when it has one.
    pub path: Option<String>,
    /// Its offset in the file.
    pub offset: u64,
    /// Its array address.
    pub addr: u64,
}

/// Checks every data block that a file owns against its checksum; `None` when the image keeps
/// no data checksums.
pub fn check_data(media: &dyn Media) -> Result<Option<Vec<BadBlock>>, MountError> {
    let t = tables::load(media)?;
    let g = t.sb.geometry;
    let Some(sums) = g.integrity() else {
        return Ok(None);
    };
    let mut bad = Vec::new();
    for e in t.extents.values() {
        if e.count == 0
            || e.dev_chunk
                .checked_add(e.count as u64)
                .is_none_or(|end| end > g.chunk_count)
        {
            continue;
        }
        let addr = g.chunk_addr(e.dev_chunk);
        for at in sums.verify(media, addr, e.count as u64 * g.chunk_size) {
            bad.push(BadBlock {
                ino: e.ino,
                path: tables::path_of(&t, e.ino),
                offset: e.file_chunk * g.chunk_size + (at - addr),
                addr: at,
            });
        }
    }
    bad.sort_by_key(|b| (b.ino, b.offset));
    Ok(Some(bad))
}
