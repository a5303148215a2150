//! The `proflow` binary: command line, logging, signals, and the table of
//! every component type compiled in. How data moves lives in `proflow-core`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use proflow_config::{Document, LogFormat};
use proflow_core::registry::Registry;
use proflow_core::telemetry::{ConfigInfo, ConfigSource, Telemetry};
use proflow_core::topology::{self, Plan};
use tokio_util::sync::CancellationToken;

mod heap;
mod opamp;

/// With `alloc-jemalloc`, Rust's allocations go to jemalloc (glibc's malloc
/// stays for C libraries; [`heap`] tunes and trims that one only). Off by
/// default: glibc's allocator, tuned by [`heap`], had the lowest (or the same) peak RSS
/// on every path measured (BENCHMARKS.md, "Global allocator").
#[cfg(feature = "alloc-jemalloc")]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(
    name = "proflow",
    version,
    about = "A continuous-profiling collector: receive, process and export profiles."
)]
struct Cli {
    /// Config file (YAML). With no command, `proflow -c FILE` runs it.
    #[arg(short, long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the collector.
    Run,
    /// Check the config and print every problem; exit 1 if there is any.
    Validate,
    /// List the component types compiled in, with kind and stability.
    Components,
}

fn registry() -> Registry {
    Registry::new(
        proflow_receivers::factories()
            .into_iter()
            .chain(proflow_processors::factories())
            .chain(proflow_exporters::factories()),
    )
}

