//! The on-array format of nvfs: every structure, its size and its byte offsets.
//!
//! All integers are little-endian. An image is laid out as
//!
//! ```text
//! 0            superblock (one 4 KiB block, CRC-32 protected, written only by mkfs)
//! journal_off  journal: a 4 KiB header block, then the body of the last transaction
//! inode_off    inode table: inode_count records of 128 bytes (inode n at index n - 1)
//! dirent_off   directory-entry table: dirent_count records of 280 bytes
//! extent_off   extent table: extent_count records of 32 bytes (one per chunk at most)
//! bitmap_off   chunk bitmap: one bit per data chunk, 1 = in use
//! data_off     data chunks (chunk-aligned), chunk_count of them
//! ```
//!
//! Metadata lives in fixed-size records in fixed tables; a change to the file system is a set
//! of whole-record images, logged to the journal and then written in place (see
//! [`crate::journal`]).

/// Bytes 0..8 of a formatted image.
pub const MAGIC: [u8; 8] = *b"NVFS\x00\x01\r\n";
/// Format version this code reads and writes.
pub const VERSION: u32 = 1;
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
/// Default chunk: 1 MiB, the paper's answer to fragmentation.
pub const DEFAULT_CHUNK: u64 = 1 << 20;
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
    #[error("nvfs format version {0} is not supported (this build reads version {VERSION})")]
    Version(u32),
    /// Checksum mismatch.
    #[error("the nvfs superblock is corrupt (checksum mismatch)")]
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
    /// Inodes; `None` picks one per 64 KiB of array (at least 1,024).
    pub inode_count: Option<u64>,
    /// Directory entries; `None` picks twice the inodes.
    pub dirent_count: Option<u64>,
    /// Owner of the root directory.
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
    /// Permission bits of the root directory.
    pub root_mode: u32,
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
            .unwrap_or_else(|| (array_size / (64 << 10)).clamp(1024, 1 << 22));
        let dirent_count = o.dirent_count.unwrap_or(inode_count * 2);
        if inode_count == 0 || inode_count > u32::MAX as u64 || dirent_count == 0 {
            return bad("inode and directory-entry counts must be at least 1".into());
        }
        // At most this many chunks; every table sized by it is large enough.
        let max_chunks = array_size / o.chunk_size;
        let extent_count = max_chunks.max(1);
        let bitmap_len = round_up(max_chunks.div_ceil(8).max(8), 8);
        // A transaction touches a handful of inodes and entries plus, at worst, every extent
        // record and the whole bitmap (freeing a fragmented file).
        let journal_len = BLOCK
            + round_up(
                (64u64 << 10).max(extent_count * (EXTENT_SIZE + 16) + bitmap_len * 3),
                BLOCK,
            );
        let journal_off = BLOCK;
        let inode_off = journal_off + journal_len;
        let dirent_off = round_up(inode_off + inode_count * INODE_SIZE, BLOCK);
        let extent_off = round_up(dirent_off + dirent_count * DIRENT_SIZE, BLOCK);
        let bitmap_off = round_up(extent_off + extent_count * EXTENT_SIZE, BLOCK);
        let data_off = round_up(bitmap_off + bitmap_len, o.chunk_size.max(BLOCK));
        if data_off >= array_size || (array_size - data_off) / o.chunk_size == 0 {
            return bad(format!(
                "an array of {array_size} bytes has no room for data after {data_off} bytes of \
                 metadata; use a larger device or fewer inodes"
            ));
        }
        let chunk_count = (array_size - data_off) / o.chunk_size;
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
            (self.bitmap_off + self.bitmap_len, self.data_off),
        ];
        if ordered.iter().any(|&(end, next)| end > next) {
            return bad("regions overlap");
        }
        if self.journal_len < 2 * BLOCK || !self.bitmap_len.is_multiple_of(8) {
            return bad("journal or bitmap size");
        }
        if self.bitmap_len * 8 < self.chunk_count || self.extent_count < self.chunk_count {
            return bad("bitmap or extent table smaller than the chunk count");
        }
        if !self.data_off.is_multiple_of(self.chunk_size)
            || self.chunk_count == 0
            || self
                .chunk_count
                .checked_mul(self.chunk_size)
                .and_then(|d| d.checked_add(self.data_off))
                .is_none_or(|end| end > self.array_size)
        {
            return bad("data region outside the array");
        }
        Ok(())
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
/// uuid 128..144, creation time 144, CRC-32 (IEEE) of bytes 0..252 at 252.
pub const SUPERBLOCK_CRC_AT: usize = 252;

