//! The dynamic labels the Pyroscope Java agent sends beside a recording (the
//! `labels` part of its upload): a protobuf snapshot of contexts, each a map
//! of label-name string ids to label-value string ids, and the strings.
//! An event's `contextId` picks its context; 0 or an unknown id gives none.
//!
//! `LabelsSnapshot`: 1 `contexts` (map int64 → Context), 2 `strings`
//! (map int64 → string). `Context`: 1 `labels` (map int64 → int64).

use std::collections::HashMap;

use prost::Message;

/// `LabelsSnapshot`.
#[derive(Clone, PartialEq, Message)]
pub struct LabelsSnapshot {
    #[prost(map = "int64, message", tag = "1")]
    pub contexts: HashMap<i64, Context>,
    #[prost(map = "int64, string", tag = "2")]
    pub strings: HashMap<i64, String>,
}

/// `Context`.
#[derive(Clone, PartialEq, Message)]
pub struct Context {
    #[prost(map = "int64, int64", tag = "1")]
    pub labels: HashMap<i64, i64>,
}

impl LabelsSnapshot {
    /// The labels of context `id`, by name (pairs whose strings are missing
    /// are left out), sorted by name.
    pub fn labels(&self, id: i64) -> Vec<(&str, &str)> {
        let Some(context) = self.contexts.get(&id) else {
            return Vec::new();
        };
        let mut labels: Vec<(&str, &str)> = context
            .labels
            .iter()
            .filter_map(|(k, v)| {
                Some((self.strings.get(k)?.as_str(), self.strings.get(v)?.as_str()))
            })
            .collect();
        labels.sort_unstable();
        labels
    }

    /// A string of the snapshot (a span's name), if it has it.
    pub fn string(&self, id: i64) -> Option<&str> {
        self.strings.get(&id).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_gives_its_labels_by_name() {
        let snapshot = LabelsSnapshot {
            contexts: HashMap::from([(
                7,
                Context {
                    labels: HashMap::from([(1, 2), (3, 99)]),
                },
            )]),
            strings: HashMap::from([(1, "endpoint".into()), (2, "/burn".into())]),
        };
        let decoded = LabelsSnapshot::decode(snapshot.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded.labels(7), vec![("endpoint", "/burn")]);
        assert!(decoded.labels(0).is_empty());
    }
}
