//! Data integrity: a CRC-32C of every block of the data region, kept in a table on the array,
//! updated by each write the engine copies into the array and checked by each read it copies
//! out, so that a flipped bit in a file reaches its reader as `Status::MediaError`, never as
//! data.
//!
//! The table and the region it covers are the file system's (nvfs records them in its
//! superblock); the daemon tells the engine where they are ([`IntegrityConfig`]). Checksums
//! are little-endian `u32`s, one per block, block `i` of the data region at `sums_off + 4 i`.
//! A write of whole blocks computes them from a copy of the data it stores (what is checked is
//! exactly what went to the array, whatever the client does to its buffer meanwhile); a write
//! of part of a block first checks the block's old contents, so a write never blesses a block
//! that was already damaged: such a write is refused and changes nothing (rewriting the whole
//! block clears the damage). The file system's own stores into data chunks go through
//! [`IntegrityConfig::zero`].

use std::io;

use crate::media::Media;

/// Largest checksummed block: the engine's scratch buffer holds one.
pub const MAX_BLOCK: u64 = 64 << 10;

/// Where the checksums are and what they cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IntegrityConfig {
    /// First array byte covered: the data region.
    pub data_off: u64,
    /// Bytes covered, a multiple of `block`.
    pub data_len: u64,
    /// Array address of the checksum table (one `u32` per block).
    pub sums_off: u64,
    /// Bytes per checksummed block: a power of two from 512 to [`MAX_BLOCK`].
    pub block: u64,
}

/// A block whose contents disagree with its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the data block at array address {0:#x} does not match its checksum")]
pub struct Corrupt(pub u64);

