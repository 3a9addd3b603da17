//! A file's translation map (Moneta-D §4.2: the library keeps the file's extents so that a
//! request needs no system call): file offsets to array addresses, filled by lookups, and the
//! shapes a request takes once mapped.

use moneta_abi::fsproto::{FsExtent, HOLE};

#[derive(Clone, Copy, Debug)]
pub(super) struct Ext {
    pub(super) len: u64,
    /// Array address, or `HOLE`.
    pub(super) dev: u64,
    /// The lookup that brought it: a hole is trusted only by the request that looked it up,
    /// since another process may fill it at any time.
    pub(super) gen: u64,
}

/// A file's translation map: runs sorted by file offset, not overlapping. A sorted vector
/// rather than a tree: most files are one extent (1 MiB chunks allocated contiguously), and the
/// lookup is on every request's path.
pub(super) struct Map {
    pub(super) size: u64,
    pub(super) gen: u64,
    /// The layout tag of the last lookup: every entry was mapped under it (the map is emptied
    /// when a lookup answers with another), and every command on an entry asks for it.
    pub(super) file: u64,
    pub(super) ext: Vec<(u64, Ext)>,
}

impl Map {
    /// The entry covering `off`, with its start.
    #[inline]
    pub(super) fn at(&self, off: u64) -> Option<(u64, Ext)> {
        let i = self.ext.partition_point(|&(k, _)| k <= off);
        let (k, e) = *self.ext.get(i.checked_sub(1)?)?;
        (off < k + e.len).then_some((k, e))
    }

    /// The array address of `[off, off + len)` when one mapped (non-hole) entry covers it,
    /// with the layout tag.
    #[inline]
    pub(super) fn single(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        let (k, e) = self.at(off)?;
        (e.dev != HOLE && off + len <= k + e.len).then(|| (e.dev + (off - k), self.file))
    }

    pub(super) fn insert(&mut self, x: &FsExtent, gen: u64) {
        let end = x.file_off.saturating_add(x.len);
        // Entries that overlap the new one go: the first that ends after its start, up to the
        // first that starts at or after its end.
        let lo = self.ext.partition_point(|&(k, e)| k + e.len <= x.file_off);
        let hi = self.ext.partition_point(|&(k, _)| k < end);
        self.ext.splice(
            lo..hi.max(lo),
            [(
                x.file_off,
                Ext {
                    len: x.len,
                    dev: x.dev,
                    gen,
                },
            )],
        );
    }
}

/// One device command of a request: `len` bytes at array address `dev`, for the bytes at `at`
/// in the caller's buffer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Seg {
    pub(crate) dev: u64,
    pub(crate) len: usize,
    pub(crate) at: usize,
    /// The layout tag the command asks for.
    pub(crate) file: u64,
}

/// A request mapped onto the array.
#[derive(Default)]
pub(crate) struct Prepared {
    /// Bytes the request moves.
    pub(crate) len: usize,
    /// Its device commands.
    pub(crate) segs: Vec<Seg>,
    /// Runs of the buffer (offset, length) that are holes: zeros.
    pub(crate) holes: Vec<(usize, usize)>,
}

/// What a request plan found.
pub(super) enum Plan {
    /// Every byte is mapped: segments (and, for reads, holes to zero) are ready.
    Ready,
    /// The first byte (buffer offset) the map does not cover.
    Miss(usize),
}
