//! How `ls` and `watch` print endpoints: tables in the style of `kubectl
//! get`, JSON, and YAML (written here from the JSON value: block style,
//! strings quoted as JSON strings, which YAML reads as-is).

use serde_json::Value;
use waypost::Endpoint;

use crate::cli::Output;

/// `e`'s address as `HOST:PORT` (`[v6]:PORT`).
pub fn host_port(e: &Endpoint) -> String {
    if e.address.contains(':') {
        format!("[{}]:{}", e.address, e.port)
    } else {
        format!("{}:{}", e.address, e.port)
    }
}

fn node(e: &Endpoint) -> String {
    if e.node.is_empty() {
        "-".into()
    } else {
        e.node.clone()
    }
}

fn labels(e: &Endpoint) -> String {
    let l: Vec<String> = e.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if l.is_empty() {
        "-".into()
    } else {
        l.join(",")
    }
}

/// One endpoint on one line (`watch`, `register`).
pub fn endpoint_line(e: &Endpoint) -> String {
    format!(
        "{}/{} {} {} cluster={} node={} {}{}",
        e.service,
        e.id,
        host_port(e),
        e.protocol.as_str(),
        e.cluster,
        node(e),
        e.health.as_str(),
        if e.labels.is_empty() {
            String::new()
        } else {
            format!(" {}", labels(e))
        }
    )
}

/// A table of `eps`: the columns of `table`, or of `wide` with the
/// cluster and the labels. Columns are padded to their widest cell.
pub fn table(eps: &[Endpoint], wide: bool) -> String {
    let mut header = vec!["SERVICE", "ID", "ADDRESS", "PROTOCOL", "NODE", "HEALTH"];
    if wide {
        header.extend(["CLUSTER", "LABELS"]);
    }
    let rows: Vec<Vec<String>> = eps
        .iter()
        .map(|e| {
            let mut r = vec![
                e.service.clone(),
                e.id.clone(),
                host_port(e),
                e.protocol.as_str().to_string(),
                node(e),
                e.health.as_str().to_string(),
            ];
            if wide {
                r.extend([e.cluster.clone(), labels(e)]);
            }
            r
        })
        .collect();
    let header: Vec<String> = header.into_iter().map(String::from).collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// `eps` as one document for `-o json` or `-o yaml`: the resume token of
/// the listing and the endpoints as `items`.
pub fn document(eps: &[Endpoint], version: &str, format: Output) -> Result<String, String> {
    let doc = serde_json::json!({
        "kind": "EndpointList",
        "version": version,
        "items": eps,
    });
    match format {
        Output::Yaml => Ok(yaml(&doc)),
        _ => serde_json::to_string_pretty(&doc)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| format!("cannot encode JSON: {e}")),
    }
}

/// `v` as a YAML document (block style).
pub fn yaml(v: &Value) -> String {
    let mut out = String::new();
    write_yaml(v, 0, &mut out);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn scalar(v: &Value) -> String {
    match v {
        // A JSON string is a valid YAML double-quoted scalar.
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Array(a) if a.is_empty() => "[]".into(),
        Value::Object(o) if o.is_empty() => "{}".into(),
        other => other.to_string(),
    }
}

/// A mapping key: plain when it is a simple word, quoted otherwise.
fn yaml_key(k: &str) -> String {
    let plain = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !matches!(k, "true" | "false" | "null" | "yes" | "no" | "on" | "off");
    if plain {
        k.to_string()
    } else {
        Value::String(k.to_string()).to_string()
    }
}

fn is_block(v: &Value) -> bool {
    match v {
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => false,
    }
}

fn write_yaml(v: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match v {
        Value::Object(o) if !o.is_empty() => {
            for (k, val) in o {
                let key = yaml_key(k);
                if is_block(val) {
                    out.push_str(&format!("{pad}{key}:\n"));
                    write_yaml(val, indent + 2, out);
                } else {
                    out.push_str(&format!("{pad}{key}: {}\n", scalar(val)));
                }
            }
        }
        Value::Array(a) if !a.is_empty() => {
            for item in a {
                if is_block(item) {
                    // The first line of the item after "- ", the rest
                    // indented under it.
                    let mut inner = String::new();
                    write_yaml(item, indent + 2, &mut inner);
                    let inner = inner.trim_start();
                    out.push_str(&format!("{pad}- {inner}"));
                } else {
                    out.push_str(&format!("{pad}- {}\n", scalar(item)));
                }
            }
        }
        other => out.push_str(&format!("{pad}{}\n", scalar(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_of_nested_values() {
        let v = serde_json::json!({
            "version": "3.7",
            "items": [{"service": "a", "port": 80, "labels": {"zone": "z\"1"}}, {"service": "b", "labels": {}}],
            "empty": [],
        });
        let y = yaml(&v);
        // serde_json's maps are sorted by key.
        let want = "empty: []\nitems:\n  - labels:\n      zone: \"z\\\"1\"\n    port: 80\n    service: \"a\"\n  - labels: {}\n    service: \"b\"\nversion: \"3.7\"\n";
        assert_eq!(y, want);
    }
}
