//! Files of a kernel file system on the array (`monetad --kernel-fs`): control-protocol ops
//! 48 to 52 (docs/abi.md §2.11).
//!
//! A client opens a file through the kernel, which decides whether it may (Moneta-D's
//! recycled file system), and hands the descriptor to the daemon with [`OP_KFS_OPEN`]
//! (`SCM_RIGHTS`). The daemon answers with a handle carrying the rights of the descriptor's
//! access mode. [`OP_KFS_MAP`] installs permission records for the file's extents (from the
//! kernel's extent map, FIEMAP) in the caller's channel and says where they are;
//! [`OP_KFS_ALLOCATE`] makes a range writable through the channel (filling holes and
//! preallocated extents, growing the file); [`OP_KFS_CLOSE`] gives the handle back;
//! [`OP_KFS_INFO`] says which file system the daemon serves and where it is mounted.

use crate::control::{Error, Reader, Writer};

/// Open: the request carries no payload and one descriptor (`SCM_RIGHTS`), opened for
/// reading, writing or both, of a regular file on the daemon's kernel file system. Reply:
/// handle (u64), size (u64), rights (u32), reserved (u32).
pub const OP_KFS_OPEN: u16 = 48;
/// Map: handle (u64), offset (u64), length (u64). Reply: [`KfsMap`].
pub const OP_KFS_MAP: u16 = 49;
/// Allocate: handle (u64), offset (u64), length (u64). Reply: [`KfsMap`] of the range.
pub const OP_KFS_ALLOCATE: u16 = 50;
/// Close: handle (u64). No reply payload.
pub const OP_KFS_CLOSE: u16 = 51;
/// Info: no payload. Reply: kind (u32: [`FS_EXT4`] or [`FS_XFS`]), path length (u32), then
/// the mount point's absolute path (at most [`MAX_MOUNT_PATH`] bytes, no NUL).
pub const OP_KFS_INFO: u16 = 52;

/// [`OP_KFS_INFO`]'s kind of an ext4 file system.
pub const FS_EXT4: u32 = 1;
/// [`OP_KFS_INFO`]'s kind of an XFS file system.
pub const FS_XFS: u32 = 2;
/// Longest mount path [`OP_KFS_INFO`] carries.
pub const MAX_MOUNT_PATH: usize = 4096;

/// Most extents one map reply carries; a client asks again from the end of the last one.
pub const MAX_KFS_EXTENTS: usize = 256;

/// Whether `op` is one of this module's.
pub fn is_kfs_op(op: u16) -> bool {
    (OP_KFS_OPEN..=OP_KFS_INFO).contains(&op)
}

/// How a range of a file is reached ([`KfsExtent::kind`]).
pub mod kind {
    /// Through the channel at the extent's array address, with the extent's rights: the
    /// daemon installed records for it in the caller's channel.
    pub const CHANNEL: u32 = 0;
    /// A hole or a preallocated (unwritten) extent: it reads as zeros now; writing it needs
    /// [`super::OP_KFS_ALLOCATE`] first. Nothing is installed for it, so a client must not
    /// keep this answer: it holds only at the moment of the reply.
    pub const ZEROS: u32 = 1;
    /// Only through the kernel: the file system keeps these bytes where the channel must not
    /// touch them (inline, encoded or encrypted data, an extent not yet allocated or not
    /// aligned).
    pub const KERNEL: u32 = 2;
}

/// A request of this module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KfsRequest {
    /// [`OP_KFS_OPEN`].
    Open,
    /// [`OP_KFS_MAP`].
    Map {
        /// The handle.
        handle: u64,
        /// First byte of the file.
        offset: u64,
        /// Bytes (at least 1).
        len: u64,
    },
    /// [`OP_KFS_ALLOCATE`].
    Allocate {
        /// The handle.
        handle: u64,
        /// First byte of the file.
        offset: u64,
        /// Bytes (at least 1).
        len: u64,
    },
    /// [`OP_KFS_CLOSE`].
    Close {
        /// The handle.
        handle: u64,
    },
    /// [`OP_KFS_INFO`].
    Info,
}

impl KfsRequest {
    /// The op code.
    pub fn op(&self) -> u16 {
        match self {
            KfsRequest::Open => OP_KFS_OPEN,
            KfsRequest::Map { .. } => OP_KFS_MAP,
            KfsRequest::Allocate { .. } => OP_KFS_ALLOCATE,
            KfsRequest::Close { .. } => OP_KFS_CLOSE,
            KfsRequest::Info => OP_KFS_INFO,
        }
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        match *self {
            KfsRequest::Open | KfsRequest::Info => {}
            KfsRequest::Map {
                handle,
                offset,
                len,
            }
            | KfsRequest::Allocate {
                handle,
                offset,
                len,
            } => {
                w.u64(handle).u64(offset).u64(len);
            }
            KfsRequest::Close { handle } => {
                w.u64(handle);
            }
        }
    }

