//! The `trace_link` processor: makes the link between profile samples and
//! the trace spans they were taken in explicit and uniform, whatever
//! convention the sender used, so a backend can jump from a span to its
//! samples and back.
//!
//! - [`ids`]: the conventions in the field (Pyroscope's `span_id` /
//!   `span_name` / `trace_id` labels, older `profile_id`, Datadog's decimal
//!   `span id` / `local root span id`, OTLP sample links) and their normal
//!   form.
//! - [`index`]: the span index a `traces` pipeline feeds (span id → trace
//!   id, name, service, times), bounded by `window` and `max_spans`.
//! - [`pprof`], [`otlp`]: reading and writing the links of each form.
//! - [`config`]: the config.
//!
//! A batch goes through in three steps: every payload that carries any
//! correlation is decoded and read (a profile without any goes on as it
//! came, never re-encoded); the spans whose trace the samples do not name
//! are looked up in the index under one lock, waiting up to `wait` for
//! those not there yet; then each payload is written in the forms of
//! `output`. For a pprof payload that feeds an OTLP exporter, the processor
//! makes the OTLP form itself, with links, so the pprof form can keep
//! Pyroscope's labels while the OTLP form has links (the pipeline then
//! converts nothing). Samples are never merged: two samples of one stack
//! in different spans stay two.

pub mod config;
pub mod ids;
pub mod index;
pub mod otlp;
pub mod pprof;
pub mod telemetry;
#[cfg(test)]
mod tests;

/// Entry points for the fuzz targets in `fuzz/`: envelopes through the
/// processor as a pipeline runs it. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use std::sync::Arc;

    use proflow_core::component::Processor;
    use proflow_core::telemetry::Telemetry;
    use proflow_model::model::Envelope;

    use super::TraceLinkProcessor;
    use super::config::{Output, TraceLinkProcessorConfig};

    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime");
    }

    /// `envelopes` through a processor writing every output (labels, a
    /// `trace_id` label, OTLP links, for a pipeline that converts to OTLP),
    /// without a span index.
    pub fn process(envelopes: Vec<Envelope>, drop_after_link: bool) -> Vec<Envelope> {
        let config = TraceLinkProcessorConfig {
            output: vec![Output::OtlpLinks, Output::Labels, Output::TraceIdLabel],
            drop_span_labels_after_link: drop_after_link,
            root_spans_only: false,
            span_index: None,
        };
        let telemetry = Arc::new(Telemetry::new());
        let processor = TraceLinkProcessor::new(
            &config,
            true,
            Some(&telemetry),
            super::TraceLinkTelemetry::new(&telemetry, "trace_link"),
        );
        let meta = proflow_model::model::BatchMeta::default();
        RUNTIME.with(|rt| rt.block_on(processor.process(envelopes, &meta)))
    }
}

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use proflow_core::component::no_problems;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Processor, ProcessorConfig, Validate,
};
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, Format, Payload};
use proflow_model::otlp::{self as potlp, Lost, OtlpProfiles, ProfileData};
use proflow_model::spans::SpanConsumer;

pub use config::{Output, SpanIndexConfig, TraceLinkProcessorConfig};
use ids::{Found, SpanId, TraceId};
pub use index::SpanIndex;
use telemetry::TraceLinkTelemetry;

/// Span ids a batch waited for in vain, kept so the next batch naming them
/// does not wait again (cleared when full).
const MAX_GAVE_UP: usize = 100_000;

/// How the processor treats a linked sample's other labels.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    pub drop_after_link: bool,
    pub root_only: bool,
}

/// The forms of `output`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Outputs {
    pub otlp_links: bool,
    pub labels: bool,
    pub trace_label: bool,
}

/// One sample's span as the processor writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub span: SpanId,
    /// `None` when neither the sample nor the index knows it.
    pub trace: Option<TraceId>,
    pub name: Option<Arc<str>>,
}

impl Validate for TraceLinkProcessorConfig {
    fn validate(&self) -> Vec<FieldError> {
        self.problems()
    }
}

impl ProcessorConfig for TraceLinkProcessorConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
        self.build_for(ctx, &[])
    }

    fn build_for(
        &self,
        ctx: &BuildContext,
        downstream: &[Format],
    ) -> Result<Arc<dyn Processor>, BuildError> {
        no_problems(self.problems())?;
        Ok(Arc::new(TraceLinkProcessor::new(
            self,
            downstream.contains(&Format::Otlp),
            Some(&ctx.telemetry),
            TraceLinkTelemetry::new(&ctx.telemetry, &ctx.id),
        )))
    }

    fn takes_spans(&self) -> bool {
        self.span_index.is_some()
    }
}

