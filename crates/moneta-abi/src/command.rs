//! Command encoding: what a client writes into a tag slot before ringing the doorbell.
//!
//! Word 0: opcode (bits 0-15), flags (bits 16-31: completion mode, barrier, barrier epoch),
//! sequence number (bits 32-63).
//! Word 1: array address in bytes. Word 2: length in bytes. Word 3: cookie (echoed back).
//! Word 4: file tag (0: any; the handle for `OP_LOOKUP`). Words 5-7: reserved, zero.
//!
//! A non-zero file tag makes the command succeed only on records installed with that tag: the
//! permission manager installs a file's records with a tag that changes whenever space leaves
//! the file, so a client's stale translation of a file offset can never reach space that has
//! since been given to another file (or to another offset of the same one) and whose records
//! the client holds for that reason.
//!
//! The sequence number is the client's: the device writes it into the tag's `state` word when
//! the command completes, which is how the client recognises *this* command's completion
//! without ever writing the status entry itself.
//!
//! Commands are byte-addressed and of any size and alignment (Moneta-D §2.3). The data moves
//! between the array and the DMA buffer starting at the tag's slice (`tag * slice_size`); a
//! command may run past its slice into the following ones, up to the end of the buffer.

use crate::status::Status;

/// Does nothing and completes; needs no permission. Measures the channel's round trip.
pub const OP_NOP: u16 = 0;
/// Array → DMA buffer.
pub const OP_READ: u16 = 1;
/// DMA buffer → array.
pub const OP_WRITE: u16 = 2;
/// Barrier and flush: completes after every earlier command of the channel, and, with a
/// non-zero length, after the range is persisted to the backing store. A non-zero range needs a
/// record with either right.
pub const OP_FLUSH: u16 = 3;

/// The soft miss through the channel: maps part of an open file and installs the records.
/// Word 1: file offset; word 2: bytes to map (at least 1); word 4: the handle (the control
/// connection's, for the file open on it). The answer goes to the tag's slice of the DMA
/// buffer ([`LookupReply`]); [`Status::Refer`] sends the caller to `FS_LOOKUP` on the control
/// socket instead.
pub const OP_LOOKUP: u16 = 4;

/// A file-system call through the channel: the control protocol's `FS` request, as a whole
/// message (header and payload, exactly as on the control socket), at the start of the tag's
/// slice; word 2 is its length in bytes (1 to `slice_size`), words 1 and 4 are zero. The device
/// answers it for the channel's control connection, with that connection's credentials and
/// handles, and writes the reply message (what the socket would send) from the start of the
/// slice; the status entry's `bytes` is its length. [`Status::Refer`] sends the caller to the
/// control socket with the same request: the device answers only calls it can answer at once.
pub const OP_FS: u16 = 5;

/// A hint: the range will be read soon (the memory drives' paper, §3: hints from applications
/// to the DRAM buffer in front of the array). Words 1-2: array range (at least 1 byte), which
/// needs records with the read right, as a read (and the file tag in word 4, as a read). No
/// data moves and the DMA buffer is not used. Under an array model with a DRAM buffer the
/// device starts filling the buffer with the range's first 64 lines; on a persistent array it
/// asks the host to read the range's first 256 KiB in. It completes as soon as it is checked,
/// without waiting for either.
pub const OP_WILLNEED: u16 = 6;

/// Bytes of a [`OP_LOOKUP`] answer's header in the DMA slice.
pub const LOOKUP_HEADER: usize = 24;

/// Bytes of each extent of a [`OP_LOOKUP`] answer.
pub const LOOKUP_EXTENT: usize = 24;

