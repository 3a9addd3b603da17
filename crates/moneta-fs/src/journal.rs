//! The metadata journal: a circular log of redo transactions of whole-record images.
//!
//! A change to nvfs is a set of byte ranges of the metadata regions (inode, directory-entry and
//! extent records, bitmap words) with their new contents. [`Journal::commit`] appends them to
//! the log as one transaction whose header carries its sequence number and a CRC-32C of header
//! and body, then writes them in place, inode and extent records in both copies of their
//! tables (the log holds one image; applying it writes both). Mounting replays every valid
//! transaction from the log's tail in sequence order, which is idempotent: a transaction's
//! log bytes are overwritten only after a checkpoint, and a checkpoint comes after every
//! transaction before it is in place.
//!
//! When the images are written in place depends on the [`Durability`] level:
//!
//! - `Device`: at once, after the transaction's log bytes. A crash of the daemon at any
//!   instant leaves a program-order prefix of its stores in the backing file or memfd (the
//!   array is a shared mapping; the page cache survives the process), so a transaction is
//!   either absent (its header is not valid: the images before it are in place) or replayed
//!   whole. Nothing is flushed to the host's disk: a crash of the machine may lose anything.
//! - `Host`: only once the transaction's log bytes are durable on the host's disk. The kernel
//!   may write any page of a shared mapping back at any time, in any order, so an image
//!   stored in place before its log is durable could reach the disk alone. So a commit only
//!   appends to the log (stores, no flush); a *durability point* ([`Journal::sync`], or the
//!   split [`Journal::pending`] and [`Journal::made_durable`] that let the caller flush
//!   outside its locks and with other ranges) flushes the log written since the last one
//!   (with whatever else the caller adds: one ordered flush) and then writes the images of
//!   the transactions it made durable in place. After a crash of the machine, replay finds
//!   the log's durable transactions (and any later ones whose pages the kernel happened to
//!   write back, up to the first missing one), and the tables hold no image that is not also
//!   in that prefix.
//!
//! Before the log is overwritten, a *checkpoint* makes the tables independent of it: (Host)
//! a durability point, then one flush of every range written in place since the last
//! checkpoint, then the head is written and flushed; (Device) the head is written. The head
//! names the sequence number of the next transaction and where it starts (the start of the
//! log); every transaction before is in place.
//!
//! On an array that nothing reads after the daemon (a volatile array: a memfd that goes with
//! the process) the log has no reader, and [`Journal::without_log`] drops it: a commit writes
//! its images in place and nothing else. The file system does not even make images there
//! (its tables have no reader either), so such commits are empty: its metadata is in memory
//! alone, as a tmpfs's is.
//!
//! What mounting replays follows from when images went in place, which the head records (the
//! level of the daemon that wrote the log since the checkpoint): at `Device`, every
//! transaction but the last is wholly in place, so only the last is replayed, and none when
//! the log shows the header of a later one (a commit the crash interrupted, whose images never
//! went in place, or damage: either way the last valid one is in place); at `Host`, every
//! valid transaction from the tail, in order. So a damaged transaction in the log of a daemon
//! at the `Device` level cannot roll the tables back to the transaction before it.
//!
//! Head (the first 40 bytes of the journal region's first block): magic `b"NVFSJRNL"` (u64),
//! next sequence number (u64), its offset in the log (u64), checkpoints made (u64), flags
//! (u32: bit 0, images go in place at commit), CRC-32C of bytes 0..36 (u32). Log (from the region's second block to its end): transactions, each a
//! 32-byte header — magic `b"NVFSTXN\0"` (u64), sequence (u64), records (u32), body bytes
//! (u32), CRC-32C of header bytes 0..24 and the body (u32), zero (u32) — then the body: per
//! record, array address (u64), length (u32), zero (u32), the bytes, zero padding to a
//! multiple of 8. A transaction that does not fit before the log's end starts at its
//! beginning; a header with `u32::MAX` records and no body (a *wrap* marker, CRC over its
//! header) says so where there is room for one.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{fence, Ordering};

