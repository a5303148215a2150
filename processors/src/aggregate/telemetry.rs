//! The aggregate processor's own metrics (`proflow_aggregate_*`): profiles
//! merged or passed on unmerged by reason, windows closed, series open.
//! Declared here through the collector's [`Telemetry`]; the metrics every
//! processor has are the core's.

use proflow_core::telemetry::{Counters, Gauges, LabelSet, Telemetry, with_label};

/// Metric handle of an `aggregate` processor.
#[derive(Clone, Debug)]
pub struct AggregateTelemetry {
    id: LabelSet,
    profiles: Counters,
    windows: Counters,
    open_series: Gauges,
}

impl AggregateTelemetry {
    /// The handle of the processor `id`, declaring the families the first
    /// time one is made.
    pub fn new(telemetry: &Telemetry, id: &str) -> Self {
        AggregateTelemetry {
            id: vec![("processor", id.to_owned())],
            profiles: telemetry.counters(
                "aggregate_profiles",
                "Profiles an aggregate processor was given, by result (merged; or passed on unmerged: unreadable, not pprof it could read; max_series, no window left; no_room, the windows' half of max_in_flight_bytes or the tenant's share is used up; other_types, its sample or period types in its bytes differ from the window's)",
            ),
            windows: telemetry.counters(
                "aggregate_windows_closed",
                "Windows an aggregate processor closed and sent on as one profile each, by why (window: it lasted `window`; stop: shutdown or reload)",
            ),
            open_series: telemetry.gauges(
                "aggregate_open_series",
                "Series with an open window in an aggregate processor (bounded by max_series)",
            ),
        }
    }

    /// `n` more profiles with `result`.
    pub fn profiles(&self, result: &str, n: u64) {
        if n > 0 {
            self.profiles
                .get_or_create(&with_label(&self.id, "result", result))
                .inc_by(n);
        }
    }

    /// `n` more windows closed, for `why` (`window`, `stop`).
    pub fn closed(&self, why: &str, n: u64) {
        if n > 0 {
            self.windows
                .get_or_create(&with_label(&self.id, "why", why))
                .inc_by(n);
        }
    }

    /// Series with an open window now.
    pub fn open_series(&self, n: usize) {
        self.open_series
            .get_or_create(&self.id)
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}