/// The running processor.
pub struct TraceLinkProcessor {
    rules: Rules,
    otlp_links: bool,
    labels: bool,
    trace_label: bool,
    /// Make the OTLP form of pprof payloads (an exporter after it wants OTLP).
    make_otlp: bool,
    index: Option<Arc<SpanIndex>>,
    wait: Duration,
    /// Set once a traces pipeline feeds the index: only then is waiting
    /// for spans worth anything.
    fed: AtomicBool,
    gave_up: Mutex<HashSet<SpanId>>,
    telemetry: TraceLinkTelemetry,
    pipeline_telemetry: Option<Arc<Telemetry>>,
}

impl TraceLinkProcessor {
    pub fn new(
        config: &TraceLinkProcessorConfig,
        make_otlp: bool,
        pipeline_telemetry: Option<&Arc<Telemetry>>,
        telemetry: TraceLinkTelemetry,
    ) -> Self {
        let otlp_links = config.writes(Output::OtlpLinks);
        TraceLinkProcessor {
            rules: Rules {
                drop_after_link: config.drop_span_labels_after_link,
                root_only: config.root_spans_only,
            },
            otlp_links,
            labels: config.writes(Output::Labels),
            trace_label: config.writes(Output::TraceIdLabel),
            make_otlp: make_otlp && otlp_links,
            index: config.span_index.as_ref().map(|i| {
                Arc::new(SpanIndex::new(
                    i.window.get(),
                    i.max_spans,
                    Some(telemetry.clone()),
                ))
            }),
            wait: config
                .span_index
                .as_ref()
                .map_or(Duration::ZERO, |i| i.wait.get()),
            fed: AtomicBool::new(false),
            gave_up: Mutex::new(HashSet::new()),
            telemetry,
            pipeline_telemetry: pipeline_telemetry.cloned(),
        }
    }

    /// The index, for tests and benchmarks that feed it directly.
    pub fn index(&self) -> Option<&Arc<SpanIndex>> {
        self.index.as_ref()
    }
}

/// What the index knew of the spans a batch wanted, sorted by span id.
#[derive(Default)]
struct KnownSpans(Vec<(SpanId, index::Known)>);

impl KnownSpans {
    fn get(&self, span: &SpanId) -> Option<&index::Known> {
        self.0
            .binary_search_by_key(span, |(s, _)| *s)
            .ok()
            .map(|i| &self.0[i].1)
    }
}

/// What was read of one envelope.
enum Work {
    /// Nothing to do: it goes on as it came.
    Pass,
    Pprof {
        /// The profile's bytes, decompressed, and where its parts are.
        wire: Box<pprof::Wire>,
        found: Vec<Option<Found>>,
    },
    Otlp {
        group: usize,
        profiles: Vec<Option<(potlp::proto::Profile, Vec<Option<Found>>)>>,
    },
}

/// Payloads sharing one OTLP dictionary.
struct Group {
    dictionary: potlp::proto::ProfilesDictionary,
    table: Option<otlp::Table>,
}

impl TraceLinkProcessor {
    fn read(&self, envelopes: &[Envelope], groups: &mut Vec<Group>) -> Vec<Work> {
        let mut by_dictionary: HashMap<usize, Option<usize>> = HashMap::new();
        envelopes
            .iter()
            .map(|e| match e.payload.arrived_as() {
                Format::Pprof => {
                    // The receiver's plain bytes when it handed them along.
                    let Ok(plain) = e.payload.plain() else {
                        return Work::Pass;
                    };
                    let Some(wire) = pprof::Wire::scan(plain) else {
                        return Work::Pass;
                    };
                    let Some(found) = wire.read() else {
                        return Work::Pass;
                    };
                    Work::Pprof {
                        wire: Box::new(wire),
                        found,
                    }
                }
                Format::Otlp => {
                    let Ok(o) = e.payload.otlp() else {
                        return Work::Pass;
                    };
                    let key = Arc::as_ptr(&o.dictionary) as usize;
                    let group = *by_dictionary.entry(key).or_insert_with(|| {
                        // Copied only when it has correlation to write.
                        let dict = o.dictionary.decoded().ok()?;
                        let table = otlp::Table::of(&dict)?;
                        groups.push(Group {
                            dictionary: dict.into_owned(),
                            table: Some(table),
                        });
                        Some(groups.len() - 1)
                    });
                    let Some(group) = group else {
                        return Work::Pass;
                    };
                    let Some(table) = &groups[group].table else {
                        return Work::Pass;
                    };
                    let profiles: Vec<_> = o
                        .profiles
                        .iter()
                        .map(|pd| {
                            let p = pd.decoded().ok()?;
                            let found = table.read(&p)?;
                            Some((p.into_owned(), found))
                        })
                        .collect();
                    if profiles.iter().all(Option::is_none) {
                        return Work::Pass;
                    }
                    Work::Otlp { group, profiles }
                }
            })
            .collect()
    }

