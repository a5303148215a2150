//! `limits` of a receiver: per-tenant ingestion rates at the edge, with
//! Pyroscope's names and meanings (`ingestion_rate_mb`,
//! `ingestion_burst_size_mb`, and `overrides` per tenant), so the overrides
//! a Pyroscope operator runs can be copied here and a flood is refused
//! before proflow decodes it or a backend refuses it.
//!
//! Each tenant (the request's `X-Scope-OrgID`, or the tenant its bearer
//! token is bound to; `anonymous` when it names none, as in Pyroscope) has
//! a token bucket of bytes: it refills at `ingestion_rate_mb` MiB a second
//! and holds at most `ingestion_burst_size_mb` MiB. A request takes its
//! body's bytes as received; one that finds too few is refused whole (429
//! with `Retry-After`, the seconds until the bucket holds enough) and takes
//! nothing. A rate of 0 is no limit. Label limits (`max_label_names_per_series`,
//! `max_label_name_length`, `max_label_value_length`; 0 is no limit) refuse a
//! series as Pyroscope does, with its reasons and words ([`LimitRefused`]).
//! The buckets of at most
//! [`MAX_TENANTS`] tenants are kept; past that, the longest unused one
//! (whose bucket has refilled, so nothing is forgotten that mattered) goes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use proflow_config::FieldError;
use serde::Deserialize;

/// The tenant of a request that names none (Pyroscope's).
pub const ANONYMOUS_TENANT: &str = "anonymous";

/// Most tenants whose buckets are kept at once.
pub const MAX_TENANTS: usize = 10_000;

const MIB: f64 = 1024.0 * 1024.0;

/// The limits of one tenant (Pyroscope's names; 0 is no limit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantRate {
    pub ingestion_rate_mb: f64,
    pub ingestion_burst_size_mb: f64,
    pub max_label_names_per_series: usize,
    pub max_label_name_length: usize,
    pub max_label_value_length: usize,
    pub max_profile_size_bytes: usize,
    pub max_profile_stacktrace_samples: usize,
    pub max_profile_stacktrace_depth: usize,
    pub max_profile_stacktrace_sample_labels: usize,
}

fn default_burst_mb() -> f64 {
    2.0
}

/// `limits` of a receiver: the defaults of every tenant and `overrides`
/// per tenant. Equal when every number has the same bits (so `Eq` holds,
/// for the reload's comparison of configs).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsSettings {
    /// MiB a second a tenant's requests may bring on average (0, the
    /// default here: no limit; Pyroscope's default is 4).
    #[serde(default)]
    pub ingestion_rate_mb: f64,
    /// MiB a tenant may bring at once above the rate (the bucket's size; a
    /// request larger than this is always refused). Pyroscope's default, 2.
    #[serde(default = "default_burst_mb")]
    pub ingestion_burst_size_mb: f64,
    /// Most labels a profile's series may have (0, the default here: no
    /// limit; Pyroscope's default is 30).
    #[serde(default)]
    pub max_label_names_per_series: usize,
    /// Longest label name, in bytes (0: no limit; Pyroscope's, 1024).
    #[serde(default)]
    pub max_label_name_length: usize,
    /// Longest label value, in bytes (0: no limit; Pyroscope's, 2048).
    #[serde(default)]
    pub max_label_value_length: usize,
    /// Largest profile, its uncompressed protobuf in bytes (0: no limit;
    /// Pyroscope's default is 4 MiB, 4194304).
    #[serde(default)]
    pub max_profile_size_bytes: usize,
    /// Most samples of one profile (0: no limit; Pyroscope's, 16000).
    #[serde(default)]
    pub max_profile_stacktrace_samples: usize,
    /// Deepest stack kept: a deeper one loses its leaf-most frames and
    /// keeps the root side, as Pyroscope truncates it; the profile is not
    /// refused (0: no limit; Pyroscope's, 1000).
    #[serde(default)]
    pub max_profile_stacktrace_depth: usize,
    /// Most labels of one sample (0: no limit; Pyroscope's, 100).
    #[serde(default)]
    pub max_profile_stacktrace_sample_labels: usize,
    /// Per tenant, limits that replace the defaults (each key given
    /// replaces that one; a key left out is the default's).
    #[serde(default)]
    pub overrides: BTreeMap<String, TenantOverride>,
}

