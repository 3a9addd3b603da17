//! Reading an image's metadata tables (with the journal's last transaction laid over them) and
//! checking them: what `mount` relies on and `moneta fsck` reports.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

use moneta_device::Media;

use crate::journal::{self, Journal, Recovered};
use crate::layout::*;

/// Which copy of a mirrored record (or of the superblock) is damaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copy {
    /// The first (in the table, or block 0).
    Primary,
    /// The second (in the mirror table, or the array's last block).
    Mirror,
}

impl fmt::Display for Copy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Copy::Primary => "first",
            Copy::Mirror => "second",
        })
    }
}

/// An image's metadata as it would be after replaying the journal.
pub struct Tables {
    /// The superblock.
    pub sb: Superblock,
    /// A superblock copy that is damaged (the other was used), and why.
    pub sb_damage: Option<(Copy, String)>,
    /// The journal's last transaction (already laid over the tables below).
    pub recovered: Recovered,
    /// Inode records, inode `n` at index `n - 1` (a free default for one damaged in both
    /// copies).
    pub inodes: Vec<Inode>,
    /// Inodes whose two copies are both damaged.
    pub bad_inodes: BTreeSet<u64>,
    /// Inodes with one damaged copy (the record above is the good one).
    pub inode_copies: Vec<(u64, Copy)>,
    /// Used directory-entry records by slot.
    pub dirents: BTreeMap<u64, Dirent>,
    /// Slots whose record is damaged (checksum or name length).
    pub bad_dirents: Vec<u64>,
    /// Used extent records by slot.
    pub extents: BTreeMap<u64, ExtentRec>,
    /// Extent slots whose two copies are both damaged.
    pub bad_extents: Vec<u64>,
    /// Extent slots with one damaged copy.
    pub extent_copies: Vec<(u64, Copy)>,
    /// Bitmap words.
    pub bitmap: Vec<u64>,
}

/// The superblock of the image on `m`: block 0's, or the backup's in the last block when
/// block 0's is damaged (with the damaged copy and why).
pub fn superblock(m: &dyn Media) -> Result<(Superblock, Option<(Copy, String)>), FormatError> {
    let size = m.size();
    if size < 2 * BLOCK {
        return Err(FormatError::NotFormatted);
    }
    let read_at = |addr: u64| {
        let mut b = [0u8; SUPERBLOCK_SIZE];
        journal::read(m, addr, &mut b);
        decode_superblock(&b, size)
    };
    let primary = read_at(0);
    let backup = read_at(size - BLOCK);
    match (primary, backup) {
        (Ok(p), Ok(b)) if p == b => Ok((p, None)),
        (Ok(p), Ok(_)) => Ok((p, Some((Copy::Mirror, "it differs from block 0's".into())))),
        (Ok(p), Err(e)) => Ok((p, Some((Copy::Mirror, e.to_string())))),
        // Another format version is the image's, not damage: never look past it.
        (Err(FormatError::Version(v)), _) => Err(FormatError::Version(v)),
        (Err(e), Ok(b)) => Ok((b, Some((Copy::Primary, e.to_string())))),
        (Err(e), Err(_)) => Err(e),
    }
}

/// Picks the good copy of a mirrored record: `decode` gives `None` for a damaged one. A valid
/// all-zero copy loses to a valid used one (a zeroed sector), and otherwise the first wins.
fn pick<T>(p: &[u8], m: &[u8], decode: impl Fn(&[u8]) -> Option<T>) -> (Option<T>, Option<Copy>) {
    if p == m {
        return (decode(p), None);
    }
    match (decode(p), decode(m)) {
        (Some(_), Some(b)) if is_zero(p) => (Some(b), Some(Copy::Primary)),
        (Some(a), _) => (Some(a), Some(Copy::Mirror)),
        (None, Some(b)) => (Some(b), Some(Copy::Primary)),
        (None, None) => (None, None),
    }
}