use moneta_device::Media;

use crate::layout::{Geometry, BLOCK};

/// `b"NVFSJRNL"` read as a little-endian u64: the head's magic.
pub const JOURNAL_MAGIC: u64 = u64::from_le_bytes(*b"NVFSJRNL");
/// `b"NVFSTXN\0"` read as a little-endian u64: a transaction header's magic.
pub const TXN_MAGIC: u64 = u64::from_le_bytes(*b"NVFSTXN\0");
/// Bytes of the head.
pub const HEAD: u64 = 40;
/// Head flag: the transactions after the head went in place as they were committed (the
/// `Device` level).
const IN_PLACE: u32 = 1;
/// Bytes of a transaction header.
pub const TXN_HEADER: u64 = 32;
/// The record count of a wrap marker.
const WRAP: u32 = u32::MAX;

/// What a metadata commit and an `fsync` make durable (docs/nvfs.md, "Durability levels").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// The emulated device's own persistence: a completed write or metadata call is in the
    /// array and survives the daemon; `fsync` costs a round trip; a crash of the machine may
    /// lose what the host has not written back, and may need `fsck --repair`.
    #[default]
    Device,
    /// The host's too: metadata reaches the host's disk in an order that keeps the image
    /// consistent across a crash of the machine, and `fsync` makes a file's data and every
    /// metadata change before it durable there, with one ordered flush.
    Host,
}

impl Durability {
    /// `device` or `host`.
    pub fn name(self) -> &'static str {
        match self {
            Durability::Device => "device",
            Durability::Host => "host",
        }
    }

    /// Parses `device` or `host`.
    pub fn parse(s: &str) -> Result<Durability, String> {
        match s.trim() {
            "device" => Ok(Durability::Device),
            "host" => Ok(Durability::Host),
            other => Err(format!(
                "durability `{other}` is neither `device` (the array's own persistence) nor \
                 `host` (fsync reaches the host's disk)"
            )),
        }
    }
}

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

/// Bytes a record of `len` bytes takes in a transaction's body.
fn record_len(len: u64) -> u64 {
    16 + len.next_multiple_of(8)
}

/// A change being built: array address to new bytes. A later image of the same address
/// replaces an earlier one. The images share one buffer (a transaction is built and committed
/// on every metadata call: one allocation for its bytes, not one per record).
#[derive(Default, Debug)]
pub struct Txn {
    /// Address to (offset, length) in `bytes`.
    records: BTreeMap<u64, (usize, usize)>,
    bytes: Vec<u8>,
    body: u64,
}

impl Txn {
    /// Records `bytes` as the new contents at `addr`.
    pub fn put(&mut self, addr: u64, bytes: &[u8]) {
        let at = self.bytes.len();
        self.bytes.extend_from_slice(bytes);
        self.body += record_len(bytes.len() as u64);
        if let Some((_, old)) = self.records.insert(addr, (at, bytes.len())) {
            self.body -= record_len(old as u64);
        }
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The records, by address.
    pub fn records(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.records
            .iter()
            .map(|(a, &(at, len))| (*a, &self.bytes[at..at + len]))
    }

    /// Bytes of journal body the change takes.
    pub fn body_len(&self) -> u64 {
        self.body
    }

    /// Adds `other`'s records (later images replace earlier ones).
    pub fn append(&mut self, other: Txn) {
        for (addr, bytes) in other.records() {
            self.put(addr, bytes);
        }
    }

    fn body(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.body as usize);
        for (addr, data) in self.records() {
            body.extend_from_slice(&addr.to_le_bytes());
            body.extend_from_slice(&(data.len() as u32).to_le_bytes());
            body.extend_from_slice(&0u32.to_le_bytes());
            body.extend_from_slice(data);
            body.resize(body.len().next_multiple_of(8), 0);
        }
        body
    }
}