    pub(crate) fn decode(op: u16, r: &mut Reader<'_>) -> Result<KfsRequest, Error> {
        let range = |r: &mut Reader<'_>| -> Result<(u64, u64, u64), Error> {
            let (handle, offset, len) = (r.u64()?, r.u64()?, r.u64()?);
            // Offsets are file offsets, which the kernel keeps below 2^63.
            if len == 0 || offset.checked_add(len).is_none_or(|e| e > i64::MAX as u64) {
                return Err(Error::BadField("len"));
            }
            Ok((handle, offset, len))
        };
        Ok(match op {
            OP_KFS_OPEN => KfsRequest::Open,
            OP_KFS_MAP => {
                let (handle, offset, len) = range(r)?;
                KfsRequest::Map {
                    handle,
                    offset,
                    len,
                }
            }
            OP_KFS_ALLOCATE => {
                let (handle, offset, len) = range(r)?;
                KfsRequest::Allocate {
                    handle,
                    offset,
                    len,
                }
            }
            OP_KFS_CLOSE => KfsRequest::Close { handle: r.u64()? },
            OP_KFS_INFO => KfsRequest::Info,
            other => return Err(Error::UnknownOp(other)),
        })
    }
}

/// A range of a file and how it is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KfsExtent {
    /// First byte of the file.
    pub logical: u64,
    /// Array address of that byte ([`kind::CHANNEL`] only; zero otherwise).
    pub physical: u64,
    /// Bytes.
    pub len: u64,
    /// [`kind`].
    pub kind: u32,
    /// The rights installed for it ([`kind::CHANNEL`] only): the handle's, less write for an
    /// extent the file shares with another (reflinked).
    pub rights: u32,
}

/// The reply of [`OP_KFS_MAP`] and [`OP_KFS_ALLOCATE`]: size (u64), count (u32), reserved
/// (u32), then `count` extents of 32 bytes: logical (u64), physical (u64), length (u64),
/// kind (u32), rights (u32). The extents are in file order, without gaps, from the offset
/// asked for to the end of the range or of the file, whichever comes first (or fewer, at most
/// [`MAX_KFS_EXTENTS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KfsMap {
    /// The file's size now.
    pub size: u64,
    /// The extents.
    pub extents: Vec<KfsExtent>,
}

/// A reply of this module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KfsReply {
    /// [`OP_KFS_OPEN`].
    Opened {
        /// The handle.
        handle: u64,
        /// The file's size.
        size: u64,
        /// [`crate::control::RIGHT_READ`] | [`crate::control::RIGHT_WRITE`].
        rights: u32,
    },
    /// [`OP_KFS_MAP`], [`OP_KFS_ALLOCATE`].
    Map(KfsMap),
    /// [`OP_KFS_CLOSE`].
    Closed,
    /// [`OP_KFS_INFO`].
    Info {
        /// [`FS_EXT4`] or [`FS_XFS`].
        kind: u32,
        /// Where the file system is mounted (absolute).
        mount: Vec<u8>,
    },
}

impl KfsReply {
    pub(crate) fn encode(&self, w: &mut Writer) {
        match self {
            KfsReply::Opened {
                handle,
                size,
                rights,
            } => {
                w.u64(*handle).u64(*size).u32(*rights).u32(0);
            }
            KfsReply::Map(m) => {
                w.u64(m.size).u32(m.extents.len() as u32).u32(0);
                for e in &m.extents {
                    w.u64(e.logical)
                        .u64(e.physical)
                        .u64(e.len)
                        .u32(e.kind)
                        .u32(e.rights);
                }
            }
            KfsReply::Closed => {}
            KfsReply::Info { kind, mount } => {
                w.u32(*kind).bytes(mount);
            }
        }
    }

