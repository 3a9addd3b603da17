//! `moneta bench --path dram-buffer`: what the DRAM buffer in front of the modelled array, and
//! the hints that fill it, buy a reader (the memory drives' paper, §3).
//!
//! For each setup (no buffer; a buffer filled on misses only; with read-ahead within the
//! file's extent; with the reader's hints; with both) a private daemon runs the model (`--model`,
//! `slow-nvm` unless given) and one process reads a file of `--region` bytes at queue depth 1,
//! in two patterns: sequentially, and with a stride of 32 requests (128 KiB for 4 KiB reads),
//! so that read-ahead fetches lines nobody reads. The hinting reader tells the device what it
//! will read next: for sequential reads the next 256 KiB whenever it enters a new 256 KiB,
//! for strided reads the 16 blocks after the current one, every 16 reads. Every read is timed
//! with the hint calls it makes, so what a hint costs the reader is in the figure.

use std::time::Instant;

use serde::Serialize;

use super::*;

/// The reads between two hints, and how far ahead a strided reader hints.
const HINT_EVERY: u64 = 16;
/// Requests' worth of bytes from one strided read to the next: past the read-ahead window
/// (64 KiB here, for 4 KiB reads).
const STRIDE: u64 = 32;
/// Bytes a sequential reader hints at a time.
const SEQ_WINDOW: u64 = 256 << 10;
/// The DRAM buffer of the setups that have one.
const BUFFER: &str = "16M";

/// How one setup fills the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// No DRAM buffer.
    NoBuffer,
    /// A buffer filled by misses only.
    Demand,
    /// Read-ahead within the extent (the model's `readahead`, 64 KiB here).
    ReadAhead,
    /// The reader's hints.
    Hints,
    /// Both.
    ReadAheadHints,
}

impl Setup {
    const ALL: [Setup; 5] = [
        Setup::NoBuffer,
        Setup::Demand,
        Setup::ReadAhead,
        Setup::Hints,
        Setup::ReadAheadHints,
    ];

    fn name(self) -> &'static str {
        match self {
            Setup::NoBuffer => "no buffer",
            Setup::Demand => "buffer, misses only",
            Setup::ReadAhead => "read-ahead",
            Setup::Hints => "hints",
            Setup::ReadAheadHints => "read-ahead + hints",
        }
    }

    /// The model parameters of the setup.
    fn model_set(self) -> Vec<String> {
        let readahead = match self {
            Setup::ReadAhead | Setup::ReadAheadHints => "64K",
            _ => "0",
        };
        match self {
            Setup::NoBuffer => vec!["buffer=0".into()],
            _ => vec![format!("buffer={BUFFER}"), format!("readahead={readahead}")],
        }
    }

    fn hints(self) -> bool {
        matches!(self, Setup::Hints | Setup::ReadAheadHints)
    }
}

/// The two access patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Request after request.
    Sequential,
    /// Every 32nd request's worth of bytes.
    Strided,
}

/// One setup and pattern.
#[derive(Serialize, Clone, Debug)]
pub struct BufferPoint {
    /// Always `dram-buffer`.
    pub path: &'static str,
    /// The model preset.
    pub model: String,
    /// The setup.
    pub setup: Setup,
    /// The pattern.
    pub pattern: Pattern,
    /// Request bytes.
    pub size: u64,
    /// Bytes from one request's start to the next.
    pub stride: u64,
    /// Reads timed.
    pub reads: u64,
    /// Mean latency of a read, with the hints it made (ns).
    pub mean_ns: u64,
    /// Median latency (ns).
    pub p50_ns: u64,
    /// 99th percentile (ns).
    pub p99_ns: u64,
    /// The mean without a buffer over this mean.
    pub speedup: f64,
    /// Reads the buffer served, of those the model saw.
    pub hit_ratio: f64,
    /// Of those, reads that waited for their line.
    pub waited: u64,
    /// Lines filled by read-ahead.
    pub ahead_lines: u64,
    /// Lines filled for hints.
    pub hinted_lines: u64,
    /// Lines filled ahead that a read used.
    pub used_ahead: u64,
    /// Lines filled ahead that no read used (by the end of the run).
    pub unused_ahead: u64,
}

/// Runs every setup on both patterns.
pub fn run_buffer(a: &BenchArgs) -> Result<Vec<BufferPoint>, String> {
    if a.socket.is_some() {
        return Err("--path dram-buffer starts daemons of its own: leave out --socket".into());
    }
    let size = a.size.first().copied().unwrap_or(4096);
    let model = a.model.clone().unwrap_or_else(|| "slow-nvm".into());
    if model == "none" {
        return Err("--path dram-buffer measures the model's DRAM buffer: give a model".into());
    }
    let stride = size * STRIDE;
    if size == 0 || size > 64 << 10 || a.region < stride * 64 {
        return Err(format!(
            "--path dram-buffer reads requests of 1 byte to 64 KiB in a region of at least 64 \
             strides ({} bytes for {size}-byte requests)",
            stride * 64
        ));
    }
    let mut out: Vec<BufferPoint> = Vec::new();
    for pattern in [Pattern::Sequential, Pattern::Strided] {
        let step = match pattern {
            Pattern::Sequential => size,
            Pattern::Strided => stride,
        };
        let reads = a.ops.unwrap_or(a.region / step).min(a.region / step);
        let mut base = None;
        for setup in Setup::ALL {
            let mut b = a.clone();
            b.model = Some(model.clone());
            b.model_set = a.model_set.clone();
            b.model_set.extend(setup.model_set());
            // The median run of `--runs`, each on a daemon of its own (a cold buffer).
            let mut runs = Vec::new();
            for _ in 0..a.runs.max(1) {
                runs.push(one_run(&b, setup, pattern, size, step, reads)?);
            }
            runs.sort_by_key(|r| r.mean_ns);
            let mut p = runs.swap_remove(runs.len() / 2);
            let none = *base.get_or_insert(p.mean_ns);
            p.speedup = none as f64 / p.mean_ns.max(1) as f64;
            p.model = model.clone();
            if a.json && !a.quiet {
                println!("{}", serde_json::to_string(&p).expect("serialize"));
            }
            out.push(p);
        }
    }
    if !a.json && !a.quiet {
        print_buffer(&out);
    }
    Ok(out)
}

