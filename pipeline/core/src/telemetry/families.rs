//! Metric families and where they are declared. The core declares the
//! families every component shares (accepted, refused, sent, dropped,
//! queues, memory); a component declares its own through
//! [`Telemetry::counters`](super::Telemetry::counters) and its siblings when
//! it is built, from a handle type in its own folder
//! (`receivers/src/ebpf/telemetry.rs` is one). Declaring a family a second
//! time, by another instance of the component or after a reload, gives the
//! family already there, so every instance writes the same one under its
//! own `receiver`/`processor`/`exporter` label.

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

use prometheus_client::metrics::MetricType;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

/// The labels of one series: the component's id first, then what the
/// family is counted by.
pub type LabelSet = Vec<(&'static str, String)>;
/// A counter per label set (`_total` is added to the name).
pub type Counters = Family<LabelSet, Counter>;
/// A gauge per label set.
pub type Gauges = Family<LabelSet, Gauge>;
/// A floating-point gauge per label set.
pub type FloatGauges = Family<LabelSet, Gauge<f64, std::sync::atomic::AtomicU64>>;
/// A histogram per label set, with buckets from 1 ms doubling to 33 s.
pub type Histograms = Family<LabelSet, Histogram, fn() -> Histogram>;

/// An empty [`Histograms`] family.
pub fn new_histograms() -> Histograms {
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16)))
}

/// `id` with one more label, `k="v"`.
pub fn with_label(id: &LabelSet, k: &'static str, v: &str) -> LabelSet {
    let mut l = id.clone();
    l.push((k, v.to_string()));
    l
}

/// The registry `/metrics` shows and every family declared in it by name.
pub(super) struct Families {
    registry: Mutex<Registry>,
    declared: Mutex<HashMap<&'static str, Declared>>,
}

/// A family as declared: itself, and what `/metrics` says of it while it
/// has no series yet.
struct Declared {
    family: Box<dyn Any + Send + Sync>,
    help: &'static str,
    kind: &'static str,
}

impl Families {
    pub(super) fn new() -> Self {
        Families {
            registry: Mutex::new(Registry::with_prefix("proflow")),
            declared: Mutex::default(),
        }
    }

    /// The family `proflow_<name>`: the one declared already under `name`,
    /// or `make()` registered with `help` (without a final period: the
    /// encoder adds one). A name declared before with another type is a
    /// bug in a component: it is logged and the family returned is not
    /// shown, so nothing else breaks.
    pub(super) fn family<M: Metric + Clone>(
        &self,
        name: &'static str,
        help: &'static str,
        make: impl FnOnce() -> M,
    ) -> M {
        let mut declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = declared.get(name) {
            if let Some(family) = found.family.downcast_ref::<M>() {
                return family.clone();
            }
            tracing::error!(
                name,
                "the metric family proflow_{name} is declared twice with different types: the second is not shown (a bug: report it)"
            );
            return make();
        }
        let family = make();
        self.registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .register(name, help, family.clone());
        let kind = match family.metric_type() {
            MetricType::Counter => "counter",
            MetricType::Gauge => "gauge",
            MetricType::Histogram => "histogram",
            MetricType::Info => "info",
            MetricType::Unknown => "unknown",
        };
        declared.insert(
            name,
            Declared {
                family: Box::new(family.clone()),
                help,
                kind,
            },
        );
        family
    }

    /// Every family in OpenMetrics text format, ending with `# EOF`.
    /// A declared family with no series yet (a reason nothing was refused
    /// for, an exporter that has sent nothing) is listed by its `# HELP` and
    /// `# TYPE` lines alone, so `/metrics` names every metric a running
    /// component can report (the dashboards and alerts are checked against
    /// these names) and `extra` (text of whole families) goes before the end.
    pub(super) fn render(&self, out: &mut String, extra: &str) {
        let start = out.len();
        {
            let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
            // Encoding into a String cannot fail.
            let _ = prometheus_client::encoding::text::encode(out, &registry);
        }
        if out.ends_with("# EOF\n") {
            out.truncate(out.len() - "# EOF\n".len());
        }
        let shown: HashSet<&str> = out[start..]
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE proflow_"))
            .filter_map(|l| l.split(' ').next())
            .collect();
        let declared = self.declared.lock().unwrap_or_else(PoisonError::into_inner);
        let mut missing: Vec<(&&str, &Declared)> = declared
            .iter()
            .filter(|(name, _)| !shown.contains(**name))
            .collect();
        missing.sort_by_key(|(name, _)| **name);
        let mut tail = String::new();
        for (name, d) in missing {
            let _ = writeln!(tail, "# HELP proflow_{name} {}.", d.help);
            let _ = writeln!(tail, "# TYPE proflow_{name} {}", d.kind);
        }
        out.push_str(&tail);
        out.push_str(extra);
        out.push_str("# EOF\n");
    }
}
