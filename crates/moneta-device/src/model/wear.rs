//! Where the model keeps wear: the writes each physical row has taken and each controller's
//! start-gap registers, in memory or in a wear file beside a persistent array, so that a
//! device's wear lasts as long as the device (Moneta §II: start-gap in every controller).
//!
//! A wear file is mapped shared and the model stores into it as it counts, so a daemon that is
//! killed loses nothing (the counts are in the page cache); the device's flusher thread writes
//! it back every few seconds and at shutdown, so a crash of the machine loses at most the
//! counts since then. Layout (little-endian): a 4 KiB header, then each controller's row
//! counts (`u32`, `lines + 1` per controller: the gap row too).
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `MNTWEAR1` |
//! | 8 | 4 | version (1) |
//! | 16 | 8 | array size |
//! | 24 | 4 | controllers |
//! | 32 | 8 | lines per controller |
//! | 40 | 8 | row size |
//! | 48 | 8 | stripe |
//! | 56 | 1 | address randomization on |
//! | 64 | 8 | randomization seed |
//! | 128 + 24·c | 24 | controller c's start, gap, and writes since the gap last moved |
//!
//! Everything that decides which physical row a write lands on (size, controllers, rows,
//! stripe, randomization and its seed) names the file: a device modelled two ways keeps two
//! wear files, each meaningful for its own geometry.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use memmap2::{MmapOptions, MmapRaw};

const MAGIC: &[u8; 8] = b"MNTWEAR1";
const VERSION: u32 = 1;
const HEADER: usize = 4096;
const REGS_AT: usize = 128;
/// Most controllers a header has registers for.
pub const MAX_CONTROLLERS: usize = 16;

/// Writes per physical row of one controller, and its start-gap registers when they are kept
/// in a file.
#[derive(Debug)]
pub(crate) struct Rows {
    ptr: NonNull<u32>,
    len: usize,
    /// The registers' place in the wear file's header.
    regs: Option<NonNull<u64>>,
    _owned: Option<Box<[u32]>>,
    _map: Option<Arc<MmapRaw>>,
}

// SAFETY: the counts are owned by this value (a box, or its range of a mapping no other
// `Rows` covers); nothing else writes them.
unsafe impl Send for Rows {}

impl Rows {
    /// `len` rows in memory, never written.
    pub(crate) fn memory(len: usize) -> Rows {
        let mut b = vec![0u32; len].into_boxed_slice();
        let ptr = NonNull::new(b.as_mut_ptr()).expect("a box is non-null");
        Rows {
            ptr,
            len,
            regs: None,
            _owned: Some(b),
            _map: None,
        }
    }

    pub(crate) fn as_slice(&self) -> &[u32] {
        // SAFETY: `ptr` is valid for `len` counts for as long as `self` (box or mapping held).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u32] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Counts a write of row `i`.
    #[inline]
    pub(crate) fn bump(&mut self, i: usize) {
        let r = &mut self.as_mut_slice()[i];
        *r = r.saturating_add(1);
    }

    /// Starts fetching the count of row `i` (see [`Rows::bump`]).
    #[inline]
    pub(crate) fn prefetch(&self, i: usize) {
        if let Some(c) = self.as_slice().get(i) {
            super::parts::prefetch(c);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn copy_from(&mut self, src: &[u32]) {
        self.as_mut_slice().copy_from_slice(src);
    }

    /// Records the start-gap registers where they last (nothing for rows in memory).
    #[inline]
    pub(crate) fn save_registers(&mut self, (start, gap, writes): (u64, u64, u64)) {
        if let Some(p) = self.regs {
            // SAFETY: `p` points at this controller's three registers in the mapped header,
            // which only this value writes.
            unsafe {
                p.as_ptr().write(start.to_le());
                p.as_ptr().add(1).write(gap.to_le());
                p.as_ptr().add(2).write(writes.to_le());
            }
        }
    }
}

/// What decides where writes land, and so names a wear file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub size: u64,
    pub controllers: usize,
    pub lines: u64,
    pub row: u64,
    pub stripe: u64,
    pub randomize: bool,
    pub seed: u64,
}

impl Geometry {
    /// A short name for the geometry: 64 bits of FNV-1a over its fields.
    fn tag(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for v in [
            self.size,
            self.controllers as u64,
            self.lines,
            self.row,
            self.stripe,
            u64::from(self.randomize),
            self.seed,
        ] {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x100_0000_01b3);
            }
        }
        format!("{h:016x}")
    }

    fn file_len(&self) -> usize {
        HEADER + self.controllers * (self.lines as usize + 1) * 4
    }
}

/// A wear file: the mapping, shared with whoever writes it back.
#[derive(Debug)]
pub struct WearFile {
    map: Arc<MmapRaw>,
    path: PathBuf,
    /// Whether it held counts from before.
    pub restored: bool,
}

impl WearFile {
    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A handle to write the file back with ([`WearSync::sync`]), from any thread.
    pub fn syncer(&self) -> WearSync {
        WearSync(self.map.clone())
    }
}

/// Writes a wear file's counts back to disk.
#[derive(Clone, Debug)]
pub struct WearSync(Arc<MmapRaw>);

