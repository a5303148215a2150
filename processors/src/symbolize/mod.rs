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
//! The lookups themselves are [`proflow_symbolize`], the same the
//! `ebpf` receiver uses. They read files and parse DWARF, and blazesym's
//! symbolizer stays on one thread, so each processor has one worker thread
//! that owns the caches and names one batch at a time; `process` hands it
//! the batch and waits. Should the worker ever panic, the batch goes on as
//! it came and the next batch starts a new worker (with empty caches).
//! Files are opened so that no open or read can wait on a FIFO or device
//! ([`proflow_symbolize::open`]); a file system that does not
//! answer can still hold a worker, so a batch waits at most 30 s, then the
//! worker is given up on (it ends, caches and all, when it returns) and a
//! new one starts, while at most [`MAX_STUCK_WORKERS`] are stuck.
//!
//! Local files and kallsyms serve by default only the batches this host
//! made ([`BatchMeta::this_host`]: the `ebpf` receiver's); see
//! [`config::HostSource`].
//! A profile with nothing to name (every location has lines) goes on as it
//! came: its bytes are decoded once to see that, and never re-encoded.

pub mod config;
pub mod debuginfod;
pub mod otlp;
pub mod profile;
pub mod sources;
pub mod telemetry;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use proflow_core::component::no_problems;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Processor, ProcessorConfig, Validate,
};
use proflow_model::model::{BatchMeta, Envelope, Format, Payload};
use proflow_model::otlp::SharedDictionary;
use proflow_net::http::{HttpClient, Options};
use proflow_symbolize::{Limits, Symbols};

pub use config::{DebuginfodConfig, HostSource, SymbolizeProcessorConfig};
use debuginfod::Debuginfod;
use sources::Sources;
use telemetry::SymbolizeTelemetry;

impl Validate for SymbolizeProcessorConfig {
    fn validate(&self) -> Vec<FieldError> {
        self.problems()
    }
}

