//! Size leases (docs/abi.md §3.9): an extend that ends a file, asked through a channel that
//! wants them, also allocates room past the new end, and the channel gets a slot in which
//! its process publishes the size it grows the file to inside that room, with no call.
//!
//! The file system reads the slot whenever something depends on the size (`Fs::size_now`,
//! `Fs::settle_size`), and the grant ends when its handle closes, when its channel goes,
//! when the file is mapped, when any of its space is freed, and when another handle takes it
//! (see `moneta_fs::SizeGrant`). Ending bumps the slot's generation before the last read,
//! so what the process published before the end always counts and nothing after it does.
//! The room is the file's own space, zeroed; what a client publishes counts only up to the
//! room's end, so a hostile one can only grow its own file over zeros, as an extend would.

use std::sync::atomic::Ordering;

use moneta_abi::{word_size, SIZE_LEASE_SLOTS, SIZE_LEASE_WANTED};
use moneta_fs::SizeGrant;

use super::*;

/// Least room an extend asks for past a growing file's end.
const MIN_ROOM: u64 = 16 << 10;
/// Most room an extend asks for (the file system gives at most its append reserve).
const MAX_ROOM: u64 = 1 << 20;

/// A grant's key: the channel, the slot and the handle (below 2^32; larger handles get no
/// grant).
fn key(channel: u32, slot: usize, handle: u64) -> Option<u64> {
    (handle < 1 << 32 && channel < 1 << 28)
        .then(|| (u64::from(channel) << 36) | ((slot as u64) << 32) | handle)
}

/// Before a stat of `ino` through a handle of `channel`'s connection: where another channel
/// holds the file's size grant, ends it for good (`Fs::share_size`). A process that has the
/// file open and asks its size (a database's other processes do, before they read or extend
/// a table) could keep no answer while the grant stood, and would ask the daemon at every
/// look; the holder's appends cost an extend call each instead, which are rarer. Another
/// handle of the holder's own channel asks, and leaves the grant be.
pub(super) fn read_by_another(fs: &mut Fs, channel: u32, ino: u64) {
    if fs.grant_key(ino).is_some_and(|k| key_channel(k) != channel) {
        if let Err(e) = fs.share_size(ino) {
            // The grant stands: the answer is not kept (`Fs::watch`), as before.
            tracing::warn!(ino, "ending a size grant for a reader: {}", e.message);
        }
    }
}

/// Whether handle `handle` of `channel`'s connection holds the size grant on `ino`.
pub(super) fn holds_grant(fs: &Fs, ino: u64, channel: u32, handle: u64) -> bool {
    fs.grant_key(ino)
        .is_some_and(|k| key_channel(k) == channel && key_handle(k) == handle)
}

fn key_channel(k: u64) -> u32 {
    (k >> 36) as u32
}

fn key_slot(k: u64) -> usize {
    ((k >> 32) & 0xf) as usize
}

fn key_handle(k: u64) -> u64 {
    k & 0xffff_ffff
}

/// How much room past its end a file gets when it grows at its end through handle `h`: as
/// much again as it holds, within bounds, when it grew at its end before since it was opened
/// or when `h` reads as well as writes. Otherwise none: most files a program only writes are
/// written whole by one call (or appended to once per open) and closed, and their room would
/// only be given back; a file opened for reading and writing is one the program works in (a
/// database, its rollback journal, written a few bytes at a time), which grows again.
fn room_for(fs: &Fs, h: &Handle) -> u64 {
    if fs.size_read_by_others(h.ino) {
        // Its size is read through other handles: a grant would only end at their next stat.
        0
    } else if fs.grew_since_open(h.ino) || h.read {
        fs.size_now(h.ino).clamp(MIN_ROOM, MAX_ROOM)
    } else {
        0
    }
}

