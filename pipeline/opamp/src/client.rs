//! The client's loop: connect (WebSocket) or poll (plain HTTP), report the
//! agent's full state (identity, capabilities, health, effective config,
//! the last remote config's status) with every message, and hand each new
//! remote config to the collector, reporting it applied or failed with the
//! collector's problems. A dropped connection or an unreachable server is
//! retried after 1 s, doubling to 30 s; the collector runs on meanwhile.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proflow_config::OpampTransport;
use proflow_core::telemetry::Telemetry;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::proto::{
    self, AgentConfigFile, AgentConfigMap, AgentDescription, AgentToServer, ComponentHealth,
    EffectiveConfig, RemoteConfigStatus, ServerToAgent, capabilities, remote_config_status,
    server_flags,
};
use crate::storage::{RemoteConfig, Storage, format_uuid, hex};
use crate::transport::{HttpTransport, WsConnection};
use crate::{ApplyRequest, Identity};

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);
/// A connection that lasted this long starts the retries from the first
/// wait again (a server that accepts and drops at once does not).
const STABLE: Duration = Duration::from_secs(30);
/// The least time between two messages the server's answers ask for: a
/// server that asks for a report in every answer gets one a second.
const MIN_GAP: Duration = Duration::from_secs(1);
/// How often health is looked at; a change is reported at once.
const HEALTH_EVERY: Duration = Duration::from_secs(5);
/// A component whose last error is younger than this is reported unhealthy.
const RECENT_ERROR: Duration = Duration::from_secs(300);

pub(crate) struct Client {
    pub(crate) transport: OpampTransport,
    pub(crate) endpoint: String,
    pub(crate) headers: Vec<(http::HeaderName, http::HeaderValue)>,
    pub(crate) tls: Arc<rustls::ClientConfig>,
    pub(crate) polling_interval: Duration,
    pub(crate) accepts_remote_config: bool,
    pub(crate) storage: Storage,
    pub(crate) uid: [u8; 16],
    pub(crate) identity: Identity,
    pub(crate) telemetry: Arc<Telemetry>,
    pub(crate) effective: watch::Receiver<String>,
    pub(crate) apply: mpsc::Sender<ApplyRequest>,
    pub(crate) sequence: u64,
    pub(crate) remote_status: Option<RemoteConfigStatus>,
    pub(crate) started_nanos: u64,
}

