//! From discovered groups to scrape targets: one target per discovered
//! address and enabled profile, relabelled as Prometheus relabels targets.
//!
//! Before relabelling, a target's labels are its group's labels plus
//! `__address__` (the `host:port`), `__scheme__`, `__profile_path__`,
//! `__name__` (the profile's key in `pprof_config`), `__scrape_interval__`,
//! `__scrape_timeout__`, `__param_<name>` for `params`, and `job`. After
//! relabelling (a target may be dropped there, and shows under `dropped` on
//! `/targets`):
//! - the URL is `__scheme__://__address____profile_path__?__param_*`, plus
//!   `seconds=` for `delta: true` profiles;
//! - `instance` defaults to `__address__`;
//! - the series labels are every label not starting with `__` and
//!   `__tenant_id__` (the profile's tenant, when relabelling sets it), plus
//!   `__name__` (a `godeltaprof_<x>` key becomes `<x>`: the same profile,
//!   already a delta) and `__delta__="false"` (what proflow sends is a delta
//!   or a snapshot already; Pyroscope must not difference it again);
//! - `service_name` is the target's own `service_name` label when it has
//!   one (from SD labels or relabelling), else the job name.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use proflow_model::model::{Labels, SERVICE_NAME_LABEL, TENANT_LABEL};
use proflow_net::url::percent_encode;
use proflow_relabel::Relabeler;

use super::config::{ProfileTarget, ScrapeJobConfig, target_problem};
use super::discovery::TargetGroup;

/// What a job's targets share, compiled once.
#[derive(Debug)]
pub struct JobSpec {
    pub name: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub scheme: &'static str,
    pub params: BTreeMap<String, Vec<String>>,
    pub relabeler: Relabeler,
    pub profiles: Vec<ProfileTarget>,
    /// Most bytes of a body and of its gunzipped form.
    pub body_limit: usize,
}

impl JobSpec {
    pub fn new(job: &ScrapeJobConfig) -> Result<Self, String> {
        Ok(JobSpec {
            name: job.job_name.clone(),
            interval: job.scrape_interval.get(),
            timeout: job.timeout(),
            scheme: job.scheme.as_str(),
            params: job.params.clone(),
            relabeler: Relabeler::new(&job.relabel_configs).map_err(|e| e.to_string())?,
            profiles: job.profiling_config.enabled_profiles(),
            body_limit: usize::try_from(job.body_size_limit.bytes()).unwrap_or(usize::MAX),
        })
    }

    /// `seconds=` of a `delta: true` profile: the interval minus one second,
    /// at least one second (Alloy's rule).
    pub fn profile_seconds(&self) -> u64 {
        self.interval.as_secs().saturating_sub(1).max(1)
    }
}

/// A target to scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Identity: the same key means the same scrape (URL and labels), so a
    /// rediscovered target keeps its loop and its delta state.
    pub key: u64,
    pub url: Uri,
    /// Series labels of what it gives.
    pub labels: Labels,
    /// Labels before relabelling, for `/targets`.
    pub discovered: Labels,
    /// The profile (from `pprof_config`).
    pub profile: Arc<ProfileTarget>,
}

impl Target {
    /// The URL as logs and `/targets` show it: the values of its query
    /// parameters (`params`, which may carry a token) redacted, but for
    /// `seconds`, which proflow sets itself.
    pub fn shown_url(&self) -> String {
        proflow_net::url::redact_url(&self.url.to_string(), &["seconds"])
    }
}

/// A target relabelling dropped (or that has no usable address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropped {
    pub discovered: Labels,
    /// Why, when it was not a relabel rule (an unusable address).
    pub reason: Option<String>,
}

