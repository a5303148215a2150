//! Series labels as Pyroscope sets them on ingestion.
//!
//! Label names from clients are checked the way Pyroscope checks them by
//! default: letters, digits and `_`, not starting with a digit, with dots
//! allowed and turned into underscores (`otel.scope.name` → `otel_scope_name`;
//! pyroscope-go and pyroscope-rs send such names). Two names that become equal
//! are fine with equal values and refused with different ones.

use std::borrow::Cow;

use proflow_model::model::{Labels, NAME_LABEL, SERVICE_NAME_LABEL, is_valid_label_name};

/// `service_name` of a Push series that has none (Pyroscope's fallback).
pub(crate) use proflow_model::model::UNKNOWN_SERVICE;
/// Marks /ingest profiles as already delta, as Pyroscope does.
pub(crate) const DELTA_LABEL: &str = "__delta__";
/// The `spyName` of an /ingest request.
pub(crate) const SPY_LABEL: &str = "pyroscope_spy";
/// The application name when `service_name` came from a tag (folded formats).
pub(crate) const APP_NAME_LABEL: &str = "app_name";
/// Most labels one series may carry from a client: Push `labels` of a series
/// and /ingest `name` tags alike. Real clients send about ten; the cap keeps a
/// request from making thousands of label strings per profile.
pub(crate) const MAX_LABELS_PER_SERIES: usize = 128;
/// The one `__`-prefixed tag Pyroscope keeps from an /ingest `name`.
const SESSION_ID_LABEL: &str = "__session_id__";

/// The Prometheus form of a client's label name, or `None` when it cannot be
/// one: dots become underscores, anything else outside `[A-Za-z0-9_]` (or a
/// leading digit) is invalid.
pub(crate) fn sanitize_label_name(name: &str) -> Option<Cow<'_, str>> {
    let sanitized = if name.contains('.') {
        Cow::Owned(name.replace('.', "_"))
    } else {
        Cow::Borrowed(name)
    };
    is_valid_label_name(&sanitized).then_some(sanitized)
}

/// Collects labels, sanitizing names and refusing conflicting duplicates.
#[derive(Debug, Default)]
pub(crate) struct LabelsBuilder {
    labels: Labels,
}

impl LabelsBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one label from a client. Errors say which name is wrong and why.
    pub fn add(&mut self, name: &str, value: &str) -> Result<(), String> {
        let sanitized = sanitize_label_name(name).ok_or_else(|| {
            format!(
                "invalid label name {name:?}: use letters, digits, underscores (and dots, sent as underscores), not starting with a digit"
            )
        })?;
        match self.labels.get(&sanitized) {
            Some(existing) if existing != value => Err(format!(
                "label {sanitized:?} is given twice with different values ({existing:?} and {value:?}); send each label once"
            )),
            _ => {
                self.labels.set(sanitized.into_owned(), value);
                Ok(())
            }
        }
    }

    /// Sets a label we derive ourselves (names are known to be valid).
    pub fn set(&mut self, name: &str, value: &str) {
        self.labels.set(name, value);
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.labels.get(name)
    }

    pub fn build(self) -> Labels {
        self.labels
    }
}

/// Adds the tags of an /ingest `name`, dropping `__`-prefixed ones as Pyroscope
/// does (they are internal), except `__session_id__`.
pub(crate) fn add_ingest_tags(
    builder: &mut LabelsBuilder,
    tags: &[(String, String)],
) -> Result<(), String> {
    for (key, value) in tags {
        if key.starts_with("__") && key != SESSION_ID_LABEL {
            continue;
        }
        builder.add(key, value)?;
    }
    Ok(())
}

/// Labels of a pprof profile sent to /ingest: Pyroscope sets `__name__` from
/// the sample types, `__delta__="false"`, `pyroscope_spy`, and `service_name`
/// from the application name unless a tag gave one.
pub(crate) fn ingest_pprof_labels(
    app: &str,
    tags: &[(String, String)],
    spy_name: &str,
    profile_name: &str,
) -> Result<Labels, String> {
    ingest_labels(app, tags, spy_name, profile_name, false)
}

