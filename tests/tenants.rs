//! Tenants at the edge, against a real Pyroscope in multi-tenant mode
//! (`-auth.multitenancy-enabled=true`, a private instance): a profile's
//! tenant comes from the `__tenant_id__` label that relabelling sets (here
//! from a `team` tag), else from the sender's `X-Scope-OrgID`; a tenant a
//! bearer token is bound to is never changed by a label. Each profile is
//! read back from Pyroscope under its own tenant only, and the `file`
//! exporter's index names the same tenant.

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::time::Duration;

use common::Proflow;

const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const FUNCTIONS: [&str; 2] = ["main", "work"];

/// A private multi-tenant Pyroscope, or `None` when it cannot be had and
/// skipping is allowed.
fn multitenant_pyroscope() -> Option<peer_env::PrivatePeer> {
    peer_env::PrivatePeer::start_with("pyroscope", &[("PROFLOW_PYROSCOPE_MULTITENANT", "1")])
}

/// The `limits` of [`a_noisy_tenant_is_refused_at_the_edge_and_a_quiet_one_is_not`]:
/// 10 MiB/s for every tenant, 10 KiB/s (20 KiB at once) for `noisy`.
const LIMITS: &str = "    limits:\n      ingestion_rate_mb: 10\n      overrides:\n        \
                      noisy: {ingestion_rate_mb: 0.009765625, ingestion_burst_size_mb: 0.01953125}\n";

/// proflow: `pprof_push` (with `auth`, when given), a `relabel` processor
/// that sets `__tenant_id__` from `team`, and the `file` and `pyroscope`
/// exporters. The `pyroscope` exporter's queue holds 10,000 profiles: the
/// series test pushes 1,000 series a request, and a Pyroscope slowed by the
/// tests beside it must not make the default 1,000-profile `drop_newest`
/// queue drop one of them (the `file` exporter takes it, so it is answered
/// 200 either way).
fn start(pyroscope: &str, auth: &str) -> Proflow {
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n{auth}\
             processors:\n  relabel:\n    relabel_configs:\n\
             \x20     - {{source_labels: [team], regex: '(.+)', target_label: __tenant_id__}}\n\
             exporters:\n  file:\n    directory: {}\n  pyroscope:\n    endpoint: {pyroscope}\n    \
             sending_queue: {{queue_size: 10000}}\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      \
             receivers: [pprof_push]\n      processors: [relabel]\n      exporters: [file, pyroscope]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    })
}

/// Pushes `main;work <n>` as `app` (with `tags`, e.g. `{team=alpha}`).
fn push(proflow: &Proflow, app: &str, tags: &str, n: u32, headers: &[(&str, &str)]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    proflow
        .post(
            &format!(
                "/ingest?name={app}.cpu{tags}&from={}&until={now}&format=folded",
                now - 10
            ),
            headers,
            format!("main;work {n}\n").into_bytes(),
        )
        .expect_status(200, "a folded push");
}

/// What Pyroscope holds of `app` for `tenant`: waits until it is `want`
/// (`None`: waits a while and checks it holds nothing).
fn read_back(base: &str, tenant: &str, app: &str, want: Option<i64>) -> common::Totals {
    let http = readback::tenant_reader(tenant);
    let selector = format!("{{service_name=\"{app}\"}}");
    let expected: common::Totals = want
        .map(|v| FUNCTIONS.iter().map(|f| ((*f).to_owned(), v)).collect())
        .unwrap_or_default();
    let (ok, got, answer) = readback::pyroscope_wait(
        &http,
        base,
        (&selector, &FUNCTIONS, CPU),
        if want.is_some() {
            READ_BACK_TIMEOUT
        } else {
            Duration::from_secs(3)
        },
        |t| want.is_some() && *t == expected,
    );
    if want.is_some() {
        assert!(
            ok,
            "tenant {tenant} should hold {app} with {expected:?}; Pyroscope read {got:?} ({answer})"
        );
    } else {
        assert!(
            got.is_empty(),
            "tenant {tenant} should hold nothing of {app}; it holds {got:?}"
        );
    }
    got
}

