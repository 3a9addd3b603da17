//! The control connection: requests to `monetad` over its Unix socket.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use moneta_abi::control::{
    self, decode_reply, encode_request, ChannelInfo, Grant, ReplyBody, Request, StatusReport,
    MAX_MESSAGE,
};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketType,
};

use crate::trust::Trust;
use crate::ClientError;

/// `recvmsg` (with `MSG_CMSG_CLOEXEC`) that first polls the socket for `spin`, yielding the
/// CPU between tries, and only then blocks (retrying after `EINTR`). A peer that answers within
/// microseconds is then met awake; waking a thread that sleeps on another CPU can cost tens of
/// them.
pub fn recvmsg_polling(
    fd: &OwnedFd,
    buf: &mut [u8],
    cmsg: &mut RecvAncillaryBuffer<'_>,
    spin: std::time::Duration,
) -> rustix::io::Result<rustix::net::RecvMsg> {
    let started = std::time::Instant::now();
    loop {
        let spinning = started.elapsed() < spin;
        let flags = if spinning {
            RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT
        } else {
            RecvFlags::CMSG_CLOEXEC
        };
        match rustix::net::recvmsg(fd, &mut [IoSliceMut::new(buf)], cmsg, flags) {
            Err(rustix::io::Errno::AGAIN) if spinning => std::thread::yield_now(),
            Err(rustix::io::Errno::INTR) => {}
            r => return r,
        }
    }
}

/// How long a caller polls for a reply before sleeping.
pub const REPLY_SPIN: std::time::Duration = std::time::Duration::from_micros(50);
use moneta_abi::fsproto::{FsExtent, FsReply, FsRequest, FsStat, Target};

/// Seconds a control call waits for the daemon's answer.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection to `monetad`'s control socket.
pub struct Control {
    fd: OwnedFd,
    seq: AtomicU32,
    lock: Mutex<()>,
    /// Whether [`Control::recv_raw`] polls for [`REPLY_SPIN`] before sleeping.
    poll: AtomicBool,
}

impl Control {
    /// Connects to the daemon at `socket`, once the socket's directories and the daemon's
    /// credentials pass the checks of [`crate::trust`] (users trusted: this process's, root's
    /// and those `MONETA_DAEMON_UID` names).
    pub fn connect(socket: &Path) -> Result<Control, ClientError> {
        let trust = Trust::from_env().map_err(|e| ClientError::Untrusted(e.why))?;
        Self::connect_trusting(socket, &trust)
    }

