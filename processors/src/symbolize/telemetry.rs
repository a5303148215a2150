//! The symbolize processor's own metrics (`proflow_symbolize_*`): frames by
//! result, cache, debuginfod fetches, open files, stuck workers. Declared
//! here through the collector's [`Telemetry`]; the metrics every processor
//! has are the core's.

use proflow_core::telemetry::{Counters, Gauges, LabelSet, Telemetry, with_label};

/// Metric handle of a `symbolize` processor.
#[derive(Clone, Debug)]
pub struct SymbolizeTelemetry {
    id: LabelSet,
    frames: Counters,
    cache_hits: Counters,
    debuginfod_fetches: Counters,
    cache_entries: Gauges,
    open_files: Gauges,
    stuck_workers: Gauges,
    skipped_profiles: Counters,
}

impl SymbolizeTelemetry {
    /// The handle of the processor `id`, declaring the families the first time
    /// one is made.
    pub fn new(telemetry: &Telemetry, id: &str) -> Self {
        SymbolizeTelemetry {
            id: vec![("processor", id.to_owned())],
            frames: telemetry.counters(
                "symbolize_frames",
                "Frames a symbolize processor was asked to name, by result (symbolized, or why not: no_mapping, no_build_id, not_found, kernel_disabled, kernel_not_this_host, local_not_this_host, debuginfod_timeout)",
            ),
            cache_hits: telemetry.counters(
                "symbolize_cache_hits",
                "Addresses a symbolize processor named from its cache",
            ),
            debuginfod_fetches: telemetry.counters(
                "symbolize_debuginfod_fetches",
                "Debug files a symbolize processor fetched from debuginfod servers, by result (found, not_found: every server answered 404, error, over_budget: the in-flight budget had no room for the file, which is asked for again)",
            ),
            cache_entries: telemetry.gauges(
                "symbolize_cache_entries",
                "Symbolized addresses a symbolize processor keeps (bounded by symbol_cache_entries)",
            ),
            open_files: telemetry.gauges(
                "symbolize_open_files",
                "Files a symbolize processor holds open: up to open_binaries binaries or debug files, each with the debug file its .gnu_debuglink names, and the dwz files they need",
            ),
            stuck_workers: telemetry.gauges(
                "symbolize_stuck_workers",
                "Worker threads a symbolize processor gave up on (a batch took longer than 30s: a file system that does not answer) that have not returned yet; at most 2",
            ),
            skipped_profiles: telemetry.counters(
                "symbolize_skipped_profiles",
                "Profiles a symbolize processor passed on as they came without naming them, by reason (worker_timeout: their batch took longer than 30s; workers_stuck: the most workers that may be stuck are; worker_failed: the worker stopped)",
            ),
        }
    }

    /// `n` more frames with `result` (`symbolized` or the reason they were not).
    pub fn frames(&self, result: &str, n: u64) {
        if n > 0 {
            let labels = with_label(&self.id, "result", result);
            self.frames.get_or_create(&labels).inc_by(n);
        }
    }

    /// `n` more addresses named from the cache.
    pub fn cache_hits(&self, n: u64) {
        if n > 0 {
            self.cache_hits.get_or_create(&self.id).inc_by(n);
        }
    }

    /// One more fetch from debuginfod servers ended with `result`.
    pub fn debuginfod_fetch(&self, result: &str) {
        let labels = with_label(&self.id, "result", result);
        self.debuginfod_fetches.get_or_create(&labels).inc();
    }

    /// `n` more profiles passed on unnamed, for `reason`.
    pub fn skipped(&self, reason: &str, n: u64) {
        if n > 0 {
            let labels = with_label(&self.id, "reason", reason);
            self.skipped_profiles.get_or_create(&labels).inc_by(n);
        }
    }

    /// Worker threads given up on and not yet returned, now.
    pub fn stuck_workers(&self, n: usize) {
        self.stuck_workers.get_or_create(&self.id).set(n as i64);
    }

    /// Cache entries and open files now.
    pub fn state(&self, entries: usize, open_files: usize) {
        self.cache_entries
            .get_or_create(&self.id)
            .set(entries as i64);
        self.open_files
            .get_or_create(&self.id)
            .set(open_files as i64);
    }
}
