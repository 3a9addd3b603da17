//! Who may do what: Linux's permission rules over an inode's owner, group and mode bits.

use super::*;

/// Who is asking: the client's credentials from the socket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cred {
    /// User.
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

impl Cred {
    /// Root.
    pub fn root() -> Cred {
        Cred::default()
    }

    /// Whether this is root.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// Whether `gid` is the primary or a supplementary group.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// Access bits asked for.
pub const MAY_READ: u32 = 4;
/// Write.
pub const MAY_WRITE: u32 = 2;
/// Execute / search.
pub const MAY_EXEC: u32 = 1;

/// Whether `cred` may access an inode with `want` (a mask of `MAY_*`).
pub fn may(n: &Inode, cred: &Cred, want: u32) -> bool {
    if cred.is_root() {
        // Root passes except for executing a file without any execute bit.
        return want & MAY_EXEC == 0 || n.is_dir() || n.mode & 0o111 != 0;
    }
    let bits = if cred.uid == n.uid {
        (n.mode >> 6) & 7
    } else if cred.in_group(n.gid) {
        (n.mode >> 3) & 7
    } else {
        n.mode & 7
    };
    bits & want == want
}

/// Linux's `fs.protected_symlinks` rule, which nvfs always applies: in a sticky
/// world-writable directory (a shared `/tmp`), a symbolic link is followed only by its owner,
/// or when the directory's owner owns the link too. Root is held to it as well: it is what
/// keeps a privileged program from following another user's planted link.
pub fn may_follow_link(dir: &Inode, link: &Inode, cred: &Cred) -> bool {
    cred.uid == link.uid || dir.mode & 0o1002 != 0o1002 || dir.uid == link.uid
}

/// Linux's `fs.protected_hardlinks` rule, which nvfs always applies: a hard link to a file is
/// made by its owner, by root (`CAP_FOWNER`), or by a user who may read and write it, and then
/// only to a regular file that is neither set-user-ID nor executable set-group-ID. Without it
/// a user could pin another user's private file in a directory of their own, which a later
/// `chown -R` of that directory by root would hand over.
pub fn may_link(n: &Inode, cred: &Cred) -> bool {
    if cred.is_root() || cred.uid == n.uid {
        return true;
    }
    n.is_reg()
        && n.mode & 0o4000 == 0
        && n.mode & 0o2010 != 0o2010
        && may(n, cred, MAY_READ | MAY_WRITE)
}

/// Linux's `fs.protected_regular` rule (level 1), which nvfs always applies: `O_CREAT` on a
/// regular file that already exists in a sticky world-writable directory opens it only when
/// the file belongs to the caller or to the directory's owner. Root too: a program creating
/// its file in `/tmp` must not open one another user placed there under the same name.
pub fn may_open_existing_in_sticky(dir: &Inode, n: &Inode, cred: &Cred) -> bool {
    !n.is_reg() || dir.mode & 0o1002 != 0o1002 || n.uid == dir.uid || n.uid == cred.uid
}
