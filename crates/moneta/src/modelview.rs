//! The array model's report (`OP_MODEL`) as `moneta status` shows it: a few readable lines, or
//! JSON whose objects follow the report's dotted keys.

use moneta_abi::control::ModelReport;
use serde_json::{Map, Value};

/// The report as JSON: `{"model": "pcm", "parameters": {...}, "controllers": [{...}], ...}`;
/// numbers become numbers, the wear histogram an array, objects keyed 0, 1, ... arrays.
pub fn json(r: &ModelReport) -> Value {
    let mut root = Map::new();
    for (k, v) in &r.pairs {
        let parts: Vec<&str> = k.split('.').collect();
        let mut node = &mut root;
        for p in &parts[..parts.len() - 1] {
            node = node
                .entry(p.to_string())
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("a key is an object or a value, never both");
        }
        node.insert(parts[parts.len() - 1].to_string(), value(v));
    }
    arrays(Value::Object(root))
}

fn value(v: &str) -> Value {
    let nums: Vec<&str> = v.split(' ').collect();
    let num = |s: &str| -> Option<Value> {
        if let Ok(i) = s.parse::<u64>() {
            return Some(i.into());
        }
        s.parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(Value::from)
    };
    if nums.len() > 1 {
        if let Some(list) = nums.iter().map(|s| num(s)).collect::<Option<Vec<_>>>() {
            return Value::Array(list);
        }
    }
    match v {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => num(v).unwrap_or_else(|| Value::String(v.to_string())),
    }
}

/// Objects whose keys are 0, 1, ..., n-1 become arrays.
fn arrays(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let indexed = !m.is_empty() && (0..m.len()).all(|i| m.contains_key(&i.to_string()));
            if indexed {
                let mut m = m;
                Value::Array(
                    (0..m.len())
                        .map(|i| arrays(m.remove(&i.to_string()).expect("checked")))
                        .collect(),
                )
            } else {
                Value::Object(m.into_iter().map(|(k, v)| (k, arrays(v))).collect())
            }
        }
        other => other,
    }
}

/// The report as the lines `moneta status` prints after the counters: the model's, then the
/// other members' links.
pub fn text(r: &ModelReport) -> String {
    let mut out = array_text(r);
    let n = |k: &str| r.get(k).and_then(|v| v.parse::<u64>().ok());
    if let (Some(start), Some(len)) = (n("local.start"), n("local.len")) {
        out += &format!("local array: [{start:#x}, {:#x})\n", start + len);
    }
    let mut i = 0;
    while let Some(uri) = r.get(&format!("members.{i}.uri")) {
        let g = |n: &str| r.get(&format!("members.{i}.{n}")).unwrap_or("?");
        let n = |n: &str| g(n).parse::<u64>().unwrap_or(0);
        out += &format!(
            "member {i}: [{:#x}, {:#x}) at {uri}: {}, {} requests ({} in flight, {} failed, \
             {} of them writes given up in flight), {} bytes, {} connections\n",
            n("start"),
            n("start") + n("len"),
            g("state"),
            g("requests"),
            g("in_flight"),
            g("failures"),
            g("uncertain_writes"),
            g("bytes"),
            g("connects"),
        );
        let e = g("last_error");
        if !e.is_empty() && e != "?" {
            out += &format!("  {:<20} {e}\n", "last error");
        }
        i += 1;
    }
    let g = |k: &str| r.get(&format!("share.{k}")).unwrap_or("?");
    match r.get("share.role") {
        Some("manager") => {
            out += &format!(
                "shared file system: manager at {}, {} members ({}), {} sessions, {} calls, \
                 {} revocations, {} cuts, {} members fenced, {} connections refused\n",
                g("listen"),
                g("members"),
                g("peers"),
                g("sessions"),
                g("calls"),
                g("revocations"),
                g("cuts"),
                g("fenced"),
                g("refused"),
            );
        }
        Some("member") => {
            out += &format!(
                "shared file system: member of {}: {}, {} sessions, {} calls, {} revocations, \
                 {} fences, {} connections\n",
                g("manager"),
                g("state"),
                g("sessions"),
                g("calls"),
                g("revocations"),
                g("fences"),
                g("connects"),
            );
            let e = g("last_error");
            if !e.is_empty() && e != "?" {
                out += &format!("  {:<20} {e}\n", "last error");
            }
        }
        _ => {}
    }
    out
}

