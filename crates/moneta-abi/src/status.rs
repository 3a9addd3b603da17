//! Completion status codes written by the device into a tag's `result` word and into error
//! entries.

/// The outcome of one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Status {
    /// The command completed.
    Ok = 0,
    /// The command is malformed: unknown opcode, unknown flag or completion mode, non-zero
    /// reserved word, zero length for a transfer.
    Malformed = 1,
    /// The DMA range (the tag's slice start plus the length) does not fit in the DMA buffer.
    BadDma = 2,
    /// The address range is outside the array.
    OutOfRange = 3,
    /// No permission record of this channel covers the whole range: never granted, revoked,
    /// or evicted (a hard miss: ask the permission manager again).
    PermissionMiss = 4,
    /// Records cover the range but do not carry the right the opcode needs (write on a
    /// read-only record).
    PermissionDenied = 5,
    /// The doorbell was rung for a tag whose previous command is still in flight. Reported only
    /// in the error queue: the tag's status belongs to the earlier command.
    TagBusy = 6,
    /// The media failed to persist a flushed range, or (on an array with data checksums) a
    /// block the command reads, or writes in part, does not match its checksum.
    MediaError = 7,
    /// The channel closed while the command waited for a physical tag. (Commands rung after a
    /// shutdown began are never taken: their client sees the daemon's socket close.)
    Aborted = 8,
    /// The device could not answer an `OP_LOOKUP` or `OP_FS` now (the file system was busy,
    /// the handle is not one it knows, the call would have to wait, the array has no file
    /// system): ask the permission manager on the control socket (`FS_LOOKUP`, or the same
    /// `FS` request), which answers or gives the error.
    Refer = 9,
}

impl Status {
    /// All codes, in numeric order.
    pub const ALL: [Status; 10] = [
        Status::Ok,
        Status::Malformed,
        Status::BadDma,
        Status::OutOfRange,
        Status::PermissionMiss,
        Status::PermissionDenied,
        Status::TagBusy,
        Status::MediaError,
        Status::Aborted,
        Status::Refer,
    ];

    /// Decodes a status word; unknown values give `None`.
    pub fn from_u32(v: u32) -> Option<Status> {
        Self::ALL.get(v as usize).copied()
    }

    /// A short lowercase name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Malformed => "malformed",
            Status::BadDma => "bad-dma",
            Status::OutOfRange => "out-of-range",
            Status::PermissionMiss => "permission-miss",
            Status::PermissionDenied => "permission-denied",
            Status::TagBusy => "tag-busy",
            Status::MediaError => "media-error",
            Status::Aborted => "aborted",
            Status::Refer => "refer",
        }
    }

    /// The errno a POSIX caller should see for this status.
    pub fn errno(self) -> i32 {
        match self {
            Status::Ok => 0,
            Status::Malformed | Status::BadDma => 22, // EINVAL
            Status::OutOfRange => 6,                  // ENXIO
            Status::PermissionMiss | Status::PermissionDenied => 13, // EACCES
            Status::TagBusy => 16,                    // EBUSY
            Status::MediaError => 5,                  // EIO
            Status::Aborted => 125,                   // ECANCELED
            Status::Refer => 11,                      // EAGAIN
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert_eq!(Status::from_u32(i as u32), Some(*s));
        }
        assert_eq!(Status::from_u32(10), None);
    }
}
