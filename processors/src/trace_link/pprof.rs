//! Reading and writing correlation in pprof profiles: sample labels.

use std::collections::HashMap;
use std::sync::Arc;

use proflow_pipeline::pprof::{Label, Profile};

use super::ids::{self, Found, Key, SpanId, TraceId};
use super::{Link, Rules};

/// What each sample of `p` says of its span (`None` for a sample without
/// any correlation label), or `None` when no sample says anything.
pub fn read(p: &Profile) -> Option<Vec<Option<Found>>> {
    // The keys' string indexes: most profiles have none, and are done here.
    let keys: Vec<(i64, Key)> = p
        .string_table
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Key::of(s).map(|k| (i as i64, k)))
        .collect();
    if keys.is_empty() {
        return None;
    }
    let string = |i: i64| usize::try_from(i).ok().and_then(|i| p.string_table.get(i));
    let mut out = Vec::with_capacity(p.sample.len());
    let mut any = false;
    for s in &p.sample {
        let mut found: Option<Found> = None;
        for l in &s.label {
            let Some(&(_, key)) = keys.iter().find(|(i, _)| *i == l.key) else {
                continue;
            };
            let text = if l.str != 0 {
                string(l.str).map(String::as_str)
            } else {
                None
            };
            found
                .get_or_insert_with(Found::default)
                .read(key, text, l.num);
        }
        any |= found.is_some();
        out.push(found);
    }
    any.then_some(out)
}

/// Strings added to a profile's table, each once.
struct Strings<'a> {
    table: &'a mut Vec<String>,
    known: HashMap<String, i64>,
}

impl<'a> Strings<'a> {
    fn new(table: &'a mut Vec<String>) -> Self {
        Strings {
            table,
            known: HashMap::new(),
        }
    }

    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.known.get(s) {
            return i;
        }
        let i = match self.table.iter().position(|t| t == s) {
            // Only the few fixed keys are looked for in the table; ids and
            // names are new strings, appended once.
            Some(i) if s.len() < 24 && Key::of(s).is_some() => i as i64,
            _ => {
                self.table.push(s.to_owned());
                self.table.len() as i64 - 1
            }
        };
        self.known.insert(s.to_owned(), i);
        i
    }

    fn span(&mut self, id: &SpanId) -> i64 {
        self.get(&ids::hex(id))
    }

    fn trace(&mut self, id: &TraceId) -> i64 {
        self.get(&ids::hex(id))
    }
}

/// How the labels of one sample are written.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// Write `span_id` and `span_name` in their normal form.
    pub labels: bool,
    /// Write `trace_id` too.
    pub trace_label: bool,
    /// For linked samples, write `trace_id` and `span_id` whatever
    /// `labels` says (the OTLP conversion makes them the sample's link).
    pub link_labels: bool,
}

/// Rewrites the correlation labels of `p`'s samples by `links` (one per
/// sample, as [`read`] gave them and the index completed them).
pub fn write(p: &mut Profile, links: &[Option<Link>], rules: &Rules, mode: Mode) {
    let key_of: HashMap<i64, Key> = p
        .string_table
        .iter()
        .enumerate()
        .filter_map(|(i, s)| Key::of(s).map(|k| (i as i64, k)))
        .collect();
    let samples = std::mem::take(&mut p.sample);
    let mut strings = Strings::new(&mut p.string_table);
    let mut spans: HashMap<SpanId, i64> = HashMap::new();
    let mut traces: HashMap<TraceId, i64> = HashMap::new();
    let mut names: HashMap<Arc<str>, i64> = HashMap::new();
    let mut out = Vec::with_capacity(samples.len());
    for (mut s, link) in samples.into_iter().zip(links) {
        let Some(link) = link else {
            // All-zero ids mean none: dropped where labels are written.
            if mode.labels {
                let table = &*strings.table;
                s.label.retain(|l| {
                    let id_key = matches!(
                        key_of.get(&l.key),
                        Some(
                            Key::SpanId
                                | Key::TraceId
                                | Key::ProfileId
                                | Key::DdSpanId
                                | Key::DdLocalRoot
                        )
                    );
                    !(id_key
                        && usize::try_from(l.str)
                            .ok()
                            .and_then(|i| table.get(i))
                            .is_some_and(|t| ids::is_zero(t)))
                });
            }
            out.push(s);
            continue;
        };
        let linked = link.trace.is_some();
        let write_ids = mode.labels || mode.trace_label || (mode.link_labels && linked);
        let write_trace = linked && (mode.trace_label || mode.link_labels);
        let drop_rest = rules.drop_after_link && linked;
        let mut had_name = false;
        s.label.retain(|l| {
            let Some(&key) = key_of.get(&l.key) else {
                return true;
            };
            match key {
                // Written afresh below when the ids are written; else kept
                // unless dropped.
                Key::SpanId => !write_ids && !drop_rest,
                Key::TraceId => !write_trace && !drop_rest,
                Key::SpanName => {
                    let keep = !drop_rest || mode.labels;
                    had_name |= keep;
                    keep
                }
                Key::ProfileId | Key::DdSpanId | Key::DdLocalRoot => !drop_rest,
            }
        });
        if write_ids {
            let span = *spans
                .entry(link.span)
                .or_insert_with(|| strings.span(&link.span));
            let key = strings.get(ids::SPAN_ID);
            s.label.push(Label {
                key,
                str: span,
                ..Label::default()
            });
            if let Some(t) = link.trace.as_ref().filter(|_| write_trace) {
                let trace = *traces.entry(*t).or_insert_with(|| strings.trace(t));
                let key = strings.get(ids::TRACE_ID);
                s.label.push(Label {
                    key,
                    str: trace,
                    ..Label::default()
                });
            }
        }
        if mode.labels
            && !had_name
            && let Some(n) = &link.name
        {
            let name = *names.entry(n.clone()).or_insert_with(|| strings.get(n));
            let key = strings.get(ids::SPAN_NAME);
            s.label.push(Label {
                key,
                str: name,
                ..Label::default()
            });
        }
        out.push(s);
    }
    p.sample = out;
}
