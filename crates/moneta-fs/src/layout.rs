//! The on-array format of nvfs: every structure, its size and its byte offsets.
//!
//! All integers are little-endian. An image (format version 3) is laid out as
//!
//! ```text
//! 0                  superblock (the first 512 bytes of a 4 KiB block, CRC-32 protected)
//! journal_off        journal: a 4 KiB head block, then a circular log of transactions
//! inode_off          inode table: inode_count records of 128 bytes (inode n at index n - 1)
//! dirent_off         directory-entry table: dirent_count records of 280 bytes
//! extent_off         extent table: extent_count records of 32 bytes
//! bitmap_off         chunk bitmap: one bit per data chunk, 1 = in use
//! inode_mirror_off   second copy of the inode table
//! extent_mirror_off  second copy of the extent table
//! sums_off           data checksums (with --data-checksums): a CRC-32C per 4 KiB data block
//! data_off           data chunks (chunk-aligned), chunk_count of them
//! array_size - 4096  backup superblock (a copy of block 0)
//! ```
//!
//! Metadata lives in fixed-size records in fixed tables; a change to the file system is a set
//! of whole-record images, logged to the journal and then written in place (see
//! [`crate::journal`]), the inode and extent records in both copies.
//!
//! The chunk is the allocation unit: one 4 KiB block by default, so a small file takes space
//! near its size (format version 3; version 2 gave out 1 MiB chunks and sized its tables for
//! them). Files that grow by appends keep a reservation ahead of them in memory (see
//! [`crate::fs`]), which keeps them in few extents without taking space on the array.
//!
//! What one damaged 512-byte sector may cost, and why the layout is so: every inode,
//! directory-entry and extent record carries a CRC-32C of its bytes and its own index, so a
//! damaged record is found and never trusted; an all-zero record is a free one. The inode and
//! extent tables, small and the only place that says which data belong to which file, have a
//! second copy apart from the first (past the large directory table), so one damaged sector
//! leaves one good copy. Directory entries have none: losing one loses a name, and `fsck`
//! puts the file in `/lost+found`. The bitmap is redundant with the extents. The superblock has
//! a backup in the array's last block, away from the start where most accidents (a stray
//! `dd`, a partition table) land. Images of versions 1 (no checksums, no copies) and 2 (1 MiB
//! chunks, a journal of one transaction) are refused with a message: this build does not read
//! them.

/// Bytes 0..8 of a formatted image.
pub const MAGIC: [u8; 8] = *b"NVFS\x00\x01\r\n";
/// Format version this code reads and writes.
pub const VERSION: u32 = 3;
/// Superblock flag: the data region has a CRC-32C per [`DATA_BLOCK`] bytes at `sums_off`.
pub const FLAG_DATA_CHECKSUMS: u32 = 1;
/// Bytes per checksummed data block.
pub const DATA_BLOCK: u64 = 4096;
/// Bytes of the encoded superblock.
pub const SUPERBLOCK_SIZE: usize = 512;
/// Alignment of the metadata regions.
pub const BLOCK: u64 = 4096;
/// Bytes per inode record.
pub const INODE_SIZE: u64 = 128;
/// Bytes per directory-entry record.
pub const DIRENT_SIZE: u64 = 280;
/// Bytes per extent record.
pub const EXTENT_SIZE: u64 = 32;
/// Longest name of a directory entry, and longest symlink target.
pub const NAME_MAX: usize = 255;
/// Inode number of the root directory.
pub const ROOT_INO: u64 = 1;
/// `parent` value of a directory-entry record that holds a symlink's target instead of a name.
pub const SYMLINK_TARGET: u64 = u64::MAX;
/// Smallest chunk (allocation unit).
pub const MIN_CHUNK: u64 = 4096;
/// Default chunk: one 4 KiB block, so that a small file takes space near its size. (Version 2
/// gave out 1 MiB chunks, the paper's answer to fragmentation; appending files keep a 1 MiB
/// reservation ahead of them instead, see [`crate::fs::DEFAULT_APPEND_RESERVE`].)
pub const DEFAULT_CHUNK: u64 = 4096;
/// Array bytes per inode when mkfs is not told the count (ext4's default ratio).
pub const BYTES_PER_INODE: u64 = 16 << 10;
/// Array bytes per byte of journal when mkfs sizes the journal, within
/// [`MIN_JOURNAL`]..=[`MAX_JOURNAL`].
pub const BYTES_PER_JOURNAL_BYTE: u64 = 1024;
/// Smallest journal log (after its head block).
pub const MIN_JOURNAL: u64 = 64 << 10;
/// Largest journal log mkfs makes.
pub const MAX_JOURNAL: u64 = 64 << 20;
/// Most hard links to one inode (as ext4).
pub const LINK_MAX: u32 = 65000;

