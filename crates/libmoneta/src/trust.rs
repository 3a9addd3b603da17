//! Which daemon a client trusts with its files.
//!
//! Whoever answers at the control socket sees every byte a client reads or writes and every
//! name it opens, so a client does not take the first process that answers. Before it
//! connects, every directory from the socket up to `/` must belong to a trusted user and be
//! writable by nobody else (unless it is sticky, as `/tmp` is, where others cannot remove or
//! replace what is not theirs), and the socket must belong to a trusted user; once connected,
//! the daemon's credentials (`SO_PEERCRED`) must name a trusted user. Trusted are the client's
//! own real and effective users, root, and the users listed in `MONETA_DAEMON_UID` (decimal
//! uids, separated by commas), for a daemon run under an account of its own. Without these
//! checks another user could create `/tmp/moneta-<uid>` first, run a daemon there and
//! capture everything the victim writes.

use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The environment variable naming further trusted daemon users.
pub const DAEMON_UID_VAR: &str = "MONETA_DAEMON_UID";

/// Why a socket or a daemon was not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct Untrusted {
    /// What is wrong and what to do.
    pub why: String,
}

/// The users a client trusts to run its daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    uids: Vec<u32>,
}

impl Trust {
    /// This process's users, root, and those `MONETA_DAEMON_UID` names. An unparsable value
    /// is an error rather than ignored: a user who named a daemon expects it to be the one.
    pub fn from_env() -> Result<Trust, Untrusted> {
        match std::env::var_os(DAEMON_UID_VAR).filter(|v| !v.is_empty()) {
            Some(v) => Trust::own().with_named(&v.to_string_lossy()),
            None => Ok(Trust::own()),
        }
    }

    /// Trusts the users in `list` too: decimal uids separated by commas.
    pub fn with_named(mut self, list: &str) -> Result<Trust, Untrusted> {
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let uid = part.parse::<u32>().map_err(|_| Untrusted {
                why: format!(
                    "{DAEMON_UID_VAR}={list}: `{part}` is not a decimal uid (e.g. `id -u USER`)"
                ),
            })?;
            self.add(uid);
        }
        Ok(self)
    }

    /// This process's real and effective users, and root.
    pub fn own() -> Trust {
        let mut t = Trust { uids: vec![0] };
        t.add(rustix::process::getuid().as_raw());
        t.add(rustix::process::geteuid().as_raw());
        t
    }

    /// Trusts `uid` too.
    pub fn add(&mut self, uid: u32) {
        if !self.uids.contains(&uid) {
            self.uids.push(uid);
        }
    }

    /// Whether `uid` is trusted.
    pub fn trusts(&self, uid: u32) -> bool {
        self.uids.contains(&uid)
    }

    fn hint(&self, uid: u32) -> String {
        format!(
            "if you mean to use a daemon run by uid {uid}, set {DAEMON_UID_VAR}={uid}; \
             otherwise set MONETA_SOCKET to a socket of your own daemon"
        )
    }

    /// Checks the socket file and every directory above it. Symbolic links on the way are
    /// resolved first, and each real directory is checked.
    pub fn check_path(&self, socket: &Path) -> Result<(), Untrusted> {
        let untrusted = |why: String| Untrusted { why };
        let name = socket.file_name().ok_or_else(|| {
            untrusted(format!("{} does not name a socket file", socket.display()))
        })?;
        let parent = match socket.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
            _ => PathBuf::from("."),
        };
        let dir = match std::fs::canonicalize(&parent) {
            Ok(d) => d,
            // Nothing can run there: connecting will say so.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(untrusted(format!(
                    "cannot reach the socket's directory {}: {e}",
                    parent.display()
                )))
            }
        };
        // A missing socket is the caller's to report (nothing runs there).
        if let Ok(m) = std::fs::symlink_metadata(dir.join(name)) {
            if !m.file_type().is_socket() {
                return Err(untrusted(format!("{} is not a socket", socket.display())));
            }
            if !self.trusts(m.uid()) {
                return Err(untrusted(format!(
                    "refusing the socket {}: it belongs to uid {}, not to you or root; {}",
                    socket.display(),
                    m.uid(),
                    self.hint(m.uid())
                )));
            }
        }
        for d in dir.ancestors() {
            let m = std::fs::metadata(d).map_err(|e| {
                untrusted(format!("cannot check the directory {}: {e}", d.display()))
            })?;
            if !self.trusts(m.uid()) {
                return Err(untrusted(format!(
                    "refusing the socket {}: the directory {} belongs to uid {}, not to you \
                     or root, so its owner could put any daemon there; {}",
                    socket.display(),
                    d.display(),
                    m.uid(),
                    self.hint(m.uid())
                )));
            }
            let sticky = m.mode() & 0o1000 != 0;
            if m.mode() & 0o022 != 0 && !sticky {
                return Err(untrusted(format!(
                    "refusing the socket {}: the directory {} (mode {:o}) is writable by \
                     others, who could replace the socket; make it private (chmod go-w)",
                    socket.display(),
                    d.display(),
                    m.mode() & 0o7777
                )));
            }
        }
        Ok(())
    }

    /// Checks the credentials of the daemon at the other end of a connected socket.
    pub fn check_peer(&self, fd: &impl AsFd, socket: &Path) -> Result<(), Untrusted> {
        let cred = peer_cred(fd).map_err(|e| Untrusted {
            why: format!(
                "cannot read the credentials of the daemon at {}: {e}",
                socket.display()
            ),
        })?;
        if self.trusts(cred.uid) {
            return Ok(());
        }
        Err(Untrusted {
            why: format!(
                "refusing the daemon at {}: it runs as uid {} (pid {}), not as you or root; {}",
                socket.display(),
                cred.uid,
                cred.pid,
                self.hint(cred.uid)
            ),
        })
    }
}