/// Reads the superblock and the tables of the image on `m`.
pub fn load(m: &dyn Media) -> Result<Tables, FormatError> {
    let (sb, sb_damage) = superblock(m)?;
    let g = sb.geometry;
    let recovered = Journal::recover(m, &g);
    // Everything from the inode table to the mirrors' end (not the data checksums).
    let mut meta = vec![0u8; (g.sums_off - g.inode_off) as usize];
    journal::read(m, g.inode_off, &mut meta);
    for (addr, data) in &recovered.records {
        for at in std::iter::once(*addr).chain(g.mirror_of(*addr)) {
            let at = (at - g.inode_off) as usize;
            meta[at..at + data.len()].copy_from_slice(data);
        }
    }
    let region = |off: u64, len: u64| {
        let at = (off - g.inode_off) as usize;
        &meta[at..at + len as usize]
    };
    let mut inodes = Vec::with_capacity(g.inode_count as usize);
    let mut bad_inodes = BTreeSet::new();
    let mut inode_copies = Vec::new();
    let table = region(g.inode_off, g.inode_count * INODE_SIZE);
    let mirror = region(g.inode_mirror_off, g.inode_count * INODE_SIZE);
    for (i, (p, c)) in table
        .chunks_exact(INODE_SIZE as usize)
        .zip(mirror.chunks_exact(INODE_SIZE as usize))
        .enumerate()
    {
        let ino = i as u64 + 1;
        let (n, copy) = pick(p, c, |b| Inode::decode(b, ino));
        if let Some(copy) = copy {
            inode_copies.push((ino, copy));
        }
        match n {
            Some(n) => inodes.push(n),
            None => {
                bad_inodes.insert(ino);
                inodes.push(Inode::default());
            }
        }
    }
    let mut dirents = BTreeMap::new();
    let mut bad_dirents = Vec::new();
    for (slot, b) in region(g.dirent_off, g.dirent_count * DIRENT_SIZE)
        .chunks_exact(DIRENT_SIZE as usize)
        .enumerate()
    {
        if is_zero(b) {
            continue;
        }
        match Dirent::decode(b, slot as u64) {
            Some(d) => {
                dirents.insert(slot as u64, d);
            }
            None => bad_dirents.push(slot as u64),
        }
    }
    let mut extents = BTreeMap::new();
    let mut bad_extents = Vec::new();
    let mut extent_copies = Vec::new();
    let table = region(g.extent_off, g.extent_count * EXTENT_SIZE);
    let mirror = region(g.extent_mirror_off, g.extent_count * EXTENT_SIZE);
    for (slot, (p, c)) in table
        .chunks_exact(EXTENT_SIZE as usize)
        .zip(mirror.chunks_exact(EXTENT_SIZE as usize))
        .enumerate()
    {
        let slot = slot as u64;
        let (e, copy) = pick(p, c, |b| ExtentRec::decode(b, slot));
        if let Some(copy) = copy {
            extent_copies.push((slot, copy));
        }
        match e {
            Some(e) if e.ino != 0 => {
                extents.insert(slot, e);
            }
            Some(_) => {}
            None => bad_extents.push(slot),
        }
    }
    let bitmap = region(g.bitmap_off, g.bitmap_len)
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8")))
        .collect();
    // An inode that was ever used keeps its generation when freed, so an all-zero record
    // that entries or extents name was zeroed by damage, in both copies.
    let named = dirents
        .values()
        .flat_map(|d| [d.ino, d.parent])
        .chain(extents.values().map(|e| e.ino));
    for ino in named {
        if ino >= 1 && ino <= g.inode_count && inodes[(ino - 1) as usize] == Inode::default() {
            bad_inodes.insert(ino);
        }
    }
    Ok(Tables {
        sb,
        sb_damage,
        recovered,
        inodes,
        bad_inodes,
        inode_copies,
        dirents,
        bad_dirents,
        extents,
        bad_extents,
        extent_copies,
        bitmap,
    })
}

