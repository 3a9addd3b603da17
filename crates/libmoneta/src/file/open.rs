//! Opening files: [`Moneta::open`] and its kin, which ask the daemon for a handle (with room
//! ahead for a file this process grows again at the same path) and make the [`File`] that
//! holds it. Here rather than beside the connection, so that the connection knows nothing of
//! files and a file knows its connection.

use std::path::Path;
use std::sync::atomic::Ordering;

use moneta_abi::fsproto::{FsReply, FsRequest};

use super::File;
use crate::bad_reply;
use crate::connection::{path_bytes, Moneta, OpenOptions};
use crate::position::Position;
use crate::ClientError;

impl Moneta {
    /// Opens `path` with `opts`.
    pub fn open<P: AsRef<Path>>(&self, path: P, opts: &OpenOptions) -> Result<File, ClientError> {
        self.open_flags(path, opts.flags(), opts.mode)
    }

    /// Opens `path` with `open(2)` flags and a creation mode.
    pub fn open_flags<P: AsRef<Path>>(
        &self,
        path: P,
        flags: i32,
        mode: u32,
    ) -> Result<File, ClientError> {
        let pos = Position::new()?;
        let path = path_bytes(&path);
        // A file made for reading and writing may grow from its first write on: where this
        // process grew the file it made at that path before (a journal made in each
        // transaction), the open asks for room at once and the first write needs no extend.
        let grows = flags & libc::O_ACCMODE == libc::O_RDWR && flags & libc::O_CREAT != 0;
        let room = grows && self.inner.live()?.room_at_open() && self.inner.roomy(&path);
        // The path is kept only for a file that may grow (see `File::watch_growth`).
        let kept = (grows && !room).then(|| path.clone());
        let flags_word = flags as u32;
        let req = if room {
            FsRequest::OpenRoom {
                flags: flags_word,
                mode,
                path,
            }
        } else {
            FsRequest::Open {
                flags: flags_word,
                mode,
                path,
            }
        };
        let (reply, epoch) = self.inner.fs_call_at(req)?;
        let (handle, rights, stat, given) = match reply {
            FsReply::Opened {
                handle,
                rights,
                stat,
            } if !room => (handle, rights, stat, None),
            FsReply::OpenedRoom {
                handle,
                rights,
                stat,
                file,
                extents,
            } if room => (handle, rights, stat, Some((file, extents))),
            _ => return Err(bad_reply("open reply")),
        };
        self.inner.open.fetch_add(1, Ordering::AcqRel);
        let f = File::opened(self.clone(), handle, epoch, rights, flags, &stat, pos);
        match given {
            Some((file, extents)) if !extents.is_empty() => f.take_room(crate::control::Mapped {
                size: stat.size,
                file,
                extents,
            }),
            _ => {
                if let (Some(path), 0) = (kept, stat.size) {
                    f.watch_growth(path);
                }
            }
        }
        Ok(f)
    }

    /// Creates (or truncates) `path` for writing, like `std::fs::File::create`.
    pub fn create<P: AsRef<Path>>(&self, path: P) -> Result<File, ClientError> {
        self.open(
            path,
            OpenOptions::new().write(true).create(true).truncate(true),
        )
    }
}
