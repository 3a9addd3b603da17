//! The control protocol: messages on `monetad`'s Unix socket (`SOCK_SEQPACKET`, one message per
//! packet, little-endian).
//!
//! Every message starts with a 16-byte header: magic `b"MNCP"` (u32), version (u16), op (u16),
//! sequence number (u32, echoed in the reply), payload length (u32). A reply's op is the
//! request's op with bit 15 set; its payload starts with a result (i32: zero or a negative Linux
//! errno) and four reserved bytes; a failed reply carries a UTF-8 message after that, a
//! successful one the op's reply payload. Messages are at most [`MAX_MESSAGE`] bytes.

/// `b"MNCP"` read as a little-endian `u32`.
pub const CONTROL_MAGIC: u32 = u32::from_le_bytes(*b"MNCP");
/// Bytes in a message header.
pub const HEADER_LEN: usize = 16;
/// Largest message either side sends or accepts.
pub const MAX_MESSAGE: usize = 16384;
/// Set in a reply's op.
pub const REPLY_BIT: u16 = 0x8000;

/// Ask for a channel; the reply carries the channel memfd and the kick eventfd (`SCM_RIGHTS`).
pub const OP_OPEN_CHANNEL: u16 = 1;
/// Administrative grant of a permission record to a channel (daemon's user or root only).
pub const OP_GRANT: u16 = 2;
/// Administrative revocation of a channel's coverage of a range; replies once no request in
/// flight uses the revoked records.
pub const OP_REVOKE: u16 = 3;
/// Administrative revocation of all of a channel's records of one file.
pub const OP_REVOKE_FILE: u16 = 4;
/// Device counters.
pub const OP_STATUS: u16 = 5;
/// Clean shutdown (daemon's user or root only): in-flight requests finish, the array is
/// flushed, the daemon exits.
pub const OP_SHUTDOWN: u16 = 6;
/// Liveness check; empty payloads both ways.
pub const OP_PING: u16 = 7;
/// The array model's report: its parameters, what its parts did, energy and wear
/// ([`ModelReport`]).
pub const OP_MODEL: u16 = 8;

/// Record right: read.
pub const RIGHT_READ: u32 = 1;
/// Record right: write.
pub const RIGHT_WRITE: u32 = 2;
/// All rights bits.
pub const RIGHTS_MASK: u32 = RIGHT_READ | RIGHT_WRITE;

/// Linux errno values used in control replies.
pub mod errno {
    /// Operation not permitted (not the daemon's user or root).
    pub const EPERM: i32 = 1;
    /// No such channel (or file).
    pub const ENOENT: i32 = 2;
    /// I/O error.
    pub const EIO: i32 = 5;
    /// Resource temporarily unavailable.
    pub const EAGAIN: i32 = 11;
    /// No such handle.
    pub const EBADF: i32 = 9;
    /// Out of memory.
    pub const ENOMEM: i32 = 12;
    /// Device busy (shutting down).
    pub const EBUSY: i32 = 16;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Too many channels.
    pub const EMFILE: i32 = 24;
    /// No space left in the permission table for the request.
    pub const ENOSPC: i32 = 28;
    /// Address range outside the array.
    pub const ERANGE: i32 = 34;
    /// Waiting for a file lock would deadlock.
    pub const EDEADLK: i32 = 35;
    /// Too many file locks.
    pub const ENOLCK: i32 = 37;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
    /// Protocol error (bad magic, length or payload).
    pub const EPROTO: i32 = 71;
    /// Connection already has a channel.
    pub const EEXIST: i32 = 17;
    /// Channel ABI version not supported (OPEN_CHANNEL). A control-protocol version mismatch
    /// in a header is answered with EPROTO.
    pub const EPROTONOSUPPORT: i32 = 93;
    /// No room to watch one more kept answer of the channel (`OP_FS_STATDIR`).
    pub const ENOBUFS: i32 = 105;
}

