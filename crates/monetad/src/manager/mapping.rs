//! Memory drives' calls (`OP_FS_MAP`, docs/abi.md §2.10): a file's own pages handed out,
//! holes filled and growth shown in them (`segments.rs` keeps them), and the durability page
//! (`OP_FS_DURABLE`, `durable.rs`) that lets a client's `fsync` of a mapped file skip the call.

use super::*;

impl Manager {
    pub(super) fn segments(&self) -> MutexGuard<'_, Segments> {
        self.segments.lock().expect("segments lock")
    }

    /// After `ino` grew to `size` (an extend or a truncation), with the file-system lock held:
    /// if it is mapped, its holes get space (a mapped file has none: a store into its pages is
    /// a store into the array) and its pages show the new space. If that fails, its pages are
    /// retired, so that mappings and the array never disagree.
    pub(super) fn show_grown(&self, fs: &mut Fs, ino: u64, size: u64) -> Result<(), Failure> {
        let mut segs = self.segments();
        if !segs.has(ino) {
            return Ok(());
        }
        drop(segs);
        let filled = fs.extend(ino, 0, size, 1).map_err(failure);
        segs = self.segments();
        let shown =
            filled.and_then(|_| segs.show(ino, &fs.allocated(ino), size, fs.generation(ino)));
        if let Err(f) = shown {
            segs.retire(ino)?;
            return Err(f);
        }
        Ok(())
    }

    /// Answers [`FsRequest::Durable`]: a descriptor of the durability page, for reading.
    pub fn durable_page(&self) -> Result<OwnedFd, Failure> {
        let Some(page) = &self.durable else {
            return Err(fail(
                errno::EOPNOTSUPP,
                "this daemon has no durability page: only the host durability level has one",
            ));
        };
        page.give().map_err(|e| {
            fail(
                errno::EMFILE,
                &format!("cannot hand out the durability page: {e}"),
            )
        })
    }

    /// Answers [`FsRequest::Map`]: the attributes of the file of `handle` and a descriptor of
    /// its pages (see `segments.rs`), open for writing if `write`.
    pub fn map(
        &self,
        s: &mut Session,
        channel: Option<u32>,
        handle: u64,
        write: bool,
    ) -> Result<(FsReply, OwnedFd), Failure> {
        self.publish(s, channel);
        self.settle_releases();
        let h = Self::handle(s, handle)?;
        if !h.read {
            return Err(fail(
                libc::EACCES,
                "a mapping needs a handle open for reading",
            ));
        }
        if write && !h.write {
            return Err(fail(errno::EBADF, "the handle is not open for writing"));
        }
        // Stores and loads through the pages do not wait for posted writes: a sole lease
        // ends first, once what its holder rang has landed.
        self.recall_sole(h.ino);
        let mut fs = self.fs();
        // A mapping's pages follow the size through calls only: a size grant ends first, and
        // its room past the end goes back now rather than at the last close, under the
        // mapping's pages.
        fs.end_grant_and_room(h.ino).map_err(failure)?;
        let st = fs.stat_ino(h.ino);
        if st.mode & libc::S_IFMT != libc::S_IFREG {
            return Err(fail(errno::EINVAL, "only a regular file can be mapped"));
        }
        let mut segs = self.segments();
        segs.supported(fs.geometry().chunk_size)?;
        if st.size > 0 && write {
            // Every byte a writable mapping reaches is in the array: holes get space (zeroed).
            // A read-only one sees a hole's zeros in pages of its own, which nobody can store
            // into (a writer's mapping or write fills the hole first).
            drop(segs);
            fs.extend(h.ino, 0, st.size, 1).map_err(failure)?;
            segs = self.segments();
        }
        // Root and the daemon's own user are not held to a share.
        let uid = s.cred.uid;
        let owner = (uid != 0 && uid != rustix::process::geteuid().as_raw()).then_some(uid);
        let generation = fs.generation(h.ino);
        let fd = segs.give(
            h.ino,
            &fs.allocated(h.ino),
            st.size,
            write,
            owner,
            generation,
        )?;
        Ok((FsReply::Stat(wire_stat(&fs.stat_ino(h.ino))), fd))
    }
}
