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

mod profile;
mod series;

use profile::shown_labels;
pub use profile::{ProfileLimits, ProfileShape, ProfileSource};
pub use series::{ACTIVE_SERIES_WINDOW, MAX_REMEMBERED_SERIES, series_hash};

pub use proflow_model::model::ANONYMOUS_TENANT;

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
    pub max_local_series_per_tenant: usize,
    pub max_global_series_per_tenant: usize,
}

fn default_burst_mb() -> Mib {
    Mib(2.0)
}

/// A number of MiB (Pyroscope's "MB"), equal to another when its bits are
/// (so the settings are `Eq`, for the reload's comparison of configs).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(transparent)]
pub struct Mib(pub f64);

impl PartialEq for Mib {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Mib {}

/// `limits` of a receiver: the defaults of every tenant and `overrides`
/// per tenant.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsSettings {
    /// MiB a second a tenant's requests may bring on average (0, the
    /// default here: no limit; Pyroscope's default is 4).
    #[serde(default)]
    pub ingestion_rate_mb: Mib,
    /// MiB a tenant may bring at once above the rate (the bucket's size; a
    /// request larger than this is always refused). Pyroscope's default, 2.
    #[serde(default = "default_burst_mb")]
    pub ingestion_burst_size_mb: Mib,
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
    /// Most active series of a tenant (seen in the last 10 minutes, as
    /// Pyroscope's ingesters count them) at this receiver: a request that
    /// would add more is refused (429). The smaller of this and
    /// `max_global_series_per_tenant` that is not 0 holds (0: no limit;
    /// Pyroscope's, 0).
    #[serde(default)]
    pub max_local_series_per_tenant: usize,
    /// As `max_local_series_per_tenant` (0: no limit; Pyroscope's, 5000,
    /// spread over its ingesters).
    #[serde(default)]
    pub max_global_series_per_tenant: usize,
    /// Per tenant, limits that replace the defaults (each key given
    /// replaces that one; a key left out is the default's).
    #[serde(default)]
    pub overrides: BTreeMap<String, TenantOverride>,
}

impl Default for TenantLimitsSettings {
    fn default() -> Self {
        TenantLimitsSettings {
            ingestion_rate_mb: Mib(0.0),
            ingestion_burst_size_mb: default_burst_mb(),
            max_label_names_per_series: 0,
            max_label_name_length: 0,
            max_label_value_length: 0,
            max_profile_size_bytes: 0,
            max_profile_stacktrace_samples: 0,
            max_profile_stacktrace_depth: 0,
            max_profile_stacktrace_sample_labels: 0,
            max_local_series_per_tenant: 0,
            max_global_series_per_tenant: 0,
            overrides: BTreeMap::new(),
        }
    }
}

