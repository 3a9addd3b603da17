//! Where a client finds the daemon, and where the daemon keeps its array by default.
//!
//! Socket: `$MONETA_SOCKET`, else `$XDG_RUNTIME_DIR/moneta/monetad.sock`, else
//! `/tmp/moneta-$UID/monetad.sock`. Device: `$MONETA_DEVICE`, else
//! `$XDG_DATA_HOME/moneta/device.img`, else `$HOME/.local/share/moneta/device.img`.

use std::path::PathBuf;

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The directory that holds the daemon's socket and pid file.
pub fn runtime_dir() -> PathBuf {
    match env_path("XDG_RUNTIME_DIR") {
        Some(d) => d.join("moneta"),
        None => PathBuf::from(format!(
            "/tmp/moneta-{}",
            rustix::process::getuid().as_raw()
        )),
    }
}

/// The control socket clients connect to.
pub fn default_socket() -> PathBuf {
    env_path("MONETA_SOCKET").unwrap_or_else(|| runtime_dir().join("monetad.sock"))
}

/// The backing file of the default device.
pub fn default_device() -> PathBuf {
    env_path("MONETA_DEVICE").unwrap_or_else(|| {
        let data = env_path("XDG_DATA_HOME").unwrap_or_else(|| {
            env_path("HOME")
                .unwrap_or_else(|| PathBuf::from("/tmp"))
                .join(".local/share")
        });
        data.join("moneta").join("device.img")
    })
}