/// File type bits of a mode.
pub const S_IFMT: u32 = 0o170000;
/// Directory.
pub const S_IFDIR: u32 = 0o040000;
/// Regular file.
pub const S_IFREG: u32 = 0o100000;
/// Symbolic link.
pub const S_IFLNK: u32 = 0o120000;

/// Directory-entry kinds (the `DT_*` values of `readdir`).
pub const DT_DIR: u8 = 4;
/// Regular file.
pub const DT_REG: u8 = 8;
/// Symbolic link.
pub const DT_LNK: u8 = 10;

/// The `DT_*` kind of a mode.
pub fn kind_of(mode: u32) -> u8 {
    match mode & S_IFMT {
        S_IFDIR => DT_DIR,
        S_IFLNK => DT_LNK,
        _ => DT_REG,
    }
}

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// Why an image cannot be read or formatted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    /// No nvfs magic at offset 0.
    #[error(
        "not an nvfs image (no nvfs superblock at offset 0); format it with `moneta mkfs` \
         or serve it as a raw device with `--raw`"
    )]
    NotFormatted,
    /// Another version.
    #[error(
        "nvfs format version {0} is not supported: this build reads version {VERSION} \
         (4 KiB allocation, a metadata log of many transactions; version 2 gave out 1 MiB \
         chunks); the image is left as it is: copy its files out with the moneta build that \
         made it, then make a new file system with `moneta mkfs --force`"
    )]
    Version(u32),
    /// Checksum mismatch.
    #[error(
        "the nvfs superblock is corrupt (checksum mismatch), and so is its backup in the \
         array's last block"
    )]
    Checksum,
    /// Fields that contradict each other or the array.
    #[error("the nvfs superblock is inconsistent: {0}")]
    Geometry(String),
}

/// The geometry of an image: what mkfs decides and the superblock records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes in the array.
    pub array_size: u64,
    /// Allocation unit.
    pub chunk_size: u64,
    /// Inode records.
    pub inode_count: u64,
    /// Directory-entry records.
    pub dirent_count: u64,
    /// Extent records.
    pub extent_count: u64,
    /// Journal region.
    pub journal_off: u64,
    /// Bytes of journal, header block included.
    pub journal_len: u64,
    /// Inode table.
    pub inode_off: u64,
    /// Directory-entry table.
    pub dirent_off: u64,
    /// Extent table.
    pub extent_off: u64,
    /// Chunk bitmap.
    pub bitmap_off: u64,
    /// Bytes of bitmap (a multiple of 8).
    pub bitmap_len: u64,
    /// Second copy of the inode table.
    pub inode_mirror_off: u64,
    /// Second copy of the extent table.
    pub extent_mirror_off: u64,
    /// Data checksums: a CRC-32C per [`DATA_BLOCK`] of the data region (0 bytes without).
    pub sums_off: u64,
    /// Bytes of the checksum table.
    pub sums_len: u64,
    /// First data chunk.
    pub data_off: u64,
    /// Data chunks.
    pub chunk_count: u64,
}

/// What `mkfs` may be told.
#[derive(Clone, Copy, Debug)]
pub struct MkfsOptions {
    /// Allocation unit (a power of two, at least 4 KiB).
    pub chunk_size: u64,
    /// Inodes; `None` picks one per 16 KiB of array (at least 1,024).
    pub inode_count: Option<u64>,
    /// Directory entries; `None` picks one and a half per inode.
    pub dirent_count: Option<u64>,
    /// Owner of the root directory.
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
    /// Permission bits of the root directory.
    pub root_mode: u32,
    /// Keep a CRC-32C of every 4 KiB data block, checked on every read.
    pub data_checksums: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            chunk_size: DEFAULT_CHUNK,
            inode_count: None,
            dirent_count: None,
            root_uid: 0,
            root_gid: 0,
            root_mode: 0o755,
            data_checksums: false,
        }
    }
}