/// One tenant's override: the keys it sets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantOverride {
    pub ingestion_rate_mb: Option<Mib>,
    pub ingestion_burst_size_mb: Option<Mib>,
    pub max_label_names_per_series: Option<usize>,
    pub max_label_name_length: Option<usize>,
    pub max_label_value_length: Option<usize>,
    pub max_profile_size_bytes: Option<usize>,
    pub max_profile_stacktrace_samples: Option<usize>,
    pub max_profile_stacktrace_depth: Option<usize>,
    pub max_profile_stacktrace_sample_labels: Option<usize>,
    pub max_local_series_per_tenant: Option<usize>,
    pub max_global_series_per_tenant: Option<usize>,
}

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
        check("ingestion_rate_mb".into(), self.ingestion_rate_mb.0);
        check(
            "ingestion_burst_size_mb".into(),
            self.ingestion_burst_size_mb.0,
        );
        for (tenant, o) in &self.overrides {
            if let Some(v) = o.ingestion_rate_mb {
                check(format!("overrides.{tenant}.ingestion_rate_mb"), v.0);
            }
            if let Some(v) = o.ingestion_burst_size_mb {
                check(format!("overrides.{tenant}.ingestion_burst_size_mb"), v.0);
            }
        }
        problems
    }

    /// The limits of `tenant`.
    pub fn rate_of(&self, tenant: &str) -> TenantRate {
        let mut r = TenantRate {
            ingestion_rate_mb: self.ingestion_rate_mb.0,
            ingestion_burst_size_mb: self.ingestion_burst_size_mb.0,
            max_label_names_per_series: self.max_label_names_per_series,
            max_label_name_length: self.max_label_name_length,
            max_label_value_length: self.max_label_value_length,
            max_profile_size_bytes: self.max_profile_size_bytes,
            max_profile_stacktrace_samples: self.max_profile_stacktrace_samples,
            max_profile_stacktrace_depth: self.max_profile_stacktrace_depth,
            max_profile_stacktrace_sample_labels: self.max_profile_stacktrace_sample_labels,
            max_local_series_per_tenant: self.max_local_series_per_tenant,
            max_global_series_per_tenant: self.max_global_series_per_tenant,
        };
        if let Some(o) = self.overrides.get(tenant) {
            r.ingestion_rate_mb = o.ingestion_rate_mb.map_or(r.ingestion_rate_mb, |m| m.0);
            r.ingestion_burst_size_mb = o
                .ingestion_burst_size_mb
                .map_or(r.ingestion_burst_size_mb, |m| m.0);
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
            r.max_local_series_per_tenant = o
                .max_local_series_per_tenant
                .unwrap_or(r.max_local_series_per_tenant);
            r.max_global_series_per_tenant = o
                .max_global_series_per_tenant
                .unwrap_or(r.max_global_series_per_tenant);
        }
        r
    }

    /// Whether any tenant is limited.
    pub fn limits_anything(&self) -> bool {
        let some = |n: Option<usize>| n.is_some_and(|n| n > 0);
        self.ingestion_rate_mb.0 > 0.0
            || self.max_label_names_per_series > 0
            || self.max_label_name_length > 0
            || self.max_label_value_length > 0
            || self.limits_profiles()
            || self.max_local_series_per_tenant > 0
            || self.max_global_series_per_tenant > 0
            || self.overrides.values().any(|o| {
                some(o.max_local_series_per_tenant) || some(o.max_global_series_per_tenant)
            })
            || self.overrides.values().any(|o| {
                o.ingestion_rate_mb.is_some_and(|r| r.0 > 0.0)
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

/// A profile's series labels as (name, value) pairs.
fn pairs(e: &proflow_model::model::Envelope) -> impl Iterator<Item = (&str, &str)> + Clone {
    e.labels.iter().map(|l| (l.name.as_str(), l.value.as_str()))
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
/// Pyroscope refuses it (400, or 429 when `exhausted`): the Pyroscope
/// reason and its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitRefused {
    /// `max_label_names_per_series`, `label_name_too_long`,
    /// `label_value_too_long`, `profile_size_limit`, `samples_limit`,
    /// `sample_labels_limit` or `series_limit`.
    pub reason: &'static str,
    pub message: String,
    /// The tenant whose limits refused it.
    pub tenant: String,
    /// A quota the tenant has spent for now (`series_limit`: 429, gRPC
    /// `RESOURCE_EXHAUSTED`), not a fault of the request (400).
    pub exhausted: bool,
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
    series: Mutex<series::ActiveSeries>,
}

impl TenantLimiter {
    pub fn new(settings: TenantLimitsSettings) -> Self {
        TenantLimiter {
            settings,
            buckets: Mutex::new(HashMap::new()),
            series: Mutex::default(),
        }
    }

    /// Takes `bytes` from `tenant`'s bucket (`None`: [`ANONYMOUS_TENANT`]),
    /// or refuses them and takes nothing.
    pub fn admit(&self, tenant: Option<&str>, bytes: usize) -> Result<(), RateLimited> {
        self.admit_at(tenant, bytes, Instant::now())
    }

    /// Checks the series of a request's profiles against `tenant`'s label
    /// limits (400) and, when it has one, admits them under its active
    /// series limit (429), or refuses the request and adds none.
    pub fn check_series(
        &self,
        tenant: Option<&str>,
        profiles: &[proflow_model::model::Envelope],
    ) -> Result<(), LimitRefused> {
        for e in profiles {
            self.check_labels(tenant, pairs(e))?;
        }
        let tenant = tenant.filter(|t| !t.is_empty()).unwrap_or(ANONYMOUS_TENANT);
        let r = self.settings.rate_of(tenant);
        let limit = match (
            r.max_local_series_per_tenant,
            r.max_global_series_per_tenant,
        ) {
            (0, g) => g,
            (l, 0) => l,
            (l, g) => l.min(g),
        };
        if limit == 0 {
            return Ok(());
        }
        let series: Vec<u64> = profiles.iter().map(|e| series_hash(pairs(e))).collect();
        self.series.lock().unwrap_or_else(|p| p.into_inner()).admit(
            tenant,
            limit,
            &series,
            Instant::now(),
        )
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
                exhausted: false,
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
                    exhausted: false,
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
                    exhausted: false,
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
mod tests;