impl Default for TenantLimitsSettings {
    fn default() -> Self {
        TenantLimitsSettings {
            ingestion_rate_mb: 0.0,
            ingestion_burst_size_mb: default_burst_mb(),
            max_label_names_per_series: 0,
            max_label_name_length: 0,
            max_label_value_length: 0,
            max_profile_size_bytes: 0,
            max_profile_stacktrace_samples: 0,
            max_profile_stacktrace_depth: 0,
            max_profile_stacktrace_sample_labels: 0,
            overrides: BTreeMap::new(),
        }
    }
}

/// One tenant's override: the keys it sets.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantOverride {
    pub ingestion_rate_mb: Option<f64>,
    pub ingestion_burst_size_mb: Option<f64>,
    pub max_label_names_per_series: Option<usize>,
    pub max_label_name_length: Option<usize>,
    pub max_label_value_length: Option<usize>,
    pub max_profile_size_bytes: Option<usize>,
    pub max_profile_stacktrace_samples: Option<usize>,
    pub max_profile_stacktrace_depth: Option<usize>,
    pub max_profile_stacktrace_sample_labels: Option<usize>,
}

impl PartialEq for TenantOverride {
    fn eq(&self, other: &Self) -> bool {
        let bits = |v: Option<f64>| v.map(f64::to_bits);
        bits(self.ingestion_rate_mb) == bits(other.ingestion_rate_mb)
            && bits(self.ingestion_burst_size_mb) == bits(other.ingestion_burst_size_mb)
            && self.max_label_names_per_series == other.max_label_names_per_series
            && self.max_label_name_length == other.max_label_name_length
            && self.max_label_value_length == other.max_label_value_length
            && self.max_profile_size_bytes == other.max_profile_size_bytes
            && self.max_profile_stacktrace_samples == other.max_profile_stacktrace_samples
            && self.max_profile_stacktrace_depth == other.max_profile_stacktrace_depth
            && self.max_profile_stacktrace_sample_labels
                == other.max_profile_stacktrace_sample_labels
    }
}

impl Eq for TenantOverride {}

impl PartialEq for TenantLimitsSettings {
    fn eq(&self, other: &Self) -> bool {
        self.ingestion_rate_mb.to_bits() == other.ingestion_rate_mb.to_bits()
            && self.ingestion_burst_size_mb.to_bits() == other.ingestion_burst_size_mb.to_bits()
            && self.max_label_names_per_series == other.max_label_names_per_series
            && self.max_label_name_length == other.max_label_name_length
            && self.max_label_value_length == other.max_label_value_length
            && self.max_profile_size_bytes == other.max_profile_size_bytes
            && self.max_profile_stacktrace_samples == other.max_profile_stacktrace_samples
            && self.max_profile_stacktrace_depth == other.max_profile_stacktrace_depth
            && self.max_profile_stacktrace_sample_labels
                == other.max_profile_stacktrace_sample_labels
            && self.overrides == other.overrides
    }
}

impl Eq for TenantLimitsSettings {}

impl TenantLimitsSettings {
    /// Every problem, each under its key after `prefix` (`limits`).
    pub fn problems(&self, prefix: &str) -> Vec<FieldError> {
        let mut problems = Vec::new();
        let mut check = |key: String, v: f64| {
            if !v.is_finite() || v < 0.0 {
                problems.push(FieldError::new(
                    format!("{prefix}.{key}"),
                    format!("must be a number of MiB of 0 or more (0: no limit), not {v}"),
                ));
            }
        };
        check("ingestion_rate_mb".into(), self.ingestion_rate_mb);
        check(
            "ingestion_burst_size_mb".into(),
            self.ingestion_burst_size_mb,
        );
        for (tenant, o) in &self.overrides {
            if let Some(v) = o.ingestion_rate_mb {
                check(format!("overrides.{tenant}.ingestion_rate_mb"), v);
            }
            if let Some(v) = o.ingestion_burst_size_mb {
                check(format!("overrides.{tenant}.ingestion_burst_size_mb"), v);
            }
        }
        problems
    }

