//! What `/targets` shows of each target: health, last scrape, its duration,
//! the last error and counts; and the rule that logs a target's failures
//! once per change of state instead of once per scrape.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proflow_core::telemetry::rfc3339;
use proflow_model::model::Labels;
use serde_json::{Map, Value, json};

use super::targets::{Dropped, Target};
use super::telemetry::HealthGauge;

/// A target's health, as Prometheus names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Unknown,
    Up,
    Down,
}

impl Health {
    fn as_str(self) -> &'static str {
        match self {
            Health::Unknown => "unknown",
            Health::Up => "up",
            Health::Down => "down",
        }
    }
}

#[derive(Debug)]
struct State {
    health: Health,
    last_scrape: Option<SystemTime>,
    last_duration: Duration,
    last_error: String,
    /// Reason word of the last error: a change of it is logged again.
    last_reason: &'static str,
    scrapes: u64,
    failures: u64,
}

/// One active target and what became of its scrapes.
#[derive(Debug)]
pub struct TargetStatus {
    pub target: Target,
    pub job: String,
    pub interval: Duration,
    pub timeout: Duration,
    state: Mutex<State>,
    /// Counts the job's targets by health, this one included while it runs.
    health_gauge: Option<HealthGauge>,
}

/// What the caller should log after recording a scrape.
#[derive(Debug, PartialEq, Eq)]
pub enum Transition {
    /// Nothing changed worth a line.
    Same,
    /// The target failed, for the first time or for a new reason.
    Failing,
    /// The target answers again after failing.
    Recovered,
}

impl TargetStatus {
    pub fn new(target: Target, job: &str, interval: Duration, timeout: Duration) -> Self {
        TargetStatus {
            target,
            job: job.to_owned(),
            interval,
            timeout,
            state: Mutex::new(State {
                health: Health::Unknown,
                last_scrape: None,
                last_duration: Duration::ZERO,
                last_error: String::new(),
                last_reason: "",
                scrapes: 0,
                failures: 0,
            }),
            health_gauge: None,
        }
    }

    /// Counted in `gauge` (as `unknown` until its first scrape) until it
    /// is dropped.
    pub fn counted_in(mut self, gauge: HealthGauge) -> Self {
        gauge.count(Health::Unknown.as_str(), true);
        self.health_gauge = Some(gauge);
        self
    }

    fn health_moved(&self, was: Health, now: Health) {
        if let (Some(g), true) = (&self.health_gauge, was != now) {
            g.count(was.as_str(), false);
            g.count(now.as_str(), true);
        }
    }

    /// Records a scrape that started at `at` and took `took`: `Ok` or the
    /// failure's reason word and message.
    pub fn record(
        &self,
        at: SystemTime,
        took: Duration,
        result: Result<(), (&'static str, String)>,
    ) -> Transition {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.last_scrape = Some(at);
        s.last_duration = took;
        s.scrapes += 1;
        let was = s.health;
        let now = if result.is_ok() {
            Health::Up
        } else {
            Health::Down
        };
        self.health_moved(was, now);
        match result {
            Ok(()) => {
                s.health = Health::Up;
                s.last_error.clear();
                s.last_reason = "";
                if was == Health::Down {
                    Transition::Recovered
                } else {
                    Transition::Same
                }
            }
            Err((reason, message)) => {
                s.failures += 1;
                s.health = Health::Down;
                s.last_error = message;
                let changed = was != Health::Down || s.last_reason != reason;
                s.last_reason = reason;
                if changed {
                    Transition::Failing
                } else {
                    Transition::Same
                }
            }
        }
    }

    /// The target as `/targets` shows it (Prometheus's field names, plus
    /// `profile`, `scrapes` and `failures`).
    pub fn to_json(&self) -> Value {
        let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        json!({
            "scrapePool": self.job,
            "scrapeUrl": self.target.shown_url(),
            "profile": self.target.profile.name,
            "labels": labels_json(&self.target.labels),
            "discoveredLabels": labels_json(&self.target.discovered),
            "health": s.health.as_str(),
            "lastError": s.last_error,
            "lastScrape": s.last_scrape.map(|t| rfc3339(unix_secs(t))),
            "lastScrapeDuration": s.last_duration.as_secs_f64(),
            "scrapeInterval": format!("{}s", self.interval.as_secs()),
            "scrapeTimeout": format!("{}s", self.timeout.as_secs()),
            "scrapes": s.scrapes,
            "failures": s.failures,
        })
    }

    #[cfg(test)]
    pub fn health(&self) -> Health {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .health
    }
}

impl Drop for TargetStatus {
    fn drop(&mut self) {
        if let Some(g) = &self.health_gauge {
            let s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            g.count(s.health.as_str(), false);
        }
    }
}

/// A dropped target as `/targets` shows it.
pub fn dropped_json(job: &str, d: &Dropped) -> Value {
    let mut v = json!({
        "scrapePool": job,
        "discoveredLabels": labels_json(&d.discovered),
    });
    if let (Some(reason), Some(o)) = (&d.reason, v.as_object_mut()) {
        o.insert("reason".to_owned(), reason.clone().into());
    }
    v
}

/// Labels as `/targets` shows them: a password in `__address__` and the
/// values of `__param_*` (the job's `params`, which may carry a token)
/// redacted.
fn labels_json(labels: &Labels) -> Value {
    let mut m = Map::new();
    for l in labels.iter() {
        let value = if l.name == "__address__" {
            proflow_net::url::redact_userinfo(&l.value)
        } else if l.name.starts_with("__param_") && l.name != "__param_seconds" {
            proflow_net::url::SECRET.to_owned()
        } else {
            l.value.clone()
        };
        m.insert(l.name.clone(), Value::String(value));
    }
    Value::Object(m)
}

fn unix_secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::config::ProfileTarget;
    use std::sync::Arc;