/// Completion mode field of the flags (bits 0-1).
pub const FLAG_COMPLETION_MASK: u16 = 0b11;
/// Flag bit 2: a barrier (Moneta §IV). Requests of the channel in later barrier epochs issue
/// only once this command and every other command of its epoch have completed.
pub const FLAG_BARRIER: u16 = 1 << 2;
/// Flag bits 8-15: the command's barrier epoch, modulo 256. A channel starts in epoch 0 and
/// moves to the next epoch when a barrier of the current one has completed together with
/// every command of that epoch. A client that numbers its commands this way (the epoch after
/// each barrier it submits) gets barrier order whatever order the device takes its doorbell
/// bits in.
pub const FLAG_EPOCH_MASK: u16 = 0xff00;
/// Shift of the barrier epoch within the flags.
pub const FLAG_EPOCH_SHIFT: u16 = 8;
/// All flag bits the device understands; others must be zero.
pub const FLAG_KNOWN: u16 = FLAG_COMPLETION_MASK | FLAG_BARRIER | FLAG_EPOCH_MASK;

/// How the device tells the client a command completed (Moneta-D §4.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Completion {
    /// DMA completion: the device writes the tag's status entry; the client spins on it.
    Dma = 0,
    /// Forwarding: the device sets the tag's bit in the tag status register and increments the
    /// completion count; a client thread reads and clears the register and marks the entries.
    Forward = 1,
    /// Issue-sleep: the device writes the status entry and, if the waiter flag is set, wakes
    /// the futex on the entry's state word.
    Sleep = 2,
}

impl Completion {
    /// Decodes the completion mode bits.
    pub fn from_bits(bits: u16) -> Option<Completion> {
        match bits & FLAG_COMPLETION_MASK {
            0 => Some(Completion::Dma),
            1 => Some(Completion::Forward),
            2 => Some(Completion::Sleep),
            _ => None,
        }
    }
}

/// What a command asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    /// [`OP_NOP`].
    Nop,
    /// [`OP_READ`].
    Read,
    /// [`OP_WRITE`].
    Write,
    /// [`OP_FLUSH`].
    Flush,
    /// [`OP_LOOKUP`].
    Lookup,
    /// [`OP_FS`].
    Fs,
    /// [`OP_WILLNEED`].
    WillNeed,
    /// Any other value: answered with [`Status::Malformed`].
    Unsupported(u16),
}

impl Opcode {
    /// Decodes an opcode value; every value maps to something.
    pub fn from_u16(v: u16) -> Opcode {
        match v {
            OP_NOP => Opcode::Nop,
            OP_READ => Opcode::Read,
            OP_WRITE => Opcode::Write,
            OP_FLUSH => Opcode::Flush,
            OP_LOOKUP => Opcode::Lookup,
            OP_FS => Opcode::Fs,
            OP_WILLNEED => Opcode::WillNeed,
            other => Opcode::Unsupported(other),
        }
    }

    /// The encoded value.
    pub fn to_u16(self) -> u16 {
        match self {
            Opcode::Nop => OP_NOP,
            Opcode::Read => OP_READ,
            Opcode::Write => OP_WRITE,
            Opcode::Flush => OP_FLUSH,
            Opcode::Lookup => OP_LOOKUP,
            Opcode::Fs => OP_FS,
            Opcode::WillNeed => OP_WILLNEED,
            Opcode::Unsupported(v) => v,
        }
    }
}

/// A command's raw words, as copied out of shared memory.
pub type CommandWords = [u64; 8];

/// A command as a client builds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Command {
    /// What to do.
    pub opcode: Opcode,
    /// How to complete.
    pub completion: Completion,
    /// First array byte.
    pub addr: u64,
    /// Bytes to move.
    pub len: u64,
    /// Opaque value echoed in the status entry and error entries.
    pub cookie: u64,
    /// Written into the tag's `state` word on completion.
    pub seq: u32,
    /// The tag every record the command uses must carry; 0 for any.
    pub file: u64,
    /// A barrier: later epochs wait for this command and the rest of its epoch.
    pub barrier: bool,
    /// The barrier epoch (0 for a client that never sends barriers).
    pub epoch: u8,
}