/// The tenant the file exporter's index names for `app`'s profiles.
fn filed_tenants(proflow: &Proflow, app: &str) -> Vec<Option<String>> {
    let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app));
    entries
        .iter()
        .map(|e| e.raw["tenant"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_label_set_by_relabelling_names_the_tenant() {
    let Some(pyroscope) = multitenant_pyroscope() else {
        return;
    };
    let base = pyroscope.http_base();
    let proflow = start(&base, "");
    let alpha = common::unique_name("tenant-alpha-app");
    let beta = common::unique_name("tenant-beta-app");
    let plain = common::unique_name("tenant-header-app");
    // The label wins over the header the sender sent; without the label,
    // the header names the tenant.
    let claim = [("X-Scope-OrgID", "sender-claim")];
    push(&proflow, &alpha, "{team=alpha}", 3, &claim);
    push(&proflow, &beta, "{team=beta}", 5, &claim);
    push(&proflow, &plain, "", 7, &claim);
    for (app, tenant) in [(&alpha, "alpha"), (&beta, "beta"), (&plain, "sender-claim")] {
        assert_eq!(
            filed_tenants(&proflow, app),
            vec![Some(tenant.to_owned())],
            "the index names {app}'s tenant"
        );
    }
    // 100 Hz folded counts: each sample is 10 ms.
    read_back(&base, "alpha", &alpha, Some(30_000_000));
    read_back(&base, "beta", &beta, Some(50_000_000));
    read_back(&base, "sender-claim", &plain, Some(70_000_000));
    // And nowhere else.
    read_back(&base, "beta", &alpha, None);
    read_back(&base, "sender-claim", &alpha, None);
    read_back(&base, "alpha", &beta, None);
}

#[test]
fn a_tenant_bound_to_a_token_is_not_changed_by_a_label() {
    let Some(pyroscope) = multitenant_pyroscope() else {
        return;
    };
    let base = pyroscope.http_base();
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "secret-locked locked\nsecret-free\n").expect("token file");
    let proflow = start(
        &base,
        &format!("    auth: {{bearer_tokens_file: {}}}\n", tokens.display()),
    );
    let bound = common::unique_name("tenant-bound-app");
    let free = common::unique_name("tenant-free-app");
    push(
        &proflow,
        &bound,
        "{team=alpha}",
        2,
        &[("Authorization", "Bearer secret-locked")],
    );
    // A token bound to no tenant: the label decides, as without auth.
    push(
        &proflow,
        &free,
        "{team=alpha}",
        4,
        &[("Authorization", "Bearer secret-free")],
    );
    assert_eq!(
        filed_tenants(&proflow, &bound),
        vec![Some("locked".to_owned())]
    );
    assert_eq!(
        filed_tenants(&proflow, &free),
        vec![Some("alpha".to_owned())]
    );
    read_back(&base, "locked", &bound, Some(20_000_000));
    read_back(&base, "alpha", &bound, None);
    read_back(&base, "alpha", &free, Some(40_000_000));
}

/// A folded body of about `bytes` bytes: `main;work 1` and padding frames
/// of other stacks with a count of 0 (no samples).
fn body_of(bytes: usize) -> Vec<u8> {
    let mut b = String::from("main;work 1\n");
    let mut i = 0;
    while b.len() < bytes {
        b.push_str(&format!("pad;frame{i} 0\n"));
        i += 1;
    }
    b.into_bytes()
}

#[test]
fn a_noisy_tenant_is_refused_at_the_edge_and_a_quiet_one_is_not() {
    let Some(pyroscope) = multitenant_pyroscope() else {
        return;
    };
    let base = pyroscope.http_base();
    let proflow = start(&base, LIMITS);
    let noisy = common::unique_name("tenant-noisy-app");
    let quiet = common::unique_name("tenant-quiet-app");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    // Each push its own second: Pyroscope counts one profile of a series
    // per millisecond.
    let send = |app: &str, tenant: &str, i: u64| {
        let from = now - 60 + i;
        proflow.post(
            &format!(
                "/ingest?name={app}.cpu&from={from}&until={}&format=folded",
                from + 1
            ),
            &[("X-Scope-OrgID", tenant)],
            body_of(4 << 10),
        )
    };
    // 20 pushes of 4 KiB each, one after the other (well inside a second):
    // the noisy tenant's 20 KiB bucket takes five; the quiet one's all.
    let (mut noisy_ok, mut refused) = (0, Vec::new());
    let mut quiet_ok = 0;
    let started = std::time::Instant::now();
    for i in 0..20 {
        let r = send(&noisy, "noisy", i);
        match r.status {
            200 => noisy_ok += 1,
            429 => refused.push(r),
            other => panic!(
                "noisy push answered {other}: {}",
                String::from_utf8_lossy(&r.body)
            ),
        }
        let q = send(&quiet, "quiet", i);
        assert_eq!(
            q.status,
            200,
            "a quiet tenant's push beside a noisy one: {}",
            String::from_utf8_lossy(&q.body)
        );
        quiet_ok += 1;
    }
    // The burst takes five 4 KiB pushes; 10 KiB/s refills one more every
    // 0.4 s the loop took (a slow machine's loop takes longer).
    let refilled = (started.elapsed().as_secs_f64() * 10_240.0 / 4_096.0).ceil() as usize;
    assert!(
        (5..=5 + refilled).contains(&noisy_ok),
        "the noisy tenant's burst takes five 4 KiB pushes, plus {refilled} refilled, took {noisy_ok}"
    );
    let first = &refused[0];
    let message: serde_json::Value = serde_json::from_slice(&first.body).expect("a JSON refusal");
    let message = message["message"].as_str().unwrap_or_default().to_owned();
    assert!(
        first
            .retry_after
            .as_deref()
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|s| (1..=2).contains(&s))
            && message.contains("push rate limit")
            && message.contains("\"noisy\""),
        "a refusal says when to retry and why: Retry-After {:?}, {message}",
        first.retry_after
    );
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_refused_requests_total",
            &[("reason", "rate_limited")]
        ),
        refused.len() as f64,
        "{metrics}"
    );
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_tenant_refused_requests_total",
            &[("tenant", "noisy"), ("reason", "rate_limited")]
        ),
        refused.len() as f64,
        "counted under the tenant: {metrics}"
    );
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_tenant_refused_requests_total",
            &[("tenant", "quiet")]
        ),
        0.0
    );
    // Each tenant's volume and refusals, on /tenants and the gauges.
    let page: serde_json::Value =
        reqwest::blocking::get(format!("http://{}/tenants", proflow.ports.telemetry))
            .and_then(|r| r.text())
            .map(|text| serde_json::from_str(&text).expect("/tenants answers JSON"))
            .expect("/tenants answers");
    let row = |tenant: &str| {
        page["tenants"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["tenant"] == tenant))
            .unwrap_or_else(|| panic!("/tenants lists {tenant}: {page}"))
            .clone()
    };
    let (quiet_row, noisy_row) = (row("quiet"), row("noisy"));
    assert_eq!(
        (
            quiet_row["profiles_total"].as_i64(),
            noisy_row["profiles_total"].as_i64(),
            noisy_row["refused"]["rate_limited"].as_u64(),
            quiet_row["refused"]["rate_limited"].as_u64(),
        ),
        (
            Some(quiet_ok),
            Some(noisy_ok as i64),
            Some(refused.len() as u64),
            None
        ),
        "{page}"
    );
    let share = quiet_row["share"].as_f64().unwrap_or_default();
    let want = quiet_ok as f64 / (quiet_ok as f64 + noisy_ok as f64);
    assert!(
        (share - want).abs() < 0.05,
        "the quiet tenant's share of the bytes is its share of the pushes: {share} against {want}: {page}"
    );
    assert!(
        common::metric_sum(
            &metrics,
            "proflow_tenant_received_profiles_per_second",
            &[("tenant", "quiet")]
        ) > 0.0,
        "{metrics}"
    );
    // Pyroscope holds every accepted push of each, under its own tenant:
    // one `main;work` sample (10 ms) a push.
    read_back(&base, "quiet", &quiet, Some(quiet_ok * 10_000_000));
    read_back(&base, "noisy", &noisy, Some(noisy_ok as i64 * 10_000_000));
    eprintln!(
        "noisy: {noisy_ok} of 20 pushes accepted, {} refused (Retry-After {:?}); quiet: {quiet_ok} of 20",
        refused.len(),
        first.retry_after
    );
}