/// Labels of a folded-text profile sent to /ingest. As Pyroscope does, the
/// application name (with its type suffix removed) becomes `service_name`, or
/// `app_name` when a tag already set `service_name`.
pub(crate) fn ingest_folded_labels(
    app: &str,
    tags: &[(String, String)],
    spy_name: &str,
    profile_name: &str,
) -> Result<Labels, String> {
    ingest_labels(app, tags, spy_name, profile_name, true)
}

fn ingest_labels(
    app: &str,
    tags: &[(String, String)],
    spy_name: &str,
    profile_name: &str,
    app_name_when_service_tagged: bool,
) -> Result<Labels, String> {
    let mut b = LabelsBuilder::new();
    add_ingest_tags(&mut b, tags)?;
    if b.get(SERVICE_NAME_LABEL).is_none() {
        b.set(SERVICE_NAME_LABEL, app);
    } else if app_name_when_service_tagged && b.get(APP_NAME_LABEL).is_none() {
        b.set(APP_NAME_LABEL, app);
    }
    b.set(NAME_LABEL, profile_name);
    b.set(DELTA_LABEL, "false");
    b.set(SPY_LABEL, spy_name);
    Ok(b.build())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sanitizes_dots_and_refuses_the_rest() {
        assert_eq!(sanitize_label_name("env").as_deref(), Some("env"));
        assert_eq!(
            sanitize_label_name("otel.scope.name").as_deref(),
            Some("otel_scope_name")
        );
        assert_eq!(sanitize_label_name(".x").as_deref(), Some("_x"));
        assert_eq!(sanitize_label_name("9lives"), None);
        assert_eq!(sanitize_label_name("a-b"), None);
        assert_eq!(sanitize_label_name(""), None);
    }

    #[test]
    fn duplicates_after_sanitizing() {
        let mut b = LabelsBuilder::new();
        b.add("a.b", "1").unwrap();
        b.add("a_b", "1").unwrap();
        assert!(b.add("a_b", "2").unwrap_err().contains("twice"));
    }

    #[test]
    fn pprof_labels_like_pyroscope() {
        let l = ingest_pprof_labels(
            "checkout",
            &tags(&[
                ("env", "prod"),
                ("__session_id__", "s1"),
                ("__secret", "x"),
                ("otel.scope.name", "go"),
            ]),
            "gospy",
            "process_cpu",
        )
        .unwrap();
        assert_eq!(
            l.to_selector_string(),
            r#"{__delta__="false", __name__="process_cpu", __session_id__="s1", env="prod", otel_scope_name="go", pyroscope_spy="gospy", service_name="checkout"}"#
        );
        // A service_name tag wins over the application name.
        let l = ingest_pprof_labels("app", &tags(&[("service_name", "svc")]), "nodespy", "wall")
            .unwrap();
        assert_eq!(l.get("service_name"), Some("svc"));
        assert_eq!(l.get("app_name"), None);
    }

    #[test]
    fn folded_labels_keep_the_app_as_app_name() {
        let l = ingest_folded_labels("app", &tags(&[("service_name", "svc")]), "rbspy", "wall")
            .unwrap();
        assert_eq!(l.get("service_name"), Some("svc"));
        assert_eq!(l.get("app_name"), Some("app"));
        let l = ingest_folded_labels("app", &[], "unknown", "process_cpu").unwrap();
        assert_eq!(l.get("service_name"), Some("app"));
        assert_eq!(l.get("app_name"), None);
    }

    #[test]
    fn invalid_tag_names_are_refused() {
        let err = ingest_pprof_labels("a", &tags(&[("9x", "1")]), "s", "n").unwrap_err();
        assert!(err.contains("9x"), "{err}");
    }
}
