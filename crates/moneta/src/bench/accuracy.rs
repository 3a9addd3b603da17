//! `moneta bench --path model-accuracy`: the array's timing model measured against itself.
//!
//! Three figures, each against what the model says it should be:
//!
//! - **latency**: for each array latency of the sweep (Moneta §V-C: 4 ns to 128 µs), a
//!   request at queue depth 1 on a daemon with the `pcm` model at that latency, minus the same
//!   request on a daemon without a model, against the model's own time for that request alone
//!   on an idle array; within 5% or 200 ns, whichever is larger, is the target. The two are
//!   measured in pairs of one run each, one right after the other and in turns which goes
//!   first (`--runs` pairs, at least three), and the point is the median of the pairs'
//!   differences: a host whose cross-core latency jumps every few seconds (by a microsecond
//!   on some virtual machines) then moves both halves of most pairs alike, where medians of
//!   separate runs compared one state of the host with another;
//! - **bandwidth**: large reads and writes kept in flight, against the model's analytical peak
//!   (the least of the link, the ring and the controllers streaming rows); within 3%;
//! - **cost**: what the model adds to the device's work per request, timed in this process on
//!   a stream of requests at the model's own peak rate, and the request rate that leaves one
//!   core for.

use moneta_device::model::{Model, ModelConfig, Submit};
use serde::Serialize;

use super::*;

/// The array latencies of the sweep (ns), as Moneta's Figure 4.
pub const SWEEP_NS: [u64; 7] = [4, 48, 150, 1_000, 4_000, 16_000, 128_000];

/// One point of the latency comparison.
#[derive(Serialize, Clone, Debug)]
pub struct LatencyPoint {
    /// Always `model-accuracy`.
    pub path: &'static str,
    /// `latency`.
    pub figure: &'static str,
    /// Read or write.
    pub op: Op,
    /// Request bytes.
    pub size: u64,
    /// The array's read and write latency of this point (ns).
    pub array_ns: u64,
    /// Median latency without a model (ns).
    pub none_p50_ns: u64,
    /// Median latency with the model (ns).
    pub model_p50_ns: u64,
    /// What the model added, as measured: the median of the pairs' differences (ns).
    pub added_ns: i64,
    /// The smallest and largest difference of a pair (ns).
    pub added_spread_ns: [i64; 2],
    /// Pairs measured.
    pub pairs: usize,
    /// What the model says it adds: the request alone on an idle array (ns).
    pub predicted_ns: u64,
    /// Measured minus predicted (ns).
    pub error_ns: i64,
    /// That over the prediction.
    pub error_fraction: f64,
    /// Whether the error is within 5% of the prediction or 200 ns.
    pub within_target: bool,
}

/// One point of the bandwidth comparison.
#[derive(Serialize, Clone, Debug)]
pub struct BandwidthPoint {
    /// Always `model-accuracy`.
    pub path: &'static str,
    /// `bandwidth`.
    pub figure: &'static str,
    /// Read or write.
    pub op: Op,
    /// Request bytes.
    pub size: u64,
    /// Requests in flight.
    pub qd: usize,
    /// Measured (MB/s, 10^6 bytes).
    pub mb_s: f64,
    /// The model's analytical peak (MB/s).
    pub peak_mb_s: f64,
    /// Measured over peak, minus one.
    pub error_fraction: f64,
    /// Whether it is within 3% of the peak.
    pub within_target: bool,
}

/// What the model costs the device per request.
#[derive(Serialize, Clone, Debug)]
pub struct CostPoint {
    /// Always `model-accuracy`.
    pub path: &'static str,
    /// `cost`.
    pub figure: &'static str,
    /// Request bytes.
    pub size: u64,
    /// Requests timed in each round.
    pub requests: u64,
    /// Rounds, each on a fresh model.
    pub rounds: usize,
    /// Nanoseconds of model work per request (submit and the decisions it causes): the
    /// median of the rounds.
    pub ns_per_request: f64,
    /// The fastest and slowest round's.
    pub ns_spread: [f64; 2],
    /// Requests per second one core could model at the median, were it doing nothing else.
    pub max_requests_per_s: f64,
}

/// Rounds of [`cost`].
pub const COST_ROUNDS: usize = 5;

