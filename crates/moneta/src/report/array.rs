//! The experiments of the first Moneta paper (the array) in `moneta report`: every one runs on
//! private daemons with the array's timing model (`monetad --model pcm`), so what they show is
//! the modelled hardware driven through the real device, channels and clients.
//!
//! - `array-latency` (Moneta Figure 4): bandwidth as the array's latency grows from 4 ns to
//!   128 µs, with 1, 2, 4 and 8 memory controllers;
//! - `array-bandwidth` (Moneta Figure 2): bandwidth against request size, with the link's ideal;
//! - `fairness` (Moneta §IV-B): small readers beside large ones, in order against round-robin;
//! - `power` (Moneta §V-D): the modelled device's power and efficiency against request size;
//! - `wear` (Moneta §II-B): row wear under a hot spot, with start-gap and without.

use std::path::Path;

use super::experiments::{draw_bars, draw_chart, fmt_ns, num, size_chart, size_name};
use super::html::{Section, Table};
use super::plot::{BarChart, Chart, Scale, Series};
use super::{Set, SetArg, Step};
use crate::bench::{Op, Record};

/// The array latencies of the sweep (ns).
fn latencies(set: &Set) -> Vec<u64> {
    match set.kind {
        SetArg::Tiny => vec![48, 16_000],
        SetArg::Quick => vec![4, 150, 1_000, 4_000, 16_000, 128_000],
        SetArg::Full => vec![
            4, 16, 64, 150, 256, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000,
        ],
    }
}

fn controllers(set: &Set) -> Vec<u64> {
    match set.kind {
        SetArg::Tiny => vec![1, 4],
        _ => vec![1, 2, 4, 8],
    }
}