/// The targets of `groups` (every provider's, in order).
pub fn build<'a>(
    job: &JobSpec,
    groups: impl IntoIterator<Item = &'a TargetGroup>,
) -> (Vec<Target>, Vec<Dropped>) {
    let mut active = Vec::new();
    let mut dropped = Vec::new();
    let profiles: Vec<Arc<ProfileTarget>> = job.profiles.iter().cloned().map(Arc::new).collect();
    for group in groups {
        for address in &group.targets {
            for profile in &profiles {
                let discovered = discovered_labels(job, group, address, profile);
                let mut labels = discovered.clone();
                if !job.relabeler.apply(&mut labels) {
                    dropped.push(Dropped {
                        discovered,
                        reason: None,
                    });
                    continue;
                }
                match finish(job, labels, profile) {
                    Ok((url, labels)) => active.push(Target {
                        key: key_of(&url, &labels),
                        url,
                        labels,
                        discovered,
                        profile: profile.clone(),
                    }),
                    Err(reason) => dropped.push(Dropped {
                        discovered,
                        reason: Some(reason),
                    }),
                }
            }
        }
    }
    // Two groups naming the same target give one scrape.
    let mut seen = std::collections::HashSet::new();
    active.retain(|t| seen.insert(t.key));
    (active, dropped)
}