    pub(crate) fn decode(op: u16, r: &mut Reader<'_>) -> Result<KfsReply, Error> {
        Ok(match op {
            OP_KFS_OPEN => {
                let (handle, size, rights) = (r.u64()?, r.u64()?, r.u32()?);
                r.zero32("reserved")?;
                KfsReply::Opened {
                    handle,
                    size,
                    rights,
                }
            }
            OP_KFS_MAP | OP_KFS_ALLOCATE => {
                let size = r.u64()?;
                let count = r.u32()? as usize;
                r.zero32("reserved")?;
                if count > MAX_KFS_EXTENTS {
                    return Err(Error::BadField("count"));
                }
                let mut extents = Vec::with_capacity(count);
                for _ in 0..count {
                    let e = KfsExtent {
                        logical: r.u64()?,
                        physical: r.u64()?,
                        len: r.u64()?,
                        kind: r.u32()?,
                        rights: r.u32()?,
                    };
                    if e.kind > kind::KERNEL || e.len == 0 {
                        return Err(Error::BadField("extent"));
                    }
                    extents.push(e);
                }
                KfsReply::Map(KfsMap { size, extents })
            }
            OP_KFS_CLOSE => KfsReply::Closed,
            OP_KFS_INFO => {
                let kind = r.u32()?;
                let n = r.u32()? as usize;
                if !(FS_EXT4..=FS_XFS).contains(&kind) {
                    return Err(Error::BadField("kind"));
                }
                if n == 0 || n > MAX_MOUNT_PATH {
                    return Err(Error::BadField("path length"));
                }
                let mount = r.take(n)?.to_vec();
                if mount[0] != b'/' || mount.contains(&0) {
                    return Err(Error::BadField("path"));
                }
                KfsReply::Info { kind, mount }
            }
            other => return Err(Error::UnknownOp(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{
        decode_reply, decode_request, encode_reply, encode_request, ReplyBody, Request,
    };

    #[test]
    fn requests_and_replies_round_trip() {
        for req in [
            KfsRequest::Open,
            KfsRequest::Map {
                handle: 3,
                offset: 4096,
                len: 10,
            },
            KfsRequest::Allocate {
                handle: 3,
                offset: 0,
                len: 1 << 20,
            },
            KfsRequest::Close { handle: 9 },
            KfsRequest::Info,
        ] {
            let b = encode_request(5, &Request::Kfs(req.clone()));
            assert_eq!(decode_request(&b).unwrap(), (5, Request::Kfs(req)));
        }
        let map = KfsReply::Map(KfsMap {
            size: 12288,
            extents: vec![
                KfsExtent {
                    logical: 0,
                    physical: 1 << 20,
                    len: 8192,
                    kind: kind::CHANNEL,
                    rights: 3,
                },
                KfsExtent {
                    logical: 8192,
                    physical: 0,
                    len: 4096,
                    kind: kind::ZEROS,
                    rights: 0,
                },
            ],
        });
        for (op, reply) in [
            (
                OP_KFS_OPEN,
                KfsReply::Opened {
                    handle: 1,
                    size: 2,
                    rights: 1,
                },
            ),
            (OP_KFS_MAP, map.clone()),
            (OP_KFS_ALLOCATE, map),
            (OP_KFS_CLOSE, KfsReply::Closed),
            (
                OP_KFS_INFO,
                KfsReply::Info {
                    kind: FS_XFS,
                    mount: b"/mnt/moneta".to_vec(),
                },
            ),
        ] {
            let b = encode_reply(op, 6, &Ok(ReplyBody::Kfs(reply.clone())));
            assert_eq!(
                decode_reply(&b, op).unwrap().result,
                Ok(ReplyBody::Kfs(reply))
            );
        }
    }

    #[test]
    fn rejects_bad_ranges() {
        let mut w = Writer(Vec::new());
        w.u64(1).u64(u64::MAX - 1).u64(4);
        let mut r = Reader { b: &w.0 };
        assert_eq!(
            KfsRequest::decode(OP_KFS_MAP, &mut r),
            Err(Error::BadField("len"))
        );
        let mut w = Writer(Vec::new());
        w.u64(1).u64(0).u64(0);
        let mut r = Reader { b: &w.0 };
        assert_eq!(
            KfsRequest::decode(OP_KFS_ALLOCATE, &mut r),
            Err(Error::BadField("len"))
        );
    }

    #[test]
    fn rejects_bad_mount_info() {
        for (kind, path) in [
            (3u32, &b"/m"[..]),
            (FS_EXT4, b""),
            (FS_EXT4, b"relative"),
            (FS_EXT4, b"/a\0b"),
        ] {
            let mut w = Writer(Vec::new());
            w.u32(kind).bytes(path);
            let mut r = Reader { b: &w.0 };
            assert!(
                KfsReply::decode(OP_KFS_INFO, &mut r).is_err(),
                "{kind} {path:?}"
            );
        }
        let mut w = Writer(Vec::new());
        w.u32(FS_EXT4).u32(MAX_MOUNT_PATH as u32 + 1);
        let mut r = Reader { b: &w.0 };
        assert_eq!(
            KfsReply::decode(OP_KFS_INFO, &mut r),
            Err(Error::BadField("path length"))
        );
    }
}
