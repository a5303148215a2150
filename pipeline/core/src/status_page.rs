//! The status page (`/` and `/status` on the telemetry address): one plain
//! HTML page, no script, readable in a terminal browser, for a person who
//! wants to know what is flowing and what is failing. Version, uptime, the
//! config running (hash, source, when applied), memory in flight against
//! the budget, each pipeline with its components, and per component what
//! `/metrics` counts (accepted, refused, sent, failed, dropped, queue depth)
//! with its last error. The figures are read from the same families
//! `/metrics` shows, at the moment the page is asked for.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::telemetry::{Telemetry, rfc3339};

/// A last error younger than this marks its component's row as failing.
const RECENT: Duration = Duration::from_secs(300);

/// Sums of `/metrics` samples: by `(family sample name, component id)`.
struct Figures {
    by_component: BTreeMap<(String, String), f64>,
    plain: BTreeMap<String, f64>,
}

impl Figures {
    /// Reads the sample lines of `text` (label `receiver`, `processor` or
    /// `exporter` names the component).
    fn parse(text: &str) -> Figures {
        let mut f = Figures {
            by_component: BTreeMap::new(),
            plain: BTreeMap::new(),
        };
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let component = ["receiver", "processor", "exporter"]
                .iter()
                .find_map(|k| label(labels, k));
            match component {
                Some(id) => {
                    *f.by_component.entry((name.to_owned(), id)).or_default() += value;
                }
                None => *f.plain.entry(name.to_owned()).or_default() += value,
            }
        }
        f
    }

    fn of(&self, name: &str, id: &str) -> f64 {
        self.by_component
            .get(&(name.to_owned(), id.to_owned()))
            .copied()
            .unwrap_or(0.0)
    }
}

/// The value of label `key` in `k="v",k2="v2"` (escapes undone).
fn label(labels: &str, key: &str) -> Option<String> {
    let mut rest = labels;
    while !rest.is_empty() {
        let (k, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        if k.trim_start_matches(',') == key {
            return Some(value);
        }
        rest = after[end..].trim_start_matches(',');
    }
    None
}

/// `text` with `<`, `>`, `&` and quotes escaped for HTML.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86_400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86_400, s % 86_400 / 3600),
    }
}

fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn count(n: f64) -> String {
    format!("{n:.0}")
}

const STYLE: &str = "body{font-family:sans-serif;margin:1.5em;color:#1a1a1a}\
table{border-collapse:collapse;margin-bottom:1.5em}\
th,td{border:1px solid #bbb;padding:.3em .6em;text-align:left;vertical-align:top}\
td.n{text-align:right;font-variant-numeric:tabular-nums}\
th{background:#eee}tr.bad td{background:#fde2e1}tr.ok td:first-child{border-left:4px solid #3a7}\
tr.bad td:first-child{border-left:4px solid #c33}code{background:#f3f3f3;padding:0 .2em}";

/// The page, as it is now.
pub fn render(t: &Telemetry) -> String {
    let figures = Figures::parse(&t.render());
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>proflow status</title>\
         <style>{STYLE}</style></head><body>\n<h1>proflow {}</h1>\n",
        esc(env!("CARGO_PKG_VERSION"))
    );
    summary(&mut h, t, &figures);
    pipelines(&mut h, t);
    components(&mut h, t, &figures);
    h.push_str("</body></html>\n");
    h
}

fn summary(h: &mut String, t: &Telemetry, f: &Figures) {
    let (up, since) = t.uptime();
    let _ = writeln!(
        h,
        "<p>Up <b>{}</b>, since {}. {}.</p>",
        duration(up),
        rfc3339(unix(since)),
        if t.is_ready() { "Ready" } else { "Not ready" }
    );
    match t.config() {
        Some(c) => {
            let _ = writeln!(
                h,
                "<p>Config <code>{}</code> (SHA-256) from {} <code>{}</code>, applied {}.</p>",
                esc(&c.hash),
                c.source.as_str(),
                esc(&c.origin),
                rfc3339(unix(c.applied_at))
            );
        }
        None => h.push_str("<p>Config: not reported.</p>\n"),
    }
    let held = f
        .plain
        .get("proflow_memory_in_flight_bytes")
        .copied()
        .unwrap_or(0.0);
    let limit = f
        .plain
        .get("proflow_memory_limit_bytes")
        .copied()
        .unwrap_or(0.0);
    let share = if limit > 0.0 {
        format!(" ({:.1}%)", held / limit * 100.0)
    } else {
        String::new()
    };
    let rss = f
        .plain
        .get("process_resident_memory_bytes")
        .map(|r| format!("; the process's resident memory: {}", bytes(*r)))
        .unwrap_or_default();
    let _ = write!(
        h,
        "<p>Memory in flight: <b>{}</b> of the budget {}{share}{rss}.</p>\n\
         <p>More: <a href=\"/metrics\">/metrics</a> · <a href=\"/targets\">/targets</a> · \
         <a href=\"/tenants\">/tenants</a> · <a href=\"/readyz\">/readyz</a></p>\n",
        bytes(held),
        bytes(limit),
    );
}

fn pipelines(h: &mut String, t: &Telemetry) {
    h.push_str("<h2>Pipelines</h2>\n<table><tr><th>pipeline</th><th>receivers</th><th>processors</th><th>exporters</th></tr>\n");
    for p in t.pipelines() {
        let list = |ids: &[String]| {
            if ids.is_empty() {
                "none".to_owned()
            } else {
                ids.iter().map(|i| esc(i)).collect::<Vec<_>>().join(" → ")
            }
        };
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&p.id),
            list(&p.receivers),
            list(&p.processors),
            list(&p.exporters)
        );
    }
    h.push_str("</table>\n");
}

