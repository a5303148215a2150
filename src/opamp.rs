//! The binary's side of OpAMP (`service.opamp`, the client in
//! `proflow-opamp`): which config proflow starts with, and applying the
//! configs the server sends through the same reload as a file's.
//!
//! A remote config is a whole proflow config without `service.opamp` (how
//! to reach the server stays the local file's, read at the start as
//! `service.telemetry` is; a restart with a kept remote config takes
//! `service.telemetry` from the local file too). It is checked exactly as `proflow validate`
//! checks a file and never applied when it does not pass. Once applied it
//! is kept in `service.opamp.storage`, and proflow starts with it while
//! `accepts_remote_config` is on, whether or not the server can be reached
//! then. While it runs, SIGHUP and `POST /-/reload` are refused (a local
//! reload would leave the server believing its config runs).

use std::path::Path;

use proflow_config::OpampSettings;
use proflow_core::telemetry::{ConfigSource, Telemetry};
use proflow_core::topology::{self, Plan};
use proflow_opamp::{ApplyRequest, RemoteConfig};
use tokio::sync::{mpsc, watch};

/// What proflow starts with.
pub struct Start {
    pub plan: Plan,
    /// The config's text (reported as the effective config).
    pub text: String,
    pub source: ConfigSource,
    /// The file's path, or the OpAMP server's endpoint.
    pub origin: String,
    /// The local file's `service.opamp`.
    pub opamp: Option<OpampSettings>,
    /// The hash of the remote config started with, if one was.
    pub remote_hash: Option<Vec<u8>>,
}

/// The server's endpoint (where a remote config came from).
pub fn endpoint(settings: &OpampSettings) -> String {
    settings
        .connection()
        .map(|(_, c)| c.endpoint.clone())
        .unwrap_or_default()
}

/// The local file's plan, or the last remote config applied when
/// `service.opamp.accepts_remote_config` is on and one was kept (and still
/// passes the checks of this build).
pub fn start_with(plan: Plan, text: String, path: &Path) -> Start {
    let opamp = plan.opamp.clone();
    let local = |plan, text| Start {
        plan,
        text,
        source: ConfigSource::File,
        origin: path.display().to_string(),
        opamp: opamp.clone(),
        remote_hash: None,
    };
    let Some(settings) = opamp.clone().filter(|s| s.accepts_remote_config) else {
        return local(plan, text);
    };
    let Some(remote) = proflow_opamp::last_applied(&settings.storage) else {
        return local(plan, text);
    };
    match remote_plan(&remote.body) {
        Ok(mut remote_plan) => {
            // The node's own wiring stays the local file's.
            remote_plan.telemetry = plan.telemetry.clone();
            tracing::info!(storage = %settings.storage.display(), "starting with the last config the OpAMP server sent (the server may send a newer one)");
            Start {
                plan: remote_plan,
                text: remote.body,
                source: ConfigSource::OpAmp,
                origin: endpoint(&settings),
                opamp: Some(settings),
                remote_hash: Some(remote.hash),
            }
        }
        Err(e) => {
            tracing::warn!(storage = %settings.storage.display(), "the kept remote config does not pass this build's checks; starting with the local file:\n{e}");
            local(plan, text)
        }
    }
}

/// A remote config checked as `proflow validate` checks a file, without
/// `service.opamp`, and with no `${env:...}` read from this process's
/// environment (a server must not be able to make proflow send it the
/// pod's secrets): only a reference's `:-default` counts.
fn remote_plan(text: &str) -> Result<Plan, String> {
    let plan = crate::plan_of_with_env(text, &|_| None)?;
    if plan.opamp.is_some() {
        return Err("service.opamp: a remote config cannot change how proflow reaches its OpAMP server (that stays the local file's); remove the section".to_owned());
    }
    Ok(plan)
}

/// `agent` (an `ebpf` receiver runs), `scraper` (a `scrape` receiver), or
/// `gateway`.
pub fn mode(telemetry: &Telemetry) -> &'static str {
    let kinds: Vec<String> = telemetry
        .pipelines()
        .into_iter()
        .flat_map(|p| p.receivers)
        .map(|id| id.split('/').next().unwrap_or_default().to_owned())
        .collect();
    if kinds.iter().any(|k| k == "ebpf") {
        "agent"
    } else if kinds.iter().any(|k| k == "scrape") {
        "scraper"
    } else {
        "gateway"
    }
}

/// The next remote config, or never when OpAMP is off.
pub async fn next(requests: &mut Option<mpsc::Receiver<ApplyRequest>>) -> Option<ApplyRequest> {
    match requests {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Checks and applies a remote config; `Err` with every problem when it
/// is refused (the running config stays) or applied in part.
pub async fn apply(
    config: &RemoteConfig,
    running: &mut topology::Running,
    started_telemetry: &str,
    telemetry: &Telemetry,
    effective: &watch::Sender<String>,
    origin: &str,
) -> Result<(), String> {
    let result = match remote_plan(&config.body) {
        Ok(plan) => crate::apply_plan(plan, running, started_telemetry).await,
        Err(e) => Err(format!("not applied; the running config stays:\n{e}")),
    };
    telemetry.config_reloaded(ConfigSource::OpAmp, result.is_ok());
    result.map(|_| {
        crate::applied(
            telemetry,
            &config.body,
            ConfigSource::OpAmp,
            origin.to_owned(),
        );
        effective.send_replace(config.body.clone());
    })
}
