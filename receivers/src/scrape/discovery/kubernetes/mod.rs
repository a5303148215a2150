//! Kubernetes service discovery (`kubernetes_sd_configs`): targets found in
//! the API server's pods, endpoints, endpoint slices, services or nodes, with
//! Prometheus's `__meta_kubernetes_*` labels ([`roles`]), so relabel rules
//! written for Prometheus (or Alloy's `discovery.kubernetes`) work here
//! unchanged.
//!
//! The discoverer watches what its role needs ([`proflow_kube::Store`]: list,
//! then watch, resuming and relisting on its own), per watched namespace:
//! - `pod`: pods (and nodes with `attach_metadata.node`);
//! - `endpoints`: endpoints, services and pods;
//! - `endpointslice`: endpoint slices, services and pods;
//! - `service`: services;
//! - `node`: nodes;
//!
//! and namespaces with `attach_metadata.namespace`. Selectors go to the API
//! server with each list and watch. Once every cache has its first list, the
//! job gets the complete set of groups, and again (at most every 200 ms,
//! so a burst of changes is one update) whenever a watch brings a change
//! that changes the set.

pub mod roles;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proflow_kube::objects::{Namespace, Node, Resource};
use proflow_kube::{Client, Connect, Scope, Store, WatchLimits};
use proflow_model::memory::MemoryBudget;
use proflow_net::tls::ClientTls;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

use super::{Discoverer, Update, send_if_changed};
use crate::scrape::client::{ClientSettings, auth_header};
use crate::scrape::config::kubernetes::{KubernetesRole, KubernetesSdConfig};
use roles::Caches;

/// How long a burst of changes is gathered before the groups are rebuilt.
const SETTLE: Duration = Duration::from_millis(200);

/// The discoverer of one `kubernetes_sd_configs` item.
pub struct KubernetesDiscoverer {
    config: KubernetesSdConfig,
    client: Client,
    /// Where list pages are granted from, once given.
    memory: Option<proflow_model::memory::MemoryBudget>,
}

impl KubernetesDiscoverer {
    /// Connects (reads the kubeconfig, token and TLS files now); an error
    /// names the field.
    pub fn new(config: &KubernetesSdConfig) -> Result<Self, String> {
        let tls = config.tls_config.clone().unwrap_or_default();
        let auth = auth_header(ClientSettings {
            basic_auth: config.basic_auth.as_ref(),
            authorization: config.authorization.as_ref(),
            tls_config: config.tls_config.as_ref(),
            follow_redirects: config.follow_redirects,
        })?;
        let client = Client::new(&Connect {
            api_server: config.api_server.as_deref(),
            kubeconfig_file: config.kubeconfig_file.as_deref(),
            tls: ClientTls::from(&tls),
            auth,
            follow_redirects: config.follow_redirects,
        })?;
        Ok(KubernetesDiscoverer {
            config: config.clone(),
            client,
            memory: None,
        })
    }

    /// The namespaces to watch: `None` for all.
    fn namespaces(&self) -> Vec<Option<String>> {
        let mut names: Vec<Option<String>> = self
            .config
            .namespaces
            .names
            .iter()
            .cloned()
            .map(Some)
            .collect();
        if self.config.namespaces.own_namespace {
            names.push(Some(self.client.own_namespace().to_owned()));
        }
        names.dedup();
        if names.is_empty() {
            names.push(None);
        }
        names
    }

    fn scope(&self, namespace: Option<String>, role: KubernetesRole) -> Scope {
        let (label, field) = self.config.selector(role);
        Scope {
            namespace,
            label_selector: label.map(str::to_owned),
            field_selector: field.map(str::to_owned),
        }
    }

