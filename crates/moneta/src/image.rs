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
    /// Allocation unit: a power of two of at least 4K [default: 4K].
    #[arg(long, value_parser = monetad::config::parse_size)]
    pub chunk_size: Option<u64>,
    /// Inodes [default: one per 16 KiB of array, at least 1024].
    #[arg(long)]
    pub inodes: Option<u64>,
    /// Directory entries (names and symlink targets) [default: one and a half per inode].
    #[arg(long)]
    pub dirents: Option<u64>,
    /// Permission bits of the root directory, octal.
    #[arg(long, default_value = "755")]
    pub root_mode: String,
    /// Owner of the root directory as UID:GID [default: the caller].
    #[arg(long)]
    pub root_owner: Option<String>,
    /// Overwrite an existing file that holds a file system or any other data (without it, an
    /// existing file is formatted only if it holds no data at all).
    #[arg(long)]
    pub force: bool,
    /// Keep a CRC-32C of every 4 KiB data block (1 MiB of table per GiB), kept by the device
    /// on every write and checked on every read: a damaged block reads as an I/O error, not
    /// as data. `moneta fsck --data` checks them all.
    #[arg(long)]
    pub data_checksums: bool,
}

/// Options of `moneta fsck`.
#[derive(Args, Debug)]
pub struct FsckArgs {
    /// Backing file [default: $MONETA_DEVICE or ~/.local/share/moneta/device.img]. It must not
    /// be in use by a running monetad.
    pub device: Option<PathBuf>,
    /// Repair through the journal, in as many transactions as it takes, keeping data: damaged
    /// superblock or record copies are rewritten from the good ones, files left without a name
    /// go to /lost+found as #<inode>, chunks no file owns are kept there too unless they hold
    /// only zeros, and link counts, types and sizes are corrected. Without it the image is
    /// opened for reading only.
    #[arg(long)]
    pub repair: bool,
    /// Also check every data block of every file against its checksum (images made with
    /// `mkfs --data-checksums`) and list the files and offsets of those that fail.
    #[arg(long)]
    pub data: bool,
    /// List every finding, notes included.
    #[arg(long, short)]
    pub verbose: bool,
}

fn open(path: &Path, size: Option<u64>) -> Result<Arc<MappedArray>, String> {
    MappedArray::open_file(path, size)
        .map(Arc::new)
        .map_err(|e| e.to_string())
}

/// The options of `moneta mkfs`, checked before anything is opened or created.
fn mkfs_options(a: &MkfsArgs) -> Result<MkfsOptions, String> {
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
    let chunk_size = a.chunk_size.unwrap_or(moneta_fs::layout::DEFAULT_CHUNK);
    if !chunk_size.is_power_of_two() || chunk_size < 4096 {
        return Err(format!(
            "chunk size {chunk_size} is not a power of two of at least 4K"
        ));
    }
    if let Some(size) = a.size {
        if size < 4096 || !size.is_multiple_of(4096) {
            return Err(format!(
                "size {size} is not a multiple of 4K of at least 4K"
            ));
        }
    }
    Ok(MkfsOptions {
        chunk_size,
        inode_count: a.inodes,
        dirent_count: a.dirents,
        root_uid: uid,
        root_gid: gid,
        root_mode: mode,
        data_checksums: a.data_checksums,
    })
}

