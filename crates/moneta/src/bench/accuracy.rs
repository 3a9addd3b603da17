//! `moneta bench --path model-accuracy`: the array's timing model measured against itself.
//!
//! Three figures, each against what the model says it should be:
//!
//! - **latency**: for each array latency of the sweep (Moneta §V-C: 4 ns to 128 µs), a
//!   request at queue depth 1 on a daemon with the `pcm` model at that latency, minus the same
//!   request on a daemon without a model, against the model's own time for that request alone
//!   on an idle array; within 5% or 200 ns, whichever is larger, is the target. Each of
//!   `--runs` runs (at least three) starts a daemon with the model and one without and keeps
//!   both up while it measures them in eight pairs of short bursts (an eighth of `--duration`
//!   each), one right after the other and in turns which goes first; the point is the median
//!   of the pairs' differences of medians. A host whose cross-core latency jumps every few
//!   seconds (by a microsecond on some virtual machines) then moves both halves of nearly
//!   every pair alike, where medians of separate runs compared one state of the host with
//!   another, and a probe of the cores around each pair tells the host's close state from its
//!   far one, reported apart;
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
    /// Each run's median difference (ns): a run's pairs share a pair of daemons.
    pub runs_added_ns: Vec<i64>,
    /// What the model says it adds: the request alone on an idle array (ns).
    pub predicted_ns: u64,
    /// Measured minus predicted (ns).
    pub error_ns: i64,
    /// That over the prediction.
    pub error_fraction: f64,
    /// Whether the error is within 5% of the prediction or 200 ns.
    pub within_target: bool,
    /// The same from the pairs measured while the host's two CPUs were close (a probe's
    /// cache-line round trip in the lower of its two groups; every pair when the host stayed
    /// in one state).
    pub close: Option<StatePoint>,
    /// And from the pairs measured while they were far apart, if any.
    pub far: Option<StatePoint>,
}

