//! The daemon's settings: command-line flags over an optional TOML file over defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use moneta_device::model::ModelConfig;
use moneta_device::{DeviceConfig, DmaGeometry, Timing};
use moneta_fs::Durability;
use serde::Deserialize;

/// Default array size for a new backing file: 1 GiB (its blocks reserved up front).
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// Parses sizes such as `4096`, `64K`, `16M`, `1G`, `2T` (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = s[i..].to_ascii_uppercase();
            let m: u64 = match unit.trim_end_matches("IB").trim_end_matches('B') {
                "" => 1,
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                "T" => 1 << 40,
                _ => return Err(format!("unknown size unit in `{s}`")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size (e.g. 4096, 64K, 16M, 1G)"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

/// Where the poller runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollerCpu {
    /// The last allowed CPU when there are two or more.
    Auto,
    /// Left to the scheduler.
    Unpinned,
    /// This CPU.
    Cpu(usize),
}

impl PollerCpu {
    /// The CPU to pin to, if any.
    pub fn resolve(self) -> Option<usize> {
        match self {
            PollerCpu::Auto => moneta_device::default_poller_cpu(),
            PollerCpu::Unpinned => None,
            PollerCpu::Cpu(c) => Some(c),
        }
    }
}

/// Parses `auto`, `none` or a CPU number.
pub fn parse_poller_cpu(s: &str) -> Result<PollerCpu, String> {
    match s.trim() {
        "auto" => Ok(PollerCpu::Auto),
        "none" => Ok(PollerCpu::Unpinned),
        n => n
            .parse()
            .map(PollerCpu::Cpu)
            .map_err(|_| format!("poller CPU `{s}` is not a CPU number, `auto` or `none`")),
    }
}

/// `monetad`: the Moneta device daemon.
///
/// Serves an emulated NVM array to client processes through per-process channels in shared
/// memory, checking an extent permission table on every request. Every option can also be set
/// in the TOML file given with --config (same names, with underscores; `merge = false` for
/// --no-merge); flags win.
#[derive(Parser, Debug, Default, Clone)]
#[command(name = "monetad", version)]
pub struct Args {
    /// TOML configuration file.
    #[arg(long, env = "MONETAD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Control socket path [default: $MONETA_SOCKET, $XDG_RUNTIME_DIR/moneta/monetad.sock or
    /// /tmp/moneta-$UID/monetad.sock].
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Backing file of the array (created if missing) [default: $MONETA_DEVICE or
    /// ~/.local/share/moneta/device.img].
    #[arg(long, conflicts_with = "volatile")]
    pub device: Option<PathBuf>,
    /// Keep the array in a memfd: fast, gone when the daemon exits.
    #[arg(long)]
    pub volatile: bool,
    /// Array size when creating it (e.g. 1G). An existing backing file must match if given.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Most channels open at once [default: 1024].
    #[arg(long)]
    pub max_channels: Option<usize>,
    /// Physical tags shared by all channels [default: 64].
    #[arg(long)]
    pub phys_tags: Option<usize>,
    /// Permission table entries [default: 16384].
    #[arg(long)]
    pub table_entries: Option<usize>,
    /// Do not merge adjacent permission records.
    #[arg(long)]
    pub no_merge: bool,
    /// DMA buffer per channel; must be 64 slices [default: 1M].
    #[arg(long, value_parser = parse_size)]
    pub dma_size: Option<u64>,
    /// DMA slice per tag [default: 16K].
    #[arg(long, value_parser = parse_size)]
    pub slice_size: Option<u64>,
    /// Microseconds a channel's doorbell must stay quiet before it is parked and, when all are,
    /// the poller sleeps [default: 200].
    #[arg(long)]
    pub park_after_us: Option<u64>,
    /// Nanoseconds added to every read by the media model [default: 0].
    #[arg(long)]
    pub read_latency_ns: Option<u64>,
    /// Nanoseconds added to every write by the media model [default: 0].
    #[arg(long)]
    pub write_latency_ns: Option<u64>,
    /// Serve the array as a raw device, without a file system (administrative grants only).
    #[arg(long)]
    pub raw: bool,
    /// Put a kernel file system on the array instead of nvfs (root only): `ext4` or `xfs`. The
    /// array is attached to a loop device, formatted if it is new (a volatile array, or a
    /// backing file this start creates) and mounted on --kernel-fs-mount; clients open its
    /// files through the kernel and read and write them through their channels
    /// (docs/kernelfs.md).
    #[arg(long, value_parser = crate::kernelfs::Kind::parse, conflicts_with = "raw")]
    pub kernel_fs: Option<crate::kernelfs::Kind>,
    /// Where --kernel-fs mounts its file system [default: beside the socket, with the
    /// extension `.mnt`].
    #[arg(long)]
    pub kernel_fs_mount: Option<PathBuf>,
    /// Time every read and write stage by stage (queueing, permission check, data movement,
    /// media latency) into the status counters `traced` and `trace_*_ns`: a few clock reads per
    /// command, for latency breakdowns.
    #[arg(long)]
    pub trace: bool,
    /// Allocation unit of the file system made on a new array (a power of two, at least 4K)
    /// [default: 4K].
    #[arg(long, value_parser = parse_size)]
    pub chunk_size: Option<u64>,
    /// What a completed call and `fsync` make durable (docs/nvfs.md, "Durability levels"):
    /// `device`, the array's own persistence (everything survives the daemon; `fsync` costs a
    /// round trip; a crash of the machine may lose what the host has not written back) or
    /// `host` (metadata reaches the host's disk in an order that survives a crash of the
    /// machine, and `fsync` makes a file and every metadata change before it durable there,
    /// with one ordered flush). A volatile array has only `device` [default: host with a
    /// backing file, device with --volatile].
    #[arg(long, value_parser = Durability::parse)]
    pub durability: Option<Durability>,
    /// Bytes a file growing at its end keeps reserved after its last chunk (in memory, given
    /// back at its last close), so that files appended side by side stay in one extent each;
    /// 0 keeps none [default: 1M].
    #[arg(long, value_parser = parse_size)]
    pub append_reserve: Option<u64>,
    /// A test hook: copy every range flushed to the host's disk into this file as well, so a
    /// test can make the image a crash of the machine would leave.
    #[arg(long, hide = true)]
    pub durable_shadow: Option<PathBuf>,
    /// Make the file system on a new array with data checksums (`moneta mkfs
    /// --data-checksums`). An existing image keeps what it was made with.
    #[arg(long)]
    pub data_checksums: bool,
    /// The CPU the device's poller runs on: a number, `auto` (the last CPU the daemon may run
    /// on, when it may run on two or more) or `none` (wherever the scheduler puts it). A pinned
    /// poller has its CPU to itself: the daemon's other threads run elsewhere, channels name
    /// the CPU, and libmoneta moves its clients' threads off it (unless they set
    /// MONETA_AFFINITY=any) [default: none].
    #[arg(long, value_parser = parse_poller_cpu)]
    pub poller_cpu: Option<PollerCpu>,
    /// Mode bits of the control socket, octal [default: 600: only the daemon's user (and
    /// root) may connect]. To serve other users, give 666 and put the socket in a directory
    /// they can search (clients then check the daemon, see docs/abi.md §2.1).
    #[arg(long)]
    pub socket_mode: Option<String>,
    /// Channels one user other than the daemon's own and root may hold at once, so that no
    /// user can take them all [default: half of --max-channels].
    #[arg(long)]
    pub user_channels: Option<usize>,
    /// Connections one user other than the daemon's own and root may hold at once
    /// [default: --user-channels plus 16].
    #[arg(long)]
    pub user_connections: Option<usize>,
    /// Permission records the channels of one user other than the daemon's own and root may
    /// hold together; past it, the user's own records make room for its new ones
    /// [default: half of --table-entries].
    #[arg(long)]
    pub user_records: Option<usize>,
    /// The array's timing and power model (Moneta §II): `none` (requests complete as fast as
    /// the host moves their data), or a preset: `pcm` (the paper's array: 48/150 ns PCM, four
    /// controllers, 2 GB/s link), `dram`, `slow-nvm` (1/4 µs), `flash-like` (25/200 µs).
    /// A `[model]` table in the TOML file defines one parameter by parameter
    /// (docs/model.md) [default: none].
    #[arg(long)]
    pub model: Option<String>,
    /// Sets one parameter of the model, NAME=VALUE (repeatable; e.g. `controllers=8`,
    /// `policy=fifo`, `read_ns=1000`); `moneta status` lists them all.
    #[arg(long = "model-set", value_name = "NAME=VALUE")]
    pub model_set: Vec<String>,
    /// A range of the address space another member holds, START:LEN=URI (repeatable; needs
    /// --raw): commands on `[START, START+LEN)` go over an NBD link to the member's export at
    /// URI, address START there being 0. The ranges lie apart from the array and from each
    /// other. `nbds://` with `?tls-psk-file=FILE` authenticates the link with a pre-shared key
    /// (docs/distributed.md).
    #[arg(long = "member", value_name = "START:LEN=URI")]
    pub members: Vec<String>,
    /// Where this device's array lies in the address space (needs --member) [default: 0]:
    /// members that hold the addresses before it let every host see one address space.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub local_at: Option<u64>,
    /// Milliseconds a forwarded request waits for its member before the link is declared
    /// failed and its requests fail [default: 5000].
    #[arg(long)]
    pub member_timeout_ms: Option<u64>,
    /// Share this daemon's nvfs with member hosts (docs/distributed.md): listen at ADDR:PORT
    /// for the members' manager links (keyed with --share-key), answer their clients'
    /// file-system calls and revoke space on every member before it is reused.
    #[arg(long, value_name = "ADDR:PORT", conflicts_with_all = ["raw", "kernel_fs"])]
    pub share_listen: Option<String>,
    /// Serve the nvfs of the manager's host at HOST:PORT (its --share-listen) to this host's
    /// clients: their file-system calls go there, their reads and writes go to the manager's
    /// array through --member ranges. No file system of this daemon's own.
    #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["kernel_fs", "share_listen"])]
    pub share_from: Option<String>,
    /// The members' shared key for the manager links: a file of `USER:HEXKEY` lines as nbdkit
    /// and libnbd read them (the first line's key, at least 16 bytes); the NBD links may use
    /// the same file.
    #[arg(long, value_name = "FILE")]
    pub share_key: Option<PathBuf>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    socket: Option<PathBuf>,
    device: Option<PathBuf>,
    volatile: Option<bool>,
    size: Option<toml::Value>,
    max_channels: Option<usize>,
    phys_tags: Option<usize>,
    table_entries: Option<usize>,
    merge: Option<bool>,
    dma_size: Option<toml::Value>,
    slice_size: Option<toml::Value>,
    park_after_us: Option<u64>,
    read_latency_ns: Option<u64>,
    trace: Option<bool>,
    write_latency_ns: Option<u64>,
    socket_mode: Option<String>,
    user_channels: Option<usize>,
    user_connections: Option<usize>,
    user_records: Option<usize>,
    raw: Option<bool>,
    kernel_fs: Option<String>,
    kernel_fs_mount: Option<PathBuf>,
    chunk_size: Option<toml::Value>,
    durability: Option<String>,
    append_reserve: Option<toml::Value>,
    data_checksums: Option<bool>,
    poller_cpu: Option<toml::Value>,
    /// A preset's name, or a table: `preset` (default `pcm`), `seed`, and any parameter.
    model: Option<toml::Value>,
    /// `START:LEN=URI` strings, as `--member`.
    members: Option<Vec<String>>,
    share_listen: Option<String>,
    share_from: Option<String>,
    share_key: Option<PathBuf>,
    member_timeout_ms: Option<u64>,
    local_at: Option<toml::Value>,
}

/// The model the flags and the file ask for, and its address-randomization seed.
fn resolve_model(
    args: &Args,
    file: Option<&toml::Value>,
    seed: u64,
) -> Result<(Option<ModelConfig>, u64), String> {
    let preset = |name: &str| -> Result<Option<ModelConfig>, String> {
        match name.trim() {
            "none" => Ok(None),
            n => ModelConfig::preset(n).map(Some),
        }
    };
    let text = |v: &toml::Value| match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut seed = seed;
    let mut model = match file {
        None => None,
        Some(toml::Value::String(s)) => preset(s)?,
        Some(toml::Value::Table(t)) => {
            let base = t.get("preset").map(text).unwrap_or_else(|| "pcm".into());
            let mut m = preset(&base)?;
            for (k, v) in t {
                match k.as_str() {
                    "preset" => {}
                    "seed" => {
                        seed = text(v)
                            .parse()
                            .map_err(|_| format!("[model] seed must be a whole number, not {v}"))?
                    }
                    _ => match m.as_mut() {
                        Some(m) => m.set(k, &text(v)).map_err(|e| format!("[model]: {e}"))?,
                        None => {
                            return Err(format!(
                                "[model] sets `{k}` but its preset is none: name a preset, or \
                                 leave the table out"
                            ))
                        }
                    },
                }
            }
            m
        }
        Some(other) => {
            return Err(format!(
                "`model` must be a preset name or a [model] table, not {other}"
            ))
        }
    };
    if let Some(name) = &args.model {
        model = preset(name)?;
    }
    for kv in &args.model_set {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(format!("--model-set {kv}: give NAME=VALUE"));
        };
        if k.trim() == "seed" {
            seed = v
                .trim()
                .parse()
                .map_err(|_| format!("--model-set seed={v}: not a whole number"))?;
            continue;
        }
        match model.as_mut() {
            Some(m) => m.set(k.trim(), v)?,
            None => {
                return Err(format!(
                    "--model-set {kv} needs a model: add --model pcm (or another preset)"
                ))
            }
        }
    }
    Ok((model, seed))
}

fn toml_size(v: &Option<toml::Value>, name: &str) -> Result<Option<u64>, String> {
    match v {
        None => Ok(None),
        Some(toml::Value::Integer(i)) if *i >= 0 => Ok(Some(*i as u64)),
        Some(toml::Value::String(s)) => parse_size(s).map(Some),
        Some(other) => Err(format!("`{name}` must be a size, not {other}")),
    }
}

/// Where the array lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArraySource {
    /// A backing file, created with the size if missing.
    File(PathBuf, Option<u64>),
    /// A memfd of this size.
    Volatile(u64),
}

