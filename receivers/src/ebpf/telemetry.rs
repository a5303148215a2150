//! The eBPF receiver's own metrics (`proflow_ebpf_*`): samples read, lost and
//! dropped, how user stacks were unwound, the state it holds. Declared here
//! through the collector's [`Telemetry`]; the metrics every receiver has are
//! the core's.

use proflow_core::telemetry::{Counters, Gauges, LabelSet, Telemetry, with_label};

/// Metric handle of an eBPF receiver.
#[derive(Clone, Debug)]
pub struct EbpfTelemetry {
    id: LabelSet,
    samples: Counters,
    sample_bytes: Counters,
    user_stacks: Counters,
    samples_lost: Counters,
    samples_dropped: Counters,
    processes: Gauges,
    symbol_cache_entries: Gauges,
    state_bytes: Gauges,
    state_refusals: Counters,
}

impl EbpfTelemetry {
    /// The handle of the receiver `id`, declaring the families the first time
    /// one is made.
    pub fn new(telemetry: &Telemetry, id: &str) -> Self {
        EbpfTelemetry {
            id: vec![("receiver", id.to_owned())],
            samples: telemetry.counters(
                "ebpf_samples",
                "CPU samples an eBPF receiver took in user space (kernel threads and every process, idle excluded)",
            ),
            sample_bytes: telemetry.counters(
                "ebpf_sample_bytes",
                "Bytes of sample records read from the kernel (stacks and the copied user stack)",
            ),
            user_stacks: telemetry.counters(
                "ebpf_user_stacks",
                "User stacks by how they were unwound (complete: .eh_frame to the outermost frame; frame_pointers: the kernel's walk went further; truncated; none)",
            ),
            samples_lost: telemetry.counters(
                "ebpf_samples_lost",
                "CPU samples lost in the kernel because the ring buffer was full (raise ring_buffer_size)",
            ),
            samples_dropped: telemetry.counters(
                "ebpf_samples_dropped",
                "Samples (CPU ticks and off-CPU waits) an eBPF receiver did not keep, by reason (stacks_full, bad_record, filtered; off_cpu_rate, off_cpu_untracked and off_cpu_outside_syscall: waits the BPF program did not send)",
            ),
            processes: telemetry.gauges(
                "ebpf_processes",
                "Processes an eBPF receiver holds state for (mappings, labels, unwind tables)",
            ),
            symbol_cache_entries: telemetry.gauges(
                "ebpf_symbol_cache_entries",
                "Symbolized addresses an eBPF receiver keeps (bounded by symbol_cache_entries)",
            ),
            state_bytes: telemetry.gauges(
                "ebpf_state_bytes",
                "Memory an eBPF receiver keeps because of what the node's processes hold (perf map entries, unwind sections copied or inflated, interpreters' functions read), bounded by max_state_size",
            ),
            state_refusals: telemetry.counters(
                "ebpf_state_refusals",
                "What an eBPF receiver did not keep because max_state_size was used up, by use (perf_map: a map stopped at a line, at most once a second per process; unwind_section: a file's section left out)",
            ),
        }
    }

    /// `n` samples of `bytes` in all read from the kernel.
    pub fn samples(&self, n: u64, bytes: u64) {
        self.samples.get_or_create(&self.id).inc_by(n);
        self.sample_bytes.get_or_create(&self.id).inc_by(bytes);
    }

    /// `n` more user stacks unwound as `how`.
    pub fn unwound(&self, how: &str, n: u64) {
        if n > 0 {
            let labels = with_label(&self.id, "unwound", how);
            self.user_stacks.get_or_create(&labels).inc_by(n);
        }
    }

    /// `n` more samples the kernel could not hand over (ring buffer full).
    pub fn lost(&self, n: u64) {
        self.samples_lost.get_or_create(&self.id).inc_by(n);
    }

    /// A sample read but not kept, for `reason`.
    pub fn dropped(&self, reason: &str) {
        self.dropped_n(reason, 1);
    }

    /// `n` samples not kept, for `reason`.
    pub fn dropped_n(&self, reason: &str, n: u64) {
        if n > 0 {
            let labels = with_label(&self.id, "reason", reason);
            self.samples_dropped.get_or_create(&labels).inc_by(n);
        }
    }

    /// Processes held and symbol cache size now.
    pub fn state(&self, processes: usize, symbols: usize) {
        self.processes.get_or_create(&self.id).set(processes as i64);
        self.symbol_cache_entries
            .get_or_create(&self.id)
            .set(symbols as i64);
    }

    /// What the state budget holds now.
    pub fn state_bytes(&self, bytes: usize) {
        self.state_bytes
            .get_or_create(&self.id)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// `n` more refusals of the state budget for `what` (`perf_map`,
    /// `unwind_section`).
    pub fn state_refused(&self, what: &str, n: u64) {
        if n > 0 {
            let labels = with_label(&self.id, "use", what);
            self.state_refusals.get_or_create(&labels).inc_by(n);
        }
    }
}
