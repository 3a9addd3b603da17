//! Files in memory (memory drives): each mapped file gets pages of its own, a *segment*, that
//! processes map with `mmap` and that the array shows at the file's addresses.
//!
//! The array is one memfd that never leaves the daemon, so a process cannot be given a
//! mapping of it: that would reach every file. A file that a process maps gets a memfd of its
//! own instead, whose offsets are the file's offsets. Its bytes move there once (copied from
//! the array while no channel holds a record over them), and the array then shows the
//! segment's pages at the file's extents ([`Media::overlay`]): the engine's copies, the file
//! system and every mapping reach the same pages, and nothing copies them again. The process
//! receives the segment open for reading only or for reading and writing, as its handle
//! allows, and the kernel's page tables enforce that: a read-only descriptor yields no
//! writable shared mapping (`mmap` and `mprotect` fail with `EACCES`), and the segment's mode
//! (0600, the daemon's user's) refuses another user who reopens it for writing through
//! `/proc/self/fd` (the daemon's own user could change the mode of what it owns anyway).
//!
//! Each process gets an open file description of its own (the segment opened again through
//! `/proc/self/fd`), never the daemon's: a descriptor or a mapping (which holds the description
//! it was made from) then keeps the segment's inode open, which the kernel shows the daemon (a
//! write lease is granted only on a file nobody else has open). When the limits below are
//! reached (files mapped, pieces shown, or the segments' pages past an eighth of the array,
//! [`MIN_BUDGET`] at least), segments nobody holds any more are retired ([`Segments::reclaim`]):
//! nothing maps them, so nobody sees the difference, and the file's next mapping gets a new
//! segment.
//!
//! A segment grows with its file (new extents are shown from it as they are allocated) but
//! never shrinks: it is sealed against shrinking, since a writer that shrank it would leave
//! the array's view of the file without pages. When space leaves the file (truncate, unlink's
//! final free), the segment is *retired*: the array shows its own pages again, with the
//! segment's bytes copied back for the space the file keeps, and the file's next mapping gets
//! a new segment. A segment also belongs to one generation of its inode: a segment found for
//! an inode number that has since been freed and given to another file is retired, never
//! shown for the new one. Mappings made before keep the old segment: the
//! bytes as they were at retirement, private to the processes that map it, reaching neither
//! the file nor any other file's space.
//!
//! On a persistent array the segments are files of the host's file system, in a directory
//! beside the backing file (`<backing file>.pages/<inode>`), fully allocated as they grow: a
//! store through a mapping or a channel write to a mapped file then outlives the daemon as a
//! write to the array does (both are in the host's page cache), and `fsync` at the `host`
//! level writes the segment's pages back with the rest. Beside each segment a list of the
//! pieces it shows (`<inode>.pieces`) grows as they are shown: at start the daemon folds the
//! listed pieces of every segment left by one that was killed back into the array
//! ([`Segments::recover`]), and nothing else (a piece being copied when the daemon died is not
//! listed yet, and the array still holds its bytes); a clean stop folds them all back. Such a file cannot be sealed, and a writer may shorten it:
//! the daemon's own accesses past its end then find a page of zeros
//! ([`moneta_device::guard`]) instead of a `SIGBUS`, and only that file is affected.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;

use moneta_abi::control::{errno, Failure};
use moneta_device::{Device, Media, TableOp};

/// Most pieces of files the array shows from segments at once: each is a mapping of the
/// daemon (the kernel allows 65,530 by default, and the array, the channels and the heap need
/// their own).
pub const MAX_SHOWN: usize = 16_384;

const PAGE: u64 = 4096;

/// The longest a retirement waits for accesses in place to finish.
const IN_PLACE_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// Most files mapped at once: each holds a descriptor of the daemon's.
pub const MAX_SEGMENTS: usize = 8192;
/// Most of them whose pages one user (other than root and the daemon's own) had made, so
/// that one user always leaves room for others.
pub const USER_SEGMENTS: usize = MAX_SEGMENTS / 4;

/// The least room the segments' pages have before those nobody holds are retired, whatever
/// the array's size.
pub const MIN_BUDGET: u64 = 64 << 20;

