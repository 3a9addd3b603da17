//! One nvfs shared by the members of a distributed device (paper 003, "Distributed storage";
//! docs/distributed.md, "One file system on every host").
//!
//! One daemon, the *manager's host*, holds the file system on its array and runs its
//! permission manager for every host (`monetad --share-listen`, [`Holder`]). The daemons of the
//! other hosts (`monetad --share-from`, [`Member`]) reach that array's bytes as a range of their
//! address space (`--member`, over NBD) and its manager over an authenticated link of their own
//! ([`link`]):
//!
//! - a client on a member host makes its file-system calls to its own daemon, which asks the
//!   manager with the client's credentials (each client connection is a session of its own at
//!   the manager, on its own connection) and passes the answer back;
//! - the extents a lookup or an extend answers are installed by the member in the client's
//!   channel with the rights of the client's open handles, so reads and writes go from the
//!   member's device straight to the array, checked by the member's permission table;
//! - before the manager reuses space (truncate, unlink, rename over a file), it revokes the
//!   space on every member as on its own device, and waits until each has removed every
//!   record over it and seen every command issued before complete;
//! - a member that loses the manager fences itself: it removes every record over the shared
//!   ranges, so nothing it holds outlives the manager's view of it.
//!
//! The members' frames: a member's first frame says what its connection is ([`Hello`]); on a
//! member's own connection the two exchange [`Note`]s; on a session's, the member sends control
//! requests as a client sends them on the Unix socket (docs/abi.md §2) and the manager answers
//! each with the count of revocations it had made before the answer was decided and the reply.

mod holder;
pub mod link;
mod member;

use std::time::Duration;

pub use holder::Holder;
pub use member::{Member, Proxy};

/// A member fences itself once no ping it sent this long ago or later has been answered; the
/// manager's host counts a member silent this long as gone.
pub const LEASE: Duration = Duration::from_secs(2);
/// How often a member asks whether the manager's host is there.
pub const PING_EVERY: Duration = Duration::from_millis(500);
/// Added to every bound the two sides compute from each other's settings.
pub const MARGIN: Duration = Duration::from_secs(2);

/// How long after its last word a gone member is surely fenced: the lease it counts from a
/// ping sent before that word, then its fence, which waits for the commands it has in flight
/// (each at most `fence`, the longest `--member-timeout-ms` it declared), and a margin.
pub fn fenced_after(fence: Duration) -> Duration {
    LEASE + fence + MARGIN
}

/// How long a revocation waits for a member that still speaks but has not answered before the
/// manager's host cuts it off: applying a revocation waits for the member's commands in flight.
pub fn ack_wait(fence: Duration) -> Duration {
    fence + MARGIN
}

/// What a connection to the manager's host is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A member host's own connection (revocations, liveness), named by a number the member
    /// draws anew for each.
    Member {
        /// The connection's name.
        id: u64,
        /// The longest a command of the member's waits for the manager's array (its
        /// `--member-timeout-ms`), in milliseconds: what its fence may wait for.
        fence_ms: u64,
    },
    /// One client connection of a member host.
    Session {
        /// The member's own connection this session lives and dies with.
        member: u64,
        /// The client's user.
        uid: u32,
        /// Its group.
        gid: u32,
        /// Its process id on its host.
        pid: i32,
        /// Its supplementary groups.
        groups: Vec<u32>,
    },
}

/// Most supplementary groups a session may name (the kernel's `NGROUPS_MAX`).
const MAX_GROUPS: usize = 65536;

impl Hello {
    /// The frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Hello::Member { id, fence_ms } => {
                b.push(1);
                b.extend_from_slice(&id.to_le_bytes());
                b.extend_from_slice(&fence_ms.to_le_bytes());
            }
            Hello::Session {
                member,
                uid,
                gid,
                pid,
                groups,
            } => {
                b.push(2);
                b.extend_from_slice(&member.to_le_bytes());
                b.extend_from_slice(&uid.to_le_bytes());
                b.extend_from_slice(&gid.to_le_bytes());
                b.extend_from_slice(&pid.to_le_bytes());
                b.extend_from_slice(&(groups.len() as u32).to_le_bytes());
                for g in groups {
                    b.extend_from_slice(&g.to_le_bytes());
                }
            }
        }
        b
    }

    /// Reads a frame; `None` if it is not a hello.
    pub fn decode(b: &[u8]) -> Option<Hello> {
        let mut r = Fields(b);
        match r.u8()? {
            1 => {
                let id = r.u64()?;
                let fence_ms = r.u64()?;
                r.end()?;
                Some(Hello::Member { id, fence_ms })
            }
            2 => {
                let member = r.u64()?;
                let uid = r.u32()?;
                let gid = r.u32()?;
                let pid = r.u32()? as i32;
                let n = r.u32()? as usize;
                if n > MAX_GROUPS {
                    return None;
                }
                let groups = (0..n).map(|_| r.u32()).collect::<Option<Vec<_>>>()?;
                r.end()?;
                Some(Hello::Session {
                    member,
                    uid,
                    gid,
                    pid,
                    groups,
                })
            }
            _ => None,
        }
    }
}

