//! `moneta bench`'s arguments: the paths, operations and completion strategies it times, every
//! option, and the checks of a configuration before anything starts.

use super::*;

/// An I/O path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// Files on nvfs through libmoneta (`--qd` above 1: asynchronous requests).
    Moneta,
    /// Those files without copies: reads left in the DMA slice, writes filled in place
    /// (requests of at most one DMA slice).
    MonetaZeroCopy,
    /// Raw commands through a channel on one file's extent.
    MonetaRaw,
    /// Those files mapped into memory (their own pages, `FS_MAP`): loads and stores, no
    /// command at all (synchronous: `--threads`, not `--qd`).
    MonetaMmap,
    /// pread/pwrite on a file (tmpfs by default).
    KernelPsync,
    /// io_uring on that file: fixed file, registered buffers, single issuer, deferred task
    /// work.
    KernelUring,
    /// io_uring with a kernel thread polling the submission queue.
    KernelUringSqpoll,
    /// The kernel path's file mapped into memory (`mmap` `MAP_SHARED` of a tmpfs file):
    /// loads and stores.
    KernelMmap,
    /// pread/pwrite with `O_DIRECT` on ext4 on a loop device over a tmpfs file: the kernel's
    /// block path, the papers' baseline (needs root; the bench sets it up and tears it down).
    KernelOdirectExt4,
    /// The same on XFS.
    KernelOdirectXfs,
    /// Files of ext4 made on the array by a private `monetad --kernel-fs ext4` (Moneta-D's
    /// recycled file system), read and written through a channel (`libmoneta::KernelFile`):
    /// the kernel checks the open, the data goes without a system call (needs root; the bench
    /// starts the daemon, writes the files, and stops it, which unmounts).
    MonetaKfsExt4,
    /// The same on XFS (an array of at least 300 MiB).
    MonetaKfsXfs,
    /// Those ext4 files through the kernel's mount: pread/pwrite with `O_DIRECT` (aligned
    /// buffers). Each run opens the files and closes them at its end, since a kernel open
    /// takes them from the channels.
    KernelKfsExt4Odirect,
    /// Those ext4 files through the kernel's mount and its page cache: pread/pwrite.
    KernelKfsExt4Buffered,
    /// The XFS files through the kernel's mount with `O_DIRECT`.
    KernelKfsXfsOdirect,
    /// The XFS files through the kernel's mount and its page cache.
    KernelKfsXfsBuffered,
    /// pread/pwrite on a file of nvfs through `moneta mount` (FUSE, direct I/O): the path of
    /// programs the shim does not reach. The bench mounts its daemon's file system and
    /// unmounts it at the end (needs /dev/fuse, and fusermount3 without root).
    Fuse,
    /// The permission table's check alone.
    PermCheck,
    /// The file system's calls against the kernel on tmpfs: the soft miss through the channel
    /// (LOOKUP) and on the control socket, stat, 10,000 small files.
    Nvfs,
    /// The array's timing model against itself (private daemons): the latency it adds at
    /// queue depth 1 across array latencies of 4 ns to 128 µs against its own prediction
    /// (daemons with and without the model side by side, in eight pairs of short bursts per
    /// `--runs`, at least three, each run on daemons of its own; the host's state probed around
    /// every pair and the target judged on the pairs of its close state), the bandwidth of
    /// large transfers against its analytical peak, and its work per request.
    ModelAccuracy,
    /// The model's DRAM buffer (private daemons, `--model`, slow-nvm by default): sequential
    /// and strided reads at queue depth 1 with no buffer, a buffer filled on misses, read-ahead
    /// within the file's extent, the reader's hints (`File::will_need`), and both.
    DramBuffer,
    /// Paper 003's Figure 3b (private daemons): a member's range read or written through a
    /// channel (the device forwards over its NBD link, TLS-PSK on loopback) against the same
    /// bytes through a user-space NBD client (libnbd) and against the device's own array, at
    /// queue depth 1 for each `--size` (docs/distributed.md)
    Remote,
}

impl Path {
    /// A path of synchronous system calls (queue depth 1 whatever `--qd` says).
    pub(super) fn synchronous(self) -> bool {
        matches!(
            self,
            Path::KernelPsync
                | Path::KernelOdirectExt4
                | Path::KernelOdirectXfs
                | Path::MonetaKfsExt4
                | Path::MonetaKfsXfs
                | Path::KernelKfsExt4Odirect
                | Path::KernelKfsExt4Buffered
                | Path::KernelKfsXfsOdirect
                | Path::KernelKfsXfsBuffered
                | Path::Fuse
                | Path::MonetaMmap
                | Path::KernelMmap
        )
    }