impl Manager {
    /// The extend of `[offset, offset + len)` of handle `handle` (`h`) asked on `channel`,
    /// with room ahead and a size grant when the channel wants them. `mapped` says the file
    /// has pages mapped (its size then grows only through the socket's calls).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn extend_with_room(
        &self,
        fs: &mut Fs,
        channel: Option<u32>,
        mapped: bool,
        h: &Handle,
        handle: u64,
        offset: u64,
        len: u64,
        max: usize,
    ) -> Result<(u64, Vec<Mapping>), Failure> {
        let slot = match channel {
            Some(c) if !mapped && h.write => self.size_slot(fs, c, handle),
            _ => None,
        };
        let ahead = match slot {
            Some(_) => room_for(fs, h),
            None => 0,
        };
        let holder = slot.and_then(|(channel, slot)| key(channel, slot, handle));
        let (size, maps, room) = fs
            .extend_ahead(h.ino, offset, len, ahead, holder, max)
            .map_err(failure)?;
        if let (Some((channel, slot)), true) = (slot, room > size) {
            self.grant(fs, channel, slot, h.ino, handle, room)?;
        }
        Ok((size, maps))
    }

    /// An open's reply as `FS_OPEN_ROOM` gives it (docs/abi.md §3.9): with room from offset
    /// 0 and a size grant over it when the file just opened is empty, holds no space, is read
    /// and written through the new handle and not mapped, and `channel` wants size leases and
    /// has a slot free. Also returns the room's mappings with the handle and the file's tag,
    /// for the caller to install records over. An open that gets no room (the file system
    /// cannot give it at once, say, with free space still to zero on the poller) still stands:
    /// the client extends later, as after a plain open.
    pub(super) fn opened_room(
        &self,
        fs: &mut Fs,
        s: &Session,
        channel: Option<u32>,
        mapped: impl FnOnce(u64) -> bool,
        reply: FsReply,
        max: usize,
    ) -> (FsReply, Option<(Handle, Vec<Mapping>, u64)>) {
        let FsReply::Opened {
            handle,
            rights,
            stat,
        } = reply
        else {
            return (reply, None);
        };
        let room = (|| {
            let h = *s.handles.get(&handle)?;
            if max == 0
                || !(h.read && h.write)
                || stat.size != 0
                || mapped(h.ino)
                || fs.size_read_by_others(h.ino)
            {
                return None;
            }
            let (channel, slot) = self.size_slot(fs, channel?, handle)?;
            let holder = key(channel, slot, handle)?;
            let (maps, end) = fs.room_at_open(h.ino, MIN_ROOM, holder, max).ok()?;
            if maps.is_empty() || end == 0 {
                return None;
            }
            if let Err(e) = self.grant(fs, channel, slot, h.ino, handle, end) {
                // The room stays the file's until its close frees it; the client extends.
                tracing::warn!(ino = h.ino, "granting room at open: {}", e.message);
                return None;
            }
            Some((h, maps, fs.layout_tag(h.ino)))
        })();
        // The room counts in the file's blocks.
        let stat = match &room {
            Some((h, _, _)) => wire_stat(&fs.stat_ino(h.ino)),
            None => stat,
        };
        let extents = room
            .as_ref()
            .map(|(_, maps, _)| wire_extents(maps))
            .unwrap_or_default();
        let file = room.as_ref().map_or(0, |r| r.2);
        (
            FsReply::OpenedRoom {
                handle,
                rights,
                stat,
                file,
                extents,
            },
            room,
        )
    }

    /// A slot of `channel`'s size-lease area for `handle`: the one it holds, or a free one;
    /// `None` when the channel does not want size leases or has no slot free.
    fn size_slot(&self, fs: &Fs, channel: u32, handle: u64) -> Option<(u32, usize)> {
        let refs = self.device.lease_area(channel)?;
        if refs.size_area().wanted.load(Ordering::Acquire) != SIZE_LEASE_WANTED {
            return None;
        }
        let mut used = [false; SIZE_LEASE_SLOTS];
        for k in fs.grant_keys() {
            if key_channel(k) == channel {
                if key_handle(k) == handle {
                    return Some((channel, key_slot(k)));
                }
                used[key_slot(k)] = true;
            }
        }
        let free = used.iter().position(|u| !u)?;
        Some((channel, free))
    }

    /// Grants `channel`'s slot `slot` to `handle` for `ino`, up to `limit` bytes.
    fn grant(
        &self,
        fs: &mut Fs,
        channel: u32,
        slot: usize,
        ino: u64,
        handle: u64,
        limit: u64,
    ) -> Result<(), Failure> {
        let (Some(refs), Some(key)) = (self.device.lease_area(channel), key(channel, slot, handle))
        else {
            return Ok(());
        };
        // The handle's grant ends first (a new room replaces it): its last size counts.
        if fs.grant_key(ino) == Some(key) {
            fs.end_grants(|k| k == key).map_err(failure)?;
        }
        let s = &refs.size_area().slots[slot];
        // A seqlock: odd while the words change, so a client never pairs one grant's handle
        // with another's limit.
        s.generation.fetch_add(1, Ordering::SeqCst);
        s.handle.store(handle, Ordering::SeqCst);
        s.limit.store(limit, Ordering::SeqCst);
        let generation = s.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let (read, end) = (refs.clone(), refs);
        let grant = SizeGrant {
            key,
            limit,
            published: Box::new(move || {
                let w = read.size_area().slots[slot]
                    .published
                    .load(Ordering::SeqCst);
                word_size(w, generation)
            }),
            end: Box::new(move || {
                let s = &end.size_area().slots[slot];
                s.limit.store(0, Ordering::SeqCst);
                s.generation.fetch_add(2, Ordering::SeqCst);
            }),
        };
        fs.grant_size(ino, grant).map_err(failure)
    }

    /// Ends the size grant of `handle` on `channel`, if it has one (the handle is closing).
    pub(super) fn end_size_grant(&self, fs: &mut Fs, channel: Option<u32>, handle: u64) {
        let Some(channel) = channel else {
            return;
        };
        if let Err(e) = fs.end_grants(|k| key_channel(k) == channel && key_handle(k) == handle) {
            tracing::warn!("ending a size grant: {e}");
        }
    }

    /// Ends every size grant of `channel` (it is closing; its id may be given again).
    pub(super) fn end_channel_grants(&self, fs: &mut Fs, channel: u32) {
        if let Err(e) = fs.end_grants(|k| key_channel(k) == channel) {
            tracing::warn!("ending a closing channel's size grants: {e}");
        }
    }
}
