//! nvfs: the mounted file system.
//!
//! The metadata tables are mirrored in memory (inodes decoded, directories and extents indexed);
//! every change is made to the mirror and logged as record images through the journal in one
//! transaction, so each call is atomic across a crash. Calls validate everything first and only
//! then change anything, so a refused call changes nothing. (Freeing the space of a file with
//! more extents than one transaction can hold takes several: the first removes the name, the
//! last the inode; a crash in between leaves an orphan that the next mount frees.)
//!
//! Space is given out in chunks (4 KiB by default): a small file takes space near its size.
//! A file that grows at its end keeps a reservation of the chunks after its last one
//! (Moneta-D's 1 MB ahead of appends, [`MountOptions::append_reserve`]), in memory only: it
//! keeps the file in one extent while other files are written beside it, costs no metadata,
//! and goes back at the file's last close (or to another file when space runs short).
//! [`crate::alloc`] says which free chunks may be handed out. Permission checks follow Linux:
//! owner, group (primary or supplementary) or other class bits, root bypassing them (but needing
//! an execute bit somewhere to execute), the sticky bit on directories, setgid directories
//! passing their group on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use moneta_device::{IntegrityConfig, Media};

use crate::alloc::{ChunkMap, Space};
use crate::idhash::IdHash;
use crate::journal::{self, Durability, Journal, Txn};
use crate::layout::*;
use crate::tables::{self, Fix, Severity, Tables};
use crate::watch::{self, ChangeSink, Watches};

mod durability;
mod grants;
mod lifecycle;
mod names;
mod namespace;
mod perm;
mod space;
mod statdir;

pub use grants::SizeGrant;
pub use perm::{
    may, may_follow_link, may_link, may_open_existing_in_sticky, Cred, MAY_EXEC, MAY_READ,
    MAY_WRITE,
};
pub use statdir::StatEntries;

/// Longest path accepted, in bytes.
pub const PATH_MAX: usize = 4095;
/// Largest file size.
pub const MAX_FILE_SIZE: u64 = 1 << 46;
/// Symbolic links followed in one path walk before `ELOOP`.
pub const MAX_SYMLINKS: u32 = 40;
/// Bytes a file growing at its end keeps in reserve after its last chunk (Moneta-D's 1 MB).
pub const DEFAULT_APPEND_RESERVE: u64 = 1 << 20;
/// Most bytes of dirty free space zeroed at once when clean space runs short: one merged
/// zeroing per run, and at the `Host` level one flush, per batch. The first batch after a
/// mount is [`FIRST_ZERO_BATCH`] and each one after doubles, so that a mount's first small file
/// does not wait for the whole array.
pub const ZERO_BATCH: u64 = 64 << 20;
/// The first batch of zeroing after a mount.
pub const FIRST_ZERO_BATCH: u64 = 256 << 10;
/// Freed runs shorter than this are recycled (zeroed by stores and handed out first, see
/// [`crate::alloc`]) as soon as they may be.
pub const RECYCLE_RUN: u64 = moneta_device::media::ZERO_BY_STORES;
/// Bytes recycled at most per commit (`Device`) or durability point (`Host`).
pub const RECYCLE_MAX: u64 = 256 << 10;
/// Bytes of recycled space kept at most.
pub const HOT_MAX: u64 = 4 << 20;
/// Clean space below which dirty free space is zeroed ahead of need, off the calls that
/// allocate ([`Fs::zero_ahead`]; an eighth of the array on a smaller one).
pub const ZERO_AHEAD_LOW: u64 = 32 << 20;
/// Bytes of dirty free space one [`Fs::zero_ahead`] zeroes.
pub const ZERO_AHEAD_BATCH: u64 = 1 << 20;
/// Free ranges of a file's data closer than this are flushed as one range by `fsync` (fewer
/// system calls; what lies between is written back too, if dirty).
pub const SYNC_GAP: u64 = 64 << 10;

/// The errno of a call refused in quick mode ([`Fs::set_quick`]) because it would have to
/// wait (zero free space, flush, revoke records): never a real errno, the caller asks again
/// where waiting is allowed. The call changed nothing.
pub const NOT_QUICK: i32 = -1;

/// How a file system is mounted.
#[derive(Clone, Copy, Debug)]
pub struct MountOptions {
    /// What commits and `fsync` make durable.
    pub durability: Durability,
    /// Bytes a file growing at its end keeps in reserve after its last chunk; 0 keeps none.
    pub append_reserve: u64,
    /// The array was formatted just now and its free space reads as zeros (nothing needs
    /// zeroing before it is handed out).
    pub fresh: bool,
    /// Nothing reads the array after this mount ends (a volatile array, gone with the
    /// daemon): there is no journal log ([`Journal::without_log`]), and at the `Device` level
    /// no metadata goes to the array's tables at all (the mount's mirror is all there is).
    pub volatile: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            durability: Durability::Device,
            append_reserve: DEFAULT_APPEND_RESERVE,
            fresh: false,
            volatile: false,
        }
    }
}