    /// [`Control::connect`] with the trusted users given.
    pub fn connect_trusting(socket: &Path, trust: &Trust) -> Result<Control, ClientError> {
        let not_running = |e: rustix::io::Errno| ClientError::NotRunning {
            socket: socket.to_owned(),
            source: e.into(),
        };
        trust
            .check_path(socket)
            .map_err(|e| ClientError::Untrusted(e.why))?;
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )?;
        let fd = crate::fdnum::hide(fd);
        let addr = SocketAddrUnix::new(socket).map_err(not_running)?;
        rustix::net::connect(&fd, &addr).map_err(not_running)?;
        trust
            .check_peer(&fd, socket)
            .map_err(|e| ClientError::Untrusted(e.why))?;
        rustix::net::sockopt::set_socket_timeout(
            &fd,
            rustix::net::sockopt::Timeout::Recv,
            Some(CONTROL_TIMEOUT),
        )?;
        Ok(Control {
            fd,
            seq: AtomicU32::new(1),
            lock: Mutex::new(()),
            poll: AtomicBool::new(true),
        })
    }

    /// The socket, for liveness checks.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Sends `req` and returns the reply body and any file descriptors that came with it.
    pub fn call(&self, req: &Request) -> Result<(ReplyBody, Vec<OwnedFd>), ClientError> {
        self.call_passing(req, &[])
    }

    /// [`Control::call`], passing `fds` with the request (`SCM_RIGHTS`).
    pub fn call_passing(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(ReplyBody, Vec<OwnedFd>), ClientError> {
        let _g = self.lock.lock().expect("control lock");
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let msg = encode_request(seq, req);
        self.send_passing(&msg, fds)?;
        // A reply to an earlier call that timed out may arrive first: skip it.
        let (bytes, fds) = loop {
            let (bytes, fds) = self.recv_raw()?;
            match control::peek_header(&bytes) {
                Some((_, s)) if s != seq && s.wrapping_sub(seq) > u32::MAX / 2 => continue,
                _ => break (bytes, fds),
            }
        };
        let reply = decode_reply(&bytes, req.op()).map_err(ClientError::Protocol)?;
        if reply.seq != seq {
            return Err(ClientError::Protocol(control::Error::BadField("seq")));
        }
        match reply.result {
            Ok(body) => Ok((body, fds)),
            Err(f) => Err(ClientError::Refused {
                errno: f.errno,
                message: f.message,
            }),
        }
    }

    /// Sends raw bytes as one message (for tests of the daemon's parser).
    pub fn send_raw(&self, msg: &[u8]) -> Result<(), ClientError> {
        self.send_passing(msg, &[])
    }

    /// Sends raw bytes as one message with descriptors (at most four).
    pub fn send_passing(&self, msg: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), ClientError> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut cmsg = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !cmsg.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(ClientError::Io(std::io::Error::other(
                "too many descriptors for one message",
            )));
        }
        rustix::net::sendmsg(
            &self.fd,
            &[IoSlice::new(msg)],
            &mut cmsg,
            SendFlags::NOSIGNAL,
        )
        .map_err(|e| match e {
            rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET => ClientError::Disconnected,
            e => e.into(),
        })?;
        Ok(())
    }

    /// Whether replies are polled for before the caller sleeps (the default; see
    /// [`crate::affinity::worth_polling`] for when not to).
    pub fn set_polling(&self, poll: bool) {
        self.poll.store(poll, Ordering::Relaxed);
    }

    /// Receives one message and the descriptors passed with it. Unless told not to
    /// ([`Control::set_polling`]), it polls the socket for a short while before blocking: a
    /// reply usually comes within microseconds, and waking a sleeping thread on another CPU can
    /// cost tens of them.
    pub fn recv_raw(&self) -> Result<(Vec<u8>, Vec<OwnedFd>), ClientError> {
        let mut buf = vec![0u8; MAX_MESSAGE + 1];
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let spin = if self.poll.load(Ordering::Relaxed) {
            REPLY_SPIN
        } else {
            Duration::ZERO
        };
        let r = recvmsg_polling(&self.fd, &mut buf, &mut cmsg, spin).map_err(|e| match e {
            rustix::io::Errno::AGAIN => ClientError::Timeout,
            rustix::io::Errno::CONNRESET => ClientError::DeviceGone,
            e => e.into(),
        })?;
        let mut fds = Vec::new();
        for m in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(it) = m {
                fds.extend(it);
            }
        }
        if r.bytes == 0 {
            return Err(ClientError::DeviceGone);
        }
        buf.truncate(r.bytes);
        Ok((buf, fds))
    }

    /// True while the daemon's end of the connection is open.
    pub fn alive(&self) -> bool {
        let mut b = [0u8; 1];
        match rustix::net::recv(&self.fd, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT) {
            Ok((0, _)) => false,
            Ok(_) => true,
            Err(rustix::io::Errno::AGAIN) => true,
            Err(_) => false,
        }
    }

    /// Liveness check.
    pub fn ping(&self) -> Result<(), ClientError> {
        self.call(&Request::Ping).map(|_| ())
    }

    /// Device counters.
    pub fn status(&self) -> Result<StatusReport, ClientError> {
        match self.call(&Request::Status)?.0 {
            ReplyBody::Status(s) => Ok(s),
            _ => Err(ClientError::Protocol(control::Error::BadField("status"))),
        }
    }

    /// The array model's report: its parameters, what its parts did, energy and wear
    /// (`model none` without a model).
    pub fn model(&self) -> Result<control::ModelReport, ClientError> {
        match self.call(&Request::Model)?.0 {
            ReplyBody::Model(m) => Ok(m),
            _ => Err(ClientError::Protocol(control::Error::BadField("model"))),
        }
    }

    /// Administrative grant of a permission record (daemon's user or root only).
    pub fn grant(&self, g: Grant) -> Result<(), ClientError> {
        self.call(&Request::Grant(g)).map(|_| ())
    }

    /// Administrative revocation of a channel's coverage of a range; returns once no request in
    /// flight uses the revoked records.
    pub fn revoke(&self, channel: u32, start: u64, len: u64) -> Result<(), ClientError> {
        self.call(&Request::Revoke {
            channel,
            start,
            len,
        })
        .map(|_| ())
    }

    /// Administrative revocation of a channel's records of one file.
    pub fn revoke_file(&self, channel: u32, file: u64) -> Result<(), ClientError> {
        self.call(&Request::RevokeFile { channel, file })
            .map(|_| ())
    }

    /// Asks the daemon to shut down cleanly.
    pub fn shutdown(&self) -> Result<(), ClientError> {
        self.call(&Request::Shutdown).map(|_| ())
    }

    /// Asks for a channel; returns its geometry, memfd and the write end of its kick pipe.
    pub fn open_channel_raw(&self) -> Result<(ChannelInfo, OwnedFd, OwnedFd), ClientError> {
        let (body, mut fds) = self.call(&Request::OpenChannel {
            abi_version: moneta_abi::ABI_VERSION,
        })?;
        let ReplyBody::Channel(info) = body else {
            return Err(ClientError::Protocol(control::Error::BadField("channel")));
        };
        if fds.len() != 2 {
            return Err(ClientError::BadChannel(format!(
                "expected 2 descriptors with the channel, got {}",
                fds.len()
            )));
        }
        let kick = crate::fdnum::hide(fds.pop().expect("two fds"));
        let memfd = crate::fdnum::hide(fds.pop().expect("two fds"));
        let _ = memfd.as_fd();
        Ok((info, memfd, kick))
    }

    /// A file-system call; the reply's payload, or the daemon's errno as
    /// [`ClientError::Refused`].
    pub fn fs(&self, req: FsRequest) -> Result<FsReply, ClientError> {
        match self.call(&Request::Fs(req))?.0 {
            ReplyBody::Fs(r) => Ok(r),
            _ => Err(ClientError::Protocol(control::Error::BadField("fs reply"))),
        }
    }

    /// Opens a file: its handle, rights and attributes.
    pub fn fs_open(
        &self,
        path: &[u8],
        flags: i32,
        mode: u32,
    ) -> Result<(u64, u32, FsStat), ClientError> {
        match self.fs(FsRequest::Open {
            flags: flags as u32,
            mode,
            path: path.to_vec(),
        })? {
            FsReply::Opened {
                handle,
                rights,
                stat,
            } => Ok((handle, rights, stat)),
            _ => Err(ClientError::Protocol(control::Error::BadField(
                "open reply",
            ))),
        }
    }

    /// The pages of the file of `handle`, for `mmap` at the file's own offsets: open for
    /// writing if `write` (see `OP_FS_MAP`).
    pub(crate) fn fs_map(
        &self,
        handle: u64,
        write: bool,
    ) -> Result<(FsStat, std::os::fd::OwnedFd), ClientError> {
        let (body, mut fds) = self.call(&Request::Fs(FsRequest::Map { handle, write }))?;
        match (body, fds.pop()) {
            (ReplyBody::Fs(FsReply::Stat(stat)), Some(pages)) if fds.is_empty() => {
                Ok((stat, pages))
            }
            _ => Err(ClientError::Protocol(control::Error::BadField("map reply"))),
        }
    }

    /// A descriptor of the daemon's durability page, for reading (see `OP_FS_DURABLE`).
    pub(crate) fn fs_durable(&self) -> Result<std::os::fd::OwnedFd, ClientError> {
        let (body, mut fds) = self.call(&Request::Fs(FsRequest::Durable))?;
        match (body, fds.pop()) {
            (ReplyBody::Fs(FsReply::Empty), Some(page)) if fds.is_empty() => Ok(page),
            _ => Err(ClientError::Protocol(control::Error::BadField(
                "durability page reply",
            ))),
        }
    }

    /// Prepares a fork: a bundle of every handle of this connection for a child to claim.
    pub(crate) fn fs_fork(&self) -> Result<crate::fork::Ticket, ClientError> {
        let (body, mut fds) = self.call(&Request::Fs(FsRequest::Fork))?;
        match (body, fds.pop()) {
            (ReplyBody::Fs(FsReply::Forked { bundle, secret, .. }), Some(pipe))
                if fds.is_empty() =>
            {
                use std::os::fd::IntoRawFd;
                Ok(crate::fork::Ticket {
                    bundle,
                    secret,
                    pipe: pipe.into_raw_fd(),
                })
            }
            _ => Err(ClientError::Protocol(control::Error::BadField(
                "fork reply",
            ))),
        }
    }

    /// Claims a fork bundle: pairs of (the forking connection's handle, this one's).
    pub fn fs_inherit(
        &self,
        bundle: u64,
        secret: [u64; 2],
    ) -> Result<Vec<(u64, u64)>, ClientError> {
        let mut out = Vec::new();
        loop {
            match self.fs(FsRequest::Inherit {
                bundle,
                secret,
                from: out.len() as u32,
            })? {
                FsReply::Inherited { total, pairs } => {
                    let empty = pairs.is_empty();
                    out.extend(pairs);
                    if out.len() >= total as usize || empty {
                        return Ok(out);
                    }
                }
                _ => {
                    return Err(ClientError::Protocol(control::Error::BadField(
                        "inherit reply",
                    )))
                }
            }
        }
    }

    /// Closes a handle.
    pub fn fs_close(&self, handle: u64) -> Result<(), ClientError> {
        self.fs(FsRequest::Close { handle }).map(|_| ())
    }

    /// Attributes of a path (following a final symlink when `follow`).
    pub fn fs_stat(&self, path: &[u8], follow: bool) -> Result<FsStat, ClientError> {
        match self.fs(FsRequest::Stat {
            target: Target::Path {
                path: path.to_vec(),
                follow,
            },
        })? {
            FsReply::Stat(s) => Ok(s),
            _ => Err(ClientError::Protocol(control::Error::BadField(
                "stat reply",
            ))),
        }
    }

    /// The soft miss: the extents of `[offset, offset + len)` of an open file, installed in
    /// this connection's channel. Returns the file size and the runs; commands on them without
    /// a file tag work until the records go (see [`Control::fs_lookup_mapped`]).
    pub fn fs_lookup(
        &self,
        handle: u64,
        offset: u64,
        len: u64,
    ) -> Result<(u64, Vec<FsExtent>), ClientError> {
        self.fs_lookup_mapped(handle, offset, len)
            .map(|m| (m.size, m.extents))
    }

    /// [`Control::fs_lookup`] with the file's layout tag, which commands on the runs put in
    /// word 4 so that they fail with `PERMISSION_MISS` rather than reach space that has left
    /// the file since.
    pub fn fs_lookup_mapped(
        &self,
        handle: u64,
        offset: u64,
        len: u64,
    ) -> Result<Mapped, ClientError> {
        mapped(self.fs(FsRequest::Lookup {
            handle,
            offset,
            len,
        })?)
    }

    /// Allocates the holes of `[offset, offset + len)` and grows the file to its end if
    /// needed; the extents are installed in this connection's channel.
    pub fn fs_extend(
        &self,
        handle: u64,
        offset: u64,
        len: u64,
    ) -> Result<(u64, Vec<FsExtent>), ClientError> {
        self.fs_extend_mapped(handle, offset, len)
            .map(|m| (m.size, m.extents))
    }

    /// [`Control::fs_extend`] with the file's layout tag.
    pub fn fs_extend_mapped(
        &self,
        handle: u64,
        offset: u64,
        len: u64,
    ) -> Result<Mapped, ClientError> {
        mapped(self.fs(FsRequest::Extend {
            handle,
            offset,
            len,
        })?)
    }
}

/// The answer to a lookup or an extend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapped {
    /// The file size.
    pub size: u64,
    /// The layout tag the runs' records carry.
    pub file: u64,
    /// Runs from the requested offset on, whole extents, holes included.
    pub extents: Vec<FsExtent>,
}

pub(crate) fn mapped(r: FsReply) -> Result<Mapped, ClientError> {
    match r {
        FsReply::Extents {
            size,
            file,
            extents,
        } => Ok(Mapped {
            size,
            file,
            extents,
        }),
        _ => Err(ClientError::Protocol(control::Error::BadField(
            "extents reply",
        ))),
    }
}