impl Command {
    /// A command in epoch 0 without a barrier, cookie or sequence number (the channel driver
    /// sets the sequence number when it submits).
    pub fn new(opcode: Opcode, completion: Completion, addr: u64, len: u64, file: u64) -> Self {
        Command {
            opcode,
            completion,
            addr,
            len,
            cookie: 0,
            seq: 0,
            file,
            barrier: false,
            epoch: 0,
        }
    }

    /// The flags field: completion mode, barrier bit and epoch.
    pub fn flags(&self) -> u16 {
        self.completion as u16
            | if self.barrier { FLAG_BARRIER } else { 0 }
            | (u16::from(self.epoch) << FLAG_EPOCH_SHIFT)
    }

    /// Encodes the command into slot words.
    pub fn to_words(&self) -> CommandWords {
        let w0 = u64::from(self.opcode.to_u16())
            | (u64::from(self.flags()) << 16)
            | (u64::from(self.seq) << 32);
        [w0, self.addr, self.len, self.cookie, self.file, 0, 0, 0]
    }
}

/// A command that passed decoding (not yet checked against the DMA buffer, the array or the
/// permission table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Opcode; never [`Opcode::Unsupported`].
    pub opcode: Opcode,
    /// Completion mode.
    pub completion: Completion,
    /// First array byte.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// Cookie.
    pub cookie: u64,
    /// Sequence number to publish on completion.
    pub seq: u32,
    /// File tag the records must carry, 0 for any.
    pub file: u64,
    /// A barrier ([`FLAG_BARRIER`]).
    pub barrier: bool,
    /// The barrier epoch ([`FLAG_EPOCH_MASK`]).
    pub epoch: u8,
}

/// Why a command failed decoding, with the status the device reports for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeError {
    /// Status to report.
    pub status: Status,
    /// The completion mode the command asked for, when readable, so the device can answer
    /// the way the client waits; [`Completion::Dma`] otherwise.
    pub completion: Completion,
    /// The cookie, echoed.
    pub cookie: u64,
    /// The sequence number, echoed.
    pub seq: u32,
}

/// Decodes raw slot words. Only the shape is checked here; limits that depend on the channel
/// and the array are checked by the device.
pub fn decode(w: &CommandWords) -> Result<Decoded, DecodeError> {
    let opcode_raw = w[0] as u16;
    let flags = (w[0] >> 16) as u16;
    let seq = (w[0] >> 32) as u32;
    let cookie = w[3];
    let completion = Completion::from_bits(flags);
    let fail = |status| DecodeError {
        status,
        completion: completion.unwrap_or(Completion::Dma),
        cookie,
        seq,
    };
    let Some(completion) = completion else {
        return Err(fail(Status::Malformed));
    };
    if flags & !FLAG_KNOWN != 0 || w[5..].iter().any(|&x| x != 0) {
        return Err(fail(Status::Malformed));
    }
    let opcode = Opcode::from_u16(opcode_raw);
    let (addr, len) = (w[1], w[2]);
    match opcode {
        Opcode::Unsupported(_) => return Err(fail(Status::Malformed)),
        Opcode::Read | Opcode::Write | Opcode::Lookup | Opcode::WillNeed if len == 0 => {
            return Err(fail(Status::Malformed))
        }
        Opcode::Lookup if addr.checked_add(len).is_none() => return Err(fail(Status::Malformed)),
        Opcode::Nop if addr != 0 || len != 0 || w[4] != 0 => return Err(fail(Status::Malformed)),
        _ => {}
    }
    Ok(Decoded {
        opcode,
        completion,
        addr,
        len,
        cookie,
        seq,
        file: w[4],
        barrier: flags & FLAG_BARRIER != 0,
        epoch: (flags >> FLAG_EPOCH_SHIFT) as u8,
    })
}

/// The answer of an [`OP_LOOKUP`], as written into the tag's DMA slice: `u64` file size,
/// `u32` extent count, `u32` rights (1 read, 2 write), `u64` layout tag, then per extent `u64`
/// file offset, `u64` length, `u64` array address (`u64::MAX` for a hole).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupReply {
    /// File size.
    pub size: u64,
    /// Rights the records were installed with.
    pub rights: u32,
    /// The layout tag the records carry.
    pub file: u64,
    /// (file offset, length, array address or `u64::MAX`).
    pub extents: Vec<(u64, u64, u64)>,
}

