//! The `aggregate` processor against the real Pyroscope: the profiles of
//! each series pushed within a window reach Pyroscope as one profile, and
//! every total Pyroscope reads back is the one it reads for the same pushes
//! sent without aggregation (and the one pushed). A collector stopped with
//! windows open sends them before it exits. In multi-tenant mode, each
//! tenant's profiles are merged apart and read back under that tenant.

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::time::Duration;

use common::{Proflow, Totals};

const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const FUNCTIONS: [&str; 3] = ["main", "work", "idle"];
/// Series pushed, and profiles per series.
const SERIES: i64 = 8;
const PROFILES: i64 = 5;
/// What a folded sample counts as CPU time: 10 ms, at the 100 Hz a folded
/// push is taken to be sampled at.
const NS_PER_SAMPLE: i64 = 10_000_000;

/// proflow: `pprof_push` → (`aggregate` with `window`, when given) →
/// `pyroscope`.
fn start(pyroscope: &str, window: Option<&str>) -> Proflow {
    let (processors, listed) = match window {
        Some(w) => (
            format!("processors:\n  aggregate:\n    window: {w}\n"),
            "      processors: [aggregate]\n",
        ),
        None => (String::new(), ""),
    };
    Proflow::start(|ports, _| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n{processors}\
             exporters:\n  pyroscope:\n    endpoint: {pyroscope}\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      \
             receivers: [pprof_push]\n{listed}      exporters: [pyroscope]\n",
            ports.receiver, ports.telemetry
        )
    })
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// Pushes profile `i` of series `app`: `main;work` and `main;idle` with
/// values that differ per series and per profile, each profile in a second
/// of its own (Pyroscope keeps one profile per series and millisecond).
/// Returns what it pushed per function.
fn push(proflow: &Proflow, app: &str, s: i64, i: i64, base_secs: u64) -> Totals {
    push_as(proflow, app, s, i, base_secs, &[])
}

/// [`push`] with request headers (`X-Scope-OrgID`).
fn push_as(
    proflow: &Proflow,
    app: &str,
    s: i64,
    i: i64,
    base_secs: u64,
    headers: &[(&str, &str)],
) -> Totals {
    let (work, idle) = (100 * (s + 1) + i, 7 + i);
    let from = base_secs + i as u64;
    proflow
        .post(
            &format!(
                "/ingest?name={app}.cpu&from={from}&until={}&format=folded",
                from + 1
            ),
            headers,
            format!("main;work {work}\nmain;idle {idle}\n").into_bytes(),
        )
        .expect_status(200, "a folded push");
    [
        ("main".to_owned(), (work + idle) * NS_PER_SAMPLE),
        ("work".to_owned(), work * NS_PER_SAMPLE),
        ("idle".to_owned(), idle * NS_PER_SAMPLE),
    ]
    .into()
}

fn add(into: &mut Totals, more: Totals) {
    for (f, v) in more {
        *into.entry(f).or_default() += v;
    }
}

/// Pyroscope's totals for `app`, once they are `want`.
fn read_back(base: &str, app: &str, want: &Totals) -> Totals {
    read_back_with(&common::http_client(), base, app, want)
}

/// [`read_back`] with a client of one's own (a tenant's).
fn read_back_with(
    http: &reqwest::blocking::Client,
    base: &str,
    app: &str,
    want: &Totals,
) -> Totals {
    let selector = format!("{{service_name=\"{app}\"}}");
    let (ok, got, answer) = readback::pyroscope_wait(
        http,
        base,
        (&selector, &FUNCTIONS, CPU),
        READ_BACK_TIMEOUT,
        |t| t == want,
    );
    assert!(
        ok,
        "{app}: Pyroscope read {got:?}, pushed {want:?} ({answer})"
    );
    got
}

fn sent(proflow: &Proflow) -> f64 {
    common::metric_sum(
        &proflow.metrics(),
        "proflow_exporter_sent_profiles_total",
        &[("exporter", "pyroscope")],
    )
}

#[test]
fn each_series_reaches_pyroscope_once_per_window_with_the_same_totals() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let base = pyroscope.http_base();
    let merged = start(&base, Some("3s"));
    let plain = start(&base, None);
    let run = common::unique_name("aggregate");
    let base_secs = now_secs() - 60;
    let mut pushed = Vec::new();
    for s in 0..SERIES {
        let mut want = Totals::new();
        for i in 0..PROFILES {
            add(
                &mut want,
                push(&merged, &format!("{run}-m{s}"), s, i, base_secs),
            );
            push(&plain, &format!("{run}-p{s}"), s, i, base_secs);
        }
        pushed.push(want);
    }
    for (s, want) in pushed.iter().enumerate() {
        let through_aggregate = read_back(&base, &format!("{run}-m{s}"), want);
        let without = read_back(&base, &format!("{run}-p{s}"), want);
        assert_eq!(through_aggregate, without);
    }
    // One write per series through `aggregate`, one per push without.
    assert_eq!(sent(&merged), SERIES as f64, "{}", merged.metrics());
    assert_eq!(sent(&plain), (SERIES * PROFILES) as f64);
    let received = common::metric_sum(
        &merged.metrics(),
        "proflow_processor_received_profiles_total",
        &[("processor", "aggregate")],
    );
    assert_eq!(received, (SERIES * PROFILES) as f64);
}

#[test]
fn a_stopped_collector_sends_its_open_windows_before_it_exits() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let base = pyroscope.http_base();
    let mut proflow = start(&base, Some("10m"));
    let app = common::unique_name("aggregate-stop");
    let base_secs = now_secs() - 60;
    let mut want = Totals::new();
    for i in 0..PROFILES {
        add(&mut want, push(&proflow, &app, 0, i, base_secs));
    }
    // Held in the open window: nothing sent yet.
    assert_eq!(sent(&proflow), 0.0);
    assert_eq!(proflow.terminate(Duration::from_secs(30)), Some(0));
    let log = proflow.log_text();
    assert!(!log.contains("could not be queued"), "{log}");
    read_back(&base, &app, &want);
}

/// Against the real Pyroscope in multi-tenant mode: profiles of one series
/// name from two tenants are merged apart, and each tenant reads back only
/// its own, with the totals it pushed.
#[test]
fn tenants_are_merged_apart_and_each_reads_back_its_own() {
    let Some(pyroscope) =
        peer_env::PrivatePeer::start_with("pyroscope", &[("PROFLOW_PYROSCOPE_MULTITENANT", "1")])
    else {
        return;
    };
    let base = pyroscope.http_base();
    let proflow = start(&base, Some("2s"));
    let app = common::unique_name("aggregate-tenants");
    let base_secs = now_secs() - 60;
    let (mut red, mut blue) = (Totals::new(), Totals::new());
    for i in 0..PROFILES {
        add(
            &mut red,
            push_as(&proflow, &app, 0, i, base_secs, &[("X-Scope-OrgID", "red")]),
        );
        if i < 2 {
            add(
                &mut blue,
                push_as(
                    &proflow,
                    &app,
                    1,
                    i,
                    base_secs,
                    &[("X-Scope-OrgID", "blue")],
                ),
            );
        }
    }
    read_back_with(&readback::tenant_reader("red"), &base, &app, &red);
    read_back_with(&readback::tenant_reader("blue"), &base, &app, &blue);
    // One write per tenant's series.
    assert_eq!(sent(&proflow), 2.0, "{}", proflow.metrics());
}