/// A socket peer's credentials as `SO_PEERCRED` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// Process id; 0 for a peer in another pid namespace.
    pub pid: i32,
    /// User.
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
}

/// Reads `SO_PEERCRED`. The pid may be 0 (a peer in another pid namespace), which typed
/// wrappers that hold a non-zero pid cannot represent, so this reads the raw structure.
pub fn peer_cred(fd: &impl AsFd) -> std::io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and `fd` is an open
    // descriptor for the duration of the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 || len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tmp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "moneta-trust-{tag}-{}-{}",
            std::process::id(),
            rand_tag()
        ));
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        p
    }

    fn rand_tag() -> u64 {
        use std::time::{SystemTime, UNIX_EPOCH};
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    }

    #[test]
    fn a_private_directory_passes_and_a_writable_one_does_not() {
        let t = Trust::own();
        let d = tmp("dir");
        assert_eq!(t.check_path(&d.join("monetad.sock")), Ok(()));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = t.check_path(&d.join("monetad.sock")).unwrap_err();
        assert!(e.why.contains("writable by others"), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(t.check_path(&d.join("monetad.sock")), Ok(()), "sticky");
        // A regular file where the socket should be.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(d.join("monetad.sock"), b"x").unwrap();
        let e = t.check_path(&d.join("monetad.sock")).unwrap_err();
        assert!(e.why.contains("not a socket"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_directory_of_an_untrusted_user_is_refused_unless_named() {
        let d = tmp("owner");
        let me = rustix::process::geteuid().as_raw();
        // Trusting nobody, the socket's own directory (ours) is the first refusal.
        let mut t = Trust { uids: vec![] };
        let e = t.check_path(&d.join("monetad.sock")).unwrap_err();
        assert!(e.why.contains(&format!("belongs to uid {me}")), "{e}");
        assert!(e.why.contains(&format!("MONETA_DAEMON_UID={me}")), "{e}");
        t.add(me);
        t.add(0);
        assert_eq!(t.check_path(&d.join("monetad.sock")), Ok(()));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_daemon_uid_variable_is_parsed_strictly() {
        let t = Trust::own().with_named("1234, 5678").unwrap();
        assert!(t.trusts(1234) && t.trusts(5678) && t.trusts(0));
        assert!(!t.trusts(4321));
        let e = Trust::own().with_named("1234,alice").unwrap_err();
        assert!(e.why.contains("`alice` is not a decimal uid"), "{e}");
    }
}