/// Encodes the superblock (the first 256 bytes of block 0; the rest of the block is zero).
pub fn encode_superblock(g: &Geometry, uuid: [u8; 16], created: u64) -> [u8; 256] {
    let mut b = [0u8; 256];
    b[0..8].copy_from_slice(&MAGIC);
    put_u32(&mut b, 8, VERSION);
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

/// Decodes and checks the superblock against an array of `array_size` bytes.
pub fn decode_superblock(b: &[u8; 256], array_size: u64) -> Result<Superblock, FormatError> {
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
    };
    if g.array_size != array_size {
        return Err(FormatError::Geometry(format!(
            "formatted for {} bytes but the array has {array_size}",
            g.array_size
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
/// (i64) and 72 (u32); bytes 76..128 are zero. Mode 0 means free.
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
    /// Encodes the record.
    pub fn encode(&self) -> [u8; INODE_SIZE as usize] {
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
        b
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> Inode {
        let t = |s: usize, n: usize| Time {
            sec: get_u64(b, s) as i64,
            nsec: get_u32(b, n),
        };
        Inode {
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
        }
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

/// A directory-entry record: parent 0 (0 = free, [`SYMLINK_TARGET`] = a symlink's target),
/// inode 8, name length 16 (u16), kind 18 (`DT_*`), zero 19..24, name 24..279, zero 279.
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
    /// Encodes the record.
    pub fn encode(&self) -> [u8; DIRENT_SIZE as usize] {
        let mut b = [0u8; DIRENT_SIZE as usize];
        put_u64(&mut b, 0, self.parent);
        put_u64(&mut b, 8, self.ino);
        let n = self.name.len().min(NAME_MAX);
        b[16..18].copy_from_slice(&(n as u16).to_le_bytes());
        b[18] = self.kind;
        b[24..24 + n].copy_from_slice(&self.name[..n]);
        b
    }

    /// Decodes a record; `None` when its name length is out of range.
    pub fn decode(b: &[u8]) -> Option<Dirent> {
        let n = u16::from_le_bytes([b[16], b[17]]) as usize;
        if n > NAME_MAX {
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
/// (u32), zero 28..32.
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
    /// Encodes the record.
    pub fn encode(&self) -> [u8; EXTENT_SIZE as usize] {
        let mut b = [0u8; EXTENT_SIZE as usize];
        put_u64(&mut b, 0, self.ino);
        put_u64(&mut b, 8, self.file_chunk);
        put_u64(&mut b, 16, self.dev_chunk);
        put_u32(&mut b, 24, self.count);
        b
    }

    /// Decodes a record.
    pub fn decode(b: &[u8]) -> ExtentRec {
        ExtentRec {
            ino: get_u64(b, 0),
            file_chunk: get_u64(b, 8),
            dev_chunk: get_u64(b, 16),
            count: get_u32(b, 24),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_of_a_gigabyte() {
        let g = Geometry::compute(1 << 30, &MkfsOptions::default()).unwrap();
        g.check().unwrap();
        assert_eq!(g.inode_count, 16384);
        assert_eq!(g.data_off % g.chunk_size, 0);
        assert!(g.chunk_count >= 1000, "{g:?}");
        let sb = encode_superblock(&g, [7; 16], 42);
        let d = decode_superblock(&sb, 1 << 30).unwrap();
        assert_eq!(d.geometry, g);
        assert_eq!(d.created, 42);
        let mut bad = sb;
        bad[20] ^= 1;
        assert_eq!(decode_superblock(&bad, 1 << 30), Err(FormatError::Checksum));
        assert!(matches!(
            decode_superblock(&sb, 2 << 30),
            Err(FormatError::Geometry(_))
        ));
        assert_eq!(
            decode_superblock(&[0; 256], 1 << 30),
            Err(FormatError::NotFormatted)
        );
    }

    #[test]
    fn tiny_arrays_are_refused() {
        assert!(Geometry::compute(1 << 20, &MkfsOptions::default()).is_err());
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
        assert_eq!(Inode::decode(&i.encode()), i);
        let d = Dirent {
            parent: 1,
            ino: 9,
            kind: DT_REG,
            name: vec![b'x'; 255],
        };
        assert_eq!(Dirent::decode(&d.encode()), Some(d));
        let e = ExtentRec {
            ino: 3,
            file_chunk: 4,
            dev_chunk: 5,
            count: 6,
        };
        assert_eq!(ExtentRec::decode(&e.encode()), e);
    }
}