    /// Starts the watches the role needs.
    fn watch_all(&self, shutdown: &CancellationToken) -> Caches {
        use KubernetesRole as R;
        let role = self.config.role;
        let per_namespace = |role_of: R| -> Vec<Scope> {
            self.namespaces()
                .into_iter()
                .map(|ns| self.scope(ns, role_of))
                .collect()
        };
        let start_with = |scopes: Vec<Scope>| (self.client.clone(), scopes, self.memory.clone());
        fn start<K: Resource>(
            (client, scopes, memory): (Client, Vec<Scope>, Option<MemoryBudget>),
            shutdown: &CancellationToken,
        ) -> Vec<Store<K>> {
            scopes
                .into_iter()
                .map(|s| {
                    Store::watch_granted(
                        client.clone(),
                        s,
                        WatchLimits::default(),
                        memory.clone(),
                        shutdown.clone(),
                    )
                })
                .collect()
        }
        let mut caches = Caches {
            attach_node: self.config.attach_metadata.node && role != R::Node && role != R::Service,
            ..Caches::default()
        };
        match role {
            R::Pod => caches.pods = start(start_with(per_namespace(R::Pod)), shutdown),
            R::Endpoints => {
                caches.endpoints = start(start_with(per_namespace(R::Endpoints)), shutdown);
                caches.services = start(start_with(per_namespace(R::Service)), shutdown);
                caches.pods = start(start_with(per_namespace(R::Pod)), shutdown);
            }
            R::EndpointSlice => {
                caches.slices = start(start_with(per_namespace(R::EndpointSlice)), shutdown);
                caches.services = start(start_with(per_namespace(R::Service)), shutdown);
                caches.pods = start(start_with(per_namespace(R::Pod)), shutdown);
            }
            R::Service => caches.services = start(start_with(per_namespace(R::Service)), shutdown),
            R::Node => {}
        }
        if role == R::Node || caches.attach_node {
            caches.nodes =
                start::<Node>(start_with(vec![self.scope(None, R::Node)]), shutdown).pop();
        }
        if self.config.attach_metadata.namespace && role != R::Node {
            caches.namespaces =
                start::<Namespace>(start_with(vec![Scope::default()]), shutdown).pop();
        }
        caches
    }

    fn groups(&self, caches: &Caches) -> Vec<super::TargetGroup> {
        match self.config.role {
            KubernetesRole::Pod => roles::pod_groups(caches),
            KubernetesRole::Endpoints => roles::endpoints_groups(caches),
            KubernetesRole::EndpointSlice => roles::endpointslice_groups(caches),
            KubernetesRole::Service => roles::service_groups(caches),
            KubernetesRole::Node => roles::node_groups(caches),
        }
    }
}

#[async_trait]
impl Discoverer for KubernetesDiscoverer {
    fn describe(&self) -> String {
        format!(
            "kubernetes_sd role={} at {}",
            self.config.role.as_str(),
            self.client.base()
        )
    }

    fn grant_from(&mut self, memory: &MemoryBudget) {
        self.memory = Some(memory.clone());
    }

    async fn run(
        self: Box<Self>,
        provider: usize,
        updates: mpsc::Sender<Update>,
        shutdown: CancellationToken,
    ) {
        // The watches end with this discoverer, whatever ends it.
        let watches = shutdown.child_token();
        let _stop = watches.clone().drop_guard();
        let caches = self.watch_all(&watches);
        let notify = Arc::new(Notify::new());
        for s in &caches.pods {
            s.notify_on_change(&notify, &watches);
        }
        for s in &caches.services {
            s.notify_on_change(&notify, &watches);
        }
        for s in &caches.endpoints {
            s.notify_on_change(&notify, &watches);
        }
        for s in &caches.slices {
            s.notify_on_change(&notify, &watches);
        }
        if let Some(s) = &caches.nodes {
            s.notify_on_change(&notify, &watches);
        }
        if let Some(s) = &caches.namespaces {
            s.notify_on_change(&notify, &watches);
        }
        let mut last_sent = None;
        loop {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                () = updates.closed() => return,
                () = notify.notified() => {}
            }
            // Let a burst of events land before building the groups.
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(SETTLE) => {}
            }
            if !caches.synced() {
                continue;
            }
            let groups = self.groups(&caches);
            if !send_if_changed(&mut last_sent, groups, provider, &updates, &shutdown).await {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
