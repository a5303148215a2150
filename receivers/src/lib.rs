//! proflow's receivers: the components that accept profiles from the network
//! and hand each request's profiles to the pipeline as one batch.
//!
//! Lives here: one module per receiver type, named after its config `type`
//! ([`pprof_push`]: Pyroscope-compatible `/ingest` and `push.v1` Push;
//! [`otlp`]: OTLP profiles over gRPC and HTTP; [`kafka`]: a consumer group
//! member committing only what was delivered; [`scrape`]: Prometheus-style
//! pull of `/debug/pprof` endpoints; [`ebpf`]: system-wide CPU sampling of
//! every process with a BPF program, Linux only), and
//! [`factories`], the table the binary joins into its registry.
//!
//! This crate depends on the core (`proflow-core`: component traits,
//! telemetry), the data model (`proflow-model`), the listeners
//! (`proflow-net`), `proflow-config`, and the engines its receivers use
//! (`proflow-kafka`, `proflow-kube`, `proflow-relabel`,
//! `proflow-symbolize`); never on another component crate, so receivers,
//! processors and exporters stay independent.
//!
//! Each receiver is behind a Cargo feature named after its config type
//! (`pprof_push`), on by default. Its own dependencies are optional and
//! enabled by that feature only, so a build without the receiver does not
//! compile them: a Kafka receiver brings `rdkafka` behind `kafka`, an OTLP one
//! `tonic` behind `otlp`. [`factories`] lists only what was compiled; the
//! `proflow` binary forwards each feature as `receiver-<type>`.

#[cfg(all(feature = "ebpf", target_os = "linux"))]
pub mod ebpf;
/// HotSpot's line-table decoders of the ebpf receiver, without the
/// receiver (feature `perf-map`: no aya), for the fuzz targets in `fuzz/`.
#[cfg(all(feature = "perf-map", not(feature = "ebpf"), target_os = "linux"))]
#[doc(hidden)]
#[path = "ebpf/jvmlines.rs"]
pub mod jvmlines;
#[cfg(feature = "kafka")]
pub mod kafka;
/// The kafka receiver's record decoder without the receiver (feature
/// `kafka-record`: no rdkafka), for the fuzz targets in `fuzz/`.
#[cfg(all(feature = "kafka-record", not(feature = "kafka")))]
#[doc(hidden)]
#[path = "kafka/record.rs"]
pub mod kafka_record;
#[cfg(feature = "otlp")]
pub mod otlp;
/// The ebpf receiver's perf map reader without the receiver (feature
/// `perf-map`: no aya), for the fuzz targets in `fuzz/`.
#[cfg(all(feature = "perf-map", not(feature = "ebpf"), target_os = "linux"))]
#[doc(hidden)]
#[path = "ebpf/perfmap.rs"]
pub mod perfmap;
#[cfg(feature = "pprof_push")]
pub mod pprof_push;
/// CPython's line-table decoders of the ebpf receiver, without the
/// receiver (feature `perf-map`: no aya), for the fuzz targets in `fuzz/`.
#[cfg(all(feature = "perf-map", not(feature = "ebpf"), target_os = "linux"))]
#[doc(hidden)]
#[path = "ebpf/pylines.rs"]
pub mod pylines;
/// Ruby's line-table decoders of the ebpf receiver, without the receiver
/// (feature `perf-map`: no aya), for the fuzz targets in `fuzz/`.
#[cfg(all(feature = "perf-map", not(feature = "ebpf"), target_os = "linux"))]
#[doc(hidden)]
#[path = "ebpf/rubylines.rs"]
pub mod rubylines;
#[cfg(feature = "scrape")]
pub mod scrape;
/// The ebpf receiver's state budget, which the perf map reader charges
/// (feature `perf-map`).
#[cfg(all(feature = "perf-map", not(feature = "ebpf"), target_os = "linux"))]
#[doc(hidden)]
#[path = "ebpf/state_budget.rs"]
pub mod state_budget;
/// V8's source position tables and line ends, as the ebpf receiver
/// decodes them, without the receiver (feature `perf-map`: no aya), for
/// the fuzz targets in `fuzz/`.
#[cfg(all(feature = "perf-map", not(feature = "ebpf"), target_os = "linux"))]
#[doc(hidden)]
#[path = "ebpf/v8lines.rs"]
pub mod v8lines;

use proflow_core::registry::Factory;
#[cfg(any(
    feature = "pprof_push",
    feature = "otlp",
    feature = "kafka",
    feature = "scrape",
    all(feature = "ebpf", target_os = "linux")
))]
use proflow_core::registry::Stability;

/// Every receiver type compiled into this crate.
pub fn factories() -> Vec<Factory> {
    vec![
        #[cfg(all(feature = "ebpf", target_os = "linux"))]
        Factory::receiver::<ebpf::EbpfReceiverConfig>(
            "ebpf",
            Stability::Alpha,
            "Samples every CPU with a BPF program (cpu-clock perf event) and turns kernel and user stacks of every process into CPU profiles, symbolized, with process and container labels. Needs root or CAP_BPF and CAP_PERFMON.",
        ),
        #[cfg(feature = "kafka")]
        Factory::receiver::<kafka::KafkaReceiverConfig>(
            "kafka",
            Stability::Alpha,
            "Reads profiles from Kafka topics as a consumer group member, committing each record only once every exporter delivered it (at least once).",
        ),
        #[cfg(feature = "pprof_push")]
        Factory::receiver::<pprof_push::PprofPushConfig>(
            "pprof_push",
            Stability::Alpha,
            "Accepts profiles pushed the way Pyroscope clients send them: POST /ingest (pprof, multipart, folded text) and the push.v1 Connect Push API.",
        ),
        #[cfg(feature = "scrape")]
        Factory::receiver::<scrape::ScrapeReceiverConfig>(
            "scrape",
            Stability::Alpha,
            "Pulls pprof profiles from /debug/pprof endpoints on a schedule, with Prometheus-style scrape_configs, service discovery and relabelling, turning cumulative profiles into deltas.",
        ),
        #[cfg(feature = "otlp")]
        Factory::receiver::<otlp::OtlpConfig>(
            "otlp",
            Stability::Alpha,
            "Accepts OTLP profiles (v1development, proto 1.10) over gRPC and HTTP, as the OpenTelemetry Collector's otlp receiver does.",
        ),
    ]
}