/// A repair `fsck --repair` may make. None frees data that a file may still need: damaged
/// records that name data are rebuilt or their data gathered into `/lost+found`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    /// Write the damaged superblock copy from the good one.
    RewriteSuperblock,
    /// Write an inode record's damaged copy from the good one.
    RewriteInode(u64),
    /// Write an extent record's damaged copy from the good one.
    RewriteExtent(u64),
    /// Rebuild an inode damaged in both copies that entries or extents refer to, as this type
    /// (`S_IFDIR`, `S_IFREG`, `S_IFLNK`): owner and group of the root directory, mode 600
    /// (700 for a directory), a regular file's size the end of its last extent.
    RebuildInode(u64, u32),
    /// Clear an inode record damaged in both copies that nothing refers to.
    ClearInode(u64),
    /// Clear a directory-entry record (a damaged one, or a name that cannot stand). The inode
    /// it named keeps its data; with no name left it goes to `/lost+found`.
    ClearDirent(u64),
    /// Correct the type an entry gives (slot, `DT_*`).
    SetKind(u64, u8),
    /// Take an extent record off a file without freeing its chunks: they are reclaimed.
    DetachExtent(u64),
    /// Chunks in use or named by a detached extent that no file owns (first, count): those
    /// that read as zeros are freed (nothing is lost: a hole reads as zeros too), the others
    /// become a file in `/lost+found`.
    Reclaim(u64, u64),
    /// Set the bitmap bits of chunks an extent owns.
    MarkChunks(u64, u64),
    /// Set an inode's link count.
    SetNlink(u64, u32),
    /// Grow a file's size to cover its extents.
    SetSize(u64, u64),
    /// Name an inode that has none (and links) `#<ino>` in `/lost+found`.
    Reattach(u64),
    /// Free an inode that was unlinked while open (link count 0, no name), with its extents
    /// and symlink target.
    FreeInode(u64),
    /// Free a symbolic link whose target is lost, and its names.
    FreeSymlink(u64),
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Normal after a crash and handled by mounting (an unlinked file that was still open).
    Note,
    /// An inconsistency.
    Error,
}

/// One finding.
#[derive(Clone, Debug)]
pub struct Problem {
    /// How bad.
    pub severity: Severity,
    /// What.
    pub text: String,
    /// The safe repair, if there is one.
    pub fix: Option<Fix>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self.severity {
            Severity::Note => "note",
            Severity::Error => "error",
        };
        write!(f, "{s}: {}", self.text)?;
        if self.fix.is_some() {
            write!(f, " [repairable]")?;
        }
        Ok(())
    }
}

/// What a check found and counted.
#[derive(Debug, Default)]
pub struct Report {
    /// Findings.
    pub problems: Vec<Problem>,
    /// Inodes in use.
    pub inodes_used: u64,
    /// Directories.
    pub directories: u64,
    /// Regular files.
    pub files: u64,
    /// Symbolic links.
    pub symlinks: u64,
    /// Chunks owned by files.
    pub chunks_used: u64,
    /// Chunks in all.
    pub chunks: u64,
}

impl Report {
    /// Findings that are errors.
    pub fn errors(&self) -> usize {
        self.problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
            .count()
    }
}

fn valid_name(n: &[u8]) -> bool {
    !n.is_empty() && n != b"." && n != b".." && !n.contains(&b'/') && !n.contains(&0)
}

/// The `S_IF*` type an inode damaged in both copies had, from what refers to it: `None` when
/// nothing does.
fn referred_type(t: &Tables, ino: u64) -> Option<u32> {
    if t.dirents.values().any(|d| d.parent == ino) {
        return Some(S_IFDIR);
    }
    if t.dirents
        .values()
        .any(|d| d.parent == SYMLINK_TARGET && d.ino == ino)
    {
        return Some(S_IFLNK);
    }
    if t.extents.values().any(|e| e.ino == ino) {
        return Some(S_IFREG);
    }
    t.dirents
        .values()
        .find(|d| d.ino == ino && d.parent != SYMLINK_TARGET)
        .map(|d| match d.kind {
            DT_DIR => S_IFDIR,
            DT_LNK => S_IFLNK,
            _ => S_IFREG,
        })
}