fn txn_header(seq: u64, records: u32, body: &[u8]) -> [u8; TXN_HEADER as usize] {
    let mut h = [0u8; TXN_HEADER as usize];
    h[0..8].copy_from_slice(&TXN_MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..20].copy_from_slice(&records.to_le_bytes());
    h[20..24].copy_from_slice(&(body.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[0..24]), body);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

fn head(next_seq: u64, off: u64, checkpoints: u64, flags: u32) -> [u8; HEAD as usize] {
    let mut h = [0u8; HEAD as usize];
    h[0..8].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&next_seq.to_le_bytes());
    h[16..24].copy_from_slice(&off.to_le_bytes());
    h[24..32].copy_from_slice(&checkpoints.to_le_bytes());
    h[32..36].copy_from_slice(&flags.to_le_bytes());
    let crc = crc32c::crc32c(&h[0..36]);
    h[36..40].copy_from_slice(&crc.to_le_bytes());
    h
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Writes the head of an empty journal (mkfs).
pub fn format(m: &dyn Media, g: &Geometry) {
    write(m, g.journal_off, &head(1, 0, 0, IN_PLACE));
}

/// The committed transactions found in an image's log.
#[derive(Debug, Default)]
pub struct Recovered {
    /// The sequence number of the last valid transaction (one less than the head's when the
    /// log holds none).
    pub seq: u64,
    /// The records to replay, in order (a later image of an address replaces an earlier
    /// one): those of every valid transaction, or of the last alone when the log's images
    /// went in place at commit (see the module's documentation); empty when there is nothing
    /// to replay.
    pub records: Vec<(u64, Vec<u8>)>,
    /// Valid transactions found.
    pub transactions: u64,
    /// Where the next transaction goes: the log offset after the last valid one.
    pub end: u64,
    /// Log bytes from the tail to `end`.
    pub live: u64,
    /// Checkpoints the head counts.
    pub checkpoints: u64,
    /// Why the log ended at something that looked like a transaction but was not valid (a
    /// commit the crash interrupted), or why the head was not used, for reports.
    pub torn: Option<String>,
}

/// Parses a transaction's body into its records; `None` when a record lies outside the
/// metadata tables or past the body.
fn parse_body(g: &Geometry, body: &[u8], count: u32) -> Option<Vec<(u64, Vec<u8>)>> {
    let mut records = Vec::with_capacity(count as usize);
    let mut at = 0usize;
    for _ in 0..count {
        if at + 16 > body.len() {
            return None;
        }
        let addr = u64_at(body, at);
        let len = u32_at(body, at + 8) as usize;
        at += 16;
        if at + len > body.len()
            || addr < g.inode_off
            || addr
                .checked_add(len as u64)
                .is_none_or(|e| e > g.tables_end())
        {
            return None;
        }
        records.push((addr, body[at..at + len].to_vec()));
        at = (at + len).next_multiple_of(8);
    }
    Some(records)
}

/// Where a journal shows how far its transactions are committed and durable (the daemon's
/// durability page, docs/abi.md §2.10).
pub trait Progress: Send + Sync {
    /// Every transaction up to `seq` is committed: called before the call that committed the
    /// last of them returns.
    fn committed(&self, seq: u64);
    /// Every transaction up to `seq` is durable as the level defines it.
    fn durable(&self, seq: u64);
}

/// The journal of a mounted image (or of a repair).
pub struct Journal {
    g: Geometry,
    /// Array address of the log.
    log: u64,
    /// Bytes of log.
    log_len: u64,
    /// Where the next transaction goes.
    pos: u64,
    /// Log bytes from the tail (the last checkpoint) to `pos`.
    live: u64,
    /// The last transaction's sequence number.
    seq: u64,
    checkpoints: u64,
    level: Durability,
    /// (Host) The last transaction whose log bytes are durable and whose images are in place.
    durable: u64,
    /// (Host) Log ranges written by transactions not yet durable: (sequence, address, bytes).
    unflushed: Vec<(u64, u64, u64)>,
    /// (Host) Transactions whose images wait for their log bytes to be durable.
    queued: VecDeque<(u64, Txn)>,
    /// In-place ranges written since the last checkpoint, which it flushes (Host).
    applied: Vec<(u64, u64)>,
    /// Whether transactions go through the log (false for an array that nothing reads after
    /// the daemon: [`Journal::without_log`]).
    logged: bool,
    /// Told of every commit and durability point ([`Journal::set_progress`]).
    progress: Option<std::sync::Arc<dyn Progress>>,
    /// Commits do not raise the progress's `committed` ([`Journal::set_quiet`]).
    quiet: bool,
}

/// Sorts and merges ranges that overlap or touch.
pub fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.retain(|r| r.1 > 0);
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (a, l) in ranges {
        match out.last_mut() {
            Some((b, m)) if *b + *m >= a => *m = (*m).max(a + l - *b),
            _ => out.push((a, l)),
        }
    }
    out
}