/// A series with more labels than `max_label_names_per_series` (Pyroscope's
/// default, 30): refused by proflow as the real Pyroscope refuses it (400,
/// the same words), before it costs the backend anything; a series within
/// it passes both.
#[test]
fn label_limits_refuse_what_pyroscope_refuses() {
    let Some(pyroscope) = multitenant_pyroscope() else {
        return;
    };
    let base = pyroscope.http_base();
    let proflow = start(
        &base,
        "    limits: {max_label_names_per_series: 30, max_label_value_length: 2048}\n",
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let http = readback::tenant_reader("labels");
    for (tags, want) in [(40, 400), (5, 200)] {
        let app = common::unique_name("tenant-labels-app");
        let tags: Vec<String> = (0..tags).map(|i| format!("t{i}=v")).collect();
        let query = format!(
            "/ingest?name={app}.cpu{{{}}}&from={}&until={now}&format=folded",
            tags.join(","),
            now - 10
        );
        let direct = http
            .post(format!("{base}{query}"))
            .body("main;work 1\n")
            .send()
            .expect("Pyroscope answers");
        let direct_status = direct.status().as_u16();
        let direct_text = direct.text().unwrap_or_default();
        let through = proflow.post(
            &query,
            &[("X-Scope-OrgID", "labels")],
            b"main;work 1\n".to_vec(),
        );
        let through_text = String::from_utf8_lossy(&through.body).into_owned();
        assert_eq!(
            (direct_status, through.status),
            (want, want),
            "{} tags: Pyroscope said {direct_text}; proflow said {through_text}",
            tags.len()
        );
        if want == 400 {
            for text in [&direct_text, &through_text] {
                assert!(
                    text.contains("label names; limit 30"),
                    "the refusal names the limit: {text}"
                );
            }
        }
    }
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_refused_requests_total",
            &[("reason", "max_label_names_per_series")]
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_tenant_refused_requests_total",
            &[
                ("tenant", "labels"),
                ("reason", "max_label_names_per_series")
            ]
        ),
        1.0,
        "{metrics}"
    );
}

