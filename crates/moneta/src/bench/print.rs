//! The tables `moneta bench` prints.

use super::*;

pub(crate) fn print_table(recs: &[Record]) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED);
    t.set_header([
        "path",
        "op",
        "size",
        "qd",
        "thr",
        "p50 ns",
        "p99 ns",
        "p50 spread",
        "kIOPS",
        "MiB/s",
        "p50 vs psync",
        "IOPS vs best kernel",
    ]);
    for r in recs {
        let ours = !r.path.starts_with("kernel") && r.path != "perm-check";
        let same = |k: &&Record| k.op == r.op && k.size == r.size && k.threads == r.threads;
        let psync = recs.iter().filter(same).find(|k| k.path == "kernel-psync");
        let ratio = match psync {
            Some(k) if ours => format!("{:.2}x", r.lat_ns.p50 as f64 / k.lat_ns.p50 as f64),
            _ => String::new(),
        };
        // The fastest kernel path at the same queue depth (psync counts at depth 1 only).
        let best = recs
            .iter()
            .filter(same)
            .filter(|k| k.path.starts_with("kernel") && k.qd == r.qd)
            .map(|k| k.iops)
            .fold(0.0f64, f64::max);
        let vs_best = if ours && best > 0.0 {
            format!("{:.2}x", r.iops / best)
        } else {
            String::new()
        };
        let what = match (r.records, r.neighbour) {
            (Some(n), _) => format!("{} ({n} rec)", r.path),
            (None, Some(true)) => format!("{} beside 1M reader", r.path),
            (None, Some(false)) => format!("{} alone", r.path),
            (None, None) => r.path.to_string(),
        };
        t.add_row([
            what,
            format!("{:?}", r.op).to_lowercase(),
            r.size.to_string(),
            r.qd.to_string(),
            r.threads.to_string(),
            r.lat_ns.p50.to_string(),
            r.lat_ns.p99.to_string(),
            format!("{}-{}", r.p50_spread[0], r.p50_spread[1]),
            format!("{:.1}", r.iops / 1000.0),
            format!("{:.1}", r.mib_s),
            ratio,
            vs_best,
        ]);
    }
    println!("{t}");
}

pub(crate) fn print_breakdown(recs: &[Record]) {
    use comfy_table::{presets::UTF8_FULL_CONDENSED, Table};
    for r in recs {
        let Some(parts) = &r.breakdown else { continue };
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header(["stage", "ns", "share", "how"]);
        let total: f64 = parts.iter().map(|c| c.ns).sum();
        for c in parts {
            t.add_row([
                c.name.to_string(),
                format!("{:.0}", c.ns),
                format!("{:.0}%", 100.0 * c.ns / total.max(1.0)),
                c.how.to_string(),
            ]);
        }
        println!(
            "{} {} {} B: {:.0} ns per request (mean {} ns)",
            r.path,
            format!("{:?}", r.op).to_lowercase(),
            r.size,
            total,
            r.lat_ns.mean
        );
        println!("{t}");
    }
}