impl WearSync {
    /// `msync`s the whole file.
    pub fn sync(&self) -> std::io::Result<()> {
        self.0.flush()
    }
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Start-gap registers as kept: start, gap, writes since the gap last moved.
pub(crate) type Registers = (u64, u64, u64);

/// The wear file of `geo` beside `base` (`BASE.wear-TAG`), opened or created; the rows and
/// registers of each controller, to be moved into the model; registers as found.
pub(crate) fn open(
    base: &Path,
    geo: Geometry,
) -> Result<(WearFile, Vec<Rows>, Vec<Registers>), String> {
    if geo.controllers > MAX_CONTROLLERS {
        return Err(format!(
            "wear file: at most {MAX_CONTROLLERS} controllers, not {}",
            geo.controllers
        ));
    }
    let mut name = base.as_os_str().to_owned();
    name.push(format!(".wear-{}", geo.tag()));
    let path = PathBuf::from(name);
    let len = geo.file_len();
    let restored = path.exists();
    if !restored {
        // Written aside and renamed into place, so a file at `path` always has its header.
        let mut tmp = path.clone().into_os_string();
        tmp.push(".new");
        let tmp = PathBuf::from(tmp);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| format!("wear file {}: {e}", tmp.display()))?;
        f.set_len(len as u64)
            .map_err(|e| format!("wear file {}: {e}", tmp.display()))?;
        let mut h = vec![0u8; HEADER];
        h[..8].copy_from_slice(MAGIC);
        h[8..12].copy_from_slice(&VERSION.to_le_bytes());
        put_u64(&mut h, 16, geo.size);
        h[24..28].copy_from_slice(&(geo.controllers as u32).to_le_bytes());
        put_u64(&mut h, 32, geo.lines);
        put_u64(&mut h, 40, geo.row);
        put_u64(&mut h, 48, geo.stripe);
        h[56] = u8::from(geo.randomize);
        put_u64(&mut h, 64, geo.seed);
        for c in 0..geo.controllers {
            // A fresh region: start 0, the gap at the top.
            put_u64(&mut h, REGS_AT + 24 * c, 0);
            put_u64(&mut h, REGS_AT + 24 * c + 8, geo.lines);
            put_u64(&mut h, REGS_AT + 24 * c + 16, 0);
        }
        use std::os::unix::fs::FileExt;
        f.write_all_at(&h, 0)
            .and_then(|()| f.sync_all())
            .map_err(|e| format!("wear file {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("wear file {}: {e}", path.display()))?;
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("wear file {}: {e}", path.display()))?;
    let actual = f
        .metadata()
        .map_err(|e| format!("wear file {}: {e}", path.display()))?
        .len();
    if actual != len as u64 {
        return Err(format!(
            "wear file {} is {actual} bytes, not the {len} its geometry needs: it is damaged; \
             move it away to start counting anew",
            path.display()
        ));
    }
    let map = MmapOptions::new()
        .len(len)
        .map_raw(&f)
        .map_err(|e| format!("wear file {}: {e}", path.display()))?;
    let map = Arc::new(map);
    // SAFETY: the mapping is `len` bytes, at least the header; only this process writes it
    // and nothing else holds a reference yet.
    let header = unsafe { std::slice::from_raw_parts(map.as_ptr(), HEADER) };
    let fields_match = &header[..8] == MAGIC
        && header[8..12] == VERSION.to_le_bytes()
        && get_u64(header, 16) == geo.size
        && header[24..28] == (geo.controllers as u32).to_le_bytes()
        && get_u64(header, 32) == geo.lines
        && get_u64(header, 40) == geo.row
        && get_u64(header, 48) == geo.stripe
        && header[56] == u8::from(geo.randomize)
        && get_u64(header, 64) == geo.seed;
    if !fields_match {
        return Err(format!(
            "wear file {} does not describe this device's geometry (damaged?): move it away \
             to start counting anew",
            path.display()
        ));
    }
    let mut regs = Vec::with_capacity(geo.controllers);
    for c in 0..geo.controllers {
        let at = REGS_AT + 24 * c;
        let r = (
            get_u64(header, at),
            get_u64(header, at + 8),
            get_u64(header, at + 16),
        );
        if r.0 >= geo.lines || r.1 > geo.lines {
            return Err(format!(
                "wear file {}: controller {c}'s start-gap registers ({}, {}) do not fit {} \
                 lines (damaged?): move it away to start counting anew",
                path.display(),
                r.0,
                r.1,
                geo.lines
            ));
        }
        regs.push(r);
    }
    let per = geo.lines as usize + 1;
    let rows = (0..geo.controllers)
        .map(|c| {
            let at = HEADER + c * per * 4;
            // SAFETY: `at + 4·per <= len` by the file's length; the mapping is page aligned,
            // so the counts are aligned for u32.
            let ptr = unsafe { map.as_mut_ptr().add(at).cast::<u32>() };
            // SAFETY: the registers lie in the header, aligned to 8.
            let regs = unsafe { map.as_mut_ptr().add(REGS_AT + 24 * c).cast::<u64>() };
            Rows {
                ptr: NonNull::new(ptr).expect("mapped"),
                len: per,
                regs: NonNull::new(regs),
                _owned: None,
                _map: Some(map.clone()),
            }
        })
        .collect();
    Ok((
        WearFile {
            map,
            path,
            restored,
        },
        rows,
        regs,
    ))
}