fn discovered_labels(
    job: &JobSpec,
    group: &TargetGroup,
    address: &str,
    profile: &ProfileTarget,
) -> Labels {
    let mut labels = Labels::from_pairs(group.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    labels.set("__address__", address);
    labels.set("__scheme__", job.scheme);
    labels.set("__profile_path__", profile.path.as_str());
    labels.set("__name__", profile.name.as_str());
    labels.set("__scrape_interval__", format_duration(job.interval));
    labels.set("__scrape_timeout__", format_duration(job.timeout));
    for (name, values) in &job.params {
        if let Some(first) = values.first() {
            labels.set(format!("__param_{name}"), first.as_str());
        }
    }
    if labels.get("job").is_none() {
        labels.set("job", job.name.as_str());
    }
    labels
}

fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The URL and series labels of a relabelled target.
fn finish(job: &JobSpec, labels: Labels, profile: &ProfileTarget) -> Result<(Uri, Labels), String> {
    let address = labels
        .get("__address__")
        .ok_or("relabelling removed __address__")?;
    if let Some(problem) = target_problem(address) {
        return Err(format!("__address__ {problem}"));
    }
    let scheme = labels.get("__scheme__").unwrap_or(job.scheme);
    if scheme != "http" && scheme != "https" {
        return Err(format!("__scheme__ {scheme:?} is not http or https"));
    }
    let path = labels
        .get("__profile_path__")
        .unwrap_or(profile.path.as_str());
    if !path.starts_with('/') {
        return Err(format!("__profile_path__ {path:?} does not start with `/`"));
    }
    let mut query: Vec<(String, String)> = Vec::new();
    for l in labels.iter() {
        if let Some(name) = l.name.strip_prefix("__param_") {
            query.push((name.to_owned(), l.value.clone()));
        }
    }
    // Further values of a multi-valued param (labels hold the first).
    for (name, values) in &job.params {
        for v in values.iter().skip(1) {
            query.push((name.clone(), v.clone()));
        }
    }
    if profile.seconds {
        query.retain(|(n, _)| n != "seconds");
        query.push(("seconds".to_owned(), job.profile_seconds().to_string()));
    }
    let mut url = format!("{scheme}://{address}{path}");
    for (i, (n, v)) in query.iter().enumerate() {
        url.push(if i == 0 { '?' } else { '&' });
        url.push_str(&percent_encode(n));
        url.push('=');
        url.push_str(&percent_encode(v));
    }
    let url: Uri = url.parse().map_err(|e| {
        let shown = proflow_net::url::redact_url(&url, &["seconds"]);
        format!("the target URL {shown:?} is not valid: {e}")
    })?;

    let name = labels
        .get("__name__")
        .filter(|n| !n.is_empty())
        .map(|n| n.strip_prefix("godeltaprof_").unwrap_or(n).to_owned())
        .unwrap_or_else(|| profile.profile_name.clone());
    let instance = labels.get("instance").unwrap_or(address).to_owned();
    let mut series = labels.without_internal(&[TENANT_LABEL]);
    series.set("__name__", name);
    series.set("__delta__", "false");
    series.set("instance", instance);
    if series.get(SERVICE_NAME_LABEL).is_none() {
        let job_name = series.get("job").unwrap_or(job.name.as_str()).to_owned();
        series.set(SERVICE_NAME_LABEL, job_name);
    }
    Ok((url, series))
}

/// A stable identity of a scrape: FNV-1a over the URL and the labels (also
/// the seed of the target's offset within the interval).
fn key_of(url: &Uri, labels: &Labels) -> u64 {
    let mut h = Fnv::default();
    url.to_string().hash(&mut h);
    for l in labels.iter() {
        l.name.hash(&mut h);
        l.value.hash(&mut h);
    }
    h.finish()
}

/// FNV-1a: deterministic across runs (std's SipHash keys are random), so a
/// target's offset is the same after a restart.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::discovery::tests::group;

    fn job(yaml: &str) -> JobSpec {
        let c: ScrapeJobConfig = serde_saphyr::from_str(yaml).expect("job parses");
        JobSpec::new(&c).expect("job compiles")
    }

    #[test]
    fn credentials_in_an_address_drop_the_target_and_never_show() {
        let j = job(
            "job_name: checkout\nscrape_interval: 15s\nparams: {token: [abc123]}\nstatic_configs: []\n",
        );
        let (active, dropped) = build(
            &j,
            &[group(&["user:PASS@10.0.0.1:6060", "10.0.0.2:6060"], &[])],
        );
        assert!(
            active
                .iter()
                .all(|t| t.labels.get("instance") == Some("10.0.0.2:6060"))
        );
        assert_eq!(
            dropped.len(),
            5,
            "one per profile of the address with credentials"
        );
        for d in &dropped {
            let reason = d.reason.as_deref().unwrap_or("");
            assert!(reason.contains("user:<secret>@10.0.0.1:6060"), "{reason}");
            assert!(!reason.contains("PASS"), "{reason}");
            let shown = crate::scrape::status::dropped_json("checkout", d).to_string();
            assert!(
                !shown.contains("PASS") && !shown.contains("abc123"),
                "{shown}"
            );
        }
        let cpu = active
            .iter()
            .find(|t| t.profile.name == "process_cpu")
            .expect("cpu target");
        // The real URL carries the token; what is shown does not.
        assert!(cpu.url.to_string().contains("token=abc123"));
        assert_eq!(
            cpu.shown_url(),
            "http://10.0.0.2:6060/debug/pprof/profile?token=<secret>&seconds=14"
        );
    }

    #[test]
    fn one_target_per_address_and_profile_with_job_instance_and_service_name() {
        let j = job("job_name: checkout\nscrape_interval: 15s\nstatic_configs: []\n");
        let (active, dropped) = build(&j, &[group(&["127.0.0.1:6060"], &[("env", "prod")])]);
        assert!(dropped.is_empty());
        assert_eq!(active.len(), 5);
        let cpu = active
            .iter()
            .find(|t| t.profile.name == "process_cpu")
            .expect("cpu target");
        assert_eq!(
            cpu.url.to_string(),
            "http://127.0.0.1:6060/debug/pprof/profile?seconds=14"
        );
        assert_eq!(
            cpu.labels,
            Labels::from_pairs([
                ("__delta__", "false"),
                ("__name__", "process_cpu"),
                ("env", "prod"),
                ("instance", "127.0.0.1:6060"),
                ("job", "checkout"),
                ("service_name", "checkout"),
            ])
        );
        let mem = active
            .iter()
            .find(|t| t.profile.name == "memory")
            .expect("memory");
        assert_eq!(
            mem.url.to_string(),
            "http://127.0.0.1:6060/debug/pprof/allocs"
        );
    }

    #[test]
    fn relabel_keeps_drops_rewrites_and_maps() {
        let j = job(concat!(
            "job_name: j\nstatic_configs: []\n",
            "profiling_config: {pprof_config: {godeltaprof_memory: {enabled: true}}}\n",
            "relabel_configs:\n",
            "- {source_labels: [__meta_keep], regex: 'yes', action: keep}\n",
            "- {source_labels: [__name__], regex: 'goroutine|mutex|block|memory', action: drop}\n",
            "- {source_labels: [__address__], regex: '(.*):\\d+', target_label: __address__, replacement: '$1:7070'}\n",
            "- {regex: '__meta_(team)', action: labelmap}\n",
            "- {source_labels: [__meta_app], target_label: service_name}\n",
            "- {source_labels: [__meta_team], target_label: __tenant_id__}\n",
        ));
        let groups = [
            group(
                &["10.0.0.1:6060"],
                &[
                    ("__meta_keep", "yes"),
                    ("__meta_team", "pay"),
                    ("__meta_app", "api"),
                ],
            ),
            group(&["10.0.0.2:6060"], &[("__meta_keep", "no")]),
        ];
        let (active, dropped) = build(&j, &groups);
        let mut got: Vec<_> = active
            .iter()
            .map(|t| {
                (
                    t.url.to_string(),
                    t.labels.get("__name__").unwrap_or("").to_owned(),
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                (
                    "http://10.0.0.1:7070/debug/pprof/delta_heap".to_owned(),
                    "memory".to_owned()
                ),
                (
                    "http://10.0.0.1:7070/debug/pprof/profile?seconds=14".to_owned(),
                    "process_cpu".to_owned()
                ),
            ]
        );
        let t = &active[0];
        assert_eq!(t.labels.get("team"), Some("pay"));
        assert_eq!(t.labels.get("service_name"), Some("api"));
        assert_eq!(t.labels.get("instance"), Some("10.0.0.1:7070"));
        assert!(t.labels.iter().all(|l| !l.name.starts_with("__meta")));
        // The one `__` label kept: the profile's tenant.
        assert_eq!(t.labels.get(TENANT_LABEL), Some("pay"));
        // 4 profiles of the kept target dropped by name, 6 of the other.
        assert_eq!(dropped.len(), 4 + 6);
    }

    #[test]
    fn params_and_unusable_addresses() {
        let j = job(
            "job_name: j\nstatic_configs: []\nparams: {debug: ['1'], x: ['a b', 'c']}\nprofiling_config: {pprof_config: {process_cpu: {enabled: false}, memory: {enabled: false}, mutex: {enabled: false}, block: {enabled: false}}}\n",
        );
        let (active, dropped) = build(&j, &[group(&["h:1", "nope"], &[])]);
        assert_eq!(active.len(), 1);
        assert_eq!(
            active[0].url.to_string(),
            "http://h:1/debug/pprof/goroutine?debug=1&x=a%20b&x=c"
        );
        assert_eq!(dropped.len(), 1);
        assert!(
            dropped[0]
                .reason
                .as_deref()
                .unwrap_or("")
                .contains("needs a port")
        );
    }

    #[test]
    fn keys_are_stable_and_distinct() {
        let j = job("job_name: j\nstatic_configs: []\n");
        let (a, _) = build(&j, &[group(&["h:1", "h:2"], &[])]);
        let (b, _) = build(&j, &[group(&["h:2", "h:1"], &[])]);
        let mut ka: Vec<_> = a.iter().map(|t| t.key).collect();
        let mut kb: Vec<_> = b.iter().map(|t| t.key).collect();
        ka.sort();
        kb.sort();
        assert_eq!(ka, kb);
        ka.dedup();
        assert_eq!(ka.len(), 10);
    }
}