impl LookupReply {
    /// Most extents an answer carries in a slice of `slice` bytes.
    pub fn capacity(slice: usize) -> usize {
        slice.saturating_sub(LOOKUP_HEADER) / LOOKUP_EXTENT
    }

    /// The encoded bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(LOOKUP_HEADER + self.extents.len() * LOOKUP_EXTENT);
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&(self.extents.len() as u32).to_le_bytes());
        v.extend_from_slice(&self.rights.to_le_bytes());
        v.extend_from_slice(&self.file.to_le_bytes());
        for &(o, l, d) in &self.extents {
            v.extend_from_slice(&o.to_le_bytes());
            v.extend_from_slice(&l.to_le_bytes());
            v.extend_from_slice(&d.to_le_bytes());
        }
        v
    }

    /// Decodes an answer from the start of `b`; `None` if it does not fit.
    pub fn decode(b: &[u8]) -> Option<LookupReply> {
        let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
        let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let n = u32_at(8)? as usize;
        if n > Self::capacity(b.len()) {
            return None;
        }
        let mut extents = Vec::with_capacity(n);
        for i in 0..n {
            let o = LOOKUP_HEADER + i * LOOKUP_EXTENT;
            extents.push((u64_at(o)?, u64_at(o + 8)?, u64_at(o + 16)?));
        }
        Some(LookupReply {
            size: u64_at(0)?,
            rights: u32_at(12)?,
            file: u64_at(16)?,
            extents,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(op: Opcode, len: u64) -> Command {
        Command {
            opcode: op,
            completion: Completion::Sleep,
            addr: 4096,
            len,
            cookie: 77,
            seq: 0xdead_beef,
            file: 0,
            barrier: false,
            epoch: 0,
        }
    }

    #[test]
    fn round_trip() {
        for op in [Opcode::Read, Opcode::Write, Opcode::Flush] {
            let c = cmd(op, 512);
            let d = decode(&c.to_words()).unwrap();
            assert_eq!(d.opcode, op);
            assert_eq!(d.completion, Completion::Sleep);
            assert_eq!(
                (d.addr, d.len, d.cookie, d.seq, d.file),
                (4096, 512, 77, 0xdead_beef, 0)
            );
            let tagged = Command { file: 9, ..c };
            assert_eq!(decode(&tagged.to_words()).unwrap().file, 9);
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        let mut w = cmd(Opcode::Read, 512).to_words();
        w[0] |= 3 << 16; // completion mode 3
        assert_eq!(decode(&w).unwrap_err().status, Status::Malformed);
        let mut w = cmd(Opcode::Read, 512).to_words();
        w[0] |= 1 << 20; // an unknown flag
        assert_eq!(decode(&w).unwrap_err().status, Status::Malformed);
        let mut w = cmd(Opcode::Read, 512).to_words();
        w[7] = 1;
        assert_eq!(decode(&w).unwrap_err().status, Status::Malformed);
        let w = cmd(Opcode::Unsupported(99), 512).to_words();
        let e = decode(&w).unwrap_err();
        assert_eq!(
            (e.status, e.completion, e.cookie),
            (Status::Malformed, Completion::Sleep, 77)
        );
        assert_eq!(
            decode(&cmd(Opcode::Write, 0).to_words())
                .unwrap_err()
                .status,
            Status::Malformed
        );
        let mut nop = cmd(Opcode::Nop, 0);
        assert_eq!(
            decode(&nop.to_words()).unwrap_err().status,
            Status::Malformed
        );
        nop.addr = 0;
        assert!(decode(&nop.to_words()).is_ok());
        nop.file = 1;
        assert_eq!(
            decode(&nop.to_words()).unwrap_err().status,
            Status::Malformed
        );
    }
}