/// One daemon, one file, `reads` reads: the point, and the daemon's buffer figures.
fn one_run(
    b: &BenchArgs,
    setup: Setup,
    pattern: Pattern,
    size: u64,
    step: u64,
    reads: u64,
) -> Result<BufferPoint, String> {
    let d = setup::BenchDaemon::get(b, b.region)?;
    let m = libmoneta::Moneta::connect(&d.socket).map_err(|e| e.to_string())?;
    let f = setup::region_file(&m, &setup::file_name("buffer"), b.region, None, b.seed)?;
    let c = libmoneta::Control::connect(&d.socket).map_err(|e| e.to_string())?;
    let before = c.model().map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; size as usize];
    let mut hist = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
    let mut total = 0u64;
    let mut hinted_to = 0u64;
    for i in 0..reads {
        let off = i * step;
        let t = Instant::now();
        if setup.hints() {
            match pattern {
                Pattern::Sequential if off + size > hinted_to => {
                    // Entering a new window: the next one is hinted.
                    let from = off.max(hinted_to);
                    hinted_to = (off / SEQ_WINDOW + 2) * SEQ_WINDOW;
                    f.will_need(from, hinted_to - from)
                        .map_err(|e| e.to_string())?;
                }
                Pattern::Strided if i % HINT_EVERY == 0 => {
                    let next: Vec<(u64, u64)> = (1..=HINT_EVERY)
                        .map(|k| (off + k * step, size))
                        .filter(|&(at, n)| at + n <= b.region)
                        .collect();
                    f.will_need_ranges(&next).map_err(|e| e.to_string())?;
                }
                _ => {}
            }
        }
        let n = f.read_at(&mut buf, off).map_err(|e| e.to_string())?;
        let ns = t.elapsed().as_nanos() as u64;
        if n as u64 != size {
            return Err(format!("short read at {off}: {n} of {size} bytes"));
        }
        total += ns;
        hist.record(ns.max(1)).map_err(|e| e.to_string())?;
    }
    let after = c.model().map_err(|e| e.to_string())?;
    let g = |r: &moneta_abi::control::ModelReport, k: &str| -> u64 {
        r.get(&format!("buffer.{k}"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let delta = |k: &str| g(&after, k).saturating_sub(g(&before, k));
    let (hits, misses) = (delta("hits"), delta("misses"));
    let point = BufferPoint {
        path: "dram-buffer",
        model: String::new(),
        setup,
        pattern,
        size,
        stride: step,
        reads,
        mean_ns: total / reads.max(1),
        p50_ns: hist.value_at_quantile(0.5),
        p99_ns: hist.value_at_quantile(0.99),
        speedup: 1.0,
        hit_ratio: if hits + misses == 0 {
            0.0
        } else {
            hits as f64 / (hits + misses) as f64
        },
        waited: delta("waited"),
        ahead_lines: delta("ahead_lines"),
        hinted_lines: delta("hinted_lines"),
        used_ahead: delta("used_ahead"),
        unused_ahead: (delta("ahead_lines") + delta("hinted_lines"))
            .saturating_sub(delta("used_ahead")),
    };
    Ok(point)
}

fn print_buffer(points: &[BufferPoint]) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let Some(first) = points.first() else { return };
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "pattern",
        "setup",
        "mean µs",
        "p50 µs",
        "p99 µs",
        "speed-up",
        "hits",
        "filled ahead (used / unused)",
    ]);
    for p in points {
        t.add_row([
            format!("{:?}", p.pattern).to_lowercase(),
            p.setup.name().to_string(),
            format!("{:.2}", p.mean_ns as f64 / 1000.0),
            format!("{:.2}", p.p50_ns as f64 / 1000.0),
            format!("{:.2}", p.p99_ns as f64 / 1000.0),
            format!("{:.2}x", p.speedup),
            format!("{:.1}%", p.hit_ratio * 100.0),
            format!(
                "{} ({} / {})",
                p.ahead_lines + p.hinted_lines,
                p.used_ahead,
                p.unused_ahead
            ),
        ]);
    }
    println!(
        "{}-byte reads at queue depth 1 on the {} model, {} DRAM buffer in 4 KiB lines \
         (strided: one request every {} bytes)",
        first.size,
        first.model,
        BUFFER,
        first.size * STRIDE
    );
    println!("{t}");
}