/// Pyroscope's own profile limits, at its defaults, set at proflow
/// (`max_profile_size_bytes` 4 MiB, `max_profile_stacktrace_samples`
/// 16,000, `max_profile_stacktrace_depth` 1,000): a profile past the
/// samples or size limit is refused by proflow as the real Pyroscope
/// refuses it (400, the same words), as folded text and through push.v1; a
/// stack deeper than 1,000 frames is cut at proflow to its root-most 1,000,
/// and Pyroscope holds the same of it whether the body went to it directly
/// or through proflow (the 5 leaf-most frames in neither); a pprof stack
/// pushed through push.v1 is cut alike; the frames cut are counted as
/// lost parts.
#[test]
fn profile_limits_refuse_and_cut_what_pyroscope_does() {
    let Some(pyroscope) = multitenant_pyroscope() else {
        return;
    };
    let base = pyroscope.http_base();
    let proflow = start(
        &base,
        "    limits: {max_profile_size_bytes: 4194304, max_profile_stacktrace_samples: 16000, \
         max_profile_stacktrace_depth: 1000}\n",
    );
    let tenant = "shapes";
    let http = readback::tenant_reader(tenant);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    // (status, text) from Pyroscope directly and through proflow.
    let both = |path: &str, content_type: &str, body: Vec<u8>| {
        let direct = http
            .post(format!("{base}{path}"))
            .header("content-type", content_type)
            .body(body.clone())
            .send()
            .expect("Pyroscope answers");
        let direct = (direct.status().as_u16(), direct.text().unwrap_or_default());
        let through = proflow.post(
            path,
            &[("X-Scope-OrgID", tenant), ("content-type", content_type)],
            body,
        );
        let through = (
            through.status,
            String::from_utf8_lossy(&through.body).into_owned(),
        );
        (direct, through)
    };
    let folded = |app: &str| {
        format!(
            "/ingest?name={app}.cpu&from={}&until={now}&format=folded",
            now - 10
        )
    };
    let push_body = |app: &str, profile: proflow_model::pprof::Profile| {
        let raw = common::gzip(&proflow_model::pprof::encode(&profile));
        let labels = [("__name__", "process_cpu"), ("service_name", app)];
        prost::Message::encode_to_vec(&common::push::request(&labels, raw))
    };
    let profile_of = |stacks: &[Vec<String>]| {
        let mut b = proflow_model::pprof::ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time((now as i64 - 10) * 1_000_000_000, 10_000_000_000);
        for stack in stacks {
            b.sample_root_first(stack.iter().map(String::as_str), vec![10_000_000]);
        }
        b.build()
    };
    let many: Vec<Vec<String>> = (0..16_001)
        .map(|i| vec!["main".to_owned(), format!("f{i}")])
        .collect();
    let huge = [vec!["main".to_owned(), "x".repeat(5 << 20)]];
    let folded_many: String = (0..16_001).map(|i| format!("main;f{i} 1\n")).collect();
    let cases = [
        (
            "folded, 16,001 samples",
            both(
                &folded(&common::unique_name("shapes-many")),
                "text/plain",
                folded_many.into_bytes(),
            ),
            "exceeds the samples count limit (max_profile_stacktrace_samples, actual: 16001, limit: 16000)",
        ),
        (
            "push, 16,001 samples",
            both(
                "/push.v1.PusherService/Push",
                "application/proto",
                push_body(&common::unique_name("shapes-push-many"), profile_of(&many)),
            ),
            "exceeds the samples count limit (max_profile_stacktrace_samples, actual: 16001, limit: 16000)",
        ),
        (
            "push, 5 MiB",
            both(
                "/push.v1.PusherService/Push",
                "application/proto",
                push_body(&common::unique_name("shapes-push-big"), profile_of(&huge)),
            ),
            "uncompressed profile payload size exceeds limit of 4.2 MB",
        ),
    ];
    for (what, (direct, through), words) in &cases {
        assert_eq!(
            (direct.0, through.0),
            (400, 400),
            "{what}: Pyroscope said {}; proflow said {}",
            direct.1,
            through.1
        );
        for text in [&direct.1, &through.1] {
            assert!(
                text.contains(words),
                "{what}: the refusal says {words:?}: {text}"
            );
        }
    }

    // One stack of 1,005 frames, f0 (root) to f1004 (leaf).
    let deep: Vec<String> = (0..1005).map(|i| format!("f{i}")).collect();
    let body = format!("{} 7\n", deep.join(";")).into_bytes();
    let (direct_app, through_app) = (
        common::unique_name("shapes-deep-direct"),
        common::unique_name("shapes-deep-through"),
    );
    let direct = http
        .post(format!("{base}{}", folded(&direct_app)))
        .body(body.clone())
        .send()
        .expect("Pyroscope answers");
    assert_eq!(
        direct.status().as_u16(),
        200,
        "Pyroscope takes a deep stack"
    );
    let through = proflow.post(&folded(&through_app), &[("X-Scope-OrgID", tenant)], body);
    through.expect_status(200, "a deep stack, cut at proflow");
    let functions = ["f0", "f999", "f1000", "f1004"];
    let read = |app: &str| {
        let (ok, got, answer) = readback::pyroscope_wait(
            &http,
            &base,
            (&format!("{{service_name=\"{app}\"}}"), &functions, CPU),
            READ_BACK_TIMEOUT,
            |t| t.contains_key("f0") && t.contains_key("f999"),
        );
        assert!(ok, "{app}: Pyroscope read {got:?} ({answer})");
        got
    };
    let (direct_read, through_read) = (read(&direct_app), read(&through_app));
    assert_eq!(
        direct_read, through_read,
        "the same of a deep stack, directly and through proflow"
    );
    assert!(
        !through_read.contains_key("f1000") && !through_read.contains_key("f1004"),
        "the 5 leaf-most frames are cut: {through_read:?}"
    );
    // The same stack as a gzipped pprof through push.v1 (decoded to be cut).
    let pushed_app = common::unique_name("shapes-deep-push");
    proflow
        .post(
            "/push.v1.PusherService/Push",
            &[
                ("X-Scope-OrgID", tenant),
                ("content-type", "application/proto"),
            ],
            push_body(&pushed_app, profile_of(std::slice::from_ref(&deep))),
        )
        .expect_status(200, "a deep pprof stack, cut at proflow");
    // What proflow sent on: each stack cut to f0..f999, root first.
    for app in [&through_app, &pushed_app] {
        let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app));
        let profile = common::read_profile(&entries[0].path);
        let stacks: Vec<Vec<&str>> = proflow_model::pprof::stacks_root_first(&profile)
            .map(|(s, _)| s)
            .collect();
        assert_eq!(stacks.len(), 1, "{app}");
        assert_eq!(
            (stacks[0].len(), stacks[0][0], stacks[0][999]),
            (1000, "f0", "f999"),
            "{app}"
        );
    }
    let metrics = proflow.metrics();
    for (reason, want) in [("samples_limit", 2.0), ("profile_size_limit", 1.0)] {
        assert_eq!(
            common::metric_sum(
                &metrics,
                "proflow_receiver_tenant_refused_requests_total",
                &[("tenant", tenant), ("reason", reason)]
            ),
            want,
            "{reason}: {metrics}"
        );
    }
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_lost_parts_total",
            &[
                ("part", "frame"),
                ("reason", "max_profile_stacktrace_depth")
            ]
        ),
        10.0,
        "{metrics}"
    );
}