fn array_text(r: &ModelReport) -> String {
    let g = |k: &str| r.get(k).unwrap_or("?");
    let name = g("model");
    if name == "none" {
        return "model: none (requests complete as fast as the host moves their data; \
                monetad --model pcm models the array)\n"
            .into();
    }
    let f = |k: &str| r.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let mut out = format!(
        "model {name}: {} controllers, {} policy, {} ns reads, {} ns writes, link {} GB/s, \
         start-gap every {} writes\n",
        g("parameters.controllers"),
        g("parameters.policy"),
        g("parameters.read_ns"),
        g("parameters.write_ns"),
        g("parameters.link_rate"),
        g("parameters.gap_interval"),
    );
    out += &format!(
        "  {:<20} {} reads, {} writes, {} transfers over {:.3} s\n",
        "requests",
        g("reads"),
        g("writes"),
        g("transfers"),
        f("elapsed_ns") * 1e-9
    );
    out += &format!(
        "  {:<20} link up {:.1}%, down {:.1}%, ring {:.1}%\n",
        "utilisation",
        f("link.up_utilisation") * 100.0,
        f("link.down_utilisation") * 100.0,
        f("ring.utilisation") * 100.0
    );
    let mut i = 0;
    while r.get(&format!("controllers.{i}.utilisation")).is_some() {
        let c = |n: &str| f(&format!("controllers.{i}.{n}"));
        out += &format!(
            "  {:<20} busy {:.1}%, {} transfers, mean queue wait {:.0} ns, row hits {} misses {}, \
             gap moves {}\n",
            format!("controller {i}"),
            c("utilisation") * 100.0,
            c("transfers"),
            c("mean_queue_wait_ns"),
            c("row_hits"),
            c("row_misses"),
            c("gap_moves"),
        );
        i += 1;
    }
    out += &format!(
        "  {:<20} {:.6} J, {:.3} W average, {:.3e} J per operation, {:.3e} J per byte\n",
        "energy",
        f("energy.total_j"),
        f("energy.average_w"),
        f("energy.per_op_j"),
        f("energy.per_byte_j"),
    );
    out += &format!(
        "  {:<20} {} rows, max {} writes, mean {:.3}, max/mean {:.2}; histogram {}\n",
        "wear",
        g("wear.rows"),
        g("wear.max"),
        f("wear.mean"),
        f("wear.max_over_mean"),
        g("wear.histogram"),
    );
    if r.get("emulation.completions").is_some() {
        out += &format!(
            "  {:<20} {} completions at the model's times, {} more than 1 µs late (mean {} ns, \
             worst {} ns), each published {} ns ahead\n",
            "emulation",
            g("emulation.completions"),
            g("emulation.late"),
            g("emulation.mean_late_ns"),
            g("emulation.max_late_ns"),
            g("emulation.lead_ns"),
        );
    }
    if r.get("buffer.hits").is_some() {
        out += &format!(
            "  {:<20} {} bytes in {}-byte lines ({}), read-ahead {} bytes: {} hits, {} misses \
             ({:.1}% hits, {} waited for their line); lines filled ahead {} by read-ahead, {} for \
             hints, {} used, {} given up unused\n",
            "DRAM buffer",
            g("parameters.buffer"),
            g("parameters.buffer_line"),
            g("parameters.buffer_policy"),
            g("parameters.readahead"),
            g("buffer.hits"),
            g("buffer.misses"),
            f("buffer.hit_ratio") * 100.0,
            g("buffer.waited"),
            g("buffer.ahead_lines"),
            g("buffer.hinted_lines"),
            g("buffer.used_ahead"),
            g("buffer.wasted_ahead"),
        );
    }
    if let Some(file) = r.get("wear.file") {
        out += &format!("  {:<20} {file}\n", "wear kept in");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_keys_nest_and_indexed_objects_become_arrays() {
        let r = ModelReport {
            pairs: [
                ("model", "pcm"),
                ("parameters.policy", "rr"),
                ("parameters.read_ns", "48"),
                ("controllers.0.utilisation", "0.5"),
                ("controllers.1.utilisation", "0.25"),
                ("wear.histogram", "3 0 1"),
                ("energy.total_j", "1.5e-9"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        };
        let j = json(&r);
        assert_eq!(j["model"], "pcm");
        assert_eq!(j["parameters"]["policy"], "rr");
        assert_eq!(j["parameters"]["read_ns"], 48);
        assert_eq!(j["controllers"][1]["utilisation"], 0.25);
        assert_eq!(j["wear"]["histogram"], serde_json::json!([3, 0, 1]));
        assert_eq!(j["energy"]["total_j"], 1.5e-9);
        let t = text(&r);
        assert!(t.contains("model pcm") && t.contains("controller 1"), "{t}");
        let none = ModelReport {
            pairs: vec![("model".into(), "none".into())],
        };
        assert_eq!(json(&none), serde_json::json!({"model": "none"}));
        assert!(text(&none).contains("model: none"));
    }
}