fn step(label: String, args: Vec<String>, set: &Set) -> Step {
    let mut a = args;
    a.extend(set.timing());
    Step::Bench { label, args: a }
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The steps of `id`.
pub fn steps(id: &str, set: &Set) -> Vec<Step> {
    let tiny = set.kind == SetArg::Tiny;
    match id {
        "array-latency" => {
            let mut v = Vec::new();
            for c in controllers(set) {
                for l in latencies(set) {
                    let mut a = strs(&[
                        "--path",
                        "moneta-raw",
                        "--op",
                        "read",
                        "--size",
                        "64K",
                        "--qd",
                        "8",
                        "--model",
                        "pcm",
                    ]);
                    for kv in [
                        format!("controllers={c}"),
                        format!("read_ns={l}"),
                        format!("write_ns={l}"),
                    ] {
                        a.extend(["--model-set".to_string(), kv]);
                    }
                    v.push(step(format!("{c} controllers, {l} ns"), a, set));
                }
            }
            v
        }
        "array-bandwidth" => {
            let sizes = if tiny {
                "4096,262144"
            } else {
                "512,2048,8192,32768,131072,524288"
            };
            ["read", "write", "randrw"]
                .iter()
                .map(|op| {
                    let a = strs(&[
                        "--path",
                        "moneta-raw",
                        "--op",
                        op,
                        "--size",
                        sizes,
                        "--qd",
                        "8",
                        "--model",
                        "pcm",
                    ]);
                    step(format!("{op}s under the pcm model"), a, set)
                })
                .collect()
        }
        "fairness" => ["2q", "rr"]
            .iter()
            .map(|p| {
                let a = strs(&[
                    "--path",
                    "moneta-raw",
                    "--op",
                    "read",
                    "--size",
                    "4K",
                    "--threads",
                    "4",
                    "--neighbour",
                    "--neighbour-size",
                    "512K",
                    "--neighbour-threads",
                    "4",
                    "--model",
                    "pcm",
                    "--model-set",
                    &format!("policy={p}"),
                ]);
                step(format!("{p} scheduling"), a, set)
            })
            .collect(),
        "power" => {
            let sizes = if tiny {
                "512,8192"
            } else {
                "512,2048,8192,32768,131072"
            };
            ["write", "read"]
                .iter()
                .map(|op| {
                    let a = strs(&[
                        "--path",
                        "moneta-raw",
                        "--op",
                        op,
                        "--size",
                        sizes,
                        "--qd",
                        "8",
                        "--model",
                        "pcm",
                    ]);
                    step(format!("random {op}s"), a, set)
                })
                .collect()
        }
        "wear" => [("with start-gap", "100"), ("without start-gap", "0")]
            .iter()
            .map(|(label, gap)| {
                let a = strs(&[
                    "--path",
                    "moneta-raw",
                    "--op",
                    "write",
                    "--size",
                    "8K",
                    "--region",
                    "64K",
                    "--array-size",
                    "4M",
                    "--qd",
                    "8",
                    "--model",
                    "pcm",
                    "--model-set",
                    &format!("gap_interval={gap}"),
                ]);
                step(label.to_string(), a, set)
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn param(r: &Record, k: &str) -> f64 {
    r.model_parameters
        .as_ref()
        .and_then(|p| p.get(k))
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// MB/s (10^6 bytes, as the paper counts) of a record.
fn mb_s(r: &Record) -> f64 {
    r.mib_s * 1.048_576
}

/// Writes the section of `id` from its records.
pub fn present(
    id: &str,
    data: &[(String, &Record)],
    dir: &Path,
    s: &mut Section,
) -> Result<(), String> {
    match id {
        "array-latency" => latency(data, dir, s),
        "array-bandwidth" => bandwidth(data, dir, s),
        "fairness" => fairness(data, dir, s),
        "power" => power(data, dir, s),
        "wear" => wear(data, dir, s),
        _ => Ok(()),
    }
}

fn latency(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let mut ctrls: Vec<f64> = Vec::new();
    for (_, r) in data {
        let c = param(r, "controllers");
        if !ctrls.contains(&c) {
            ctrls.push(c);
        }
    }
    let series: Vec<Series> = ctrls
        .iter()
        .map(|&c| Series {
            label: format!("{c} controllers"),
            points: data
                .iter()
                .filter(|(_, r)| param(r, "controllers") == c)
                .map(|(_, r)| (param(r, "read_ns"), mb_s(r)))
                .collect(),
            dashed: false,
        })
        .collect();
    draw_chart(
        &Chart {
            title: "64 KiB random reads, 8 in flight, as the array's latency grows".into(),
            x_label: "array read and write latency (ns)".into(),
            y_label: "MB/s".into(),
            x_scale: Scale::Log10,
            y_scale: Scale::Linear,
            series: series.clone(),
            y_from_zero: true,
        },
        dir,
        "array-latency.png",
        s,
    )?;
    let lats: Vec<f64> = series
        .first()
        .map(|sr| sr.points.iter().map(|p| p.0).collect())
        .unwrap_or_default();
    let mut header = vec!["latency".to_string()];
    header.extend(series.iter().map(|sr| format!("{} MB/s", sr.label)));
    let rows = lats
        .iter()
        .map(|&l| {
            let mut row = vec![fmt_ns(l)];
            for sr in &series {
                row.push(
                    sr.points
                        .iter()
                        .find(|p| p.0 == l)
                        .map(|p| num(p.1))
                        .unwrap_or_default(),
                );
            }
            row
        })
        .collect();
    s.table = Some(Table { header, rows });
    // How much of the fastest point each controller count keeps at 1 µs and 4 µs.
    let at = |sr: &Series, l: f64| sr.points.iter().find(|p| p.0 == l).map(|p| p.1);
    let mut parts = Vec::new();
    for sr in &series {
        let best = sr.points.iter().map(|p| p.1).fold(0.0, f64::max);
        let mut kept = Vec::new();
        for l in [1_000.0, 4_000.0, 16_000.0] {
            if let Some(v) = at(sr, l) {
                kept.push(format!("{:.0}% at {}", v / best * 100.0, fmt_ns(l)));
            }
        }
        if !kept.is_empty() {
            parts.push(format!("{}: {}", sr.label, kept.join(", ")));
        }
    }
    s.reading = if parts.is_empty() {
        "Bandwidth by array latency and controllers; see the table.".into()
    } else {
        format!(
            "Bandwidth kept as the array slows, of each configuration's best: {}.",
            parts.join("; ")
        )
    };
    s.notes.push(
        "64 KiB reads (eight stripes each) keep the host's own work per request small beside \
         the model's; the paper's figure is for its workload of 4 KB and larger accesses."
            .into(),
    );
    Ok(())
}

fn bandwidth(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let recs: Vec<&Record> = data.iter().map(|(_, r)| *r).collect();
    let mut series = Vec::new();
    for (op, name) in [
        (Op::Read, "reads"),
        (Op::Write, "writes"),
        (Op::Randrw, "50/50"),
    ] {
        let points: Vec<(f64, f64)> = recs
            .iter()
            .filter(|r| r.op == op)
            .map(|r| (r.size as f64, mb_s(r)))
            .collect();
        if !points.is_empty() {
            series.push(Series {
                label: name.into(),
                points,
                dashed: false,
            });
        }
    }
    let sizes: Vec<f64> = recs.iter().map(|r| r.size as f64).collect();
    let (lo, hi) = sizes
        .iter()
        .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
    let link = recs
        .first()
        .map(|r| param(r, "link_rate") * 1000.0)
        .unwrap_or(2000.0);
    if lo <= hi {
        series.push(Series {
            label: "ideal (the link, one way)".into(),
            points: vec![(lo, link), (hi, link)],
            dashed: true,
        });
        series.push(Series {
            label: "ideal (the link, both ways)".into(),
            points: vec![(lo, 2.0 * link), (hi, 2.0 * link)],
            dashed: true,
        });
    }
    draw_chart(
        &size_chart(
            "Bandwidth against request size under the pcm model, 8 in flight",
            "MB/s",
            Scale::Linear,
            series,
        ),
        dir,
        "array-bandwidth.png",
        s,
    )?;
    let mut rows = Vec::new();
    for r in &recs {
        let ideal = if r.op == Op::Randrw { 2.0 * link } else { link };
        rows.push(vec![
            super::experiments::op_name(r.op).to_string(),
            size_name(r.size),
            num(mb_s(r)),
            format!("{:.0}%", mb_s(r) / ideal * 100.0),
            num(r.iops / 1e3),
        ]);
    }
    s.table = Some(Table {
        header: vec![
            "op".into(),
            "size".into(),
            "MB/s".into(),
            "of the link's ideal".into(),
            "kIOPS".into(),
        ],
        rows,
    });
    let best = |op: Op| {
        recs.iter()
            .filter(|r| r.op == op)
            .map(|r| mb_s(r))
            .fold(0.0, f64::max)
    };
    s.reading = format!(
        "Largest requests: reads {:.0} MB/s and writes {:.0} MB/s against the link's {:.0}; \
         mixed {:.0} MB/s against {:.0} both ways.",
        best(Op::Read),
        best(Op::Write),
        link,
        best(Op::Randrw),
        2.0 * link
    );
    s.notes.push(
        "Small requests are bound by the host (the device is a thread that copies and checks \
         every request): the model's own limit for them is far higher, as the model-accuracy \
         bench shows."
            .into(),
    );
    Ok(())
}

fn fairness(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let mut rows = Vec::new();
    let mut categories = Vec::new();
    let mut small_alone = Vec::new();
    let mut small_beside = Vec::new();
    let mut large = Vec::new();
    for (label, r) in data {
        if r.neighbour == Some(true) {
            categories.push(label.clone());
            small_beside.push(mb_s(r));
            large.push(r.neighbour_mib_s.map(|m| m * 1.048_576).unwrap_or(f64::NAN));
        } else {
            small_alone.push(mb_s(r));
        }
    }
    for (i, c) in categories.iter().enumerate() {
        rows.push(vec![
            c.clone(),
            num(*small_alone.get(i).unwrap_or(&f64::NAN)),
            num(small_beside[i]),
            num(large[i]),
            num(small_beside[i] + large[i]),
        ]);
    }
    s.table = Some(Table {
        header: vec![
            "policy".into(),
            "4 KB readers alone MB/s".into(),
            "4 KB readers beside MB/s".into(),
            "512 KB readers MB/s".into(),
            "together MB/s".into(),
        ],
        rows,
    });
    draw_bars(
        &BarChart {
            title: "Four 4 KB readers beside four 512 KB readers".into(),
            y_label: "MB/s".into(),
            categories: categories.clone(),
            groups: vec![
                ("4 KB readers".into(), small_beside.clone()),
                ("512 KB readers".into(), large.clone()),
            ],
            stacked: false,
        },
        dir,
        "fairness.png",
        s,
    )?;
    if small_beside.len() == 2 {
        s.reading = format!(
            "Round-robin gives the 4 KB readers {:.1}x what in-order scheduling gives them \
             ({:.0} against {:.0} MB/s); the 512 KB readers go from {:.0} to {:.0} MB/s.",
            small_beside[1] / small_beside[0],
            small_beside[1],
            small_beside[0],
            large[0],
            large[1]
        );
    }
    s.notes.push(
        "Two queues (reads and writes apart) in order, as Moneta+2Q, against round-robin in \
         8 KB transfers, as Moneta+Balance. The large readers are another process (the bench's \
         --neighbour) on the same daemon."
            .into(),
    );
    Ok(())
}

fn power(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let recs: Vec<&Record> = data
        .iter()
        .map(|(_, r)| *r)
        .filter(|r| r.model_figures.is_some())
        .collect();
    let fig = |r: &Record| r.model_figures.expect("filtered");
    let mut series = Vec::new();
    let mut eff = Vec::new();
    for (op, name) in [(Op::Write, "writes"), (Op::Read, "reads")] {
        series.push(Series {
            label: name.into(),
            points: recs
                .iter()
                .filter(|r| r.op == op)
                .map(|r| (r.size as f64, fig(r).power_w))
                .collect(),
            dashed: false,
        });
        eff.push(Series {
            label: name.into(),
            points: recs
                .iter()
                .filter(|r| r.op == op)
                .map(|r| (r.size as f64, fig(r).mb_s_per_w))
                .collect(),
            dashed: false,
        });
    }
    draw_chart(
        &size_chart(
            "The modelled device's power against request size",
            "W",
            Scale::Linear,
            series,
        ),
        dir,
        "power.png",
        s,
    )?;
    draw_chart(
        &size_chart(
            "Efficiency against request size",
            "MB/s per W",
            Scale::Log10,
            eff,
        ),
        dir,
        "power-efficiency.png",
        s,
    )?;
    s.table = Some(Table {
        header: vec![
            "op".into(),
            "size".into(),
            "MB/s".into(),
            "W".into(),
            "µJ per request".into(),
            "MB/s per W".into(),
        ],
        rows: recs
            .iter()
            .map(|r| {
                let f = fig(r);
                vec![
                    super::experiments::op_name(r.op).to_string(),
                    size_name(r.size),
                    num(mb_s(r)),
                    format!("{:.2}", f.power_w),
                    format!("{:.2}", f.energy_per_op_j * 1e6),
                    num(f.mb_s_per_w),
                ]
            })
            .collect(),
    });
    let find = |op: Op, size: u64| recs.iter().find(|r| r.op == op && r.size == size);
    if let (Some(w8), Some(w512)) = (find(Op::Write, 8192), find(Op::Write, 512)) {
        let (a, b) = (fig(w8), fig(w512));
        s.reading = format!(
            "Random 8 KB writes: {:.2} W; 512 B writes: {:.2} W, their MB/s per watt {:.0}% \
             below 8 KB writes'.",
            a.power_w,
            b.power_w,
            (1.0 - b.mb_s_per_w / a.mb_s_per_w) * 100.0
        );
    }
    s.notes.push(
        "Power is the Table I model integrated over what the modelled parts did during each \
         run (idle power included), as the daemon reports it (OP_MODEL). Small requests run at \
         the host's rate, below the array's: at the array's own peak 512 B writes would draw \
         more."
            .into(),
    );
    Ok(())
}

fn wear(data: &[(String, &Record)], dir: &Path, s: &mut Section) -> Result<(), String> {
    let mut rows = Vec::new();
    let mut cats = Vec::new();
    let mut ratio = Vec::new();
    for (label, r) in data {
        let Some(f) = r.model_figures else { continue };
        cats.push(label.clone());
        ratio.push(f.wear_max_over_mean);
        rows.push(vec![
            label.clone(),
            format!("{:.0}", f.wear_max),
            format!("{:.2}", f.wear_mean),
            format!("{:.1}", f.wear_max_over_mean),
            format!(
                "{:.2}%",
                if f.wear_max_over_mean > 0.0 {
                    100.0 / f.wear_max_over_mean
                } else {
                    0.0
                }
            ),
            format!("{:.0}", f.gap_moves),
        ]);
    }
    s.table = Some(Table {
        header: vec![
            "configuration".into(),
            "most writes of a row".into(),
            "mean".into(),
            "max / mean".into(),
            "of the ideal lifetime".into(),
            "gap moves".into(),
        ],
        rows,
    });
    draw_bars(
        &BarChart {
            title: "Row wear under a hot spot: most written row over the mean".into(),
            y_label: "max / mean writes per row".into(),
            categories: cats,
            groups: vec![("max / mean".into(), ratio.clone())],
            stacked: false,
        },
        dir,
        "wear.png",
        s,
    )?;
    if ratio.len() == 2 && ratio[0] > 0.0 {
        s.reading = format!(
            "Random 8 KB writes to a 64 KiB hot spot of a 4 MiB array: the most written row \
             takes {:.1}x the mean with start-gap and {:.1}x without ({:.1}x less uneven).",
            ratio[0],
            ratio[1],
            ratio[1] / ratio[0]
        );
    }
    s.notes.push(
        "Start-gap moves a line every 100 writes of a controller; the gap has to sweep a \
         controller's rows many times for the wear to even out, so the longer the run the \
         closer the ratio comes to 1 (the small array, 128 rows per controller, lets the gap \
         sweep it several times a second). The device's wear is counted since the daemon started \
         (a volatile array keeps no wear file)."
            .into(),
    );
    Ok(())
}
