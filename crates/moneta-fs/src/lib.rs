//! nvfs, the file system built directly on the Moneta array (seed 004): no block layer and no
//! page cache; it reads and writes its metadata in the array with loads and stores, and hands
//! out extents of the array that clients then reach through their channels.
//!
//! [`layout`] is the on-array format, [`journal`] makes each change atomic, [`alloc`] hands out
//! chunks, [`tables`] loads and checks an image (`fsck`), and [`fs`] is the mounted file system
//! with its POSIX calls.

pub mod alloc;
pub mod fs;
pub mod journal;
pub mod layout;
pub mod tables;

pub use fs::{
    file_id, mkfs, Cred, DirEntry, Fs, FsError, FsResult, Mapping, MountError, Opened, Revoker,
    SetTime, Stat, StatFs,
};
pub use layout::{FormatError, Geometry, MkfsOptions, Time};
pub use tables::{Fix, Problem, Report, Severity};

use moneta_device::Media;

/// What `fsck` found and did.
#[derive(Debug)]
pub struct FsckOutcome {
    /// The check before any repair.
    pub before: Report,
    /// Repairs made.
    pub repaired: Vec<Fix>,
    /// The check after repairs (when any were made).
    pub after: Option<Report>,
    /// The journal held a committed change that was (re)applied.
    pub replayed: bool,
    /// The geometry.
    pub geometry: Geometry,
}

/// Checks the image on `media` (with the journal's last change laid over it) and, with
/// `repair`, makes the safe repairs through the journal and checks again.
pub fn fsck(media: &dyn Media, repair: bool) -> Result<FsckOutcome, MountError> {
    let t = tables::load(media)?;
    let before = tables::check(&t);
    let geometry = t.sb.geometry;
    let replayed = !t.recovered.records.is_empty();
    let fixes: Vec<Fix> = before
        .problems
        .iter()
        .filter_map(|p| p.fix.clone())
        .collect();
    if !repair || fixes.is_empty() {
        return Ok(FsckOutcome {
            before,
            repaired: Vec::new(),
            after: None,
            replayed,
            geometry,
        });
    }
    let mut journal = journal::Journal::new(&geometry, t.recovered.seq, media.persistent());
    journal.replay(media, &t.recovered)?;
    let txn = tables::repair_txn(&t, &fixes);
    journal.commit(media, &txn)?;
    journal.sync(media)?;
    let after = tables::check(&tables::load(media)?);
    Ok(FsckOutcome {
        before,
        repaired: fixes,
        after: Some(after),
        replayed,
        geometry,
    })
}