    /// Every span whose trace (or name) the index may give, sorted, each
    /// with whether a sample needs its trace (only those are waited for).
    fn wanted(&self, work: &[Work]) -> Vec<(SpanId, bool)> {
        let mut wanted: Vec<(SpanId, bool)> = Vec::new();
        let mut add = |found: &[Option<Found>]| {
            for f in found.iter().flatten() {
                let Some(s) = f.span(self.rules.root_only) else {
                    continue;
                };
                let need_trace = f.trace().is_none();
                if need_trace || (self.labels && f.span_name.is_none()) {
                    wanted.push((s, need_trace));
                }
            }
        };
        for w in work {
            match w {
                Work::Pass => {}
                Work::Pprof { found, .. } => add(found),
                Work::Otlp { profiles, .. } => {
                    for (_, found) in profiles.iter().flatten() {
                        add(found);
                    }
                }
            }
        }
        // Sorted with the trace-needing entry of a span last, so dedup keeps it.
        wanted.sort_unstable();
        wanted.dedup_by(|later, earlier| {
            if later.0 == earlier.0 {
                earlier.1 |= later.1;
                true
            } else {
                false
            }
        });
        wanted
    }

    /// Looks `wanted` up, waiting up to `wait` for spans whose trace a
    /// sample needs and that are not indexed yet.
    async fn lookup(&self, wanted: Vec<(SpanId, bool)>) -> KnownSpans {
        let mut known = KnownSpans::default();
        let Some(index) = &self.index else {
            return known;
        };
        if wanted.is_empty() {
            return known;
        }
        let ids: Vec<SpanId> = wanted.iter().map(|(s, _)| *s).collect();
        // `ids` is sorted, so what is found is too.
        index.lookup_all(&ids, |i, k| known.0.push((ids[i], k)));
        if known.0.len() == ids.len() || self.wait.is_zero() || !self.fed.load(Ordering::Relaxed) {
            return known;
        }
        let missing: Vec<SpanId> = match self.gave_up.lock() {
            Ok(gave_up) => wanted
                .iter()
                .filter(|(s, need_trace)| {
                    *need_trace && known.get(s).is_none() && !gave_up.contains(s)
                })
                .map(|(s, _)| *s)
                .collect(),
            Err(_) => Vec::new(),
        };
        if missing.is_empty() {
            return known;
        }
        let deadline = tokio::time::Instant::now() + self.wait;
        let found_all = loop {
            let notified = index.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if index.has_all(&missing) {
                break true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break index.has_all(&missing);
            }
        };
        self.telemetry
            .waited(if found_all { "found" } else { "timed_out" });
        index.lookup_all(&missing, |i, k| known.0.push((missing[i], k)));
        known.0.sort_unstable_by_key(|(s, _)| *s);
        if !found_all && let Ok(mut gave_up) = self.gave_up.lock() {
            if gave_up.len() + missing.len() > MAX_GAVE_UP {
                gave_up.clear();
            }
            gave_up.extend(missing.iter().filter(|s| known.get(s).is_none()));
        }
        known
    }

    /// Each sample's link, counted by result.
    fn links(
        &self,
        found: &[Option<Found>],
        known: &KnownSpans,
        counts: &mut [u64; 3],
    ) -> Vec<Option<Link>> {
        found
            .iter()
            .map(|f| {
                let f = f.as_ref()?;
                let Some(span) = f.span(self.rules.root_only) else {
                    if f.malformed {
                        counts[2] += 1;
                    }
                    return None;
                };
                let k = known.get(&span);
                let trace = f.trace().or(k.map(|k| k.trace_id));
                let name = match (&f.span_name, k) {
                    (Some(n), _) => Some(n.clone()),
                    (None, Some(k)) => k.name.clone(),
                    (None, None) => None,
                };
                counts[usize::from(trace.is_none())] += 1;
                Some(Link { span, trace, name })
            })
            .collect()
    }