/// What the manager's host and a member say on the member's own connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The manager's host, first: the member is registered; its array is `array_size` bytes
    /// at `[0, array_size)` of the address space.
    Welcome {
        /// The manager's array.
        array_size: u64,
    },
    /// The member: are you there? (Numbered: the answer says which ping it answers.)
    Ping {
        /// The ping's number.
        n: u64,
    },
    /// The manager's host: yes, to ping `n`.
    Pong {
        /// The ping's number.
        n: u64,
    },
    /// The manager's host: remove every record over these ranges (start, length), and answer
    /// once every command issued before has completed.
    Revoke {
        /// The revocation's number (they only grow).
        seq: u64,
        /// The ranges.
        ranges: Vec<(u64, u64)>,
    },
    /// The member: revocation `seq` is done. `failed`: since its last answer it gave up on a
    /// write it forwarded while the write may have been on its way (its connection broke or did
    /// not answer in time), so the write may yet reach the array (NBD cannot take one back), and
    /// the manager's host cuts the members' export connections off before the space is reused.
    Ack {
        /// Its number.
        seq: u64,
        /// A forwarded write was given up on meanwhile.
        failed: bool,
    },
    /// The member: no process of its host can claim fork bundle `bundle` any more (its pipe
    /// hung up there), so the manager's host may let it go.
    Release {
        /// The bundle.
        bundle: u64,
    },
}

impl Note {
    /// The frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        match self {
            Note::Ping { n } => {
                b.push(1);
                b.extend_from_slice(&n.to_le_bytes());
            }
            Note::Pong { n } => {
                b.push(2);
                b.extend_from_slice(&n.to_le_bytes());
            }
            Note::Welcome { array_size } => {
                b.push(6);
                b.extend_from_slice(&array_size.to_le_bytes());
            }
            Note::Revoke { seq, ranges } => {
                b.push(3);
                b.extend_from_slice(&seq.to_le_bytes());
                b.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
                for (s, l) in ranges {
                    b.extend_from_slice(&s.to_le_bytes());
                    b.extend_from_slice(&l.to_le_bytes());
                }
            }
            Note::Ack { seq, failed } => {
                b.push(4);
                b.extend_from_slice(&seq.to_le_bytes());
                b.push(u8::from(*failed));
            }
            Note::Release { bundle } => {
                b.push(5);
                b.extend_from_slice(&bundle.to_le_bytes());
            }
        }
        b
    }

    /// Reads a frame; `None` if it is not a note.
    pub fn decode(b: &[u8]) -> Option<Note> {
        let mut r = Fields(b);
        let n = match r.u8()? {
            1 => Note::Ping { n: r.u64()? },
            2 => Note::Pong { n: r.u64()? },
            6 => Note::Welcome {
                array_size: r.u64()?,
            },
            3 => {
                let seq = r.u64()?;
                let n = r.u32()? as usize;
                if n > link::MAX_FRAME / 16 {
                    return None;
                }
                let ranges = (0..n)
                    .map(|_| Some((r.u64()?, r.u64()?)))
                    .collect::<Option<Vec<_>>>()?;
                Note::Revoke { seq, ranges }
            }
            4 => Note::Ack {
                seq: r.u64()?,
                failed: match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return None,
                },
            },
            5 => Note::Release { bundle: r.u64()? },
            _ => return None,
        };
        r.end()?;
        Some(n)
    }
}

/// Little-endian fields read one after another.
struct Fields<'a>(&'a [u8]);

impl Fields<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (h, t) = self.0.split_first_chunk::<N>()?;
        self.0 = t;
        Some(*h)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take()?))
    }
    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_read_back_and_malformed_ones_are_refused() {
        let hellos = [
            Hello::Member {
                id: 7,
                fence_ms: 5000,
            },
            Hello::Session {
                member: 7,
                uid: 1000,
                gid: 100,
                pid: -1,
                groups: vec![1, 2, 3],
            },
        ];
        for h in hellos {
            let b = h.encode();
            assert_eq!(Hello::decode(&b), Some(h));
            assert_eq!(Hello::decode(&b[..b.len() - 1]), None);
            let mut longer = b.clone();
            longer.push(0);
            assert_eq!(Hello::decode(&longer), None);
        }
        let notes = [
            Note::Ping { n: 1 },
            Note::Pong { n: 1 },
            Note::Welcome {
                array_size: 1 << 30,
            },
            Note::Ack {
                seq: 9,
                failed: true,
            },
            Note::Release { bundle: 12 },
            Note::Revoke {
                seq: 3,
                ranges: vec![(4096, 8192), (1 << 40, 1)],
            },
        ];
        for n in notes {
            let b = n.encode();
            assert_eq!(Note::decode(&b), Some(n));
            assert_eq!(Note::decode(&b[..b.len() - 1]), None);
        }
        assert_eq!(Note::decode(&[9]), None);
        assert_eq!(Note::decode(&[1]), None);
        assert_eq!(Note::decode(&[]), None);
        // A count of ranges that no frame could hold.
        let mut huge = vec![3];
        huge.extend_from_slice(&1u64.to_le_bytes());
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Note::decode(&huge), None);
    }
}