/// A file's own pages.
struct Segment {
    /// The pages, read-write (a memfd sealed against shrinking, or a file of the host).
    rw: File,
    /// Its length.
    len: u64,
    /// The user whose map call made it, counted against their share (none for root and
    /// the daemon's own user).
    owner: Option<u32>,
    /// The generation of the inode it belongs to.
    generation: u32,
    /// The list of pieces shown, beside a segment of the host (see the module's text).
    pieces: Option<File>,
    /// Pieces the array shows from it: (file offset, array address, bytes), in file order.
    shown: Vec<(u64, u64, u64)>,
}

/// How a segment is retired.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Retire {
    /// Processes may map it: clients reading and writing in place are told, and the channels'
    /// records over it revoked.
    Mapped,
    /// Nobody holds it: only the records are revoked.
    Unheld,
    /// The device has stopped: no command can come.
    Stopped,
}

/// The path that opens `f` again, as a new open file description.
fn reopen_path(f: &File) -> String {
    format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(f))
}

/// Where segments live.
pub enum Store {
    /// Memfds: a volatile array.
    Memory,
    /// Files in this directory: a persistent array. `host`: the `host` durability level, at
    /// which segments' sizes and removals are made durable as they change.
    Dir { path: PathBuf, host: bool },
    /// None: the array hands no pages out, and this says why.
    Refused(&'static str),
}

/// The segments of the mapped files.
pub struct Segments {
    media: Arc<dyn Media>,
    device: Arc<Device>,
    store: Store,
    files: HashMap<u64, Segment>,
    shown: usize,
    /// Segments each user's map calls made ([`USER_SEGMENTS`]).
    per_user: HashMap<u32, usize>,
    /// Bytes of all segments together past which making a segment first retires every one
    /// nobody holds: an eighth of the array, [`MIN_BUDGET`] at least. On a persistent array
    /// the pages are files of the host beside the backing file, taking space of their own
    /// (the array's space for the same bytes stays allocated), and files that go in place by
    /// themselves (libmoneta's default at the `host` level) would otherwise keep it until
    /// they are removed or the daemon stops.
    budget: u64,
}

fn fail(errno: i32, message: impl Into<String>) -> Failure {
    Failure {
        errno,
        message: message.into(),
    }
}

fn io_fail(what: &str, e: impl std::fmt::Display) -> Failure {
    fail(errno::EIO, format!("{what}: {e}"))
}

impl Segments {
    /// Segments over `media` in `store`, revoking records through `device`.
    pub fn new(media: Arc<dyn Media>, device: Arc<Device>, store: Store) -> Segments {
        let budget = (media.size() / 8).max(MIN_BUDGET);
        Segments {
            media,
            device,
            store,
            files: HashMap::new(),
            shown: 0,
            per_user: HashMap::new(),
            budget,
        }
    }

    /// Bytes of all segments together.
    fn bytes(&self) -> u64 {
        self.files.values().map(|s| s.len).sum()
    }

    /// Whether the array can hand pages out at all: one with a place for segments, whose
    /// chunks are whole pages.
    pub fn supported(&self, chunk_size: u64) -> Result<(), Failure> {
        if let Store::Refused(why) = self.store {
            return Err(fail(libc::ENODEV, why));
        }
        if !chunk_size.is_multiple_of(PAGE) {
            return Err(fail(
                libc::ENODEV,
                format!("the file system's chunks ({chunk_size} bytes) are not whole pages"),
            ));
        }
        Ok(())
    }

    /// Whether `ino` may have a segment (its allocations must then pass through
    /// [`Segments::show`], which also retires one of an older generation).
    pub fn has(&self, ino: u64) -> bool {
        self.files.contains_key(&ino)
    }

    /// Retires `ino`'s segment if it belongs to another generation of the inode than
    /// `generation` (the inode was freed and given to another file since).
    fn drop_stale(&mut self, ino: u64, generation: u32) -> Result<(), Failure> {
        if self
            .files
            .get(&ino)
            .is_some_and(|s| s.generation != generation)
        {
            self.retire(ino)?;
        }
        Ok(())
    }