impl Journal {
    /// The journal of an image with geometry `g`, continuing after the log `r` recovered
    /// (replay it with [`Journal::replay`] before committing).
    pub fn open(g: &Geometry, r: &Recovered, level: Durability) -> Journal {
        Journal {
            g: *g,
            log: g.journal_off + BLOCK,
            log_len: g.journal_len - BLOCK,
            pos: r.end,
            live: r.live,
            seq: r.seq,
            checkpoints: r.checkpoints,
            level,
            durable: r.seq,
            unflushed: Vec::new(),
            queued: VecDeque::new(),
            applied: Vec::new(),
            logged: true,
            progress: None,
            quiet: false,
        }
    }

    /// Drops the log, for an array that nothing reads after the daemon that writes it (a
    /// volatile array): a commit writes its images in place at once and nothing else, since
    /// no mount will ever replay it. Only at the `Device` level (the `Host` level needs a
    /// backing file); a journal at `Host` keeps its log.
    pub fn without_log(mut self) -> Journal {
        self.logged = self.level == Durability::Host;
        self
    }

    /// Whether transactions go through the log.
    pub fn logged(&self) -> bool {
        self.logged
    }

    /// Reads the committed transactions of an image's log, from the tail the head names to
    /// the first header that is not the next transaction's.
    pub fn recover(m: &dyn Media, g: &Geometry) -> Recovered {
        let mut h = [0u8; HEAD as usize];
        read(m, g.journal_off, &mut h);
        let log = g.journal_off + BLOCK;
        let log_len = g.journal_len - BLOCK;
        let next = u64_at(&h, 8);
        let tail = u64_at(&h, 16);
        if u64_at(&h, 0) != JOURNAL_MAGIC
            || crc32c::crc32c(&h[0..36]) != u32_at(&h, 36)
            || tail >= log_len
            || !tail.is_multiple_of(8)
            || next == 0
        {
            // Every transaction before the head's was in place when it was written, and a
            // damaged head cannot say where the rest begins: the tables stand as they are.
            return Recovered {
                torn: Some("the journal head is damaged; nothing is replayed".into()),
                ..Default::default()
            };
        }
        let mut r = Recovered {
            seq: next - 1,
            end: tail,
            checkpoints: u64_at(&h, 24),
            ..Default::default()
        };
        let in_place = u32_at(&h, 32) & IN_PLACE != 0;
        // The last valid transaction's records.
        let mut last = Vec::new();
        let mut pos = tail;
        let mut scanned = 0u64;
        // Bytes at the log's end that a writer skipped to start the next transaction at its
        // beginning: counted once that transaction is found.
        let mut skipped = 0u64;
        loop {
            if pos + TXN_HEADER > log_len {
                scanned += log_len - pos;
                skipped += log_len - pos;
                pos = 0;
            }
            if scanned >= log_len {
                break;
            }
            let mut th = [0u8; TXN_HEADER as usize];
            read(m, log + pos, &mut th);
            let seq = u64_at(&th, 8);
            if u64_at(&th, 0) != TXN_MAGIC || seq != r.seq + 1 {
                break;
            }
            // From here on, a failure is the header of a later transaction that is not valid.
            if in_place {
                last.clear();
            }
            let count = u32_at(&th, 16);
            let body_len = u32_at(&th, 20) as u64;
            if count == WRAP {
                if body_len != 0 || txn_header(seq, WRAP, &[])[24..28] != th[24..28] {
                    r.torn = Some("a damaged wrap marker".into());
                    break;
                }
                scanned += log_len - pos;
                skipped += log_len - pos;
                pos = 0;
                continue;
            }
            if body_len > log_len - pos - TXN_HEADER {
                r.torn = Some("a transaction longer than the log".into());
                break;
            }
            let mut body = vec![0u8; body_len as usize];
            read(m, log + pos + TXN_HEADER, &mut body);
            if txn_header(seq, count, &body)[24..28] != th[24..28] {
                r.torn = Some("checksum mismatch (a commit was interrupted)".into());
                break;
            }
            let Some(records) = parse_body(g, &body, count) else {
                r.torn = Some("a record outside the metadata tables".into());
                break;
            };
            if in_place {
                last = records;
            } else {
                r.records.extend(records);
            }
            r.transactions += 1;
            r.seq = seq;
            pos += TXN_HEADER + body_len;
            scanned += TXN_HEADER + body_len;
            r.live += skipped + TXN_HEADER + body_len;
            skipped = 0;
            r.end = pos;
        }
        if in_place {
            r.records = last;
        }
        r
    }

