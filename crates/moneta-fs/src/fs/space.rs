//! A file's space: extending it (chunks, the reservation ahead of appends, zeroing the tail),
//! its extents, and truncation.

use super::*;

impl Fs {
    /// Allocates every hole of `[off, off + len)` (zeroed before it becomes part of the file)
    /// and grows the size to `off + len` if it is larger. Returns the mapping of the range.
    /// `off == u64::MAX` appends: the range starts at the current size, so that concurrent
    /// appenders each get their own range (the caller learns it as the new size minus `len`).
    pub fn extend(
        &mut self,
        ino: u64,
        off: u64,
        len: u64,
        max: usize,
    ) -> FsResult<(u64, Vec<Mapping>)> {
        self.extend_ahead(ino, off, len, 0, None, max)
            .map(|(size, maps, _)| (size, maps))
    }

    /// [`Fs::extend`] that also allocates up to `ahead` bytes past the new end when the range
    /// ends the file, from the chunks that continue its last extent on the array (its
    /// reserve), without growing the size: room a size grant lets the client grow into with
    /// no call ([`Fs::grant_size`]). `holder` is the key of the caller's grant, if it may
    /// hold one: a grant of anyone else on the file ends first, so that while a grant stands
    /// its holder alone moves the size and knows it exactly. Returns the size, the mapping
    /// (whole extents, the room included) and the end of the room (the size when there is
    /// none).
    pub fn extend_ahead(
        &mut self,
        ino: u64,
        off: u64,
        len: u64,
        ahead: u64,
        holder: Option<u64>,
        max: usize,
    ) -> FsResult<(u64, Vec<Mapping>, u64)> {
        self.allocate(ino, off, len, ahead, holder, max, true)
    }