/// The model's time for one request alone on an idle array (ns): the `pcm` model at
/// `array_ns`, as the daemon of the latency figure runs it.
pub fn predicted(array_ns: u64, write: bool, size: u64) -> u64 {
    let cfg = sweep_config(array_ns);
    let mut m = Model::new(cfg, 1 << 30, 0x6d6f_6e65_7461).expect("a valid preset");
    m.submit(
        Submit {
            id: 1,
            write,
            addr: 1 << 20,
            len: size,
            channel: 0,
            barrier: false,
            reach: 0,
        },
        0,
    );
    let mut done = None;
    let mut t = 0;
    while done.is_none() {
        m.advance(t, |_, d| done = Some(d));
        t = m.next_event_ns().unwrap_or(t + 1_000).max(t + 1);
    }
    done.expect("completed")
}

fn sweep_config(array_ns: u64) -> ModelConfig {
    let mut c = ModelConfig::pcm();
    c.read_ns = array_ns as f64;
    c.write_ns = array_ns as f64;
    c
}

/// Times the model alone on `n` requests of `size` bytes arriving at its peak rate, random
/// reads and writes in turn over 1 GiB, in [`COST_ROUNDS`] rounds; the addresses are drawn
/// before the clock starts, so only the model's work is timed.
pub fn cost(size: u64, n: u64) -> CostPoint {
    let cfg = ModelConfig::pcm();
    let gap_ns = (size as f64 / cfg.peak_rate(false)).max(1.0) as u64;
    let region = 1u64 << 30;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let addrs: Vec<u64> = (0..n)
        .map(|_| rng.gen_range(0..region / size) * size)
        .collect();
    let mut rounds: Vec<f64> = (0..COST_ROUNDS)
        .map(|_| {
            let mut m = Model::new(cfg.clone(), region, 1).expect("pcm");
            let mut completed = 0u64;
            let t0 = Instant::now();
            let mut now = 0u64;
            for (i, &addr) in addrs.iter().enumerate() {
                let i = i as u64;
                m.submit(
                    Submit {
                        id: i,
                        write: i % 2 == 1,
                        addr,
                        len: size,
                        channel: (i % 4) as u32,
                        barrier: false,
                        reach: 0,
                    },
                    now,
                );
                now += gap_ns;
                m.advance(now, |_, _| completed += 1);
            }
            let ns = t0.elapsed().as_nanos() as f64 / n as f64;
            std::hint::black_box(completed);
            ns
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    let ns = rounds[rounds.len() / 2];
    CostPoint {
        path: "model-accuracy",
        figure: "cost",
        size,
        requests: n,
        rounds: COST_ROUNDS,
        ns_per_request: ns,
        ns_spread: [rounds[0], rounds[rounds.len() - 1]],
        max_requests_per_s: 1e9 / ns,
    }
}

/// A run of `moneta bench` on the raw channel of a private daemon with `model` (and
/// parameters), returning its record.
fn measure(
    a: &BenchArgs,
    op: Op,
    size: u64,
    qd: usize,
    runs: usize,
    model: Option<(&str, Vec<String>)>,
) -> Result<Record, String> {
    let mut b = a.clone();
    b.paths = vec![Path::MonetaRaw];
    b.op = op;
    b.size = vec![size];
    b.qd = qd;
    b.threads = 1;
    b.quiet = true;
    b.json = false;
    b.csv = false;
    b.runs = runs;
    b.model = model.as_ref().map(|m| m.0.to_string());
    b.model_set = model.map(|m| m.1).unwrap_or_default();
    run(b)?
        .into_iter()
        .next()
        .ok_or_else(|| "the bench measured nothing".to_string())
}

/// The middle of `v` (sorted in place; the upper of the two middle values of an even count).
fn median<T: Ord + Copy>(v: &mut [T]) -> T {
    v.sort_unstable();
    v[v.len() / 2]
}

/// The whole comparison; prints it unless quiet.
pub fn run_accuracy(
    a: &BenchArgs,
) -> Result<(Vec<LatencyPoint>, Vec<BandwidthPoint>, CostPoint), String> {
    if a.socket.is_some() {
        return Err("--path model-accuracy starts daemons of its own: leave out --socket".into());
    }
    let size = a.size.first().copied().unwrap_or(4096);
    let pairs = a.runs.max(3);
    let mut lat = Vec::new();
    for op in [Op::Read, Op::Write] {
        for &ns in &SWEEP_NS {
            let set = vec![format!("read_ns={ns}"), format!("write_ns={ns}")];
            let (mut nones, mut withs, mut diffs) = (Vec::new(), Vec::new(), Vec::new());
            for i in 0..pairs {
                // Without and with the model, one right after the other, so both see the
                // same host; which goes first alternates, so a change of the host's state
                // between the two favours neither.
                let model = || measure(a, op, size, 1, 1, Some(("pcm", set.clone())));
                let (none, with) = if i % 2 == 0 {
                    let none = measure(a, op, size, 1, 1, None)?;
                    (none, model()?)
                } else {
                    let with = model()?;
                    (measure(a, op, size, 1, 1, None)?, with)
                };
                nones.push(none.lat_ns.p50);
                withs.push(with.lat_ns.p50);
                diffs.push(with.lat_ns.p50 as i64 - none.lat_ns.p50 as i64);
            }
            let predicted = predicted(ns, op == Op::Write, size);
            let added = median(&mut diffs);
            let error = added - predicted as i64;
            let point = LatencyPoint {
                path: "model-accuracy",
                figure: "latency",
                op,
                size,
                array_ns: ns,
                none_p50_ns: median(&mut nones),
                model_p50_ns: median(&mut withs),
                added_ns: added,
                added_spread_ns: [diffs[0], diffs[diffs.len() - 1]],
                pairs,
                predicted_ns: predicted,
                error_ns: error,
                error_fraction: error as f64 / predicted as f64,
                within_target: error.unsigned_abs() <= (predicted / 20).max(200),
            };
            if a.json && !a.quiet {
                println!("{}", serde_json::to_string(&point).expect("serialize"));
            }
            lat.push(point);
        }
    }
    let mut bw = Vec::new();
    let (big, qd) = (256u64 << 10, 4);
    let peak = ModelConfig::pcm().peak_rate(false) * 1000.0;
    for op in [Op::Read, Op::Write] {
        let r = measure(a, op, big, qd, a.runs, Some(("pcm", Vec::new())))?;
        let mb_s = r.mib_s * 1.048_576;
        let point = BandwidthPoint {
            path: "model-accuracy",
            figure: "bandwidth",
            op,
            size: big,
            qd,
            mb_s,
            peak_mb_s: peak,
            error_fraction: mb_s / peak - 1.0,
            within_target: (mb_s / peak - 1.0).abs() <= 0.03,
        };
        if a.json && !a.quiet {
            println!("{}", serde_json::to_string(&point).expect("serialize"));
        }
        bw.push(point);
    }
    let c = cost(size, 200_000);
    if a.json && !a.quiet {
        println!("{}", serde_json::to_string(&c).expect("serialize"));
    }
    if !a.json && !a.quiet {
        print_accuracy(&lat, &bw, &c);
    }
    Ok((lat, bw, c))
}

fn print_accuracy(lat: &[LatencyPoint], bw: &[BandwidthPoint], c: &CostPoint) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "op",
        "size",
        "array ns",
        "p50 none",
        "p50 model",
        "added",
        "pairs: spread",
        "predicted",
        "error",
        "ok",
    ]);
    for p in lat {
        t.add_row([
            format!("{:?}", p.op).to_lowercase(),
            p.size.to_string(),
            p.array_ns.to_string(),
            p.none_p50_ns.to_string(),
            p.model_p50_ns.to_string(),
            p.added_ns.to_string(),
            format!(
                "{}: {}..{}",
                p.pairs, p.added_spread_ns[0], p.added_spread_ns[1]
            ),
            p.predicted_ns.to_string(),
            format!("{} ns ({:+.1}%)", p.error_ns, p.error_fraction * 100.0),
            if p.within_target { "yes" } else { "no" }.to_string(),
        ]);
    }
    println!("latency the pcm model adds at queue depth 1, against its own prediction");
    println!("(target: within 5% or 200 ns; p50s and added: medians over pairs of runs)");
    println!("{t}");
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header(["op", "size", "qd", "MB/s", "peak MB/s", "error", "ok"]);
    for p in bw {
        t.add_row([
            format!("{:?}", p.op).to_lowercase(),
            p.size.to_string(),
            p.qd.to_string(),
            format!("{:.0}", p.mb_s),
            format!("{:.0}", p.peak_mb_s),
            format!("{:+.1}%", p.error_fraction * 100.0),
            if p.within_target { "yes" } else { "no" }.to_string(),
        ]);
    }
    println!("bandwidth of large transfers under the pcm model, against its analytical peak");
    println!("(target: within 3%)");
    println!("{t}");
    println!(
        "model work per {}-byte request: {:.0} ns, median of {} rounds ({:.0}-{:.0}; {:.2} M \
         requests/s on one core)",
        c.size,
        c.ns_per_request,
        c.rounds,
        c.ns_spread[0],
        c.ns_spread[1],
        c.max_requests_per_s / 1e6
    );
}
