//! The metadata journal: one redo transaction at a time, of whole-record images.
//!
//! A change to nvfs is a set of byte ranges of the metadata regions (inode, directory-entry and
//! extent records, bitmap words) with their new contents. [`Journal::commit`] writes them to
//! the journal body, then writes the header that makes them valid (its CRC covers the header
//! fields and the body), then writes them in place, inode and extent records in both copies
//! of their tables (the journal holds one image; applying it writes both). Mounting replays the last valid transaction,
//! which is idempotent: a transaction is overwritten only by the next one, after it was
//! applied, so the journal always holds the newest change and replaying it rewrites images
//! that are already there or finishes an interrupted apply.
//!
//! A crash of the daemon at any instant leaves a program-order prefix of its stores in the
//! backing file (the array is a shared mapping; the page cache survives the process), so the
//! header is either absent (the change never happened: the previous transaction's images are
//! already in place) or valid (replay finishes the change). On a persistent array each step is
//! also flushed before the next, and the previous transaction's in-place ranges are flushed
//! before its log is overwritten, so the same holds across a crash of the machine.
//!
//! Header (the first block of the journal region): magic `b"NVFSJRNL"` (u64), sequence (u64),
//! records (u32), body bytes (u32), CRC-32 of header bytes 0..24 and the body (u32). Body (from
//! the second block): per record, array address (u64), length (u32), zero (u32), the bytes,
//! zero padding to a multiple of 8.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{fence, Ordering};

use moneta_device::Media;

use crate::layout::{Geometry, BLOCK};

/// `b"NVFSJRNL"` read as a little-endian u64.
pub const JOURNAL_MAGIC: u64 = u64::from_le_bytes(*b"NVFSJRNL");
const HEADER: usize = 32;

/// Reads `buf.len()` bytes of the array at `addr`.
pub fn read(m: &dyn Media, addr: u64, buf: &mut [u8]) {
    // SAFETY: `buf` is valid for writes of its length; `Media::read` checks the range.
    unsafe { m.read(addr, buf.as_mut_ptr(), buf.len()) }
}

/// Writes `buf` to the array at `addr`.
pub fn write(m: &dyn Media, addr: u64, buf: &[u8]) {
    // SAFETY: `buf` is valid for reads of its length; `Media::write` checks the range.
    unsafe { m.write(addr, buf.as_ptr(), buf.len()) }
}

/// A change being built: array address to new bytes. A later image of the same address
/// replaces an earlier one.
#[derive(Default, Debug)]
pub struct Txn {
    records: BTreeMap<u64, Vec<u8>>,
}

impl Txn {
    /// Records `bytes` as the new contents at `addr`.
    pub fn put(&mut self, addr: u64, bytes: &[u8]) {
        self.records.insert(addr, bytes.to_vec());
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The records, by address.
    pub fn records(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.records.iter().map(|(a, b)| (*a, b.as_slice()))
    }

    /// Bytes of journal body the change takes.
    pub fn body_len(&self) -> u64 {
        self.records
            .values()
            .map(|d| 16 + (d.len() as u64).next_multiple_of(8))
            .sum()
    }

    /// Adds `other`'s records (later images replace earlier ones).
    pub fn append(&mut self, other: Txn) {
        self.records.extend(other.records);
    }

    fn body(&self) -> Vec<u8> {
        let mut body = Vec::new();
        for (addr, data) in &self.records {
            body.extend_from_slice(&addr.to_le_bytes());
            body.extend_from_slice(&(data.len() as u32).to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(data);
            body.resize(body.len().next_multiple_of(8), 0);
        }
        body
    }
}

/// The journal of a mounted image.
pub struct Journal {
    g: Geometry,
    off: u64,
    len: u64,
    lo: u64,
    hi: u64,
    seq: u64,
    durable: bool,
    /// In-place ranges of the last transaction, flushed before its log is overwritten.
    unflushed: Vec<(u64, u64)>,
}

fn header(seq: u64, records: u32, body: &[u8]) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    h[0..8].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..20].copy_from_slice(&records.to_le_bytes());
    h[20..24].copy_from_slice(&(body.len() as u32).to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&h[0..24]);
    crc.update(body);
    h[24..28].copy_from_slice(&crc.finalize().to_le_bytes());
    h
}

/// The last committed transaction found in an image's journal.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Its sequence number (0 if the journal is empty).
    pub seq: u64,
    /// Its records; empty when there is nothing to replay.
    pub records: Vec<(u64, Vec<u8>)>,
    /// Why a header that is present was not valid (a torn commit), for reports.
    pub torn: Option<String>,
}

impl Journal {
    /// The journal of an image with geometry `g`. `durable` flushes each step to the backing
    /// store.
    pub fn new(g: &Geometry, seq: u64, durable: bool) -> Journal {
        Journal {
            g: *g,
            off: g.journal_off,
            len: g.journal_len,
            lo: g.inode_off,
            hi: g.tables_end(),
            seq,
            durable,
            unflushed: Vec::new(),
        }
    }