/// Why bytes are not a valid control message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// Shorter than its header or its payload says.
    Truncated,
    /// Longer than [`MAX_MESSAGE`] or than the op's payload.
    TooLong,
    /// Wrong magic.
    BadMagic,
    /// A version this side does not speak.
    BadVersion(u16),
    /// An op this side does not know.
    UnknownOp(u16),
    /// A reserved field is not zero or a field is out of its domain.
    BadField(&'static str),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::Truncated => write!(f, "message truncated"),
            Error::TooLong => write!(f, "message too long"),
            Error::BadMagic => write!(f, "bad magic: not a Moneta control message"),
            Error::BadVersion(v) => write!(f, "unsupported control protocol version {v}"),
            Error::UnknownOp(op) => write!(f, "unknown control op {op}"),
            Error::BadField(name) => write!(f, "invalid field `{name}`"),
        }
    }
}

impl std::error::Error for Error {}

/// A grant of one permission record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Target channel.
    pub channel: u32,
    /// [`RIGHT_READ`] | [`RIGHT_WRITE`]; not zero.
    pub rights: u32,
    /// First array byte.
    pub start: u64,
    /// Bytes; not zero.
    pub len: u64,
    /// File id the record belongs to (records merge only within one file).
    pub file: u64,
}

/// A control request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Payload: ABI version (u32), reserved (u32).
    OpenChannel {
        /// The client's [`crate::ABI_VERSION`].
        abi_version: u32,
    },
    /// Payload: channel (u32), rights (u32), start (u64), len (u64), file (u64).
    Grant(Grant),
    /// Payload: channel (u32), reserved (u32), start (u64), len (u64).
    Revoke {
        /// Target channel.
        channel: u32,
        /// First byte.
        start: u64,
        /// Bytes; not zero.
        len: u64,
    },
    /// Payload: channel (u32), reserved (u32), file (u64).
    RevokeFile {
        /// Target channel.
        channel: u32,
        /// File id.
        file: u64,
    },
    /// No payload.
    Status,
    /// No payload.
    Shutdown,
    /// No payload.
    Ping,
    /// No payload.
    Model,
    /// A file-system call (ops 16 and up); see [`crate::fsproto`].
    Fs(crate::fsproto::FsRequest),
    /// A call on a file of the kernel file system on the array (ops 48 to 51); see
    /// [`crate::kfsproto`]. [`crate::kfsproto::OP_KFS_OPEN`] carries a descriptor.
    Kfs(crate::kfsproto::KfsRequest),
}

impl Request {
    /// The op code of this request.
    pub fn op(&self) -> u16 {
        match self {
            Request::OpenChannel { .. } => OP_OPEN_CHANNEL,
            Request::Grant(_) => OP_GRANT,
            Request::Revoke { .. } => OP_REVOKE,
            Request::RevokeFile { .. } => OP_REVOKE_FILE,
            Request::Status => OP_STATUS,
            Request::Shutdown => OP_SHUTDOWN,
            Request::Ping => OP_PING,
            Request::Model => OP_MODEL,
            Request::Fs(f) => f.op(),
            Request::Kfs(k) => k.op(),
        }
    }
}

/// What the daemon tells a client about its new channel. Reply payload after the result word:
/// channel id (u32), tags (u32), slice size (u32), reserved (u32), DMA offset (u64), DMA size
/// (u64), array size (u64), channel size (u64).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelInfo {
    /// Channel id.
    pub channel: u32,
    /// Tags (64).
    pub tags: u32,
    /// Bytes of DMA buffer per tag.
    pub slice_size: u32,
    /// Offset of the DMA buffer in the memfd.
    pub dma_offset: u64,
    /// Bytes of DMA buffer.
    pub dma_size: u64,
    /// Bytes in the array.
    pub array_size: u64,
    /// Bytes in the memfd.
    pub channel_size: u64,
}