/// What the pairs of a latency point measured in one state of the host say.
#[derive(Serialize, Clone, Debug)]
pub struct StatePoint {
    /// Pairs measured in this state.
    pub pairs: usize,
    /// The median probe of those pairs: one cache line between the first two CPUs and back
    /// (ns).
    pub line_round_trip_ns: u64,
    /// The median of those pairs' differences (ns).
    pub added_ns: i64,
    /// Added minus predicted (ns).
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

/// Pairs of bursts per `--runs` of the latency comparison: each burst lasts this fraction of
/// `--duration` (or of `--ops`).
pub const BURSTS_PER_RUN: usize = 8;

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

/// One pair of bursts of a latency point.
struct Pair {
    /// The median latency without the model (ns).
    none_ns: u64,
    /// The median latency with it (ns).
    model_ns: u64,
    /// The slower of the two probes of the host's cores around the pair (ns per round trip).
    probe_ns: u64,
    /// Which run (pair of daemons) it was measured on.
    run: usize,
}

impl Pair {
    /// What the model added in this pair (ns).
    fn added(&self) -> i64 {
        self.model_ns as i64 - self.none_ns as i64
    }
}

/// Cache-line round trips of each probe of the host's state (a few milliseconds).
const PROBE_TRIPS: u64 = 5_000;

/// Probes of the two states of a host whose vCPUs move closer and farther apart differ by
/// several times (70-100 ns against 430-540 ns on the machines of docs/performance.md); sorted,
/// they fall into two groups where neighbours differ by at least this factor.
const STATE_GAP: f64 = 2.0;

/// A state of the host counts only if at least this share of the probes fell in it: a moment
/// in which the two vCPUs shared a core (a probe of 40 ns beside a hundred of 130) is not the
/// state the host was in.
const STATE_MIN_SHARE: f64 = 0.1;

/// The slowest probe that counts as the close state: the upper end of the lower group when
/// the sorted probes jump by [`STATE_GAP`] or more somewhere with at least
/// [`STATE_MIN_SHARE`] of them on each side (at the largest such jump), else every probe (one
/// state throughout).
fn close_limit(probes: &[u64]) -> u64 {
    let mut v = probes.to_vec();
    v.sort_unstable();
    let least = ((v.len() as f64 * STATE_MIN_SHARE).ceil() as usize).max(1);
    let mut best = (STATE_GAP, u64::MAX);
    for (i, w) in v.windows(2).enumerate() {
        let (below, above) = (i + 1, v.len() - i - 1);
        if below < least || above < least {
            continue;
        }
        let r = w[1] as f64 / w[0].max(1) as f64;
        if r >= best.0 {
            best = (r, w[0]);
        }
    }
    best.1
}

/// The figures of one point from its pairs: over all of them and in each state of the host.
fn latency_point(op: Op, size: u64, array_ns: u64, pairs: &[Pair], limit: u64) -> LatencyPoint {
    let predicted = predicted(array_ns, op == Op::Write, size);
    let mut nones: Vec<u64> = pairs.iter().map(|p| p.none_ns).collect();
    let mut withs: Vec<u64> = pairs.iter().map(|p| p.model_ns).collect();
    let mut diffs: Vec<i64> = pairs.iter().map(Pair::added).collect();
    let added = median(&mut diffs);
    let error = added - predicted as i64;
    let state = |close: bool| {
        let of: Vec<&Pair> = pairs
            .iter()
            .filter(|p| (p.probe_ns <= limit) == close)
            .collect();
        if of.is_empty() {
            return None;
        }
        let mut d: Vec<i64> = of.iter().map(|p| p.added()).collect();
        let mut probes: Vec<u64> = of.iter().map(|p| p.probe_ns).collect();
        let added = median(&mut d);
        let error = added - predicted as i64;
        Some(StatePoint {
            pairs: of.len(),
            line_round_trip_ns: median(&mut probes),
            added_ns: added,
            error_ns: error,
            error_fraction: error as f64 / predicted as f64,
            within_target: within(error, predicted),
        })
    };
    let runs = pairs.iter().map(|p| p.run + 1).max().unwrap_or(0);
    let runs_added_ns = (0..runs)
        .map(|r| {
            let mut d: Vec<i64> = pairs
                .iter()
                .filter(|p| p.run == r)
                .map(Pair::added)
                .collect();
            median(&mut d)
        })
        .collect();
    LatencyPoint {
        path: "model-accuracy",
        figure: "latency",
        op,
        size,
        array_ns,
        runs_added_ns,
        none_p50_ns: median(&mut nones),
        model_p50_ns: median(&mut withs),
        added_ns: added,
        added_spread_ns: [diffs[0], diffs[diffs.len() - 1]],
        pairs: pairs.len(),
        predicted_ns: predicted,
        error_ns: error,
        error_fraction: error as f64 / predicted as f64,
        within_target: within(error, predicted),
        close: state(true),
        far: state(false),
    }
}

/// The target: within 5% of the prediction or 200 ns, whichever is larger.
fn within(error: i64, predicted: u64) -> bool {
    error.unsigned_abs() <= (predicted / 20).max(200)
}

/// The whole comparison; prints it unless quiet.
pub fn run_accuracy(
    a: &BenchArgs,
) -> Result<(Vec<LatencyPoint>, Vec<BandwidthPoint>, CostPoint), String> {
    if a.socket.is_some() {
        return Err("--path model-accuracy starts daemons of its own: leave out --socket".into());
    }
    let size = a.size.first().copied().unwrap_or(4096);
    let runs = a.runs.max(3);
    let raw = |op: Op, model: Option<Vec<String>>| {
        let mut b = a.clone();
        b.paths = vec![Path::MonetaRaw];
        b.op = op;
        b.size = vec![size];
        b.qd = 1;
        b.threads = 1;
        b.model = model.as_ref().map(|_| "pcm".to_string());
        b.model_set = model.unwrap_or_default();
        b
    };
    let seconds = a.duration / BURSTS_PER_RUN as f64;
    let limit = a.ops.map(|n| n.div_ceil(BURSTS_PER_RUN as u64));
    let probe = || machine::line_probe_ns(PROBE_TRIPS).unwrap_or(0);
    // Every point's pairs, kept until all are measured: the host's states are told apart
    // by all the probes of the bench.
    let mut measured: Vec<(Op, u64, Vec<Pair>)> = Vec::new();
    for op in [Op::Read, Op::Write] {
        for &ns in &SWEEP_NS {
            let set = vec![format!("read_ns={ns}"), format!("write_ns={ns}")];
            let b = raw(op, Some(set));
            let mut pairs_of_point = Vec::with_capacity(runs * BURSTS_PER_RUN);
            for run in 0..runs {
                // Each run has daemons of its own: where a daemon's poller, channel and array
                // land moves its latency by a few hundred nanoseconds from one start to the
                // next, and the median over runs does not rest on one start.
                let unmodelled = BenchDaemon::get(&raw(op, None), a.region)?;
                let none = raw_target(&unmodelled, &raw(op, None))?;
                let modelled = BenchDaemon::get(&b, a.region)?;
                let with = raw_target(&modelled, &b)?;
                if a.warmup > 0.0 {
                    run_threads(&b, size, &none, a.warmup / 2.0, None)?;
                    run_threads(&b, size, &with, a.warmup / 2.0, None)?;
                }
                // Each pair's bursts draw offsets of their own: bursts replaying one sequence
                // would find rows their last replay left open in the array's row buffers
                // (every request of a short burst a row hit).
                let burst = |t: &Target, pair: usize| -> Result<u64, String> {
                    let mut bp = b.clone();
                    bp.seed = a.seed.wrapping_add((run * BURSTS_PER_RUN + pair) as u64);
                    let r = run_threads(&bp, size, t, seconds, limit)?;
                    Ok(r.hist.value_at_quantile(0.5))
                };
                let mut before = probe();
                for i in 0..BURSTS_PER_RUN {
                    // Without and with the model in short bursts, one right after the other,
                    // so both see the same host; which goes first alternates, so a change of
                    // the host's state between the two favours neither.
                    let (none_ns, model_ns) = if (run + i) % 2 == 0 {
                        let n = burst(&none, i)?;
                        (n, burst(&with, i)?)
                    } else {
                        let w = burst(&with, i)?;
                        (burst(&none, i)?, w)
                    };
                    let after = probe();
                    pairs_of_point.push(Pair {
                        none_ns,
                        model_ns,
                        probe_ns: before.max(after),
                        run,
                    });
                    before = after;
                }
            }
            measured.push((op, ns, pairs_of_point));
        }
    }
    let probes: Vec<u64> = measured
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|p| p.probe_ns))
        .collect();
    let limit = close_limit(&probes);
    let mut lat = Vec::new();
    for (op, ns, pairs) in measured {
        let point = latency_point(op, size, ns, &pairs, limit);
        if a.json && !a.quiet {
            println!("{}", serde_json::to_string(&point).expect("serialize"));
        }
        lat.push(point);
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
        "predicted",
        "all pairs: added (spread)",
        "error",
        "close: pairs, error",
        "ok",
        "far: pairs, error",
    ]);
    let err = |e: i64, f: f64| format!("{e} ns ({:+.1}%)", f * 100.0);
    let state = |s: &Option<StatePoint>| match s {
        Some(s) => format!("{}: {}", s.pairs, err(s.error_ns, s.error_fraction)),
        None => "-".to_string(),
    };
    for p in lat {
        t.add_row([
            format!("{:?}", p.op).to_lowercase(),
            p.size.to_string(),
            p.array_ns.to_string(),
            p.none_p50_ns.to_string(),
            p.model_p50_ns.to_string(),
            p.predicted_ns.to_string(),
            format!(
                "{}: {} ({}..{})",
                p.pairs, p.added_ns, p.added_spread_ns[0], p.added_spread_ns[1]
            ),
            err(p.error_ns, p.error_fraction),
            state(&p.close),
            match &p.close {
                Some(c) if c.within_target => "yes",
                _ => "no",
            }
            .to_string(),
            state(&p.far),
        ]);
    }
    let probe = |far: bool| {
        let mut v: Vec<u64> = lat
            .iter()
            .filter_map(|p| {
                if far {
                    p.far.as_ref()
                } else {
                    p.close.as_ref()
                }
            })
            .map(|s| s.line_round_trip_ns)
            .collect();
        (!v.is_empty()).then(|| median(&mut v))
    };
    println!("latency the pcm model adds at queue depth 1, against its own prediction");
    println!(
        "(target: within 5% or 200 ns in the host's close state; p50s: medians over pairs of \
         bursts; added: the median of the pairs' differences)"
    );
    println!("{t}");
    match (probe(false), probe(true)) {
        (Some(c), Some(f)) => println!(
            "host states, by a probe of cores around each pair: close (a cache line there and \
             back in {c} ns) and far ({f} ns)"
        ),
        (Some(c), None) => println!(
            "host state: close throughout (a cache line there and back in {c} ns around each pair)"
        ),
        _ => {}
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_in_two_groups_split_at_the_largest_jump() {
        // Close probes spread over two near clusters, far ones several times slower, and one
        // in between: the split falls at the largest jump, the one in between counted far.
        let probes = [31, 45, 50, 64, 71, 80, 100, 225, 430, 470, 540];
        assert_eq!(close_limit(&probes), 100);
        // One state throughout: every probe is close.
        assert_eq!(close_limit(&[70, 72, 75, 90, 110]), u64::MAX);
        assert_eq!(close_limit(&[]), u64::MAX);
        // No probe could be made (one CPU): all zero, all close.
        assert_eq!(close_limit(&[0, 0, 0]), u64::MAX);
        // A probe or two of a moment closer still (two vCPUs on one core) beside the host's
        // state: one state, not a close state of two pairs.
        let mut probes = vec![41, 39];
        probes.extend((0..46).map(|i| 125 + i % 20));
        assert_eq!(close_limit(&probes), u64::MAX);
        // Three states: the rare closest counts with the close one, the far one apart.
        probes.extend((0..12).map(|i| 800 + i * 10));
        assert_eq!(close_limit(&probes), 144);
    }

    #[test]
    fn a_point_is_judged_on_its_close_pairs() {
        let pair = |none_ns, model_ns, probe_ns, run| Pair {
            none_ns,
            model_ns,
            probe_ns,
            run,
        };
        let predicted = predicted(48, false, 4096);
        // Close pairs add the prediction exactly; far ones add 900 ns less.
        let mut pairs = Vec::new();
        for run in 0..3 {
            for _ in 0..3 {
                pairs.push(pair(1_000, 1_000 + predicted, 80, run));
            }
            pairs.push(pair(3_000, 2_100 + predicted, 480, run));
        }
        let p = latency_point(Op::Read, 4096, 48, &pairs, close_limit(&[80, 480]));
        assert_eq!(p.pairs, 12);
        assert_eq!(p.runs_added_ns.len(), 3);
        let close = p.close.expect("close pairs");
        let far = p.far.expect("far pairs");
        assert_eq!((close.pairs, far.pairs), (9, 3));
        assert_eq!(close.error_ns, 0);
        assert!(close.within_target);
        assert_eq!(far.error_ns, -900);
        assert!(!far.within_target);
        assert_eq!(
            (close.line_round_trip_ns, far.line_round_trip_ns),
            (80, 480)
        );
    }
}
