//! Checking a parsed config: every component read through the registry and
//! validated, pipelines and claimed resources checked, all problems at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use proflow_config::{ComponentId, Document, Error, Errors, Located, PipelineConfig};

use crate::component::{ExporterConfig, ProcessorConfig, ReceiverConfig, Resource};
use crate::registry::{AnyConfig, Kind, Registry};

use super::{PipelinePlan, Plan, Signal};

pub(super) struct Defined {
    pub(super) kind: Kind,
    pub(super) line: usize,
    pub(super) column: usize,
    pub(super) path: String,
}

/// The components of a config, read and validated.
#[derive(Default)]
struct Components {
    receivers: BTreeMap<String, Arc<dyn ReceiverConfig>>,
    processors: BTreeMap<String, Arc<dyn ProcessorConfig>>,
    exporters: BTreeMap<String, Arc<dyn ExporterConfig>>,
    /// Every id defined (valid or not), for the pipelines' references.
    defined: HashMap<(Kind, String), Defined>,
    /// Each component's config as text, by `<section>.<id>`.
    fingerprints: HashMap<String, String>,
}

/// Reads every component through the registry, validates it, and checks the
/// pipelines and claimed resources. Returns all problems at once.
pub fn plan(doc: &Document, registry: &Registry) -> Result<Plan, Errors> {
    let mut errors = Errors::default();
    let components = read_components(doc, registry, &mut errors);
    let mut used: HashSet<(Kind, String)> = HashSet::new();
    let pipelines: Vec<PipelinePlan> = doc
        .service
        .pipelines
        .iter()
        .map(|(pid, p)| check_pipeline(pid, p, &components, &mut used, &mut errors))
        .collect();
    let warnings = warnings(&components, &pipelines, &used);
    let max_in_flight = check_memory(doc, &components.receivers, &mut errors);
    if !errors.is_empty() {
        return Err(errors.sorted());
    }
    Ok(Plan {
        receivers: components.receivers,
        processors: components.processors,
        exporters: components.exporters,
        pipelines,
        telemetry: doc.service.telemetry.clone(),
        opamp: doc.service.opamp.clone(),
        shutdown_timeout: doc.service.shutdown_timeout.get(),
        max_in_flight_bytes: max_in_flight,
        warnings,
        fingerprints: components.fingerprints,
    })
}

/// Every component read through the registry and validated; two claiming
/// one resource (an address, a directory) is a problem.
fn read_components(doc: &Document, registry: &Registry, errors: &mut Errors) -> Components {
    let mut out = Components::default();
    let mut claims: Vec<(Resource, String)> = Vec::new();
    if let Ok(Some(addr)) = doc.service.telemetry.socket_addr() {
        claims.push((Resource::TcpListen(addr), "service.telemetry".into()));
    }
    if let Some(tls) = &doc.service.telemetry.tls {
        use proflow_net::server::ServerTlsFiles;
        for p in tls.problems("service.telemetry.tls") {
            errors.push(Error::new(&p.path, 0, 0, p.message));
        }
    }
    for (kind, entries) in [
        (Kind::Receiver, &doc.receivers),
        (Kind::Processor, &doc.processors),
        (Kind::Exporter, &doc.exporters),
    ] {
        for entry in entries {
            let id = entry.id.to_string();
            let owner = format!("{}::{id}", kind.section());
            let Some(factory) = registry.get(kind, &entry.id.kind) else {
                let message = format!(
                    "unknown {kind} type `{}`; known types: {}",
                    entry.id.kind,
                    registry.names(kind).join(", ")
                );
                errors.push(
                    Error::new(&entry.path, entry.line, entry.column, message).in_component(owner),
                );
                continue;
            };
            out.fingerprints
                .insert(format!("{}.{id}", kind.section()), entry.body.fingerprint());
            let defined = Defined {
                kind,
                line: entry.line,
                column: entry.column,
                path: entry.path.clone(),
            };
            out.defined.insert((kind, id.clone()), defined);
            let config = match factory.parse(&entry.body, &entry.path) {
                Ok(config) => config,
                Err(errs) => {
                    for e in errs {
                        errors.push(e.in_component(owner.clone()));
                    }
                    continue;
                }
            };
            let resources = match &config {
                AnyConfig::Receiver(c) => c.resources(),
                AnyConfig::Exporter(c) => c.resources(),
                AnyConfig::Processor(_) => Vec::new(),
            };
            for r in resources {
                if let Some((_, other)) = claims.iter().find(|(c, _)| conflicts(c, &r)) {
                    let message = format!(
                        "{} is already used by {other}; give each component its own",
                        describe(&r)
                    );
                    errors.push(
                        Error::new(&entry.path, entry.line, entry.column, message)
                            .in_component(owner.clone()),
                    );
                } else {
                    claims.push((r, owner.clone()));
                }
            }
            match config {
                AnyConfig::Receiver(c) => {
                    out.receivers.insert(id, c);
                }
                AnyConfig::Processor(c) => {
                    out.processors.insert(id, c);
                }
                AnyConfig::Exporter(c) => {
                    out.exporters.insert(id, c);
                }
            }
        }
    }
    out
}