/// Pyroscope's series limit at its default (`max_global_series_per_tenant:
/// 5000`) set at proflow: past 5,000 active series a push is refused by
/// proflow as the real Pyroscope refuses it (429, the same words), whole
/// and before the backend; 5,000 pass to Pyroscope whole; a known series
/// still passes.
#[test]
fn the_series_limit_refuses_what_pyroscope_refuses() {
    let Some(pyroscope) = multitenant_pyroscope() else {
        return;
    };
    let base = pyroscope.http_base();
    let proflow = start(&base, "    limits: {max_global_series_per_tenant: 5000}\n");
    let profile = common::gzip(&common::cpu_profile());
    let push_of = |app: &str, series: std::ops::Range<usize>| {
        let request = proflow_model::push_v1::PushRequest {
            series: series
                .map(|i| {
                    let i = i.to_string();
                    proflow_model::push_v1::RawProfileSeries::new(
                        [
                            ("__name__", "process_cpu"),
                            ("service_name", app),
                            ("series", i.as_str()),
                        ],
                        [profile.clone().into()],
                    )
                })
                .collect(),
        };
        prost::Message::encode_to_vec(&request)
    };
    let push = |tenant: &str, body: Vec<u8>| {
        proflow.post(
            "/push.v1.PusherService/Push",
            &[
                ("X-Scope-OrgID", tenant),
                ("content-type", "application/proto"),
            ],
            body,
        )
    };
    let app = common::unique_name("tenant-series-app");
    let words = "Maximum active series limit exceeded (";
    // Pyroscope itself, for its own tenant, 500 series a request (one
    // request of 5,001 outlasted its distributor's 5 s push to the ingester
    // on a busy machine: 504): 5,000 fit, the 5,001st is refused.
    let direct_push = |series: std::ops::Range<usize>| {
        let reply = readback::tenant_reader("series-direct")
            .post(format!("{base}/push.v1.PusherService/Push"))
            .header("content-type", "application/proto")
            .body(push_of(&app, series))
            .send()
            .expect("Pyroscope answers");
        (reply.status().as_u16(), reply.text().unwrap_or_default())
    };
    for from in (0..5000).step_by(500) {
        let (status, text) = direct_push(from..from + 500);
        assert_eq!(status, 200, "Pyroscope takes 500 more series: {text}");
    }
    let direct = direct_push(5000..5001);
    assert!(
        direct.0 == 429 && direct.1.contains(words) && direct.1.contains("(5000/5000)"),
        "Pyroscope refuses the 5,001st series: {direct:?}"
    );
    // Through proflow (at most 1,000 series a request): 4,999 fit.
    for from in (0..4000).step_by(1000) {
        push("series", push_of(&app, from..from + 1000)).expect_status(200, "1,000 series");
    }
    push("series", push_of(&app, 4000..4999)).expect_status(200, "999 series");
    // Two new ones do not: refused whole, before the backend, none added.
    let refused = push("series", push_of(&app, 4999..5001));
    let text = String::from_utf8_lossy(&refused.body).into_owned();
    assert!(
        refused.status == 429 && text.contains(words) && text.contains("(4999/5000)"),
        "{} {text}",
        refused.status
    );
    push("series", push_of(&app, 4999..5000)).expect_status(200, "the 5,000th series");
    let one_more = push("series", push_of(&app, 5000..5001));
    let text = String::from_utf8_lossy(&one_more.body).into_owned();
    assert!(
        one_more.status == 429 && text.contains("(5000/5000)"),
        "{} {text}",
        one_more.status
    );
    push("series", push_of(&app, 0..1)).expect_status(200, "a known series");
    // Pyroscope holds all 5,000 of proflow's series (and refused none).
    let http = readback::tenant_reader("series");
    let selector = format!("{{service_name=\"{app}\"}}");
    // Each series' profile once: the known series' second profile has the
    // first one's time, and Pyroscope keeps one profile of a series per
    // millisecond.
    let want = 5000 * 300_000_000;
    let (ok, got, answer) = readback::pyroscope_wait(
        &http,
        &base,
        (&selector, &[common::HOT_FUNCTION], CPU),
        READ_BACK_TIMEOUT,
        |t| t.get(common::HOT_FUNCTION) == Some(&want),
    );
    assert!(
        ok,
        "Pyroscope holds every series proflow let through: {got:?} ({answer})"
    );
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_tenant_refused_requests_total",
            &[("tenant", "series"), ("reason", "series_limit")]
        ),
        2.0,
        "{metrics}"
    );
}