impl Geometry {
    /// Lays out an array of `array_size` bytes.
    pub fn compute(array_size: u64, o: &MkfsOptions) -> Result<Geometry, FormatError> {
        let bad = |m: String| Err(FormatError::Geometry(m));
        if !o.chunk_size.is_power_of_two() || o.chunk_size < MIN_CHUNK {
            return bad(format!(
                "chunk size {} is not a power of two of at least 4 KiB",
                o.chunk_size
            ));
        }
        let inode_count = o
            .inode_count
            .unwrap_or_else(|| (array_size / BYTES_PER_INODE).clamp(1024, 1 << 22));
        let dirent_count = o.dirent_count.unwrap_or(inode_count * 3 / 2);
        if inode_count == 0 || inode_count > u32::MAX as u64 || dirent_count == 0 {
            return bad("inode and directory-entry counts must be at least 1".into());
        }
        // At most this many chunks; the bitmap sized by it is large enough.
        let max_chunks = array_size / o.chunk_size;
        // Most files are one extent. Two records per inode, or one per 16 chunks when that is
        // more; never more than one per chunk (a file's extents cannot outnumber its chunks, so
        // a table of one per chunk cannot fill up). A fragmented file system can fill a smaller
        // one: extends then fail with ENOSPC.
        let extent_count = (inode_count * 2)
            .max(max_chunks / 16)
            .min(max_chunks)
            .max(1);
        let bitmap_len = round_up(max_chunks.div_ceil(8).max(8), 8);
        // The log holds many transactions between checkpoints; calls that would make one too
        // large for it (freeing a fragmented file) split themselves.
        let journal_len = BLOCK
            + round_up(
                (array_size / BYTES_PER_JOURNAL_BYTE).clamp(MIN_JOURNAL, MAX_JOURNAL),
                BLOCK,
            );
        let journal_off = BLOCK;
        let inode_off = journal_off + journal_len;
        let dirent_off = round_up(inode_off + inode_count * INODE_SIZE, BLOCK);
        let extent_off = round_up(dirent_off + dirent_count * DIRENT_SIZE, BLOCK);
        let bitmap_off = round_up(extent_off + extent_count * EXTENT_SIZE, BLOCK);
        let inode_mirror_off = round_up(bitmap_off + bitmap_len, BLOCK);
        let extent_mirror_off = round_up(inode_mirror_off + inode_count * INODE_SIZE, BLOCK);
        let sums_off = round_up(extent_mirror_off + extent_count * EXTENT_SIZE, BLOCK);
        let sums_len = if o.data_checksums {
            round_up(max_chunks * (o.chunk_size / DATA_BLOCK) * 4, BLOCK)
        } else {
            0
        };
        let data_off = round_up(sums_off + sums_len, o.chunk_size.max(BLOCK));
        // The last block holds the backup superblock.
        let room = array_size.saturating_sub(BLOCK);
        if data_off >= room || (room - data_off) / o.chunk_size == 0 {
            return bad(format!(
                "an array of {array_size} bytes has no room for data after {data_off} bytes of \
                 metadata; use a larger device or fewer inodes"
            ));
        }
        let chunk_count = (room - data_off) / o.chunk_size;
        Ok(Geometry {
            array_size,
            chunk_size: o.chunk_size,
            inode_count,
            dirent_count,
            extent_count,
            journal_off,
            journal_len,
            inode_off,
            dirent_off,
            extent_off,
            bitmap_off,
            bitmap_len,
            inode_mirror_off,
            extent_mirror_off,
            sums_off,
            sums_len,
            data_off,
            chunk_count,
        })
    }