macro_rules! status_report {
    ($( $(#[$m:meta])* $name:ident ),* $(,)?) => {
        /// Device counters returned by [`OP_STATUS`]: after the result word, a count (u32),
        /// four reserved bytes, then `count` u64 values in the order of this struct's fields.
        /// A reader takes the fields it knows and ignores extra ones.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct StatusReport { $( $(#[$m])* pub $name: u64, )* }

        impl StatusReport {
            /// Field names in wire order.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// Field values in wire order.
            pub fn values(&self) -> Vec<u64> { vec![$(self.$name),*] }

            fn from_values(v: &[u64]) -> Option<Self> {
                let mut it = v.iter().copied();
                Some(Self { $( $name: it.next()?, )* })
            }
        }
    };
}

status_report! {
    /// Daemon process id.
    pid,
    /// Nanoseconds since the daemon started.
    uptime_ns,
    /// Bytes in the array.
    array_size,
    /// 1 if the array is a file that survives the daemon, 0 for a volatile memfd.
    persistent,
    /// Channels open now.
    channels_open,
    /// Most channels allowed.
    channels_max,
    /// Physical tags in the retag pool.
    phys_tags,
    /// Physical tags held by requests now.
    phys_tags_in_use,
    /// Requests that waited for a physical tag.
    retag_stalls,
    /// Permission table capacity (records).
    table_capacity,
    /// Records in the table now.
    table_used,
    /// Records merged into a neighbour on insert.
    table_merges,
    /// Records evicted because the table was full.
    table_evictions,
    /// Requests failed with a permission miss.
    permission_misses,
    /// Requests failed with permission denied.
    permission_denials,
    /// Requests completed (any status).
    commands,
    /// Requests completed with an error status, plus doorbell rings refused because the tag
    /// was busy (those complete nothing: they are reported in the error queue only).
    command_errors,
    /// Bytes read from the array.
    bytes_read,
    /// Bytes written to the array.
    bytes_written,
    /// Flush commands that passed the permission check (including any whose persist failed).
    flushes,
    /// Error entries dropped because a channel's queue was full.
    error_overflows,
    /// Times the poller went to sleep.
    poller_sleeps,
    /// Times the poller was woken.
    poller_wakeups,
    /// Channels parked (need-wakeup set) so far.
    parks,
    /// Permission-table update batches applied.
    table_updates,
    /// Channels reclaimed after their client closed or died.
    channels_reclaimed,
    /// Reads and writes timed stage by stage (only with `monetad --trace`).
    traced,
    /// Nanoseconds those requests spent between the doorbell being seen and their permission
    /// check (waiting for a physical tag or for the poller's pass).
    trace_queue_ns,
    /// Nanoseconds they spent in the permission check.
    trace_check_ns,
    /// Nanoseconds they spent moving data between the array and the DMA buffers.
    trace_move_ns,
    /// Nanoseconds from the data's movement to the completion's publication (the media
    /// model's latency, when set, and the scheduler).
    trace_media_ns,
    /// `OP_LOOKUP` commands the device answered (soft misses served through the channel).
    lookups,
    /// `OP_LOOKUP` commands it referred to the control socket.
    lookups_referred,
    /// `OP_FS` commands the device answered (file-system calls through the channel).
    fs_calls,
    /// `OP_FS` commands it referred to the control socket.
    fs_calls_referred,
    /// `OP_WILLNEED` hints that passed the permission check.
    hints,
}

/// The array model's report ([`OP_MODEL`]): after the result word, a byte count (u32), four
/// reserved bytes, then that many bytes of UTF-8 text, one `key value` pair per line (the key
/// has no spaces; the value is the rest of the line). Keys are dotted paths (`energy.total_j`,
/// `controllers.0.utilisation`); `model none` means the daemon runs without a model. `members.N.*`
/// keys after the model's describe the links to other members (docs/distributed.md).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelReport {
    /// The pairs, in the daemon's order.
    pub pairs: Vec<(String, String)>,
}

impl ModelReport {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The text.
    pub fn encode(&self) -> Vec<u8> {
        let mut t = String::new();
        for (k, v) in &self.pairs {
            t.push_str(k);
            t.push(' ');
            t.push_str(v);
            t.push('\n');
        }
        t.into_bytes()
    }

    /// Parses the text; `None` if it is not UTF-8 or a line has no key.
    pub fn decode(b: &[u8]) -> Option<ModelReport> {
        let t = std::str::from_utf8(b).ok()?;
        let mut pairs = Vec::new();
        for line in t.lines() {
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            if k.is_empty() {
                return None;
            }
            pairs.push((k.to_string(), v.to_string()));
        }
        Some(ModelReport { pairs })
    }
}

/// A reply body, by op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyBody {
    /// For ops with no reply payload.
    Empty,
    /// For [`OP_OPEN_CHANNEL`].
    Channel(ChannelInfo),
    /// For [`OP_STATUS`].
    Status(StatusReport),
    /// For [`OP_MODEL`].
    Model(ModelReport),
    /// The reply of a file-system call.
    Fs(crate::fsproto::FsReply),
    /// The reply of a call on a kernel file system's file.
    Kfs(crate::kfsproto::KfsReply),
}

