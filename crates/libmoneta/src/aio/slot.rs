//! Zero-copy writes: a DMA slice lent to the caller to fill in place, then submitted.

use super::*;

impl File {
    /// A DMA slice to fill in place for a zero-copy write of `len` bytes (at most one slice);
    /// [`WriteSlot::submit`] sends it. `EAGAIN` when [`MAX_PINNED_TAGS`] tags are held this way.
    pub fn write_slot(&self, len: usize) -> Result<WriteSlot<'_>, ClientError> {
        self.h()?;
        if len > self.channel().slice_size() {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::EINVAL,
            )));
        }
        self.check_access(true)?;
        let ch = self.channel();
        take_pinned(ch)?;
        Ok(WriteSlot {
            file: self,
            ch,
            gen: fork::generation(),
            _pinned: PhantomData,
            tag: Some(ch.tag()),
            len,
        })
    }
}

/// A DMA slice being filled for a zero-copy write.
pub struct WriteSlot<'f> {
    file: &'f File,
    ch: &'f Channel,
    gen: u64,
    /// Counts against [`MAX_PINNED_TAGS`] until submitted or dropped.
    _pinned: PhantomData<()>,
    tag: Option<Tag>,
    len: usize,
}

impl<'f> WriteSlot<'f> {
    /// The slice to fill.
    pub fn buf(&mut self) -> &mut [u8] {
        let tag = self.tag.expect("slot holds its tag until submitted");
        self.ch.dma_slice_mut(tag, self.len)
    }

    /// Sends the slice's bytes to `off` (the end on a file opened for appending). When the
    /// range maps to one command, the device takes the bytes straight from the slice.
    pub fn submit(mut self, off: u64) -> Result<Pending<'f>, ClientError> {
        let f = self.file;
        let tag = self.tag.take().expect("slot holds its tag until submitted");
        let len = self.len;
        let ch = self.ch;
        if self.gen != fork::generation() {
            return Err(ClientError::Io(std::io::Error::from_raw_os_error(
                libc::ECANCELED,
            )));
        }
        give_pinned(ch);
        let mode = f.policy().mode(len);
        let r = (|| {
            let off = if f.appends() {
                f.append_at(len as u64)?
            } else {
                f.check_range(off, len as u64, true)?;
                off
            };
            f.settle_reporting()?;
            let prep = f.prepare_write(off, len, &mut 0)?;
            Ok::<_, ClientError>((off, prep))
        })();
        let (off, prep) = match r {
            Ok(x) => x,
            Err(e) => {
                ch.release(tag);
                return Err(e);
            }
        };
        if prep.segs.len() == 1 {
            let seg = prep.segs[0];
            ch.submit(
                tag,
                &command(Opcode::Write, mode, seg.dev, seg.len as u64, seg.file),
            );
            let mut sp = spare();
            let mut inflight = std::mem::take(&mut sp.inflight);
            inflight.push_back((tag, 0));
            let mut st = State::new(f, ch, self.gen, true, off, Buf::Owned(Vec::new()), mode);
            st.prep = prep;
            st.next = 1;
            st.inflight = inflight;
            return Ok(Pending::new(st, sp.slot.take()));
        }
        // Spans extents: the bytes leave the slice for an ordinary request.
        let data = ch.dma_slice(tag, len).to_vec();
        ch.release(tag);
        f.submit(true, Some(off), Buf::Owned(data), mode, &mut 0)
    }
}

impl std::fmt::Debug for WriteSlot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSlot")
            .field("tag", &self.tag)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for WriteSlot<'_> {
    fn drop(&mut self) {
        if let Some(t) = self.tag.take() {
            if self.gen == fork::generation() {
                self.ch.release(t);
                give_pinned(self.ch);
            }
        }
    }
}
