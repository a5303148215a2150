//! The `symbolize` processor: names the frames of profiles that arrive as
//! addresses (the `ebpf` receiver with `symbolize: none`, perf-based pprof,
//! native frames of other agents), so a flame graph shows functions, files
//! and lines instead of hex, before they reach a backend that cannot
//! symbolize.
//!
//! - [`config`]: the config (sources and cache bounds).
//! - [`sources`]: where a mapping's symbols are (this host's kallsyms, the
//!   local binary, a debug file by build id, debuginfod) and the address
//!   each needs.
//! - [`debuginfod`]: debug files fetched by build id, cached on disk.
//! - [`profile`]: naming a pprof profile's unnamed locations.
//! - [`otlp`]: naming the unnamed locations of an OTLP payload's dictionary
//!   (once per dictionary that payloads of one request share).
//!
//! The lookups themselves are [`proflow_pipeline::symbolize`], the same the
//! `ebpf` receiver uses. They read files and parse DWARF, and blazesym's
//! symbolizer stays on one thread, so each processor has one worker thread
//! that owns the caches and names one batch at a time; `process` hands it
//! the batch and waits. Should the worker ever panic, the batch goes on as
//! it came and the next batch starts a new worker (with empty caches).
//! A profile with nothing to name (every location has lines) goes on as it
//! came: its bytes are decoded once to see that, and never re-encoded.
//!
//! Local files and kallsyms serve by default only the batches this host
//! made ([`BatchMeta::this_host`]: the `ebpf` receiver's); see
//! [`config::HostSource`].

pub mod config;
pub mod debuginfod;
pub mod otlp;
pub mod profile;
pub mod sources;

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use proflow_pipeline::component::{
    BuildContext, BuildError, FieldError, Processor, ProcessorConfig, Validate,
};
use proflow_pipeline::http::{HttpClient, Options};
use proflow_pipeline::model::{BatchMeta, Envelope, Format, Payload};
use proflow_pipeline::otlp::SharedDictionary;
use proflow_pipeline::symbolize::{Limits, Symbols};
use proflow_pipeline::telemetry::SymbolizeTelemetry;

pub use config::{DebuginfodConfig, HostSource, SymbolizeProcessorConfig};
use debuginfod::Debuginfod;
use sources::Sources;

impl Validate for SymbolizeProcessorConfig {
    fn validate(&self) -> Vec<FieldError> {
        self.problems()
    }
}

impl ProcessorConfig for SymbolizeProcessorConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
        let problems = self.problems();
        if !problems.is_empty() {
            return Err(BuildError::new(
                proflow_pipeline::component::joined_problems(&problems),
            ));
        }
        let telemetry = ctx.telemetry.symbolize(&ctx.id);
        let urls = self.debuginfod.resolved_urls();
        let debuginfod = if urls.is_empty() {
            None
        } else {
            let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                BuildError::new("debuginfod: the processor must be built on proflow's runtime")
            })?;
            let client = HttpClient::new(Options {
                tls: proflow_pipeline::tls::ClientTls::default(),
                // An http server may redirect to https.
                load_roots: true,
                auth: None,
                follow_redirects: true,
                connect_timeout: std::time::Duration::from_secs(10),
            })
            .map_err(|e| BuildError::new(format!("debuginfod: {e}")))?;
            let d = &self.debuginfod;
            Some(Debuginfod::new(
                debuginfod::Settings {
                    urls,
                    cache_dir: d.resolved_cache_dir(),
                    max_cache_size: d.max_cache_size.bytes(),
                    max_file_size: d.max_file_size.as_usize(),
                    negative_ttl: d.negative_ttl.get(),
                    fetch_timeout: d.fetch_timeout.get(),
                    max_concurrent_fetches: d.max_concurrent_fetches,
                },
                client,
                runtime,
                telemetry.clone(),
            ))
        };
        Ok(Arc::new(SymbolizeProcessor::with_debuginfod(
            self, telemetry, debuginfod,
        )))
    }
}

/// What the worker owns: the sources' decisions and the symbol caches.
struct State {
    sources: Sources,
    symbols: Symbols,
}

/// A batch for the worker, whether it was made on this host, and where its
/// answer goes.
type Job = (
    Vec<Envelope>,
    bool,
    tokio::sync::oneshot::Sender<Vec<Envelope>>,
);

/// The running `symbolize` processor.
pub struct SymbolizeProcessor {
    config: SymbolizeProcessorConfig,
    debuginfod: Option<Arc<Debuginfod>>,
    worker: Mutex<mpsc::Sender<Job>>,
    telemetry: SymbolizeTelemetry,
}

impl SymbolizeProcessor {
    /// A processor without debuginfod.
    pub fn new(config: &SymbolizeProcessorConfig, telemetry: SymbolizeTelemetry) -> Self {
        SymbolizeProcessor::with_debuginfod(config, telemetry, None)
    }

    fn with_debuginfod(
        config: &SymbolizeProcessorConfig,
        telemetry: SymbolizeTelemetry,
        debuginfod: Option<Arc<Debuginfod>>,
    ) -> Self {
        SymbolizeProcessor {
            worker: Mutex::new(spawn_worker(
                config.clone(),
                debuginfod.clone(),
                telemetry.clone(),
            )),
            config: config.clone(),
            debuginfod,
            telemetry,
        }
    }
}