    /// Checks that the regions are ordered, aligned and inside the array.
    pub fn check(&self) -> Result<(), FormatError> {
        let bad = |m: &str| Err(FormatError::Geometry(m.into()));
        if !self.chunk_size.is_power_of_two() || self.chunk_size < MIN_CHUNK {
            return bad("chunk size");
        }
        if self.inode_count == 0 || self.inode_count > u32::MAX as u64 || self.dirent_count == 0 {
            return bad("table sizes");
        }
        let ordered = [
            (BLOCK, self.journal_off),
            (self.journal_off + self.journal_len, self.inode_off),
            (
                self.inode_off + self.inode_count * INODE_SIZE,
                self.dirent_off,
            ),
            (
                self.dirent_off + self.dirent_count * DIRENT_SIZE,
                self.extent_off,
            ),
            (
                self.extent_off + self.extent_count * EXTENT_SIZE,
                self.bitmap_off,
            ),
            (self.bitmap_off + self.bitmap_len, self.inode_mirror_off),
            (
                self.inode_mirror_off + self.inode_count * INODE_SIZE,
                self.extent_mirror_off,
            ),
            (
                self.extent_mirror_off + self.extent_count * EXTENT_SIZE,
                self.sums_off,
            ),
            (self.sums_off + self.sums_len, self.data_off),
        ];
        if ordered.iter().any(|&(end, next)| end > next) {
            return bad("regions overlap");
        }
        if self.journal_len < BLOCK + MIN_JOURNAL || !self.bitmap_len.is_multiple_of(8) {
            return bad("journal or bitmap size");
        }
        if self.bitmap_len * 8 < self.chunk_count || self.extent_count == 0 {
            return bad("bitmap smaller than the chunk count, or no extent records");
        }
        if !self.data_off.is_multiple_of(self.chunk_size)
            || self.chunk_count == 0
            || self
                .chunk_count
                .checked_mul(self.chunk_size)
                .and_then(|d| d.checked_add(self.data_off))
                .is_none_or(|end| end > self.array_size - BLOCK)
        {
            return bad("data region outside the array");
        }
        if self.sums_len != 0 && self.sums_len < self.chunk_count * self.blocks_per_chunk() * 4 {
            return bad("checksum table smaller than the data region");
        }
        Ok(())
    }

    /// Whether data blocks are checksummed.
    pub fn data_checksums(&self) -> bool {
        self.sums_len != 0
    }

    /// Checksummed blocks per chunk.
    pub fn blocks_per_chunk(&self) -> u64 {
        self.chunk_size / DATA_BLOCK
    }

    /// Where the data checksums are, for the device and for `fsck --data`.
    pub fn integrity(&self) -> Option<moneta_device::IntegrityConfig> {
        self.data_checksums()
            .then(|| moneta_device::IntegrityConfig {
                data_off: self.data_off,
                data_len: self.chunk_count * self.chunk_size,
                sums_off: self.sums_off,
                block: DATA_BLOCK,
            })
    }

    /// Array address of the backup superblock: the array's last block.
    pub fn backup_superblock_addr(&self) -> u64 {
        self.array_size - BLOCK
    }

    /// Where the copy of the metadata at `addr` lies, for the mirrored tables (inodes and
    /// extents); `None` elsewhere.
    pub fn mirror_of(&self, addr: u64) -> Option<u64> {
        let inodes = self.inode_off..self.inode_off + self.inode_count * INODE_SIZE;
        let extents = self.extent_off..self.extent_off + self.extent_count * EXTENT_SIZE;
        if inodes.contains(&addr) {
            Some(addr - self.inode_off + self.inode_mirror_off)
        } else if extents.contains(&addr) {
            Some(addr - self.extent_off + self.extent_mirror_off)
        } else {
            None
        }
    }

    /// End of the tables a transaction may change (inodes, entries, extents, bitmap); the
    /// mirrors are written with their originals.
    pub fn tables_end(&self) -> u64 {
        self.bitmap_off + self.bitmap_len
    }

    /// Array address of inode `ino`'s record.
    pub fn inode_addr(&self, ino: u64) -> u64 {
        self.inode_off + (ino - 1) * INODE_SIZE
    }

    /// Array address of directory-entry record `slot`.
    pub fn dirent_addr(&self, slot: u64) -> u64 {
        self.dirent_off + slot * DIRENT_SIZE
    }

    /// Array address of extent record `slot`.
    pub fn extent_addr(&self, slot: u64) -> u64 {
        self.extent_off + slot * EXTENT_SIZE
    }

    /// Array address of data chunk `chunk`.
    pub fn chunk_addr(&self, chunk: u64) -> u64 {
        self.data_off + chunk * self.chunk_size
    }