    /// The limits of `tenant`.
    pub fn rate_of(&self, tenant: &str) -> TenantRate {
        let mut r = TenantRate {
            ingestion_rate_mb: self.ingestion_rate_mb,
            ingestion_burst_size_mb: self.ingestion_burst_size_mb,
            max_label_names_per_series: self.max_label_names_per_series,
            max_label_name_length: self.max_label_name_length,
            max_label_value_length: self.max_label_value_length,
            max_profile_size_bytes: self.max_profile_size_bytes,
            max_profile_stacktrace_samples: self.max_profile_stacktrace_samples,
            max_profile_stacktrace_depth: self.max_profile_stacktrace_depth,
            max_profile_stacktrace_sample_labels: self.max_profile_stacktrace_sample_labels,
        };
        if let Some(o) = self.overrides.get(tenant) {
            r.ingestion_rate_mb = o.ingestion_rate_mb.unwrap_or(r.ingestion_rate_mb);
            r.ingestion_burst_size_mb = o
                .ingestion_burst_size_mb
                .unwrap_or(r.ingestion_burst_size_mb);
            r.max_label_names_per_series = o
                .max_label_names_per_series
                .unwrap_or(r.max_label_names_per_series);
            r.max_label_name_length = o.max_label_name_length.unwrap_or(r.max_label_name_length);
            r.max_label_value_length = o.max_label_value_length.unwrap_or(r.max_label_value_length);
            r.max_profile_size_bytes = o.max_profile_size_bytes.unwrap_or(r.max_profile_size_bytes);
            r.max_profile_stacktrace_samples = o
                .max_profile_stacktrace_samples
                .unwrap_or(r.max_profile_stacktrace_samples);
            r.max_profile_stacktrace_depth = o
                .max_profile_stacktrace_depth
                .unwrap_or(r.max_profile_stacktrace_depth);
            r.max_profile_stacktrace_sample_labels = o
                .max_profile_stacktrace_sample_labels
                .unwrap_or(r.max_profile_stacktrace_sample_labels);
        }
        r
    }

    /// Whether any tenant is limited.
    pub fn limits_anything(&self) -> bool {
        let some = |n: Option<usize>| n.is_some_and(|n| n > 0);
        self.ingestion_rate_mb > 0.0
            || self.max_label_names_per_series > 0
            || self.max_label_name_length > 0
            || self.max_label_value_length > 0
            || self.limits_profiles()
            || self.overrides.values().any(|o| {
                o.ingestion_rate_mb.is_some_and(|r| r > 0.0)
                    || some(o.max_label_names_per_series)
                    || some(o.max_label_name_length)
                    || some(o.max_label_value_length)
            })
    }

    /// Whether any tenant's profiles are limited (size, samples, depth or
    /// sample labels): the receiver then reads each profile's shape.
    pub fn limits_profiles(&self) -> bool {
        let some = |n: Option<usize>| n.is_some_and(|n| n > 0);
        self.max_profile_size_bytes > 0
            || self.max_profile_stacktrace_samples > 0
            || self.max_profile_stacktrace_depth > 0
            || self.max_profile_stacktrace_sample_labels > 0
            || self.overrides.values().any(|o| {
                some(o.max_profile_size_bytes)
                    || some(o.max_profile_stacktrace_samples)
                    || some(o.max_profile_stacktrace_depth)
                    || some(o.max_profile_stacktrace_sample_labels)
            })
    }
}

/// A refusal: the tenant's rate and how long until the request would fit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimited {
    pub tenant: String,
    /// The tenant's rate, bytes a second.
    pub limit_bytes: u64,
    /// The request's bytes.
    pub adding: u64,
    /// When the bucket will hold `adding` (never, when it is larger than
    /// the burst: then `None`).
    pub retry_after: Option<Duration>,
}

impl RateLimited {
    /// What the client is told (Pyroscope's wording) and what to do.
    pub fn message(&self) -> String {
        let what = match self.retry_after {
            Some(_) => "retry after the time in Retry-After, or send less".to_owned(),
            None => "the request is larger than the tenant's ingestion_burst_size_mb: send smaller requests".to_owned(),
        };
        format!(
            "push rate limit ({} bytes/s) exceeded while adding {} bytes for tenant {:?}: {what}",
            self.limit_bytes, self.adding, self.tenant
        )
    }

