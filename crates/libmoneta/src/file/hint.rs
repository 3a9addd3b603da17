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

impl File {
    /// Tells the device that `[off, off + len)` will be read soon (`len == 0`: to the end of
    /// the file, as `posix_fadvise` takes it), at most [`MAX_HINT`] bytes of it. Holes and
    /// bytes past the end of the file are skipped. The file must be open for reading
    /// (`EBADF`); it returns once the device has taken the hints, without waiting for it to
    /// act on them.
    pub fn will_need(&self, off: u64, len: u64) -> Result<(), ClientError> {
        self.check_access(false)?;
        self.check_range(off, len, false)?;
        self.h()?;
        let size = self.len()?;
        let end = if len == 0 { size } else { off + len };
        let end = end.min(size).min(off.saturating_add(MAX_HINT));
        let mut at = off;
        let mut fruitless = 0u32;
        while at < end {
            let want = ((end - at) as usize).min(STEP);
            let p = self.prepare_read(at, want, &mut fruitless)?;
            if p.len == 0 {
                break;
            }
            // The planned segments (at most a DMA slice each), joined where they follow one
            // another in the array: a hint needs no DMA buffer.
            let mut runs: Vec<(u64, u64, u64)> = Vec::new();
            for s in &p.segs {
                match runs.last_mut() {
                    Some((dev, n, file)) if *dev + *n == s.dev && *file == s.file => {
                        *n += s.len as u64;
                    }
                    _ => runs.push((s.dev, s.len as u64, s.file)),
                }
            }
            let mut missed = false;
            for &(dev, n, file) in &runs {
                match self.hint_one(dev, n, file)? {
                    Status::Ok => {}
                    Status::PermissionMiss => {
                        missed = true;
                        break;
                    }
                    Status::PermissionDenied => return Err(errno(libc::EBADF)),
                    st => return Err(ClientError::Status(st)),
                }
            }
            if missed {
                // A record went (the table is full, or space left the file): look again.
                self.hard_miss_at(at, &mut fruitless)?;
                continue;
            }
            at += p.len as u64;
        }
        Ok(())
    }

    /// One `OP_WILLNEED` command: its status.
    fn hint_one(&self, dev: u64, len: u64, file: u64) -> Result<Status, ClientError> {
        let ch = self.ch();
        let tag = ch.tag();
        ch.submit(
            tag,
            &command(Opcode::WillNeed, Completion::Dma, dev, len, file),
        );
        let r = ch.wait(tag, Completion::Dma);
        ch.release(tag);
        Ok(r?.status)
    }
}
