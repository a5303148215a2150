//! proflow's OpAMP client (`service.opamp`): the OpenTelemetry agent
//! management protocol, so a fleet of proflows can be seen and reconfigured
//! from one server.
//!
//! - [`proto`]: the messages, written from the specification's field numbers.
//! - [`transport`]: WebSocket (kept open; the server pushes) and plain HTTP
//!   (polled), with the exporters' `headers` and `tls`.
//! - [`storage`]: the instance uid and the last applied remote config, kept
//!   across restarts in `service.opamp.storage`.
//! - `client`: the loop that reports identity (`service.instance.id`,
//!   version, host, mode, the Kubernetes pod where known), health per
//!   pipeline and component, and the effective config, and hands each new
//!   remote config to the collector through [`ApplyRequest`]s: the collector
//!   validates it as `proflow validate` does and applies it as SIGHUP
//!   applies a file, and the client reports it applied or failed with the
//!   problems. A config that does not validate is never applied.
//!
//! Nothing here decides how a config is applied: the binary does, through
//! the same reload as a file's.

mod client;
pub mod proto;
pub mod storage;
pub mod transport;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use proflow_config::{OpampSettings, OpampTransport};
use proflow_core::telemetry::Telemetry;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

pub use storage::RemoteConfig;

/// Plain HTTP's default polling interval.
const DEFAULT_POLLING: Duration = Duration::from_secs(30);

/// A remote config for the collector to validate and apply; `reply` gets
/// `Ok` once it runs, or every problem.
pub struct ApplyRequest {
    pub config: RemoteConfig,
    pub reply: oneshot::Sender<Result<(), String>>,
}

/// Who this proflow is, beyond its instance uid.
#[derive(Debug, Clone)]
pub struct Identity {
    pub version: String,
    pub host: String,
    /// `agent`, `gateway` or `scraper`.
    pub mode: String,
    /// `k8s.pod.name`, `k8s.namespace.name`, `k8s.node.name` where known.
    pub kubernetes: Vec<(String, String)>,
}

impl Identity {
    /// This process's: the host name from the kernel, the pod from the
    /// chart's environment (`POD_NAME`, `POD_NAMESPACE`, `KUBE_NODE_NAME`).
    pub fn of_this_process(mode: &str) -> Identity {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let kubernetes = [
            ("POD_NAME", "k8s.pod.name"),
            ("POD_NAMESPACE", "k8s.namespace.name"),
            ("KUBE_NODE_NAME", "k8s.node.name"),
        ]
        .iter()
        .filter_map(|(var, key)| {
            let v = std::env::var(var).ok().filter(|v| !v.is_empty())?;
            Some(((*key).to_owned(), v))
        })
        .collect();
        Identity {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            host,
            mode: mode.to_owned(),
            kubernetes,
        }
    }
}

/// The last remote config applied, kept in `storage` (what proflow starts
/// with when `accepts_remote_config` is on).
pub fn last_applied(storage: &Path) -> Option<RemoteConfig> {
    storage::Storage::open(storage).ok()?.remote_config()
}

/// The YAML of a remote config: its one file (any name), or the one named
/// `""` or `proflow.yaml` among several.
pub fn config_text(remote: proto::AgentRemoteConfig) -> Result<String, String> {
    let mut files = remote.config.map(|c| c.config_map).unwrap_or_default();
    let file = if files.len() == 1 {
        files.into_values().next()
    } else {
        files.remove("").or_else(|| files.remove("proflow.yaml"))
    };
    let file = file.ok_or_else(|| {
        "the remote config must hold one file (or one named \"\" or proflow.yaml)".to_owned()
    })?;
    String::from_utf8(file.body).map_err(|_| "the remote config is not UTF-8 text".to_owned())
}

/// Starts the client: it runs until `shutdown`, reporting `effective` (the
/// YAML running now) and asking for remote configs to be applied through
/// the returned receiver. `applied` is the remote config's hash proflow
/// started with, if it did.
pub fn start(
    settings: &OpampSettings,
    identity: Identity,
    telemetry: Arc<Telemetry>,
    effective: watch::Receiver<String>,
    applied: Option<Vec<u8>>,
    shutdown: CancellationToken,
) -> Result<(tokio::task::JoinHandle<()>, mpsc::Receiver<ApplyRequest>), String> {
    let (transport, connection) = settings
        .connection()
        .ok_or("service.opamp.server: set ws or http")?;
    let storage = storage::Storage::open(&settings.storage)?;
    let uid = storage.instance_uid()?;
    let uses_tls =
        connection.endpoint.starts_with("wss://") || connection.endpoint.starts_with("https://");
    let tls = proflow_net::tls::client_config(&(&connection.tls).into(), uses_tls)
        .map_err(|e| format!("service.opamp tls: {e}"))?;
    let (apply, requests) = mpsc::channel(1);
    let client = client::Client {
        transport,
        endpoint: connection.endpoint.clone(),
        headers: transport::headers(connection)?,
        tls: Arc::new(tls),
        polling_interval: match transport {
            OpampTransport::Http => connection
                .polling_interval
                .map(|d| d.get())
                .unwrap_or(DEFAULT_POLLING),
            OpampTransport::WebSocket => DEFAULT_POLLING,
        },
        accepts_remote_config: settings.accepts_remote_config,
        storage,
        uid,
        identity,
        telemetry,
        effective,
        apply,
        sequence: 0,
        remote_status: applied.map(|hash| proto::RemoteConfigStatus {
            last_remote_config_hash: hash,
            status: proto::remote_config_status::APPLIED,
            error_message: String::new(),
        }),
        started_nanos: client::unix_nanos(std::time::SystemTime::now()),
    };
    Ok((tokio::spawn(client.run(shutdown)), requests))
}