    fn write_pprof(
        &self,
        e: &mut Envelope,
        wire: &pprof::Wire,
        found: &[Option<Found>],
        links: &[Option<Link>],
    ) {
        // A rewritten profile is larger than it was decompressed: it may
        // pass the receiver's limit by what was added.
        let bytes = |w: pprof::Written| match w {
            pprof::Written::Same => wire.plain().clone(),
            pprof::Written::New(b) => Bytes::from(b),
        };
        let limit = |b: &Bytes| e.payload.decode_limit().max(b.len());
        let linked = links.iter().flatten().any(|l| l.trace.is_some());
        let otlp = if self.make_otlp && linked {
            // The OTLP form: linked samples get `trace_id` and `span_id`
            // labels, which the pipeline's conversion makes their link.
            let mode = pprof::Mode {
                labels: self.labels,
                trace_label: self.trace_label,
                link_labels: true,
            };
            pprof::write(wire, links, found, &self.rules, mode).and_then(|w| {
                let source = bytes(w);
                let mut lost = Lost::default();
                // A profile that does not convert fails the pipeline's
                // conversion the same way, which says so.
                let converted = Payload::from_bytes(source.clone(), limit(&source))
                    .with_form(Format::Otlp, &mut lost)
                    .ok()?;
                if let Some(t) = &self.pipeline_telemetry {
                    t.converted(Format::Otlp, &lost);
                }
                converted.otlp().ok()
            })
        } else {
            None
        };
        if self.labels || self.trace_label || self.rules.drop_after_link {
            let mode = pprof::Mode {
                labels: self.labels,
                trace_label: self.trace_label,
                link_labels: false,
            };
            if let Some(pprof::Written::New(b)) =
                pprof::write(wire, links, found, &self.rules, mode)
            {
                let b = Bytes::from(b);
                e.payload = Payload::from_bytes(b.clone(), limit(&b));
            }
        }
        if let Some(o) = otlp {
            e.payload = e.payload.with_otlp(o);
        }
    }
}

#[async_trait]
impl Processor for TraceLinkProcessor {
    async fn process(&self, mut envelopes: Vec<Envelope>, _meta: &BatchMeta) -> Vec<Envelope> {
        let mut groups = Vec::new();
        let work = self.read(&envelopes, &mut groups);
        if work.iter().all(|w| matches!(w, Work::Pass)) {
            return envelopes;
        }
        let known = self.lookup(self.wanted(&work)).await;
        let mut counts = [0u64; 3];
        let mut writers: Vec<Option<otlp::DictionaryWriter>> = groups
            .iter_mut()
            .map(|g| {
                Some(otlp::DictionaryWriter::new(
                    std::mem::take(&mut g.dictionary),
                    &g.table,
                ))
            })
            .collect();
        // (envelope, group, profiles) for the OTLP payloads that changed,
        // finished once their group's dictionary is.
        let mut changed_otlp: Vec<(usize, usize, Vec<ProfileData>)> = Vec::new();
        for (i, w) in work.into_iter().enumerate() {
            match w {
                Work::Pass => {}
                Work::Pprof { wire, found } => {
                    let links = self.links(&found, &known, &mut counts);
                    self.write_pprof(&mut envelopes[i], &wire, &found, &links);
                }
                Work::Otlp { group, profiles } => {
                    let Ok(o) = envelopes[i].payload.otlp() else {
                        continue;
                    };
                    let Some(writer) = writers[group].as_mut() else {
                        continue;
                    };
                    let table = &groups[group].table;
                    let mut any = false;
                    let mut out = Vec::with_capacity(o.profiles.len());
                    for (pd, read) in o.profiles.iter().zip(profiles) {
                        let Some((mut p, found)) = read else {
                            out.push(pd.clone());
                            continue;
                        };
                        let links = self.links(&found, &known, &mut counts);
                        if otlp::write(
                            &mut p,
                            &links,
                            table,
                            writer,
                            &self.rules,
                            Outputs {
                                otlp_links: self.otlp_links,
                                labels: self.labels,
                                trace_label: self.trace_label,
                            },
                        ) {
                            any = true;
                            out.push(ProfileData::from_decoded(p));
                        } else {
                            out.push(pd.clone());
                        }
                    }
                    if any {
                        changed_otlp.push((i, group, out));
                    }
                }
            }
        }
        let mut dictionaries: Vec<Option<Arc<potlp::SharedDictionary>>> = vec![None; writers.len()];
        for (i, group, profiles) in changed_otlp {
            let Ok(o) = envelopes[i].payload.otlp() else {
                continue;
            };
            let dictionary = match &dictionaries[group] {
                Some(d) => d.clone(),
                None => {
                    let Some(w) = writers[group].take() else {
                        continue;
                    };
                    let d = if w.changed {
                        otlp::shared(w)
                    } else {
                        o.dictionary.clone()
                    };
                    dictionaries[group] = Some(d.clone());
                    d
                }
            };
            let shared = dictionary.heap_size();
            envelopes[i].payload = Payload::from_otlp(OtlpProfiles::new(
                dictionary,
                o.context.clone(),
                profiles,
                shared,
            ));
        }
        self.telemetry.samples("linked", counts[0]);
        self.telemetry.samples("no_trace_id", counts[1]);
        self.telemetry.samples("malformed", counts[2]);
        envelopes
    }

    fn span_consumer(&self) -> Option<Arc<dyn SpanConsumer>> {
        let index = self.index.clone()?;
        self.fed.store(true, Ordering::Relaxed);
        Some(index)
    }
}