/// Behind a stopped backend the `pyroscope` exporter's `block` queue fills:
/// once a quiet tenant has profiles in it, the noisy tenant flooding it is
/// refused at its share (429 naming it) while the quiet one still gets in,
/// and once the backend is back each tenant's accepted profiles read back
/// under its own tenant.
#[test]
fn behind_a_stopped_backend_a_noisy_tenant_cannot_take_the_whole_queue() {
    let Some(mut pyroscope) = multitenant_pyroscope() else {
        return;
    };
    let base = pyroscope.http_base();
    let proflow = Proflow::start(|ports, _| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n\
             exporters:\n  pyroscope:\n    endpoint: {base}\n    \
             sending_queue: {{queue_size: 32, when_full: block, wait_when_full: 0s, num_consumers: 1, batch: {{max_profiles: 1}}}}\n    \
             retry_on_failure: {{initial_interval: 100ms, max_interval: 200ms, max_elapsed_time: 0s}}\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      \
             receivers: [pprof_push]\n      exporters: [pyroscope]\n",
            ports.receiver, ports.telemetry
        )
    });
    pyroscope.stop();
    let noisy = common::unique_name("share-noisy-app");
    let quiet = common::unique_name("share-quiet-app");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let send = |app: &str, tenant: &str, i: u64| {
        let from = now - 120 + i;
        proflow.post(
            &format!(
                "/ingest?name={app}.cpu&from={from}&until={}&format=folded",
                from + 1
            ),
            &[("X-Scope-OrgID", tenant)],
            b"main;work 1\n".to_vec(),
        )
    };
    let r = send(&quiet, "quiet", 0);
    assert_eq!(r.status, 200, "{}", r.text());
    // The noisy tenant floods: past half the queue it is held to half.
    let mut noisy_ok = 0;
    let refusal = loop {
        let r = send(&noisy, "noisy", noisy_ok);
        match r.status {
            200 => noisy_ok += 1,
            429 => break r,
            other => panic!("answered {other}: {}", r.text()),
        }
        assert!(noisy_ok <= 32, "the noisy tenant was never refused");
    };
    assert_eq!(noisy_ok, 16, "half of a 32-profile queue");
    assert!(refusal.retry_after.is_some(), "429 with Retry-After");
    assert!(
        refusal.text().contains("tenant `noisy` holds its share"),
        "{}",
        refusal.text()
    );
    // The quiet tenant still gets in; the noisy one still does not.
    for i in 1..3 {
        let r = send(&quiet, "quiet", i);
        assert_eq!(r.status, 200, "{}", r.text());
        let r = send(&noisy, "noisy", 40 + i);
        assert_eq!(r.status, 429, "{}", r.text());
    }
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_tenant_refused_requests_total",
            &[("tenant", "noisy"), ("reason", "tenant_share")]
        ),
        3.0,
        "{metrics}"
    );
    // The backend is back: everything accepted is delivered, each under its tenant.
    pyroscope.start_again();
    read_back(&base, "noisy", &noisy, Some(16 * 10_000_000));
    read_back(&base, "quiet", &quiet, Some(3 * 10_000_000));
}