/// The ids a pipeline lists for `kind`, each defined and listed once;
/// marked used.
fn check_refs(
    kind: Kind,
    refs: &[Located<String>],
    components: &Components,
    used: &mut HashSet<(Kind, String)>,
    errors: &mut Errors,
) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for r in refs {
        let at = |message: String| Error::new(&r.path, r.line, r.column, message);
        if let Err(msg) = ComponentId::parse(&r.value) {
            errors.push(at(msg));
            continue;
        }
        if !components.defined.contains_key(&(kind, r.value.clone())) {
            errors.push(at(format!(
                "{kind} `{}` is not defined: add it under `{}:` or fix the name",
                r.value,
                kind.section()
            )));
            continue;
        }
        if !seen.insert(r.value.clone()) {
            errors.push(at(format!(
                "{kind} `{}` is listed twice in this pipeline",
                r.value
            )));
            continue;
        }
        used.insert((kind, r.value.clone()));
        out.push(r.value.clone());
    }
    out
}

/// One pipeline checked: its references, and what its signal needs.
fn check_pipeline(
    pid: &Located<String>,
    p: &PipelineConfig,
    components: &Components,
    used: &mut HashSet<(Kind, String)>,
    errors: &mut Errors,
) -> PipelinePlan {
    let receivers = check_refs(Kind::Receiver, &p.receivers, components, used, errors);
    let processors = check_refs(Kind::Processor, &p.processors, components, used, errors);
    let exporters = check_refs(Kind::Exporter, &p.exporters, components, used, errors);
    let signal = if pid.value == "traces" || pid.value.starts_with("traces/") {
        Signal::Traces
    } else {
        Signal::Profiles
    };
    let mut at = |message: String| {
        errors.push(Error::new(&pid.path, pid.line, pid.column, message));
    };
    let id = &pid.value;
    match signal {
        Signal::Profiles => {
            for (what, list) in [("receiver", &p.receivers), ("exporter", &p.exporters)] {
                if list.is_empty() {
                    at(format!("pipeline `{id}` needs at least one {what}"));
                }
            }
        }
        Signal::Traces => {
            if p.receivers.is_empty() {
                at(format!(
                    "pipeline `{id}` needs at least one receiver, such as otlp"
                ));
            }
            if p.processors.is_empty() {
                at(format!(
                    "pipeline `{id}` needs a processor to feed: a trace_link with a span_index"
                ));
            }
            if !p.exporters.is_empty() {
                at(format!(
                    "pipeline `{id}` lists exporters, but proflow exports no traces: a traces pipeline only feeds the span index of its trace_link processors; remove `exporters`"
                ));
            }
            check_span_takers(p, components, errors);
        }
    }
    PipelinePlan {
        id: id.clone(),
        signal,
        receivers,
        processors,
        exporters,
    }
}

/// In a traces pipeline, every receiver takes traces and every processor
/// spans.
fn check_span_takers(p: &PipelineConfig, components: &Components, errors: &mut Errors) {
    for r in &p.receivers {
        if components
            .receivers
            .get(&r.value)
            .is_some_and(|c| !c.accepts_spans())
        {
            errors.push(Error::new(
                &r.path,
                r.line,
                r.column,
                format!(
                    "receiver `{}` takes no traces; in a traces pipeline use an otlp receiver",
                    r.value
                ),
            ));
        }
    }
    for r in &p.processors {
        if components
            .processors
            .get(&r.value)
            .is_some_and(|c| !c.takes_spans())
        {
            errors.push(Error::new(&r.path, r.line, r.column, format!("processor `{}` takes no spans; a traces pipeline feeds trace_link processors that have a span_index", r.value)));
        }
    }
}

