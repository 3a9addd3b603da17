//! The applications benchmark: unmodified programs on Moneta against the kernel, the shape of
//! Moneta-D's Table 3 (BerkeleyDB, SQLite and fio on Moneta-D and on the stock kernel).
//!
//! Every workload runs the same program with the same arguments on each target, timed the same
//! way, one target after another (Firecracker's A/B habit: one run, alternating):
//!
//! - `moneta`: under `moneta run --socket S --no-start`, its data under `/moneta/<unique dir>`
//!   (the shim sends the program's file calls on that path to the daemon's channel);
//! - `kernel-tmpfs`: the program alone, its data in a directory under `/dev/shm` (the kernel's
//!   best case: the page cache and nothing under it);
//! - `kernel-ext4-odirect` and `kernel-xfs-odirect`: the program alone, its data on ext4 or XFS
//!   on a loop device over a tmpfs file ([`crate::loopfs`]): the kernel's block path, the
//!   papers' baseline. fio opens its file with `O_DIRECT` there; BerkeleyDB and SQLite have no
//!   such mode here (Debian's libdb is built without it), so their page cache is in the path
//!   and each commit's flush goes through the block layer. A target that cannot be set up
//!   (not root, a tool or kernel module missing) is recorded as skipped, with the reason.
//!
//! Workloads:
//!
//! - `bdb-btree`, `bdb-hash`: `examples/apps/bdb_bench.c` (compiled here with `cc ... -ldb`):
//!   a transactional BerkeleyDB database loaded with 64-byte keys and 256-byte values, then
//!   random read-modify-write updates, one committed transaction each, for a fixed time; the
//!   program times itself and reports the median update latency. A `--verify` pass (not timed)
//!   then checks every record and that the updates it finds equal those reported.
//! - `sqlite-insert`, `sqlite-update`: the `sqlite3` shell with `PRAGMA journal_mode=DELETE;
//!   PRAGMA synchronous=FULL` on every target: a table of an integer key and a 100-byte text,
//!   rows inserted a small batch per transaction, then random rows updated one transaction
//!   each. The statements go to the shell's standard input and each phase ends with a marker
//!   row the shell prints; the time is taken here, from the marker before a phase to the marker
//!   after it. A count, a sum of lengths and `PRAGMA integrity_check` close the run (not timed).
//! - `sqlite-wal-insert`, `sqlite-wal-update`: the same in `PRAGMA journal_mode=WAL`, where
//!   every connection maps the database's `-shm` file shared (on Moneta, the file's own pages).
//! - `fio-randread-1j`, `fio-randread-2j`, `fio-randwrite-1j`, `fio-randwrite-2j`: fio,
//!   `psync`, 4 KiB, on one file; fio's JSON gives IOPS and the median completion latency.
//!   `--direct=1` on the `-odirect` targets only (the shim keeps no page cache: its writes reach
//!   the array directly). These short runs are the ones a change in the host's speed skews most
//!   (on a shared virtual machine it can change by half within a minute), so they run in
//!   rounds: each round runs every fio workload on every target in turn, and a target's record
//!   is its median round (of an even number, the lower middle one), with every round's figure
//!   in the detail (`rounds_ops_per_s`).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use crate::loopfs::{FsKind, LoopFs};

/// The C source of the BerkeleyDB workload, carried in the binary so `moneta` needs no source
/// tree to run it.
const BDB_SOURCE: &str = include_str!("../../../examples/apps/bdb_bench.c");

/// The target name of Moneta through the shim.
pub const TARGET_MONETA: &str = "moneta";
/// The target name of the kernel on tmpfs.
pub const TARGET_TMPFS: &str = "kernel-tmpfs";

/// Size of each loop device's backing file (sparse in tmpfs; XFS wants at least 300 MiB).
const LOOP_FS_BYTES: u64 = 1 << 30;

/// The mount prefix passed to `moneta run`, whatever the caller's `MONETA_MOUNT` says.
const MONETA_MOUNT: &str = "/moneta";

/// What to run and where.
#[derive(Clone, Debug)]
pub struct AppOptions {
    /// The quick configuration (well under a minute in all) instead of the full one.
    pub quick: bool,
    /// The control socket of a running daemon (its array holds the `moneta` target's data:
    /// 256 MiB is enough for either configuration).
    pub moneta_socket: PathBuf,
    /// The `moneta` executable, for `moneta run` (`libmoneta.so` beside it).
    pub moneta_bin: PathBuf,
    /// A scratch directory for the compiled program, scripts and outputs (created if missing,
    /// left in place).
    pub work: PathBuf,
}

