//! From hostile words to a typed, bounded request: the device's decode-and-validate step.
//!
//! The engine copies a command's words out of shared memory once and hands them here. What
//! comes back either carries a status to complete with, or is a request whose DMA range lies in
//! the channel's buffer and whose address range lies in the array; the permission check comes
//! after retag.

use moneta_abi::{decode, Completion, Decoded, Opcode, Status};

use crate::channel::DmaGeometry;

/// A command that failed validation: what to answer and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// Status to report.
    pub status: Status,
    /// Completion mode to answer with.
    pub completion: Completion,
    /// What the command said, for the status entry and error queue (opcode as decoded).
    pub cmd: Decoded,
}

/// Validates the words a client wrote on `tag` against the channel's DMA geometry and the
/// array's size. Never panics, whatever the words.
pub fn validate(
    words: &[u64; 8],
    tag: usize,
    geometry: DmaGeometry,
    array_size: u64,
) -> Result<Decoded, Rejected> {
    let cmd = decode(words).map_err(|e| Rejected {
        status: e.status,
        completion: e.completion,
        cmd: Decoded {
            opcode: Opcode::from_u16(words[0] as u16),
            completion: e.completion,
            addr: words[1],
            len: words[2],
            cookie: e.cookie,
            seq: e.seq,
            file: words[4],
            barrier: false,
            epoch: 0,
        },
    })?;
    let in_array = |addr: u64, len: u64| addr.checked_add(len).is_some_and(|e| e <= array_size);
    let status = match cmd.opcode {
        Opcode::Read | Opcode::Write => {
            let dma_start = tag.checked_mul(geometry.slice_size).map(|s| s as u64);
            if dma_start
                .and_then(|s| s.checked_add(cmd.len))
                .is_none_or(|e| e > geometry.dma_size as u64)
            {
                Some(Status::BadDma)
            } else if !in_array(cmd.addr, cmd.len) {
                Some(Status::OutOfRange)
            } else {
                None
            }
        }
        Opcode::Flush | Opcode::WillNeed if !in_array(cmd.addr, cmd.len) => {
            Some(Status::OutOfRange)
        }
        // Answered when taken, outside the channel's barrier epochs: they cannot be barriers.
        Opcode::Lookup | Opcode::Fs if cmd.barrier => Some(Status::Malformed),
        // The request lies in the tag's own slice; nothing else is addressed.
        Opcode::Fs if cmd.len == 0 || cmd.len > geometry.slice_size as u64 => Some(Status::BadDma),
        Opcode::Fs if cmd.addr != 0 || cmd.file != 0 => Some(Status::Malformed),
        _ => None,
    };
    match status {
        Some(status) => Err(Rejected {
            status,
            completion: cmd.completion,
            cmd,
        }),
        None => Ok(cmd),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moneta_abi::Command;

    const GEO: DmaGeometry = DmaGeometry {
        dma_size: 1 << 20,
        slice_size: 16 << 10,
    };

    fn words(op: Opcode, addr: u64, len: u64) -> [u64; 8] {
        Command {
            opcode: op,
            completion: Completion::Forward,
            addr,
            len,
            cookie: 3,
            seq: 11,
            file: 0,
            barrier: false,
            epoch: 0,
        }
        .to_words()
    }

    #[test]
    fn bounds() {
        let ok = validate(&words(Opcode::Read, 0, 16 << 10), 63, GEO, 1 << 30).unwrap();
        assert_eq!(ok.len, 16 << 10);
        let e = validate(&words(Opcode::Read, 0, (16 << 10) + 1), 63, GEO, 1 << 30).unwrap_err();
        assert_eq!(
            (e.status, e.completion),
            (Status::BadDma, Completion::Forward)
        );
        let e = validate(&words(Opcode::Write, (1 << 30) - 1, 2), 0, GEO, 1 << 30).unwrap_err();
        assert_eq!(e.status, Status::OutOfRange);
        let e = validate(&words(Opcode::Flush, u64::MAX, 2), 0, GEO, 1 << 30).unwrap_err();
        assert_eq!(e.status, Status::OutOfRange);
        assert!(validate(&words(Opcode::Flush, 0, 0), 0, GEO, 1 << 30).is_ok());
        // A hint names a range of the array, of any length past the DMA buffer, but not none.
        assert!(validate(&words(Opcode::WillNeed, 0, 1 << 29), 63, GEO, 1 << 30).is_ok());
        let e = validate(&words(Opcode::WillNeed, 1 << 29, 1 << 30), 0, GEO, 1 << 30).unwrap_err();
        assert_eq!(e.status, Status::OutOfRange);
        let e = validate(&words(Opcode::WillNeed, 0, 0), 0, GEO, 1 << 30).unwrap_err();
        assert_eq!(e.status, Status::Malformed);
        // LOOKUP and FS are answered when taken: neither can be a barrier.
        for op in [Opcode::Lookup, Opcode::Fs] {
            let mut c = Command::new(op, Completion::Dma, 0, 16, 0);
            assert!(validate(&c.to_words(), 0, GEO, 1 << 30).is_ok());
            c.barrier = true;
            let e = validate(&c.to_words(), 0, GEO, 1 << 30).unwrap_err();
            assert_eq!(e.status, Status::Malformed);
        }
        let e = validate(&words(Opcode::Unsupported(9), 0, 1), 0, GEO, 1 << 30).unwrap_err();
        assert_eq!(
            (e.status, e.cmd.opcode),
            (Status::Malformed, Opcode::Unsupported(9))
        );
    }
}
