//! The `scrape` receiver's config: Prometheus-style `scrape_configs` with
//! Parca's and Alloy's `profiling_config`.
//!
//! Names are Prometheus's (`job_name`, `scrape_interval`, `static_configs`,
//! `file_sd_configs`, `http_sd_configs`, `kubernetes_sd_configs`,
//! `relabel_configs`, `basic_auth`,
//! `authorization`, `tls_config`, `follow_redirects`, `body_size_limit`)
//! and Parca's and Alloy's (`profiling_config.path_prefix`,
//! `profiling_config.pprof_config.<name>.{enabled,path,delta}`). Where Parca
//! and Alloy differ, the defaults are Alloy's (interval 15s, timeout 10s),
//! because Pyroscope users are the larger group moving to a collector;
//! its reference (`README.md` beside this code) says so.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

pub(crate) use proflow_config::ClientTlsSettings;
use proflow_config::{ByteSize, Duration};
use proflow_core::component::FieldError;
use proflow_model::model::is_valid_label_name;
use proflow_relabel::{self as relabel, RelabelConfig};
use serde::Deserialize;

pub mod kubernetes;
pub use kubernetes::{KubernetesRole, KubernetesSdConfig};

/// Shortest `scrape_interval` (as Alloy's): a CPU profile needs a second of
/// sampling at least, and the interval minus the one-second margin.
pub const MIN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// Config of the `scrape` receiver.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScrapeReceiverConfig {
    /// The scrape jobs: each a set of targets found by its discovery
    /// configs, relabelled, and scraped for its enabled profiles.
    pub scrape_configs: Vec<ScrapeJobConfig>,
    /// Most memory the previous values of cumulative profiles (for client-side
    /// deltas) may take over all targets, shared fairly: a target whose state
    /// would not fit has its cumulative profiles dropped (counted, reason
    /// `delta_state_full`); if its state is within its share (this limit
    /// over the targets holding state), targets over theirs are refused at
    /// their next scrapes and give their room back. Default 128MiB.
    #[serde(default = "default_max_delta_state")]
    pub max_delta_state: ByteSize,
}

fn default_max_delta_state() -> ByteSize {
    ByteSize::mib(128)
}