/// What a durability point for `fsync` must flush: made under the file-system lock by
/// [`Fs::sync_plan`], flushed by the caller (outside the lock, together with other callers'
/// plans: a group commit), and finished by [`Fs::sync_done`].
#[derive(Clone, Debug, Default)]
pub struct SyncPlan {
    /// Array ranges to flush together.
    pub ranges: Vec<(u64, u64)>,
    /// The last metadata transaction the flush makes durable.
    pub seq: u64,
    /// Freed runs (chunks) zeroed for the flush, recycled once it is done.
    pub recycled: Vec<(u64, u64)>,
}
/// A failed call: a Linux errno and what happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsError {
    /// Linux errno (positive).
    pub errno: i32,
    /// For people.
    pub message: String,
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.message, self.errno)
    }
}

impl std::error::Error for FsError {}

/// Result of a file-system call.
pub type FsResult<T> = Result<T, FsError>;

fn e<T>(errno: i32, message: impl Into<String>) -> FsResult<T> {
    Err(FsError {
        errno,
        message: message.into(),
    })
}

/// A file's attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Inode number.
    pub ino: u64,
    /// Type and permission bits.
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Bytes.
    pub size: u64,
    /// 512-byte units allocated.
    pub blocks: u64,
    /// Preferred I/O size (the chunk).
    pub blksize: u64,
    /// Access time.
    pub atime: Time,
    /// Modification time.
    pub mtime: Time,
    /// Status change time.
    pub ctime: Time,
    /// Creation time.
    pub btime: Time,
    /// Generation of the inode number.
    pub generation: u32,
}

/// A run of a file: mapped to the array at `dev`, or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First byte in the file.
    pub file_off: u64,
    /// Bytes.
    pub len: u64,
    /// First array byte, or `None` for a hole (reads as zeros).
    pub dev: Option<u64>,
}

/// File-system totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Chunk size.
    pub chunk_size: u64,
    /// Data chunks.
    pub chunks: u64,
    /// Free chunks.
    pub chunks_free: u64,
    /// Inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// Longest name.
    pub name_max: u64,
}

/// One directory entry from `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode.
    pub ino: u64,
    /// `DT_*`.
    pub kind: u8,
    /// Name.
    pub name: Vec<u8>,
    /// Cookie to continue after this entry.
    pub next: u64,
}

/// A time to set: now, leave alone, or a value (`utimensat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// The current time.
    Now,
    /// Unchanged.
    Omit,
    /// This time.
    At(Time),
}

/// What `open` decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    /// The inode.
    pub ino: u64,
    /// Reads allowed.
    pub read: bool,
    /// Writes allowed.
    pub write: bool,
    /// Whether this call created the file.
    pub created: bool,
    /// Attributes after the call.
    pub stat: Stat,
}

/// Called with the array ranges a change is about to free, before the change is committed; it
/// must not return until no channel can reach them (revocation before reuse).
pub type Revoker = Box<dyn FnMut(&[(u64, u64)]) -> FsResult<()> + Send>;

/// Sorts ranges and joins those less than `gap` apart.
fn coalesce(mut ranges: Vec<(u64, u64)>, gap: u64) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, l) in ranges {
        match out.last_mut() {
            Some((b, m)) if *b + *m + gap >= a => *m = (*m).max(a + l - *b),
            _ => out.push((a, l)),
        }
    }
    out
}

/// Runs of chunks, or ranges of array bytes: (first, length).
type Runs = Vec<(u64, u64)>;

/// Identity of a file for permission records: inode number and generation.
pub fn file_id(ino: u64, generation: u32) -> u64 {
    (ino << 32) | generation as u64
}

#[derive(Clone, Copy, Debug)]
struct Ext {
    dev: u64,
    count: u64,
    slot: u64,
}

/// A name in a directory, shared by its two indexes.
type Name = Arc<[u8]>;

#[derive(Default, Debug)]
struct Dir {
    by_name: HashMap<Name, (u64, u64)>,
    by_slot: BTreeMap<u64, Name>,
}

/// Where a path's last component lives.
struct Parent {
    dir: u64,
    /// `None` when the path ends in `/`, `.` or `..` (it names `dir` itself).
    name: Option<Vec<u8>>,
    /// The path ended in `/`.
    slash: bool,
    /// Last component was `..` (for rmdir's answer).
    dotdot: bool,
}

