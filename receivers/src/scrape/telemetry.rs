//! The scrape receiver's own metrics (`proflow_scrape_*`): scrapes and their
//! failures by job, target counts, delta state. Declared here through the
//! collector's [`Telemetry`]; the metrics every receiver has are the core's.
//! The job is the label `scrape_job`, as Prometheus's own metrics name it: a
//! `job` label would clash with the one Prometheus sets on what it scrapes
//! (it would become `exported_job`).

use proflow_core::telemetry::{Counters, Gauges, Histograms, LabelSet, Telemetry, with_label};

/// Metric handle of a pull (scrape) receiver: scrapes and their failures by
/// job, target counts, delta state.
#[derive(Clone, Debug)]
pub struct ScrapeTelemetry {
    id: LabelSet,
    attempts: Counters,
    failures: Counters,
    targets: Gauges,
    targets_health: Gauges,
    delta_state_bytes: Gauges,
    delta_series: Gauges,
    duration: Histograms,
}

impl ScrapeTelemetry {
    /// The handle of the receiver `id`, declaring the families the first time
    /// one is made.
    pub fn new(telemetry: &Telemetry, id: &str) -> Self {
        ScrapeTelemetry {
            id: vec![("receiver", id.to_owned())],
            attempts: telemetry.counters(
                "scrape_attempts",
                "Scrapes a pull receiver attempted, by scrape_job (the job's job_name: Prometheus renames a job label of a scraped service)",
            ),
            failures: telemetry.counters(
                "scrape_failures",
                "Scrapes that gave no profile, by job and reason (per target: /targets)",
            ),
            targets: telemetry.gauges(
                "scrape_targets",
                "Targets of a pull receiver, by job and state (active: scraped; dropped: by relabelling)",
            ),
            targets_health: telemetry.gauges(
                "scrape_targets_health",
                "Active targets of a pull receiver by job and the health of their last scrape (up, down; unknown: not scraped yet), as /targets shows them",
            ),
            delta_state_bytes: telemetry.gauges(
                "scrape_delta_state_bytes",
                "Memory held for client-side deltas of cumulative profiles (bounded by max_delta_state)",
            ),
            delta_series: telemetry.gauges(
                "scrape_delta_series",
                "Target profiles whose previous values are held for client-side deltas",
            ),
            duration: telemetry.histograms(
                "scrape_duration_seconds",
                "Time one scrape took, by job (CPU profiles last the interval minus one second)",
            ),
        }
    }

    /// One scrape of `job` that took `seconds`.
    pub fn scraped(&self, job: &str, seconds: f64) {
        let labels = with_label(&self.id, "scrape_job", job);
        self.attempts.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(seconds);
    }

    /// A scrape of `job` that gave no profile, for `reason`.
    pub fn failed(&self, job: &str, reason: &str) {
        let mut labels = with_label(&self.id, "scrape_job", job);
        labels.push(("reason", reason.to_owned()));
        self.failures.get_or_create(&labels).inc();
    }

    /// How many targets `job` has now, active and dropped.
    pub fn targets(&self, job: &str, active: usize, dropped: usize) {
        for (state, n) in [("active", active), ("dropped", dropped)] {
            let mut labels = with_label(&self.id, "scrape_job", job);
            labels.push(("state", state.to_owned()));
            self.targets.get_or_create(&labels).set(n as i64);
        }
    }

    /// The gauge that counts `job`'s active targets by health.
    pub fn health_gauge(&self, job: &str) -> HealthGauge {
        HealthGauge {
            family: self.targets_health.clone(),
            labels: with_label(&self.id, "scrape_job", job),
        }
    }

    /// What the delta state holds now.
    pub fn delta_state(&self, bytes: usize, series: usize) {
        self.delta_state_bytes
            .get_or_create(&self.id)
            .set(bytes as i64);
        self.delta_series.get_or_create(&self.id).set(series as i64);
    }
}

/// One job's count of active targets by health: a target adds itself as
/// `unknown` when it starts, moves when its health changes and takes
/// itself off when it stops.
#[derive(Clone, Debug)]
pub struct HealthGauge {
    family: Gauges,
    labels: LabelSet,
}

impl HealthGauge {
    /// One target more (`add`) or less with health `health`.
    pub fn count(&self, health: &str, add: bool) {
        let labels = with_label(&self.labels, "health", health);
        let gauge = self.family.get_or_create(&labels);
        if add {
            gauge.inc();
        } else {
            gauge.dec();
        }
    }
}