/// A failed request: a negative errno and a message saying what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Positive Linux errno.
    pub errno: i32,
    /// Human-readable reason.
    pub message: String,
}

/// A decoded reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The request's op (without [`REPLY_BIT`]).
    pub op: u16,
    /// The request's sequence number.
    pub seq: u32,
    /// The outcome.
    pub result: Result<ReplyBody, Failure>,
}

pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    fn new(op: u16, seq: u32) -> Self {
        let mut v = Vec::with_capacity(64);
        v.extend_from_slice(&CONTROL_MAGIC.to_le_bytes());
        v.extend_from_slice(&crate::CONTROL_VERSION.to_le_bytes());
        v.extend_from_slice(&op.to_le_bytes());
        v.extend_from_slice(&seq.to_le_bytes());
        v.extend_from_slice(&0u32.to_le_bytes());
        Writer(v)
    }
    pub(crate) fn u32(&mut self, x: u32) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
    pub(crate) fn i32(&mut self, x: i32) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, x: u64) -> &mut Self {
        self.0.extend_from_slice(&x.to_le_bytes());
        self
    }
    fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - HEADER_LEN) as u32;
        self.0[12..16].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

pub(crate) struct Reader<'a> {
    pub(crate) b: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.b.len() < n {
            return Err(Error::Truncated);
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Error> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(crate) fn i32(&mut self) -> Result<i32, Error> {
        Ok(i32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Error> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(crate) fn zero32(&mut self, name: &'static str) -> Result<(), Error> {
        if self.u32()? != 0 {
            return Err(Error::BadField(name));
        }
        Ok(())
    }
    pub(crate) fn end(&self) -> Result<(), Error> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(Error::TooLong)
        }
    }
}

/// Parses a header, returning (op, seq, payload).
fn split_header(bytes: &[u8]) -> Result<(u16, u32, &[u8]), Error> {
    if bytes.len() > MAX_MESSAGE {
        return Err(Error::TooLong);
    }
    if bytes.len() < HEADER_LEN {
        return Err(Error::Truncated);
    }
    let mut r = Reader { b: bytes };
    if r.u32()? != CONTROL_MAGIC {
        return Err(Error::BadMagic);
    }
    let version = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes"));
    if version != crate::CONTROL_VERSION {
        return Err(Error::BadVersion(version));
    }
    let op = u16::from_le_bytes(r.take(2)?.try_into().expect("2 bytes"));
    let seq = r.u32()?;
    let len = r.u32()? as usize;
    match len.cmp(&r.b.len()) {
        core::cmp::Ordering::Greater => Err(Error::Truncated),
        core::cmp::Ordering::Less => Err(Error::TooLong),
        core::cmp::Ordering::Equal => Ok((op, seq, r.b)),
    }
}

