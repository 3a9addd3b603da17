//! `OP_FS_STATDIR`: the attributes of a directory's entries in one call. A client that keeps
//! answers (docs/abi.md §3.7) and stats one path after another in a directory (`git status`,
//! `ls -l`, `find`) asks for them all at once, and then answers the stats of the rest itself.
//!
//! Each entry's answer is what `OP_FS_STAT` of `dir/name` would answer, and it is watched so
//! that a client may keep it exactly as long as a stat's: its own inode in the entry's slot,
//! and everything else it depends on (the walk to the directory, and the directory's inode,
//! which every name added, removed or renamed in it changes) once, in the slot of the
//! directory's path. A client keeps an entry while both counters hold. One watch per entry,
//! where single stats would take two for each directory on the way: a tree of thousands of
//! files fits in the channel's bound.

use moneta_abi::fsproto::{entry_path, FsReply, FsStatEntry, Target};

use super::*;

/// Entries looked at in one call at most.
pub(super) const MOST_ENTRIES: usize = 1024;

/// Entries looked at in one call the poller answers itself: a few microseconds of its pass.
pub(super) const QUICK_ENTRIES: usize = 32;

/// The reply to `OP_FS_STATDIR` of `path` from `cookie` for `cred`, looking at `most` entries
/// at most, in at most `room` bytes of entries, with the answers watched for `channel` (none
/// without one).
#[allow(clippy::too_many_arguments)]
pub(super) fn stat_dir(
    fs: &mut Fs,
    cred: &Cred,
    channel: Option<u32>,
    path: &[u8],
    cookie: u64,
    follow: bool,
    most: usize,
    room: usize,
) -> Result<FsReply, Failure> {
    let most = most.min(room / FsReply::stat_entry_len(b"x")).max(1);
    let listed = fs
        .stat_entries(cred, path, follow, cookie, most)
        .map_err(failure)?;
    // What the channel may still have watched: the directory's dependencies, then one for
    // each entry.
    let watchable = match channel {
        Some(c) => {
            let left = fs.watch_room(c);
            if left < listed.seen.len() + 1 {
                return Err(fail(
                    errno::ENOBUFS,
                    "the channel has as many kept answers watched as it may",
                ));
            }
            left - listed.seen.len()
        }
        None => usize::MAX,
    };
    let mut used = 0;
    let mut entries = Vec::new();
    // The cookie after the last entry answered, or after everything looked at.
    let (mut next, mut end) = (listed.next, listed.end);
    let mut after = cookie;
    for (name, st, cont) in listed.entries {
        let full = entry_path(path, &name);
        let len = FsReply::stat_entry_len(&name);
        if used + len > room || entries.len() >= watchable {
            (next, end) = (after, false);
            break;
        }
        after = cont;
        if full.len() > PATH_MAX {
            // No stat could name it: nothing to keep.
            continue;
        }
        used += len;
        if let Some(c) = channel {
            let slot = moneta_abi::change_slot(&Target::Path { path: full, follow }) as u16;
            fs.watch(c, slot, &[st.ino]);
        }
        entries.push(FsStatEntry {
            name,
            stat: wire_stat(&st),
        });
    }
    if let Some(c) = channel {
        let slot = moneta_abi::change_slot(&Target::Path {
            path: path.to_vec(),
            follow: true,
        }) as u16;
        fs.watch(c, slot, &listed.seen);
    }
    Ok(FsReply::Stats { entries, next, end })
}