    /// Writes a recovered log's images in place again, then checkpoints, so that the log can
    /// be reused.
    pub fn replay(&mut self, m: &dyn Media, r: &Recovered) -> io::Result<()> {
        for (addr, data) in &r.records {
            for at in std::iter::once(*addr).chain(self.g.mirror_of(*addr)) {
                self.put(m, at, data)?;
                self.applied.push((at, data.len() as u64));
            }
        }
        self.checkpoint(m)
    }

    /// Bytes of body the largest transaction may take.
    pub fn capacity(&self) -> u64 {
        self.log_len - TXN_HEADER
    }

    /// Log bytes free before the next transaction needs a checkpoint.
    pub fn room(&self) -> u64 {
        self.log_len.saturating_sub(self.live)
    }

    /// Tells `p` how far transactions are committed and durable now, and after every commit
    /// and durability point from now on.
    pub fn set_progress(&mut self, p: std::sync::Arc<dyn Progress>) {
        p.committed(self.seq);
        p.durable(self.durable_seq());
        self.progress = Some(p);
    }

    /// While `on`, the transactions committed are not shown as committed to the progress
    /// ([`Progress::committed`]); they still count as durable once a durability point passes
    /// them. For changes that no call waits for and that a crash of the machine repairs by
    /// itself: the frees of orphans (files with no name and no handle left), which the next
    /// mount frees again if their transactions did not reach the disk. An `fsync` that finds
    /// every *shown* transaction durable then needs no durability point of its own for them.
    pub fn set_quiet(&mut self, on: bool) {
        self.quiet = on;
    }

    /// The sequence number of the last transaction.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The durability level.
    pub fn level(&self) -> Durability {
        self.level
    }

    /// The last transaction that is durable as the level defines it (every transaction, at
    /// `Device`).
    pub fn durable_seq(&self) -> u64 {
        match self.level {
            Durability::Device => self.seq,
            Durability::Host => self.durable,
        }
    }