/// Resolved settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Control socket.
    pub socket: PathBuf,
    /// The array.
    pub array: ArraySource,
    /// Engine settings.
    pub device: DeviceConfig,
    /// Socket file mode.
    pub socket_mode: u32,
    /// What one user may hold.
    pub shares: crate::server::Shares,
    /// No file system: a raw device.
    pub raw: bool,
    /// A kernel file system on the array instead of nvfs, and where it is mounted.
    pub kernel_fs: Option<(crate::kernelfs::Kind, PathBuf)>,
    /// Allocation unit of a file system made on a new array.
    pub chunk_size: u64,
    /// What calls and `fsync` make durable.
    pub durability: Durability,
    /// Bytes a file growing at its end keeps reserved after its last chunk.
    pub append_reserve: u64,
    /// Where flushed ranges are copied as well (a test hook).
    pub durable_shadow: Option<PathBuf>,
    /// A file system made on a new array keeps data checksums.
    pub data_checksums: bool,
    /// The daemon's part in a file system several hosts share.
    pub share: Option<ShareConfig>,
}

/// The daemon's part in a file system several hosts share (docs/distributed.md).
#[derive(Clone, Debug)]
pub enum ShareConfig {
    /// It holds the file system and listens for members at this address.
    Listen {
        /// ADDR:PORT.
        addr: String,
        /// The members' key.
        key: PathBuf,
    },
    /// Its clients use the file system whose manager listens there.
    From {
        /// HOST:PORT.
        addr: String,
        /// The members' key.
        key: PathBuf,
    },
}