    /// `Retry-After` in whole seconds (at least 1).
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.retry_after
            .map(|d| d.as_secs() + u64::from(d.subsec_nanos() > 0))
            .map(|s| s.max(1))
    }
}

/// A series or profile past one of a tenant's limits, refused as
/// Pyroscope refuses it (400): the Pyroscope reason and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitRefused {
    /// `max_label_names_per_series`, `label_name_too_long`,
    /// `label_value_too_long`, `profile_size_limit`, `samples_limit` or
    /// `sample_labels_limit`.
    pub reason: &'static str,
    pub message: String,
    /// The tenant whose limits refused it.
    pub tenant: String,
}

/// What the profile limits look at, read from a profile by its receiver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileShape {
    /// Its uncompressed protobuf, bytes.
    pub size: usize,
    pub samples: usize,
    /// Most location ids of one sample.
    pub deepest_stack: usize,
    pub most_sample_labels: usize,
}

/// How a profile came, for the words of a size refusal: Pyroscope's differ
/// by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileSource {
    /// A pprof body of `/ingest`.
    IngestPprof,
    /// A profile of `/push.v1.PusherService/Push`.
    Push,
    /// A profile the receiver made from another format (folded text, JFR…).
    Converted,
}

/// One tenant's profile limits (0: no limit), taken from the settings when
/// a request arrives, so a request is checked against one set of limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileLimits {
    pub tenant: String,
    pub max_size: usize,
    pub max_samples: usize,
    pub max_depth: usize,
    pub max_sample_labels: usize,
}

impl ProfileLimits {
    /// Whether any of them limits.
    pub fn any(&self) -> bool {
        self.max_size > 0
            || self.max_samples > 0
            || self.max_depth > 0
            || self.max_sample_labels > 0
    }

    /// Checks a profile (its `shape`, its series `labels`) in Pyroscope's
    /// order: size, samples, then each sample's depth and labels. `Ok(Some(depth))`:
    /// its stacks deeper than `depth` are to be truncated (the root side kept).
    pub fn check<'a>(
        &self,
        shape: &ProfileShape,
        source: ProfileSource,
        labels: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Result<Option<usize>, LimitRefused> {
        let tenant = &self.tenant;
        let refuse = |reason: &'static str, words: String| LimitRefused {
            reason,
            message: format!("{words} (tenant {tenant:?})"),
            tenant: tenant.clone(),
        };
        if self.max_size > 0 && shape.size > self.max_size {
            let words = match source {
                ProfileSource::IngestPprof => format!(
                    "decompressed size exceeds maximum allowed size of {} bytes",
                    self.max_size
                ),
                ProfileSource::Push => format!(
                    "uncompressed profile payload size exceeds limit of {}",
                    si_bytes(self.max_size)
                ),
                ProfileSource::Converted => format!(
                    "the profile with labels '{}' exceeds the size limit (max_profile_size_byte, actual: {}, limit: {})",
                    shown_labels(labels),
                    shape.size,
                    self.max_size
                ),
            };
            return Err(refuse("profile_size_limit", words));
        }
        if self.max_samples > 0 && shape.samples > self.max_samples {
            return Err(refuse(
                "samples_limit",
                format!(
                    "the profile with labels '{}' exceeds the samples count limit (max_profile_stacktrace_samples, actual: {}, limit: {})",
                    shown_labels(labels),
                    shape.samples,
                    self.max_samples
                ),
            ));
        }
        if self.max_sample_labels > 0 && shape.most_sample_labels > self.max_sample_labels {
            return Err(refuse(
                "sample_labels_limit",
                format!(
                    "the profile with labels '{}' exceeds the sample labels limit (max_profile_stacktrace_sample_labels, actual: {}, limit: {})",
                    shown_labels(labels),
                    shape.most_sample_labels,
                    self.max_sample_labels
                ),
            ));
        }
        Ok((self.max_depth > 0 && shape.deepest_stack > self.max_depth).then_some(self.max_depth))
    }
}