/// One scrape job.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScrapeJobConfig {
    /// The job's name: the `job` label of its targets, and the default
    /// `service_name`. Unique within the receiver.
    pub job_name: String,
    /// How often each target is scraped. Default 15s (Alloy; Parca: 10s).
    /// At least 2s.
    #[serde(default = "default_interval")]
    pub scrape_interval: Duration,
    /// How long one scrape may take; at most the interval. Unset, it is
    /// 10s or the interval if that is shorter (as Prometheus does when a job
    /// sets none). A CPU profile (`delta: true`) samples for `seconds=` the
    /// interval minus one second, and may take that long plus this timeout.
    #[serde(default)]
    pub scrape_timeout: Option<Duration>,
    /// `http` (default) or `https`; a target's `__scheme__` label overrides it.
    #[serde(default)]
    pub scheme: Scheme,
    /// Query parameters added to every scrape URL (Prometheus's shape: each
    /// name with a list of values).
    #[serde(default)]
    pub params: BTreeMap<String, Vec<String>>,
    /// Fixed targets.
    #[serde(default)]
    pub static_configs: Vec<StaticConfig>,
    /// Targets read from JSON or YAML files (Prometheus file_sd format),
    /// reread when they change and every `refresh_interval`.
    #[serde(default)]
    pub file_sd_configs: Vec<FileSdConfig>,
    /// Targets fetched from an HTTP endpoint (Prometheus http_sd format).
    #[serde(default)]
    pub http_sd_configs: Vec<HttpSdConfig>,
    /// Targets found in Kubernetes (pods, endpoints, endpoint slices,
    /// services, nodes), watched as they change, with Prometheus's
    /// `__meta_kubernetes_*` labels.
    #[serde(default)]
    pub kubernetes_sd_configs: Vec<KubernetesSdConfig>,
    /// Prometheus relabel rules applied to each target (once per enabled
    /// profile: `__name__` is the profile's name and `__profile_path__` its
    /// path) before it is scraped; a target dropped here is listed under
    /// `dropped` on `/targets`.
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfig>,
    /// Which profiles to scrape, and where.
    #[serde(default)]
    pub profiling_config: ProfilingConfig,
    /// HTTP basic authentication for the targets.
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization` header for the targets (type `Bearer` by default).
    #[serde(default)]
    pub authorization: Option<Authorization>,
    /// TLS for `https` targets.
    #[serde(default)]
    pub tls_config: Option<ClientTlsSettings>,
    /// Follow HTTP redirects (at most 10). Default true (Prometheus).
    #[serde(default = "default_true")]
    pub follow_redirects: bool,
    /// Most bytes of one scraped profile, both as sent and once gunzipped;
    /// a larger one is refused (reason `too_large`). Default 64MiB.
    #[serde(default = "default_body_size_limit")]
    pub body_size_limit: ByteSize,
}

fn default_interval() -> Duration {
    Duration::from_secs(15)
}
/// The timeout of a job that sets none (before the interval caps it).
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
fn default_true() -> bool {
    true
}
fn default_body_size_limit() -> ByteSize {
    ByteSize::mib(64)
}
fn default_sd_file_refresh() -> Duration {
    Duration::from_secs(300)
}
fn default_sd_http_refresh() -> Duration {
    Duration::from_secs(60)
}

/// `scheme` of a job.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    #[default]
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// `static_configs` item: targets (`host:port`) and labels they all get.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct StaticConfig {
    /// `host:port` of each target.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Labels added to every target of this group.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `file_sd_configs` item.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileSdConfig {
    /// Files of target groups, `.json`, `.yaml` or `.yml`; the last path
    /// component may hold `*` wildcards (`targets/*.json`). Relative paths are
    /// relative to the working directory.
    pub files: Vec<PathBuf>,
    /// How often the files are reread even when nothing signalled a change.
    /// Default 5m (Prometheus).
    #[serde(default = "default_sd_file_refresh")]
    pub refresh_interval: Duration,
}

/// `http_sd_configs` item.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HttpSdConfig {
    /// The URL that answers with a JSON list of target groups.
    pub url: String,
    /// How often the URL is fetched. Default 1m (Prometheus).
    #[serde(default = "default_sd_http_refresh")]
    pub refresh_interval: Duration,
    /// HTTP basic authentication for the SD endpoint.
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization` header for the SD endpoint.
    #[serde(default)]
    pub authorization: Option<Authorization>,
    /// TLS for an `https` SD endpoint.
    #[serde(default)]
    pub tls_config: Option<ClientTlsSettings>,
    /// Follow HTTP redirects (at most 10). Default true.
    #[serde(default = "default_true")]
    pub follow_redirects: bool,
}

/// `basic_auth` (Prometheus's): `password` or `password_file`, not both.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password (read at start; trailing newline removed).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// `authorization` (Prometheus's): `credentials` or `credentials_file`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Authorization {
    /// The scheme word of the header. Default `Bearer`.
    #[serde(default = "default_auth_type", rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub credentials: Option<String>,
    /// A file holding the credentials (read at start; trailing newline removed).
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
}

fn default_auth_type() -> String {
    "Bearer".to_owned()
}

/// `profiling_config`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ProfilingConfig {
    /// Put before every profile path (`/myapp` → `/myapp/debug/pprof/…`).
    #[serde(default)]
    pub path_prefix: String,
    /// Profiles by name; these are merged over the defaults
    /// ([`default_profiles`]), so `memory: {enabled: false}` turns one off
    /// and any other name with a `path` adds a custom profile.
    #[serde(default)]
    pub pprof_config: BTreeMap<String, ProfileTargetConfig>,
}

/// One profile of `pprof_config`; unset fields take the default of that name.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq, Default)]
#[serde(deny_unknown_fields)]
pub struct ProfileTargetConfig {
    /// Scrape this profile. Default: on for the built-in `process_cpu`,
    /// `memory`, `goroutine`, `mutex`, `block` and for custom profiles; off
    /// for `godeltaprof_*` and `fgprof`.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The URL path (after `path_prefix`).
    #[serde(default)]
    pub path: Option<String>,
    /// The endpoint profiles over a duration it is asked for
    /// (`?seconds=`): the scrape asks for the interval minus one second.
    /// Default true for `process_cpu` and `fgprof`, else false.
    #[serde(default)]
    pub delta: Option<bool>,
}

/// A profile after defaults: what a scrape loop needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileTarget {
    /// The key in `pprof_config` (`process_cpu`, `godeltaprof_memory`, …).
    pub name: String,
    /// The `__name__` profiles of this target get: the key, except
    /// `godeltaprof_<x>`, which is the same profile as `<x>` (already a delta).
    pub profile_name: String,
    /// The path (with `path_prefix`).
    pub path: String,
    /// Asked for with `?seconds=` (a profile over the interval).
    pub seconds: bool,
    /// Counters since process start that proflow turns into deltas
    /// (memory, mutex, block; not godeltaprof, not `seconds` profiles).
    pub cumulative: bool,
}

/// The built-in profiles as `(name, enabled, path, delta)`: Alloy's set and
/// paths (Parca's agree for the five enabled ones).
pub const DEFAULT_PROFILES: &[(&str, bool, &str, bool)] = &[
    ("process_cpu", true, "/debug/pprof/profile", true),
    ("memory", true, "/debug/pprof/allocs", false),
    ("goroutine", true, "/debug/pprof/goroutine", false),
    ("mutex", true, "/debug/pprof/mutex", false),
    ("block", true, "/debug/pprof/block", false),
    ("fgprof", false, "/debug/fgprof", true),
    (
        "godeltaprof_memory",
        false,
        "/debug/pprof/delta_heap",
        false,
    ),
    (
        "godeltaprof_mutex",
        false,
        "/debug/pprof/delta_mutex",
        false,
    ),
    (
        "godeltaprof_block",
        false,
        "/debug/pprof/delta_block",
        false,
    ),
];

/// Built-in profiles whose counters run since process start.
const CUMULATIVE: &[&str] = &["memory", "mutex", "block"];

impl ProfilingConfig {
    /// The enabled profiles, defaults merged, in name order.
    pub fn enabled_profiles(&self) -> Vec<ProfileTarget> {
        let mut out = Vec::new();
        let mut names: BTreeSet<&str> = DEFAULT_PROFILES.iter().map(|p| p.0).collect();
        names.extend(self.pprof_config.keys().map(String::as_str));
        for name in names {
            let default = DEFAULT_PROFILES.iter().find(|p| p.0 == name);
            let own = self.pprof_config.get(name);
            let enabled = own
                .and_then(|o| o.enabled)
                .unwrap_or(default.is_none_or(|d| d.1));
            let Some(path) = own
                .and_then(|o| o.path.clone())
                .or_else(|| default.map(|d| d.2.to_owned()))
            else {
                continue; // a custom profile without a path: validate says so
            };
            if !enabled {
                continue;
            }
            let seconds = own
                .and_then(|o| o.delta)
                .unwrap_or(default.is_some_and(|d| d.3));
            let profile_name = name.strip_prefix("godeltaprof_").unwrap_or(name).to_owned();
            out.push(ProfileTarget {
                name: name.to_owned(),
                cumulative: !seconds && CUMULATIVE.contains(&name),
                profile_name,
                path: join_path(&self.path_prefix, &path),
                seconds,
            });
        }
        out
    }

    fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if !self.path_prefix.is_empty() && !self.path_prefix.starts_with('/') {
            problems.push(FieldError::new(
                "profiling_config.path_prefix",
                format!("{:?} must start with `/` (or be empty)", self.path_prefix),
            ));
        }
        for (name, p) in &self.pprof_config {
            let at = format!("profiling_config.pprof_config.{name}");
            if !is_valid_label_name(name) {
                problems.push(FieldError::new(
                    &at,
                    "a profile name becomes `__name__`: use letters, digits and `_`, not starting with a digit",
                ));
            }
            let builtin = DEFAULT_PROFILES.iter().any(|d| d.0 == name);
            match &p.path {
                None if !builtin && p.enabled != Some(false) => problems.push(FieldError::new(
                    format!("{at}.path"),
                    "a custom profile needs a `path` (such as /debug/pprof/heap)",
                )),
                Some(path) if !path.starts_with('/') => problems.push(FieldError::new(
                    format!("{at}.path"),
                    format!("{path:?} must start with `/`"),
                )),
                _ => {}
            }
        }
        problems
    }
}

fn join_path(prefix: &str, path: &str) -> String {
    format!("{}{}", prefix.trim_end_matches('/'), path)
}

impl BasicAuth {
    fn problems(&self, at: &str) -> Vec<FieldError> {
        match (&self.password, &self.password_file) {
            (Some(_), Some(_)) => vec![FieldError::new(
                at,
                "set `password` or `password_file`, not both",
            )],
            _ => Vec::new(),
        }
    }
}

impl Authorization {
    fn problems(&self, at: &str) -> Vec<FieldError> {
        let mut problems = Vec::new();
        match (&self.credentials, &self.credentials_file) {
            (Some(_), Some(_)) => problems.push(FieldError::new(
                at,
                "set `credentials` or `credentials_file`, not both",
            )),
            (None, None) => problems.push(FieldError::new(
                at,
                "set `credentials` or `credentials_file`",
            )),
            _ => {}
        }
        if self.kind.eq_ignore_ascii_case("basic") {
            problems.push(FieldError::new(
                format!("{at}.type"),
                "use `basic_auth` for Basic authentication",
            ));
        }
        if self.kind.is_empty() || self.kind.contains(char::is_whitespace) {
            problems.push(FieldError::new(
                format!("{at}.type"),
                "must be one word, such as Bearer",
            ));
        }
        problems
    }
}

/// Problems of the HTTP client settings shared by jobs and HTTP SD.
pub(crate) fn client_problems(
    at: &str,
    basic_auth: Option<&BasicAuth>,
    authorization: Option<&Authorization>,
    tls: Option<&ClientTlsSettings>,
) -> Vec<FieldError> {
    let mut problems = Vec::new();
    if let Some(b) = basic_auth {
        problems.extend(b.problems(&format!("{at}basic_auth")));
    }
    if let Some(a) = authorization {
        problems.extend(a.problems(&format!("{at}authorization")));
    }
    if basic_auth.is_some() && authorization.is_some() {
        problems.push(FieldError::new(
            format!("{at}authorization"),
            "set `basic_auth` or `authorization`, not both",
        ));
    }
    if let Some(t) = tls {
        problems.extend(t.problems(&format!("{at}tls_config")));
    }
    problems
}

/// Checks a `host:port` target.
pub(crate) fn target_problem(target: &str) -> Option<String> {
    if proflow_net::url::has_userinfo(target) {
        // Shown without its password: this message reaches logs and
        // `/targets`.
        let shown = proflow_net::url::redact_userinfo(target);
        return Some(format!(
            "{shown:?} holds a user name: a target is host:port; put the credentials in the job's `basic_auth` (a password in an address would end up in logs and labels)"
        ));
    }
    if target.contains("://") || target.contains('/') {
        return Some(format!(
            "{target:?} must be host:port without scheme or path (use `scheme` and `profiling_config.path_prefix`)"
        ));
    }
    let Some((host, port)) = target.rsplit_once(':') else {
        return Some(format!("{target:?} needs a port: host:port"));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Some(format!("{target:?} is not host:port"));
    }
    None
}

impl ScrapeReceiverConfig {
    /// Every problem of the config.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.scrape_configs.is_empty() {
            problems.push(FieldError::new(
                "scrape_configs",
                "list at least one job (job_name and static_configs, file_sd_configs, http_sd_configs or kubernetes_sd_configs)",
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, job) in self.scrape_configs.iter().enumerate() {
            let at = format!("scrape_configs.{i}.");
            if !seen.insert(job.job_name.as_str()) {
                problems.push(FieldError::new(
                    format!("{at}job_name"),
                    format!(
                        "{:?} is used by an earlier job; job names must be unique",
                        job.job_name
                    ),
                ));
            }
            problems.extend(job.problems().into_iter().map(|p| FieldError {
                path: format!("{at}{}", p.path),
                message: p.message,
            }));
        }
        if self.max_delta_state.bytes() == 0 {
            problems.push(FieldError::new(
                "max_delta_state",
                "must be more than 0: memory, mutex and block deltas need it",
            ));
        }
        problems
    }
}

impl ScrapeJobConfig {
    /// The job's timeout: `scrape_timeout`, or unset the smaller of 10s and
    /// the interval (Prometheus's rule for a job without one).
    pub fn timeout(&self) -> std::time::Duration {
        match self.scrape_timeout {
            Some(t) => t.get(),
            None => DEFAULT_TIMEOUT.min(self.scrape_interval.get()),
        }
    }

    /// Every problem of the job's settings, each at its path.
    fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.job_name.is_empty() {
            problems.push(FieldError::new("job_name", "must not be empty"));
        }
        self.timing_problems(&mut problems);
        self.discovery_problems(&mut problems);
        self.static_problems(&mut problems);
        self.file_sd_problems(&mut problems);
        self.http_sd_problems(&mut problems);
        self.scrape_problems(&mut problems);
        problems
    }

    /// Problems of `scrape_interval` and `scrape_timeout`.
    fn timing_problems(&self, problems: &mut Vec<FieldError>) {
        let interval = self.scrape_interval.get();
        if interval < MIN_INTERVAL {
            problems.push(FieldError::new(
                "scrape_interval",
                "must be at least 2s (a CPU profile samples for the interval minus one second)",
            ));
        }
        if let Some(timeout) = self.scrape_timeout {
            if timeout.is_zero() {
                problems.push(FieldError::new("scrape_timeout", "must be more than 0"));
            } else if timeout.get() > interval {
                problems.push(FieldError::new(
                    "scrape_timeout",
                    format!(
                        "{timeout} is longer than scrape_interval {}: make it at most the interval, or remove it (unset, it is 10s or the interval if shorter)",
                        self.scrape_interval
                    ),
                ));
            }
        }
    }

    /// A job without a source of targets, and problems of
    /// `kubernetes_sd_configs`.
    fn discovery_problems(&self, problems: &mut Vec<FieldError>) {
        if self.static_configs.is_empty()
            && self.file_sd_configs.is_empty()
            && self.http_sd_configs.is_empty()
            && self.kubernetes_sd_configs.is_empty()
        {
            problems.push(FieldError::new(
                "static_configs",
                "the job has no targets: add static_configs, file_sd_configs, http_sd_configs or kubernetes_sd_configs",
            ));
        }
        for (i, k) in self.kubernetes_sd_configs.iter().enumerate() {
            problems.extend(k.problems().into_iter().map(|p| FieldError {
                path: format!("kubernetes_sd_configs.{i}.{}", p.path),
                message: p.message,
            }));
        }
    }

    /// Problems of `static_configs`: their targets and label names.
    fn static_problems(&self, problems: &mut Vec<FieldError>) {
        for (i, s) in self.static_configs.iter().enumerate() {
            for (j, t) in s.targets.iter().enumerate() {
                if let Some(m) = target_problem(t) {
                    problems.push(FieldError::new(
                        format!("static_configs.{i}.targets.{j}"),
                        m,
                    ));
                }
            }
            for name in s.labels.keys() {
                if !is_valid_label_name(name) {
                    problems.push(FieldError::new(
                        format!("static_configs.{i}.labels.{name}"),
                        "is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*)",
                    ));
                }
            }
        }
    }

    /// Problems of `file_sd_configs`: their files and refresh intervals.
    fn file_sd_problems(&self, problems: &mut Vec<FieldError>) {
        for (i, f) in self.file_sd_configs.iter().enumerate() {
            if f.files.is_empty() {
                problems.push(FieldError::new(
                    format!("file_sd_configs.{i}.files"),
                    "list at least one file or pattern",
                ));
            }
            for (j, file) in f.files.iter().enumerate() {
                let text = file.to_string_lossy();
                let ext_ok = [".json", ".yaml", ".yml"].iter().any(|e| text.ends_with(e));
                let dir_has_wildcard = file
                    .parent()
                    .is_some_and(|d| d.to_string_lossy().contains(['*', '?', '[']));
                if !ext_ok || dir_has_wildcard {
                    problems.push(FieldError::new(
                        format!("file_sd_configs.{i}.files.{j}"),
                        format!("{text:?}: name files ending in .json, .yaml or .yml; only the last path component may hold `*`"),
                    ));
                }
            }
            if f.refresh_interval.is_zero() {
                problems.push(FieldError::new(
                    format!("file_sd_configs.{i}.refresh_interval"),
                    "must be more than 0",
                ));
            }
        }
    }

    /// Problems of `http_sd_configs`: their URLs, refresh intervals and
    /// client settings.
    fn http_sd_problems(&self, problems: &mut Vec<FieldError>) {
        for (i, h) in self.http_sd_configs.iter().enumerate() {
            let at = format!("http_sd_configs.{i}.");
            match h.url.parse::<http::Uri>() {
                Ok(u) if matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some() => {
                }
                _ => problems.push(FieldError::new(
                    format!("{at}url"),
                    format!("{:?} is not an absolute http:// or https:// URL", h.url),
                )),
            }
            if h.refresh_interval.is_zero() {
                problems.push(FieldError::new(
                    format!("{at}refresh_interval"),
                    "must be more than 0",
                ));
            }
            problems.extend(client_problems(
                &at,
                h.basic_auth.as_ref(),
                h.authorization.as_ref(),
                h.tls_config.as_ref(),
            ));
        }
    }

    /// Problems of how targets are scraped: relabelling, profiles, params,
    /// client settings and the body size limit.
    fn scrape_problems(&self, problems: &mut Vec<FieldError>) {
        problems.extend(
            relabel::validate_configs(&self.relabel_configs)
                .into_iter()
                .map(|p| FieldError {
                    path: format!("relabel_configs.{}", p.path),
                    message: p.message,
                }),
        );
        problems.extend(self.profiling_config.problems());
        if self.profiling_config.enabled_profiles().is_empty() {
            problems.push(FieldError::new(
                "profiling_config.pprof_config",
                "every profile is disabled: enable at least one",
            ));
        }
        for name in self.params.keys() {
            if name == "seconds" {
                problems.push(FieldError::new(
                    "params.seconds",
                    "is set by the scraper for `delta: true` profiles (the interval minus one second); remove it",
                ));
            }
        }
        problems.extend(client_problems(
            "",
            self.basic_auth.as_ref(),
            self.authorization.as_ref(),
            self.tls_config.as_ref(),
        ));
        // Relabelling may make a target https (Alloy's `.scheme` annotation
        // rule writes __scheme__); a rule that may write any label counts.
        let relabelling_sets_scheme = self.relabel_configs.iter().any(|r| {
            r.action == relabel::RelabelAction::LabelMap
                || r.target_label == "__scheme__"
                || r.target_label.contains('$')
        });
        if self.scheme == Scheme::Http && self.tls_config.is_some() && !relabelling_sets_scheme {
            problems.push(FieldError::new(
                "tls_config",
                "is only used with `scheme: https` (or targets whose __scheme__ is https); keep it only if relabelling sets __scheme__",
            ));
        }
        if self.body_size_limit.bytes() == 0 {
            problems.push(FieldError::new("body_size_limit", "must be more than 0"));
        }
    }
}

#[cfg(test)]
mod tests;