    /// Room for an empty regular file that holds no space, just opened by the caller of
    /// `holder`'s grant: at least `ahead` bytes allocated from offset 0 (zeroed, as any
    /// extend's), the size left at 0 and no time changed, as if an extend that ends the file
    /// had given room and nothing more. Returns the mapping of the room (whole extents from
    /// offset 0) and its end; no room (an empty mapping) for any other file, or one another
    /// handle holds a grant on.
    pub fn room_at_open(
        &mut self,
        ino: u64,
        ahead: u64,
        holder: u64,
        max: usize,
    ) -> FsResult<(Vec<Mapping>, u64)> {
        let none = Ok((Vec::new(), 0));
        if ahead == 0
            || !self.exists(ino)
            || !self.inode(ino).is_reg()
            || self.size_now(ino) != 0
            || self.grants.contains_key(&ino)
            || self.extents.get(&ino).is_some_and(|m| !m.is_empty())
        {
            return none;
        }
        let cs = self.g.chunk_size;
        let (_, _, room) = self.allocate(ino, 0, cs, ahead, Some(holder), max, false)?;
        let maps = self
            .extents
            .get(&ino)
            .map(|m| {
                m.iter()
                    .take(max)
                    .map(|(&fc, x)| Mapping {
                        file_off: fc * cs,
                        len: x.count * cs,
                        dev: Some(self.g.chunk_addr(x.dev)),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok((maps, room))
    }

    /// [`Fs::extend_ahead`]; with `grow` false the size and times stay as they are (room
    /// only, [`Fs::room_at_open`]).
    #[allow(clippy::too_many_arguments)]
    fn allocate(
        &mut self,
        ino: u64,
        off: u64,
        len: u64,
        ahead: u64,
        holder: Option<u64>,
        max: usize,
        grow: bool,
    ) -> FsResult<(u64, Vec<Mapping>, u64)> {
        self.check_alive()?;
        if !self.inode(ino).is_reg() {
            return e(libc::EINVAL, "not a regular file");
        }
        // What the grant's holder published is part of the size the range is measured from.
        let settled = if self.grants.get(&ino).is_some_and(|g| Some(g.key) != holder) {
            self.end_grant_of(ino)
        } else {
            self.settle_size(ino)
        };
        let off = if off == u64::MAX {
            self.inode(ino).size
        } else {
            off
        };
        if len == 0 {
            let size = self.inode(ino).size;
            if settled {
                self.commit()?;
            }
            return self.map(ino, off, 0, max).map(|(s, m)| (s, m, size));
        }
        let end = match off.checked_add(len) {
            Some(end) if end <= MAX_FILE_SIZE => end,
            _ => return e(libc::EFBIG, "file too large"),
        };
        let cs = self.g.chunk_size;
        let (first, last) = (off / cs, (end - 1) / cs);
        // Missing runs of file chunks.
        let mut missing: Vec<(u64, u64)> = Vec::new();
        {
            let empty = BTreeMap::new();
            let m = self.extents.get(&ino).unwrap_or(&empty);
            let mut at = first;
            let before = m.range(..=first).next_back().map(|(k, x)| (*k, x.count));
            if let Some((fc, count)) = before {
                at = at.max(fc + count);
            }
            for (&fc, x) in m.range(first + 1..last + 1) {
                if fc > at {
                    missing.push((at, fc - at));
                }
                at = at.max(fc + x.count);
            }
            if at <= last {
                missing.push((at, last + 1 - at));
            }
        }
        let need: u64 = missing.iter().map(|r| r.1).sum();
        if need > self.space.free() {
            // Other files' room ahead of their appends is space too.
            self.take_back_rooms(ino)?;
        }
        if need > self.space.free() {
            return e(
                libc::ENOSPC,
                format!(
                    "no space left: {need} chunks needed, {} free",
                    self.space.free()
                ),
            );
        }
        if need > 0 {
            self.make_room(ino, need)?;
        }
        // Whether the range reaches past the file's last chunk: an append, after which the
        // file keeps a reserve past its new last chunk.
        let appends = need > 0
            && self
                .extents
                .get(&ino)
                .is_none_or(|m| m.range(last + 1..).next().is_none());
        let budget = self.txn_budget();
        let mut allocated = 0;
        'runs: for (fc, count) in missing {
            let (mut f, mut left) = (fc, count);
            while left > 0 {
                if allocated > 0 && self.txn_estimate() > budget {
                    // Too many extents for one transaction (a fragmented array): what is
                    // allocated stands, the rest stays a hole the client extends again.
                    break 'runs;
                }
                // The chunk after the extent that ends at `f`, if one does.
                let goal = self.extents.get(&ino).and_then(|m| {
                    m.range(..f)
                        .next_back()
                        .filter(|(k, x)| **k + x.count == f)
                        .map(|(_, x)| x.dev + x.count)
                });
                if let (Some(g), Some(&(rs, re))) = (goal, self.reserves.get(&ino)) {
                    if g == rs {
                        let k = left.min(re - rs);
                        self.space.claim(rs, k);
                        if rs + k == re {
                            self.reserves.remove(&ino);
                        } else {
                            self.reserves.insert(ino, (rs + k, re));
                        }
                        self.add_extent(ino, f, rs, k);
                        (f, left, allocated) = (f + k, left - k, allocated + k);
                        continue;
                    }
                }
                let runs =
                    self.space
                        .take(goal, left.min(u32::MAX as u64), self.free_extents.len() + 1);
                if runs.is_empty() {
                    // The rest of the free space is this file's reserve, which does not
                    // continue it here: give it back and take from it.
                    if self.reserves.contains_key(&ino) {
                        self.drop_reserve(ino);
                        continue;
                    }
                    break 'runs;
                }
                for (i, &(d, n)) in runs.iter().enumerate() {
                    if !self.continues(ino, f, d) && self.free_extents.is_empty() {
                        self.space.untake(&runs[i..]);
                        if allocated == 0 {
                            return e(
                                libc::ENOSPC,
                                "no free extent records: the file system is too fragmented \
                                 (mkfs with a larger --chunk-size, or fewer, larger files)",
                            );
                        }
                        break 'runs;
                    }
                    self.add_extent(ino, f, d, n);
                    (f, left, allocated) = (f + n, left - n, allocated + n);
                }
            }
        }
        if appends {
            self.keep_reserve(ino);
        }
        let old = self.inode(ino).size;
        let room = if ahead > 0 && end >= old {
            self.allocate_ahead(ino, last, ahead.div_ceil(cs))
        } else {
            end
        };
        // With room ahead the client may write anywhere in the old last chunk past the size:
        // all of it must read as zeros, not only the part up to the new end.
        if let Err(err) = self.zero_tail(ino, old, room.max(end)) {
            return Err(self.fail(&err));
        }
        if grow {
            if end > old && self.open.contains_key(&ino) {
                self.grown.insert(ino);
            }
            let now = Time::now();
            let node = self.inode_mut(ino);
            node.size = node.size.max(end);
            node.mtime = now;
            node.ctime = now;
        }
        self.commit()?;
        // The size as readers see it: the holder may have published more meanwhile.
        let (size, maps) = self.map(ino, off, len, max)?;
        Ok((size, maps, room.max(size)))
    }

    /// Allocates up to `chunks` chunks after file chunk `last` from `ino`'s reserve, when the
    /// extent holding `last` ends there and the reserve continues it, so that the room is part
    /// of that extent (an extent never starts past the size). Returns the end of the extent
    /// holding `last`, in bytes.
    fn allocate_ahead(&mut self, ino: u64, last: u64, chunks: u64) -> u64 {
        let cs = self.g.chunk_size;
        let Some((fc, x)) = self
            .extents
            .get(&ino)
            .and_then(|m| m.range(..=last).next_back())
            .map(|(&k, x)| (k, *x))
        else {
            return 0;
        };
        if fc + x.count <= last {
            return 0;
        }
        let have = fc + x.count - (last + 1);
        if have < chunks && fc + x.count == last + 1 {
            if let Some(&(rs, re)) = self.reserves.get(&ino) {
                if rs == x.dev + x.count {
                    let k = (chunks - have).min(re - rs);
                    self.space.claim(rs, k);
                    if rs + k == re {
                        self.reserves.remove(&ino);
                    } else {
                        self.reserves.insert(ino, (rs + k, re));
                    }
                    self.add_extent(ino, last + 1, rs, k);
                    self.keep_reserve(ino);
                }
            }
        }
        self.extents
            .get(&ino)
            .and_then(|m| m.range(..=last).next_back())
            .map_or(0, |(&k, x)| (k + x.count) * cs)
    }

    /// Whether an extent of `ino` ends at file chunk `fc` and data chunk `dev`, so that chunks
    /// from `dev` at `fc` extend it.
    pub(super) fn continues(&self, ino: u64, fc: u64, dev: u64) -> bool {
        self.extents.get(&ino).is_some_and(|m| {
            m.range(..fc)
                .next_back()
                .is_some_and(|(k, x)| k + x.count == fc && x.dev + x.count == dev)
        })
    }

    /// Keeps a reserve right after `ino`'s last chunk on the array (Moneta-D's 1 MB ahead of
    /// appends): other allocations leave those chunks alone, so the file's next appends extend
    /// its last extent.
    pub(super) fn keep_reserve(&mut self, ino: u64) {
        let Some(after) = self
            .extents
            .get(&ino)
            .and_then(|m| m.values().next_back())
            .map(|x| x.dev + x.count)
        else {
            return;
        };
        if self.reserves.get(&ino).is_some_and(|&(s, _)| s == after) {
            return;
        }
        self.drop_reserve(ino);
        if after < self.g.chunk_count && self.reserve_chunks > 0 {
            let k = self.space.reserve(after, self.reserve_chunks);
            if k > 0 {
                self.reserves.insert(ino, (after, after + k));
            }
        }
    }

    /// Zeroes the bytes of `ino`'s chunk holding its old end `old` from there to `new_end`
    /// (or the chunk's end), before the file grows over them: they read as zeros even when a
    /// crash of the machine kept an earlier truncate but not its zeroing of them.
    pub(super) fn zero_tail(&mut self, ino: u64, old: u64, new_end: u64) -> FsResult<()> {
        let cs = self.g.chunk_size;
        if new_end <= old || old.is_multiple_of(cs) {
            return Ok(());
        }
        if let Some(from) = self.addr_of(ino, old) {
            let len = ((old / cs + 1) * cs).min(new_end) - old;
            if let Err(err) = self.zero(from, len) {
                return e(libc::EIO, format!("cannot zero past the end: {err}"));
            }
        }
        Ok(())
    }

    /// The array address of byte `off` of `ino`, if a chunk holds it (whatever the size).
    pub(super) fn addr_of(&self, ino: u64, off: u64) -> Option<u64> {
        let cs = self.g.chunk_size;
        let fc = off / cs;
        let (&k, x) = self.extents.get(&ino)?.range(..=fc).next_back()?;
        (k + x.count > fc).then(|| self.g.chunk_addr(x.dev + fc - k) + off % cs)
    }

    pub(super) fn add_extent(&mut self, ino: u64, fc: u64, dev: u64, n: u64) {
        self.touched.insert(ino);
        let m = self.extents.entry(ino).or_default();
        // Grow the extent just before when it continues both in the file and on the array.
        if let Some((&pfc, px)) = m.range_mut(..fc).next_back() {
            if pfc + px.count == fc && px.dev + px.count == dev && px.count + n <= u32::MAX as u64 {
                px.count += n;
                let rec = ExtentRec {
                    ino,
                    file_chunk: pfc,
                    dev_chunk: px.dev,
                    count: px.count as u32,
                };
                let slot = px.slot;
                if self.images {
                    self.txn.put(self.g.extent_addr(slot), &rec.encode(slot));
                }
                return;
            }
        }
        let mut left = n;
        let (mut f, mut d) = (fc, dev);
        while left > 0 {
            let take = left.min(u32::MAX as u64);
            let slot = self
                .free_extents
                .pop_first()
                .expect("extent records are at least as many as chunks");
            let rec = ExtentRec {
                ino,
                file_chunk: f,
                dev_chunk: d,
                count: take as u32,
            };
            if self.images {
                self.txn.put(self.g.extent_addr(slot), &rec.encode(slot));
            }
            self.extents.entry(ino).or_default().insert(
                f,
                Ext {
                    dev: d,
                    count: take,
                    slot,
                },
            );
            left -= take;
            f += take;
            d += take;
        }
    }

    /// Sets the size of a regular file (the caller checked permission). Shrinking revokes the
    /// chunks past the new end and then frees them, and zeroes the rest of the last chunk.
    pub(super) fn truncate_ino(&mut self, ino: u64, size: u64) -> FsResult<()> {
        if size > MAX_FILE_SIZE {
            return e(libc::EFBIG, "file too large");
        }
        // A grant's holder may have grown the file: that counts first, and the grant ends
        // (its room may be freed below).
        self.end_grant_of(ino);
        let cs = self.g.chunk_size;
        let old = self.inode(ino).size;
        if size < old {
            let keep = size.div_ceil(cs);
            // Revoke from the chunk that holds the new end, not only the freed chunks: a
            // client that still holds records of the kept part of that chunk would otherwise
            // read past the new end (or write there without growing the file) on a stale size.
            let ranges = self.ranges_from(ino, size / cs);
            self.revoke(&ranges)?;
            self.drop_reserve(ino);
            if !size.is_multiple_of(cs) {
                if let Some(from) = self.addr_of(ino, size) {
                    let to = old.min((size / cs + 1) * cs);
                    if let Err(err) = self.zero(from, to - size) {
                        return e(libc::EIO, format!("cannot zero the tail: {err}"));
                    }
                }
            }
            let budget = self.txn_budget();
            while !self.free_from(ino, keep, budget) {
                // More extents than one transaction holds: this one ends the file where the
                // space it still holds ends.
                let held = self
                    .extents
                    .get(&ino)
                    .and_then(|m| m.iter().next_back())
                    .map_or(0, |(k, x)| (k + x.count) * cs);
                self.inode_mut(ino).size = held.clamp(size, old);
                if let Err(err) = self.commit_one() {
                    return Err(self.fail(&err));
                }
            }
        } else {
            self.zero_tail(ino, old, size)?;
        }
        let now = Time::now();
        let n = self.inode_mut(ino);
        n.size = size;
        n.mtime = now;
        n.ctime = now;
        Ok(())
    }

    /// `truncate(2)` by path.
    pub fn truncate(&mut self, cred: &Cred, path: &[u8], size: u64) -> FsResult<()> {
        self.check_alive()?;
        let ino = self.resolve(cred, path, true)?;
        let n = *self.inode(ino);
        if n.is_dir() {
            return e(libc::EISDIR, "is a directory");
        }
        if !n.is_reg() {
            return e(libc::EINVAL, "not a regular file");
        }
        if !may(&n, cred, MAY_WRITE) {
            return e(libc::EACCES, "permission denied");
        }
        self.truncate_ino(ino, size)?;
        self.commit()
    }

    /// `ftruncate(2)` on an inode opened for writing.
    pub fn truncate_open(&mut self, ino: u64, size: u64) -> FsResult<()> {
        self.check_alive()?;
        if !self.inode(ino).is_reg() {
            return e(libc::EINVAL, "not a regular file");
        }
        self.truncate_ino(ino, size)?;
        self.commit()
    }
}