    /// The segment of `ino`, made if it has none (on behalf of `owner`, whose share it then
    /// counts against), showing `allocated` (the file's extents, as
    /// [`moneta_fs::Fs::allocated`] lists them) and at least `size` bytes long: a descriptor
    /// open for writing if `write`, else for reading only.
    pub fn give(
        &mut self,
        ino: u64,
        allocated: &[(u64, u64, u64)],
        size: u64,
        write: bool,
        owner: Option<u32>,
        generation: u32,
    ) -> Result<OwnedFd, Failure> {
        self.drop_stale(ino, generation)?;
        if !self.files.contains_key(&ino)
            && (self.at_limit(owner) || self.bytes().saturating_add(size) > self.budget)
        {
            self.reclaim(Some(ino))?;
        }
        let made = match self.files.get(&ino) {
            Some(_) => None,
            None if self.files.len() >= MAX_SEGMENTS => {
                return Err(fail(
                    errno::ENOMEM,
                    format!("the daemon already maps {MAX_SEGMENTS} files"),
                ))
            }
            None if owner
                .is_some_and(|u| self.per_user.get(&u).copied().unwrap_or(0) >= USER_SEGMENTS) =>
            {
                return Err(fail(
                    errno::ENOMEM,
                    format!(
                        "this user's programs already map {USER_SEGMENTS} files, a user's share"
                    ),
                ))
            }
            None => Some(self.make(ino, owner, generation)?),
        };
        let fresh = made.is_some();
        if let Some(seg) = made {
            if let Some(u) = owner {
                *self.per_user.entry(u).or_default() += 1;
            }
            self.files.insert(ino, seg);
        }
        if let Err(f) = self.show(ino, allocated, size, generation) {
            if fresh {
                // Nothing half made stays: what was shown goes back to the array.
                self.retire(ino)?;
            }
            return Err(f);
        }
        // The same pages opened again, a description of the process's own (see the module's
        // text), for reading only or for reading and writing.
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .write(write)
            .open(reopen_path(&self.files[&ino].rw))
            .map(OwnedFd::from);
        fd.map_err(|e| io_fail("cannot share the file's pages", e))
    }

    /// Whether making a segment for `owner` would pass a limit: the files the daemon maps at
    /// once, or the owner's share of them.
    fn at_limit(&self, owner: Option<u32>) -> bool {
        self.files.len() >= MAX_SEGMENTS
            || owner.is_some_and(|u| self.per_user.get(&u).copied().unwrap_or(0) >= USER_SEGMENTS)
    }