/// Peeks at the sequence number and op of a message whose header is intact, so a server can
/// answer even a request whose payload it rejects.
pub fn peek_header(bytes: &[u8]) -> Option<(u16, u32)> {
    if bytes.len() < HEADER_LEN || bytes[0..4] != CONTROL_MAGIC.to_le_bytes() {
        return None;
    }
    let op = u16::from_le_bytes([bytes[6], bytes[7]]);
    let seq = u32::from_le_bytes(bytes[8..12].try_into().ok()?);
    Some((op, seq))
}

/// Encodes a request.
pub fn encode_request(seq: u32, req: &Request) -> Vec<u8> {
    let mut w = Writer::new(req.op(), seq);
    match req {
        Request::OpenChannel { abi_version } => {
            w.u32(*abi_version).u32(0);
        }
        Request::Grant(g) => {
            w.u32(g.channel)
                .u32(g.rights)
                .u64(g.start)
                .u64(g.len)
                .u64(g.file);
        }
        Request::Revoke {
            channel,
            start,
            len,
        } => {
            w.u32(*channel).u32(0).u64(*start).u64(*len);
        }
        Request::RevokeFile { channel, file } => {
            w.u32(*channel).u32(0).u64(*file);
        }
        Request::Status | Request::Shutdown | Request::Ping | Request::Model => {}
        Request::Fs(f) => f.encode(&mut w),
        Request::Kfs(k) => k.encode(&mut w),
    }
    w.finish()
}

/// Decodes a request from untrusted bytes, returning its sequence number.
pub fn decode_request(bytes: &[u8]) -> Result<(u32, Request), Error> {
    let (op, seq, payload) = split_header(bytes)?;
    let mut r = Reader { b: payload };
    let req = match op {
        OP_OPEN_CHANNEL => {
            let abi_version = r.u32()?;
            r.zero32("reserved")?;
            Request::OpenChannel { abi_version }
        }
        OP_GRANT => {
            let g = Grant {
                channel: r.u32()?,
                rights: r.u32()?,
                start: r.u64()?,
                len: r.u64()?,
                file: r.u64()?,
            };
            if g.rights == 0 || g.rights & !RIGHTS_MASK != 0 {
                return Err(Error::BadField("rights"));
            }
            if g.len == 0 || g.start.checked_add(g.len).is_none() {
                return Err(Error::BadField("len"));
            }
            Request::Grant(g)
        }
        OP_REVOKE => {
            let channel = r.u32()?;
            r.zero32("reserved")?;
            let (start, len) = (r.u64()?, r.u64()?);
            if len == 0 || start.checked_add(len).is_none() {
                return Err(Error::BadField("len"));
            }
            Request::Revoke {
                channel,
                start,
                len,
            }
        }
        OP_REVOKE_FILE => {
            let channel = r.u32()?;
            r.zero32("reserved")?;
            Request::RevokeFile {
                channel,
                file: r.u64()?,
            }
        }
        OP_STATUS => Request::Status,
        OP_SHUTDOWN => Request::Shutdown,
        OP_PING => Request::Ping,
        OP_MODEL => Request::Model,
        other if crate::fsproto::is_fs_op(other) => {
            Request::Fs(crate::fsproto::FsRequest::decode(other, &mut r)?)
        }
        other if crate::kfsproto::is_kfs_op(other) => {
            Request::Kfs(crate::kfsproto::KfsRequest::decode(other, &mut r)?)
        }
        other => return Err(Error::UnknownOp(other)),
    };
    r.end()?;
    Ok((seq, req))
}

