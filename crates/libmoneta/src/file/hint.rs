//! Hints to the device: the bytes a process says it will read soon (`posix_fadvise` and
//! `madvise` with `WILLNEED`), sent as `OP_WILLNEED` commands over the file's extents, so that
//! the DRAM buffer in front of the array fills them ahead of use (the memory drives' paper,
//! §3: hints from applications). A hint moves no data and needs the read right, as a read.

use moneta_abi::{Completion, Opcode, Status};

use crate::channel::command;
use crate::{errno, ClientError};

use super::File;

/// Most bytes of the file one call hints (from its offset): the device's buffer holds far
/// less, and a hint of a whole large file would only look up extents to no use.
pub const MAX_HINT: u64 = 256 << 20;

/// Bytes of the file planned at a time.
const STEP: usize = 16 << 20;

/// Hint commands in flight at once (each on a tag of its own).
const IN_FLIGHT: usize = 16;

/// Most bytes one hint command names: what the device acts on of one (256 KiB: 64 lines of
/// the model's buffer in 4 KiB lines, and the pages a persistent array reads in at once).
const RUN_MAX: u64 = 256 << 10;

/// One hint command: the file offset it starts at, and its array range and layout tag.
#[derive(Clone, Copy)]
struct Run {
    at: u64,
    dev: u64,
    len: u64,
    file: u64,
}

impl File {
    /// Tells the device that `[off, off + len)` will be read soon (`len == 0`: to the end of
    /// the file, as `posix_fadvise` takes it), at most 256 MiB of it (`MAX_HINT`). Holes and
    /// bytes past the end of the file are skipped. The file must be open for reading
    /// (`EBADF`); it returns once the device has taken the hints, without waiting for it to
    /// act on them.
    pub fn will_need(&self, off: u64, len: u64) -> Result<(), ClientError> {
        self.will_need_ranges(&[(off, len)])
    }

    /// [`File::will_need`] for several ranges (file offset, length) at once, their commands
    /// in flight together: what a reader that skips through a file knows it will read next.
    pub fn will_need_ranges(&self, ranges: &[(u64, u64)]) -> Result<(), ClientError> {
        self.check_access(false)?;
        for &(off, len) in ranges {
            self.check_range(off, len, false)?;
        }
        self.h()?;
        let mut fruitless = 0u32;
        loop {
            let runs = self.hint_plan(ranges, &mut fruitless)?;
            match self.hint_runs(&runs)? {
                None => return Ok(()),
                Some((i, Status::PermissionMiss)) => {
                    // A record went (the table is full, or space left the file): look again.
                    self.hard_miss_at(runs[i].at, &mut fruitless)?;
                }
                Some((_, Status::PermissionDenied)) => return Err(errno(libc::EBADF)),
                Some((_, st)) => return Err(ClientError::Status(st)),
            }
        }
    }

    /// The commands that hint `ranges`: their planned segments (at most a DMA slice each),
    /// joined where they follow one another in the array (a hint needs no DMA buffer), up to
    /// [`RUN_MAX`] bytes a command.
    fn hint_plan(
        &self,
        ranges: &[(u64, u64)],
        fruitless: &mut u32,
    ) -> Result<Vec<Run>, ClientError> {
        let mut runs: Vec<Run> = Vec::new();
        for &(off, len) in ranges {
            // The plan of each step stops at the end of the file.
            let end = off.saturating_add(if len == 0 {
                MAX_HINT
            } else {
                len.min(MAX_HINT)
            });
            let mut at = off;
            while at < end {
                let want = ((end - at) as usize).min(STEP);
                let p = self.prepare_read(at, want, fruitless)?;
                if p.len == 0 {
                    break;
                }
                for s in &p.segs {
                    match runs.last_mut() {
                        Some(r)
                            if r.dev + r.len == s.dev
                                && r.file == s.file
                                && r.len + s.len as u64 <= RUN_MAX =>
                        {
                            r.len += s.len as u64;
                        }
                        _ => runs.push(Run {
                            at: at + s.at as u64,
                            dev: s.dev,
                            len: s.len as u64,
                            file: s.file,
                        }),
                    }
                }
                at += p.len as u64;
            }
        }
        Ok(runs)
    }

    /// `OP_WILLNEED` commands for `runs`, up to [`IN_FLIGHT`] at once: the first that did not
    /// succeed, with its status. As a request's commands, it waits for a tag only while it
    /// holds none, so threads hinting at once cannot hold each other's tags.
    fn hint_runs(&self, runs: &[Run]) -> Result<Option<(usize, Status)>, ClientError> {
        let ch = self.ch();
        let mut held: Vec<(crate::Tag, usize)> = Vec::with_capacity(IN_FLIGHT);
        let mut first: Option<(usize, Status)> = None;
        let mut failed = None;
        let mut finish = |held: &mut Vec<(crate::Tag, usize)>| {
            for (tag, i) in held.drain(..) {
                match ch.wait(tag, Completion::Dma) {
                    Ok(c) if c.status != Status::Ok && first.is_none_or(|(j, _)| i < j) => {
                        first = Some((i, c.status));
                    }
                    Ok(_) => {}
                    Err(e) => failed = Some(e),
                }
                ch.release(tag);
            }
        };
        for (i, r) in runs.iter().enumerate() {
            let tag = if held.is_empty() {
                ch.tag()
            } else {
                match (held.len() < IN_FLIGHT).then(|| ch.try_tag()).flatten() {
                    Some(t) => t,
                    None => {
                        finish(&mut held);
                        ch.tag()
                    }
                }
            };
            ch.submit(
                tag,
                &command(Opcode::WillNeed, Completion::Dma, r.dev, r.len, r.file),
            );
            held.push((tag, i));
        }
        finish(&mut held);
        match failed {
            Some(e) => Err(e),
            None => Ok(first),
        }
    }
}