    /// Whether a process other than the daemon holds `seg`'s pages: a descriptor of them, or
    /// a mapping (which holds the descriptor's open file). The kernel grants a write lease
    /// only on a file that nobody but the caller has open, and every process has
    /// descriptions of its own ([`Segments::give`]). A memfd's first description (the
    /// daemon's `rw`) does not count as an open for writing, so a memfd is asked through a
    /// description opened for reading, which is the only one then allowed; a file of the
    /// host is asked through `rw`. Anything the kernel refuses counts as held.
    fn in_use(&self, seg: &Segment) -> bool {
        let free = |f: &File| {
            use std::os::fd::AsRawFd;
            let fd = f.as_raw_fd();
            // SAFETY: lease calls on a descriptor we own.
            unsafe {
                if libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) != 0 {
                    return false;
                }
                libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK);
            }
            true
        };
        match &self.store {
            Store::Memory => match File::open(reopen_path(&seg.rw)) {
                Ok(probe) => !free(&probe),
                Err(_) => true,
            },
            Store::Dir { .. } => !free(&seg.rw),
            Store::Refused(_) => true,
        }
    }

    /// Retires every segment nobody holds any more (but `keep`'s): returns how many. Nothing
    /// maps them, so nothing is retired under a process; their bytes go back to the array.
    pub fn reclaim(&mut self, keep: Option<u64>) -> Result<usize, Failure> {
        let free: Vec<u64> = self
            .files
            .iter()
            .filter(|&(&ino, seg)| Some(ino) != keep && !self.in_use(seg))
            .map(|(&ino, _)| ino)
            .collect();
        for &ino in &free {
            // No process maps it, so none reads or writes it in place: the clients need not
            // be told (but the channels' records over it go, as for any retirement).
            self.retire_with(ino, Retire::Unheld)?;
        }
        Ok(free.len())
    }

    fn make(&self, ino: u64, owner: Option<u32>, generation: u32) -> Result<Segment, Failure> {
        let Store::Dir { path, .. } = &self.store else {
            return Self::make_memfd(owner, generation);
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(|e| io_fail(&format!("cannot make {}", path.display()), e))?;
        let file = path.join(ino.to_string());
        // The daemon's user's alone from the start (see the module's text).
        let rw = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&file)
            .map_err(|e| io_fail(&format!("cannot make {}", file.display()), e))?;
        let pieces = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path.join(format!("{ino}.pieces")))
            .map_err(|e| io_fail("cannot make the list of the file's pieces", e))?;
        Ok(Segment {
            rw,
            len: 0,
            owner,
            generation,
            pieces: Some(pieces),
            shown: Vec::new(),
        })
    }

    fn make_memfd(owner: Option<u32>, generation: u32) -> Result<Segment, Failure> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(
            "moneta-file",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(|e| io_fail("cannot make the file's pages", e))?;
        // A writer that shrank the segment would take pages from under the array's view, and
        // one that sealed it further would stop it growing with its file.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::SEAL)
            .map_err(|e| io_fail("cannot seal the file's pages", e))?;
        // Nobody but the daemon's user (and root) can open it again through /proc, as the
        // daemon does for every process it gives the pages to.
        rustix::fs::fchmod(&fd, rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR)
            .map_err(|e| io_fail("cannot protect the file's pages", e))?;
        Ok(Segment {
            rw: File::from(fd),
            len: 0,
            owner,
            generation,
            pieces: None,
            shown: Vec::new(),
        })
    }

    /// Shows from `ino`'s segment every piece of `allocated` it does not show yet (the file
    /// grew), and makes the segment at least `size` bytes long. Each new piece's records are
    /// revoked from every channel, its bytes copied into the segment, and the segment's pages
    /// shown in their place, so no write is lost between the copy and the switch.
    pub fn show(
        &mut self,
        ino: u64,
        allocated: &[(u64, u64, u64)],
        size: u64,
        generation: u32,
    ) -> Result<(), Failure> {
        self.drop_stale(ino, generation)?;
        let Some(seg) = self.files.get(&ino) else {
            return Ok(());
        };
        let new = missing(&seg.shown, allocated);
        if self.shown + new.len() > MAX_SHOWN {
            // Pieces of segments nobody holds any more make room (this one stays).
            self.reclaim(Some(ino))?;
        }
        if self.shown + new.len() > MAX_SHOWN {
            return Err(fail(
                errno::ENOMEM,
                format!("the array already shows {MAX_SHOWN} pieces of mapped files"),
            ));
        }
        let end = allocated
            .iter()
            .map(|&(off, _, len)| off + len)
            .max()
            .unwrap_or(0)
            .max(size.next_multiple_of(PAGE));
        let seg = self.files.get_mut(&ino).expect("checked above");
        if end > seg.len {
            seg.rw
                .set_len(end)
                .map_err(|e| io_fail("cannot grow the file's pages", e))?;
            if let Store::Dir { host, .. } = self.store {
                // Every page allocated now: a store into a hole of a full file system would
                // fault in the daemon.
                rustix::fs::fallocate(&seg.rw, rustix::fs::FallocateFlags::empty(), 0, end)
                    .map_err(|e| {
                        if e == rustix::io::Errno::NOSPC {
                            fail(errno::ENOSPC, "no space on the host for the file's pages")
                        } else {
                            io_fail("cannot allocate the file's pages", e)
                        }
                    })?;
                if host {
                    seg.rw
                        .sync_all()
                        .map_err(|e| io_fail("cannot make the file's pages durable", e))?;
                }
            }
            seg.len = end;
        }
        if new.is_empty() {
            return Ok(());
        }
        revoke_records(&self.device, &new)?;
        // A page at a time: the page cache keeps what one write fills as one folio, and a
        // flush writes a dirty folio back whole, so pages copied in larger writes would make
        // every later `fsync` of a few bytes write back up to megabytes.
        let mut buf = vec![0u8; PAGE as usize];
        // Whether any byte copied is not zero (space a file just grew into is all zeros).
        let mut data = false;
        for &(off, addr, len) in &new {
            let mut at = 0;
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                // SAFETY: `buf` holds `n` bytes; the range is the file's, inside the array.
                unsafe { self.media.read(addr + at, buf.as_mut_ptr(), n) };
                data |= buf[..n].iter().any(|&b| b != 0);
                seg.rw
                    .write_all_at(&buf[..n], off + at)
                    .map_err(|e| io_fail("cannot fill the file's pages", e))?;
                at += n as u64;
            }
        }
        for &(off, addr, len) in &new {
            self.media
                .overlay(addr, len, seg.rw.as_fd(), off)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::Unsupported => fail(libc::ENODEV, e.to_string()),
                    _ => io_fail("cannot show the file's pages", e),
                })?;
            seg.shown.push((off, addr, len));
            self.shown += 1;
        }
        let host = matches!(self.store, Store::Dir { host: true, .. });
        if host && data {
            // The copies reach the host's disk before the list names their pieces: a crash
            // of the machine in between would otherwise leave a list whose pieces the next
            // start folds back from pages that never got the bytes, over the array's own.
            // The array's mapping shows the pieces now, so this writes back their ranges of
            // the pages' file alone (stores in place elsewhere in it wait for their `fsync`).
            // Copies of zeros need none: the pages' file reads as zeros on the disk wherever
            // nothing was written back (it was allocated and made durable as it grew), as
            // where a file grows in place.
            let ranges: Vec<(u64, u64)> = new.iter().map(|&(_, addr, len)| (addr, len)).collect();
            self.media
                .flush_ranges(&ranges)
                .map_err(|e| io_fail("cannot make the file's pages durable", e))?;
        }
        if let Some(list) = seg.pieces.as_mut() {
            // Listed once shown: recovery folds only what the segment holds (at the `host`
            // level durably, as the segment's own pages become at `fsync`).
            let lines: String = new
                .iter()
                .map(|&(off, addr, len)| format!("{off} {addr} {len}\n"))
                .collect();
            list.write_all(lines.as_bytes())
                .and_then(|()| if host { list.sync_data() } else { Ok(()) })
                .map_err(|e| io_fail("cannot list the file's pieces", e))?;
        }
        // Pieces adjacent in the file and in the array are one (the kernel merges the
        // mappings too), so a file that grows in place counts as one piece.
        seg.shown.sort_unstable();
        let mut merged: Vec<(u64, u64, u64)> = Vec::with_capacity(seg.shown.len());
        for &(off, addr, len) in &seg.shown {
            match merged.last_mut() {
                Some(l) if l.0 + l.2 == off && l.1 + l.2 == addr => l.2 += len,
                _ => merged.push((off, addr, len)),
            }
        }
        self.shown -= seg.shown.len() - merged.len();
        seg.shown = merged;
        Ok(())
    }

    /// Retires the segment of every file that shows a piece overlapping `ranges` (array
    /// ranges about to leave their files), or of `ino`: the array shows its own pages there
    /// again, holding the segment's bytes, and mappings made before keep the old pages.
    pub fn retire_over(&mut self, ranges: &[(u64, u64)]) -> Result<(), Failure> {
        let hit: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, seg)| {
                seg.shown.iter().any(|&(_, addr, len)| {
                    ranges
                        .iter()
                        .any(|&(s, l)| addr < s.saturating_add(l) && s < addr + len)
                })
            })
            .map(|(&ino, _)| ino)
            .collect();
        for ino in hit {
            self.retire(ino)?;
        }
        Ok(())
    }

    /// Retires `ino`'s segment, if it has one.
    pub fn retire(&mut self, ino: u64) -> Result<(), Failure> {
        self.retire_with(ino, Retire::Mapped)
    }

    /// Retires `ino`'s segment, first (unless the device has stopped) revoking every record
    /// over it, and telling clients that read and write in place when processes may map it.
    /// The segment stays known, with the pieces still shown, until every piece is the
    /// array's own again: a failure leaves nothing shown that the daemon does not know of
    /// (and so no space freed while it is shown).
    fn retire_with(&mut self, ino: u64, how: Retire) -> Result<(), Failure> {
        let Some(seg) = self.files.get(&ino) else {
            return Ok(());
        };
        if how == Retire::Mapped {
            // Clients reading and writing in place stop using these pages first (the wait
            // is bounded: a client can only delay this).
            self.device.retire_pages(IN_PLACE_WAIT);
        }
        if how != Retire::Stopped {
            revoke_records(&self.device, &seg.shown)?;
        }
        let mut buf = vec![0u8; 1 << 20];
        let seg = self.files.get_mut(&ino).expect("checked above");
        let folded: Vec<(u64, u64)> = seg.shown.iter().map(|&(_, a, l)| (a, l)).collect();
        while let Some(&(off, addr, len)) = seg.shown.last() {
            self.media
                .detach(addr, len)
                .map_err(|e| io_fail("cannot show the array's pages again", e))?;
            seg.shown.pop();
            self.shown -= 1;
            let mut at = 0;
            while at < len {
                let n = (len - at).min(buf.len() as u64) as usize;
                // A segment a writer shortened reads as zeros past its end.
                let got = read_full_at(&seg.rw, &mut buf[..n], off + at);
                buf[got..n].fill(0);
                // SAFETY: `buf` holds `n` bytes; the range is the file's, inside the array.
                unsafe { self.media.write(addr + at, buf.as_ptr(), n) };
                at += n as u64;
            }
        }
        let seg = self.files.remove(&ino).expect("checked above");
        if let Some(u) = seg.owner {
            if let Some(n) = self.per_user.get_mut(&u) {
                *n -= 1;
                if *n == 0 {
                    self.per_user.remove(&u);
                }
            }
        }
        self.forget(ino, &folded)
    }

    /// Removes a retired segment's file, once the array holds its bytes for good at the
    /// `host` level (so that a free that follows can never be durable before it).
    fn forget(&self, ino: u64, folded: &[(u64, u64)]) -> Result<(), Failure> {
        let Store::Dir { path, host } = &self.store else {
            return Ok(());
        };
        if *host {
            self.media
                .flush_ranges(folded)
                .map_err(|e| io_fail("cannot make the file's bytes durable", e))?;
        }
        // The list first: without it, a segment left behind is never folded.
        for name in [format!("{ino}.pieces"), ino.to_string()] {
            let file = path.join(name);
            match std::fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io_fail(&format!("cannot remove {}", file.display()), e))
                }
                _ => {}
            }
        }
        if *host {
            File::open(path)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_fail("cannot make the removal durable", e))?;
        }
        Ok(())
    }

    /// Retires every segment once the device has stopped (a clean stop: the array then
    /// holds every byte).
    /// On a failure the others are still retired, and what failed stays for the next start
    /// to fold; the first failure is returned.
    pub fn retire_all(&mut self) -> Result<(), Failure> {
        let inos: Vec<u64> = self.files.keys().copied().collect();
        let mut first = None;
        for ino in inos {
            if let Err(f) = self.retire_with(ino, Retire::Stopped) {
                first.get_or_insert(f);
            }
        }
        if let Some(f) = first {
            return Err(f);
        }
        if let Store::Dir { path, .. } = &self.store {
            match std::fs::remove_dir(path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io_fail(&format!("cannot remove {}", path.display()), e))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Folds the segments a daemon left (killed while files were mapped) back into the
    /// array: of the pieces each one's list names, the parts that the inode, a regular file,
    /// still holds at the same address (its extents, `allocated`; `None` for any other inode);
    /// then the pages directory goes. Returns how many segments there were.
    pub fn recover(
        &self,
        allocated: impl Fn(u64) -> Option<Vec<(u64, u64, u64)>>,
    ) -> Result<usize, Failure> {
        let Store::Dir { path, .. } = &self.store else {
            return Ok(0);
        };
        let entries = match std::fs::read_dir(path) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_fail(&format!("cannot read {}", path.display()), e)),
        };
        let mut count = 0;
        let mut ranges = Vec::new();
        let mut buf = vec![0u8; 1 << 20];
        for entry in entries {
            let entry = entry.map_err(|e| io_fail("cannot read the pages directory", e))?;
            let name = entry.file_name();
            let Some(ino) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".pieces"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            count += 1;
            let Some(extents) = allocated(ino) else {
                continue;
            };
            let list = std::fs::read_to_string(entry.path()).unwrap_or_default();
            let Ok(seg) = File::open(path.join(ino.to_string())) else {
                continue;
            };
            for line in list.lines() {
                let v: Vec<u64> = line.split(' ').filter_map(|w| w.parse().ok()).collect();
                let &[off, addr, len] = v.as_slice() else {
                    continue;
                };
                // The parts of the piece the file still holds at the same address: the mount
                // may have freed some of it since (room a size lease left past the end).
                for (from, to) in held_parts(&extents, off, addr, len) {
                    let mut at = from;
                    while at < to {
                        let want = (to - at).min(buf.len() as u64) as usize;
                        let n = read_full_at(&seg, &mut buf[..want], at);
                        if n == 0 {
                            break;
                        }
                        // SAFETY: `buf` holds `n` bytes; the range is the file's, in the array.
                        unsafe { self.media.write(addr + (at - off), buf.as_ptr(), n) };
                        at += n as u64;
                    }
                    ranges.push((addr + (from - off), to - from));
                }
            }
        }
        self.media
            .flush_ranges(&ranges)
            .map_err(|e| io_fail("cannot make the folded bytes durable", e))?;
        std::fs::remove_dir_all(path)
            .map_err(|e| io_fail(&format!("cannot remove {}", path.display()), e))?;
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_fail("cannot make the removal durable", e))?;
        }
        Ok(count)
    }
}