    /// Commits `txn` and returns its sequence number. On return the change survives a crash
    /// of the daemon; at `Host`, it reaches the host's disk at the next durability point (or
    /// before, when the kernel writes the log back), in log order.
    pub fn commit(&mut self, m: &dyn Media, txn: Txn) -> io::Result<u64> {
        if txn.is_empty() {
            return Ok(self.seq);
        }
        for (addr, data) in txn.records() {
            assert!(
                addr >= self.g.inode_off && addr + data.len() as u64 <= self.g.tables_end(),
                "journal record at {addr:#x} outside the metadata tables"
            );
        }
        if !self.logged {
            self.seq += 1;
            self.apply(m, &txn)?;
            self.show_committed();
            return Ok(self.seq);
        }
        let body = txn.body();
        let len = TXN_HEADER + body.len() as u64;
        if len > self.log_len {
            return Err(io::Error::other(format!(
                "metadata transaction of {} bytes exceeds the journal ({} bytes)",
                body.len(),
                self.capacity()
            )));
        }
        let log_len = self.log_len;
        let wraps = |pos: u64| pos + len > log_len;
        // Bytes the transaction takes from `pos`: the rest of the log when it wraps.
        let need = |pos: u64| if wraps(pos) { log_len - pos + len } else { len };
        if self.live + need(self.pos) > log_len {
            self.checkpoint(m)?;
        }
        let seq = self.seq + 1;
        let taken = need(self.pos);
        if wraps(self.pos) {
            if self.pos + TXN_HEADER <= self.log_len {
                let marker = txn_header(seq, WRAP, &[]);
                self.log_write(m, self.pos, &marker, seq)?;
            }
            self.pos = 0;
        }
        self.log_write(m, self.pos + TXN_HEADER, &body, seq)?;
        // The header must not reach the array before the body it validates (a crash of the
        // daemon leaves a prefix of its stores; a crash of the machine is the CRC's business).
        fence(Ordering::SeqCst);
        self.log_write(
            m,
            self.pos,
            &txn_header(seq, txn.records.len() as u32, &body),
            seq,
        )?;
        fence(Ordering::SeqCst);
        self.pos += len;
        self.live += taken;
        self.seq = seq;
        match self.level {
            Durability::Device => self.apply(m, &txn)?,
            Durability::Host => self.queued.push_back((seq, txn)),
        }
        self.show_committed();
        Ok(seq)
    }

    fn show_committed(&self) {
        if let Some(p) = &self.progress {
            if !self.quiet {
                p.committed(self.seq);
            }
            if self.level == Durability::Device {
                p.durable(self.seq);
            }
        }
    }

    /// Writes metadata: at the `Host` level through the backing file's own interface, so
    /// that flushing it does not write-protect the daemon's mapping of it
    /// ([`Media::write_file`]); at the `Device` level by stores.
    fn put(&self, m: &dyn Media, addr: u64, bytes: &[u8]) -> io::Result<()> {
        match self.level {
            Durability::Device => {
                write(m, addr, bytes);
                Ok(())
            }
            Durability::Host => m.write_file(addr, bytes),
        }
    }

    fn log_write(&mut self, m: &dyn Media, off: u64, bytes: &[u8], seq: u64) -> io::Result<()> {
        self.put(m, self.log + off, bytes)?;
        if self.level == Durability::Host {
            self.unflushed
                .push((seq, self.log + off, bytes.len() as u64));
        }
        Ok(())
    }

    /// Writes a transaction's images in place, the first copies first: a crash in between
    /// leaves the log to redo both.
    fn apply(&mut self, m: &dyn Media, txn: &Txn) -> io::Result<()> {
        // Only a checkpoint at `Host` flushes what went in place.
        let track = self.level == Durability::Host;
        for (addr, data) in txn.records() {
            self.put(m, addr, data)?;
            if track {
                self.applied.push((addr, data.len() as u64));
            }
        }
        for (addr, data) in txn.records() {
            if let Some(at) = self.g.mirror_of(addr) {
                self.put(m, at, data)?;
                if track {
                    self.applied.push((at, data.len() as u64));
                }
            }
        }
        if self.applied.len() > 4096 {
            self.applied = merge(std::mem::take(&mut self.applied));
        }
        Ok(())
    }

    /// What a durability point must flush to make every transaction so far durable: the
    /// last transaction's sequence number and the log ranges written since the last point
    /// (none at `Device`).
    pub fn pending(&self) -> (u64, Vec<(u64, u64)>) {
        let ranges = self.unflushed.iter().map(|&(_, a, l)| (a, l)).collect();
        (self.seq, merge(ranges))
    }