/// Every component id of `kind` the pipelines name, in order, once.
fn ids(t: &Telemetry, kind: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in t.pipelines() {
        let list = match kind {
            "receiver" => p.receivers,
            "processor" => p.processors,
            _ => p.exporters,
        };
        for id in list {
            if !out.contains(&id) {
                out.push(id);
            }
        }
    }
    out
}

/// A row's class and its last-error cell.
fn last_error(
    t: &Telemetry,
    kind: &'static str,
    id: &str,
    failing: bool,
) -> (&'static str, String) {
    let last = t.last_error(kind, id);
    let recent = last
        .as_ref()
        .is_some_and(|e| e.at.elapsed().unwrap_or_default() < RECENT);
    let cell = match last {
        Some(e) => format!(
            "{} <small>({} ago)</small>",
            esc(&e.message),
            duration(e.at.elapsed().unwrap_or_default())
        ),
        None => "none".to_owned(),
    };
    (if failing || recent { "bad" } else { "ok" }, cell)
}

fn components(h: &mut String, t: &Telemetry, f: &Figures) {
    h.push_str("<h2>Receivers</h2>\n<table><tr><th>receiver</th><th>accepted profiles</th><th>accepted bytes</th>\
        <th>refused requests</th><th>refused profiles</th><th>last error</th></tr>\n");
    for id in ids(t, "receiver") {
        let (class, err) = last_error(t, "receiver", &id, false);
        let _ = writeln!(
            h,
            "<tr class=\"{class}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{err}</td></tr>",
            esc(&id),
            count(f.of("proflow_receiver_accepted_profiles_total", &id)),
            bytes(f.of("proflow_receiver_accepted_bytes_total", &id)),
            count(f.of("proflow_receiver_refused_requests_total", &id)),
            count(f.of("proflow_receiver_refused_profiles_total", &id)),
        );
    }
    h.push_str("</table>\n<h2>Processors</h2>\n<table><tr><th>processor</th><th>received profiles</th><th>dropped profiles</th></tr>\n");
    for id in ids(t, "processor") {
        let _ = writeln!(
            h,
            "<tr class=\"ok\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&id),
            count(f.of("proflow_processor_received_profiles_total", &id)),
            count(f.of("proflow_processor_dropped_profiles_total", &id)),
        );
    }
    h.push_str("</table>\n<h2>Exporters</h2>\n<table><tr><th>exporter</th><th>sent profiles</th><th>sent bytes</th>\
        <th>failed profiles</th><th>dropped profiles</th><th>retries</th><th>queue</th><th>last error</th></tr>\n");
    for id in ids(t, "exporter") {
        let failed = f.of("proflow_exporter_failed_profiles_total", &id);
        let dropped = f.of("proflow_exporter_dropped_profiles_total", &id);
        let queued = f.of("proflow_exporter_queue_profiles", &id);
        let capacity = f.of("proflow_exporter_queue_capacity_profiles", &id);
        let full = capacity > 0.0 && queued / capacity > 0.9;
        let (class, err) = last_error(t, "exporter", &id, full);
        let _ = writeln!(
            h,
            "<tr class=\"{class}\"><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{} of {} profiles, {}</td><td>{err}</td></tr>",
            esc(&id),
            count(f.of("proflow_exporter_sent_profiles_total", &id)),
            bytes(f.of("proflow_exporter_sent_bytes_total", &id)),
            count(failed),
            count(dropped),
            count(f.of("proflow_exporter_retries_total", &id)),
            count(queued),
            count(capacity),
            bytes(f.of("proflow_exporter_queue_bytes", &id)),
        );
    }
    h.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_read_with_their_escapes() {
        let l = r#"exporter="a\"b",reason="x,y=\"z\"""#;
        assert_eq!(label(l, "exporter").as_deref(), Some("a\"b"));
        assert_eq!(label(l, "reason").as_deref(), Some("x,y=\"z\""));
        assert_eq!(label(l, "receiver"), None);
    }

    #[test]
    fn figures_sum_each_components_series() {
        let f = Figures::parse(
            "# TYPE x counter\nproflow_exporter_failed_profiles_total{exporter=\"p\",reason=\"a\"} 2\n\
             proflow_exporter_failed_profiles_total{exporter=\"p\",reason=\"b\"} 3\n\
             proflow_exporter_failed_profiles_total{exporter=\"q\",reason=\"b\"} 7\n\
             proflow_memory_limit_bytes 100\n",
        );
        assert_eq!(f.of("proflow_exporter_failed_profiles_total", "p"), 5.0);
        assert_eq!(f.of("proflow_exporter_failed_profiles_total", "q"), 7.0);
        assert_eq!(f.plain["proflow_memory_limit_bytes"], 100.0);
    }

    #[test]
    fn the_page_escapes_what_components_report() {
        let t = std::sync::Arc::new(Telemetry::new());
        t.set_pipelines(vec![crate::telemetry::PipelineView {
            id: "profiles".into(),
            receivers: vec!["pprof_push".into()],
            processors: vec![],
            exporters: vec!["<b>x</b>".into()],
        }]);
        t.exporter("<b>x</b>")
            .attempt_failed("peer said <script>alert(1)</script>");
        let page = render(&t);
        assert!(!page.contains("<script>"), "{page}");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(
            page.contains("<tr class=\"bad\"><td>&lt;b&gt;x&lt;/b&gt;</td>"),
            "{page}"
        );
    }
}