/// The file-offset ranges of the piece (`off`, `addr`, `len`) that `extents` (file offset,
/// address, bytes) still hold at the same address.
fn held_parts(extents: &[(u64, u64, u64)], off: u64, addr: u64, len: u64) -> Vec<(u64, u64)> {
    let end = off.saturating_add(len);
    extents
        .iter()
        .filter(|&&(x_off, x_addr, _)| {
            u128::from(addr) + u128::from(x_off) == u128::from(x_addr) + u128::from(off)
        })
        .filter_map(|&(x_off, _, x_len)| {
            let (from, to) = (off.max(x_off), end.min(x_off.saturating_add(x_len)));
            (from < to).then_some((from, to))
        })
        .collect()
}

/// The parts of `want` (file offset, address, bytes) that `have` does not cover. Every piece
/// of `have` lies inside one of `want` at the same address (space stays where it is while the
/// file keeps it, and a segment is retired before any leaves), so the difference is taken on
/// file offsets.
fn missing(have: &[(u64, u64, u64)], want: &[(u64, u64, u64)]) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    for &(off, addr, len) in want {
        let mut at = off;
        let end = off + len;
        for &(h_off, _, h_len) in have {
            let h_end = h_off + h_len;
            if h_end <= at || h_off >= end {
                continue;
            }
            if h_off > at {
                out.push((at, addr + (at - off), h_off - at));
            }
            at = at.max(h_end);
        }
        if at < end {
            out.push((at, addr + (at - off), end - at));
        }
    }
    out
}