/// One workload on one target.
#[derive(Serialize, Clone, Debug)]
pub struct AppRecord {
    /// `bdb-btree`, `bdb-hash`, `sqlite-insert`, `sqlite-update`, `fio-randread-1j`, ...
    pub workload: String,
    /// `moneta`, `kernel-tmpfs`, `kernel-ext4-odirect` or `kernel-xfs-odirect`.
    pub target: String,
    /// Operations timed (updates, rows, I/Os); 0 when skipped.
    pub ops: u64,
    /// Seconds they took.
    pub seconds: f64,
    /// `ops / seconds`; 0 when skipped.
    pub ops_per_s: f64,
    /// Median latency of one operation in microseconds, where the workload measures it
    /// (BerkeleyDB's updates, fio's I/Os).
    pub p50_us: Option<f64>,
    /// What ran and how: the command, `o_direct`, the file system, workload specifics; for a
    /// skipped target `{"skipped": reason}`.
    pub detail: Value,
}

impl AppRecord {
    /// Why this target was skipped, if it was.
    #[allow(dead_code)] // for the report's table; `run` itself does not need it
    pub fn skipped(&self) -> Option<&str> {
        self.detail.get("skipped").and_then(Value::as_str)
    }
}

/// Every workload, in the order they run and are reported.
pub const WORKLOADS: [&str; 10] = [
    "bdb-btree",
    "bdb-hash",
    "sqlite-insert",
    "sqlite-update",
    "sqlite-wal-insert",
    "sqlite-wal-update",
    "fio-randread-1j",
    "fio-randread-2j",
    "fio-randwrite-1j",
    "fio-randwrite-2j",
];

/// How much work each workload does.
#[derive(Clone, Copy, Debug)]
struct Sizes {
    bdb_records: u64,
    bdb_seconds: f64,
    bdb_cache_mb: u64,
    sqlite_rows: u64,
    sqlite_batch: u64,
    sqlite_updates: u64,
    fio_file_mb: u64,
    fio_runtime_ms: u64,
    fio_ramp_ms: u64,
    /// Rounds of the fio workloads (see the module's description).
    fio_rounds: usize,
    /// The most one program may take before it is killed and the run fails.
    limit: Duration,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                bdb_records: 20_000,
                bdb_seconds: 0.5,
                bdb_cache_mb: 32,
                sqlite_rows: 2_000,
                sqlite_batch: 10,
                sqlite_updates: 500,
                fio_file_mb: 16,
                fio_runtime_ms: 300,
                fio_ramp_ms: 100,
                fio_rounds: 2,
                limit: Duration::from_secs(60),
            }
        } else {
            Sizes {
                bdb_records: 50_000,
                bdb_seconds: 5.0,
                bdb_cache_mb: 64,
                sqlite_rows: 20_000,
                sqlite_batch: 10,
                sqlite_updates: 3_000,
                fio_file_mb: 64,
                fio_runtime_ms: 2_000,
                fio_ramp_ms: 500,
                fio_rounds: 3,
                limit: Duration::from_secs(600),
            }
        }
    }
}

/// Where a target keeps its data.
enum Place {
    /// Under the shim: a directory on nvfs, named by its `/moneta/...` path.
    Moneta { dir: String },
    /// The kernel: a directory on tmpfs or on a loop file system.
    Kernel {
        dir: PathBuf,
        o_direct: bool,
        fs: Option<Value>,
    },
}

struct Target {
    name: String,
    /// `Err`: skipped, and why.
    place: Result<Place, String>,
}

impl Target {
    fn o_direct(&self) -> bool {
        matches!(self.place, Ok(Place::Kernel { o_direct: true, .. }))
    }

    /// The path of `name` in this target's directory (the directory itself for `""`), as the
    /// program sees it.
    fn path(&self, name: &str) -> String {
        match &self.place {
            Ok(Place::Moneta { dir }) if name.is_empty() => dir.clone(),
            Ok(Place::Moneta { dir }) => format!("{dir}/{name}"),
            Ok(Place::Kernel { dir, .. }) if name.is_empty() => dir.display().to_string(),
            Ok(Place::Kernel { dir, .. }) => dir.join(name).display().to_string(),
            Err(_) => unreachable!("a skipped target runs nothing"),
        }
    }

