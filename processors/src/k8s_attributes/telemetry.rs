//! The k8s_attributes processor's own metrics (`proflow_k8s_attributes_*`):
//! profiles by result, untrusted labels removed, the watch caches. Declared
//! here through the collector's [`Telemetry`]; the metrics every processor
//! has are the core's.

use proflow_core::telemetry::{Counters, Gauges, LabelSet, Telemetry, with_label};

/// Metric handle of a `k8s_attributes` processor.
#[derive(Clone, Debug)]
pub struct K8sAttributesTelemetry {
    id: LabelSet,
    profiles: Counters,
    untrusted_labels_removed: Counters,
    cache_objects: Gauges,
    watch_failures: Gauges,
}

impl K8sAttributesTelemetry {
    /// The handle of the processor `id`, declaring the families the first time
    /// one is made.
    pub fn new(telemetry: &Telemetry, id: &str) -> Self {
        K8sAttributesTelemetry {
            id: vec![("processor", id.to_owned())],
            profiles: telemetry.counters(
                "k8s_attributes_profiles",
                "Profiles a k8s_attributes processor saw, by result (associated: a pod was found and its metadata added; not_found: an identifier named no known pod; no_identifier: the profile carried none of the pod_association sources)",
            ),
            untrusted_labels_removed: telemetry.counters(
                "k8s_attributes_untrusted_labels_removed",
                "Identity labels (those the processor sets) a k8s_attributes processor removed from profiles pushed by senders outside its trusted_senders; the pod found by the connection sets them again",
            ),
            cache_objects: telemetry.gauges(
                "k8s_attributes_cache_objects",
                "Objects a k8s_attributes processor holds from its watches, by kind (pods, namespaces, nodes, replicasets)",
            ),
            watch_failures: telemetry.gauges(
                "k8s_attributes_watch_failures",
                "Failed lists and watches of a k8s_attributes processor's caches so far, by kind (each is retried)",
            ),
        }
    }

    /// `n` more profiles with `result` (`associated`, `not_found`,
    /// `no_identifier`).
    pub fn profiles(&self, result: &str, n: u64) {
        if n > 0 {
            let labels = with_label(&self.id, "result", result);
            self.profiles.get_or_create(&labels).inc_by(n);
        }
    }

    /// `n` more identity labels removed from profiles of untrusted senders.
    pub fn untrusted_labels_removed(&self, n: u64) {
        if n > 0 {
            self.untrusted_labels_removed
                .get_or_create(&self.id)
                .inc_by(n);
        }
    }

    /// A cache's objects and failed lists or watches so far, now.
    pub fn cache(&self, kind: &str, objects: usize, failures: u64) {
        let labels = with_label(&self.id, "kind", kind);
        self.cache_objects
            .get_or_create(&labels)
            .set(objects as i64);
        self.watch_failures
            .get_or_create(&labels)
            .set(i64::try_from(failures).unwrap_or(i64::MAX));
    }
}
