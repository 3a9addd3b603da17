//! `moneta mkfs` and `moneta fsck`: formatting and checking an nvfs image offline.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use moneta_device::{MappedArray, Media};
use moneta_fs::{MkfsOptions, Severity};

/// Options of `moneta mkfs`.
#[derive(Args, Debug)]
pub struct MkfsArgs {
    /// Backing file [default: $MONETA_DEVICE or ~/.local/share/moneta/device.img]; created if
    /// missing.
    pub device: Option<PathBuf>,
    /// Array size when creating the file (e.g. 4G) [default: 1G].
    #[arg(long, value_parser = monetad::config::parse_size)]
    pub size: Option<u64>,
    /// Allocation unit: a power of two of at least 4K [default: 1M].
    #[arg(long, value_parser = monetad::config::parse_size)]
    pub chunk_size: Option<u64>,
    /// Inodes [default: one per 64 KiB of array, at least 1024].
    #[arg(long)]
    pub inodes: Option<u64>,
    /// Directory entries (names and symlink targets) [default: twice the inodes].
    #[arg(long)]
    pub dirents: Option<u64>,
    /// Permission bits of the root directory, octal [default: 755].
    #[arg(long, default_value = "755")]
    pub root_mode: String,
    /// Owner of the root directory as UID:GID [default: the caller].
    #[arg(long)]
    pub root_owner: Option<String>,
    /// Overwrite an image that already holds a file system.
    #[arg(long)]
    pub force: bool,
}

/// Options of `moneta fsck`.
#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Backing file [default: $MONETA_DEVICE or ~/.local/share/moneta/device.img]. It must not
    /// be in use by a running monetad.
    pub device: Option<PathBuf>,
    /// Make the safe repairs (leaked or unmarked chunks, link counts, orphans, dangling
    /// entries) through the journal.
    #[arg(long)]
    pub repair: bool,
    /// List every finding, notes included.
    #[arg(long, short)]
    pub verbose: bool,
}

fn open(path: &Path, size: Option<u64>) -> Result<Arc<MappedArray>, String> {
    MappedArray::open_file(path, size)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// Formats a device.
pub fn mkfs(a: MkfsArgs) -> Result<(), String> {
    let path = a.device.unwrap_or_else(libmoneta::paths::default_device);
    let size = if path.exists() {
        a.size
    } else {
        Some(a.size.unwrap_or(monetad::config::DEFAULT_SIZE))
    };
    let media = open(&path, size)?;
    if !a.force {
        match moneta_fs::tables::load(&*media) {
            Err(moneta_fs::FormatError::NotFormatted) => {}
            _ => {
                return Err(format!(
                    "{} already holds an nvfs file system; add --force to overwrite it",
                    path.display()
                ))
            }
        }
    }
    let mode = u32::from_str_radix(&a.root_mode, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("root mode `{}` is not octal permission bits", a.root_mode))?;
    let (uid, gid) = match &a.root_owner {
        Some(s) => {
            let (u, g) = s
                .split_once(':')
                .ok_or_else(|| format!("root owner `{s}` is not UID:GID"))?;
            (
                u.parse().map_err(|_| format!("bad uid `{u}`"))?,
                g.parse().map_err(|_| format!("bad gid `{g}`"))?,
            )
        }
        None => (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        ),
    };
    let o = MkfsOptions {
        chunk_size: a.chunk_size.unwrap_or(moneta_fs::layout::DEFAULT_CHUNK),
        inode_count: a.inodes,
        dirent_count: a.dirents,
        root_uid: uid,
        root_gid: gid,
        root_mode: mode,
    };
    let g = moneta_fs::mkfs(&*media, &o).map_err(|e| e.to_string())?;
    println!(
        "nvfs on {}: {} bytes, {} chunks of {} bytes, {} inodes, {} directory entries, {} bytes of metadata",
        path.display(),
        media.size(),
        g.chunk_count,
        g.chunk_size,
        g.inode_count,
        g.dirent_count,
        g.metadata_bytes()
    );
    Ok(())
}

/// Checks (and repairs) a device. Exit status as e2fsck: 0 clean, 1 errors corrected, 4
/// errors left uncorrected, 8 could not check.
pub fn fsck(a: FsckArgs) -> ExitCode {
    let path = a.device.unwrap_or_else(libmoneta::paths::default_device);
    let media = match open(&path, None) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("moneta fsck: {e}");
            return ExitCode::from(8);
        }
    };
    let out = match moneta_fs::fsck(&*media, a.repair) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("moneta fsck: {}: {e}", path.display());
            return ExitCode::from(8);
        }
    };
    let r = &out.before;
    println!(
        "{}: nvfs, {} inodes in use ({} directories, {} files, {} symlinks), {} of {} chunks in use",
        path.display(),
        r.inodes_used,
        r.directories,
        r.files,
        r.symlinks,
        r.chunks_used,
        r.chunks
    );
    if out.replayed {
        println!("the journal's last change was laid over the tables");
    }
    for p in &r.problems {
        if a.verbose || p.severity == Severity::Error {
            println!("  {p}");
        }
    }
    let notes = r.problems.len() - r.errors();
    if notes > 0 && !a.verbose {
        println!(
            "  ({notes} notes: files unlinked while open, freed at the next mount; -v lists them)"
        );
    }
    match &out.after {
        None if r.errors() == 0 => {
            println!("clean");
            ExitCode::SUCCESS
        }
        None => {
            let fixable = r.problems.iter().filter(|p| p.fix.is_some()).count();
            println!("{} errors ({fixable} repairable with --repair)", r.errors());
            ExitCode::from(4)
        }
        Some(after) => {
            println!("repaired {} findings", out.repaired.len());
            for p in &after.problems {
                if p.severity == Severity::Error {
                    println!("  still: {p}");
                }
            }
            if after.errors() == 0 {
                ExitCode::from(1)
            } else {
                ExitCode::from(4)
            }
        }
    }
}