/// Encodes a reply to request `op` with sequence number `seq`.
pub fn encode_reply(op: u16, seq: u32, result: &Result<ReplyBody, Failure>) -> Vec<u8> {
    let mut w = Writer::new(op | REPLY_BIT, seq);
    match result {
        Err(f) => {
            w.i32(-f.errno.abs()).u32(0);
            let room = MAX_MESSAGE - HEADER_LEN - 8;
            let mut msg = f.message.as_str();
            while msg.len() > room {
                let mut cut = room;
                while !msg.is_char_boundary(cut) {
                    cut -= 1;
                }
                msg = &msg[..cut];
            }
            w.0.extend_from_slice(msg.as_bytes());
        }
        Ok(body) => {
            w.i32(0).u32(0);
            match body {
                ReplyBody::Empty => {}
                ReplyBody::Channel(c) => {
                    w.u32(c.channel).u32(c.tags).u32(c.slice_size).u32(0);
                    w.u64(c.dma_offset)
                        .u64(c.dma_size)
                        .u64(c.array_size)
                        .u64(c.channel_size);
                }
                ReplyBody::Status(s) => {
                    let v = s.values();
                    w.u32(v.len() as u32).u32(0);
                    for x in v {
                        w.u64(x);
                    }
                }
                ReplyBody::Model(m) => {
                    let text = m.encode();
                    w.u32(text.len() as u32).u32(0);
                    w.0.extend_from_slice(&text);
                }
                ReplyBody::Fs(f) => f.encode(&mut w),
                ReplyBody::Kfs(k) => k.encode(&mut w),
            }
        }
    }
    w.finish()
}