    /// Records that the log ranges [`Journal::pending`] gave for `seq` are durable, and
    /// writes the images of the transactions up to `seq` in place.
    pub fn made_durable(&mut self, m: &dyn Media, seq: u64) -> io::Result<()> {
        if self.level != Durability::Host || seq <= self.durable {
            return Ok(());
        }
        self.unflushed.retain(|&(s, _, _)| s > seq);
        while self.queued.front().is_some_and(|(s, _)| *s <= seq) {
            let (_, txn) = self.queued.pop_front().expect("checked");
            self.apply(m, &txn)?;
        }
        self.durable = seq;
        if let Some(p) = &self.progress {
            p.durable(seq);
        }
        Ok(())
    }

    /// A durability point: flushes the log written since the last one, together with
    /// `extra` (one ordered flush), and writes the images it made durable in place.
    pub fn sync(&mut self, m: &dyn Media, extra: &[(u64, u64)]) -> io::Result<()> {
        let (seq, mut ranges) = self.pending();
        ranges.extend_from_slice(extra);
        if self.level == Durability::Host && !ranges.is_empty() {
            m.flush_ranges(&merge(ranges))?;
        }
        self.made_durable(m, seq)
    }

    /// Makes the tables independent of the log, so that it can be overwritten from its start:
    /// (Host) a durability point, a flush of what was written in place since the last
    /// checkpoint, then the head, flushed; (Device) the head.
    pub fn checkpoint(&mut self, m: &dyn Media) -> io::Result<()> {
        if self.level == Durability::Host {
            self.sync(m, &[])?;
            m.flush_ranges(&merge(std::mem::take(&mut self.applied)))?;
        }
        self.applied.clear();
        self.checkpoints += 1;
        // Every transaction so far is in place: the next one starts the log.
        let flags = match self.level {
            Durability::Device => IN_PLACE,
            Durability::Host => 0,
        };
        self.put(
            m,
            self.g.journal_off,
            &head(self.seq + 1, 0, self.checkpoints, flags),
        )?;
        fence(Ordering::SeqCst);
        if self.level == Durability::Host {
            m.flush(self.g.journal_off, HEAD)?;
        }
        self.pos = 0;
        self.live = 0;
        Ok(())
    }