    /// Bytes of metadata before the first data chunk.
    pub fn metadata_bytes(&self) -> u64 {
        self.data_off
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}
fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Superblock field offsets: magic 0, version 8, flags 12, array size 16, chunk size 24, inode
/// count 32, dirent count 40, extent count 48, journal off 56, journal len 64, inode off 72,
/// dirent off 80, extent off 88, bitmap off 96, bitmap len 104, data off 112, chunk count 120,
/// uuid 128..144, creation time 144, inode mirror off 152, extent mirror off 160, sums off 168,
/// sums len 176, data checksum block 184, zero 192..508, CRC-32 (IEEE) of bytes 0..508 at 508.
pub const SUPERBLOCK_CRC_AT: usize = SUPERBLOCK_SIZE - 4;

/// Encodes the superblock (the first 512 bytes of block 0, and of the backup block; the rest
/// of each block is zero).
pub fn encode_superblock(g: &Geometry, uuid: [u8; 16], created: u64) -> [u8; SUPERBLOCK_SIZE] {
    let mut b = [0u8; SUPERBLOCK_SIZE];
    b[0..8].copy_from_slice(&MAGIC);
    put_u32(&mut b, 8, VERSION);
    let flags = if g.data_checksums() {
        FLAG_DATA_CHECKSUMS
    } else {
        0
    };
    put_u32(&mut b, 12, flags);
    let fields = [
        g.array_size,
        g.chunk_size,
        g.inode_count,
        g.dirent_count,
        g.extent_count,
        g.journal_off,
        g.journal_len,
        g.inode_off,
        g.dirent_off,
        g.extent_off,
        g.bitmap_off,
        g.bitmap_len,
        g.data_off,
        g.chunk_count,
    ];
    for (i, f) in fields.iter().enumerate() {
        put_u64(&mut b, 16 + 8 * i, *f);
    }
    b[128..144].copy_from_slice(&uuid);
    put_u64(&mut b, 144, created);
    put_u64(&mut b, 152, g.inode_mirror_off);
    put_u64(&mut b, 160, g.extent_mirror_off);
    put_u64(&mut b, 168, g.sums_off);
    put_u64(&mut b, 176, g.sums_len);
    put_u64(&mut b, 184, DATA_BLOCK);
    let crc = crc32fast::hash(&b[..SUPERBLOCK_CRC_AT]);
    put_u32(&mut b, SUPERBLOCK_CRC_AT, crc);
    b
}

/// A decoded superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The layout.
    pub geometry: Geometry,
    /// Identity of the image.
    pub uuid: [u8; 16],
    /// Seconds since the epoch at mkfs.
    pub created: u64,
}

impl Superblock {
    /// The encoded superblock.
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        encode_superblock(&self.geometry, self.uuid, self.created)
    }
}

/// Decodes and checks the superblock against an array of `array_size` bytes.
pub fn decode_superblock(
    b: &[u8; SUPERBLOCK_SIZE],
    array_size: u64,
) -> Result<Superblock, FormatError> {
    if b[0..8] != MAGIC {
        return Err(FormatError::NotFormatted);
    }
    let v = get_u32(b, 8);
    if v != VERSION {
        return Err(FormatError::Version(v));
    }
    if crc32fast::hash(&b[..SUPERBLOCK_CRC_AT]) != get_u32(b, SUPERBLOCK_CRC_AT) {
        return Err(FormatError::Checksum);
    }
    let f = |i: usize| get_u64(b, 16 + 8 * i);
    let flags = get_u32(b, 12);
    let g = Geometry {
        array_size: f(0),
        chunk_size: f(1),
        inode_count: f(2),
        dirent_count: f(3),
        extent_count: f(4),
        journal_off: f(5),
        journal_len: f(6),
        inode_off: f(7),
        dirent_off: f(8),
        extent_off: f(9),
        bitmap_off: f(10),
        bitmap_len: f(11),
        data_off: f(12),
        chunk_count: f(13),
        inode_mirror_off: get_u64(b, 152),
        extent_mirror_off: get_u64(b, 160),
        sums_off: get_u64(b, 168),
        sums_len: get_u64(b, 176),
    };
    if g.array_size != array_size {
        return Err(FormatError::Geometry(format!(
            "formatted for {} bytes but the array has {array_size}",
            g.array_size
        )));
    }
    if flags & !FLAG_DATA_CHECKSUMS != 0
        || (flags & FLAG_DATA_CHECKSUMS != 0) != (g.sums_len != 0)
        || get_u64(b, 184) != DATA_BLOCK
    {
        return Err(FormatError::Geometry(format!(
            "unknown flags {flags:#x} or checksum settings"
        )));
    }
    g.check()?;
    let mut uuid = [0u8; 16];
    uuid.copy_from_slice(&b[128..144]);
    Ok(Superblock {
        geometry: g,
        uuid,
        created: get_u64(b, 144),
    })
}

