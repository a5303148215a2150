//! The `scrape` receiver: Prometheus-style `scrape_configs` that pull pprof
//! profiles from `/debug/pprof` endpoints, as Parca and Grafana Alloy's
//! `pyroscope.scrape` do.
//!
//! - [`config`]: the config (Prometheus's names, Alloy's defaults).
//! - [`discovery`]: where targets come from (static, file, HTTP); a new kind
//!   is one more [`discovery::Discoverer`].
//! - [`targets`]: discovered groups → relabelled targets, one per address
//!   and enabled profile, with their URL and series labels.
//! - [`manager`]: per job, keeps one scrape loop per target as discovery
//!   changes, and the job's view for `/targets`.
//! - [`scrape_loop`]: a target's loop (offset, timeout, checks, delta,
//!   hand-off to the pipeline).
//! - [`delta`]: cumulative → delta for memory, mutex and block profiles,
//!   with bounded state.
//! - [`client`]: the HTTP client of scrapes and HTTP SD.
//! - [`status`]: health, last scrape and last error of each target.
//!
//! Profiles other than cumulative ones leave as they arrived (the gzip
//! bytes, never decoded here); cumulative ones are decoded once to
//! subtract the previous scrape and re-encoded.

pub mod client;
pub mod config;
pub mod delta;
pub mod discovery;
pub mod manager;
pub mod scrape_loop;
pub mod status;
pub mod targets;
pub mod telemetry;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proflow_core::component::no_problems;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Receiver, ReceiverConfig, ReceiverContext, ServeFuture,
    Validate,
};
use proflow_core::telemetry::{TargetsView, Telemetry};
use proflow_model::model::BatchMeta;
use telemetry::ScrapeTelemetry;

use client::{ClientSettings, HttpClient};
pub use config::ScrapeReceiverConfig;
use delta::DeltaStore;
use discovery::Discoverer;
use manager::SharedView;
use targets::JobSpec;

impl Validate for ScrapeReceiverConfig {
    fn validate(&self) -> Vec<FieldError> {
        self.problems()
    }
}

/// One job ready to run.
struct Job {
    spec: Arc<JobSpec>,
    client: HttpClient,
    discoverers: Vec<Box<dyn Discoverer>>,
    view: SharedView,
}

/// The built receiver: jobs with their clients and discoverers.
pub struct ScrapeReceiver {
    jobs: Vec<Job>,
    scrape: ScrapeTelemetry,
    deltas: Arc<DeltaStore>,
    /// On `/targets` while the receiver runs.
    targets: TargetsView,
    telemetry: Arc<Telemetry>,
}

impl ReceiverConfig for ScrapeReceiverConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Receiver>, BuildError> {
        no_problems(self.problems())?;
        let mut jobs = Vec::new();
        let mut views = Vec::new();
        for (i, job) in self.scrape_configs.iter().enumerate() {
            let at = |e: String| BuildError::new(format!("scrape_configs.{i}: {e}"));
            let spec = Arc::new(JobSpec::new(job).map_err(at)?);
            // The client loads the system's CA roots only with a tls_config;
            // an https job needs them without one.
            let default_tls = config::ClientTlsSettings::default();
            let tls_config = job
                .tls_config
                .as_ref()
                .or((job.scheme == config::Scheme::Https).then_some(&default_tls));
            let client = client::build(
                ClientSettings {
                    basic_auth: job.basic_auth.as_ref(),
                    authorization: job.authorization.as_ref(),
                    tls_config,
                    follow_redirects: job.follow_redirects,
                },
                job.timeout().min(Duration::from_secs(10)),
            )
            .map_err(at)?;
            let discoverers = discovery::discoverers(job).map_err(at)?;
            let view = SharedView::default();
            views.push((job.job_name.clone(), view.clone()));
            jobs.push(Job {
                spec,
                client,
                discoverers,
                view,
            });
        }
        Ok(Box::new(ScrapeReceiver {
            jobs,
            scrape: ScrapeTelemetry::new(&ctx.telemetry, &ctx.id),
            deltas: DeltaStore::new(
                usize::try_from(self.max_delta_state.bytes()).unwrap_or(usize::MAX),
            ),
            targets: Arc::new(move || manager::views_json(&views)),
            telemetry: ctx.telemetry.clone(),
        }))
    }
}

#[async_trait]
impl Receiver for ScrapeReceiver {
    async fn start(self: Box<Self>, ctx: ReceiverContext) -> Result<ServeFuture, BuildError> {
        let meta = Arc::new(BatchMeta {
            receiver: ctx.id.as_str().into(),
            tenant: None,
            tenant_bound: false,
            client: None,
            this_host: false,
        });
        let mut tasks = tokio::task::JoinSet::new();
        for job in self.jobs {
            let shared = Arc::new(scrape_loop::JobShared {
                job: job.spec,
                client: job.client,
                consumer: ctx.consumer.clone(),
                receiver: ctx.telemetry.clone(),
                scrape: self.scrape.clone(),
                meta: meta.clone(),
                memory: ctx.memory.clone(),
                deltas: self.deltas.clone(),
            });
            tasks.spawn(manager::run_job(
                shared,
                job.discoverers,
                job.view,
                ctx.shutdown.clone(),
            ));
        }
        // On `/targets` from its start (a config a reload refuses never
        // shows) until it stops (a receiver a reload removes leaves).
        let (telemetry, targets, id) = (self.telemetry, self.targets, ctx.id.clone());
        telemetry.register_targets(&id, targets.clone());
        Ok(Box::pin(async move {
            while tasks.join_next().await.is_some() {}
            telemetry.unregister_targets(&id, &targets);
        }))
    }
}