fn main() -> ExitCode {
    heap::limit_arenas();
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Components => {
            println!(
                "{:<10} {:<14} {:<12} DESCRIPTION",
                "KIND", "TYPE", "STABILITY"
            );
            for f in registry().iter() {
                println!(
                    "{:<10} {:<14} {:<12} {}",
                    f.kind.to_string(),
                    f.type_name,
                    f.stability.to_string(),
                    f.description
                );
            }
            ExitCode::SUCCESS
        }
        Command::Validate => {
            let Some(path) = cli.config else {
                eprintln!("error: give the config file with -c FILE");
                return ExitCode::from(2);
            };
            match load(&path) {
                Ok((plan, _)) => {
                    for w in &plan.warnings {
                        eprintln!("warning: {w}");
                    }
                    println!("{}: valid", path.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e:#}");
                    ExitCode::from(1)
                }
            }
        }
        Command::Run => {
            let Some(path) = cli.config else {
                eprintln!(
                    "error: give the config file with -c FILE (for example: proflow run -c examples/sidecar.yaml)"
                );
                return ExitCode::from(2);
            };
            let (plan, text) = match load(&path) {
                Ok(loaded) => loaded,
                Err(e) => {
                    eprintln!("{e:#}");
                    return ExitCode::from(1);
                }
            };
            if let Err(e) = init_logging(&plan.telemetry.log_level, plan.telemetry.log_format) {
                eprintln!("error: {e:#}");
                return ExitCode::from(1);
            }
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            let start = opamp::start_with(plan, text, &path);
            match runtime.block_on(run(path, start)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    eprintln!("error: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// Reads, parses and checks a config file; the error lists every problem.
/// With the plan, the file's text.
fn load(path: &Path) -> anyhow::Result<(Plan, String)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    let plan = plan_of(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((plan, text))
}

/// Parses and checks a config's text as `proflow validate` does.
fn plan_of(text: &str) -> Result<Plan, String> {
    plan_of_with_env(text, &|k| std::env::var(k).ok())
}

/// [`plan_of`], with `${env:...}` read from `env`.
fn plan_of_with_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Plan, String> {
    let doc =
        Document::parse_with_env(text, env).map_err(|e| format!("{} problem(s):\n{e}", e.len()))?;
    topology::plan(&doc, &registry()).map_err(|e| format!("{} problem(s):\n{e}", e.len()))
}

fn sha256_hex(bytes: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    proflow_model::otlp::hex(digest.as_ref())
}

/// Tells the status page which config runs now.
fn applied(telemetry: &Telemetry, text: &str, source: ConfigSource, origin: String) {
    telemetry.config_applied(ConfigInfo {
        hash: sha256_hex(text.as_bytes()),
        source,
        origin,
        applied_at: std::time::SystemTime::now(),
    });
}

fn init_logging(level: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(level).with_context(|| {
        format!(
            "invalid service.telemetry.log_level {level:?}: use trace, debug, info, warn or error"
        )
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}

async fn run(path: PathBuf, start: opamp::Start) -> anyhow::Result<()> {
    let opamp::Start {
        plan,
        text,
        source,
        origin,
        opamp,
        remote_hash,
    } = start;
    for w in &plan.warnings {
        tracing::warn!("{w}");
    }
    let telemetry = Arc::new(Telemetry::new());
    // Ends with the runtime.
    tokio::spawn(heap::trim_every(std::time::Duration::from_secs(10)));
    let stop_telemetry = CancellationToken::new();
    // `POST /-/reload` asks here (when service.telemetry.reload_endpoint).
    let (reload_tx, mut reload_rx) =
        tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<Result<String, String>>>(4);
    let started_telemetry = format!("{:?}", plan.telemetry);
    // Watched from the start: a SIGHUP while starting must not kill the
    // process, and no SIGTERM is missed while a reload runs.
    let mut stop = StopSignals::new();
    let mut hangup = ReloadSignal::new();
    let telemetry_task = match plan
        .telemetry
        .socket_addr()
        .map_err(|e| anyhow::anyhow!("{e}"))?
    {
        Some(addr) => {
            let tls = plan
                .telemetry
                .tls
                .clone()
                .map(|t| {
                    proflow_net::server::ServerTls::start(t, "telemetry", stop_telemetry.clone())
                })
                .transpose()
                .map_err(|e| anyhow::anyhow!("service.telemetry.{e}"))?;
            let listener = proflow_core::admin::bind(addr)
                .await
                .with_context(|| format!("cannot listen on service.telemetry.address {addr}: is another process using it?"))?;
            tracing::info!(address = %listener.local_addr().unwrap_or(addr), tls = tls.is_some(), "telemetry serving /metrics, /healthz, /readyz, /targets");
            let reload = plan.telemetry.reload_endpoint.then(|| reload_tx.clone());
            Some(tokio::spawn(proflow_core::admin::serve(
                telemetry.clone(),
                listener,
                tls,
                reload,
                stop_telemetry.clone(),
            )))
        }
        None => None,
    };
    let shutdown_timeout = plan.shutdown_timeout;
    let mut running = plan
        .start(telemetry.clone())
        .await
        .context("cannot start")?;
    applied(&telemetry, &text, source, origin);
    let (effective, _) = tokio::sync::watch::channel(text);
    let stop_opamp = CancellationToken::new();
    let opamp_origin = opamp.as_ref().map(opamp::endpoint).unwrap_or_default();
    let (opamp_task, mut remote_configs) = match &opamp {
        Some(settings) => {
            let (task, requests) = proflow_opamp::start(
                settings,
                proflow_opamp::Identity::of_this_process(opamp::mode(&telemetry)),
                telemetry.clone(),
                effective.subscribe(),
                remote_hash,
                stop_opamp.clone(),
            )
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            (Some(task), Some(requests))
        }
        None => (None, None),
    };
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "proflow is running");
    // Start-up code (config, TLS, component set-up) is not called again:
    // its pages go back to the page cache (see `heap`).
    heap::release_clean_file_pages();

    let receiver_failed = running.failed_token();
    let failed = loop {
        tokio::select! {
            _ = stop.recv() => break false,
            _ = receiver_failed.cancelled() => break true,
            _ = hangup.recv() => {
                tracing::info!(config = %path.display(), "SIGHUP: reloading the config");
                let _ = reload(&path, &mut running, &started_telemetry, &telemetry, &effective).await;
            }
            Some(reply) = reload_rx.recv() => {
                tracing::info!(config = %path.display(), "POST /-/reload: reloading the config");
                let _ = reply.send(reload(&path, &mut running, &started_telemetry, &telemetry, &effective).await);
            }
            Some(request) = opamp::next(&mut remote_configs) => {
                tracing::info!("the OpAMP server sent a config: validating and applying it");
                let result = opamp::apply(&request.config, &mut running, &started_telemetry, &telemetry, &effective, &opamp_origin).await;
                let _ = request.reply.send(result);
            }
        }
    };
    // A reload asked for from now on gets "stopping" instead of waiting.
    drop(reload_rx);
    stop_opamp.cancel();
    if let Some(task) = opamp_task {
        // It says goodbye to the server; bounded, as the server may be gone.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), task).await;
    }
    tracing::info!(
        ?shutdown_timeout,
        "stopping: receivers first, then draining exporter queues"
    );
    let report = running.shutdown().await;
    if report.all_delivered() {
        tracing::info!("stopped; every accepted profile was delivered");
    } else {
        for (exporter, n) in &report.undelivered {
            tracing::warn!(exporter = %exporter, undelivered = n, "profiles not delivered before shutdown_timeout");
        }
        for (exporter, lost) in &report.lost {
            if lost.dropped > 0 {
                tracing::warn!(exporter = %exporter, dropped = lost.dropped, "profiles dropped by this exporter's full queue while running (when_full: drop_newest)");
            }
            if lost.failed > 0 {
                tracing::warn!(exporter = %exporter, failed = lost.failed, "profiles this exporter gave up on while running (refused by its peer, or retries ran out)");
            }
        }
        tracing::warn!(
            undelivered = report.total_undelivered(),
            dropped = report.total_dropped(),
            failed = report.total_failed(),
            "stopped; not every accepted profile was delivered: {} left at shutdown, {} dropped by full queues, {} given up on",
            report.total_undelivered(),
            report.total_dropped(),
            report.total_failed()
        );
    }
    stop_telemetry.cancel();
    if let Some(t) = telemetry_task {
        let _ = t.await;
    }
    if failed {
        anyhow::bail!("a receiver stopped on its own (see the log above); stopped the collector");
    }
    Ok(())
}

/// Reads the config again and applies it to the running collector; the
/// summary, or every problem (the running config then stays). Counted in
/// `proflow_config_reloads_total` by result.
async fn reload(
    path: &Path,
    running: &mut topology::Running,
    started_telemetry: &str,
    telemetry: &Telemetry,
    effective: &tokio::sync::watch::Sender<String>,
) -> Result<String, String> {
    let result = reload_file(path, running, started_telemetry, telemetry, effective).await;
    telemetry.config_reloaded(ConfigSource::File, result.is_ok());
    result
}

async fn reload_file(
    path: &Path,
    running: &mut topology::Running,
    started_telemetry: &str,
    telemetry: &Telemetry,
    effective: &tokio::sync::watch::Sender<String>,
) -> Result<String, String> {
    if telemetry
        .config()
        .is_some_and(|c| c.source == ConfigSource::OpAmp)
    {
        let why = "not reloaded: the running config is the OpAMP server's; change it there, or set service.opamp.accepts_remote_config: false in the file and restart (a local reload would leave the server believing its config runs)";
        tracing::error!("{why}");
        return Err(why.to_owned());
    }
    let (plan, text) = match load(path) {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::error!("the new config is refused; the running config stays:\n{e:#}");
            return Err(format!("not reloaded; the running config stays:\n{e:#}"));
        }
    };
    let summary = apply_plan(plan, running, started_telemetry).await?;
    applied(
        telemetry,
        &text,
        ConfigSource::File,
        path.display().to_string(),
    );
    effective.send_replace(text);
    Ok(summary)
}

/// Applies a checked config to the running collector; the summary, or
/// every problem (what could not be applied; the rest runs).
async fn apply_plan(
    plan: Plan,
    running: &mut topology::Running,
    started_telemetry: &str,
) -> Result<String, String> {
    for w in &plan.warnings {
        tracing::warn!("{w}");
    }
    if format!("{:?}", plan.telemetry) != started_telemetry {
        tracing::warn!(
            "service.telemetry changes (address, tls, logging, reload_endpoint) apply at the next restart only"
        );
    }
    match running.reload(plan).await {
        Ok(report) => {
            let summary = format!(
                "started {:?}, stopped {:?}, kept {} component(s)",
                report.started,
                report.stopped,
                report.kept.len()
            );
            if !report.errors.is_empty() {
                tracing::error!(started = ?report.started, stopped = ?report.stopped, errors = ?report.errors, "config partly reloaded");
                return Err(format!(
                    "partly reloaded ({summary}); not applied:\n{}",
                    report.errors.join("\n")
                ));
            }
            tracing::info!(started = ?report.started, stopped = ?report.stopped, kept = ?report.kept, "config reloaded");
            Ok(summary)
        }
        Err(e) => {
            tracing::error!(error = %e, "the new config cannot be started; the running config stays");
            Err(format!("not reloaded; the running config stays:\n{e}"))
        }
    }
}

/// SIGTERM / SIGINT: stop. Watched from the start, so none is missed
/// while a reload runs.
struct StopSignals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

/// SIGHUP: reload.
struct ReloadSignal {
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

#[cfg(unix)]
fn watch_signal(
    kind: tokio::signal::unix::SignalKind,
    name: &str,
) -> Option<tokio::signal::unix::Signal> {
    match tokio::signal::unix::signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch {name}");
            None
        }
    }
}

impl StopSignals {
    fn new() -> Self {
        StopSignals {
            #[cfg(unix)]
            term: watch_signal(tokio::signal::unix::SignalKind::terminate(), "SIGTERM"),
            #[cfg(unix)]
            int: watch_signal(tokio::signal::unix::SignalKind::interrupt(), "SIGINT"),
        }
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
                match s {
                    Some(s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                _ = next(&mut self.term) => tracing::info!("SIGTERM received"),
                _ = next(&mut self.int) => tracing::info!("SIGINT received"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

impl ReloadSignal {
    fn new() -> Self {
        ReloadSignal {
            #[cfg(unix)]
            hup: watch_signal(
                tokio::signal::unix::SignalKind::hangup(),
                "SIGHUP (no reload by signal)",
            ),
        }
    }

    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(h) = &mut self.hup {
            h.recv().await;
            return;
        }
        std::future::pending::<()>().await
    }
}

#[cfg(test)]
mod tests {
    /// The registry holds exactly the components whose features this build
    /// has, named `<kind>-<type>` like the features.
    #[test]
    fn registry_lists_exactly_the_compiled_components() {
        let compiled: Vec<String> = super::registry()
            .iter()
            .map(|f| format!("{}-{}", f.kind, f.type_name))
            .collect();
        let features = [
            (cfg!(feature = "receiver-ebpf"), "receiver-ebpf"),
            (cfg!(feature = "receiver-kafka"), "receiver-kafka"),
            (cfg!(feature = "receiver-otlp"), "receiver-otlp"),
            (cfg!(feature = "receiver-pprof_push"), "receiver-pprof_push"),
            (cfg!(feature = "receiver-scrape"), "receiver-scrape"),
            (cfg!(feature = "processor-aggregate"), "processor-aggregate"),
            (
                cfg!(feature = "processor-k8s_attributes"),
                "processor-k8s_attributes",
            ),
            (cfg!(feature = "processor-relabel"), "processor-relabel"),
            (cfg!(feature = "processor-symbolize"), "processor-symbolize"),
            (
                cfg!(feature = "processor-trace_link"),
                "processor-trace_link",
            ),
            (cfg!(feature = "exporter-file"), "exporter-file"),
            (cfg!(feature = "exporter-kafka"), "exporter-kafka"),
            (cfg!(feature = "exporter-nop"), "exporter-nop"),
            (cfg!(feature = "exporter-otlp"), "exporter-otlp"),
            (cfg!(feature = "exporter-parca"), "exporter-parca"),
            (cfg!(feature = "exporter-pyroscope"), "exporter-pyroscope"),
        ];
        let enabled: Vec<&str> = features
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| *name)
            .collect();
        assert_eq!(compiled, enabled);
    }
}