/// The CRC-32C of a record's bytes, seeded with its index, so that a record is valid only
/// where it was written.
fn record_crc(index: u64, bytes: &[&[u8]]) -> u32 {
    let mut crc = crc32c::crc32c(&index.to_le_bytes());
    for b in bytes {
        crc = crc32c::crc32c_append(crc, b);
    }
    crc
}

/// Whether a record is all zeros (a record never used, or freed): such a record carries no
/// checksum.
pub fn is_zero(b: &[u8]) -> bool {
    b.iter().all(|x| *x == 0)
}

/// A timestamp: seconds and nanoseconds since the epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time {
    /// Seconds.
    pub sec: i64,
    /// Nanoseconds, below 10^9.
    pub nsec: u32,
}

impl Time {
    /// The current time.
    pub fn now() -> Time {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Time {
            sec: d.as_secs() as i64,
            nsec: d.subsec_nanos(),
        }
    }
}

/// An inode record. Layout: mode 0, uid 4, gid 8, nlink 12, size 16, atime 24, mtime 32, ctime
/// 40 (seconds, i64), their nanoseconds at 48, 52, 56 (u32), generation 60, creation time 64
/// (i64) and 72 (u32); bytes 76..124 are zero; CRC-32C of the inode number and bytes 0..124 at
/// 124. Mode 0 means free; an all-zero record was never used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Inode {
    /// Type and permission bits; 0 for a free inode.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Links (directory entries; for a directory, 2 + subdirectories).
    pub nlink: u32,
    /// Bytes.
    pub size: u64,
    /// Last access.
    pub atime: Time,
    /// Last data change.
    pub mtime: Time,
    /// Last status change.
    pub ctime: Time,
    /// Creation.
    pub btime: Time,
    /// Bumped each time the record is reused: with the number, a file's identity.
    pub generation: u32,
}

impl Inode {
    /// Encodes the record of inode `ino`.
    pub fn encode(&self, ino: u64) -> [u8; INODE_SIZE as usize] {
        let mut b = [0u8; INODE_SIZE as usize];
        put_u32(&mut b, 0, self.mode);
        put_u32(&mut b, 4, self.uid);
        put_u32(&mut b, 8, self.gid);
        put_u32(&mut b, 12, self.nlink);
        put_u64(&mut b, 16, self.size);
        put_u64(&mut b, 24, self.atime.sec as u64);
        put_u64(&mut b, 32, self.mtime.sec as u64);
        put_u64(&mut b, 40, self.ctime.sec as u64);
        put_u32(&mut b, 48, self.atime.nsec);
        put_u32(&mut b, 52, self.mtime.nsec);
        put_u32(&mut b, 56, self.ctime.nsec);
        put_u32(&mut b, 60, self.generation);
        put_u64(&mut b, 64, self.btime.sec as u64);
        put_u32(&mut b, 72, self.btime.nsec);
        let crc = record_crc(ino, &[&b[..124]]);
        put_u32(&mut b, 124, crc);
        b
    }

    /// Decodes the record of inode `ino`; `None` when it is damaged (its checksum disagrees).
    pub fn decode(b: &[u8], ino: u64) -> Option<Inode> {
        if is_zero(b) {
            return Some(Inode::default());
        }
        if record_crc(ino, &[&b[..124]]) != get_u32(b, 124) {
            return None;
        }
        let t = |s: usize, n: usize| Time {
            sec: get_u64(b, s) as i64,
            nsec: get_u32(b, n),
        };
        Some(Inode {
            mode: get_u32(b, 0),
            uid: get_u32(b, 4),
            gid: get_u32(b, 8),
            nlink: get_u32(b, 12),
            size: get_u64(b, 16),
            atime: t(24, 48),
            mtime: t(32, 52),
            ctime: t(40, 56),
            generation: get_u32(b, 60),
            btime: t(64, 72),
        })
    }