impl Config {
    /// Resolves flags over the TOML file over defaults.
    pub fn resolve(args: &Args) -> Result<Config, String> {
        let file: FileConfig = match &args.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read config {}: {e}", p.display()))?;
                toml::from_str(&text).map_err(|e| format!("config {}: {e}", p.display()))?
            }
            None => FileConfig::default(),
        };
        let d = DeviceConfig::default();
        let size = args.size.or(toml_size(&file.size, "size")?);
        let volatile = args.volatile || file.volatile.unwrap_or(false);
        let array = if volatile && args.device.is_none() {
            ArraySource::Volatile(size.unwrap_or(DEFAULT_SIZE))
        } else {
            let path = args
                .device
                .clone()
                .or(file.device)
                .unwrap_or_else(libmoneta::paths::default_device);
            let exists = path.exists();
            ArraySource::File(path, size.or((!exists).then_some(DEFAULT_SIZE)))
        };
        let dma_size = args
            .dma_size
            .or(toml_size(&file.dma_size, "dma_size")?)
            .unwrap_or(d.geometry.dma_size as u64);
        let slice_size = args
            .slice_size
            .or(toml_size(&file.slice_size, "slice_size")?)
            .unwrap_or(d.geometry.slice_size as u64);
        let device = DeviceConfig {
            max_channels: args
                .max_channels
                .or(file.max_channels)
                .unwrap_or(d.max_channels),
            phys_tags: args.phys_tags.or(file.phys_tags).unwrap_or(d.phys_tags),
            table_entries: args
                .table_entries
                .or(file.table_entries)
                .unwrap_or(d.table_entries),
            merge: !args.no_merge && file.merge.unwrap_or(true),
            geometry: DmaGeometry {
                dma_size: usize::try_from(dma_size).map_err(|_| "dma size too large")?,
                slice_size: usize::try_from(slice_size).map_err(|_| "slice size too large")?,
            },
            park_after: args
                .park_after_us
                .or(file.park_after_us)
                .map(Duration::from_micros)
                .unwrap_or(d.park_after),
            timing: Timing {
                read_ns: args.read_latency_ns.or(file.read_latency_ns).unwrap_or(0),
                write_ns: args.write_latency_ns.or(file.write_latency_ns).unwrap_or(0),
            },
            trace: args.trace || file.trace.unwrap_or(false),
            poller_cpu: match args.poller_cpu {
                Some(p) => p,
                None => match &file.poller_cpu {
                    None => PollerCpu::Unpinned,
                    Some(toml::Value::Integer(i)) if *i >= 0 => PollerCpu::Cpu(*i as usize),
                    Some(toml::Value::String(s)) => parse_poller_cpu(s)?,
                    Some(other) => {
                        return Err(format!(
                            "`poller_cpu` must be a CPU number, \"auto\" or \"none\", not {other}"
                        ))
                    }
                },
            }
            .resolve(),
            user_records: args.user_records.or(file.user_records),
            model: None,
            model_seed: d.model_seed,
            wear_base: None,
            // From the file system's superblock, once it is mounted (`run`).
            integrity: None,
            members: {
                let timeout = args
                    .member_timeout_ms
                    .or(file.member_timeout_ms)
                    .map(Duration::from_millis)
                    .unwrap_or(moneta_device::remote::DEFAULT_TIMEOUT);
                let given = if args.members.is_empty() {
                    file.members.clone().unwrap_or_default()
                } else {
                    args.members.clone()
                };
                given
                    .iter()
                    .map(|m| {
                        moneta_device::remote::MemberConfig::parse(m, parse_size).map(|mut m| {
                            m.timeout = timeout;
                            m
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?
            },
            local_at: args
                .local_at
                .or(toml_size(&file.local_at, "local_at")?)
                .unwrap_or(0),
        };
        let mut device = device;
        (device.model, device.model_seed) =
            resolve_model(args, file.model.as_ref(), device.model_seed)?;
        // A persistent array keeps the model's wear beside it.
        device.wear_base = match &array {
            ArraySource::File(p, _) => Some(p.clone()),
            ArraySource::Volatile(_) => None,
        };
        device.validate()?;
        let mode = args
            .socket_mode
            .clone()
            .or(file.socket_mode)
            .unwrap_or_else(|| "600".into());
        let socket_mode = u32::from_str_radix(&mode, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| format!("socket mode `{mode}` is not octal permission bits"))?;
        let mut shares = crate::server::Shares::for_channels(device.max_channels);
        if let Some(n) = args.user_channels.or(file.user_channels) {
            if n == 0 || (n >= device.max_channels && device.max_channels > 1) {
                return Err(format!(
                    "--user-channels {n}: a user's share must be at least 1 and less than \
                     --max-channels ({}), so that others keep room",
                    device.max_channels
                ));
            }
            shares.channels = n;
            shares.connections = n + crate::server::EXTRA_USER_CONNECTIONS;
        }
        if let Some(n) = args.user_connections.or(file.user_connections) {
            if n < shares.channels {
                return Err(format!(
                    "--user-connections {n} is less than the user's share of channels ({}): \
                     each channel needs its connection",
                    shares.channels
                ));
            }
            shares.connections = n;
        }
        let chunk_size = args
            .chunk_size
            .or(toml_size(&file.chunk_size, "chunk_size")?)
            .unwrap_or(moneta_fs::layout::DEFAULT_CHUNK);
        if !chunk_size.is_power_of_two() || chunk_size < 4096 {
            return Err(format!(
                "chunk size {chunk_size} is not a power of two of at least 4K"
            ));
        }
        let durability = match (args.durability, &file.durability) {
            (Some(d), _) => Some(d),
            (None, Some(name)) => Some(Durability::parse(name)?),
            (None, None) => None,
        };
        // A backing file is kept to keep its files: fsync means what programs take it to
        // mean. A memfd has no disk to reach.
        let durability = match (&array, durability) {
            (ArraySource::Volatile(_), Some(Durability::Host)) => {
                return Err(
                    "--durability host needs a backing file (--device): a volatile array \
                     has no disk to make anything durable on"
                        .into(),
                )
            }
            (ArraySource::Volatile(_), _) => Durability::Device,
            (ArraySource::File(..), d) => d.unwrap_or(Durability::Host),
        };
        let append_reserve = args
            .append_reserve
            .or(toml_size(&file.append_reserve, "append_reserve")?)
            .unwrap_or(moneta_fs::fs::DEFAULT_APPEND_RESERVE);
        let socket = args
            .socket
            .clone()
            .or(file.socket)
            .unwrap_or_else(libmoneta::paths::default_socket);
        let kernel_fs = match (args.kernel_fs, file.kernel_fs.as_deref()) {
            (Some(k), _) => Some(k),
            (None, Some(name)) => Some(crate::kernelfs::Kind::parse(name)?),
            (None, None) => None,
        };
        let raw = args.raw || file.raw.unwrap_or(false);
        if kernel_fs.is_some() && raw {
            return Err("--kernel-fs and --raw exclude each other".into());
        }
        let share_key = args.share_key.clone().or(file.share_key);
        let share = match (
            args.share_listen.clone().or(file.share_listen),
            args.share_from.clone().or(file.share_from),
        ) {
            (Some(_), Some(_)) => {
                return Err("--share-listen and --share-from exclude each other".into())
            }
            (None, None) => None,
            (Some(addr), None) => {
                if raw || kernel_fs.is_some() {
                    return Err(
                        "--share-listen shares the daemon's nvfs: not with --raw or --kernel-fs"
                            .into(),
                    );
                }
                Some(ShareConfig::Listen {
                    addr,
                    key: share_key
                        .clone()
                        .ok_or("--share-listen needs --share-key")?,
                })
            }
            (None, Some(addr)) => {
                if kernel_fs.is_some() {
                    return Err("--share-from and --kernel-fs exclude each other".into());
                }
                if device.members.is_empty() {
                    return Err(
                        "--share-from needs --member: the manager's array must be in this \
                         device's address space"
                            .into(),
                    );
                }
                Some(ShareConfig::From {
                    addr,
                    key: share_key.clone().ok_or("--share-from needs --share-key")?,
                })
            }
        };
        if share_key.is_some() && share.is_none() {
            return Err("--share-key needs --share-listen or --share-from".into());
        }
        // A member host of a shared file system has none of its own.
        let raw = raw || matches!(share, Some(ShareConfig::From { .. }));
        if device.members.is_empty() && device.local_at != 0 {
            return Err(
                "--local-at needs --member: the addresses before the array are other members'"
                    .into(),
            );
        }
        if !device.members.is_empty() && !raw {
            return Err(
                "--member needs --raw or --share-from: the other members' ranges are served as \
                 a raw device, or as the array of a file system another host manages"
                    .into(),
            );
        }
        let kernel_fs = kernel_fs.map(|k| {
            let mount = args
                .kernel_fs_mount
                .clone()
                .or(file.kernel_fs_mount)
                .unwrap_or_else(|| socket.with_extension("mnt"));
            (k, mount)
        });
        Ok(Config {
            socket,
            kernel_fs,
            array,
            device,
            socket_mode,
            shares,
            raw,
            chunk_size,
            durability,
            append_reserve,
            durable_shadow: args.durable_shadow.clone(),
            data_checksums: args.data_checksums || file.data_checksums.unwrap_or(false),
            share,
        })
    }
}

/// The pid file beside a socket.
pub fn pid_file(socket: &Path) -> PathBuf {
    socket.with_extension("pid")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("1X").is_err());
        assert!(parse_size("abc").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn flags_win_over_file_and_bad_files_are_refused() {
        let dir = std::env::temp_dir().join(format!("monetad-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(
            &p,
            "volatile = true\nsize = \"64M\"\nphys_tags = 8\nmerge = false\n",
        )
        .unwrap();
        let args = Args {
            config: Some(p.clone()),
            phys_tags: Some(16),
            ..Default::default()
        };
        let c = Config::resolve(&args).unwrap();
        assert_eq!(c.array, ArraySource::Volatile(64 << 20));
        assert_eq!(c.device.phys_tags, 16);
        assert!(!c.device.merge);
        std::fs::write(&p, "bogus_key = 1\n").unwrap();
        assert!(Config::resolve(&args).unwrap_err().contains("bogus_key"));
        let bad = Args {
            slice_size: Some(8 << 10),
            volatile: true,
            ..Default::default()
        };
        assert!(Config::resolve(&bad).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn members_need_a_raw_device_and_a_uri() {
        let member = |m: &[&str], raw: bool| {
            Config::resolve(&Args {
                volatile: true,
                size: Some(64 << 20),
                raw,
                members: m.iter().map(|s| s.to_string()).collect(),
                member_timeout_ms: Some(250),
                ..Default::default()
            })
        };
        let c = member(&["64M:1G=nbds://h/?tls-psk-file=/k"], true).unwrap();
        assert_eq!(c.device.members.len(), 1);
        assert_eq!(c.device.members[0].start, 64 << 20);
        assert_eq!(c.device.members[0].len, 1 << 30);
        assert_eq!(c.device.members[0].timeout, Duration::from_millis(250));
        assert!(member(&["64M:1G=nbd://h"], false)
            .unwrap_err()
            .contains("--raw"));
        assert!(member(&["64M:1G"], true).is_err());
        // The array after a member's range; an offset without members is refused.
        let after = |m: &[&str]| {
            Config::resolve(&Args {
                volatile: true,
                size: Some(64 << 20),
                raw: true,
                members: m.iter().map(|s| s.to_string()).collect(),
                local_at: Some(1 << 30),
                ..Default::default()
            })
        };
        assert_eq!(after(&["0:1G=nbd://h"]).unwrap().device.local_at, 1 << 30);
        assert!(after(&[]).unwrap_err().contains("--member"));
    }

    #[test]
    fn a_shared_file_system_is_held_by_an_nvfs_daemon_and_joined_by_a_member() {
        let base = || Args {
            volatile: true,
            size: Some(64 << 20),
            share_key: Some("/k".into()),
            ..Default::default()
        };
        let holder = Config::resolve(&Args {
            share_listen: Some("0.0.0.0:7700".into()),
            ..base()
        })
        .unwrap();
        assert!(matches!(holder.share, Some(ShareConfig::Listen { .. })));
        assert!(!holder.raw);
        assert!(Config::resolve(&Args {
            share_listen: Some("0.0.0.0:7700".into()),
            raw: true,
            ..base()
        })
        .unwrap_err()
        .contains("nvfs"));
        // A member needs the manager's array in its address space, and has no nvfs of its own.
        let member = Config::resolve(&Args {
            share_from: Some("10.0.0.1:7700".into()),
            members: vec!["0:1G=nbd://h".into()],
            local_at: Some(1 << 30),
            ..base()
        })
        .unwrap();
        assert!(matches!(member.share, Some(ShareConfig::From { .. })));
        assert!(member.raw);
        assert!(Config::resolve(&Args {
            share_from: Some("10.0.0.1:7700".into()),
            ..base()
        })
        .unwrap_err()
        .contains("--member"));
        // Both at once, a key for nothing, and no key.
        assert!(Config::resolve(&Args {
            share_from: Some("h:1".into()),
            share_listen: Some("h:2".into()),
            ..base()
        })
        .is_err());
        assert!(Config::resolve(&base())
            .unwrap_err()
            .contains("--share-key needs"));
        assert!(Config::resolve(&Args {
            share_listen: Some("h:2".into()),
            share_key: None,
            ..base()
        })
        .unwrap_err()
        .contains("needs --share-key"));
    }

    #[test]
    fn durability_defaults_to_the_arrays_kind_and_is_checked() {
        let dir = std::env::temp_dir().join(format!("monetad-dur-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.toml");
        let resolve = |toml: &str, flag: Option<Durability>, volatile: bool| {
            std::fs::write(&p, toml).unwrap();
            Config::resolve(&Args {
                config: Some(p.clone()),
                device: (!volatile).then(|| dir.join("img")),
                volatile,
                durability: flag,
                ..Default::default()
            })
            .map(|c| c.durability)
        };
        assert_eq!(resolve("", None, false), Ok(Durability::Host));
        assert_eq!(resolve("", None, true), Ok(Durability::Device));
        assert_eq!(
            resolve("durability = \"device\"\n", None, false),
            Ok(Durability::Device)
        );
        assert_eq!(
            resolve("durability = \"device\"\n", Some(Durability::Host), false),
            Ok(Durability::Host),
            "the flag wins"
        );
        let e = resolve("", Some(Durability::Host), true).unwrap_err();
        assert!(e.contains("needs a backing file"), "{e}");
        let e = resolve("durability = \"disk\"\n", None, false).unwrap_err();
        assert!(e.contains("neither"), "{e}");
        std::fs::write(&p, "volatile = true\nappend_reserve = \"64K\"\n").unwrap();
        let c = Config::resolve(&Args {
            config: Some(p.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(c.append_reserve, 64 << 10);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_model_comes_from_a_preset_a_table_and_flags() {
        let dir = std::env::temp_dir().join(format!("monetad-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("m.toml");
        let resolve = |toml: &str, model: Option<&str>, sets: &[&str]| {
            std::fs::write(&p, format!("volatile = true\n{toml}")).unwrap();
            Config::resolve(&Args {
                config: Some(p.clone()),
                model: model.map(String::from),
                model_set: sets.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            })
            .map(|c| (c.device.model, c.device.model_seed))
        };
        // No model unless asked for.
        assert_eq!(resolve("", None, &[]).unwrap().0, None);
        // A preset by name, in the file or by flag.
        assert_eq!(
            resolve("model = \"dram\"\n", None, &[])
                .unwrap()
                .0
                .unwrap()
                .name,
            "dram"
        );
        assert_eq!(
            resolve("", Some("pcm"), &[]).unwrap().0.unwrap(),
            ModelConfig::pcm()
        );
        // A table defines one, from pcm unless it names another preset; flags win.
        let (m, seed) = resolve(
            "[model]\nname = \"mine\"\ncontrollers = 8\nread_ns = 500\npolicy = \"fifo\"\nseed = 7\n",
            None,
            &["write_ns=900"],
        )
        .unwrap();
        let m = m.unwrap();
        assert_eq!(
            (m.name.as_str(), m.controllers, m.read_ns, m.write_ns),
            ("mine", 8, 500.0, 900.0)
        );
        assert_eq!(m.policy, moneta_device::model::Policy::Fifo);
        assert_eq!(seed, 7);
        let m = resolve("[model]\npreset = \"slow-nvm\"\nrow = \"4K\"\n", None, &[])
            .unwrap()
            .0
            .unwrap();
        assert_eq!((m.read_ns, m.row), (1000.0, 4096));
        assert_eq!(
            resolve("[model]\ncontrollers = 2\n", Some("none"), &[])
                .unwrap()
                .0,
            None
        );
        // Mistakes are refused, saying what is wrong.
        let e = resolve("[model]\ncontrollers = 17\n", None, &[]).unwrap_err();
        assert!(e.contains("controllers must be 1 to 16"), "{e}");
        let e = resolve("[model]\nspeed = 1\n", None, &[]).unwrap_err();
        assert!(e.contains("no parameter `speed`"), "{e}");
        let e = resolve("", Some("tape"), &[]).unwrap_err();
        assert!(e.contains("no model preset `tape`"), "{e}");
        let e = resolve("", None, &["controllers=2"]).unwrap_err();
        assert!(e.contains("needs a model"), "{e}");
        let e = resolve("", Some("pcm"), &["controllers"]).unwrap_err();
        assert!(e.contains("NAME=VALUE"), "{e}");
        let e = resolve("read_latency_ns = 100\n", Some("pcm"), &[]).unwrap_err();
        assert!(e.contains("cannot be used together"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