    /// Log bytes in use since the last checkpoint, and the log's size.
    pub fn usage(&self) -> (u64, u64) {
        (self.live, self.log_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::MkfsOptions;
    use moneta_device::MappedArray;

    fn setup(log: u64) -> (MappedArray, Geometry) {
        let a = MappedArray::volatile(4 << 20).unwrap();
        let mut g = Geometry::compute(
            4 << 20,
            &MkfsOptions {
                inode_count: Some(64),
                ..Default::default()
            },
        )
        .unwrap();
        g.journal_len = BLOCK + log;
        format(&a, &g);
        (a, g)
    }

    fn txn(g: &Geometry, ino: u64, byte: u8, n: usize) -> Txn {
        let mut t = Txn::default();
        t.put(g.inode_addr(ino), &vec![byte; n]);
        t
    }

    #[test]
    fn transactions_replay_in_order_across_wraps_and_checkpoints() {
        let (a, g) = setup(4096);
        let r = Journal::recover(&a, &g);
        assert_eq!((r.seq, r.transactions, r.end), (0, 0, 0));
        let mut j = Journal::open(&g, &r, Durability::Device);
        // 600-byte transactions in a 4 KiB log: each sixth one wraps or checkpoints.
        for i in 1..=40u64 {
            let seq = j.commit(&a, txn(&g, 1 + i % 3, i as u8, 600)).unwrap();
            assert_eq!(seq, i);
            let r = Journal::recover(&a, &g);
            assert_eq!(r.seq, i, "after commit {i}");
            assert!(r.transactions >= 1);
            // Laying the recovered images over the tables gives the newest record.
            let last = r
                .records
                .iter()
                .rev()
                .find(|(addr, _)| *addr == g.inode_addr(1 + i % 3))
                .unwrap();
            assert_eq!(last.1[0], i as u8);
            assert_eq!((r.end, r.live), (j.pos, j.live));
        }
        assert!(j.checkpoints > 5, "{} checkpoints", j.checkpoints);
    }

    #[test]
    fn a_torn_commit_ends_the_log() {
        let (a, g) = setup(64 << 10);
        let mut j = Journal::open(&g, &Journal::recover(&a, &g), Durability::Device);
        j.commit(&a, txn(&g, 1, 1, 100)).unwrap();
        let at = j.pos;
        j.commit(&a, txn(&g, 2, 2, 100)).unwrap();
        // Damage the second transaction's body.
        write(&a, g.journal_off + BLOCK + at + TXN_HEADER + 20, &[0xff]);
        let r = Journal::recover(&a, &g);
        assert_eq!((r.seq, r.transactions), (1, 1));
        assert!(r.torn.unwrap().contains("interrupted"));
        // A damaged head replays nothing.
        write(&a, g.journal_off + 9, &[0xff]);
        let r = Journal::recover(&a, &g);
        assert_eq!(r.transactions, 0);
        assert!(r.torn.unwrap().contains("head"));
    }

    #[test]
    fn at_host_level_images_wait_for_their_log() {
        let (a, g) = setup(64 << 10);
        let mut j = Journal::open(&g, &Journal::recover(&a, &g), Durability::Host);
        j.commit(&a, txn(&g, 1, 7, 128)).unwrap();
        let mut rec = [0u8; 1];
        read(&a, g.inode_addr(1), &mut rec);
        assert_eq!(rec[0], 0, "not in place before the log is durable");
        let (seq, ranges) = j.pending();
        assert_eq!(seq, 1);
        assert_eq!(ranges.len(), 1, "header and body are one range: {ranges:?}");
        j.made_durable(&a, seq).unwrap();
        read(&a, g.inode_addr(1), &mut rec);
        assert_eq!(rec[0], 7);
        read(&a, g.mirror_of(g.inode_addr(1)).unwrap(), &mut rec);
        assert_eq!(rec[0], 7, "both copies");
        assert!(j.pending().1.is_empty());
        assert_eq!(j.durable_seq(), 1);
    }

    #[test]
    fn without_a_log_images_go_in_place_and_the_log_stays_empty() {
        let (a, g) = setup(64 << 10);
        let head_before = {
            let mut h = [0u8; HEAD as usize];
            read(&a, g.journal_off, &mut h);
            h
        };
        let mut j = Journal::open(&g, &Journal::recover(&a, &g), Durability::Device).without_log();
        assert!(!j.logged());
        for i in 1..=50u64 {
            assert_eq!(j.commit(&a, txn(&g, 1 + i % 3, i as u8, 128)).unwrap(), i);
            let mut rec = [0u8; 1];
            read(&a, g.inode_addr(1 + i % 3), &mut rec);
            assert_eq!(rec[0], i as u8, "in place at commit {i}");
            read(&a, g.mirror_of(g.inode_addr(1 + i % 3)).unwrap(), &mut rec);
            assert_eq!(rec[0], i as u8, "both copies at commit {i}");
        }
        // Nothing reached the log or the head, and nothing waits for a flush.
        let r = Journal::recover(&a, &g);
        assert_eq!((r.transactions, r.live), (0, 0));
        let mut h = [0u8; HEAD as usize];
        read(&a, g.journal_off, &mut h);
        assert_eq!(h, head_before);
        assert_eq!(j.usage().0, 0);
        assert_eq!(j.durable_seq(), 50);
        assert!(j.pending().1.is_empty());
        // A journal at the host level keeps its log: it needs one.
        let h = Journal::open(&g, &Journal::recover(&a, &g), Durability::Host).without_log();
        assert!(h.logged());
    }

    #[test]
    fn merge_joins_touching_ranges() {
        assert_eq!(
            merge(vec![(10, 5), (0, 4), (4, 2), (15, 1), (30, 0), (20, 3)]),
            vec![(0, 6), (10, 6), (20, 3)]
        );
    }
}
