//! The inodes the kernel knows through the mount, and the path of each.
//!
//! The kernel names files by inode number; the permission manager by path (it resolves every
//! path with the caller's credentials, which is what makes its checks those of a path walk).
//! So the server remembers, for each inode the kernel holds, the directory and name it was
//! last found under, and builds its path from them. Inode numbers are nvfs's own (its root is
//! 1, as FUSE's is). A name that goes (unlink, rmdir, rename over it) detaches the inode it
//! named: calls on it by inode then fail with `ENOENT` unless an open handle can answer.

use std::collections::HashMap;

/// FUSE's and nvfs's root directory.
pub const ROOT: u64 = 1;

/// Deepest path the server builds (nvfs's paths are at most 4095 bytes, so this is never
/// reached by a real one; it stops a loop among stale parents).
const MAX_DEPTH: usize = 2048;

struct Node {
    /// Directory and name it was last found under; `None` once that name went.
    at: Option<(u64, Vec<u8>)>,
    /// The kernel's references (lookups not yet forgotten).
    lookups: u64,
}

/// The table.
#[derive(Default)]
pub struct Nodes {
    nodes: HashMap<u64, Node>,
    names: HashMap<(u64, Vec<u8>), u64>,
}

/// Why an inode has no path.
#[derive(Debug, PartialEq, Eq)]
pub enum NoPath {
    /// The kernel asked about an inode the server does not know (or no longer knows).
    Unknown,
    /// Its name went, or one of its directories' did.
    Detached,
}

impl Nodes {
    /// `ino` was found as `name` in `parent`: one more kernel reference when `counted` (an
    /// entry reply), and `ino` is what that name means from now on.
    pub fn found(&mut self, parent: u64, name: &[u8], ino: u64, counted: bool) {
        if ino == ROOT {
            return;
        }
        let key = (parent, name.to_vec());
        if let Some(old) = self.names.insert(key.clone(), ino) {
            if old != ino {
                if let Some(n) = self.nodes.get_mut(&old) {
                    if n.at.as_ref() == Some(&key) {
                        n.at = None;
                    }
                }
            }
        }
        let n = self.nodes.entry(ino).or_insert(Node {
            at: None,
            lookups: 0,
        });
        if let Some(prev) = n.at.take() {
            if prev != key && self.names.get(&prev) == Some(&ino) {
                self.names.remove(&prev);
            }
        }
        n.at = Some(key);
        if counted {
            n.lookups += 1;
        }
    }

    /// The name `name` in `parent` went (unlink, rmdir, or another file renamed over it).
    pub fn gone(&mut self, parent: u64, name: &[u8]) {
        if let Some(ino) = self.names.remove(&(parent, name.to_vec())) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.at = None;
            }
        }
    }

    /// The file named `name` in `parent` is now `to_name` in `to_parent`.
    pub fn moved(&mut self, parent: u64, name: &[u8], to_parent: u64, to_name: &[u8]) {
        self.gone(to_parent, to_name);
        if let Some(ino) = self.names.remove(&(parent, name.to_vec())) {
            let key = (to_parent, to_name.to_vec());
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.at = Some(key.clone());
            }
            self.names.insert(key, ino);
        }
    }

    /// The kernel dropped `count` references to `ino`.
    pub fn forget(&mut self, ino: u64, count: u64) {
        let Some(n) = self.nodes.get_mut(&ino) else {
            return;
        };
        n.lookups = n.lookups.saturating_sub(count);
        if n.lookups == 0 {
            if let Some(at) = n.at.take() {
                if self.names.get(&at) == Some(&ino) {
                    self.names.remove(&at);
                }
            }
            self.nodes.remove(&ino);
        }
    }

    /// The path of `ino` inside nvfs.
    pub fn path(&self, ino: u64) -> Result<Vec<u8>, NoPath> {
        let mut parts: Vec<&[u8]> = Vec::new();
        let mut at = ino;
        while at != ROOT {
            let n = self.nodes.get(&at).ok_or(if at == ino {
                NoPath::Unknown
            } else {
                NoPath::Detached
            })?;
            let (parent, name) = n.at.as_ref().ok_or(NoPath::Detached)?;
            parts.push(name);
            at = *parent;
            if parts.len() > MAX_DEPTH {
                return Err(NoPath::Detached);
            }
        }
        if parts.is_empty() {
            return Ok(b"/".to_vec());
        }
        let mut p = Vec::new();
        for name in parts.iter().rev() {
            p.push(b'/');
            p.extend_from_slice(name);
        }
        Ok(p)
    }

    /// The path of `name` in directory `parent`.
    pub fn child(&self, parent: u64, name: &[u8]) -> Result<Vec<u8>, NoPath> {
        let mut p = self.path(parent)?;
        if p != b"/" {
            p.push(b'/');
        }
        p.extend_from_slice(name);
        Ok(p)
    }

    /// Inodes known (for tests and status).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_lookups_renames_and_removals() {
        let mut t = Nodes::default();
        assert_eq!(t.path(ROOT).unwrap(), b"/");
        assert_eq!(t.path(5), Err(NoPath::Unknown));
        t.found(ROOT, b"d", 5, true);
        t.found(5, b"f", 9, true);
        assert_eq!(t.path(9).unwrap(), b"/d/f");
        assert_eq!(t.child(ROOT, b"x").unwrap(), b"/x");
        assert_eq!(t.child(5, b"x").unwrap(), b"/d/x");
        // Rename over another file: that one is detached, the moved one follows.
        t.found(ROOT, b"g", 11, true);
        t.moved(5, b"f", ROOT, b"g");
        assert_eq!(t.path(9).unwrap(), b"/g");
        assert_eq!(t.path(11), Err(NoPath::Detached));
        // A hard link found under another name: the latest name is used.
        t.found(5, b"h", 9, true);
        assert_eq!(t.path(9).unwrap(), b"/d/h");
        t.gone(5, b"h");
        assert_eq!(t.path(9), Err(NoPath::Detached));
        // A moved directory takes its children along.
        t.found(5, b"k", 12, true);
        t.moved(ROOT, b"d", ROOT, b"e");
        assert_eq!(t.path(12).unwrap(), b"/e/k");
        // Forgetting drops the inode once every reference went.
        t.found(ROOT, b"e", 5, true);
        t.forget(5, 1);
        assert_eq!(t.path(12).unwrap(), b"/e/k");
        t.forget(5, 1);
        assert_eq!(t.path(12), Err(NoPath::Detached));
        t.forget(12, 1);
        t.forget(9, 2);
        t.forget(11, 1);
        assert_eq!(t.len(), 0);
        assert!(t.names.is_empty());
    }
}
