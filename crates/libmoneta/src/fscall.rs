//! File-system calls through the channel (`OP_FS`, docs/abi.md §4.1): the request message the
//! control socket would carry goes into a tag's slice of the DMA buffer, and the device's
//! poller answers it in the pass that takes it, with no daemon thread to wake. A call the
//! device cannot answer at once (a busy lock, a call that would wait for the disk or free
//! space) comes back `Refer`, and is then sent on the control socket, which answers it the
//! same way.

use std::sync::atomic::{AtomicBool, Ordering};

use moneta_abi::control::{decode_reply, encode_request, ReplyBody, Request};
use moneta_abi::fsproto::{FsReply, FsRequest};
use moneta_abi::{Command, Completion, Opcode, Status};

use crate::channel::Channel;
use crate::ClientError;

/// Set once a daemon did not know `OP_FS` (it answers `Malformed`): this process then sends
/// its calls on the socket only.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// `MONETA_FS_CHANNEL=off` keeps every file-system call on the control socket (to compare
/// the two paths); `on`, the default, tries the channel first.
fn enabled() -> bool {
    static WARNED: std::sync::Once = std::sync::Once::new();
    static SETTING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SETTING.get_or_init(|| {
        !crate::env_setting(
            "MONETA_FS_CHANNEL",
            |v| match v {
                "on" => Some(false),
                "off" => Some(true),
                _ => None,
            },
            "on or off",
            &WARNED,
        )
    }) && !UNSUPPORTED.load(Ordering::Relaxed)
}

impl Channel {
    /// A file-system call of this channel's connection: through the channel when the device
    /// may answer it there ([`FsRequest::on_channel`]), on the control socket otherwise and
    /// whenever the device refers it. The reply's payload, or the daemon's errno as
    /// [`ClientError::Refused`].
    pub fn fs(&self, req: FsRequest) -> Result<FsReply, ClientError> {
        if req.on_channel() && enabled() {
            if let Some(r) = self.fs_on_channel(&req) {
                return r;
            }
        }
        self.control().fs(req)
    }

    /// `OP_FS`: `None` when the call must go to the socket (referred, too long for a slice,
    /// or the channel is gone: the socket then says so).
    fn fs_on_channel(&self, req: &FsRequest) -> Option<Result<FsReply, ClientError>> {
        let op = req.op();
        let msg = encode_request(0, &Request::Fs(req.clone()));
        if msg.len() > self.slice_size() {
            return None;
        }
        let tag = match self.try_tag() {
            Some(t) => t,
            None => self.tag(),
        };
        self.write_dma(tag, 0, &msg);
        let cmd = Command::new(Opcode::Fs, Completion::Dma, 0, msg.len() as u64, 0);
        self.submit(tag, &cmd);
        let done = self.wait(tag, Completion::Dma);
        let answer = match done {
            Ok(c) if c.status == Status::Ok => {
                let len = c.bytes as usize;
                if len == 0 || len > self.slice_size() {
                    Some(Err(ClientError::Status(Status::Malformed)))
                } else {
                    let mut buf = vec![0u8; len];
                    self.read_dma(tag, 0, &mut buf);
                    Some(decode(&buf, op))
                }
            }
            Ok(c) if c.status == Status::Malformed => {
                // A daemon from before `OP_FS`.
                UNSUPPORTED.store(true, Ordering::Relaxed);
                None
            }
            _ => None,
        };
        self.release(tag);
        answer
    }
}

fn decode(bytes: &[u8], op: u16) -> Result<FsReply, ClientError> {
    let reply = decode_reply(bytes, op).map_err(ClientError::Protocol)?;
    match reply.result {
        Ok(ReplyBody::Fs(r)) => Ok(r),
        Ok(_) => Err(ClientError::Protocol(moneta_abi::control::Error::BadField(
            "fs reply",
        ))),
        Err(f) => Err(ClientError::Refused {
            errno: f.errno,
            message: f.message,
        }),
    }
}