/// Starts a worker thread; it ends when its sender is dropped.
fn spawn_worker(
    config: SymbolizeProcessorConfig,
    debuginfod: Option<Arc<Debuginfod>>,
    telemetry: SymbolizeTelemetry,
) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let started = std::thread::Builder::new()
        .name("symbolize".into())
        .spawn(move || {
            let limits = Limits {
                max_entries: config.symbol_cache_entries,
                max_open: config.open_binaries,
                max_debug_info: config.max_debug_info.bytes(),
            };
            let mut sources = Sources::new(config.local, config.debug_dirs.clone(), config.kernel);
            if let Some(d) = debuginfod {
                // What an earlier run left over the cap goes first.
                debuginfod::trim(
                    &config.debuginfod.resolved_cache_dir(),
                    config.debuginfod.max_cache_size.bytes(),
                );
                sources = sources.with_debuginfod(d);
            }
            let mut state = State {
                sources,
                symbols: Symbols::new(limits, Some(config.debug_dirs.clone())),
            };
            let wait = config.debuginfod.timeout.get();
            while let Ok((batch, this_host, reply)) = rx.recv() {
                state.sources.begin_batch(Instant::now() + wait, this_host);
                let mut named = HashMap::new();
                let out: Vec<Envelope> = batch
                    .into_iter()
                    .map(|e| state.envelope(e, &mut named, &telemetry))
                    .collect();
                telemetry.cache_hits(state.symbols.take_hits());
                telemetry.state(state.symbols.len(), state.symbols.open_files());
                let _ = reply.send(out);
            }
        });
    if let Err(e) = started {
        // The batches go on unsymbolized (their jobs find no receiver).
        tracing::error!(error = %e, "symbolize: could not start its worker thread");
    }
    tx
}

/// Longest a batch waits for the worker. Naming a batch takes milliseconds
/// warm and seconds for new large files; past this the worker is taken to
/// be stuck (a file system that does not answer), replaced, and the batch
/// goes on as it came.
const WORKER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[async_trait]
impl Processor for SymbolizeProcessor {
    async fn process(&self, batch: Vec<Envelope>, meta: &BatchMeta) -> Vec<Envelope> {
        // Envelopes share their payloads: keeping a copy costs pointers, and
        // a batch whose work failed goes on as it came.
        let unchanged = batch.clone();
        let (reply, answer) = tokio::sync::oneshot::channel();
        {
            let mut worker = match self.worker.lock() {
                Ok(w) => w,
                Err(poisoned) => poisoned.into_inner(),
            };
            if let Err(mpsc::SendError(job)) = worker.send((batch, meta.this_host, reply)) {
                // The worker ended (it panicked): a new one takes this batch.
                tracing::error!("symbolize: the worker stopped; a new one starts");
                *worker = self.new_worker();
                let _ = worker.send(job);
            }
        }
        match tokio::time::timeout(WORKER_TIMEOUT, answer).await {
            Ok(Ok(out)) => out,
            Ok(Err(_)) => {
                tracing::error!("symbolize: the worker stopped during a batch; it goes on unnamed");
                unchanged
            }
            Err(_) => {
                tracing::error!(
                    "symbolize: a batch took more than {WORKER_TIMEOUT:?}; it goes on unnamed and a new worker takes the next ones"
                );
                let mut worker = match self.worker.lock() {
                    Ok(w) => w,
                    Err(poisoned) => poisoned.into_inner(),
                };
                *worker = self.new_worker();
                unchanged
            }
        }
    }
}

impl SymbolizeProcessor {
    fn new_worker(&self) -> mpsc::Sender<Job> {
        spawn_worker(
            self.config.clone(),
            self.debuginfod.clone(),
            self.telemetry.clone(),
        )
    }
}

/// The dictionaries of one batch already named, by the dictionary's address
/// and the series' pid: `None` when there was nothing to name.
type Named = HashMap<(usize, Option<u32>), Option<Arc<SharedDictionary>>>;

impl State {
    /// `e` with its frames named, or as it came when there is nothing to
    /// name.
    fn envelope(
        &mut self,
        e: Envelope,
        named: &mut Named,
        telemetry: &SymbolizeTelemetry,
    ) -> Envelope {
        let pid = e
            .labels
            .get("pid")
            .or_else(|| e.labels.get("process_pid"))
            .and_then(|p| p.parse().ok());
        if e.payload.has(Format::Pprof) {
            let Ok(profile) = e.payload.decoded() else {
                // Receivers check what they accept; what cannot be decoded
                // here goes on for the exporters to report.
                return e;
            };
            // Decoded now for this processor: named in place, not copied.
            let mut profile = Arc::unwrap_or_clone(profile);
            let (changed, counts) =
                profile::symbolize(&mut profile, pid, &mut self.sources, &mut self.symbols);
            for (result, n) in counts {
                telemetry.frames(result, n);
            }
            return if changed {
                Envelope {
                    payload: Payload::from_profile(profile),
                    ..e
                }
            } else {
                e
            };
        }
        let Ok(o) = e.payload.otlp() else {
            return e;
        };
        let key = (Arc::as_ptr(&o.dictionary) as usize, pid);
        let dictionary = match named.get(&key) {
            Some(d) => d.clone(),
            None => {
                let (d, counts) =
                    otlp::symbolize(&o.dictionary, pid, &mut self.sources, &mut self.symbols);
                for (result, n) in counts {
                    telemetry.frames(result, n);
                }
                named.insert(key, d.clone());
                d
            }
        };
        match dictionary {
            Some(d) => Envelope {
                payload: Payload::from_otlp(otlp::with_dictionary(&o, d)),
                ..e
            },
            None => e,
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod safety_tests;
