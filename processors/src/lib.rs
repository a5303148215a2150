//! proflow's processors: components that rewrite or filter profiles on their way
//! from receivers to exporters. Each lives in a folder named after its config
//! `type` (`relabel/`), holding its config struct and the running processor.
//!
//! This crate depends on the core (`proflow-core`: component traits,
//! telemetry), the data model (`proflow-model`), `proflow-net` (symbolize's
//! debuginfod client), `proflow-config` and the engines its processors use
//! (`proflow-relabel`, `proflow-symbolize`, `proflow-kube`), never on the
//! receiver or exporter crates. The binary registers what [`factories`] returns.
//!
//! Each processor is behind a Cargo feature named after its config type
//! (`relabel`), on by default; a processor's own dependencies are optional
//! and enabled by that feature only. [`factories`] lists only what was
//! compiled; the `proflow` binary forwards each feature as `processor-<type>`.

#[cfg(feature = "aggregate")]
pub mod aggregate;
#[cfg(feature = "k8s_attributes")]
pub mod k8s_attributes;
#[cfg(feature = "relabel")]
mod relabel;
#[cfg(feature = "symbolize")]
pub mod symbolize;
#[cfg(feature = "trace_link")]
pub mod trace_link;

use proflow_core::registry::Factory;
#[cfg(any(
    feature = "aggregate",
    feature = "relabel",
    feature = "symbolize",
    feature = "trace_link",
    feature = "k8s_attributes"
))]
use proflow_core::registry::Stability;

#[cfg(feature = "relabel")]
pub use relabel::{RELABEL_DROP_REASON, RelabelProcessor, RelabelProcessorConfig};

/// Every processor type compiled into this crate.
pub fn factories() -> Vec<Factory> {
    vec![
        #[cfg(feature = "aggregate")]
        Factory::processor::<aggregate::AggregateProcessorConfig>(
            "aggregate",
            Stability::Alpha,
            "Merges the profiles of one series over a window into one (values of equal stacks summed), cutting backend writes with every total kept.",
        ),
        #[cfg(feature = "relabel")]
        Factory::processor::<RelabelProcessorConfig>(
            "relabel",
            Stability::Beta,
            "Rewrites and filters series labels with Prometheus relabel_configs, without decoding profiles.",
        ),
        #[cfg(feature = "symbolize")]
        Factory::processor::<symbolize::SymbolizeProcessorConfig>(
            "symbolize",
            Stability::Alpha,
            "Names frames that arrive as addresses (pprof, OTLP): kernel from kallsyms, user from local binaries and debug files by build id.",
        ),
        #[cfg(feature = "trace_link")]
        Factory::processor::<trace_link::TraceLinkProcessorConfig>(
            "trace_link",
            Stability::Alpha,
            "Links profile samples to trace spans in every convention (Pyroscope, Datadog, OTLP links), filling trace ids from a span index fed by a traces pipeline.",
        ),
        #[cfg(feature = "k8s_attributes")]
        Factory::processor::<k8s_attributes::K8sAttributesProcessorConfig>(
            "k8s_attributes",
            Stability::Alpha,
            "Adds each profile's Kubernetes pod, namespace, node, container and owners (found by container id, pod IP or the sender's address) from watches of the API server.",
        ),
    ]
}