/// A mounted nvfs.
pub struct Fs {
    media: Arc<dyn Media>,
    sb: Superblock,
    g: Geometry,
    journal: Journal,
    inodes: Vec<Inode>,
    free_inodes: BTreeSet<u64>,
    dirs: HashMap<u64, Dir, IdHash>,
    parent: HashMap<u64, u64, IdHash>,
    free_dirents: BTreeSet<u64>,
    symlinks: HashMap<u64, (u64, Vec<u8>), IdHash>,
    extents: HashMap<u64, BTreeMap<u64, Ext>>,
    free_extents: BTreeSet<u64>,
    space: Space,
    /// Chunks held in reserve ahead of a file's appends: (first, end).
    reserves: HashMap<u64, (u64, u64)>,
    /// Chunks a reserve may hold.
    reserve_chunks: u64,
    /// Nothing reads the array after this mount ([`MountOptions::volatile`]).
    volatile: bool,
    /// Whether changes write their images to the array's tables: not on a volatile array at
    /// the `Device` level, whose tables nothing reads again (the mirror is all there is, as
    /// a tmpfs's metadata is in memory alone).
    images: bool,
    /// Files whose space is being freed in transactions of their own (too many extents for
    /// the call's): an orphan until the last one.
    doomed: Vec<u64>,
    /// Bytes the next batch of zeroing takes at least.
    next_zero_batch: u64,
    open: HashMap<u64, u32>,
    txn: Txn,
    dirty: BTreeSet<u64>,
    revoker: Option<Revoker>,
    /// Quick mode: refuse with [`NOT_QUICK`] what would wait (see [`Fs::set_quick`]).
    quick: bool,
    failed: Option<String>,
    /// Where the data checksums are, when the image keeps them.
    sums: Option<IntegrityConfig>,
    /// Layout tags of files whose mapping has been handed out (see [`Fs::layout_tag`]).
    layouts: HashMap<u64, u64>,
    /// The next layout tag; tags are never reused while the file system is mounted.
    next_layout: u64,
    /// Who kept answers about which inodes ([`Fs::watch`]), and where to say they changed.
    watches: Watches,
    sink: Option<Arc<dyn ChangeSink>>,
    /// Inodes whose answers changed in this transaction besides the dirty ones (their
    /// extents, their directory entries): their watches fire at the commit too.
    touched: BTreeSet<u64>,
    /// Size grants, by file ([`Fs::grant_size`]).
    grants: HashMap<u64, SizeGrant>,
    /// Open files that grew at their end since they were opened ([`Fs::grew_since_open`]).
    grown: std::collections::HashSet<u64>,
    /// Open files whose size other openers read ([`Fs::share_size`]): no grant until their
    /// last close.
    size_read: std::collections::HashSet<u64>,
}

/// Why an image cannot be mounted.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// Not nvfs, another version, or a bad superblock.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The tables are inconsistent.
    #[error("the file system is inconsistent ({count} errors; first: {first}); run `moneta fsck --repair`")]
    Inconsistent {
        /// Errors found.
        count: usize,
        /// The first.
        first: String,
    },
    /// Writing the array failed.
    #[error("cannot write the array: {0}")]
    Io(#[from] std::io::Error),
}

/// Formats the array on `media`: superblock and its backup, empty journal and tables, the
/// root directory and `/lost+found`.
pub fn mkfs(media: &dyn Media, o: &MkfsOptions) -> Result<Geometry, MountError> {
    let g = Geometry::compute(media.size(), o)?;
    // Clear every metadata region (holes where the array can punch them) and, first, any old
    // backup superblock: until the new ones are written, the image is not formatted.
    media.zero(g.backup_superblock_addr(), BLOCK)?;
    media.flush(g.backup_superblock_addr(), BLOCK)?;
    media.zero(0, g.data_off)?;
    if let Some(sums) = g.integrity() {
        // The data region reads as zeros: every block's checksum is that of zeros, so that
        // free space is clean (handed out without zeroing) from the start.
        let zero_sum = moneta_device::integrity::block_sum(&[0u8; DATA_BLOCK as usize]);
        let piece: Vec<u8> = std::iter::repeat_n(zero_sum.to_le_bytes(), 16 << 10)
            .flatten()
            .collect();
        let (start, len) = (sums.sums_off, sums.sums_len());
        let mut at = 0;
        while at < len {
            let n = (len - at).min(piece.len() as u64) as usize;
            journal::write(media, start + at, &piece[..n]);
            at += n as u64;
        }
    }
    let now = Time::now();
    let dir = |nlink: u32, mode: u32| Inode {
        mode: S_IFDIR | mode,
        uid: o.root_uid,
        gid: o.root_gid,
        nlink,
        size: 0,
        atime: now,
        mtime: now,
        ctime: now,
        btime: now,
        generation: 1,
    };
    // The root, and lost+found (inode 2, the first entry) where fsck puts what it finds
    // without a name: made now, so that a repair rarely has to.
    let lost_found = ROOT_INO + 1;
    let inodes = [
        (ROOT_INO, dir(3, o.root_mode & 0o7777)),
        (lost_found, dir(2, 0o700)),
    ];
    for (ino, n) in inodes {
        let rec = n.encode(ino);
        journal::write(media, g.inode_addr(ino), &rec);
        journal::write(
            media,
            g.mirror_of(g.inode_addr(ino)).expect("an inode"),
            &rec,
        );
    }
    let entry = Dirent {
        parent: ROOT_INO,
        ino: lost_found,
        kind: DT_DIR,
        name: crate::repair::LOST_FOUND.to_vec(),
    };
    journal::write(media, g.dirent_addr(0), &entry.encode(0));
    journal::format(media, &g);
    let mut uuid = [0u8; 16];
    uuid[..8].copy_from_slice(&(now.sec as u64).to_le_bytes());
    uuid[8..12].copy_from_slice(&now.nsec.to_le_bytes());
    uuid[12..16].copy_from_slice(&std::process::id().to_le_bytes());
    media.flush(0, g.data_off)?;
    // The superblocks last, the backup first: an interrupted mkfs leaves an unformatted image,
    // or one whose backup names the finished tables.
    let sb = encode_superblock(&g, uuid, now.sec as u64);
    journal::write(media, g.backup_superblock_addr(), &sb);
    media.flush(g.backup_superblock_addr(), BLOCK)?;
    journal::write(media, 0, &sb);
    media.flush(0, BLOCK)?;
    Ok(g)
}