    /// Reads the last committed transaction of an image.
    pub fn recover(m: &dyn Media, g: &Geometry) -> Recovered {
        let mut h = [0u8; HEADER];
        read(m, g.journal_off, &mut h);
        let magic = u64::from_le_bytes(h[0..8].try_into().expect("8"));
        if magic != JOURNAL_MAGIC {
            return Recovered::default();
        }
        let seq = u64::from_le_bytes(h[8..16].try_into().expect("8"));
        let count = u32::from_le_bytes(h[16..20].try_into().expect("4"));
        let body_len = u32::from_le_bytes(h[20..24].try_into().expect("4")) as u64;
        let torn = |why: &str| Recovered {
            seq,
            records: Vec::new(),
            torn: Some(why.to_string()),
        };
        if body_len > g.journal_len - BLOCK {
            return torn("body longer than the journal");
        }
        let mut body = vec![0u8; body_len as usize];
        read(m, g.journal_off + BLOCK, &mut body);
        if header(seq, count, &body)[24..28] != h[24..28] {
            return torn("checksum mismatch (a commit was interrupted)");
        }
        let mut records = Vec::with_capacity(count as usize);
        let mut at = 0usize;
        for _ in 0..count {
            if at + 16 > body.len() {
                return torn("record header past the body");
            }
            let addr = u64::from_le_bytes(body[at..at + 8].try_into().expect("8"));
            let len = u32::from_le_bytes(body[at + 8..at + 12].try_into().expect("4")) as usize;
            at += 16;
            if at + len > body.len()
                || addr < g.inode_off
                || addr
                    .checked_add(len as u64)
                    .is_none_or(|e| e > g.tables_end())
            {
                return torn("record outside the metadata tables");
            }
            records.push((addr, body[at..at + len].to_vec()));
            at = (at + len).next_multiple_of(8);
        }
        Recovered {
            seq,
            records,
            torn: None,
        }
    }

    /// Writes a recovered transaction in place again.
    pub fn replay(&mut self, m: &dyn Media, r: &Recovered) -> io::Result<()> {
        for (addr, data) in &r.records {
            for at in std::iter::once(*addr).chain(self.g.mirror_of(*addr)) {
                write(m, at, data);
                if self.durable {
                    m.flush(at, data.len() as u64)?;
                }
            }
        }
        Ok(())
    }

    /// Bytes of journal body a transaction may take.
    pub fn capacity(&self) -> u64 {
        self.len - BLOCK
    }

    /// The sequence number of the last transaction.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Commits `txn`: log, validate, apply. On return the change is in place and survives a
    /// crash of the daemon (and, on a durable array, of the machine).
    pub fn commit(&mut self, m: &dyn Media, txn: &Txn) -> io::Result<()> {
        if txn.is_empty() {
            return Ok(());
        }
        for (addr, data) in txn.records() {
            assert!(
                addr >= self.lo && addr + data.len() as u64 <= self.hi,
                "journal record at {addr:#x} outside the metadata tables"
            );
        }
        let body = txn.body();
        if body.len() as u64 > self.len - BLOCK {
            return Err(io::Error::other(format!(
                "metadata transaction of {} bytes exceeds the journal ({} bytes)",
                body.len(),
                self.len - BLOCK
            )));
        }
        if self.durable {
            for (addr, len) in self.unflushed.drain(..) {
                m.flush(addr, len)?;
            }
        }
        self.unflushed.clear();
        write(m, self.off + BLOCK, &body);
        if self.durable {
            m.flush(self.off + BLOCK, body.len() as u64)?;
        }
        // The header must not reach the array before the body it validates.
        fence(Ordering::SeqCst);
        self.seq += 1;
        let h = header(self.seq, txn.records.len() as u32, &body);
        write(m, self.off, &h);
        if self.durable {
            m.flush(self.off, HEADER as u64)?;
        }
        fence(Ordering::SeqCst);
        for (addr, data) in txn.records() {
            write(m, addr, data);
            match self.unflushed.last_mut() {
                Some((a, l)) if *a + *l >= addr => *l = (*l).max(addr + data.len() as u64 - *a),
                _ => self.unflushed.push((addr, data.len() as u64)),
            }
        }
        // The second copies, after the first: a crash in between leaves the journal to redo
        // both.
        for (addr, data) in txn.records() {
            if let Some(at) = self.g.mirror_of(addr) {
                write(m, at, data);
                self.unflushed.push((at, data.len() as u64));
            }
        }
        Ok(())
    }

    /// Flushes the in-place ranges of the last transaction (fsync of metadata).
    pub fn sync(&mut self, m: &dyn Media) -> io::Result<()> {
        if self.durable {
            for (addr, len) in self.unflushed.drain(..) {
                m.flush(addr, len)?;
            }
        }
        Ok(())
    }
}