/// Revokes every channel's records over `pieces` (file offset, address, bytes), and waits
/// until no command issued before is in flight.
fn revoke_records(device: &Device, pieces: &[(u64, u64, u64)]) -> Result<(), Failure> {
    let ops = pieces
        .iter()
        .map(|&(_, addr, len)| TableOp::RemoveRangeAll { start: addr, len })
        .collect();
    device
        .update(ops)
        .map_err(|e| io_fail("cannot revoke records", e))
}

/// Reads into `buf` at `off` until it is full or the file ends; the bytes read.
fn read_full_at(f: &File, buf: &mut [u8], off: u64) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], off + got as u64) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    got
}

#[cfg(test)]
mod tests {
    use super::{held_parts, missing};

    #[test]
    fn a_piece_folds_back_where_the_file_still_holds_it_at_the_same_address() {
        // Held whole; held in part (the end freed since); moved elsewhere; gone.
        assert_eq!(held_parts(&[(0, 100, 16)], 0, 100, 16), vec![(0, 16)]);
        assert_eq!(held_parts(&[(0, 100, 12)], 0, 100, 16), vec![(0, 12)]);
        assert_eq!(held_parts(&[(0, 900, 16)], 0, 100, 16), vec![]);
        assert_eq!(held_parts(&[], 0, 100, 16), vec![]);
        // Two extents, one of them at the piece's addresses.
        assert_eq!(
            held_parts(&[(0, 100, 8), (8, 500, 8)], 4, 104, 12),
            vec![(4, 8)]
        );
        // Addresses that would overflow compare exactly.
        assert_eq!(held_parts(&[(0, u64::MAX - 8, 8)], 8, 0, 8), vec![]);
    }

    #[test]
    fn what_a_segment_does_not_show_yet() {
        // Nothing shown: everything.
        assert_eq!(missing(&[], &[(0, 100, 8)]), vec![(0, 100, 8)]);
        // A file grown at its end, in place and elsewhere.
        let have = [(0, 100, 8)];
        assert_eq!(
            missing(&have, &[(0, 100, 16), (16, 500, 4)]),
            vec![(8, 108, 8), (16, 500, 4)]
        );
        // A hole filled between two shown pieces.
        let have = [(0, 100, 4), (8, 300, 4)];
        assert_eq!(
            missing(&have, &[(0, 100, 4), (4, 200, 4), (8, 300, 4)]),
            vec![(4, 200, 4)]
        );
        // All shown.
        assert!(missing(&have, &have).is_empty());
    }
}
