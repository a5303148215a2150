//! The `trace_link` processor's config.

use proflow_config::Duration;
use proflow_core::component::FieldError;
use serde::Deserialize;

/// A form the processor writes a sample's trace and span in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// OTLP sample links (trace id and span id bytes in the dictionary's
    /// link table): on OTLP payloads, and on the OTLP form of pprof
    /// payloads when an exporter after the processor wants OTLP.
    OtlpLinks,
    /// pprof sample labels as Pyroscope's otel-profiling-go writes them:
    /// `span_id` (16 lower-case hex digits) and `span_name`. On OTLP
    /// payloads, the same as sample attributes where the sample has no link
    /// (a link becomes `trace_id` and `span_id` labels in any pprof made
    /// from it).
    Labels,
    /// The trace id as a `trace_id` sample label too (32 hex digits, as
    /// otel-profiling-go v0.6+ writes it), for pprof readers that link by
    /// it. Not for Pyroscope: it makes every sample label but `span_id` a
    /// series label, so one series per trace.
    TraceIdLabel,
}

/// Config of the `trace_link` processor.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TraceLinkProcessorConfig {
    /// The forms to write: `otlp_links`, `labels`, `trace_id_label`.
    /// Default `[otlp_links, labels]`.
    #[serde(default = "default_output")]
    pub output: Vec<Output>,
    /// Once a sample is linked (its trace and span known), remove the
    /// correlation labels the outputs do not write (Datadog's, `profile_id`,
    /// and with `labels` not in `output` all of them, `span_id` and
    /// `span_name` too), so exporters that index sample labels do not get
    /// one series per span. Default false.
    #[serde(default)]
    pub drop_span_labels_after_link: bool,
    /// Link to the local root span where the sample names it (Datadog's
    /// `local root span id`) rather than to the span itself (whose label
    /// stays unless `drop_span_labels_after_link`). Pyroscope's
    /// otel-profiling-go labels root spans only already. Default false.
    #[serde(default)]
    pub root_spans_only: bool,
    /// The span index: spans a `traces` pipeline feeds this processor,
    /// so samples that carry a span id only get its trace id (and span
    /// name). Absent: no index, and the processor takes no spans.
    #[serde(default)]
    pub span_index: Option<SpanIndexConfig>,
}

/// The `span_index` block.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SpanIndexConfig {
    /// How long a span stays findable after it arrived. Default 5m.
    #[serde(default = "default_window")]
    pub window: Duration,
    /// Most spans kept; the oldest go first beyond it. Default 1000000
    /// (about 60 MB).
    #[serde(default = "default_max_spans")]
    pub max_spans: usize,
    /// How long a batch of profiles waits for spans it names that are not
    /// indexed yet (spans are exported when they end, often after the
    /// profile that sampled them). The batch then goes on, those samples
    /// unlinked and counted. The wait holds the request that brought the
    /// batch. 0 never waits. Default 2s.
    #[serde(default = "default_wait")]
    pub wait: Duration,
}

impl Default for SpanIndexConfig {
    fn default() -> Self {
        SpanIndexConfig {
            window: default_window(),
            max_spans: default_max_spans(),
            wait: default_wait(),
        }
    }
}

fn default_output() -> Vec<Output> {
    vec![Output::OtlpLinks, Output::Labels]
}

fn default_window() -> Duration {
    Duration::from_secs(300)
}

fn default_max_spans() -> usize {
    1_000_000
}

fn default_wait() -> Duration {
    Duration::from_secs(2)
}

/// The longest `wait` accepted: a batch holds its sender's request meanwhile.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// The shortest `window` accepted.
pub const MIN_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);
/// The most spans an index may be asked to keep (about 6 GB).
pub const MAX_SPANS: usize = 100_000_000;

impl TraceLinkProcessorConfig {
    /// Every problem of the config.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.output.is_empty() {
            problems.push(FieldError::new(
                "output",
                "must list at least one of otlp_links, labels, trace_id_label",
            ));
        }
        for (i, o) in self.output.iter().enumerate() {
            if self.output[..i].contains(o) {
                problems.push(FieldError::new(
                    format!("output.{i}"),
                    "is listed twice; list each form once",
                ));
            }
        }
        if let Some(index) = &self.span_index {
            if index.window.get() < MIN_WINDOW {
                problems.push(FieldError::new(
                    "span_index.window",
                    "must be at least 1s, such as 5m (spans arrive when they end, seconds after their samples)",
                ));
            }
            if index.max_spans == 0 || index.max_spans > MAX_SPANS {
                problems.push(FieldError::new(
                    "span_index.max_spans",
                    format!("must be from 1 to {MAX_SPANS}, such as 1000000"),
                ));
            }
            if index.wait.get() > MAX_WAIT {
                problems.push(FieldError::new(
                    "span_index.wait",
                    format!(
                        "must be at most {MAX_WAIT:?}: a batch holds its sender's request while it waits; such as 2s"
                    ),
                ));
            }
        }
        problems
    }

    pub fn writes(&self, output: Output) -> bool {
        self.output.contains(&output)
    }
}