pub(crate) fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl Client {
    fn capabilities(&self) -> u64 {
        let mut c = capabilities::REPORTS_STATUS
            | capabilities::REPORTS_EFFECTIVE_CONFIG
            | capabilities::REPORTS_HEALTH
            | capabilities::REPORTS_REMOTE_CONFIG;
        if self.accepts_remote_config {
            c |= capabilities::ACCEPTS_REMOTE_CONFIG;
        }
        c
    }

    fn description(&self) -> AgentDescription {
        let mut non_identifying = vec![
            proto::attribute("host.name", self.identity.host.clone()),
            proto::attribute("os.type", std::env::consts::OS),
            proto::attribute("host.arch", std::env::consts::ARCH),
            proto::attribute("proflow.mode", self.identity.mode.clone()),
        ];
        for (k, v) in &self.identity.kubernetes {
            non_identifying.push(proto::attribute(k, v.clone()));
        }
        AgentDescription {
            identifying_attributes: vec![
                proto::attribute("service.name", "proflow"),
                proto::attribute("service.version", self.identity.version.clone()),
                proto::attribute("service.instance.id", format_uuid(&self.uid)),
            ],
            non_identifying_attributes: non_identifying,
        }
    }

    /// The collector's health: healthy while it serves; each pipeline and
    /// component unhealthy while its last error is recent.
    fn health(&self) -> ComponentHealth {
        let t = &self.telemetry;
        let now = unix_nanos(SystemTime::now());
        let component = |kind: &'static str, id: &str| {
            let last = t.last_error(kind, id);
            let recent = last
                .as_ref()
                .is_some_and(|e| e.at.elapsed().unwrap_or_default() < RECENT_ERROR);
            ComponentHealth {
                healthy: !recent,
                start_time_unix_nano: self.started_nanos,
                last_error: last.map(|e| e.message).unwrap_or_default(),
                status: if recent { "failing" } else { "running" }.to_owned(),
                status_time_unix_nano: now,
                component_health_map: HashMap::new(),
            }
        };
        let mut pipelines = HashMap::new();
        for p in t.pipelines() {
            let mut parts = HashMap::new();
            for (kind, ids) in [
                ("receiver", &p.receivers),
                ("processor", &p.processors),
                ("exporter", &p.exporters),
            ] {
                for id in ids {
                    parts.insert(format!("{kind}:{id}"), component(kind, id));
                }
            }
            let healthy = parts.values().all(|c| c.healthy);
            pipelines.insert(
                format!("pipeline:{}", p.id),
                ComponentHealth {
                    healthy,
                    start_time_unix_nano: self.started_nanos,
                    status: if healthy { "running" } else { "degraded" }.to_owned(),
                    status_time_unix_nano: now,
                    component_health_map: parts,
                    ..Default::default()
                },
            );
        }
        let ready = t.is_ready();
        ComponentHealth {
            healthy: ready,
            start_time_unix_nano: self.started_nanos,
            status: if !ready {
                "starting"
            } else if pipelines.values().all(|p| p.healthy) {
                "running"
            } else {
                "degraded"
            }
            .to_owned(),
            status_time_unix_nano: now,
            component_health_map: pipelines,
            ..Default::default()
        }
    }

    /// The full state, as every message carries it.
    fn message(&mut self) -> AgentToServer {
        self.sequence += 1;
        let mut files = HashMap::new();
        files.insert(
            String::new(),
            AgentConfigFile {
                body: self.effective.borrow_and_update().clone().into_bytes(),
                content_type: "text/yaml".to_owned(),
            },
        );
        AgentToServer {
            instance_uid: self.uid.to_vec(),
            sequence_num: self.sequence,
            agent_description: Some(self.description()),
            capabilities: self.capabilities(),
            health: Some(self.health()),
            effective_config: Some(EffectiveConfig {
                config_map: Some(AgentConfigMap { config_map: files }),
            }),
            remote_config_status: self.remote_status.clone(),
            ..Default::default()
        }
    }

    /// What a server's message asks for; true when the agent should report
    /// its state again.
    async fn handle(&mut self, msg: ServerToAgent) -> bool {
        let mut report = false;
        if let Some(e) = &msg.error_response {
            tracing::warn!(error = %e.error_message, kind = e.r#type, "the OpAMP server answered with an error");
        }
        if let Some(id) = msg.agent_identification {
            match <[u8; 16]>::try_from(id.new_instance_uid.as_slice()) {
                Ok(uid) => {
                    tracing::info!(uid = %format_uuid(&uid), "the OpAMP server gave this proflow a new instance uid");
                    self.uid = uid;
                    if let Err(e) = self.storage.set_instance_uid(uid) {
                        tracing::warn!("{e}; the new uid holds until the next restart");
                    }
                    report = true;
                }
                Err(_) => tracing::warn!(
                    len = id.new_instance_uid.len(),
                    "ignored a new instance uid that is not 16 bytes"
                ),
            }
        }
        if msg.flags & server_flags::REPORT_FULL_STATE != 0 {
            report = true;
        }
        if let Some(remote) = msg.remote_config {
            report |= self.remote_config(remote).await;
        }
        report
    }

    /// Validates and applies a remote config the agent has not seen yet.
    async fn remote_config(&mut self, remote: proto::AgentRemoteConfig) -> bool {
        if !self.accepts_remote_config {
            tracing::warn!(
                "the OpAMP server sent a config; ignored (service.opamp.accepts_remote_config is off)"
            );
            return false;
        }
        let last = self
            .remote_status
            .as_ref()
            .map(|s| &s.last_remote_config_hash);
        if last == Some(&remote.config_hash) {
            return false;
        }
        let hash = remote.config_hash.clone();
        let result = match crate::config_text(remote) {
            Ok(body) => {
                let config = RemoteConfig {
                    body,
                    hash: hash.clone(),
                };
                self.ask_to_apply(config).await
            }
            Err(e) => Err(e),
        };
        self.remote_status = Some(match result {
            Ok(()) => {
                tracing::info!(hash = %hex(&hash), "applied the OpAMP server's config");
                RemoteConfigStatus {
                    last_remote_config_hash: hash,
                    status: remote_config_status::APPLIED,
                    error_message: String::new(),
                }
            }
            Err(problems) => {
                tracing::warn!(hash = %hex(&hash), "refused the OpAMP server's config; the running config stays:\n{problems}");
                RemoteConfigStatus {
                    last_remote_config_hash: hash,
                    status: remote_config_status::FAILED,
                    error_message: problems,
                }
            }
        });
        true
    }

    async fn ask_to_apply(&mut self, config: RemoteConfig) -> Result<(), String> {
        let (reply, answer) = oneshot::channel();
        let request = ApplyRequest {
            config: config.clone(),
            reply,
        };
        if self.apply.send(request).await.is_err() {
            return Err("proflow is stopping".to_owned());
        }
        let result = answer
            .await
            .unwrap_or_else(|_| Err("proflow is stopping".to_owned()));
        if result.is_ok()
            && let Err(e) = self.storage.set_remote_config(&config)
        {
            tracing::warn!(
                "{e}: after a restart without the server, proflow starts with the config before it"
            );
        }
        result
    }

    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        let mut wait = FIRST_RETRY;
        let mut failing_since: Option<String> = None;
        while !shutdown.is_cancelled() {
            let result = match self.transport {
                OpampTransport::WebSocket => self.websocket(&shutdown).await,
                OpampTransport::Http => self.poll(&shutdown).await,
            };
            match result {
                Ok(()) => return,
                Err((e, connected)) => {
                    if connected.is_some_and(|at| at.elapsed() >= STABLE) {
                        wait = FIRST_RETRY;
                    }
                    if failing_since.as_deref() != Some(e.as_str()) {
                        tracing::warn!(endpoint = %self.endpoint, error = %e, "OpAMP server unreachable; retrying (logged again when the error changes)");
                        failing_since = Some(e);
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = (wait * 2).min(LAST_RETRY);
        }
    }

    /// One WebSocket connection until it ends: `Ok` at shutdown, else the
    /// error and when the connection had been made, if it had.
    async fn websocket(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<(), (String, Option<Instant>)> {
        let mut conn = WsConnection::connect(&self.endpoint, &self.headers, &self.tls)
            .await
            .map_err(|e| (e, None))?;
        let connected = Some(Instant::now());
        tracing::info!(endpoint = %self.endpoint, uid = %format_uuid(&self.uid), "connected to the OpAMP server (WebSocket)");
        let first = self.message();
        conn.send(&first).await.map_err(|e| (e, connected))?;
        let mut last_sent = Instant::now();
        let mut health = tokio::time::interval(HEALTH_EVERY);
        let mut last_health = self.health_summary();
        loop {
            let report = tokio::select! {
                _ = shutdown.cancelled() => {
                    let bye = AgentToServer {
                        instance_uid: self.uid.to_vec(),
                        sequence_num: self.sequence + 1,
                        agent_disconnect: Some(proto::AgentDisconnect {}),
                        ..Default::default()
                    };
                    let _ = conn.send(&bye).await;
                    conn.close().await;
                    return Ok(());
                }
                msg = conn.recv() => self.handle(msg.map_err(|e| (e, connected))?).await,
                changed = self.effective.changed() => changed.is_ok(),
                _ = health.tick() => {
                    let now = self.health_summary();
                    std::mem::replace(&mut last_health, now.clone()) != now
                }
            };
            if report {
                tokio::time::sleep_until((last_sent + MIN_GAP).into()).await;
                last_health = self.health_summary();
                let msg = self.message();
                conn.send(&msg).await.map_err(|e| (e, connected))?;
                last_sent = Instant::now();
            }
        }
    }

    /// Plain HTTP: a POST now, then every polling interval, and at once
    /// after anything the agent must report.
    async fn poll(
        &mut self,
        shutdown: &CancellationToken,
    ) -> Result<(), (String, Option<Instant>)> {
        let http = HttpTransport::new(&self.endpoint, self.headers.clone(), (*self.tls).clone())
            .map_err(|e| (e, None))?;
        let mut connected = None;
        loop {
            let msg = self.message();
            let answer = http.exchange(&msg).await.map_err(|e| (e, connected))?;
            if connected.is_none() {
                tracing::info!(endpoint = %self.endpoint, uid = %format_uuid(&self.uid), "reached the OpAMP server (plain HTTP)");
                connected = Some(Instant::now());
            }
            // What the answer asks for is reported after MIN_GAP, else at
            // the next poll.
            let next = if self.handle(answer).await {
                MIN_GAP
            } else {
                self.polling_interval
            };
            tokio::select! {
                _ = shutdown.cancelled() => return Ok(()),
                _ = tokio::time::sleep(next) => {}
                _ = self.effective.changed() => {}
            }
        }
    }

    /// What the health report says, without its times.
    fn health_summary(&self) -> Vec<(String, bool, String)> {
        let mut out = Vec::new();
        for (pipeline, p) in self.health().component_health_map {
            for (name, c) in p.component_health_map {
                out.push((format!("{pipeline}/{name}"), c.healthy, c.last_error));
            }
        }
        out.sort();
        out.push((String::new(), self.telemetry.is_ready(), String::new()));
        out
    }
}