/// A series' labels as Pyroscope shows them in a refusal
/// (`{name="value", ...}`), at most 512 bytes of them.
fn shown_labels<'a>(labels: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let pairs: Vec<String> = labels.map(|(n, v)| format!("{n}=\"{v}\"")).collect();
    // Bounded: a refusal does not echo a megabyte of labels.
    let mut text = format!("{{{}}}", pairs.join(", "));
    if text.len() > 512 {
        let mut cut = 512;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// Bytes in SI units as Pyroscope writes them in refusals (go-humanize's
/// `Bytes`: `4.2 MB`, `15 kB`, `7 B`).
fn si_bytes(n: usize) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let mut e = 0;
    let mut scaled = n as f64;
    while scaled >= 1000.0 && e + 1 < UNITS.len() {
        scaled /= 1000.0;
        e += 1;
    }
    let value = (scaled * 10.0 + 0.5).floor() / 10.0;
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[e])
    } else {
        format!("{value:.0} {}", UNITS[e])
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Bytes it holds at `at`.
    tokens: f64,
    at: Instant,
}

/// The running limiter of one receiver.
#[derive(Debug)]
pub struct TenantLimiter {
    settings: TenantLimitsSettings,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl TenantLimiter {
    pub fn new(settings: TenantLimitsSettings) -> Self {
        TenantLimiter {
            settings,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `bytes` from `tenant`'s bucket (`None`: [`ANONYMOUS_TENANT`]),
    /// or refuses them and takes nothing.
    pub fn admit(&self, tenant: Option<&str>, bytes: usize) -> Result<(), RateLimited> {
        self.admit_at(tenant, bytes, Instant::now())
    }

    /// The profile limits of `tenant` (`None`: [`ANONYMOUS_TENANT`]).
    pub fn profile_limits(&self, tenant: Option<&str>) -> ProfileLimits {
        let tenant = tenant.filter(|t| !t.is_empty()).unwrap_or(ANONYMOUS_TENANT);
        let r = self.settings.rate_of(tenant);
        ProfileLimits {
            tenant: tenant.to_owned(),
            max_size: r.max_profile_size_bytes,
            max_samples: r.max_profile_stacktrace_samples,
            max_depth: r.max_profile_stacktrace_depth,
            max_sample_labels: r.max_profile_stacktrace_sample_labels,
        }
    }

    /// Checks a series' labels (name, value pairs, `__name__` included)
    /// against `tenant`'s label limits.
    pub fn check_labels<'a>(
        &self,
        tenant: Option<&str>,
        labels: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Result<(), LimitRefused> {
        let tenant = tenant.filter(|t| !t.is_empty()).unwrap_or(ANONYMOUS_TENANT);
        let r = self.settings.rate_of(tenant);
        let shown = || shown_labels(labels.clone());
        let count = labels.clone().count();
        if r.max_label_names_per_series > 0 && count > r.max_label_names_per_series {
            return Err(LimitRefused {
                tenant: tenant.to_owned(),
                reason: "max_label_names_per_series",
                message: format!(
                    "profile series '{}' has {count} label names; limit {} (tenant {tenant:?})",
                    shown(),
                    r.max_label_names_per_series
                ),
            });
        }
        for (name, value) in labels.clone() {
            if r.max_label_name_length > 0 && name.len() > r.max_label_name_length {
                return Err(LimitRefused {
                    tenant: tenant.to_owned(),
                    reason: "label_name_too_long",
                    message: format!(
                        "profile with labels '{}' has label name too long: '{name}' (limit {}, tenant {tenant:?})",
                        shown(),
                        r.max_label_name_length
                    ),
                });
            }
            if r.max_label_value_length > 0 && value.len() > r.max_label_value_length {
                return Err(LimitRefused {
                    tenant: tenant.to_owned(),
                    reason: "label_value_too_long",
                    message: format!(
                        "profile with labels '{}' has label value too long: '{value}' (limit {}, tenant {tenant:?})",
                        shown(),
                        r.max_label_value_length
                    ),
                });
            }
        }
        Ok(())
    }

    fn admit_at(
        &self,
        tenant: Option<&str>,
        bytes: usize,
        now: Instant,
    ) -> Result<(), RateLimited> {
        let tenant = tenant.filter(|t| !t.is_empty()).unwrap_or(ANONYMOUS_TENANT);
        let rate = self.settings.rate_of(tenant);
        if rate.ingestion_rate_mb <= 0.0 {
            return Ok(());
        }
        let per_second = rate.ingestion_rate_mb * MIB;
        let burst = rate.ingestion_burst_size_mb * MIB;
        let adding = bytes as f64;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if !buckets.contains_key(tenant) && buckets.len() >= MAX_TENANTS {
            // The longest unused bucket has refilled the most.
            if let Some(oldest) = buckets
                .iter()
                .min_by_key(|(_, b)| b.at)
                .map(|(t, _)| t.clone())
            {
                buckets.remove(&oldest);
            }
        }
        let bucket = buckets.entry(tenant.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * per_second).min(burst);
        bucket.at = now;
        if adding <= bucket.tokens {
            bucket.tokens -= adding;
            return Ok(());
        }
        let retry_after = (adding <= burst)
            .then(|| Duration::from_secs_f64((adding - bucket.tokens) / per_second));
        Err(RateLimited {
            tenant: tenant.to_owned(),
            limit_bytes: per_second as u64,
            adding: bytes as u64,
            retry_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(yaml: &str) -> TenantLimitsSettings {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_bucket_refills_at_the_rate_up_to_the_burst() {
        let s = settings(
            "ingestion_rate_mb: 1\ningestion_burst_size_mb: 2\noverrides:\n  noisy: {ingestion_rate_mb: 0.5}\n",
        );
        assert!(s.problems("limits").is_empty());
        assert_eq!(s.rate_of("noisy").ingestion_burst_size_mb, 2.0);
        let l = TenantLimiter::new(s);
        let t0 = Instant::now();
        let mib = 1 << 20;
        // The burst at once, then nothing more.
        assert!(l.admit_at(Some("a"), 2 * mib, t0).is_ok());
        let refused = l.admit_at(Some("a"), mib, t0).unwrap_err();
        assert_eq!(refused.retry_after_seconds(), Some(1));
        assert_eq!(refused.limit_bytes, mib as u64);
        // A second later one MiB is back; the refusal took nothing.
        assert!(
            l.admit_at(Some("a"), mib, t0 + Duration::from_secs(1))
                .is_ok()
        );
        // Another tenant has its own bucket; the override's rate is its own.
        assert!(l.admit_at(Some("noisy"), 2 * mib, t0).is_ok());
        let r = l.admit_at(Some("noisy"), mib, t0).unwrap_err();
        assert_eq!(r.retry_after_seconds(), Some(2));
        // Larger than the burst: never.
        assert_eq!(
            l.admit_at(Some("b"), 3 * mib, t0).unwrap_err().retry_after,
            None
        );
        // No tenant is `anonymous`, limited like any other.
        assert!(l.admit_at(None, 2 * mib, t0).is_ok());
        assert!(l.admit_at(Some(""), 1, t0).is_err());
    }

    #[test]
    fn label_limits_as_pyroscope_words_them() {
        let s = settings(
            "max_label_names_per_series: 3\nmax_label_name_length: 8\nmax_label_value_length: 5\n\
             overrides:\n  roomy: {max_label_names_per_series: 10, max_label_value_length: 0}\n",
        );
        assert!(s.limits_anything());
        let l = TenantLimiter::new(s);
        let ok = [("__name__", "cpu"), ("a", "1")];
        assert!(l.check_labels(Some("t"), ok.iter().copied()).is_ok());
        let many = [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")];
        let e = l.check_labels(Some("t"), many.iter().copied()).unwrap_err();
        assert_eq!(e.reason, "max_label_names_per_series");
        assert!(
            e.message.contains("has 4 label names; limit 3"),
            "{}",
            e.message
        );
        assert!(l.check_labels(Some("roomy"), many.iter().copied()).is_ok());
        let long_name = [("a_long_name", "1")];
        let e = l.check_labels(None, long_name.iter().copied()).unwrap_err();
        assert_eq!(e.reason, "label_name_too_long");
        assert!(e.message.contains("has label name too long: 'a_long_name'"));
        let long_value = [("a", "123456")];
        let e = l
            .check_labels(Some("t"), long_value.iter().copied())
            .unwrap_err();
        assert_eq!(e.reason, "label_value_too_long");
        assert!(
            l.check_labels(Some("roomy"), long_value.iter().copied())
                .is_ok()
        );
    }

    #[test]
    fn profile_limits_in_pyroscopes_order_and_words() {
        let s = settings(
            "max_profile_size_bytes: 4194304\nmax_profile_stacktrace_samples: 16000\n\
             max_profile_stacktrace_depth: 1000\nmax_profile_stacktrace_sample_labels: 100\n\
             overrides:\n  deep: {max_profile_stacktrace_depth: 0, max_profile_size_bytes: 0}\n",
        );
        assert!(s.limits_profiles() && s.limits_anything());
        assert!(!TenantLimitsSettings::default().limits_profiles());
        let l = TenantLimiter::new(s);
        let limits = l.profile_limits(Some("t"));
        assert!(limits.any());
        let labels = [("__name__", "process_cpu"), ("service_name", "a")];
        let within = ProfileShape {
            size: 4194304,
            samples: 16000,
            deepest_stack: 1000,
            most_sample_labels: 100,
        };
        let check =
            |shape: ProfileShape, source| limits.check(&shape, source, labels.iter().copied());
        assert_eq!(check(within, ProfileSource::Push), Ok(None));
        // Size first, in the words of each path.
        let big = ProfileShape {
            size: 4194305,
            samples: 16001,
            ..within
        };
        let e = check(big, ProfileSource::Push).unwrap_err();
        assert_eq!(e.reason, "profile_size_limit");
        assert!(
            e.message
                .starts_with("uncompressed profile payload size exceeds limit of 4.2 MB"),
            "{}",
            e.message
        );
        let e = check(big, ProfileSource::IngestPprof).unwrap_err();
        assert!(
            e.message
                .starts_with("decompressed size exceeds maximum allowed size of 4194304 bytes"),
            "{}",
            e.message
        );
        let e = check(big, ProfileSource::Converted).unwrap_err();
        assert!(
            e.message.contains(
                "exceeds the size limit (max_profile_size_byte, actual: 4194305, limit: 4194304)"
            ),
            "{}",
            e.message
        );
        // Then samples.
        let e = check(
            ProfileShape {
                samples: 16001,
                ..within
            },
            ProfileSource::Push,
        )
        .unwrap_err();
        assert_eq!(e.reason, "samples_limit");
        assert_eq!(
            e.message,
            "the profile with labels '{__name__=\"process_cpu\", service_name=\"a\"}' exceeds the samples count limit (max_profile_stacktrace_samples, actual: 16001, limit: 16000) (tenant \"t\")"
        );
        let e = check(
            ProfileShape {
                most_sample_labels: 101,
                ..within
            },
            ProfileSource::Push,
        )
        .unwrap_err();
        assert_eq!(e.reason, "sample_labels_limit");
        // A deep stack is truncated, never refused.
        let deep = ProfileShape {
            deepest_stack: 1001,
            ..within
        };
        assert_eq!(check(deep, ProfileSource::Push), Ok(Some(1000)));
        let roomy = l.profile_limits(Some("deep"));
        assert_eq!(
            roomy.check(
                &ProfileShape {
                    size: usize::MAX,
                    ..deep
                },
                ProfileSource::Push,
                labels.iter().copied()
            ),
            Ok(None)
        );
        assert_eq!(roomy.tenant, "deep");
        assert_eq!(l.profile_limits(None).tenant, ANONYMOUS_TENANT);
    }

    #[test]
    fn sizes_in_si_units_as_go_humanize_writes_them() {
        for (n, text) in [
            (7, "7 B"),
            (999, "999 B"),
            (1500, "1.5 kB"),
            (15_000, "15 kB"),
            (4_194_304, "4.2 MB"),
            (9_960_000, "10 MB"),
            (1 << 30, "1.1 GB"),
        ] {
            assert_eq!(si_bytes(n), text, "{n}");
        }
    }

    #[test]
    fn no_rate_is_no_limit_and_bad_numbers_are_named() {
        let l = TenantLimiter::new(TenantLimitsSettings::default());
        assert!(l.admit(Some("a"), usize::MAX).is_ok());
        let s =
            settings("ingestion_rate_mb: -1\noverrides:\n  x: {ingestion_burst_size_mb: .nan}\n");
        let problems = s.problems("limits");
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert_eq!(
            problems[1].path,
            "limits.overrides.x.ingestion_burst_size_mb"
        );
        assert!(serde_saphyr::from_str::<TenantLimitsSettings>("rate: 1\n").is_err());
    }
}
