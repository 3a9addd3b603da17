//! The model's figures as `key value` pairs: what `moneta status` shows and the control
//! protocol's `OP_MODEL` carries (dotted keys, one value each).

use super::{ModelConfig, ModelStats};

/// Every figure of `stats` for a model of `cfg`, with its parameters.
pub fn pairs(cfg: &ModelConfig, stats: &ModelStats) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut put = |k: String, v: String| out.push((k, v));
    put("model".into(), cfg.name.clone());
    for (k, v) in cfg.parameters() {
        put(format!("parameters.{k}"), v);
    }
    let elapsed = stats.elapsed_ns;
    let share = |busy: u64| {
        if elapsed == 0 {
            0.0
        } else {
            (busy as f64 / elapsed as f64).min(1.0)
        }
    };
    put("elapsed_ns".into(), elapsed.to_string());
    put("reads".into(), stats.reads.to_string());
    put("writes".into(), stats.writes.to_string());
    put("bytes_read".into(), stats.bytes_read.to_string());
    put("bytes_written".into(), stats.bytes_written.to_string());
    put("transfers".into(), stats.transfers.to_string());
    put("link.up_busy_ns".into(), stats.link_up_busy_ns.to_string());
    put(
        "link.down_busy_ns".into(),
        stats.link_down_busy_ns.to_string(),
    );
    put(
        "link.up_utilisation".into(),
        fmt(share(stats.link_up_busy_ns)),
    );
    put(
        "link.down_utilisation".into(),
        fmt(share(stats.link_down_busy_ns)),
    );
    put("ring.busy_ns".into(), stats.ring_busy_ns.to_string());
    put("ring.utilisation".into(), fmt(share(stats.ring_busy_ns)));
    for (i, c) in stats.controllers.iter().enumerate() {
        let k = |n: &str| format!("controllers.{i}.{n}");
        put(k("busy_ns"), c.busy_ns.to_string());
        put(k("utilisation"), fmt(c.utilisation));
        put(k("transfers"), c.transfers.to_string());
        put(k("queue_wait_ns"), c.queue_wait_ns.to_string());
        put(
            k("mean_queue_wait_ns"),
            fmt(if c.transfers == 0 {
                0.0
            } else {
                c.queue_wait_ns as f64 / c.transfers as f64
            }),
        );
        put(k("row_hits"), c.row_hits.to_string());
        put(k("row_misses"), c.row_misses.to_string());
        put(k("gap_moves"), c.gap_moves.to_string());
    }
    let e = &stats.energy;
    let total = e.total_j();
    for (n, v) in [
        ("scheduler_j", e.scheduler_j),
        ("buffers_j", e.buffers_j),
        ("ring_j", e.ring_j),
        ("link_j", e.link_j),
        ("controllers_j", e.controllers_j),
        ("array_j", e.array_j),
        ("background_j", e.background_j),
        ("total_j", total),
    ] {
        put(format!("energy.{n}"), fmt(v));
    }
    let ops = stats.reads + stats.writes;
    let bytes = stats.bytes_read + stats.bytes_written;
    put("energy.average_w".into(), fmt(stats.watts()));
    put(
        "energy.per_op_j".into(),
        fmt(if ops == 0 { 0.0 } else { total / ops as f64 }),
    );
    put(
        "energy.per_byte_j".into(),
        fmt(if bytes == 0 {
            0.0
        } else {
            total / bytes as f64
        }),
    );
    let w = &stats.wear;
    put("wear.rows".into(), w.rows.to_string());
    put("wear.max".into(), w.max.to_string());
    put("wear.mean".into(), fmt(w.mean));
    put("wear.total".into(), w.total.to_string());
    put(
        "wear.max_over_mean".into(),
        fmt(if w.mean > 0.0 {
            f64::from(w.max) / w.mean
        } else {
            0.0
        }),
    );
    put(
        "wear.histogram".into(),
        w.histogram
            .iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(" "),
    );
    if let Some(b) = &stats.buffer {
        let reads = b.hits + b.misses;
        for (n, v) in [
            ("hits", b.hits),
            ("misses", b.misses),
            ("waited", b.waited),
            ("ahead_lines", b.ahead_lines),
            ("hinted_lines", b.hinted_lines),
            ("used_ahead", b.used_ahead),
            ("wasted_ahead", b.wasted_ahead),
            ("evictions", b.evictions),
            ("lines", b.lines),
        ] {
            out.push((format!("buffer.{n}"), v.to_string()));
        }
        out.push((
            "buffer.hit_ratio".into(),
            fmt(if reads == 0 {
                0.0
            } else {
                b.hits as f64 / reads as f64
            }),
        ));
    }
    if let Some(f) = &stats.wear_file {
        out.push(("wear.file".into(), f.display().to_string()));
    }
    out
}

/// A real number, exactly (the shortest text that reads back as the same number).
fn fmt(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1e-4 && v.abs() < 1e15 {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Model, Submit};

    #[test]
    fn every_figure_has_a_key() {
        let mut m = Model::new(ModelConfig::pcm(), 64 << 20, 1).unwrap();
        for i in 0..8u64 {
            m.submit(
                Submit {
                    id: i,
                    write: i % 2 == 0,
                    addr: i * 8192,
                    len: 4096,
                    channel: 0,
                    barrier: false,
                    reach: 0,
                },
                0,
            );
        }
        let mut done = 0;
        let mut t = 0;
        while done < 8 {
            m.advance(t, |_, _| done += 1);
            t = m.next_event_ns().unwrap_or(t + 1000).max(t + 1);
        }
        let p = pairs(m.config(), &m.stats(t + 100_000));
        let get = |k: &str| {
            &p.iter()
                .find(|(n, _)| n == k)
                .unwrap_or_else(|| panic!("{k}"))
                .1
        };
        assert_eq!(get("model"), "pcm");
        assert_eq!(get("parameters.controllers"), "4");
        assert_eq!(get("reads"), "4");
        assert_eq!(get("writes"), "4");
        assert_eq!(get("controllers.3.transfers"), "2");
        assert!(get("energy.total_j").parse::<f64>().unwrap() > 0.0);
        assert_eq!(get("wear.histogram").split(' ').count(), 16);
        // No key twice, none with a space.
        let mut keys: Vec<&String> = p.iter().map(|(k, _)| k).collect();
        assert!(keys.iter().all(|k| !k.contains(' ')));
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), p.len());
    }

    #[test]
    fn numbers_read_back() {
        for v in [0.0, 1.5, 3.47, 1e-12, 2.5e-7, 123456.0, 1e12] {
            let back: f64 = fmt(v).parse().unwrap();
            assert_eq!(back, v, "{v} -> {}", fmt(v));
        }
    }
}
