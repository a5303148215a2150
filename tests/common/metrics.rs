//! Reading `/metrics` (Prometheus text format): sums and samples by labels.

use std::collections::BTreeMap;

/// The sum of `metric`'s samples whose labels include every pair of `labels`.
pub fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    metric_samples(text, metric)
        .into_iter()
        .filter(|(l, _)| {
            labels
                .iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .sum()
}

/// Parses the Prometheus text exposition: for each sample of `metric`, its
/// labels and value.
pub fn metric_samples(text: &str, metric: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
            let Some(end) = rest.rfind('}') else {
                continue;
            };
            (parse_labels(&rest[..end]), rest[end + 1..].trim())
        } else if rest.starts_with(' ') {
            (BTreeMap::new(), rest.trim())
        } else {
            continue; // a longer metric name with this prefix
        };
        let value = value.split_whitespace().next().unwrap_or("");
        if let Ok(v) = value.parse::<f64>() {
            out.push((labels, v));
        }
    }
    out
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if name.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(name.trim().to_owned(), value);
    }
    out
}