    /// Whether the record is in use.
    pub fn is_used(&self) -> bool {
        self.mode != 0
    }

    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & S_IFMT == S_IFDIR
    }

    /// Whether it is a regular file.
    pub fn is_reg(&self) -> bool {
        self.mode & S_IFMT == S_IFREG
    }

    /// Whether it is a symbolic link.
    pub fn is_symlink(&self) -> bool {
        self.mode & S_IFMT == S_IFLNK
    }
}

/// A directory-entry record: parent 0 ([`SYMLINK_TARGET`] = a symlink's target), inode 8, name
/// length 16 (u16), kind 18 (`DT_*`), zero 19..20, CRC-32C of the slot number and the other
/// bytes at 20, name 24..279, zero 279. A free record is all zeros.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dirent {
    /// Directory holding the entry; 0 if free.
    pub parent: u64,
    /// Inode named.
    pub ino: u64,
    /// `DT_*`.
    pub kind: u8,
    /// Name bytes (1..=255, no `/` or NUL), or a symlink target.
    pub name: Vec<u8>,
}

impl Dirent {
    /// Encodes the record for slot `slot`.
    pub fn encode(&self, slot: u64) -> [u8; DIRENT_SIZE as usize] {
        let mut b = [0u8; DIRENT_SIZE as usize];
        put_u64(&mut b, 0, self.parent);
        put_u64(&mut b, 8, self.ino);
        let n = self.name.len().min(NAME_MAX);
        b[16..18].copy_from_slice(&(n as u16).to_le_bytes());
        b[18] = self.kind;
        b[24..24 + n].copy_from_slice(&self.name[..n]);
        let crc = record_crc(slot, &[&b[..20], &b[24..]]);
        put_u32(&mut b, 20, crc);
        b
    }

    /// Decodes the record in slot `slot` (not a free one: see [`is_zero`]); `None` when it is
    /// damaged (checksum, name length).
    pub fn decode(b: &[u8], slot: u64) -> Option<Dirent> {
        let n = u16::from_le_bytes([b[16], b[17]]) as usize;
        if n > NAME_MAX || record_crc(slot, &[&b[..20], &b[24..]]) != get_u32(b, 20) {
            return None;
        }
        Some(Dirent {
            parent: get_u64(b, 0),
            ino: get_u64(b, 8),
            kind: b[18],
            name: b[24..24 + n].to_vec(),
        })
    }
}

/// An extent record: inode 0 (0 = free), first file chunk 8, first data chunk 16, chunks 24
/// (u32), CRC-32C of the slot number and bytes 0..28 at 28. A free record is all zeros.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtentRec {
    /// Owner; 0 if free.
    pub ino: u64,
    /// File offset / chunk size.
    pub file_chunk: u64,
    /// Data chunk index.
    pub dev_chunk: u64,
    /// Chunks.
    pub count: u32,
}

impl ExtentRec {
    /// Encodes the record for slot `slot`.
    pub fn encode(&self, slot: u64) -> [u8; EXTENT_SIZE as usize] {
        let mut b = [0u8; EXTENT_SIZE as usize];
        put_u64(&mut b, 0, self.ino);
        put_u64(&mut b, 8, self.file_chunk);
        put_u64(&mut b, 16, self.dev_chunk);
        put_u32(&mut b, 24, self.count);
        let crc = record_crc(slot, &[&b[..28]]);
        put_u32(&mut b, 28, crc);
        b
    }

