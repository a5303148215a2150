//! What the collector reports of itself rather than of a component: its
//! version (`proflow_build_info`) and its config reloads, the figures the
//! `reload failed` alert and the status page read.

use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::gauge::Gauge;

use super::families::{Counters, Families, FloatGauges, Gauges};

/// Where the running config came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// The `--config` file (at start, SIGHUP, `POST /-/reload`).
    File,
    /// A remote config an OpAMP server sent.
    OpAmp,
}

impl ConfigSource {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigSource::File => "file",
            ConfigSource::OpAmp => "opamp",
        }
    }
}

pub(super) struct ServiceFamilies {
    reloads: Counters,
    last_reload_successful: Gauge,
    last_reload_success_time: FloatGauges,
}

impl ServiceFamilies {
    pub(super) fn declare(families: &Families) -> Self {
        let build: Gauges = families.family(
            "build_info",
            "Always 1; its version label says which proflow this is",
            Gauges::default,
        );
        build
            .get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_owned())])
            .set(1);
        let service = ServiceFamilies {
            reloads: families.family(
                "config_reloads",
                "Config reloads asked for (SIGHUP, POST /-/reload, OpAMP), by result (success, failure: refused or partly applied) and source",
                Counters::default,
            ),
            last_reload_successful: families.family(
                "config_last_reload_successful",
                "1 if the last config reload applied in full (or none was asked for since the start), 0 if it was refused or partly applied",
                Gauge::default,
            ),
            last_reload_success_time: families.family(
                "config_last_reload_success_timestamp_seconds",
                "Unix time the running config was last applied in full (the start counts)",
                FloatGauges::default,
            ),
        };
        service.last_reload_successful.set(1);
        service.stamp_success();
        service
    }

    fn stamp_success(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        self.last_reload_success_time
            .get_or_create(&Vec::new())
            .set(now);
    }

    pub(super) fn reloaded(&self, source: ConfigSource, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.reloads
            .get_or_create(&vec![
                ("result", result.to_owned()),
                ("source", source.as_str().to_owned()),
            ])
            .inc();
        self.last_reload_successful.set(i64::from(ok));
        if ok {
            self.stamp_success();
        }
    }
}