    /// `program args...` as this target runs it.
    fn command(&self, opts: &AppOptions, program: &str, args: &[String]) -> Command {
        match &self.place {
            Ok(Place::Moneta { .. }) => {
                let mut c = Command::new(&opts.moneta_bin);
                c.arg("run")
                    .arg("--socket")
                    .arg(&opts.moneta_socket)
                    .arg("--no-start")
                    .arg("--mount")
                    .arg(MONETA_MOUNT)
                    .arg("--")
                    .arg(program)
                    .args(args);
                c
            }
            _ => {
                let mut c = Command::new(program);
                c.args(args);
                c
            }
        }
    }

    /// Details every record of this target carries.
    fn detail(&self) -> Value {
        match &self.place {
            Ok(Place::Moneta { dir }) => json!({ "dir": dir }),
            Ok(Place::Kernel { dir, fs, .. }) => json!({ "dir": dir, "fs": fs }),
            Err(e) => json!({ "skipped": e }),
        }
    }

    /// Removes `name` (a file or a directory tree) from this target's directory.
    fn remove(&self, opts: &AppOptions, name: &str) -> Result<(), String> {
        let path = self.path(name);
        match &self.place {
            Ok(Place::Moneta { .. }) => {
                let out = run_limited(
                    self.command(opts, "rm", &["-rf".into(), path.clone()]),
                    &opts.work.join("rm"),
                    Duration::from_secs(60),
                )?;
                out.check(&format!("rm -rf {path}"))
            }
            _ => {
                let p = Path::new(&path);
                let r = if p.is_dir() {
                    std::fs::remove_dir_all(p)
                } else {
                    std::fs::remove_file(p)
                };
                match r {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(format!("removing {path}: {e}"))
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

/// Runs every workload on every target; one record per (workload, target), skipped targets
/// included. `Err` when a program is missing (naming its package) or a workload fails on a
/// target that could be set up.
pub fn run(opts: &AppOptions) -> Result<Vec<AppRecord>, String> {
    let sizes = Sizes::new(opts.quick);
    std::fs::create_dir_all(&opts.work)
        .map_err(|e| format!("creating {}: {e}", opts.work.display()))?;
    need("sqlite3", "sqlite3")?;
    need("fio", "fio")?;
    let bdb = compile_bdb(&opts.work)?;
    let tag = format!(
        "moneta-apps-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() % 1_000_000_000)
            .unwrap_or(0)
    );

    // The loop file systems live until the end of the run (dropped after `targets`).
    let mut loops: Vec<LoopFs> = Vec::new();
    let mut targets = vec![
        Target {
            name: TARGET_MONETA.into(),
            place: Ok(Place::Moneta {
                dir: format!("{MONETA_MOUNT}/{tag}"),
            }),
        },
        Target {
            name: TARGET_TMPFS.into(),
            place: Ok(Place::Kernel {
                dir: Path::new(crate::loopfs::BACKING_DIR).join(&tag),
                o_direct: false,
                fs: Some(json!("tmpfs")),
            }),
        },
    ];
    for kind in FsKind::ALL {
        let name = format!("kernel-{}-odirect", kind.name());
        let place = LoopFs::create(kind, LOOP_FS_BYTES).map(|fs| {
            let place = Place::Kernel {
                dir: fs.mount.join(&tag),
                o_direct: true,
                fs: Some(json!({
                    "kind": kind.name(),
                    "device": fs.device,
                    "backing": fs.backing,
                    "size_bytes": fs.size_bytes,
                    "loop_direct_io": fs.loop_direct_io,
                })),
            };
            loops.push(fs);
            place
        });
        targets.push(Target { name, place });
    }

    let result = run_targets(opts, &sizes, &bdb, &targets);
    // Whatever happened, leave no data behind (the loop file systems go when `loops` drops).
    let mut cleanup = Vec::new();
    for t in &targets {
        if t.place.is_ok() {
            if let Err(e) = t.remove(opts, "") {
                cleanup.push(format!("{}: {e}", t.name));
            }
        }
    }
    drop(targets);
    drop(loops);
    let records = result?;
    if !cleanup.is_empty() {
        return Err(format!("cleaning up: {}", cleanup.join("; ")));
    }
    Ok(records)
}

fn run_targets(
    opts: &AppOptions,
    sizes: &Sizes,
    bdb: &Path,
    targets: &[Target],
) -> Result<Vec<AppRecord>, String> {
    for t in targets {
        make_dir(opts, t)?;
    }
    let scripts = [
        ("delete", sqlite_script(sizes, "delete")),
        ("wal", sqlite_script(sizes, "wal")),
    ];
    let mut records = Vec::new();
    let skipped = |t: &Target, workloads: &[&str], records: &mut Vec<AppRecord>| {
        for w in workloads {
            records.push(AppRecord {
                workload: (*w).into(),
                target: t.name.clone(),
                ops: 0,
                seconds: 0.0,
                ops_per_s: 0.0,
                p50_us: None,
                detail: t.detail(),
            });
        }
    };
    // Workload by workload, the targets one after another.
    for kind in ["btree", "hash"] {
        for t in targets {
            if t.place.is_err() {
                skipped(t, &[&format!("bdb-{kind}")], &mut records);
                continue;
            }
            records.push(
                run_bdb(opts, sizes, bdb, t, kind)
                    .map_err(|e| format!("bdb-{kind} on {}: {e}", t.name))?,
            );
        }
    }
    for (journal, sql) in &scripts {
        let names = sqlite_workloads(journal);
        for t in targets {
            if t.place.is_err() {
                skipped(t, &names, &mut records);
                continue;
            }
            records.extend(
                run_sqlite(opts, sizes, sql, t, journal)
                    .map_err(|e| format!("sqlite ({journal}) on {}: {e}", t.name))?,
            );
        }
    }
    // fio in rounds, each running every workload on every target in turn.
    let mut rounds: Vec<Vec<AppRecord>> = vec![Vec::new(); FIO_JOBS.len() * targets.len()];
    for _ in 0..sizes.fio_rounds {
        for (j, job) in FIO_JOBS.iter().enumerate() {
            for (i, t) in targets.iter().enumerate() {
                if t.place.is_ok() {
                    let r = run_fio(opts, sizes, t, *job)
                        .map_err(|e| format!("{} on {}: {e}", job.0, t.name))?;
                    rounds[j * targets.len() + i].push(r);
                }
            }
        }
    }
    for (i, t) in targets.iter().enumerate() {
        if t.place.is_err() {
            let fio: Vec<&str> = WORKLOADS
                .iter()
                .copied()
                .filter(|w| w.starts_with("fio"))
                .collect();
            skipped(t, &fio, &mut records);
            continue;
        }
        for j in 0..FIO_JOBS.len() {
            let runs = std::mem::take(&mut rounds[j * targets.len() + i]);
            records.push(median_round(runs).ok_or("no fio round ran")?);
        }
        t.remove(opts, "fio.dat")?;
    }
    // Reported workload by workload, whatever order they ran in.
    records.sort_by_key(|r| WORKLOADS.iter().position(|w| *w == r.workload));
    Ok(records)
}

/// For every workload and every other target that ran it: Moneta's operations per second
/// over that target's (above 1: Moneta is faster).
pub fn speedups(records: &[AppRecord]) -> Vec<(String, String, f64)> {
    let mut out = Vec::new();
    for m in records
        .iter()
        .filter(|r| r.target == TARGET_MONETA && r.ops_per_s > 0.0)
    {
        for r in records
            .iter()
            .filter(|r| r.workload == m.workload && r.target != TARGET_MONETA && r.ops_per_s > 0.0)
        {
            out.push((
                m.workload.clone(),
                r.target.clone(),
                m.ops_per_s / r.ops_per_s,
            ));
        }
    }
    out
}

/// Fails with the package to install when `tool` is not on `PATH`.
fn need(tool: &str, package: &str) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join(tool).is_file()) {
        Ok(())
    } else {
        Err(format!(
            "{tool} not found: the applications benchmark needs it (apt-get install {package})"
        ))
    }
}

/// Compiles the BerkeleyDB workload into `work`; a missing `db.h` names `libdb-dev`.
fn compile_bdb(work: &Path) -> Result<PathBuf, String> {
    need("cc", "gcc")?;
    let src = work.join("bdb_bench.c");
    let exe = work.join("bdb_bench");
    std::fs::write(&src, BDB_SOURCE).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(&src)
        .arg("-ldb")
        .arg("-o")
        .arg(&exe)
        .output()
        .map_err(|e| format!("running cc: {e}"))?;
    if out.status.success() {
        return Ok(exe);
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("db.h") || err.contains("-ldb") {
        return Err(format!(
            "the BerkeleyDB workload needs Berkeley DB's headers and library: apt-get install \
             libdb-dev ({})",
            err.lines().next().unwrap_or("").trim()
        ));
    }
    Err(format!("cc {}: {}", src.display(), err.trim()))
}

/// The target's own directory, made empty.
fn make_dir(opts: &AppOptions, t: &Target) -> Result<(), String> {
    match &t.place {
        Ok(Place::Moneta { dir }) => {
            let out = run_limited(
                t.command(opts, "mkdir", &["-p".into(), dir.clone()]),
                &opts.work.join("mkdir"),
                Duration::from_secs(60),
            )?;
            out.check(&format!("moneta run -- mkdir -p {dir}"))
                .map_err(|e| {
                    format!(
                        "{e} (is a daemon running at {}?)",
                        opts.moneta_socket.display()
                    )
                })
        }
        Ok(Place::Kernel { dir, .. }) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))
        }
        Err(_) => Ok(()),
    }
}

/// What a program printed and how it ended.
struct Output {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    wall: Duration,
}

impl Output {
    fn check(&self, what: &str) -> Result<(), String> {
        if self.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{what}: {}: {}",
                self.status,
                tail(&self.stderr, 2000)
            ))
        }
    }
}

