//! proflow's exporters: the components that take profiles out of the collector.
//! One folder per component, named after its config `type`: [`file`] writes
//! pprof or folded files to a local directory, [`nop`] discards (for tests and
//! benchmarks), [`otlp`] sends OTLP profiles over gRPC or HTTP, [`parca`]
//! writes pprof to Parca over gRPC, [`pyroscope`] sends pprof to Grafana
//! Pyroscope's push API, [`kafka`] sends one record per profile to Apache
//! Kafka.
//!
//! This crate depends on the core (`proflow-core`), the data model
//! (`proflow-model`), `proflow-net` (TLS), `proflow-config` and
//! `proflow-kafka` (the Kafka exporter's producer), never on another component
//! crate: exporters are driven by the pipeline's queue and implement nothing
//! but [`Exporter::export`](proflow_core::component::Exporter::export).
//!
//! Each exporter is behind a Cargo feature named after its config type
//! (`file`, `kafka`, `nop`, `otlp`, `parca`, `pyroscope`), all on by default.
//! Its own dependencies are optional and enabled by that feature only, so a
//! build without the exporter does not compile them: a Kafka exporter brings
//! `rdkafka` behind `kafka`, an OTLP one `tonic` behind `otlp`. [`factories`] lists only what was compiled; the
//! `proflow` binary forwards each feature as `exporter-<type>`.

// The errors of exporters that touch files and encode data; `nop` has none.
#[cfg(feature = "file")]
mod error;
#[cfg(feature = "file")]
pub mod file;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nop")]
pub mod nop;
#[cfg(feature = "otlp")]
pub mod otlp;
#[cfg(feature = "parca")]
pub mod parca;
#[cfg(feature = "pyroscope")]
pub mod pyroscope;
// The clients the exporters connect out with: gRPC (`otlp`, `parca`) and
// HTTP (`otlp`, `pyroscope`), their TLS setup and answer classification.
#[cfg(any(feature = "otlp", feature = "parca", feature = "pyroscope"))]
// A build with `pyroscope` alone uses only its HTTP client and TLS setup.
#[cfg_attr(not(any(feature = "otlp", feature = "parca")), allow(dead_code))]
mod client;

// The in-process server of the HTTP and gRPC exporters' unit tests.
#[cfg(all(test, any(feature = "otlp", feature = "parca", feature = "pyroscope")))]
mod test_peer;

#[cfg(feature = "file")]
pub use error::Error;

use proflow_core::registry::Factory;

#[cfg(any(
    feature = "file",
    feature = "nop",
    feature = "otlp",
    feature = "parca",
    feature = "pyroscope",
    feature = "kafka"
))]
use proflow_core::registry::Stability;

/// The exporter types compiled into this crate, for the binary's registry.
pub fn factories() -> Vec<Factory> {
    vec![
        #[cfg(feature = "file")]
        Factory::exporter::<file::FileExporterConfig>(
            "file",
            Stability::Alpha,
            "Writes profiles as gzip pprof or folded stacks under a local directory, with a JSON-lines index and size/age retention.",
        ),
        #[cfg(feature = "nop")]
        Factory::exporter::<nop::NopExporterConfig>(
            "nop",
            Stability::Stable,
            "Accepts and discards profiles, counting them; for tests and benchmarks.",
        ),
        #[cfg(feature = "kafka")]
        Factory::exporter::<kafka::KafkaExporterConfig>(
            "kafka",
            Stability::Alpha,
            "Sends one record per profile to Apache Kafka (pprof or OTLP), keyed by series, acknowledged by delivery reports.",
        ),
        #[cfg(feature = "otlp")]
        Factory::exporter::<otlp::OtlpExporterConfig>(
            "otlp",
            Stability::Alpha,
            "Sends OTLP profiles (v1development) over gRPC or HTTP to a Collector, Pyroscope or any OTLP profiles receiver.",
        ),
        #[cfg(feature = "parca")]
        Factory::exporter::<parca::ParcaExporterConfig>(
            "parca",
            Stability::Alpha,
            "Sends pprof profiles as they arrived to a Parca server (gRPC ProfileStoreService/WriteRaw).",
        ),
        #[cfg(feature = "pyroscope")]
        Factory::exporter::<pyroscope::PyroscopeExporterConfig>(
            "pyroscope",
            Stability::Alpha,
            "Sends pprof profiles as they arrived to Grafana Pyroscope's push API (or /ingest).",
        ),
    ]
}