    fn status() -> TargetStatus {
        TargetStatus::new(
            Target {
                key: 1,
                url: "http://h:1/debug/pprof/allocs".parse().expect("url"),
                labels: Labels::from_pairs([("job", "j")]),
                discovered: Labels::from_pairs([("__address__", "h:1")]),
                profile: Arc::new(ProfileTarget {
                    name: "memory".into(),
                    profile_name: "memory".into(),
                    path: "/debug/pprof/allocs".into(),
                    seconds: false,
                    cumulative: true,
                }),
            },
            "j",
            Duration::from_secs(15),
            Duration::from_secs(10),
        )
    }

    #[test]
    fn failures_are_logged_once_per_change_of_state() {
        let s = status();
        let now = SystemTime::now();
        let d = Duration::from_millis(5);
        assert_eq!(s.record(now, d, Ok(())), Transition::Same);
        let refused = || Err(("connection", "connection refused".to_owned()));
        assert_eq!(s.record(now, d, refused()), Transition::Failing);
        assert_eq!(s.record(now, d, refused()), Transition::Same);
        assert_eq!(
            s.record(now, d, Err(("http_status", "HTTP 404".into()))),
            Transition::Failing
        );
        assert_eq!(s.health(), Health::Down);
        assert_eq!(s.record(now, d, Ok(())), Transition::Recovered);
        let j = s.to_json();
        assert_eq!(j["health"], "up");
        assert_eq!(j["failures"], 3);
        assert_eq!(j["scrapes"], 5);
        assert_eq!(j["lastError"], "");
        assert_eq!(j["labels"]["job"], "j");
        assert_eq!(j["discoveredLabels"]["__address__"], "h:1");
    }

    #[test]
    fn the_health_gauge_follows_each_target_until_it_stops() {
        let t = proflow_core::telemetry::Telemetry::new();
        let gauge = crate::scrape::telemetry::ScrapeTelemetry::new(&t, "scrape").health_gauge("j");
        let value = |health: &str| {
            let text = t.render();
            let line = format!(
                "proflow_scrape_targets_health{{receiver=\"scrape\",scrape_job=\"j\",health=\"{health}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(line.as_str()))
                .map(|v| v.parse::<i64>().expect("a number"))
        };
        let (a, b) = (
            status().counted_in(gauge.clone()),
            status().counted_in(gauge),
        );
        assert_eq!(value("unknown"), Some(2));
        let (now, d) = (SystemTime::now(), Duration::from_millis(5));
        a.record(now, d, Ok(()));
        b.record(now, d, Err(("connection", "refused".to_owned())));
        b.record(now, d, Err(("connection", "refused".to_owned())));
        assert_eq!(
            (value("unknown"), value("up"), value("down")),
            (Some(0), Some(1), Some(1))
        );
        drop(b);
        assert_eq!(value("down"), Some(0));
        drop(a);
        assert_eq!(value("up"), Some(0));
    }
}