/// Decodes a reply; `expect_op` is the op of the request it answers.
pub fn decode_reply(bytes: &[u8], expect_op: u16) -> Result<Reply, Error> {
    let (op, seq, payload) = split_header(bytes)?;
    if op != expect_op | REPLY_BIT {
        return Err(Error::UnknownOp(op));
    }
    let mut r = Reader { b: payload };
    let result = r.i32()?;
    r.zero32("reserved")?;
    if result != 0 {
        let message = String::from_utf8_lossy(r.b).into_owned();
        return Ok(Reply {
            op: expect_op,
            seq,
            result: Err(Failure {
                errno: result.checked_neg().unwrap_or(i32::MAX),
                message,
            }),
        });
    }
    let body = match expect_op {
        OP_OPEN_CHANNEL => {
            let channel = r.u32()?;
            let tags = r.u32()?;
            let slice_size = r.u32()?;
            r.zero32("reserved")?;
            ReplyBody::Channel(ChannelInfo {
                channel,
                tags,
                slice_size,
                dma_offset: r.u64()?,
                dma_size: r.u64()?,
                array_size: r.u64()?,
                channel_size: r.u64()?,
            })
        }
        OP_STATUS => {
            let count = r.u32()? as usize;
            r.zero32("reserved")?;
            let mut v = Vec::with_capacity(count.min(MAX_MESSAGE / 8));
            for _ in 0..count {
                v.push(r.u64()?);
            }
            ReplyBody::Status(StatusReport::from_values(&v).ok_or(Error::BadField("status count"))?)
        }
        OP_MODEL => {
            let len = r.u32()? as usize;
            r.zero32("reserved")?;
            let text = r.take(len)?;
            ReplyBody::Model(ModelReport::decode(text).ok_or(Error::BadField("model report"))?)
        }
        op if crate::fsproto::is_fs_op(op) => {
            ReplyBody::Fs(crate::fsproto::FsReply::decode(op, &mut r)?)
        }
        op if crate::kfsproto::is_kfs_op(op) => {
            ReplyBody::Kfs(crate::kfsproto::KfsReply::decode(op, &mut r)?)
        }
        _ => ReplyBody::Empty,
    };
    r.end()?;
    Ok(Reply {
        op: expect_op,
        seq,
        result: Ok(body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let reqs = [
            Request::OpenChannel { abi_version: 1 },
            Request::Grant(Grant {
                channel: 3,
                rights: RIGHT_READ | RIGHT_WRITE,
                start: 4096,
                len: 1 << 20,
                file: 9,
            }),
            Request::Revoke {
                channel: 3,
                start: 0,
                len: 10,
            },
            Request::RevokeFile {
                channel: 3,
                file: 9,
            },
            Request::Status,
            Request::Shutdown,
            Request::Ping,
        ];
        for (i, req) in reqs.iter().enumerate() {
            let b = encode_request(i as u32, req);
            assert_eq!(decode_request(&b).unwrap(), (i as u32, req.clone()));
            // Every strict prefix is rejected, and so is one extra byte.
            for cut in 0..b.len() {
                assert!(decode_request(&b[..cut]).is_err(), "{req:?} cut at {cut}");
            }
            let mut longer = b.clone();
            longer.push(0);
            assert!(decode_request(&longer).is_err());
        }
    }

    #[test]
    fn rejects_bad_grants() {
        let mut g = Grant {
            channel: 0,
            rights: 4,
            start: 0,
            len: 1,
            file: 0,
        };
        assert_eq!(
            decode_request(&encode_request(1, &Request::Grant(g))),
            Err(Error::BadField("rights"))
        );
        g.rights = RIGHT_READ;
        g.start = u64::MAX;
        assert_eq!(
            decode_request(&encode_request(1, &Request::Grant(g))),
            Err(Error::BadField("len"))
        );
        let mut b = encode_request(1, &Request::Ping);
        b[0] = b'X';
        assert_eq!(decode_request(&b), Err(Error::BadMagic));
        let mut b = encode_request(1, &Request::Ping);
        b[4] = 9;
        assert_eq!(decode_request(&b), Err(Error::BadVersion(9)));
        let mut b = encode_request(1, &Request::Ping);
        b[6] = 200;
        assert_eq!(decode_request(&b), Err(Error::UnknownOp(200)));
    }

    #[test]
    fn replies_round_trip() {
        let info = ChannelInfo {
            channel: 5,
            tags: 64,
            slice_size: 16384,
            dma_offset: 0x4000,
            dma_size: 1 << 20,
            array_size: 1 << 30,
            channel_size: 0x4000 + (1 << 20),
        };
        let b = encode_reply(OP_OPEN_CHANNEL, 7, &Ok(ReplyBody::Channel(info)));
        let r = decode_reply(&b, OP_OPEN_CHANNEL).unwrap();
        assert_eq!((r.seq, r.result), (7, Ok(ReplyBody::Channel(info))));

        let s = StatusReport {
            pid: 1,
            table_used: 42,
            channels_reclaimed: 3,
            ..Default::default()
        };
        let b = encode_reply(OP_STATUS, 8, &Ok(ReplyBody::Status(s)));
        assert_eq!(
            decode_reply(&b, OP_STATUS).unwrap().result,
            Ok(ReplyBody::Status(s))
        );

        let m = ModelReport {
            pairs: vec![
                ("model".into(), "pcm".into()),
                ("wear.histogram".into(), "1 2 3".into()),
                ("empty".into(), String::new()),
            ],
        };
        let b = encode_reply(OP_MODEL, 9, &Ok(ReplyBody::Model(m.clone())));
        let r = decode_reply(&b, OP_MODEL).unwrap().result.unwrap();
        assert_eq!(r, ReplyBody::Model(m.clone()));
        assert_eq!(m.get("wear.histogram"), Some("1 2 3"));
        let req = encode_request(3, &Request::Model);
        assert_eq!(decode_request(&req).unwrap().1, Request::Model);
        assert_eq!(ModelReport::decode(b" no key\n"), None);
        assert_eq!(ModelReport::decode(&[0xff]), None);

        let f = Failure {
            errno: errno::EMFILE,
            message: "too many channels".into(),
        };
        let b = encode_reply(OP_OPEN_CHANNEL, 9, &Err(f.clone()));
        assert_eq!(decode_reply(&b, OP_OPEN_CHANNEL).unwrap().result, Err(f));
        assert!(decode_reply(&b, OP_STATUS).is_err());
    }

    #[test]
    fn long_failure_messages_are_cut_to_fit() {
        let f = Failure {
            errno: errno::EINVAL,
            message: "é".repeat(5000),
        };
        let b = encode_reply(OP_GRANT, 1, &Err(f));
        assert!(b.len() <= MAX_MESSAGE);
        let r = decode_reply(&b, OP_GRANT).unwrap();
        assert!(r.result.unwrap_err().message.chars().all(|c| c == 'é'));
    }
}