    /// Decodes the record in slot `slot`: a free one (all zeros) has inode 0; `None` when it
    /// is damaged.
    pub fn decode(b: &[u8], slot: u64) -> Option<ExtentRec> {
        if is_zero(b) {
            return Some(ExtentRec::default());
        }
        if record_crc(slot, &[&b[..28]]) != get_u32(b, 28) {
            return None;
        }
        Some(ExtentRec {
            ino: get_u64(b, 0),
            file_chunk: get_u64(b, 8),
            dev_chunk: get_u64(b, 16),
            count: get_u32(b, 24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_of_a_gigabyte() {
        let g = Geometry::compute(1 << 30, &MkfsOptions::default()).unwrap();
        g.check().unwrap();
        assert_eq!(g.inode_count, 65536);
        assert_eq!(g.chunk_size, 4096);
        assert_eq!(g.data_off % g.chunk_size, 0);
        assert!(g.chunk_count >= 245_000, "{g:?}");
        assert_eq!(g.journal_len, BLOCK + (1 << 20));
        // Metadata: about 5% of the array, mostly the inode and entry tables.
        assert!(g.data_off < 56 << 20, "{} bytes of metadata", g.data_off);
        assert!(!g.data_checksums());
        assert!(g.data_off + g.chunk_count * g.chunk_size <= g.backup_superblock_addr());
        let sb = encode_superblock(&g, [7; 16], 42);
        let d = decode_superblock(&sb, 1 << 30).unwrap();
        assert_eq!(d.geometry, g);
        assert_eq!(d.created, 42);
        let sums = MkfsOptions {
            data_checksums: true,
            ..Default::default()
        };
        let gs = Geometry::compute(1 << 30, &sums).unwrap();
        gs.check().unwrap();
        assert!(gs.sums_len >= gs.chunk_count * 4, "{gs:?}");
        let i = gs.integrity().unwrap();
        i.validate(1 << 30).unwrap();
        let d = decode_superblock(&encode_superblock(&gs, [7; 16], 42), 1 << 30).unwrap();
        assert_eq!(d.geometry, gs);
        // Versions 1 and 2 are refused with a message that says what to do.
        for old in [1, 2] {
            let mut v = sb;
            v[8] = old;
            let err = decode_superblock(&v, 1 << 30).unwrap_err();
            assert_eq!(err, FormatError::Version(old as u32));
            assert!(err.to_string().contains("moneta mkfs"), "{err}");
        }
        let mut bad = sb;
        bad[20] ^= 1;
        assert_eq!(decode_superblock(&bad, 1 << 30), Err(FormatError::Checksum));
        assert!(matches!(
            decode_superblock(&sb, 2 << 30),
            Err(FormatError::Geometry(_))
        ));
        assert_eq!(
            decode_superblock(&[0; SUPERBLOCK_SIZE], 1 << 30),
            Err(FormatError::NotFormatted)
        );
    }

    #[test]
    fn tiny_arrays_are_refused() {
        assert!(Geometry::compute(512 << 10, &MkfsOptions::default()).is_err());
        let small = MkfsOptions {
            chunk_size: 4096,
            inode_count: Some(16),
            ..Default::default()
        };
        let g = Geometry::compute(1 << 20, &small).unwrap();
        g.check().unwrap();
        let odd = MkfsOptions {
            chunk_size: 3000,
            ..Default::default()
        };
        assert!(Geometry::compute(1 << 30, &odd).is_err());
    }

    #[test]
    fn records_round_trip() {
        let i = Inode {
            mode: S_IFREG | 0o644,
            uid: 1000,
            gid: 100,
            nlink: 1,
            size: 12345,
            atime: Time { sec: -5, nsec: 9 },
            mtime: Time { sec: 77, nsec: 1 },
            ctime: Time { sec: 78, nsec: 2 },
            btime: Time { sec: 1, nsec: 3 },
            generation: 4,
        };
        assert_eq!(Inode::decode(&i.encode(3), 3), Some(i));
        assert_eq!(
            Inode::decode(&i.encode(3), 4),
            None,
            "another inode's record"
        );
        assert_eq!(Inode::decode(&[0; 128], 4), Some(Inode::default()));
        let d = Dirent {
            parent: 1,
            ino: 9,
            kind: DT_REG,
            name: vec![b'x'; 255],
        };
        assert_eq!(Dirent::decode(&d.encode(7), 7), Some(d.clone()));
        let e = ExtentRec {
            ino: 3,
            file_chunk: 4,
            dev_chunk: 5,
            count: 6,
        };
        assert_eq!(ExtentRec::decode(&e.encode(2), 2), Some(e));
        // Any flipped bit is found.
        for bit in 0..(DIRENT_SIZE as usize * 8) {
            let mut b = d.encode(7);
            b[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Dirent::decode(&b, 7), None, "bit {bit}");
        }
        for bit in 0..(INODE_SIZE as usize * 8) {
            let mut b = i.encode(3);
            b[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Inode::decode(&b, 3), None, "bit {bit}");
        }
        for bit in 0..(EXTENT_SIZE as usize * 8) {
            let mut b = e.encode(2);
            b[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(ExtentRec::decode(&b, 2), None, "bit {bit}");
        }
    }
}