/// Formats a device. An existing file is formatted only if it holds nvfs already and
/// `--force` is given, or holds no data at all (a file of holes); anything else at the path is
/// someone's data and is left alone. A file this call created is removed again if formatting
/// fails.
pub fn mkfs(a: MkfsArgs) -> Result<(), String> {
    let path = a
        .device
        .clone()
        .unwrap_or_else(libmoneta::paths::default_device);
    let o = mkfs_options(&a)?;
    let exists = std::fs::symlink_metadata(&path).is_ok();
    if exists {
        if !std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            return Err(format!("{} is not a regular file", path.display()));
        }
        let holds_nvfs = {
            let ro = MappedArray::open_read_only(&path).map_err(|e| e.to_string())?;
            !matches!(
                moneta_fs::tables::load(&ro),
                Err(moneta_fs::FormatError::NotFormatted)
            )
        };
        let has_data = MappedArray::has_data(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if !a.force && holds_nvfs {
            return Err(format!(
                "{} already holds an nvfs file system; add --force to overwrite it",
                path.display()
            ));
        }
        if !a.force && has_data {
            return Err(format!(
                "{} exists and holds data that is not an nvfs file system; formatting would \
                 destroy it: pick another path, or add --force if it really is to be overwritten",
                path.display()
            ));
        }
    }
    let size = if exists {
        a.size
    } else {
        Some(a.size.unwrap_or(monetad::config::DEFAULT_SIZE))
    };
    let made = |r: Result<(), String>| {
        if r.is_err() && !exists {
            let _ = std::fs::remove_file(&path);
        }
        r
    };
    let media = match open(&path, size) {
        Ok(m) => m,
        Err(e) => return made(Err(e)),
    };
    let g = match moneta_fs::mkfs(&*media, &o) {
        Ok(g) => g,
        Err(e) => return made(Err(e.to_string())),
    };
    println!(
        "nvfs on {}: {} bytes, {} chunks of {} bytes, {} inodes, {} directory entries, {} bytes of metadata{}",
        path.display(),
        media.size(),
        g.chunk_count,
        g.chunk_size,
        g.inode_count,
        g.dirent_count,
        g.metadata_bytes(),
        if g.data_checksums() {
            ", data checksums"
        } else {
            ""
        }
    );
    Ok(())
}

/// Checks (and repairs) a device. Exit status as e2fsck: 0 clean, 1 errors corrected, 4
/// errors left uncorrected, 8 could not check.
pub fn fsck(a: FsckArgs) -> ExitCode {
    let path = a.device.unwrap_or_else(libmoneta::paths::default_device);
    // Only a repair writes: a check opens the image for reading and changes nothing.
    let opened = if a.repair {
        open(&path, None)
    } else {
        MappedArray::open_read_only(&path)
            .map(Arc::new)
            .map_err(|e| e.to_string())
    };
    let media = match opened {
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
    // Pages of mapped files a killed daemon left: the image alone lacks their latest bytes
    // until a daemon starts on it and folds them back.
    let mut pages = path.clone().into_os_string();
    pages.push(".pages");
    let left = std::fs::read_dir(&pages).map_or(0, |d| d.count());
    if left > 0 {
        println!(
            "  note: {} holds the pages of files that were mapped when the daemon stopped \
             without folding them back; a daemon started on this image folds them in",
            std::path::Path::new(&pages).display()
        );
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
    // Data blocks, after any repair (a block's file may have gone to /lost+found).
    let bad_data = if a.data {
        match moneta_fs::check_data(&*media) {
            Ok(Some(bad)) => {
                for b in &bad {
                    let file = match &b.path {
                        Some(p) => format!("{p} (inode {})", b.ino),
                        None => format!("inode {}", b.ino),
                    };
                    println!(
                        "  error: {file}: the 4 KiB block at offset {} does not match its \
                         checksum (array address {:#x})",
                        b.offset, b.addr
                    );
                }
                println!("data: {} damaged blocks", bad.len());
                bad.len()
            }
            Ok(None) => {
                println!("data: the image keeps no data checksums (mkfs --data-checksums)");
                0
            }
            Err(e) => {
                eprintln!("moneta fsck: {}: {e}", path.display());
                return ExitCode::from(8);
            }
        }
    } else {
        0
    };
    let data_left = if bad_data > 0 {
        println!(
            "damaged data blocks are not repaired (there is no second copy): restore those \
             files, or rewrite the blocks whole"
        );
        ExitCode::from(4)
    } else {
        ExitCode::SUCCESS
    };
    match &out.after {
        None if r.errors() == 0 => {
            if bad_data == 0 {
                println!("clean");
            }
            data_left
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
            if after.errors() == 0 && bad_data == 0 {
                ExitCode::from(1)
            } else {
                ExitCode::from(4)
            }
        }
    }
}
