//! Reading an image's metadata tables (with the journal's last transaction laid over them) and
//! checking them: what `mount` relies on and `moneta fsck` reports.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use moneta_device::Media;

use crate::journal::{self, Journal, Recovered, Txn};
use crate::layout::*;

/// An image's metadata as it would be after replaying the journal.
pub struct Tables {
    /// The superblock.
    pub sb: Superblock,
    /// The journal's last transaction (already laid over the tables below).
    pub recovered: Recovered,
    /// Inode records, inode `n` at index `n - 1`.
    pub inodes: Vec<Inode>,
    /// Used directory-entry records by slot.
    pub dirents: BTreeMap<u64, Dirent>,
    /// Slots whose record cannot be decoded.
    pub bad_dirents: Vec<u64>,
    /// Used extent records by slot.
    pub extents: BTreeMap<u64, ExtentRec>,
    /// Bitmap words.
    pub bitmap: Vec<u64>,
}

/// Reads the superblock and the tables of the image on `m`.
pub fn load(m: &dyn Media) -> Result<Tables, FormatError> {
    if m.size() < BLOCK {
        return Err(FormatError::NotFormatted);
    }
    let mut sbb = [0u8; 256];
    journal::read(m, 0, &mut sbb);
    let sb = decode_superblock(&sbb, m.size())?;
    let g = sb.geometry;
    let recovered = Journal::recover(m, &g);
    let mut meta = vec![0u8; (g.data_off - g.inode_off) as usize];
    journal::read(m, g.inode_off, &mut meta);
    for (addr, data) in &recovered.records {
        let at = (addr - g.inode_off) as usize;
        meta[at..at + data.len()].copy_from_slice(data);
    }
    let region = |off: u64, len: u64| {
        let at = (off - g.inode_off) as usize;
        &meta[at..at + len as usize]
    };
    let inodes = region(g.inode_off, g.inode_count * INODE_SIZE)
        .chunks_exact(INODE_SIZE as usize)
        .map(Inode::decode)
        .collect();
    let mut dirents = BTreeMap::new();
    let mut bad_dirents = Vec::new();
    for (slot, b) in region(g.dirent_off, g.dirent_count * DIRENT_SIZE)
        .chunks_exact(DIRENT_SIZE as usize)
        .enumerate()
    {
        if b[0..8] == [0; 8] {
            continue;
        }
        match Dirent::decode(b) {
            Some(d) => {
                dirents.insert(slot as u64, d);
            }
            None => bad_dirents.push(slot as u64),
        }
    }
    let mut extents = BTreeMap::new();
    for (slot, b) in region(g.extent_off, g.extent_count * EXTENT_SIZE)
        .chunks_exact(EXTENT_SIZE as usize)
        .enumerate()
    {
        let e = ExtentRec::decode(b);
        if e.ino != 0 {
            extents.insert(slot as u64, e);
        }
    }
    let bitmap = region(g.bitmap_off, g.bitmap_len)
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().expect("8")))
        .collect();
    Ok(Tables {
        sb,
        recovered,
        inodes,
        dirents,
        bad_dirents,
        extents,
        bitmap,
    })
}

/// A repair `fsck --repair` may make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fix {
    /// Clear the bitmap bits of chunks nothing owns.
    FreeChunks(u64, u64),
    /// Set the bitmap bits of chunks an extent owns.
    MarkChunks(u64, u64),
    /// Set an inode's link count.
    SetNlink(u64, u32),
    /// Free an inode no directory entry names (its extents and symlink target too).
    FreeInode(u64),
    /// Clear a directory-entry record.
    ClearDirent(u64),
    /// Clear an extent record.
    ClearExtent(u64),
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