/// The checksum of a block's bytes.
pub fn block_sum(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

impl IntegrityConfig {
    /// Bytes of the checksum table.
    pub fn sums_len(&self) -> u64 {
        self.data_len / self.block * 4
    }

    /// Checks the settings against an array of `array_size` bytes: block size, both regions
    /// inside the array, and apart.
    pub fn validate(&self, array_size: u64) -> Result<(), String> {
        if !self.block.is_power_of_two() || !(512..=MAX_BLOCK).contains(&self.block) {
            return Err(format!(
                "data checksum block {} is not a power of two from 512 to {MAX_BLOCK}",
                self.block
            ));
        }
        let end = |off: u64, len: u64| off.checked_add(len).filter(|e| *e <= array_size);
        let (Some(data_end), Some(sums_end)) = (
            end(self.data_off, self.data_len),
            end(self.sums_off, self.sums_len()),
        ) else {
            return Err("the data checksum regions lie outside the array".into());
        };
        if !self.data_off.is_multiple_of(self.block) || !self.data_len.is_multiple_of(self.block) {
            return Err("the checksummed data region is not block-aligned".into());
        }
        if self.sums_off < data_end && self.data_off < sums_end {
            return Err("the checksum table overlaps the data it covers".into());
        }
        Ok(())
    }

    /// The blocks of the data region that `[addr, addr + len)` touches, as (first, end).
    fn blocks(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        let lo = addr.max(self.data_off);
        let hi = (addr + len).min(self.data_off + self.data_len);
        (lo < hi).then(|| {
            (
                (lo - self.data_off) / self.block,
                (hi - self.data_off).div_ceil(self.block),
            )
        })
    }

    fn block_addr(&self, b: u64) -> u64 {
        self.data_off + b * self.block
    }

    fn sum_addr(&self, b: u64) -> u64 {
        self.sums_off + 4 * b
    }

    /// The stored checksum of block `b`.
    fn stored<M: Media + ?Sized>(&self, m: &M, b: u64) -> u32 {
        let mut w = [0u8; 4];
        // SAFETY: `w` is valid for 4 bytes; the table lies inside the array (validated).
        unsafe { m.read(self.sum_addr(b), w.as_mut_ptr(), 4) };
        u32::from_le_bytes(w)
    }

    fn store<M: Media + ?Sized>(&self, m: &M, b: u64, sum: u32) {
        // SAFETY: the source is 4 bytes; the table lies inside the array (validated).
        unsafe { m.write(self.sum_addr(b), sum.to_le_bytes().as_ptr(), 4) };
    }

    /// Whether block `b` matches its checksum; `buf` (one block) receives its bytes.
    fn check_block<M: Media + ?Sized>(&self, m: &M, b: u64, buf: &mut [u8]) -> bool {
        // SAFETY: `buf` holds one block; the block lies in the data region, inside the array.
        unsafe { m.read(self.block_addr(b), buf.as_mut_ptr(), buf.len()) };
        block_sum(buf) == self.stored(m, b)
    }

    /// The blocks in `[addr, addr + len)` whose contents disagree with their checksums (what
    /// `fsck --data` reports), by array address.
    pub fn verify<M: Media + ?Sized>(&self, m: &M, addr: u64, len: u64) -> Vec<u64> {
        let mut buf = vec![0u8; self.block as usize];
        let mut bad = Vec::new();
        if let Some((first, end)) = self.blocks(addr, len) {
            for b in first..end {
                if !self.check_block(m, b, &mut buf) {
                    bad.push(self.block_addr(b));
                }
            }
        }
        bad
    }

    /// Zeroes `[addr, addr + len)` (`Media::zero`) and keeps the checksums of the blocks it
    /// touches true: whole blocks get the checksum of zeros; a block zeroed in part is
    /// checksummed again from the array if it was sound before, and otherwise keeps its old
    /// checksum, so damage that was there stays reported.
    pub fn zero<M: Media + ?Sized>(&self, m: &M, addr: u64, len: u64) -> io::Result<()> {
        let Some((first, end)) = self.blocks(addr, len) else {
            return m.zero(addr, len);
        };
        let mut buf = vec![0u8; self.block as usize];
        let partial = |b: u64| {
            let (s, e) = (self.block_addr(b), self.block_addr(b) + self.block);
            addr > s || addr + len < e
        };
        // Which partly zeroed blocks were sound, looked at before they change.
        let edges: Vec<(u64, bool)> = [first, end - 1]
            .into_iter()
            .filter(|b| partial(*b))
            .map(|b| (b, self.check_block(m, b, &mut buf)))
            .collect();
        m.zero(addr, len)?;
        let zero_sum = block_sum(&vec![0u8; self.block as usize]);
        for b in first..end {
            match edges.iter().find(|(e, _)| *e == b) {
                None => self.store(m, b, zero_sum),
                Some((_, true)) => {
                    // SAFETY: `buf` holds one block, inside the data region.
                    unsafe { m.read(self.block_addr(b), buf.as_mut_ptr(), buf.len()) };
                    self.store(m, b, block_sum(&buf));
                }
                Some((_, false)) => {}
            }
        }
        Ok(())
    }

    /// The part of the checksum table that covers `[addr, addr + len)`, as (address, bytes).
    pub fn sums_range(&self, addr: u64, len: u64) -> Option<(u64, u64)> {
        self.blocks(addr, len)
            .map(|(first, end)| (self.sum_addr(first), (end - first) * 4))
    }

    /// Makes the checksums of `[addr, addr + len)` durable (`Media::flush` of their table).
    pub fn flush_sums<M: Media + ?Sized>(&self, m: &M, addr: u64, len: u64) -> io::Result<()> {
        match self.sums_range(addr, len) {
            Some((at, bytes)) => m.flush(at, bytes),
            None => Ok(()),
        }
    }
}

/// The engine's integrity unit: checks reads and checksums writes as the engine copies them,
/// with a scratch block of its own. Without a configuration it copies straight through.
pub struct Integrity {
    config: Option<IntegrityConfig>,
    buf: Vec<u8>,
}

impl Integrity {
    /// The unit for `config` on an array of `array_size` bytes; `None` checks nothing.
    pub fn new(config: Option<IntegrityConfig>, array_size: u64) -> Result<Integrity, String> {
        if let Some(c) = &config {
            c.validate(array_size)?;
        }
        Ok(Integrity {
            buf: vec![0u8; config.map_or(0, |c| c.block as usize)],
            config,
        })
    }

    /// The configuration, if checksums are kept.
    pub fn config(&self) -> Option<&IntegrityConfig> {
        self.config.as_ref()
    }

    /// Copies `len` bytes at array address `addr` to `dst` after checking every block they
    /// touch; a block that fails its check fails the read, and `dst` holds no part of it.
    ///
    /// # Safety
    /// As [`Media::read`]: `dst` valid for writes of `len` bytes, the range inside the array.
    pub unsafe fn read<M: Media + ?Sized>(
        &mut self,
        m: &M,
        addr: u64,
        dst: *mut u8,
        len: usize,
    ) -> Result<(), Corrupt> {
        let Some(c) = self.config else {
            // SAFETY: the caller's contract.
            unsafe { m.read(addr, dst, len) };
            return Ok(());
        };
        let end = addr + len as u64;
        let mut at = addr;
        while at < end {
            let Some((b, _)) = c.blocks(at, end - at) else {
                // Outside the data region: nothing to check.
                // SAFETY: `dst + (at - addr)` is inside `dst`'s `len` bytes.
                unsafe { m.read(at, dst.add((at - addr) as usize), (end - at) as usize) };
                break;
            };
            let start = c.block_addr(b);
            if at < start {
                // SAFETY: as above, for the part before the data region.
                unsafe { m.read(at, dst.add((at - addr) as usize), (start - at) as usize) };
                at = start;
                continue;
            }
            if !c.check_block(m, b, &mut self.buf) {
                return Err(Corrupt(start));
            }
            let n = (start + c.block).min(end) - at;
            // SAFETY: `buf` holds the block, `at - start + n <= block`; the destination is
            // inside `dst`'s `len` bytes; the two do not overlap (`buf` is ours).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.buf.as_ptr().add((at - start) as usize),
                    dst.add((at - addr) as usize),
                    n as usize,
                )
            };
            at += n;
        }
        Ok(())
    }

    /// Copies `len` bytes from `src` to array address `addr` and updates the checksums of the
    /// blocks they touch. A block written in part is checked first; if it (or the other end's
    /// partial block) fails, nothing is written.
    ///
    /// # Safety
    /// As [`Media::write`]: `src` valid for reads of `len` bytes, the range inside the array.
    pub unsafe fn write<M: Media + ?Sized>(
        &mut self,
        m: &M,
        addr: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), Corrupt> {
        let Some(c) = self.config else {
            // SAFETY: the caller's contract.
            unsafe { m.write(addr, src, len) };
            return Ok(());
        };
        let end = addr + len as u64;
        let Some((first, last_end)) = c.blocks(addr, len as u64) else {
            // SAFETY: the caller's contract.
            unsafe { m.write(addr, src, len) };
            return Ok(());
        };
        let partial = |b: u64| addr > c.block_addr(b) || end < c.block_addr(b) + c.block;
        for b in [first, last_end - 1] {
            if partial(b) && !c.check_block(m, b, &mut self.buf) {
                return Err(Corrupt(c.block_addr(b)));
            }
        }
        let data_lo = c.block_addr(first).max(addr);
        if addr < data_lo {
            // SAFETY: the part before the data region, inside both ranges.
            unsafe { m.write(addr, src, (data_lo - addr) as usize) };
        }
        for b in first..last_end {
            let start = c.block_addr(b);
            let lo = start.max(addr);
            let hi = (start + c.block).min(end);
            if partial(b) {
                // SAFETY: `buf` holds one block of the array's.
                unsafe { m.read(start, self.buf.as_mut_ptr(), self.buf.len()) };
            }
            // SAFETY: `[lo, hi)` lies inside both the block and `src`'s `len` bytes; `buf` is
            // ours, so a client changing its buffer meanwhile changes only what is stored,
            // never the agreement between the stored bytes and their checksum.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add((lo - addr) as usize),
                    self.buf.as_mut_ptr().add((lo - start) as usize),
                    (hi - lo) as usize,
                );
                m.write(start, self.buf.as_ptr(), self.buf.len());
            }
            c.store(m, b, block_sum(&self.buf));
        }
        let data_hi = c.block_addr(last_end);
        if end > data_hi {
            // SAFETY: the part after the data region, inside both ranges.
            unsafe {
                m.write(
                    data_hi,
                    src.add((data_hi - addr) as usize),
                    (end - data_hi) as usize,
                )
            };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::MappedArray;

    const BLOCK: u64 = 4096;

    fn setup() -> (MappedArray, IntegrityConfig) {
        let m = MappedArray::volatile(1 << 20).unwrap();
        let c = IntegrityConfig {
            data_off: 64 << 10,
            data_len: 512 << 10,
            sums_off: 4096,
            block: BLOCK,
        };
        c.validate(m.size()).unwrap();
        c.zero(&m, c.data_off, c.data_len).unwrap();
        (m, c)
    }

    fn flip(m: &MappedArray, addr: u64) {
        let mut b = [0u8];
        // SAFETY: one byte inside the array, read then written.
        unsafe {
            m.read(addr, b.as_mut_ptr(), 1);
            b[0] ^= 0x10;
            m.write(addr, b.as_ptr(), 1);
        }
    }

    #[test]
    fn reads_of_damaged_blocks_fail_and_writes_keep_sums() {
        let (m, c) = setup();
        let mut unit = Integrity::new(Some(c), m.size()).unwrap();
        let data: Vec<u8> = (0..3 * BLOCK as usize + 100)
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        let at = c.data_off + 1000;
        // SAFETY: `data` is valid for its length; the range is inside the array.
        unsafe { unit.write(&m, at, data.as_ptr(), data.len()) }.unwrap();
        assert!(c.verify(&m, c.data_off, c.data_len).is_empty());
        let mut back = vec![0u8; data.len()];
        // SAFETY: `back` is valid for its length; the range is inside the array.
        unsafe { unit.read(&m, at, back.as_mut_ptr(), back.len()) }.unwrap();
        assert_eq!(back, data);
        // One flipped bit: the read of any range touching the block fails, others pass.
        flip(&m, c.data_off + 2 * BLOCK + 7);
        assert_eq!(
            c.verify(&m, c.data_off, c.data_len),
            vec![c.data_off + 2 * BLOCK]
        );
        // SAFETY: as above.
        let r = unsafe { unit.read(&m, at, back.as_mut_ptr(), back.len()) };
        assert_eq!(r, Err(Corrupt(c.data_off + 2 * BLOCK)));
        // SAFETY: as above, one block before the damaged one.
        unsafe { unit.read(&m, c.data_off + BLOCK, back.as_mut_ptr(), 10) }.unwrap();
        // A partial write into the damaged block is refused and changes nothing.
        let before = c.verify(&m, c.data_off, c.data_len);
        // SAFETY: as above.
        let w = unsafe { unit.write(&m, c.data_off + 2 * BLOCK + 10, data.as_ptr(), 5) };
        assert_eq!(w, Err(Corrupt(c.data_off + 2 * BLOCK)));
        assert_eq!(c.verify(&m, c.data_off, c.data_len), before);
        // A whole-block write replaces it.
        // SAFETY: as above.
        unsafe { unit.write(&m, c.data_off + 2 * BLOCK, data.as_ptr(), BLOCK as usize) }.unwrap();
        assert!(c.verify(&m, c.data_off, c.data_len).is_empty());
        // Zeroing part of a sound block re-checksums it; of a damaged one keeps it damaged.
        c.zero(&m, c.data_off + 100, 50).unwrap();
        assert!(c.verify(&m, c.data_off, c.data_len).is_empty());
        flip(&m, c.data_off + 5);
        c.zero(&m, c.data_off + 100, BLOCK).unwrap();
        assert_eq!(c.verify(&m, c.data_off, c.data_len), vec![c.data_off]);
        // A write from before the region into the damaged block is refused too; one wholly
        // outside the region passes straight through.
        // SAFETY: as above, across the start of the data region.
        unsafe { unit.write(&m, c.data_off - 10, data.as_ptr(), 20) }.unwrap_err();
        // SAFETY: as above, below the data region.
        unsafe { unit.write(&m, 100, data.as_ptr(), 20) }.unwrap();
    }

    #[test]
    fn bad_settings_are_refused() {
        let ok = IntegrityConfig {
            data_off: 8192,
            data_len: 8192,
            sums_off: 4096,
            block: 4096,
        };
        ok.validate(1 << 20).unwrap();
        assert!(ok.validate(12288).is_err(), "outside the array");
        let odd = IntegrityConfig { block: 3000, ..ok };
        assert!(odd.validate(1 << 20).is_err());
        let overlap = IntegrityConfig {
            sums_off: 8192,
            ..ok
        };
        assert!(overlap.validate(1 << 20).is_err());
        assert!(Integrity::new(Some(odd), 1 << 20).is_err());
    }
}