fn tail(s: &str, n: usize) -> &str {
    let s = s.trim();
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// Runs `cmd` to its end within `limit` (killed after it), its output in files `stem.out` and
/// `stem.err` (files, not pipes: a chatty program cannot block on a full pipe while we wait).
fn run_limited(mut cmd: Command, stem: &Path, limit: Duration) -> Result<Output, String> {
    let out_path = stem.with_extension("out");
    let err_path = stem.with_extension("err");
    let open = |p: &Path| File::create(p).map_err(|e| format!("creating {}: {e}", p.display()));
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(open(&out_path)?)
        .stderr(open(&err_path)?)
        .spawn()
        .map_err(|e| format!("starting {:?}: {e}", cmd.get_program()))?;
    let status = wait_limited(&mut child, limit, start)?;
    let wall = start.elapsed();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    Ok(Output {
        status,
        stdout: read(&out_path),
        stderr: read(&err_path),
        wall,
    })
}

fn wait_limited(child: &mut Child, limit: Duration, start: Instant) -> Result<ExitStatus, String> {
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Ok(s),
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("killed after {limit:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The last line of `stdout` that is a JSON object.
fn json_line(stdout: &str) -> Result<Value, String> {
    stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| format!("no JSON line in the output: {}", tail(stdout, 500)))
        .and_then(|l| serde_json::from_str(l).map_err(|e| format!("{e}: {l}")))
}

fn command_text(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `base` with `extra`'s fields added (a null `base` becomes `extra`).
fn merge(base: Value, extra: Value) -> Value {
    match (base, extra) {
        (Value::Object(mut b), Value::Object(e)) => {
            b.extend(e);
            Value::Object(b)
        }
        (Value::Null, e) => e,
        (b, _) => b,
    }
}

fn run_bdb(
    opts: &AppOptions,
    sizes: &Sizes,
    bdb: &Path,
    t: &Target,
    kind: &str,
) -> Result<AppRecord, String> {
    let name = format!("bdb-{kind}");
    let dir = t.path(&name);
    let common = [
        "--kind".to_string(),
        kind.into(),
        "--records".into(),
        sizes.bdb_records.to_string(),
        "--cache-mb".into(),
        sizes.bdb_cache_mb.to_string(),
    ];
    let mut args = common.to_vec();
    args.extend([
        "--seconds".into(),
        sizes.bdb_seconds.to_string(),
        dir.clone(),
    ]);
    let program = bdb.display().to_string();
    let cmd = t.command(opts, &program, &args);
    let text = command_text(&cmd);
    let stem = opts.work.join(format!("{name}-{}", t.name));
    let out = run_limited(cmd, &stem, sizes.limit)?;
    out.check(&text)?;
    let v = json_line(&out.stdout)?;
    let ops = v["ops"].as_u64().ok_or("no ops in bdb_bench's line")?;
    let seconds = v["seconds"]
        .as_f64()
        .ok_or("no seconds in bdb_bench's line")?;
    if ops == 0 || seconds <= 0.0 {
        return Err(format!("bdb_bench did nothing: {v}"));
    }

    // The database as the program left it: every record intact, every update there.
    let mut vargs = vec!["--verify".to_string()];
    vargs.extend(common);
    vargs.push(dir);
    let vout = run_limited(
        t.command(opts, &program, &vargs),
        &stem.with_file_name(format!("{name}-{}-verify", t.name)),
        sizes.limit,
    )?;
    vout.check("bdb_bench --verify")?;
    let check = json_line(&vout.stdout)?;
    if check["updates"].as_u64() != Some(ops) {
        return Err(format!(
            "verify found {} updates, the run reported {ops}",
            check["updates"]
        ));
    }
    t.remove(opts, &name)?;

    Ok(AppRecord {
        workload: name,
        target: t.name.clone(),
        ops,
        seconds,
        ops_per_s: ops as f64 / seconds,
        p50_us: v["p50_us"].as_f64(),
        detail: merge(
            t.detail(),
            json!({
                "command": text,
                // Debian's libdb has no direct I/O (DB_DIRECT_DB answers EINVAL).
                "o_direct": false,
                "records": sizes.bdb_records,
                "load_seconds": v["load_seconds"],
                "verified": true,
                "wall_seconds": out.wall.as_secs_f64(),
            }),
        ),
    })
}

/// The three parts of the SQLite script: setup, inserts, updates; each ends with a marker.
struct SqlScript {
    setup: String,
    inserts: String,
    updates: String,
    transactions_insert: u64,
}

const MARK_READY: &str = "MONETA-READY";
const MARK_INSERTED: &str = "MONETA-INSERTED";
const MARK_UPDATED: &str = "MONETA-UPDATED";
const MARK_CHECK: &str = "MONETA-CHECK";

/// The two SQLite workloads in journal mode `journal`: inserts, updates.
fn sqlite_workloads(journal: &str) -> [&'static str; 2] {
    if journal == "wal" {
        ["sqlite-wal-insert", "sqlite-wal-update"]
    } else {
        ["sqlite-insert", "sqlite-update"]
    }
}

/// The same statements for every target, from a fixed seed, in journal mode `journal`
/// (`delete` or `wal`).
fn sqlite_script(sizes: &Sizes, journal: &str) -> SqlScript {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_a995);
    let text = |rng: &mut rand::rngs::StdRng| -> String {
        const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
        (0..100)
            .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
            .collect()
    };
    let setup = format!(
        "PRAGMA journal_mode={journal};\nPRAGMA synchronous=FULL;\n\
         CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT NOT NULL);\nSELECT '{MARK_READY}';\n"
    );
    let mut inserts = String::new();
    let mut txns = 0;
    let mut k = 0;
    while k < sizes.sqlite_rows {
        inserts.push_str("BEGIN;\n");
        for _ in 0..sizes.sqlite_batch.min(sizes.sqlite_rows - k) {
            k += 1;
            inserts.push_str(&format!(
                "INSERT INTO t VALUES({k},'{}');\n",
                text(&mut rng)
            ));
        }
        inserts.push_str("COMMIT;\n");
        txns += 1;
    }
    inserts.push_str(&format!("SELECT '{MARK_INSERTED}';\n"));
    let mut updates = String::new();
    for _ in 0..sizes.sqlite_updates {
        let k = rng.gen_range(1..=sizes.sqlite_rows);
        updates.push_str(&format!(
            "BEGIN;\nUPDATE t SET v='{}' WHERE k={k};\nCOMMIT;\n",
            text(&mut rng)
        ));
    }
    updates.push_str(&format!(
        "SELECT '{MARK_UPDATED}';\nSELECT '{MARK_CHECK}', count(*), sum(length(v)) FROM t;\n\
         PRAGMA integrity_check;\n.quit\n"
    ));
    SqlScript {
        setup,
        inserts,
        updates,
        transactions_insert: txns,
    }
}

fn run_sqlite(
    opts: &AppOptions,
    sizes: &Sizes,
    sql: &SqlScript,
    t: &Target,
    journal: &str,
) -> Result<Vec<AppRecord>, String> {
    let db = t.path("sqlite.db");
    let mut cmd = t.command(opts, "sqlite3", &["-bail".into(), db.clone()]);
    let text = command_text(&cmd);
    let err_path = opts.work.join(format!("sqlite-{}.err", t.name));
    let err_file =
        File::create(&err_path).map_err(|e| format!("creating {}: {e}", err_path.display()))?;
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(err_file)
        .spawn()
        .map_err(|e| format!("starting sqlite3: {e}"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut stdin = child.stdin.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    // The shell's rows, as they come (it flushes after each statement's output), so the time
    // of each marker is known here.
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send((line, Instant::now())).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let mut phase = |input: &str, mark: &str, stdin: &mut std::process::ChildStdin| {
        stdin
            .write_all(input.as_bytes())
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("writing to sqlite3: {e}"))?;
        let deadline = start + sizes.limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok((l, at)) => {
                    let done = l == mark;
                    lines.push(l);
                    if done {
                        return Ok(at);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no {mark} within {:?}", sizes.limit))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!("sqlite3 ended before {mark}"))
                }
            }
        }
    };
    let times = (|| {
        let t0 = phase(&sql.setup, MARK_READY, &mut stdin)?;
        let t1 = phase(&sql.inserts, MARK_INSERTED, &mut stdin)?;
        let t2 = phase(&sql.updates, MARK_UPDATED, &mut stdin)?;
        Ok::<_, String>((t0, t1, t2))
    })();
    drop(stdin);
    let status = wait_limited(&mut child, sizes.limit, start);
    let _ = reader.join();
    let lines: Vec<String> = lines
        .into_iter()
        .chain(rx.try_iter().map(|(l, _)| l))
        .collect();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let status = status?;
    let (t0, t1, t2) = times.map_err(|e| format!("{e}: {}", tail(&stderr, 2000)))?;
    if !status.success() {
        return Err(format!("{text}: {status}: {}", tail(&stderr, 2000)));
    }
    let wall = start.elapsed();

    // The durable work asked for, and the table that resulted.
    if lines.first().map(String::as_str) != Some(journal) {
        return Err(format!("journal_mode is not {journal}: {lines:?}"));
    }
    let want_check = format!(
        "{MARK_CHECK}|{}|{}",
        sizes.sqlite_rows,
        sizes.sqlite_rows * 100
    );
    if !lines.contains(&want_check) || lines.last().map(String::as_str) != Some("ok") {
        return Err(format!(
            "the table is not as written (want {want_check:?} and integrity ok): {:?}",
            &lines[lines.len().saturating_sub(3)..]
        ));
    }
    t.remove(opts, "sqlite.db")?;

    let base = merge(
        t.detail(),
        json!({
            "command": text,
            "o_direct": false,
            "journal_mode": journal,
            "synchronous": "full",
            "wall_seconds": wall.as_secs_f64(),
        }),
    );
    let ins = (t1 - t0).as_secs_f64();
    let upd = (t2 - t1).as_secs_f64();
    Ok(vec![
        AppRecord {
            workload: sqlite_workloads(journal)[0].into(),
            target: t.name.clone(),
            ops: sizes.sqlite_rows,
            seconds: ins,
            ops_per_s: sizes.sqlite_rows as f64 / ins,
            p50_us: None,
            detail: merge(
                base.clone(),
                json!({
                    "rows": sizes.sqlite_rows,
                    "rows_per_transaction": sizes.sqlite_batch,
                    "transactions": sql.transactions_insert,
                }),
            ),
        },
        AppRecord {
            workload: sqlite_workloads(journal)[1].into(),
            target: t.name.clone(),
            ops: sizes.sqlite_updates,
            seconds: upd,
            ops_per_s: sizes.sqlite_updates as f64 / upd,
            p50_us: None,
            detail: merge(
                base,
                json!({ "rows": sizes.sqlite_rows, "transactions": sizes.sqlite_updates }),
            ),
        },
    ])
}

/// fio's workloads: name, `--rw`, jobs.
const FIO_JOBS: [(&str, &str, u32); 4] = [
    ("fio-randread-1j", "randread", 1),
    ("fio-randread-2j", "randread", 2),
    ("fio-randwrite-1j", "randwrite", 1),
    ("fio-randwrite-2j", "randwrite", 2),
];

/// The round with the median operations per second (of an even number, the lower middle
/// one), its detail carrying every round's figure in the order they ran; `None` for no rounds.
fn median_round(runs: Vec<AppRecord>) -> Option<AppRecord> {
    let all: Vec<f64> = runs.iter().map(|r| r.ops_per_s).collect();
    let mut sorted = runs;
    sorted.sort_by(|a, b| a.ops_per_s.total_cmp(&b.ops_per_s));
    let mid = sorted.len().checked_sub(1)? / 2;
    let mut r = sorted.swap_remove(mid);
    r.detail = merge(r.detail, json!({ "rounds_ops_per_s": all }));
    Some(r)
}

/// One fio workload on one target; the file stays for the next round (a round after the
/// first finds it laid out).
fn run_fio(
    opts: &AppOptions,
    sizes: &Sizes,
    t: &Target,
    (name, rw, n): (&str, &str, u32),
) -> Result<AppRecord, String> {
    let file = t.path("fio.dat");
    let mut args = vec![
        "--output-format=json".to_string(),
        format!("--filename={file}"),
        format!("--size={}M", sizes.fio_file_mb),
        "--ioengine=psync".into(),
        "--bs=4k".into(),
        "--time_based".into(),
        format!("--runtime={}ms", sizes.fio_runtime_ms),
        format!("--ramp_time={}ms", sizes.fio_ramp_ms),
        "--group_reporting".into(),
    ];
    if t.o_direct() {
        args.push("--direct=1".into());
    }
    args.push(format!("--name={name}"));
    args.push(format!("--rw={rw}"));
    args.push(format!("--numjobs={n}"));
    let cmd = t.command(opts, "fio", &args);
    let text = command_text(&cmd);
    let out = run_limited(
        cmd,
        &opts.work.join(format!("{name}-{}", t.name)),
        sizes.limit,
    )?;
    out.check(&text)?;
    let start = out
        .stdout
        .find('{')
        .ok_or_else(|| format!("no JSON from fio: {}", tail(&out.stdout, 500)))?;
    let v: Value =
        serde_json::from_str(&out.stdout[start..]).map_err(|e| format!("fio JSON: {e}"))?;
    let empty = Vec::new();
    let got = v["jobs"].as_array().unwrap_or(&empty);
    let j = got
        .iter()
        .find(|j| j["jobname"] == name)
        .ok_or_else(|| format!("fio's output has no {name}"))?;
    if j["error"].as_i64() != Some(0) {
        return Err(format!("fio error {}", j["error"]));
    }
    let side = if rw == "randread" { "read" } else { "write" };
    let s = &j[side];
    let ops = s["total_ios"].as_u64().unwrap_or(0);
    let seconds = s["runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    let iops = s["iops"].as_f64().unwrap_or(0.0);
    if ops == 0 || seconds <= 0.0 || iops <= 0.0 {
        return Err(format!("fio did no I/O: {s}"));
    }
    let p50 = s["clat_ns"]["percentile"]["50.000000"]
        .as_f64()
        .map(|ns| ns / 1000.0);
    Ok(AppRecord {
        workload: name.into(),
        target: t.name.clone(),
        ops,
        seconds,
        ops_per_s: iops,
        p50_us: p50,
        detail: merge(
            t.detail(),
            json!({
                "command": text,
                "o_direct": t.o_direct(),
                "rw": rw,
                "jobs": n,
                "block_size": 4096,
                "file_mib": sizes.fio_file_mb,
                "p99_us": s["clat_ns"]["percentile"]["99.000000"].as_f64().map(|ns| ns / 1000.0),
                "wall_seconds": out.wall.as_secs_f64(),
            }),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(workload: &str, target: &str, ops_per_s: f64) -> AppRecord {
        AppRecord {
            workload: workload.into(),
            target: target.into(),
            ops: ops_per_s as u64,
            seconds: 1.0,
            ops_per_s,
            p50_us: None,
            detail: Value::Null,
        }
    }

    #[test]
    fn median_round_keeps_the_middle_run_and_every_figure() {
        assert!(median_round(Vec::new()).is_none());
        let m = median_round(vec![
            rec("w", "t", 3.0),
            rec("w", "t", 1.0),
            rec("w", "t", 2.0),
        ])
        .unwrap();
        assert_eq!(m.ops_per_s, 2.0);
        assert_eq!(m.detail["rounds_ops_per_s"], json!([3.0, 1.0, 2.0]));
        // Of an even number, the lower middle one.
        let m = median_round(vec![rec("w", "t", 5.0), rec("w", "t", 4.0)]).unwrap();
        assert_eq!(m.ops_per_s, 4.0);
        assert_eq!(m.detail["rounds_ops_per_s"], json!([5.0, 4.0]));
        let m = median_round(vec![rec("w", "t", 7.0)]).unwrap();
        assert_eq!(m.ops_per_s, 7.0);
    }

    #[test]
    fn speedups_divide_moneta_by_each_other_target() {
        let r = vec![
            rec("bdb-btree", "moneta", 100.0),
            rec("bdb-btree", "kernel-tmpfs", 200.0),
            rec("bdb-btree", "kernel-ext4-odirect", 10.0),
            rec("bdb-btree", "kernel-xfs-odirect", 0.0), // skipped
            rec("fio-randread-1j", "kernel-tmpfs", 5.0), // no moneta figure
        ];
        let s = speedups(&r);
        assert_eq!(
            s,
            vec![
                ("bdb-btree".into(), "kernel-tmpfs".into(), 0.5),
                ("bdb-btree".into(), "kernel-ext4-odirect".into(), 10.0),
            ]
        );
    }

    #[test]
    fn the_sqlite_script_is_the_same_every_time() {
        let s = Sizes::new(true);
        let a = sqlite_script(&s, "delete");
        let b = sqlite_script(&s, "delete");
        assert_eq!(a.inserts, b.inserts);
        assert_eq!(a.updates, b.updates);
        assert_eq!(a.transactions_insert, s.sqlite_rows / s.sqlite_batch);
        assert_eq!(
            a.inserts.matches("INSERT INTO").count() as u64,
            s.sqlite_rows
        );
        assert_eq!(
            a.updates.matches("UPDATE t").count() as u64,
            s.sqlite_updates
        );
    }
}
