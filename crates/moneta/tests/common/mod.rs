//! What the kernel-fs and export tests share: the built libraries beside the binaries, the
//! text of a failed command, and a byte pattern.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub mod hosts;

/// The directory of the binaries under test.
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_moneta"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The shared libraries the commands load (`libmoneta.so` for `moneta run`,
/// `libmoneta_nbd.so` for `moneta export`) and `monetad`, brought up to date once per test
/// process; returns the path of `file`. (`cargo test` leaves the shared libraries beside the
/// executables as the last `cargo build` made them, and a `cargo test` of this package alone
/// leaves `monetad` so too: either may be older than the tree.)
pub fn built(file: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    let dir = bin_dir();
    BUILT.get_or_init(|| {
        let mut c = Command::new(env!("CARGO"));
        c.args([
            "build",
            "--quiet",
            "-p",
            "libmoneta-c",
            "-p",
            "moneta-nbd",
            "-p",
            "monetad",
        ]);
        if dir.ends_with("release") {
            c.arg("--release");
        }
        assert!(
            c.status().unwrap().success(),
            "cargo build of the libraries"
        );
    });
    let path = dir.join(file);
    assert!(path.exists(), "{} missing", path.display());
    path
}

/// A command's status and output, for an assertion's message.
pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `len` bytes that differ with `seed` and along the buffer.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2] ^ seed)
        .collect()
}
