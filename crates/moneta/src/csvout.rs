//! CSV from any serializable records: nested objects flatten into `parent_child` columns, a
//! list of named items (`[{"name": "copy", "ns": 5}]`) into `parent_copy_ns` columns; the
//! columns are the union over the records, in order of first appearance.

use serde::Serialize;
use serde_json::{Map, Value};

/// The records as CSV text: a header line, then one line per record.
pub fn to_csv<T: Serialize>(rows: &[T]) -> Result<String, String> {
    let flat: Vec<Map<String, Value>> = rows
        .iter()
        .map(|r| {
            let v = serde_json::to_value(r).map_err(|e| e.to_string())?;
            let mut m = Map::new();
            flatten("", &v, &mut m);
            Ok(m)
        })
        .collect::<Result<_, String>>()?;
    let mut cols: Vec<String> = Vec::new();
    for m in &flat {
        for k in m.keys() {
            if !cols.contains(k) {
                cols.push(k.clone());
            }
        }
    }
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(&cols).map_err(|e| e.to_string())?;
    for m in &flat {
        w.write_record(cols.iter().map(|c| match m.get(c) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        }))
        .map_err(|e| e.to_string())?;
    }
    let bytes = w.into_inner().map_err(|e| e.to_string())?;
    String::from_utf8(bytes).map_err(|e| e.to_string())
}

fn key(prefix: &str, k: &str) -> String {
    let k = k.replace([' ', '(', ')', ','], "_").replace("__", "_");
    let k = k.trim_end_matches('_');
    if prefix.is_empty() {
        k.to_string()
    } else {
        format!("{prefix}_{k}")
    }
}

fn flatten(prefix: &str, v: &Value, out: &mut Map<String, Value>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                flatten(&key(prefix, k), x, out);
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                match x {
                    Value::Object(o) if o.get("name").is_some_and(Value::is_string) => {
                        let name = o["name"].as_str().unwrap_or_default();
                        let p = key(prefix, name);
                        for (k, y) in o.iter().filter(|(k, _)| *k != "name") {
                            flatten(&key(&p, k), y, out);
                        }
                    }
                    _ => flatten(&key(prefix, &i.to_string()), x, out),
                }
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_fields_and_named_lists_flatten_into_columns() {
        let rows = vec![
            serde_json::json!({"path": "a", "lat": {"p50": 5, "p99": 9}, "spread": [1, 2]}),
            serde_json::json!({"path": "b,c", "lat": {"p50": 6, "p99": 10},
                "parts": [{"name": "extent lookup", "ns": 1.5, "how": "counted"}]}),
        ];
        let csv = to_csv(&rows).unwrap();
        let mut lines = csv.lines();
        assert_eq!(
            lines.next().unwrap(),
            "path,lat_p50,lat_p99,spread_0,spread_1,parts_extent_lookup_ns,parts_extent_lookup_how"
        );
        assert_eq!(lines.next().unwrap(), "a,5,9,1,2,,");
        assert_eq!(lines.next().unwrap(), "\"b,c\",6,10,,,1.5,counted");
        assert!(lines.next().is_none());
    }
}