    /// The path's name, as `--path` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Moneta => "moneta",
            Path::MonetaZeroCopy => "moneta-zero-copy",
            Path::MonetaRaw => "moneta-raw",
            Path::MonetaMmap => "moneta-mmap",
            Path::KernelMmap => "kernel-mmap",
            Path::KernelPsync => "kernel-psync",
            Path::KernelUring => "kernel-uring",
            Path::KernelUringSqpoll => "kernel-uring-sqpoll",
            Path::KernelOdirectExt4 => "kernel-odirect-ext4",
            Path::KernelOdirectXfs => "kernel-odirect-xfs",
            Path::MonetaKfsExt4 => "moneta-kfs-ext4",
            Path::MonetaKfsXfs => "moneta-kfs-xfs",
            Path::KernelKfsExt4Odirect => "kernel-kfs-ext4-odirect",
            Path::KernelKfsExt4Buffered => "kernel-kfs-ext4-buffered",
            Path::KernelKfsXfsOdirect => "kernel-kfs-xfs-odirect",
            Path::KernelKfsXfsBuffered => "kernel-kfs-xfs-buffered",
            Path::Fuse => "fuse",
            Path::PermCheck => "perm-check",
            Path::Nvfs => "nvfs",
            Path::ModelAccuracy => "model-accuracy",
            Path::DramBuffer => "dram-buffer",
            Path::Remote => "remote",
        }
    }
}

/// What each operation does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Random reads.
    Read,
    /// Random writes.
    Write,
    /// Random reads and writes, half each.
    Randrw,
    /// Sequential reads.
    Seqread,
    /// Sequential writes.
    Seqwrite,
    /// Commands that move no data: the channel's round trip (moneta-raw only).
    Nop,
}

/// Completion strategy for the Moneta paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompletionArg {
    /// DMA completion: spin on the tag status entry.
    Spin,
    /// Forwarding: spin on the completion count.
    Forward,
    /// Issue-sleep: sleep on a futex.
    Sleep,
    /// libmoneta's policy: spin up to 256 KiB, sleep above.
    Auto,
}

impl CompletionArg {
    /// The mode for a request of `size` bytes.
    pub(super) fn mode(self, size: u64) -> Completion {
        match self {
            CompletionArg::Spin => Completion::Dma,
            CompletionArg::Forward => Completion::Forward,
            CompletionArg::Sleep => Completion::Sleep,
            CompletionArg::Auto => libmoneta::Policy::default().mode(size as usize),
        }
    }
}