/// What is worth saying but does not stop the collector: components no
/// pipeline uses, span indexes nothing feeds or nothing reads.
fn warnings(
    components: &Components,
    pipelines: &[PipelinePlan],
    used: &HashSet<(Kind, String)>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let mut unused: Vec<_> = components
        .defined
        .iter()
        .filter(|(k, _)| !used.contains(k))
        .collect();
    unused.sort_by_key(|(_, d)| d.line);
    for ((_, id), d) in unused {
        warnings.push(format!(
            "line {}:{}: {} `{id}` is defined at `{}` but used by no pipeline",
            d.line, d.column, d.kind, d.path
        ));
    }
    for (id, config) in &components.processors {
        let listed = |signal: Signal| {
            pipelines
                .iter()
                .any(|p| p.signal == signal && p.processors.contains(id))
        };
        if config.takes_spans() && listed(Signal::Profiles) && !listed(Signal::Traces) {
            warnings.push(format!(
                "processor `{id}` has a span index but no traces pipeline feeds it: samples that name a span only stay unlinked; add `traces: {{receivers: [otlp], processors: [{id}]}}`"
            ));
        }
        if listed(Signal::Traces) && !listed(Signal::Profiles) {
            warnings.push(format!(
                "processor `{id}` is fed spans but is in no profiles pipeline: its span index is never read; list it in the profiles pipeline whose samples it should link"
            ));
        }
    }
    warnings
}

/// `service.limits.max_in_flight_bytes`, checked against what one request
/// of each receiver may need.
fn check_memory(
    doc: &Document,
    receivers: &BTreeMap<String, Arc<dyn ReceiverConfig>>,
    errors: &mut Errors,
) -> usize {
    let max_in_flight = doc.service.limits.max_in_flight_bytes.as_usize();
    let largest = receivers
        .iter()
        .map(|(id, c)| (id, c.max_request_memory()))
        .max_by_key(|(_, m)| *m);
    if max_in_flight == 0 {
        errors.push(Error::new(
            "service.limits.max_in_flight_bytes",
            0,
            0,
            "must be more than 0, such as 256MiB",
        ));
    } else if let Some((id, need)) =
        largest.filter(|(_, need)| *need > proflow_model::memory::max_grant(max_in_flight))
    {
        errors.push(Error::new(
            "service.limits.max_in_flight_bytes",
            0,
            0,
            format!(
                "is {max_in_flight} bytes: one request may hold three quarters of it ({} bytes), less than one request of receiver `{id}` may need ({need} bytes: what it reads and decompresses); raise it to at least {} bytes or lower those limits",
                proflow_model::memory::max_grant(max_in_flight),
                need.saturating_mul(4).div_ceil(3)
            ),
        ));
    }
    max_in_flight
}

/// Two listeners conflict on the same port when their addresses are equal or
/// either is the unspecified address (`0.0.0.0`, `[::]`); two directories
/// conflict when one contains the other (one exporter's start-up clean-up
/// would delete the other's temporary files).
pub(super) fn conflicts(a: &Resource, b: &Resource) -> bool {
    match (a, b) {
        (Resource::TcpListen(x), Resource::TcpListen(y)) => {
            x.port() == y.port()
                && x.port() != 0
                && (x.ip() == y.ip() || x.ip().is_unspecified() || y.ip().is_unspecified())
        }
        (Resource::Directory(x), Resource::Directory(y)) => x.starts_with(y) || y.starts_with(x),
        _ => false,
    }
}

pub(super) fn describe(r: &Resource) -> String {
    match r {
        Resource::TcpListen(a) => format!("listen address {a}"),
        Resource::Directory(d) => format!("directory {}", d.display()),
    }
}

/// Runs a component's build inside a span naming it, so what the build
/// logs (a warning about its settings) says which component it is.
pub(super) fn building<T>(id: &str, build: impl FnOnce() -> T) -> T {
    tracing::info_span!("build", component = %id).in_scope(build)
}
