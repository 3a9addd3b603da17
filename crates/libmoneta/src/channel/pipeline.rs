//! Transfers of a contiguous range of the array longer than one DMA slice, with several
//! slice-sized commands in flight on tags of the channel (as a file's large requests are,
//! Moneta-D §4.3): the device works on one piece while the client copies the next.

use moneta_abi::{Completion, Opcode, Status};

use super::{command, Channel, Tag};
use crate::ClientError;

/// Most commands one transfer keeps in flight.
const MAX_INFLIGHT: usize = 16;

enum Io<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8]),
}

impl Channel {
    /// Reads `buf.len()` bytes at array address `addr`, up to 16 slice-sized commands at
    /// once. On failure, the first failing piece's status (or error) is returned, and which
    /// bytes arrived is unspecified.
    pub fn read_pipelined(
        &self,
        addr: u64,
        buf: &mut [u8],
        mode: Completion,
    ) -> Result<(), ClientError> {
        if buf.len() <= self.slice_size() {
            return self.read(addr, buf, mode);
        }
        self.pipeline(addr, Io::Read(buf), mode)
    }

    /// Writes `data` at array address `addr`, up to 16 slice-sized commands at once. On
    /// failure, the first failing piece's status (or error) is returned, and which bytes were
    /// written is unspecified.
    pub fn write_pipelined(
        &self,
        addr: u64,
        data: &[u8],
        mode: Completion,
    ) -> Result<(), ClientError> {
        if data.len() <= self.slice_size() {
            return self.write(addr, data, mode);
        }
        self.pipeline(addr, Io::Write(data), mode)
    }

    fn pipeline(&self, addr: u64, mut io: Io<'_>, mode: Completion) -> Result<(), ClientError> {
        let slice = self.slice_size();
        let len = match &io {
            Io::Read(b) => b.len(),
            Io::Write(d) => d.len(),
        };
        let pieces = len.div_ceil(slice);
        // Tags in flight, oldest first: (tag, piece).
        let mut ring: [(Tag, usize); MAX_INFLIGHT] = [(Tag(0), 0); MAX_INFLIGHT];
        let (mut head, mut inflight, mut held) = (0usize, 0usize, 0usize);
        // Tags taken and free again (no allocation on the data path).
        let mut spare: [Tag; MAX_INFLIGHT] = [Tag(0); MAX_INFLIGHT];
        let mut nspare = 0usize;
        let mut fail: Option<ClientError> = None;
        let finish =
            |tag: Tag, i: usize, io: &mut Io<'_>, fail: &mut Option<ClientError>| match self
                .wait(tag, mode)
            {
                Ok(c) if c.status == Status::Ok => {
                    if let Io::Read(buf) = io {
                        let at = i * slice;
                        let end = (at + slice).min(buf.len());
                        self.read_dma(tag, 0, &mut buf[at..end]);
                    }
                }
                Ok(c) => {
                    fail.get_or_insert(ClientError::Status(c.status));
                }
                Err(e) => {
                    fail.get_or_insert(e);
                }
            };
        for i in 0..pieces {
            if fail.is_some() {
                break;
            }
            let tag = if nspare > 0 {
                nspare -= 1;
                spare[nspare]
            } else if held == 0 {
                held += 1;
                self.tag()
            } else if let Some(t) = (held < MAX_INFLIGHT).then(|| self.try_tag()).flatten() {
                held += 1;
                t
            } else {
                let (t, j) = ring[head];
                head = (head + 1) % MAX_INFLIGHT;
                inflight -= 1;
                finish(t, j, &mut io, &mut fail);
                if fail.is_some() {
                    spare[nspare] = t;
                    nspare += 1;
                    break;
                }
                t
            };
            let at = i * slice;
            let n = slice.min(len - at);
            let opcode = match &io {
                Io::Read(_) => Opcode::Read,
                Io::Write(data) => {
                    self.write_dma(tag, 0, &data[at..at + n]);
                    Opcode::Write
                }
            };
            // Wrapping: an address past the end is the device's to refuse (OutOfRange).
            let cmd = command(opcode, mode, addr.wrapping_add(at as u64), n as u64, 0);
            self.submit(tag, &cmd);
            ring[(head + inflight) % MAX_INFLIGHT] = (tag, i);
            inflight += 1;
        }
        while inflight > 0 {
            let (t, j) = ring[head];
            head = (head + 1) % MAX_INFLIGHT;
            inflight -= 1;
            finish(t, j, &mut io, &mut fail);
            spare[nspare] = t;
            nspare += 1;
        }
        for &t in &spare[..nspare] {
            self.release(t);
        }
        match fail {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use moneta_abi::control::{Grant, RIGHT_READ, RIGHT_WRITE};
    use moneta_abi::Completion;

    use crate::Channel;

    #[test]
    fn long_transfers_round_trip_and_stop_at_a_missing_record() {
        let d = monetad::testing::Daemon::start_raw();
        let ch = Channel::open(&d.socket).unwrap();
        ch.control()
            .grant(Grant {
                channel: ch.id(),
                rights: RIGHT_READ | RIGHT_WRITE,
                start: 0,
                len: 4 << 20,
                file: 0,
            })
            .unwrap();
        let data: Vec<u8> = (0..(3 << 20) + 12_345)
            .map(|i: usize| (i.wrapping_mul(31) >> 3) as u8)
            .collect();
        ch.write_pipelined(4096, &data, Completion::Dma).unwrap();
        let mut back = vec![0u8; data.len()];
        ch.read_pipelined(4096, &mut back, Completion::Dma).unwrap();
        assert!(back == data, "the bytes read back differ");
        // Single-tag reads agree.
        let mut one = vec![0u8; 100_000];
        ch.read(4096 + 1_000_000, &mut one, Completion::Dma)
            .unwrap();
        assert!(one[..] == data[1_000_000..1_100_000]);
        // A range running past the granted records fails with the miss, and every tag comes
        // back.
        let mut big = vec![0u8; 2 << 20];
        let e = ch
            .read_pipelined(3 << 20, &mut big, Completion::Dma)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            crate::ClientError::Status(moneta_abi::Status::PermissionMiss).to_string()
        );
        ch.write_pipelined(0, &data[..1 << 20], Completion::Dma)
            .unwrap();
    }
}