/// Checks the tables: superblock copies, damaged records, inodes, directory entries and the
/// tree, extents (in range, no chunk owned twice, none past the end of its file), and the
/// bitmap against the extents. Each finding carries the repair that keeps the most data; a
/// finding that waits on another repair (an entry of a directory being rebuilt) is left to
/// the next pass of [`crate::fsck`].
pub fn check(t: &Tables) -> Report {
    let g = &t.sb.geometry;
    let mut r = Report {
        chunks: g.chunk_count,
        ..Default::default()
    };
    let mut ps: Vec<Problem> = Vec::new();
    macro_rules! err {
        ($text:expr, $fix:expr $(,)?) => {
            ps.push(Problem {
                severity: Severity::Error,
                text: $text,
                fix: $fix,
            })
        };
    }
    if let Some((copy, why)) = &t.sb_damage {
        let text = match copy {
            Copy::Primary => {
                format!("the superblock in block 0 is damaged ({why}); its backup is used")
            }
            Copy::Mirror => format!("the backup superblock in the last block is damaged ({why})"),
        };
        err!(text, Some(Fix::RewriteSuperblock));
    }
    for &(ino, copy) in &t.inode_copies {
        err!(
            format!("inode {ino}: the {copy} copy of its record is damaged; the other is good"),
            Some(Fix::RewriteInode(ino)),
        );
    }
    for &(slot, copy) in &t.extent_copies {
        err!(
            format!("extent record {slot}: its {copy} copy is damaged; the other is good"),
            Some(Fix::RewriteExtent(slot)),
        );
    }
    let bad = |ino: u64| t.bad_inodes.contains(&ino);
    for &ino in &t.bad_inodes {
        match referred_type(t, ino) {
            Some(kind) => err!(
                format!("inode {ino} is damaged in both copies; it will be rebuilt"),
                Some(Fix::RebuildInode(ino, kind)),
            ),
            None => err!(
                format!("inode {ino} is damaged in both copies and nothing refers to it"),
                Some(Fix::ClearInode(ino)),
            ),
        }
    }
    for &slot in &t.bad_extents {
        err!(
            format!("extent record {slot} is damaged in both copies; its chunks are reclaimed"),
            Some(Fix::DetachExtent(slot)),
        );
    }
    let used =
        |ino: u64| ino >= 1 && ino <= g.inode_count && t.inodes[(ino - 1) as usize].is_used();
    let inode = |ino: u64| &t.inodes[(ino - 1) as usize];
    for (i, n) in t.inodes.iter().enumerate() {
        let ino = i as u64 + 1;
        if n.is_used() && !(n.is_dir() || n.is_reg() || n.is_symlink()) {
            err!(
                format!("inode {ino} has an unknown type (mode {:o})", n.mode),
                None
            );
        }
    }
    if !bad(ROOT_INO) && (!used(ROOT_INO) || !inode(ROOT_INO).is_dir()) {
        err!(
            "the root directory (inode 1) is missing or not a directory".into(),
            Some(Fix::RebuildInode(ROOT_INO, S_IFDIR)),
        );
    }
    for s in &t.bad_dirents {
        err!(
            format!("directory entry {s} is damaged; the file it named goes to /lost+found"),
            Some(Fix::ClearDirent(*s))
        );
    }
    // Directory entries and symlink targets.
    let mut names: HashMap<u64, HashSet<&[u8]>> = HashMap::new();
    let mut links: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    // Directory -> (its parent, the slot of the entry naming it).
    let mut parent_of: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut targets: HashMap<u64, u64> = HashMap::new();
    for (&slot, d) in &t.dirents {
        if d.parent == SYMLINK_TARGET {
            if bad(d.ino) {
                continue;
            }
            if !used(d.ino) || !inode(d.ino).is_symlink() {
                err!(
                    format!(
                        "symlink target record {slot} belongs to inode {}, not a symlink",
                        d.ino
                    ),
                    Some(Fix::ClearDirent(slot)),
                );
            } else if targets.insert(d.ino, slot).is_some() {
                err!(
                    format!("symlink {} has two targets", d.ino),
                    Some(Fix::ClearDirent(slot))
                );
            }
            continue;
        }
        if bad(d.parent) || bad(d.ino) {
            // Counted once the inode is rebuilt.
            continue;
        }
        if !used(d.parent) || !inode(d.parent).is_dir() {
            err!(
                format!(
                    "directory entry {slot} is in inode {}, not a directory",
                    d.parent
                ),
                Some(Fix::ClearDirent(slot)),
            );
            continue;
        }
        let shown = String::from_utf8_lossy(&d.name);
        if !used(d.ino) {
            err!(
                format!(
                    "directory entry {slot} ({shown:?}) names free inode {}",
                    d.ino
                ),
                Some(Fix::ClearDirent(slot)),
            );
            continue;
        }
        if d.ino == ROOT_INO {
            err!(
                format!("directory entry {slot} ({shown:?}) names the root"),
                Some(Fix::ClearDirent(slot)),
            );
            continue;
        }
        if !valid_name(&d.name) {
            err!(
                format!("directory entry {slot} has an invalid name"),
                Some(Fix::ClearDirent(slot))
            );
            continue;
        }
        let kind = kind_of(inode(d.ino).mode);
        if d.kind != kind {
            err!(
                format!(
                    "directory entry {slot} has the wrong type for inode {}",
                    d.ino
                ),
                Some(Fix::SetKind(slot, kind))
            );
        }
        if !names.entry(d.parent).or_default().insert(&d.name) {
            err!(
                format!("directory {} holds the name {shown:?} twice", d.parent),
                Some(Fix::ClearDirent(slot)),
            );
            continue;
        }
        if inode(d.ino).is_dir() {
            if parent_of.contains_key(&d.ino) {
                err!(
                    format!("directory {} has more than one name", d.ino),
                    Some(Fix::ClearDirent(slot))
                );
                continue;
            }
            parent_of.insert(d.ino, (d.parent, slot));
            *subdirs.entry(d.parent).or_default() += 1;
        }
        *links.entry(d.ino).or_default() += 1;
    }
    // The tree: every directory reaches the root. Each walk stops at a directory already
    // known to reach it, so a deep chain costs one pass, not one per directory. A cycle is
    // cut at the directory where the walk meets itself, which then goes to /lost+found.
    let mut reaches: HashSet<u64> = HashSet::from([ROOT_INO]);
    let mut lost: HashSet<u64> = HashSet::new();
    let mut dirs: Vec<u64> = parent_of.keys().copied().collect();
    dirs.sort_unstable();
    for dir in dirs {
        let mut path = HashSet::new();
        let mut cur = dir;
        let mut cut = None;
        let ok = loop {
            if reaches.contains(&cur) {
                break true;
            }
            if lost.contains(&cur) {
                break false;
            }
            if !path.insert(cur) {
                cut = parent_of.get(&cur).map(|&(_, slot)| slot);
                break false;
            }
            match parent_of.get(&cur) {
                Some(&(p, _)) => cur = p,
                None => break false,
            }
        };
        if ok {
            reaches.extend(path);
        } else {
            lost.extend(path);
            err!(
                format!("directory {dir} is not reachable from the root"),
                cut.map(Fix::ClearDirent)
            );
        }
    }
    // Link counts and orphans.
    for (i, n) in t.inodes.iter().enumerate() {
        let ino = i as u64 + 1;
        if !n.is_used() {
            continue;
        }
        r.inodes_used += 1;
        let found = links.get(&ino).copied().unwrap_or(0);
        if n.is_dir() {
            r.directories += 1;
            let want = 2 + subdirs.get(&ino).copied().unwrap_or(0);
            if ino != ROOT_INO && found == 0 {
                if n.nlink == 0 {
                    ps.push(Problem {
                        severity: Severity::Note,
                        text: format!("directory {ino} was removed while open; it will be freed"),
                        fix: Some(Fix::FreeInode(ino)),
                    });
                    continue;
                }
                err!(
                    format!("directory {ino} has no name; it goes to /lost+found as #{ino}"),
                    Some(Fix::Reattach(ino))
                );
            }
            if n.nlink != want {
                err!(
                    format!(
                        "directory {ino} has link count {}, should be {want}",
                        n.nlink
                    ),
                    Some(Fix::SetNlink(ino, want)),
                );
            }
            continue;
        }
        if n.is_reg() {
            r.files += 1;
        } else if n.is_symlink() {
            r.symlinks += 1;
            let unlinked_while_open = found == 0 && n.nlink == 0;
            if !targets.contains_key(&ino) && !unlinked_while_open {
                err!(
                    format!("symlink {ino} has no target; it is removed with its names"),
                    Some(Fix::FreeSymlink(ino))
                );
                continue;
            }
        }
        if found == 0 {
            if n.nlink == 0 {
                ps.push(Problem {
                    severity: Severity::Note,
                    text: format!("inode {ino} was unlinked while open; it will be freed"),
                    fix: Some(Fix::FreeInode(ino)),
                });
            } else {
                err!(
                    format!(
                        "inode {ino} has link count {} but no directory entry; it goes to \
                         /lost+found as #{ino}",
                        n.nlink
                    ),
                    Some(Fix::Reattach(ino)),
                );
            }
        } else if n.nlink != found {
            err!(
                format!("inode {ino} has link count {}, should be {found}", n.nlink),
                Some(Fix::SetNlink(ino, found)),
            );
        }
    }
    // Extents.
    let mut owner: Vec<u64> = vec![0; g.chunk_count as usize];
    let mut detached: Vec<bool> = vec![false; g.chunk_count as usize];
    let mut per_file: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    let mut past_end: BTreeMap<u64, u64> = BTreeMap::new();
    let in_region = |e: &ExtentRec| {
        e.count != 0
            && e.dev_chunk
                .checked_add(e.count as u64)
                .is_some_and(|end| end <= g.chunk_count)
    };
    for (&slot, e) in &t.extents {
        let mut detach = |why: String| {
            if in_region(e) {
                for c in e.dev_chunk..e.dev_chunk + e.count as u64 {
                    detached[c as usize] = true;
                }
            }
            ps.push(Problem {
                severity: Severity::Error,
                text: why,
                fix: Some(Fix::DetachExtent(slot)),
            });
        };
        if !bad(e.ino) && (!used(e.ino) || !inode(e.ino).is_reg()) {
            detach(format!(
                "extent record {slot} belongs to inode {}, not a file; its chunks are reclaimed",
                e.ino
            ));
            continue;
        }
        if !in_region(e) {
            detach(format!("extent record {slot} is outside the data region"));
            continue;
        }
        if !bad(e.ino) {
            let size = inode(e.ino).size;
            // Room past the end continues the extent of the size's last chunk; an empty
            // file's room (given at its open) is the extent at chunk 0. The mount frees both.
            let room_of_empty = size == 0 && e.file_chunk == 0;
            if e.file_chunk.saturating_mul(g.chunk_size) >= size && !room_of_empty {
                let end = (e.file_chunk + e.count as u64).saturating_mul(g.chunk_size);
                let want = past_end.entry(e.ino).or_default();
                *want = (*want).max(end);
            }
        }
        per_file
            .entry(e.ino)
            .or_default()
            .push((e.file_chunk, e.file_chunk + e.count as u64));
        for c in e.dev_chunk..e.dev_chunk + e.count as u64 {
            if owner[c as usize] != 0 {
                err!(
                    format!(
                        "chunk {c} is owned by inodes {} and {}",
                        owner[c as usize], e.ino
                    ),
                    None,
                );
            } else {
                owner[c as usize] = e.ino;
            }
        }
    }
    for (ino, size) in past_end {
        err!(
            format!("inode {ino} has extents past its end; its size grows to {size} to keep them"),
            Some(Fix::SetSize(ino, size)),
        );
    }
    for (ino, mut ranges) in per_file {
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[0].1 > w[1].0) {
            err!(format!("inode {ino} maps one file offset twice"), None);
        }
    }
    // Bitmap against owners. Chunks no file owns that are marked in use, or that a detached
    // extent named, are reclaimed (kept unless they hold nothing).
    let bit = |c: u64| {
        t.bitmap
            .get((c / 64) as usize)
            .is_some_and(|w| w & (1 << (c % 64)) != 0)
    };
    #[derive(PartialEq, Clone, Copy)]
    enum State {
        Fine,
        Unmarked,
        Unowned,
    }
    let state = |c: u64| {
        let (o, b) = (owner[c as usize] != 0, bit(c));
        if o && !b {
            State::Unmarked
        } else if !o && (b || detached[c as usize]) {
            State::Unowned
        } else {
            State::Fine
        }
    };
    let mut c = 0;
    while c < g.chunk_count {
        if owner[c as usize] != 0 {
            r.chunks_used += 1;
        }
        let s = state(c);
        if s == State::Fine {
            c += 1;
            continue;
        }
        let start = c;
        while c < g.chunk_count && state(c) == s {
            if c > start && owner[c as usize] != 0 {
                r.chunks_used += 1;
            }
            c += 1;
        }
        if s == State::Unowned {
            err!(
                format!(
                    "chunks {start}..{c} are marked in use (or named by a damaged extent) but \
                     no file owns them; they are freed if they hold only zeros, else kept in \
                     /lost+found"
                ),
                Some(Fix::Reclaim(start, c - start)),
            );
        } else {
            err!(
                format!("chunks {start}..{c} are owned by a file but marked free"),
                Some(Fix::MarkChunks(start, c - start)),
            );
        }
    }
    r.problems = ps;
    r
}

/// A path of `ino` from the root, through its first name (for reports); `None` when it has no
/// name that reaches the root.
pub fn path_of(t: &Tables, ino: u64) -> Option<String> {
    let mut parts = Vec::new();
    let mut cur = ino;
    // A walk no longer than the inodes there are: a cycle ends it.
    for _ in 0..=t.sb.geometry.inode_count {
        if cur == ROOT_INO {
            parts.reverse();
            return Some(format!("/{}", parts.join("/")));
        }
        let (_, d) = t
            .dirents
            .iter()
            .find(|(_, d)| d.ino == cur && d.parent != SYMLINK_TARGET)?;
        parts.push(String::from_utf8_lossy(&d.name).into_owned());
        cur = d.parent;
    }
    None
}