impl ProcessorConfig for SymbolizeProcessorConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
        no_problems(self.problems())?;
        let telemetry = SymbolizeTelemetry::new(&ctx.telemetry, &ctx.id);
        let urls = self.debuginfod.resolved_urls();
        let debuginfod = if urls.is_empty() {
            None
        } else {
            let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                BuildError::new("debuginfod: the processor must be built on proflow's runtime")
            })?;
            let client = HttpClient::new(Options {
                tls: proflow_net::tls::ClientTls::default(),
                // An http server may redirect to https.
                load_roots: true,
                auth: None,
                follow_redirects: true,
                connect_timeout: std::time::Duration::from_secs(10),
            })
            .map_err(|e| BuildError::new(format!("debuginfod: {e}")))?;
            let d = &self.debuginfod;
            let cache_dir = d
                .prepared_cache_dir()
                .map_err(|e| BuildError::new(format!("debuginfod: {e}")))?;
            Some(Debuginfod::new(
                debuginfod::Settings {
                    urls,
                    cache_dir,
                    max_cache_size: d.max_cache_size.bytes(),
                    max_file_size: d.max_file_size.as_usize(),
                    negative_ttl: d.negative_ttl.get(),
                    fetch_timeout: d.fetch_timeout.get(),
                    max_concurrent_fetches: d.max_concurrent_fetches,
                    memory: ctx.memory.clone(),
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

/// Work for the worker.
enum Job {
    /// A batch, whether it was made on this host, and where its answer
    /// goes.
    Batch(
        Vec<Envelope>,
        bool,
        tokio::sync::oneshot::Sender<Vec<Envelope>>,
    ),
    /// Holds the worker until the sender is dropped or sends: a worker
    /// stuck in a file system, for tests.
    #[cfg(test)]
    Stall(mpsc::Receiver<()>),
}

/// Longest a batch waits for the worker. Naming a batch takes milliseconds
/// warm and seconds for new large files; past this the worker is taken to
/// be stuck (a file system that does not answer: files are opened so that
/// nothing else can block), given up on, and the batch goes on as it came.
const WORKER_TIMEOUT: Duration = Duration::from_secs(30);

/// Most workers given up on that may still be running (stuck). Past it no
/// new worker starts and batches go on unnamed at once, until one returns:
/// a file system that hangs every worker that touches it costs this many
/// threads and their caches, not one per timeout.
pub const MAX_STUCK_WORKERS: usize = 2;

/// The worker batches go to now.
struct Worker {
    jobs: mpsc::Sender<Job>,
    /// Which one it is (a timed-out batch gives up only on the worker it
    /// was sent to, not on one that replaced it since).
    number: u64,
    /// Set when it is given up on: it then ends after its current job,
    /// dropping its caches, rather than take more.
    abandoned: Arc<AtomicBool>,
    /// When it last moved (began a job or a profile of one), for telling a
    /// worker that is busy with earlier batches from a stuck one.
    progress: Progress,
}

/// When a worker last moved: milliseconds after its start.
#[derive(Clone)]
struct Progress {
    epoch: Instant,
    last_ms: Arc<std::sync::atomic::AtomicU64>,
}

impl Progress {
    fn new() -> Self {
        Progress {
            epoch: Instant::now(),
            last_ms: Arc::new(std::sync::atomic::AtomicU64::new(0)),
        }
    }

    fn moved(&self) {
        let now = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(now, Ordering::Relaxed);
    }

    fn since(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }
}

/// Counts a given-up worker off the stuck ones when its thread ends,
/// however it ends (a panic too).
struct StuckGuard {
    given_up: Arc<AtomicBool>,
    stuck: Arc<AtomicUsize>,
    telemetry: SymbolizeTelemetry,
}

impl Drop for StuckGuard {
    fn drop(&mut self) {
        if self.given_up.load(Ordering::SeqCst) {
            let left = self.stuck.fetch_sub(1, Ordering::SeqCst).saturating_sub(1);
            self.telemetry.stuck_workers(left);
            tracing::info!("symbolize: a worker given up on has returned and ended");
        }
    }
}

/// The processor's workers.
struct Workers {
    current: Option<Worker>,
    started: u64,
}

/// The running `symbolize` processor.
pub struct SymbolizeProcessor {
    config: SymbolizeProcessorConfig,
    debuginfod: Option<Arc<Debuginfod>>,
    workers: Mutex<Workers>,
    /// Workers given up on that have not ended yet.
    stuck: Arc<AtomicUsize>,
    worker_timeout: Duration,
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
        let p = SymbolizeProcessor {
            workers: Mutex::new(Workers {
                current: None,
                started: 0,
            }),
            stuck: Arc::new(AtomicUsize::new(0)),
            worker_timeout: WORKER_TIMEOUT,
            config: config.clone(),
            debuginfod,
            telemetry,
        };
        p.telemetry.stuck_workers(0);
        // The first worker starts now, so that a config it cannot run with
        // (no thread) shows at once in the log.
        if let Ok(mut w) = p.workers.lock() {
            p.current_worker(&mut w);
        }
        p
    }

    /// The current worker, started if there is none and fewer than
    /// [`MAX_STUCK_WORKERS`] are stuck; `None` otherwise.
    fn current_worker<'w>(&self, workers: &'w mut Workers) -> Option<&'w Worker> {
        if workers.current.is_none() && self.stuck.load(Ordering::SeqCst) < MAX_STUCK_WORKERS {
            workers.started += 1;
            workers.current = self.spawn_worker(workers.started);
        }
        workers.current.as_ref()
    }

    /// Starts worker `number`; it ends when its sender is dropped, or after
    /// the job during which it was given up on.
    fn spawn_worker(&self, number: u64) -> Option<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let abandoned = Arc::new(AtomicBool::new(false));
        let config = self.config.clone();
        let debuginfod = self.debuginfod.clone();
        let telemetry = self.telemetry.clone();
        let stuck = self.stuck.clone();
        let given_up = abandoned.clone();
        let progress = Progress::new();
        let moved = progress.clone();
        let started = std::thread::Builder::new()
            .name("symbolize".into())
            .spawn(move || {
                let _guard = StuckGuard {
                    given_up: given_up.clone(),
                    stuck,
                    telemetry: telemetry.clone(),
                };
                let mut state = State::new(&config, debuginfod);
                let wait = config.debuginfod.timeout.get();
                while let Ok(job) = rx.recv() {
                    match job {
                        Job::Batch(batch, this_host, reply) => {
                            moved.moved();
                            state.sources.begin_batch(Instant::now() + wait, this_host);
                            let mut named = HashMap::new();
                            let out: Vec<Envelope> = batch
                                .into_iter()
                                .map(|e| {
                                    moved.moved();
                                    state.envelope(e, &mut named, &telemetry)
                                })
                                .collect();
                            telemetry.cache_hits(state.symbols.take_hits());
                            telemetry.state(state.symbols.len(), state.symbols.open_files());
                            let _ = reply.send(out);
                        }
                        #[cfg(test)]
                        Job::Stall(until) => {
                            let _ = until.recv();
                        }
                    }
                    if given_up.load(Ordering::SeqCst) {
                        break;
                    }
                }
                // Given up on while stuck: its caches go with it now, and
                // (the guard) it no longer counts against MAX_STUCK_WORKERS.
                drop(state);
            });
        match started {
            Ok(_) => Some(Worker {
                jobs: tx,
                number,
                abandoned,
                progress,
            }),
            Err(e) => {
                tracing::error!(error = %e, "symbolize: could not start a worker thread; profiles go on unnamed");
                None
            }
        }
    }

    /// Gives up on worker `number` if it is still the current one: it is
    /// counted as stuck until it returns, and the next batch starts another
    /// (while fewer than [`MAX_STUCK_WORKERS`] are stuck).
    fn give_up_on(&self, number: u64) {
        let mut workers = lock(&self.workers);
        if workers.current.as_ref().is_some_and(|w| w.number == number)
            && let Some(w) = workers.current.take()
        {
            let stuck = self.stuck.fetch_add(1, Ordering::SeqCst) + 1;
            w.abandoned.store(true, Ordering::SeqCst);
            self.telemetry.stuck_workers(stuck);
            tracing::error!(
                stuck,
                "symbolize: a batch took more than {:?}; it goes on unnamed, the worker is given up on (at most {MAX_STUCK_WORKERS} may be stuck; past that profiles go on unnamed until one returns)",
                self.worker_timeout
            );
        }
    }

    /// Sends `job` to the current worker, starting one if needed; the
    /// number of the worker that took it, and how to see it move.
    fn send(&self, mut job: Job) -> Option<(u64, Progress)> {
        let mut workers = lock(&self.workers);
        for _ in 0..2 {
            let w = self.current_worker(&mut workers)?;
            match w.jobs.send(job) {
                Ok(()) => return Some((w.number, w.progress.clone())),
                Err(mpsc::SendError(back)) => {
                    // The worker ended (it panicked): a new one takes it.
                    tracing::error!("symbolize: the worker stopped; a new one starts");
                    workers.current = None;
                    job = back;
                }
            }
        }
        None
    }

    #[cfg(test)]
    fn stall_worker(&self) -> mpsc::Sender<()> {
        let (tx, rx) = mpsc::channel();
        self.send(Job::Stall(rx));
        tx
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl State {
    fn new(config: &SymbolizeProcessorConfig, debuginfod: Option<Arc<Debuginfod>>) -> State {
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
        State {
            sources,
            symbols: Symbols::new(limits, Some(config.debug_dirs.clone())),
        }
    }
}

#[async_trait]
impl Processor for SymbolizeProcessor {
    async fn process(&self, batch: Vec<Envelope>, meta: &BatchMeta) -> Vec<Envelope> {
        // Envelopes share their payloads: keeping a copy costs pointers, and
        // a batch whose work failed goes on as it came.
        let unchanged = batch.clone();
        let n = batch.len() as u64;
        let (reply, answer) = tokio::sync::oneshot::channel();
        let Some((number, progress)) = self.send(Job::Batch(batch, meta.this_host, reply)) else {
            self.telemetry.skipped(skip::WORKERS_STUCK, n);
            return unchanged;
        };
        let mut answer = answer;
        loop {
            match tokio::time::timeout(self.worker_timeout, &mut answer).await {
                Ok(Ok(out)) => return out,
                Ok(Err(_)) => {
                    tracing::error!(
                        "symbolize: the worker stopped during a batch; it goes on unnamed"
                    );
                    self.telemetry.skipped(skip::WORKER_FAILED, n);
                    return unchanged;
                }
                // Still on earlier batches, and moving: a backlog, not a
                // stuck file system. Wait on.
                Err(_) if progress.since() < self.worker_timeout => {}
                Err(_) => {
                    self.give_up_on(number);
                    self.telemetry.skipped(skip::WORKER_TIMEOUT, n);
                    return unchanged;
                }
            }
        }
    }
}

/// Why profiles went on unnamed (the `reason` label of
/// `proflow_symbolize_skipped_profiles_total`).
pub mod skip {
    /// Their batch took longer than the worker timeout (30s).
    pub const WORKER_TIMEOUT: &str = "worker_timeout";
    /// [`super::MAX_STUCK_WORKERS`] workers are stuck: no new one starts.
    pub const WORKERS_STUCK: &str = "workers_stuck";
    /// The worker stopped during their batch (it panicked).
    pub const WORKER_FAILED: &str = "worker_failed";
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
