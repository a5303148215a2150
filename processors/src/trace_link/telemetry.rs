//! The trace_link processor's own metrics (`proflow_trace_link_*`): samples
//! by result, the span index, waits for spans. Declared here through the
//! collector's [`Telemetry`]; the metrics every processor has are the core's.

use proflow_core::telemetry::{Counters, Gauges, LabelSet, Telemetry, with_label};

/// Metric handle of a `trace_link` processor.
#[derive(Clone, Debug)]
pub struct TraceLinkTelemetry {
    id: LabelSet,
    samples: Counters,
    spans_indexed: Counters,
    spans_evicted: Counters,
    waits: Counters,
    index_spans: Gauges,
    index_bytes: Gauges,
}

impl TraceLinkTelemetry {
    /// The handle of the processor `id`, declaring the families the first time
    /// one is made.
    pub fn new(telemetry: &Telemetry, id: &str) -> Self {
        TraceLinkTelemetry {
            id: vec![("processor", id.to_owned())],
            samples: telemetry.counters(
                "trace_link_samples",
                "Samples a trace_link processor read a span from, by result (linked; no_trace_id: the span's trace is unknown; malformed: an id that is not one)",
            ),
            spans_indexed: telemetry.counters(
                "trace_link_spans_indexed",
                "Spans a trace_link processor put in its span index",
            ),
            spans_evicted: telemetry.counters(
                "trace_link_spans_evicted",
                "Spans a trace_link processor's index let go, by reason (window, max_spans)",
            ),
            waits: telemetry.counters(
                "trace_link_waits",
                "Batches a trace_link processor held for spans not yet indexed, by result (found: every span arrived; timed_out: went on after `wait` with some unlinked)",
            ),
            index_spans: telemetry.gauges(
                "trace_link_index_spans",
                "Spans in a trace_link processor's index (bounded by max_spans)",
            ),
            index_bytes: telemetry.gauges(
                "trace_link_index_bytes",
                "Memory a trace_link processor's span index holds",
            ),
        }
    }

    /// `n` more samples with `result` (`linked`, `no_trace_id`, `malformed`).
    pub fn samples(&self, result: &str, n: u64) {
        if n > 0 {
            let labels = with_label(&self.id, "result", result);
            self.samples.get_or_create(&labels).inc_by(n);
        }
    }

    /// Spans indexed and let go.
    pub fn indexed(&self, n: u64, evicted_window: u64, evicted_max: u64) {
        if n > 0 {
            self.spans_indexed.get_or_create(&self.id).inc_by(n);
        }
        for (reason, n) in [("window", evicted_window), ("max_spans", evicted_max)] {
            if n > 0 {
                let labels = with_label(&self.id, "reason", reason);
                self.spans_evicted.get_or_create(&labels).inc_by(n);
            }
        }
    }

    /// One batch held for spans, ended with `result` (`found`, `timed_out`).
    pub fn waited(&self, result: &str) {
        let labels = with_label(&self.id, "result", result);
        self.waits.get_or_create(&labels).inc();
    }

    /// The index's size now.
    pub fn index(&self, spans: usize, bytes: usize) {
        self.index_spans.get_or_create(&self.id).set(spans as i64);
        self.index_bytes.get_or_create(&self.id).set(bytes as i64);
    }
}
