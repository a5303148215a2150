//! What the real Pyroscope clients do with a profile proflow refuses (429 with
//! `Retry-After: 1`): they drop it and send the next period's profile. docs/exporter-queues.md
//! rests the `when_full: drop_newest` default on this; this test keeps it true
//! for the client versions we install.
//!
//! proflow is set up to refuse nearly everything: its only exporter is stuck
//! (a file stands where it must create the service's directory; retried
//! forever) behind a one-profile `block` queue. A client that resent refused
//! uploads after `Retry-After` would make about twice as many requests as it
//! has upload periods.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{Proflow, metric_sum};

/// How long each client runs, uploading every second.
const RUN_SECONDS: u32 = 6;

fn refusing_proflow(app: &str) -> Proflow {
    let app = app.to_owned();
    Proflow::start(move |ports, profiles| {
        std::fs::create_dir_all(profiles).unwrap();
        std::fs::write(profiles.join(&app), b"in the way").unwrap();
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  file:\n    directory: {}\n    sending_queue: {{queue_size: 1, num_consumers: 1, when_full: block}}\n    retry_on_failure: {{initial_interval: 1s, max_interval: 1s, max_elapsed_time: 0s}}\nservice:\n  shutdown_timeout: 100ms\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [file]}}\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    })
}

/// Runs a client against a refusing proflow and checks it neither failed nor
/// resent what was refused.
fn check(what: &str, app: &str, mut client: Command) {
    let proflow = refusing_proflow(app);
    client
        .args(["--server", &proflow.receiver_url("")])
        .args(["--app-name", app])
        .args(["--upload-interval", "1"])
        .arg(RUN_SECONDS.to_string());
    let log = proflow.dir.path().join("client.log");
    let (status, output) = common::run_bounded(&mut client, &log, Duration::from_secs(60));
    assert!(status.success(), "{what} failed ({status}):\n{output}");
    let metrics = proflow.metrics();
    let refused = metric_sum(
        &metrics,
        "proflow_receiver_refused_requests_total",
        &[("reason", "backpressure")],
    );
    let accepted = metric_sum(&metrics, "proflow_receiver_accepted_profiles_total", &[]);
    eprintln!("{what}: {accepted} accepted, {refused} refused with 429 in {RUN_SECONDS} s");
    assert!(
        refused >= 3.0,
        "{what} was refused while it ran: {metrics}\n{output}"
    );
    // One upload per period, plus the last one at shutdown (and slack for a
    // period cut in two at start).
    let most = f64::from(RUN_SECONDS + 3);
    assert!(
        accepted + refused <= most,
        "{what} made {} requests in {RUN_SECONDS} one-second periods: it resends refused uploads\n{output}",
        accepted + refused
    );
}

#[test]
fn pyroscope_io_drops_a_refused_profile() {
    let python = match common::python_client() {
        Ok(p) => p,
        Err(why) => {
            let _: Option<()> = common::missing_peer(&format!("pyroscope-io: {why}"));
            return;
        }
    };
    let mut cmd = Command::new(python);
    cmd.arg(common::peers_dir().join("apps/python/main.py"));
    check("pyroscope-io", &common::unique_name("py-refused"), cmd);
}

#[test]
fn pyroscope_nodejs_drops_a_refused_profile() {
    let node_modules: PathBuf = match common::node_client() {
        Ok(p) => p,
        Err(why) => {
            let _: Option<()> = common::missing_peer(&format!("@pyroscope/nodejs: {why}"));
            return;
        }
    };
    let mut cmd = Command::new(std::env::var_os("NODE").unwrap_or_else(|| "node".into()));
    cmd.env("NODE_PATH", node_modules)
        .arg(common::peers_dir().join("apps/node/main.js"));
    check(
        "@pyroscope/nodejs",
        &common::unique_name("node-refused"),
        cmd,
    );
}
