//! `moneta`: the one command users type.

mod apps;
mod bench;
mod csvout;
mod daemon;
mod export;
mod fsbench;
mod image;
mod loopfs;
mod modelview;
mod mount;
mod report;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use libmoneta::{paths, Control};

/// Moneta: storage at memory speed, from user space, with protection.
#[derive(Parser)]
#[command(name = "moneta", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start monetad in the background on the default device (a backing file under the user's
    /// data directory) or the one given.
    Start {
        /// Control socket [default: $MONETA_SOCKET or the user's runtime directory].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Backing file of the array [default: $MONETA_DEVICE or
        /// ~/.local/share/moneta/device.img].
        #[arg(long, conflicts_with = "volatile")]
        device: Option<PathBuf>,
        /// Array size when creating the backing file (e.g. 1G) [default: 1G].
        #[arg(long)]
        size: Option<String>,
        /// Keep the array in memory only.
        #[arg(long)]
        volatile: bool,
        /// Further monetad options (see `monetad --help`), after `--`.
        #[arg(last = true)]
        extra: Vec<String>,
    },
    /// Stop monetad cleanly: requests in flight finish, the array is flushed.
    Stop {
        /// Control socket.
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Show the device's counters.
    Status {
        /// Control socket.
        #[arg(long)]
        socket: Option<PathBuf>,
        /// One JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure I/O paths against the kernel (see docs/performance.md).
    Bench(bench::BenchArgs),
    /// Format a device with nvfs (creating the backing file if missing).
    Mkfs(image::MkfsArgs),
    /// Check a device's file system offline; exit 0 clean, 1 repaired, 4 errors left, 8
    /// could not check.
    Fsck(image::FsckArgs),
    /// Measure Moneta against the kernel and write the papers' figures to an HTML page (see
    /// docs/performance.md).
    Report(report::ReportArgs),
    /// Run a program with the libmoneta shim preloaded: its files under the mount prefix
    /// (default /moneta) are Moneta files. Starts the daemon if none is running.
    Run(run::RunArgs),
    /// Mount nvfs through FUSE so every program sees its files (docs/mount.md); returns once
    /// the mount is live, its server in the background.
    Mount(mount::MountArgs),
    /// Unmount a `moneta mount` (also one whose server was killed).
    Umount(mount::UmountArgs),
    /// Serve a file (of nvfs, or of a --kernel-fs daemon's mount) or a range of a raw
    /// daemon's array as an NBD export through nbdkit, for any NBD client (qemu-img, nbdcopy,
    /// nbd-client; docs/export.md); prints its URI. In the background unless --foreground.
    Export(export::ExportArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A reader that stops early (`moneta status | head`) ends the output quietly, as it does
    // for other commands, rather than with a panic in `println!`. Not for `run`, whose
    // program gets the default anyway, nor `report`, which feeds applications through pipes
    // and must see a failed write as an error.
    if !matches!(cli.command, Cmd::Run(_) | Cmd::Report(_)) {
        // SAFETY: sets a signal's disposition to the default, before any thread exists.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let r = match cli.command {
        Cmd::Start {
            socket,
            device,
            size,
            volatile,
            extra,
        } => {
            let socket = socket.unwrap_or_else(paths::default_socket);
            let mut args = Vec::new();
            if volatile {
                args.push("--volatile".to_string());
            } else {
                args.push("--device".into());
                args.push(
                    device
                        .unwrap_or_else(paths::default_device)
                        .display()
                        .to_string(),
                );
            }
            if let Some(s) = size {
                args.push("--size".into());
                args.push(s);
            }
            args.extend(extra);
            let log = socket.with_extension("log");
            daemon::start(&socket, &args, &log).map(|s| {
                println!(
                    "monetad started: pid {}, socket {}, log {}",
                    s.pid,
                    s.socket.display(),
                    s.log.display()
                );
            })
        }
        Cmd::Stop { socket } => {
            let socket = socket.unwrap_or_else(paths::default_socket);
            daemon::stop(&socket).map(|()| println!("monetad stopped"))
        }
        Cmd::Status { socket, json } => {
            let socket = socket.unwrap_or_else(paths::default_socket);
            status(&socket, json)
        }
        Cmd::Bench(a) => bench::run(a).map(|_| ()),
        Cmd::Mkfs(a) => image::mkfs(a),
        Cmd::Fsck(a) => return image::fsck(a),
        Cmd::Run(a) => run::run(a),
        Cmd::Mount(a) => mount::mount(a),
        Cmd::Umount(a) => mount::umount(a),
        Cmd::Export(a) => export::export(a),
        Cmd::Report(a) => report::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moneta: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The kernel file system the daemon serves (`--kernel-fs`): its kind and mount point.
fn kernel_fs(c: &Control) -> Result<Option<(&'static str, String)>, String> {
    use moneta_abi::control::{ReplyBody, Request};
    use moneta_abi::kfsproto::{KfsReply, KfsRequest, FS_XFS};
    match c.call(&Request::Kfs(KfsRequest::Info)) {
        Ok((ReplyBody::Kfs(KfsReply::Info { kind, mount }), _)) => Ok(Some((
            if kind == FS_XFS { "xfs" } else { "ext4" },
            String::from_utf8_lossy(&mount).into_owned(),
        ))),
        Ok(_) => Err("the daemon answered KFS_INFO with another reply".into()),
        Err(libmoneta::ClientError::Refused {
            errno: libc::EOPNOTSUPP,
            ..
        }) => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

fn status(socket: &std::path::Path, json: bool) -> Result<(), String> {
    let c = Control::connect(socket).map_err(|e| e.to_string())?;
    let s = c.status().map_err(|e| e.to_string())?;
    let model = c.model().map_err(|e| e.to_string())?;
    let kernel_fs = kernel_fs(&c)?;
    let names = moneta_abi::control::StatusReport::NAMES;
    let values = s.values();
    if json {
        let mut map: serde_json::Map<String, serde_json::Value> = names
            .iter()
            .zip(values)
            .map(|(n, v)| (n.to_string(), v.into()))
            .collect();
        map.insert("model".into(), modelview::json(&model));
        if let Some((kind, mount)) = &kernel_fs {
            map.insert(
                "kernel_fs".into(),
                serde_json::json!({"kind": kind, "mount": mount}),
            );
        }
        println!("{}", serde_json::Value::Object(map));
        return Ok(());
    }
    println!("monetad at {}", socket.display());
    if let Some((kind, mount)) = &kernel_fs {
        println!("  serves {kind} on {mount} (--kernel-fs)");
    }
    for (n, v) in names.iter().zip(values) {
        println!("  {:<20} {v}", n.replace('_', " "));
    }
    print!("{}", modelview::text(&model));
    Ok(())
}