/// Checks the tables: superblock (by loading), inodes, directory entries and the tree, extents
/// (in range, no chunk owned twice, none past the end of its file), and the bitmap against
/// the extents.
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
    let used =
        |ino: u64| ino >= 1 && ino <= g.inode_count && t.inodes[(ino - 1) as usize].is_used();
    let inode = |ino: u64| &t.inodes[(ino - 1) as usize];
    let mut problems_inodes = Vec::new();
    for (i, n) in t.inodes.iter().enumerate() {
        let ino = i as u64 + 1;
        if !n.is_used() {
            continue;
        }
        if !(n.is_dir() || n.is_reg() || n.is_symlink()) {
            problems_inodes.push(format!(
                "inode {ino} has an unknown type (mode {:o})",
                n.mode
            ));
        }
    }
    for p in problems_inodes {
        err!(p, None);
    }
    if !used(ROOT_INO) || !inode(ROOT_INO).is_dir() {
        err!(
            "the root directory (inode 1) is missing or not a directory".into(),
            None
        );
    }
    for s in &t.bad_dirents {
        err!(
            format!("directory entry {s} has a bad name length"),
            Some(Fix::ClearDirent(*s))
        );
    }
    // Directory entries and symlink targets.
    let mut names: HashMap<u64, HashSet<&[u8]>> = HashMap::new();
    let mut links: HashMap<u64, u32> = HashMap::new();
    let mut subdirs: HashMap<u64, u32> = HashMap::new();
    let mut parent_of: HashMap<u64, u64> = HashMap::new();
    let mut targets: HashMap<u64, u64> = HashMap::new();
    for (&slot, d) in &t.dirents {
        if d.parent == SYMLINK_TARGET {
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
        if !used(d.ino) {
            err!(
                format!(
                    "directory entry {slot} ({:?}) names free inode {}",
                    String::from_utf8_lossy(&d.name),
                    d.ino
                ),
                Some(Fix::ClearDirent(slot)),
            );
            continue;
        }
        if !valid_name(&d.name) {
            err!(format!("directory entry {slot} has an invalid name"), None);
        }
        if d.kind != kind_of(inode(d.ino).mode) {
            err!(
                format!(
                    "directory entry {slot} has the wrong type for inode {}",
                    d.ino
                ),
                None
            );
        }
        if !names.entry(d.parent).or_default().insert(&d.name) {
            err!(
                format!(
                    "directory {} holds the name {:?} twice",
                    d.parent,
                    String::from_utf8_lossy(&d.name)
                ),
                None,
            );
        }
        *links.entry(d.ino).or_default() += 1;
        if inode(d.ino).is_dir() {
            *subdirs.entry(d.parent).or_default() += 1;
            if parent_of.insert(d.ino, d.parent).is_some() || d.ino == ROOT_INO {
                err!(format!("directory {} has more than one name", d.ino), None);
            }
        }
    }
    // The tree: every directory reaches the root. Each walk stops at a directory already
    // known to reach it, so a deep chain costs one pass, not one per directory.
    let mut reaches: HashSet<u64> = HashSet::from([ROOT_INO]);
    let mut lost: HashSet<u64> = HashSet::new();
    for &dir in parent_of.keys() {
        let mut path = HashSet::new();
        let mut cur = dir;
        let ok = loop {
            if reaches.contains(&cur) {
                break true;
            }
            // A directory already found lost, or a cycle.
            if lost.contains(&cur) || !path.insert(cur) {
                break false;
            }
            match parent_of.get(&cur) {
                Some(&p) => cur = p,
                None => break false,
            }
        };
        if ok {
            reaches.extend(path);
        } else {
            lost.extend(path);
            err!(
                format!("directory {dir} is not reachable from the root"),
                None
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
                } else {
                    err!(format!("directory {ino} has no name"), None);
                }
            } else if n.nlink != want {
                err!(
                    format!(
                        "directory {ino} has link count {}, should be {want}",
                        n.nlink
                    ),
                    Some(Fix::SetNlink(ino, want)),
                );
            }
        } else {
            if n.is_reg() {
                r.files += 1;
            } else if n.is_symlink() {
                r.symlinks += 1;
                if !targets.contains_key(&ino) && found > 0 {
                    err!(format!("symlink {ino} has no target"), None);
                }
            }
            if found == 0 {
                let text = if n.nlink == 0 {
                    format!("inode {ino} was unlinked while open; it will be freed")
                } else {
                    format!(
                        "inode {ino} has link count {} but no directory entry",
                        n.nlink
                    )
                };
                ps.push(Problem {
                    severity: if n.nlink == 0 {
                        Severity::Note
                    } else {
                        Severity::Error
                    },
                    text,
                    fix: Some(Fix::FreeInode(ino)),
                });
            } else if n.nlink != found {
                err!(
                    format!("inode {ino} has link count {}, should be {found}", n.nlink),
                    Some(Fix::SetNlink(ino, found)),
                );
            }
        }
    }
    // Extents.
    let mut owner: Vec<u64> = vec![0; g.chunk_count as usize];
    let mut per_file: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    for (&slot, e) in &t.extents {
        if !used(e.ino) || !inode(e.ino).is_reg() {
            err!(
                format!(
                    "extent record {slot} belongs to inode {}, not a file",
                    e.ino
                ),
                Some(Fix::ClearExtent(slot)),
            );
            continue;
        }
        if e.count == 0
            || e.dev_chunk
                .checked_add(e.count as u64)
                .is_none_or(|end| end > g.chunk_count)
        {
            err!(
                format!("extent record {slot} is outside the data region"),
                None
            );
            continue;
        }
        let size = inode(e.ino).size;
        if e.file_chunk.saturating_mul(g.chunk_size) >= size {
            err!(
                format!("extent record {slot} of inode {} lies past its end", e.ino),
                Some(Fix::ClearExtent(slot)),
            );
            continue;
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
    for (ino, mut ranges) in per_file {
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[0].1 > w[1].0) {
            err!(format!("inode {ino} maps one file offset twice"), None);
        }
    }
    // Bitmap against owners.
    let bit = |c: u64| {
        t.bitmap
            .get((c / 64) as usize)
            .is_some_and(|w| w & (1 << (c % 64)) != 0)
    };
    let mut c = 0;
    while c < g.chunk_count {
        let (o, b) = (owner[c as usize] != 0, bit(c));
        if o {
            r.chunks_used += 1;
        }
        if o == b {
            c += 1;
            continue;
        }
        let start = c;
        while c < g.chunk_count && (owner[c as usize] != 0) == o && bit(c) == b {
            c += 1;
        }
        if b {
            err!(
                format!("chunks {start}..{c} are marked in use but no file owns them"),
                Some(Fix::FreeChunks(start, c - start)),
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

/// Builds the transaction that applies `fixes` to the tables.
pub fn repair_txn(t: &Tables, fixes: &[Fix]) -> Txn {
    let g = &t.sb.geometry;
    let mut txn = Txn::default();
    let mut inodes: BTreeMap<u64, Inode> = BTreeMap::new();
    let mut bitmap = t.bitmap.clone();
    let mut dirty_words = HashSet::new();
    let mut set_bits = |start: u64, len: u64, on: bool| {
        for c in start..start + len {
            let w = (c / 64) as usize;
            if on {
                bitmap[w] |= 1 << (c % 64);
            } else {
                bitmap[w] &= !(1 << (c % 64));
            }
            dirty_words.insert(w);
        }
    };
    for f in fixes {
        match *f {
            Fix::FreeChunks(s, l) => set_bits(s, l, false),
            Fix::MarkChunks(s, l) => set_bits(s, l, true),
            Fix::SetNlink(ino, n) => {
                inodes
                    .entry(ino)
                    .or_insert(t.inodes[(ino - 1) as usize])
                    .nlink = n;
            }
            Fix::ClearDirent(slot) => txn.put(g.dirent_addr(slot), &[0u8; DIRENT_SIZE as usize]),
            Fix::ClearExtent(slot) => {
                txn.put(g.extent_addr(slot), &[0u8; EXTENT_SIZE as usize]);
                if let Some(e) = t.extents.get(&slot) {
                    if e.dev_chunk + e.count as u64 <= g.chunk_count {
                        set_bits(e.dev_chunk, e.count as u64, false);
                    }
                }
            }
            Fix::FreeInode(ino) => {
                let n = inodes.entry(ino).or_insert(t.inodes[(ino - 1) as usize]);
                let generation = n.generation.wrapping_add(1);
                *n = Inode {
                    generation,
                    ..Default::default()
                };
                for (&slot, e) in &t.extents {
                    if e.ino == ino {
                        txn.put(g.extent_addr(slot), &[0u8; EXTENT_SIZE as usize]);
                        if e.dev_chunk + e.count as u64 <= g.chunk_count {
                            set_bits(e.dev_chunk, e.count as u64, false);
                        }
                    }
                }
                for (&slot, d) in &t.dirents {
                    if d.parent == SYMLINK_TARGET && d.ino == ino {
                        txn.put(g.dirent_addr(slot), &[0u8; DIRENT_SIZE as usize]);
                    }
                }
            }
        }
    }
    for (ino, n) in inodes {
        txn.put(g.inode_addr(ino), &n.encode());
    }
    for w in dirty_words {
        txn.put(g.bitmap_off + w as u64 * 8, &bitmap[w].to_le_bytes());
    }
    txn
}