impl Fs {
    /// Mounts the image on `media` with the default options (the `Device` level).
    pub fn mount(media: Arc<dyn Media>) -> Result<Fs, MountError> {
        Fs::mount_with(media, MountOptions::default())
    }

    /// Mounts the image on `media`: replays the journal, checks the tables (refusing an
    /// inconsistent image), frees files that were unlinked while open.
    pub fn mount_with(media: Arc<dyn Media>, opts: MountOptions) -> Result<Fs, MountError> {
        let t = tables::load(&*media)?;
        let report = tables::check(&t);
        if let Some((copy, why)) = &t.sb_damage {
            // The other copy is good and was checked: mend this one now (as fsck would).
            tracing::warn!("the {copy} superblock copy is damaged ({why}); rewriting it");
            crate::repair::rewrite_superblock(&*media, &t)?;
        }
        if let Some(first) = report
            .problems
            .iter()
            .find(|p| p.severity == Severity::Error && p.fix != Some(Fix::RewriteSuperblock))
        {
            return Err(MountError::Inconsistent {
                count: report.errors(),
                first: first.text.clone(),
            });
        }
        let mut journal = Journal::open(&t.sb.geometry, &t.recovered, opts.durability);
        journal.replay(&*media, &t.recovered)?;
        if opts.volatile {
            journal = journal.without_log();
        }
        let mut fs = Fs::from_tables(media, t, journal, &opts);
        let orphans: Vec<u64> = report
            .problems
            .iter()
            .filter_map(|p| match p.fix {
                Some(Fix::FreeInode(ino)) => Some(ino),
                _ => None,
            })
            .collect();
        for ino in orphans {
            tracing::info!(ino, "freeing a file unlinked while open before the restart");
            fs.release(ino)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        // Room past a file's end left by a size lease that a kill or a stop ended: no channel
        // holds records yet, so it goes back now rather than at the file's next last close.
        let rooms: Vec<u64> = fs
            .extents
            .keys()
            .copied()
            .filter(|&ino| fs.past_end(ino))
            .collect();
        for ino in rooms {
            fs.trim_past_end(ino)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        fs.commit()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(fs)
    }

    fn from_tables(media: Arc<dyn Media>, t: Tables, journal: Journal, opts: &MountOptions) -> Fs {
        let g = t.sb.geometry;
        let mut fs = Fs {
            media,
            sb: t.sb,
            g,
            journal,
            free_inodes: BTreeSet::new(),
            dirs: HashMap::default(),
            parent: HashMap::default(),
            free_dirents: BTreeSet::new(),
            symlinks: HashMap::default(),
            extents: HashMap::new(),
            free_extents: BTreeSet::new(),
            space: Space::new(ChunkMap::from_words(t.bitmap, g.chunk_count), opts.fresh),
            reserves: HashMap::new(),
            reserve_chunks: opts.append_reserve / g.chunk_size,
            volatile: opts.volatile,
            images: !(opts.volatile && opts.durability == Durability::Device),
            doomed: Vec::new(),
            next_zero_batch: FIRST_ZERO_BATCH,
            sums: g.integrity(),
            open: HashMap::new(),
            txn: Txn::default(),
            dirty: BTreeSet::new(),
            revoker: None,
            quick: false,
            failed: None,
            layouts: HashMap::new(),
            next_layout: 1,
            watches: Watches::default(),
            sink: None,
            touched: BTreeSet::new(),
            grants: HashMap::new(),
            grown: Default::default(),
            size_read: Default::default(),
            inodes: t.inodes,
        };
        for (i, n) in fs.inodes.iter().enumerate() {
            if !n.is_used() {
                fs.free_inodes.insert(i as u64 + 1);
            } else if n.is_dir() {
                fs.dirs.insert(i as u64 + 1, Dir::default());
            }
        }
        fs.parent.insert(ROOT_INO, ROOT_INO);
        for slot in 0..g.dirent_count {
            if !t.dirents.contains_key(&slot) {
                fs.free_dirents.insert(slot);
            }
        }
        for (slot, d) in t.dirents {
            if d.parent == SYMLINK_TARGET {
                fs.symlinks.insert(d.ino, (slot, d.name));
                continue;
            }
            if fs.inodes[(d.ino - 1) as usize].is_dir() {
                fs.parent.insert(d.ino, d.parent);
            }
            let dir = fs.dirs.entry(d.parent).or_default();
            let name: Name = d.name.into();
            dir.by_slot.insert(slot, name.clone());
            dir.by_name.insert(name, (d.ino, slot));
        }
        for slot in 0..g.extent_count {
            if !t.extents.contains_key(&slot) {
                fs.free_extents.insert(slot);
            }
        }
        for (slot, x) in t.extents {
            fs.extents.entry(x.ino).or_default().insert(
                x.file_chunk,
                Ext {
                    dev: x.dev_chunk,
                    count: x.count as u64,
                    slot,
                },
            );
        }
        fs
    }

    /// Sets the hook that revokes channel access to ranges about to be freed.
    pub fn set_revoker(&mut self, r: Revoker) {
        self.revoker = Some(r);
    }

    /// Where fired watches go ([`Fs::watch`]).
    pub fn set_change_sink(&mut self, sink: Arc<dyn ChangeSink>) {
        self.sink = Some(sink);
    }

    /// Where the journal shows how far its transactions are committed and durable
    /// ([`crate::journal::Progress`]).
    pub fn set_progress(&mut self, p: Arc<dyn crate::journal::Progress>) {
        self.journal.set_progress(p);
    }

    /// `observer` keeps an answer in `slot` that depends on `inos`: the next transaction that
    /// changes one of them tells the change sink (observer, slot) before it returns (see
    /// [`crate::watch`]).
    pub fn watch(&mut self, observer: u32, slot: u16, inos: &[u64]) {
        if !self.grants.is_empty() && inos.iter().any(|i| self.grants.contains_key(i)) {
            // A granted file's size changes with no call: the answer must not be kept.
            self.unkept(observer, slot);
            return;
        }
        self.watch_holder(observer, slot, inos);
    }

    /// [`Fs::watch`] even of a file with a size grant out: for an answer that only the
    /// grant's holder asked, about the very handle the grant is on, which adds the size it
    /// published itself (docs/abi.md §3.9). Nothing but the size changes with no call.
    pub fn watch_holder(&mut self, observer: u32, slot: u16, inos: &[u64]) {
        let sink = self.sink.clone();
        self.watches.watch(observer, slot, inos, sink.as_deref());
    }

    /// How many more things `observer`'s kept answers may depend on (see [`crate::watch`]).
    pub fn watch_room(&self, observer: u32) -> usize {
        self.watches.room(observer)
    }

    /// `observer`'s answer in `slot` is not kept: the counter moves at once (the client read
    /// it before it asked).
    pub fn unkept(&self, observer: u32, slot: u16) {
        if let Some(sink) = &self.sink {
            sink.changed(observer, slot);
        }
    }

    /// Forgets every watch of `observer`.
    pub fn unwatch(&mut self, observer: u32) {
        self.watches.forget(observer);
    }

    /// Watches held now, of every observer.
    pub fn watch_count(&self) -> usize {
        self.watches.len()
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.g
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Where the data checksums are, for the device to keep them; `None` when the image has
    /// none.
    pub fn integrity(&self) -> Option<IntegrityConfig> {
        self.sums
    }

    /// The sequence number of the last metadata transaction.
    pub fn journal_seq(&self) -> u64 {
        self.journal.seq()
    }

    /// The durability level it was mounted with.
    pub fn durability(&self) -> Durability {
        self.journal.level()
    }

    /// Whether nothing reads the array after this mount (a volatile array, gone with the
    /// daemon): nothing on it is durable past the daemon, whatever the level.
    pub fn volatile(&self) -> bool {
        self.volatile
    }

    /// The array.
    pub fn media(&self) -> Arc<dyn Media> {
        self.media.clone()
    }

    /// Free chunks by state: (clean, dirty, pending, held in reserves), for reports and tests.
    pub fn space_states(&self) -> (u64, u64, u64, u64) {
        let s = &self.space;
        (s.clean(), s.dirty(), s.pending(), s.held())
    }

    // ---- internal helpers -------------------------------------------------------------

    fn check_alive(&self) -> FsResult<()> {
        match &self.failed {
            Some(why) => e(
                libc::EIO,
                format!("the file system stopped after an error: {why}"),
            ),
            None => Ok(()),
        }
    }

    fn inode(&self, ino: u64) -> &Inode {
        &self.inodes[(ino - 1) as usize]
    }

    fn inode_mut(&mut self, ino: u64) -> &mut Inode {
        self.dirty.insert(ino);
        &mut self.inodes[(ino - 1) as usize]
    }

    /// Zeroes array bytes of data chunks, keeping their checksums true.
    fn zero(&self, addr: u64, len: u64) -> std::io::Result<()> {
        match &self.sums {
            Some(sums) => sums.zero(&*self.media, addr, len),
            None => self.media.zero(addr, len),
        }
    }

    /// Gives a file's reserve back.
    fn drop_reserve(&mut self, ino: u64) {
        if let Some((s, e)) = self.reserves.remove(&ino) {
            self.space.unreserve(s, e - s);
        }
    }

    /// Marks the file system failed after a change was half made in memory.
    fn fail(&mut self, why: &FsError) -> FsError {
        let msg = format!("a change could not be completed: {why}");
        tracing::error!("{msg}");
        self.failed = Some(msg);
        why.clone()
    }

    fn stat_of(&self, ino: u64) -> Stat {
        let n = self.inode(ino);
        let chunks: u64 = self
            .extents
            .get(&ino)
            .map(|m| m.values().map(|x| x.count).sum())
            .unwrap_or(0);
        Stat {
            ino,
            mode: n.mode,
            nlink: n.nlink,
            uid: n.uid,
            gid: n.gid,
            size: self.size_now(ino),
            blocks: chunks * self.g.chunk_size / 512,
            blksize: self.g.chunk_size,
            atime: n.atime,
            mtime: n.mtime,
            ctime: n.ctime,
            btime: n.btime,
            generation: n.generation,
        }
    }

    fn need_dir_write(&self, cred: &Cred, dir: u64) -> FsResult<()> {
        if !may(self.inode(dir), cred, MAY_WRITE | MAY_EXEC) {
            return e(libc::EACCES, "write permission denied on the directory");
        }
        Ok(())
    }

    /// The sticky-bit rule: in a sticky directory only the owner of the entry, the owner of the
    /// directory or root may remove or rename it.
    fn sticky_ok(&self, cred: &Cred, dir: u64, victim: u64) -> FsResult<()> {
        let d = self.inode(dir);
        if d.mode & 0o1000 != 0
            && !cred.is_root()
            && cred.uid != d.uid
            && cred.uid != self.inode(victim).uid
        {
            return e(
                libc::EPERM,
                "the directory is sticky and the entry is not yours",
            );
        }
        Ok(())
    }

    /// The group of a new inode in `dir`: the directory's if it is set-group-ID, else the
    /// creator's.
    fn new_gid(&self, dir: u64, cred: &Cred) -> u32 {
        let d = self.inode(dir);
        if d.mode & 0o2000 != 0 {
            d.gid
        } else {
            cred.gid
        }
    }

    fn touch_dir(&mut self, dir: u64, now: Time) {
        let d = self.inode_mut(dir);
        d.mtime = now;
        d.ctime = now;
    }

    fn check_room(&self, inodes: usize, dirents: usize) -> FsResult<()> {
        if self.free_inodes.len() < inodes {
            return e(libc::ENOSPC, "no free inodes");
        }
        if self.free_dirents.len() < dirents {
            return e(libc::ENOSPC, "no free directory entries");
        }
        Ok(())
    }

    fn new_inode(&mut self, mode: u32, uid: u32, gid: u32, nlink: u32, now: Time) -> u64 {
        let ino = self.free_inodes.pop_first().expect("room checked");
        let generation = self.inode(ino).generation.wrapping_add(1);
        *self.inode_mut(ino) = Inode {
            mode,
            uid,
            gid,
            nlink,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            generation,
        };
        if mode & S_IFMT == S_IFDIR {
            self.dirs.insert(ino, Dir::default());
        }
        ino
    }

    fn add_entry(&mut self, dir: u64, name: &[u8], ino: u64) {
        let slot = self.free_dirents.pop_first().expect("room checked");
        let kind = kind_of(self.inode(ino).mode);
        // The directory's names change, and a directory moved here has another `..`.
        self.touched.insert(dir);
        self.touched.insert(watch::name_key(dir, name));
        if kind == DT_DIR {
            self.touched.insert(ino);
            self.touched.insert(watch::name_key(ino, b".."));
        }
        let rec = Dirent {
            parent: dir,
            ino,
            kind,
            name: name.to_vec(),
        };
        if self.images {
            self.txn.put(self.g.dirent_addr(slot), &rec.encode(slot));
        }
        let d = self.dirs.get_mut(&dir).expect("a directory");
        let name: Name = name.into();
        d.by_name.insert(name.clone(), (ino, slot));
        d.by_slot.insert(slot, name);
        if kind == DT_DIR {
            self.parent.insert(ino, dir);
        }
    }

    fn remove_entry(&mut self, dir: u64, name: &[u8]) -> u64 {
        self.touched.insert(dir);
        self.touched.insert(watch::name_key(dir, name));
        let d = self.dirs.get_mut(&dir).expect("a directory");
        let (ino, slot) = d.by_name.remove(name).expect("entry exists");
        d.by_slot.remove(&slot);
        if self.images {
            self.txn
                .put(self.g.dirent_addr(slot), &[0u8; DIRENT_SIZE as usize]);
        }
        self.free_dirents.insert(slot);
        ino
    }

    /// Array ranges of the chunks of `ino` from file chunk `from` on.
    fn ranges_from(&self, ino: u64, from: u64) -> Vec<(u64, u64)> {
        let cs = self.g.chunk_size;
        let mut out = Vec::new();
        if let Some(m) = self.extents.get(&ino) {
            for (&fc, x) in m.iter() {
                let end = fc + x.count;
                if end <= from {
                    continue;
                }
                let skip = from.saturating_sub(fc);
                out.push((self.g.chunk_addr(x.dev + skip), (x.count - skip) * cs));
            }
        }
        out
    }

    // ---- the calls ---------------------------------------------------------------------

    /// `stat`/`lstat`.
    pub fn stat(&self, cred: &Cred, path: &[u8], follow: bool) -> FsResult<Stat> {
        let ino = self.resolve(cred, path, follow)?;
        Ok(self.stat_of(ino))
    }

    /// [`Fs::stat`], also listing in `seen` every inode the answer depended on, whatever it
    /// is (an error too): each directory searched, each link followed, and the file.
    pub fn stat_seen(
        &self,
        cred: &Cred,
        path: &[u8],
        follow: bool,
        seen: &mut Vec<u64>,
    ) -> FsResult<Stat> {
        let (parts, slash) = Self::split(path)?;
        let (ino, _) = self.walk_seen(cred, &parts, follow, slash, Some(seen))?;
        Ok(self.stat_of(ino))
    }

    /// Attributes of an inode (`fstat` on a handle).
    pub fn stat_ino(&self, ino: u64) -> Stat {
        self.stat_of(ino)
    }

    /// Resolves a path to its inode.
    pub fn lookup(&self, cred: &Cred, path: &[u8], follow: bool) -> FsResult<u64> {
        self.resolve(cred, path, follow)
    }

    /// The mapping of `[off, off + len)` of a regular file, clipped to its size: whole extents
    /// that intersect it and the holes between them, at most `max` runs.
    pub fn map(&self, ino: u64, off: u64, len: u64, max: usize) -> FsResult<(u64, Vec<Mapping>)> {
        let n = self.inode(ino);
        if !n.is_reg() {
            return e(libc::EINVAL, "not a regular file");
        }
        let size = self.size_now(ino);
        let end = off.saturating_add(len).min(size);
        let mut out = Vec::new();
        if off >= end {
            return Ok((size, out));
        }
        let cs = self.g.chunk_size;
        let (first, last) = (off / cs, (end - 1) / cs);
        let empty = BTreeMap::new();
        let m = self.extents.get(&ino).unwrap_or(&empty);
        let mut at = first;
        // An extent that starts before `first` but covers it.
        let start_key = m.range(..=first).next_back().map(|(k, _)| *k);
        let iter = start_key
            .into_iter()
            .chain(m.range(first + 1..last + 1).map(|(k, _)| *k));
        for fc in iter {
            let x = m[&fc];
            if fc + x.count <= at {
                continue;
            }
            if fc > at {
                out.push(Mapping {
                    file_off: at * cs,
                    len: (fc - at) * cs,
                    dev: None,
                });
            }
            out.push(Mapping {
                file_off: fc * cs,
                len: x.count * cs,
                dev: Some(self.g.chunk_addr(x.dev)),
            });
            at = fc + x.count;
            if out.len() >= max {
                return Ok((size, out));
            }
        }
        if at <= last {
            out.push(Mapping {
                file_off: at * cs,
                len: (last + 1 - at) * cs,
                dev: None,
            });
        }
        out.truncate(max.max(1));
        Ok((size, out))
    }

    /// The generation of inode `ino` (it changes when the number is given to a new file).
    pub fn generation(&self, ino: u64) -> u32 {
        self.inode(ino).generation
    }

    /// The extents of `ino`'s allocated space (array address, length) that overlap the array
    /// range `[addr, addr + len)`, having looked at no more than `limit` of its extents:
    /// `None` when it has more (the caller's work stays bounded).
    pub fn allocated_over(
        &self,
        ino: u64,
        addr: u64,
        len: u64,
        limit: usize,
    ) -> Option<Vec<(u64, u64)>> {
        let cs = self.g.chunk_size;
        let end = addr.saturating_add(len);
        let mut out = Vec::new();
        for (i, x) in self
            .extents
            .get(&ino)
            .into_iter()
            .flatten()
            .map(|(_, x)| x)
            .enumerate()
        {
            if i >= limit {
                return None;
            }
            let (a, l) = (self.g.chunk_addr(x.dev), x.count * cs);
            if a < end && a.saturating_add(l) > addr {
                out.push((a, l));
            }
        }
        Some(out)
    }

    /// Every extent of `ino`, past its size too (space reserved ahead of appends):
    /// `(file offset, array address, bytes)`, in file order, adjacent extents merged.
    pub fn allocated(&self, ino: u64) -> Vec<(u64, u64, u64)> {
        let cs = self.g.chunk_size;
        let mut out: Vec<(u64, u64, u64)> = Vec::new();
        for (&fc, x) in self.extents.get(&ino).into_iter().flatten() {
            let (off, addr, len) = (fc * cs, self.g.chunk_addr(x.dev), x.count * cs);
            match out.last_mut() {
                Some(last) if last.0 + last.2 == off && last.1 + last.2 == addr => last.2 += len,
                _ => out.push((off, addr, len)),
            }
        }
        out
    }

    /// `chmod(2)` on an inode: owner or root.
    pub fn chmod(&mut self, cred: &Cred, ino: u64, mode: u32) -> FsResult<()> {
        self.check_alive()?;
        let n = *self.inode(ino);
        if !cred.is_root() && cred.uid != n.uid {
            return e(libc::EPERM, "only the owner or root may change the mode");
        }
        let mut bits = mode & 0o7777;
        if !cred.is_root() && !n.is_dir() && !cred.in_group(n.gid) {
            bits &= !0o2000;
        }
        let m = self.inode_mut(ino);
        m.mode = (n.mode & S_IFMT) | bits;
        m.ctime = Time::now();
        self.touched.insert(watch::search_key(ino));
        self.commit()
    }

    /// `chown(2)` on an inode: changing the owner is root's; the owner may change the group to
    /// one of its own. Clears set-user-ID and set-group-ID on files, as Linux does.
    pub fn chown(
        &mut self,
        cred: &Cred,
        ino: u64,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> FsResult<()> {
        self.check_alive()?;
        let n = *self.inode(ino);
        let uid_change = uid.is_some_and(|u| u != n.uid);
        let gid_change = gid.is_some_and(|g| g != n.gid);
        if !cred.is_root() {
            if uid_change {
                return e(libc::EPERM, "only root may change the owner");
            }
            if gid_change && (cred.uid != n.uid || !cred.in_group(gid.unwrap_or(n.gid))) {
                return e(
                    libc::EPERM,
                    "only the owner may change the group, to one of its groups",
                );
            }
            if gid.is_some() && !gid_change && cred.uid != n.uid {
                return e(libc::EPERM, "operation not permitted");
            }
        }
        if uid.is_none() && gid.is_none() {
            return Ok(());
        }
        let m = self.inode_mut(ino);
        if let Some(u) = uid {
            m.uid = u;
        }
        if let Some(g) = gid {
            m.gid = g;
        }
        if !m.is_dir() {
            m.mode &= !0o4000;
            if m.mode & 0o010 != 0 {
                m.mode &= !0o2000;
            }
        }
        m.ctime = Time::now();
        self.touched.insert(watch::search_key(ino));
        self.commit()
    }

    /// `utimensat(2)` on an inode.
    pub fn utimes(
        &mut self,
        cred: &Cred,
        ino: u64,
        atime: SetTime,
        mtime: SetTime,
    ) -> FsResult<()> {
        self.check_alive()?;
        if atime == SetTime::Omit && mtime == SetTime::Omit {
            return Ok(());
        }
        let n = *self.inode(ino);
        let explicit = matches!(atime, SetTime::At(_)) || matches!(mtime, SetTime::At(_));
        let owner = cred.is_root() || cred.uid == n.uid;
        if explicit && !owner {
            return e(libc::EPERM, "only the owner or root may set explicit times");
        }
        if !explicit && !owner && !may(&n, cred, MAY_WRITE) {
            return e(libc::EACCES, "permission denied");
        }
        let now = Time::now();
        let pick = |s: SetTime, old: Time| match s {
            SetTime::Now => now,
            SetTime::Omit => old,
            SetTime::At(t) => t,
        };
        let m = self.inode_mut(ino);
        m.atime = pick(atime, n.atime);
        m.mtime = pick(mtime, n.mtime);
        m.ctime = now;
        self.commit()
    }

    /// Entries of a directory after `cookie` (0 starts with `.` and `..`), at most `max`.
    /// Returns the entries and whether the end was reached.
    pub fn readdir(&self, ino: u64, cookie: u64, max: usize) -> FsResult<(Vec<DirEntry>, bool)> {
        let Some(d) = self.dirs.get(&ino) else {
            return e(libc::ENOTDIR, "not a directory");
        };
        if !self.inode(ino).is_used() || self.inode(ino).nlink == 0 {
            return Ok((Vec::new(), true));
        }
        let mut out = Vec::new();
        if cookie == 0 {
            if max == 0 {
                return Ok((out, false));
            }
            out.push(DirEntry {
                ino,
                kind: DT_DIR,
                name: b".".to_vec(),
                next: 1,
            });
        }
        if cookie <= 1 {
            if out.len() >= max {
                return Ok((out, false));
            }
            out.push(DirEntry {
                ino: self.parent[&ino],
                kind: DT_DIR,
                name: b"..".to_vec(),
                next: 2,
            });
        }
        let from = cookie.max(2) - 2;
        for (&slot, name) in d.by_slot.range(from..) {
            if out.len() >= max {
                return Ok((out, false));
            }
            let (child, _) = d.by_name[name];
            out.push(DirEntry {
                ino: child,
                kind: kind_of(self.inode(child).mode),
                name: name.to_vec(),
                next: slot + 3,
            });
        }
        Ok((out, true))
    }

    /// Totals for `statfs`.
    pub fn statfs(&self) -> StatFs {
        StatFs {
            chunk_size: self.g.chunk_size,
            chunks: self.g.chunk_count,
            chunks_free: self.space.free(),
            inodes: self.g.inode_count,
            inodes_free: self.free_inodes.len() as u64,
            name_max: NAME_MAX as u64,
        }
    }

    /// The inode's link count (0 for one not in use).
    pub fn nlink(&self, ino: u64) -> u32 {
        if self.exists(ino) {
            self.inode(ino).nlink
        } else {
            0
        }
    }

    /// Open handles counted for `ino`.
    pub fn open_count(&self, ino: u64) -> u32 {
        self.open.get(&ino).copied().unwrap_or(0)
    }

    /// Whether an inode is in use.
    pub fn exists(&self, ino: u64) -> bool {
        ino >= 1 && ino <= self.g.inode_count && self.inode(ino).is_used()
    }

    /// Checks the file system's metadata on the array against itself (as `fsck` does).
    pub fn check(&self) -> tables::Report {
        match tables::load(&*self.media) {
            Ok(t) => tables::check(&t),
            Err(err) => tables::Report {
                problems: vec![tables::Problem {
                    severity: Severity::Error,
                    text: err.to_string(),
                    fix: None,
                }],
                ..Default::default()
            },
        }
    }
}