/// Options of `moneta bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Paths to measure (repeatable). Without any: the comparison of moneta (files through
    /// libmoneta) and moneta-raw against kernel-psync for 512 B and 4 KiB reads and writes, the
    /// permission check, the idle daemon's CPU, and what talking across two cores costs on this
    /// machine (a cache line there and back, 4 KiB handed across: the floor under a request
    /// served by another core).
    #[arg(long = "path", value_enum)]
    pub paths: Vec<Path>,
    /// Operation.
    #[arg(long, value_enum, default_value = "read")]
    pub op: Op,
    /// Request sizes in bytes (comma-separated; K/M suffixes allowed).
    #[arg(long, value_delimiter = ',', value_parser = monetad::config::parse_size)]
    pub size: Vec<u64>,
    /// Requests in flight per thread (kernel-psync is synchronous).
    #[arg(long, default_value_t = 1)]
    pub qd: usize,
    /// Threads.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Operations per thread and run instead of a duration (the warm-up still lasts
    /// `--warmup` seconds; 0 skips it).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Seconds of discarded warm-up before each configuration.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Runs per configuration; the median is reported with the spread.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// File for the kernel paths [default: /dev/shm/moneta-bench-PID].
    #[arg(long)]
    pub target: Option<PathBuf>,
    /// Bytes of the region the requests fall in.
    #[arg(long, default_value = "64M", value_parser = monetad::config::parse_size)]
    pub region: u64,
    /// Completion strategy for the Moneta paths.
    #[arg(long, value_enum, default_value = "spin")]
    pub completion: CompletionArg,
    /// Records installed for perm-check (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1000u64, 16384])]
    pub records: Vec<u64>,
    /// Use the daemon at this socket (the bench works in a file it creates and removes, or, on
    /// a daemon started with --raw, grants itself an extent, which needs the daemon's user or
    /// root). Without it the bench starts a private daemon on a volatile array and stops it at
    /// the end. The kernel-fs paths (moneta-kfs-*, kernel-kfs-*) always run on private daemons
    /// of their own (`monetad --kernel-fs`).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Print one JSON object per configuration instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Seed of the random offsets.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Small files created by `--path nvfs`.
    #[arg(long, default_value_t = 10_000)]
    pub files: usize,
    /// Time each stage of the requests (Moneta-D's Figure 3): on the moneta path from counters
    /// in libmoneta and in the daemon (the private daemon runs with `--trace`; a daemon given
    /// with --socket needs it too for the device's stages); on the kernel paths the system call
    /// and the copy timed apart and the rest of the mean. Queue depth 1.
    #[arg(long)]
    pub breakdown: bool,
    /// Files the requests spread over, each an equal part of the region (moneta and
    /// kernel-psync paths): more files, more permission records.
    #[arg(long, default_value_t = 1)]
    pub open_files: usize,
    /// Extents each moneta file is made of: its chunks are written in a shuffled order, so
    /// they lie next to each other on the array but not in the file, on a private daemon whose
    /// allocation unit is the file's size over this (a power of two, at least 4 KiB).
    #[arg(long)]
    pub extents: Option<u64>,
    /// Private daemon: do not merge adjacent permission records (`monetad --no-merge`).
    #[arg(long)]
    pub no_merge: bool,
    /// Private daemon: permission table entries [default: the daemon's, 16384].
    #[arg(long)]
    pub table_entries: Option<usize>,
    /// Count the instructions the bench threads retire (user and kernel, from the processor's
    /// counters through perf_event_open), per operation; where the machine cannot count them
    /// the record says why.
    #[arg(long)]
    pub count_instructions: bool,
    /// Print CSV (a header, then one row per configuration) instead of tables.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Measure the Moneta paths twice in every run, alone and beside a neighbour: another
    /// process on the same daemon reading 1 MiB at a time as 64 commands on all of its tags
    /// (`moneta bench --path moneta-raw --op read --size 1M`, in a child process). The records
    /// say which (`neighbour`: false alone, true beside it).
    #[arg(long)]
    pub neighbour: bool,
    /// The neighbour's request size.
    #[arg(long, default_value = "1M", value_parser = monetad::config::parse_size)]
    pub neighbour_size: u64,
    /// The neighbour's threads.
    #[arg(long, default_value_t = 1)]
    pub neighbour_threads: usize,
    /// Private daemon: the array's size [default: room for two regions and the file
    /// system's tables].
    #[arg(long, value_parser = monetad::config::parse_size)]
    pub array_size: Option<u64>,
    /// Private daemon: the array's timing model (`monetad --model`: none, pcm, dram,
    /// slow-nvm, flash-like); every record names the model its daemon ran.
    #[arg(long)]
    pub model: Option<String>,
    /// Private daemon: one parameter of the model, NAME=VALUE (repeatable; `monetad
    /// --model-set`).
    #[arg(long = "model-set", value_name = "NAME=VALUE")]
    pub model_set: Vec<String>,
    /// Print nothing (the records are returned to the caller: `moneta report`).
    #[arg(skip)]
    pub quiet: bool,
}

pub(super) fn validate(
    a: &BenchArgs,
    sizes: &[u64],
    slice: usize,
    paths: &[Path],
) -> Result<(), String> {
    let raw = paths.contains(&Path::MonetaRaw);
    if a.threads == 0
        || a.qd == 0
        || a.runs == 0
        || a.duration <= 0.0
        || a.ops == Some(0)
        || a.open_files == 0
    {
        return Err("threads, qd, runs, ops, open files and duration must be positive".into());
    }
    if a.qd > 4096 {
        return Err("qd is at most 4096".into());
    }
    if a.breakdown && paths.iter().any(|p| p.kfs_kind().is_some()) {
        return Err(
            "--breakdown times the moneta and the kernel's own paths, not the kernel-fs ones"
                .into(),
        );
    }
    if a.breakdown && a.qd != 1 {
        return Err("--breakdown times requests one at a time: use it with --qd 1".into());
    }
    if raw && a.threads * a.qd > moneta_abi::TAGS_PER_CHANNEL {
        return Err(format!(
            "threads x qd = {} exceeds the raw channel's {} tags",
            a.threads * a.qd,
            moneta_abi::TAGS_PER_CHANNEL
        ));
    }
    if a.open_files > 4096 {
        return Err("--open-files is at most 4096".into());
    }
    if a.open_files > 1
        && paths.iter().any(|p| {
            matches!(
                p,
                Path::MonetaRaw | Path::KernelUring | Path::KernelUringSqpoll
            )
        })
    {
        return Err(
            "--open-files above 1 works with the moneta, moneta-zero-copy, kernel-psync and \
             fuse paths"
                .into(),
        );
    }
    if paths.contains(&Path::MonetaZeroCopy) {
        if let Some(s) = sizes.iter().find(|&&s| s as usize > slice) {
            return Err(format!(
                "moneta-zero-copy requests fit one DMA slice ({slice} bytes): size {s} does not"
            ));
        }
    }
    let part = a.region / a.open_files as u64;
    for &s in sizes {
        if s == 0 || s > part {
            return Err(format!(
                "size {s} must be between 1 and the region's part per file ({part})"
            ));
        }
    }
    Ok(())
}
