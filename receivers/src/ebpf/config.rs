//! The `ebpf` receiver's config. Names and defaults follow Parca's agent and
//! Grafana Alloy's `pyroscope.ebpf` (`sample_rate` 19 Hz, `collect_interval`
//! 15s), with Prometheus `relabel_configs` over the process discovery labels
//! as in Alloy's `discovery.process`.

use proflow_config::{ByteSize, Duration};
use proflow_core::component::FieldError;
use proflow_relabel::{self as relabel, RelabelConfig};
use serde::Deserialize;

/// Highest `sample_rate`: above it the sampler itself becomes the load.
pub const MAX_SAMPLE_RATE: u64 = 1000;

/// Config of the `ebpf` receiver.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct EbpfReceiverConfig {
    /// Samples per second on each CPU (a cpu-clock perf event). Default 19
    /// (Parca's and Alloy's): a prime, so sampling does not lock step with
    /// timers that run at round rates. At most 1000.
    #[serde(default = "default_sample_rate")]
    pub sample_rate: u64,
    /// How often each process's samples are sent as one profile. Default 15s.
    /// At least 1s.
    #[serde(default = "default_collect_interval")]
    pub collect_interval: Duration,
    /// `local` (default): frames get function names, files and lines here
    /// (kernel from /proc/kallsyms; user from ELF symbols and DWARF, with
    /// inlined functions and Rust/C++ demangling). `none`: profiles carry
    /// addresses, mappings and build ids only, for a downstream symbolizer.
    #[serde(default)]
    pub symbolize: Symbolize,
    /// `process` (default): one profile per process per interval, labelled
    /// with `pid`. `service`: the processes that end with the same labels
    /// (without `pid`) share one profile.
    #[serde(default)]
    pub group_by: GroupBy,
    /// Prometheus relabel rules run once per process over its discovery
    /// labels (`__meta_process_pid`, `__meta_process_comm`,
    /// `__meta_process_exe`, `__meta_process_cgroup`, `__meta_container_id`)
    /// and the default labels (`pid`, `comm`, `exe`, `container_id`). A
    /// `drop`/`keep` rule chooses which processes are profiled. Labels
    /// starting with `__` are removed afterwards.
    #[serde(default)]
    pub relabel_configs: Vec<RelabelConfig>,
    /// Size of the ring buffer that carries samples from the kernel: a power
    /// of two, at least 64KiB. A sample takes 3.6KiB plus the user stack copied
    /// (at most 16KiB, typically a few KiB); the ring is drained every 100 ms
    /// and when it is an eighth full. It is mapped twice, so it counts twice
    /// in RSS. Samples that find it full are counted in
    /// `proflow_ebpf_samples_lost_total`: raise it for high rates or a
    /// receiver that may stall. Default: a second of samples at 8KiB each,
    /// for every online CPU at `sample_rate` plus `off_cpu.max_rate`, rounded
    /// up to a power of two from 512KiB to 16MiB (2 CPUs at 19 Hz: 512KiB;
    /// 8 CPUs: 2MiB; 64 CPUs at 99 Hz: 16MiB, a third of a second).
    #[serde(default)]
    pub ring_buffer_size: Option<ByteSize>,
    /// Most symbolized addresses kept (per binary and offset). Default 100000.
    #[serde(default = "default_symbol_cache_entries")]
    pub symbol_cache_entries: usize,
    /// Most binaries whose symbol tables and DWARF stay open at once; the
    /// least recently used is closed beyond it. Default 32.
    #[serde(default = "default_open_binaries")]
    pub open_binaries: usize,
    /// Files whose DWARF (every `.debug_*` section, uncompressed) is larger
    /// are symbolized from their symbol table only (function names, no
    /// files, lines or inlined frames); files stay open while the DWARF of
    /// all open ones is at most twice this, and a file no new address needed for
    /// a minute is closed. Bounds the memory DWARF takes (about its own
    /// size while open). Default 16MiB.
    #[serde(default = "default_max_debug_info")]
    pub max_debug_info: ByteSize,
    /// Most distinct stacks held per interval over all processes; samples of
    /// new stacks beyond it are counted in
    /// `proflow_ebpf_samples_dropped_total{reason="stacks_full"}`. Default 200000.
    #[serde(default = "default_max_stacks")]
    pub max_stacks: usize,
    /// Name JIT code (Node `--perf-basic-prof`, CPython 3.12+ `-X perf`,
    /// the JVM's `jcmd PID Compiler.perfmap`, .NET
    /// `DOTNET_PerfMapEnabled=1`) from the `/tmp/perf-PID.map` the runtime
    /// writes, inside the process's own root. Default true. Works with
    /// `symbolize: none` too: no symbolizer downstream can read this host's
    /// maps.
    #[serde(default = "default_perf_maps")]
    pub perf_maps: bool,
    /// Most bytes of one process's perf map read (its entries take about
    /// that much memory while the process is sampled); functions past it
    /// stay unnamed. Default 16MiB.
    #[serde(default = "default_max_perf_map_size")]
    pub max_perf_map_size: ByteSize,
    /// Most memory the receiver keeps because of what the node's processes
    /// hold, together: their perf maps' entries, the unwind sections
    /// copied or inflated (those of files users can change, and compressed
    /// `.debug_frame`; kept in private files in `$TMPDIR`, mapped), and what was read of interpreters'
    /// functions (names, files, lines). What does not fit is refused,
    /// counted in `proflow_ebpf_state_refusals_total{use}`: a perf map
    /// stops at that line and reads on once room is freed, a section is
    /// left out (that file's frames are not unwound), a function read is
    /// used for its sample and not kept. Given back as
    /// processes exit and files are let go. Default 64MiB, so that the
    /// chart's agent stays within its memory limit whatever the node's
    /// users run.
    #[serde(default = "default_max_state_size")]
    pub max_state_size: ByteSize,
    /// Walk the Python frames of CPython 3.8 to 3.13 processes (found by
    /// the `python3.X` or `libpython3.X.so` they map; no flag or restart of
    /// theirs needed), and put them in the native stack where the
    /// interpreter ran them, named with their qualified name, file and
    /// line. Default true (as Alloy's `python_enabled`).
    #[serde(default = "default_python")]
    pub python: bool,
    /// Walk the PHP frames of PHP 8.2 processes without threads (the CLI,
    /// FPM, CGI: found by the `php8.2`, `php-fpm8.2`, `php-cgi8.2` or
    /// `libphp8.2.so` they map; no flag or extension of theirs needed), and
    /// put them in the native stack where `execute_ex` ran them, named
    /// `Class::method` or `function` (`{main}` for a file's own code) with
    /// file and line. Default true (as the OpenTelemetry eBPF profiler's
    /// `php` tracer).
    #[serde(default = "default_php")]
    pub php: bool,
    /// Walk the Perl subs of Perl 5.36 processes built with threads (Debian's
    /// `perl`, or a program embedding `libperl.so.5.36`; no flag or module
    /// of theirs needed), in their main thread, and put them in the native
    /// stack where `Perl_runops_standard` ran them, named `Package::sub`
    /// (`main::RUNTIME` for a file's own code) with file and line. Default
    /// true (as the OpenTelemetry eBPF profiler's `perl` tracer).
    #[serde(default = "default_perl")]
    pub perl: bool,
    /// Walk the Ruby frames of Ruby 3.1 processes (Debian's `ruby`, whose VM
    /// is `libruby-3.1.so`; no flag or gem of theirs needed), in their main
    /// thread, and put them in the native stack where `rb_vm_exec` ran
    /// them, named by their label (`handle`, `block in run`, `<main>`) with
    /// path and line. Default true (as the OpenTelemetry eBPF profiler's
    /// `ruby` tracer).
    #[serde(default = "default_ruby")]
    pub ruby: bool,
    /// Walk the Java frames of HotSpot JVMs (`libjvm.so`; Java 17 and 25
    /// tested; no flag, agent or perf map of theirs needed), in every
    /// thread, from HotSpot's own description of its structs: compiled and
    /// interpreted methods named `package/Class.method` with their source
    /// file at the line of their bytecode, a compiled frame as every
    /// method it was running (those the JIT inlined, where it recorded
    /// their scope). Where the JVM also writes a perf map, these names
    /// win.
    /// Default true (as the OpenTelemetry eBPF profiler's `hotspot`
    /// tracer).
    #[serde(default = "default_jvm")]
    pub jvm: bool,
    /// Name the JavaScript frames of Node processes (`node`, `nodejs`,
    /// `libnode.so`; Node 20 tested; no flag or perf map of theirs needed)
    /// from V8's post-mortem metadata in the binary: each frame V8 runs
    /// (interpreted, baseline or optimized) named by its function (or the
    /// name V8 inferred for an anonymous one) and its script, at its line
    /// (V8 11.3, Node 20; baseline frames at their function's first line),
    /// with the functions the optimizing compiler inlined as frames of their
    /// own. Where Node also writes a perf map (`--perf-basic-prof`), these
    /// names win.
    /// Default true (as the OpenTelemetry eBPF profiler's `v8` tracer).
    #[serde(default = "default_node")]
    pub node: bool,
    /// Read the pprof labels of the goroutine each sample of a Go program
    /// (Go 1.24 to 1.26) ran, set by `runtime/pprof.Do` or
    /// `pprof.SetGoroutineLabels` (as the Go OpenTelemetry profiling
    /// bridges set `span_id`), and put them on the sample, so that
    /// `trace_link` and the backends can use them without a profiling
    /// client. At most 10 labels a sample, keys cut to 32 bytes and values
    /// to 112. Default true (as the OpenTelemetry eBPF profiler's Go
    /// labels).
    #[serde(default = "default_go_labels")]
    pub go_labels: bool,
    /// Where threads wait, and how long: a profile named `off_cpu` per
    /// process beside `process_cpu`. Absent (default): off; `off_cpu: {}`
    /// turns it on with the defaults below.
    #[serde(default)]
    pub off_cpu: Option<OffCpuConfig>,
}

/// Off-CPU profiling: every wait of a user thread (it left the CPU to
/// sleep, for I/O, a lock, a timer; not a preemption) at least `threshold`
/// long is recorded with its stacks and how long it lasted, at most
/// `max_rate` a second per CPU.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OffCpuConfig {
    /// Shorter waits are not recorded. Default 1ms.
    #[serde(default = "default_off_cpu_threshold")]
    pub threshold: Duration,
    /// Most waits recorded per CPU per second; the ones past it are counted
    /// in `proflow_ebpf_samples_dropped_total{reason="off_cpu_rate"}`.
    /// Default 100.
    #[serde(default = "default_off_cpu_max_rate")]
    pub max_rate: u64,
}

/// Highest `off_cpu.max_rate`.
pub const MAX_OFF_CPU_RATE: u64 = 10_000;

/// Where frames get their names.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Symbolize {
    #[default]
    Local,
    None,
}

/// What one profile covers.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    #[default]
    Process,
    Service,
}

fn default_sample_rate() -> u64 {
    19
}
fn default_collect_interval() -> Duration {
    Duration::from_secs(15)
}
fn default_symbol_cache_entries() -> usize {
    100_000
}
fn default_open_binaries() -> usize {
    32
}
fn default_max_debug_info() -> ByteSize {
    ByteSize::mib(16)
}
fn default_max_stacks() -> usize {
    200_000
}
fn default_off_cpu_threshold() -> Duration {
    Duration::from_millis(1)
}
fn default_off_cpu_max_rate() -> u64 {
    100
}
fn default_perf_maps() -> bool {
    true
}
fn default_python() -> bool {
    true
}
fn default_php() -> bool {
    true
}
fn default_perl() -> bool {
    true
}
fn default_ruby() -> bool {
    true
}
fn default_jvm() -> bool {
    true
}
fn default_node() -> bool {
    true
}
fn default_go_labels() -> bool {
    true
}
fn default_max_perf_map_size() -> ByteSize {
    ByteSize::mib(16)
}
fn default_max_state_size() -> ByteSize {
    ByteSize::mib(64)
}

impl EbpfReceiverConfig {
    /// The ring buffer's size on a machine with `cpus` online CPUs:
    /// `ring_buffer_size`, or by default a second of 8KiB samples for every
    /// CPU at the sampling rate (and the off-CPU rate), a power of two from
    /// 512KiB to 16MiB.
    pub fn ring_size(&self, cpus: usize) -> u64 {
        match self.ring_buffer_size {
            Some(size) => size.bytes(),
            None => {
                let per_cpu = self
                    .sample_rate
                    .saturating_add(self.off_cpu.as_ref().map_or(0, |o| o.max_rate));
                (cpus as u64)
                    .saturating_mul(per_cpu)
                    .saturating_mul(8 << 10)
                    .checked_next_power_of_two()
                    .unwrap_or(u64::MAX)
                    .clamp(512 << 10, 16 << 20)
            }
        }
    }

    /// Every problem of this config.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut p = Vec::new();
        if self.sample_rate == 0 || self.sample_rate > MAX_SAMPLE_RATE {
            p.push(FieldError::new(
                "sample_rate",
                format!(
                    "{} Hz is out of range: use 1 to {MAX_SAMPLE_RATE} (19 is the usual rate)",
                    self.sample_rate
                ),
            ));
        }
        if self.collect_interval.get() < std::time::Duration::from_secs(1) {
            p.push(FieldError::new(
                "collect_interval",
                "must be at least 1s (15s is the usual interval)",
            ));
        }
        let ring = self.ring_buffer_size.map_or(1 << 20, |r| r.bytes());
        if ring < 64 << 10 || !ring.is_power_of_two() || ring > 1 << 30 {
            p.push(FieldError::new(
                "ring_buffer_size",
                format!("{ring} bytes: use a power of two from 64KiB to 1GiB, such as 4MiB"),
            ));
        }
        for (name, value) in [
            ("symbol_cache_entries", self.symbol_cache_entries),
            ("open_binaries", self.open_binaries),
            ("max_stacks", self.max_stacks),
        ] {
            if value == 0 {
                p.push(FieldError::new(name, "must be at least 1"));
            }
        }
        if let Some(off) = &self.off_cpu
            && (off.max_rate == 0 || off.max_rate > MAX_OFF_CPU_RATE)
        {
            p.push(FieldError::new(
                "off_cpu.max_rate",
                format!(
                    "{} waits a second per CPU is out of range: use 1 to {MAX_OFF_CPU_RATE} (100 is the default)",
                    off.max_rate
                ),
            ));
        }
        p.extend(
            relabel::validate_configs(&self.relabel_configs)
                .into_iter()
                .map(|e| FieldError::new(format!("relabel_configs.{}", e.path), e.message)),
        );
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> EbpfReceiverConfig {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn defaults_are_parcas_and_alloys() {
        let c = parse("{}");
        assert_eq!(c.sample_rate, 19);
        assert_eq!(c.collect_interval, Duration::from_secs(15));
        assert_eq!(c.symbolize, Symbolize::Local);
        assert_eq!(c.group_by, GroupBy::Process);
        assert_eq!(c.ring_buffer_size, None);
        // A second of 8KiB samples per CPU, at least 512KiB, at most 16MiB.
        assert_eq!(c.ring_size(2), 512 << 10);
        assert_eq!(c.ring_size(8), 2 << 20);
        assert_eq!(c.ring_size(1024), 16 << 20);
        assert_eq!(parse("sample_rate: 99").ring_size(64), 16 << 20);
        assert_eq!(parse("sample_rate: 997").ring_size(2), 16 << 20);
        assert_eq!(parse("off_cpu: {}").ring_size(2), 2 << 20);
        assert_eq!(parse("ring_buffer_size: 4MiB").ring_size(2), 4 << 20);
        assert!(c.perf_maps);
        assert!(c.python);
        assert!(c.php);
        assert!(c.go_labels);
        assert!(c.perl);
        assert!(c.ruby);
        assert!(c.jvm);
        assert!(c.node);
        assert!(!parse("php: false").php);
        assert_eq!(c.off_cpu, None);
        let on = parse("off_cpu: {}").off_cpu.unwrap();
        assert_eq!(on.threshold, Duration::from_millis(1));
        assert_eq!(on.max_rate, 100);
        assert_eq!(c.max_perf_map_size, ByteSize::mib(16));
        assert_eq!(c.max_state_size, ByteSize::mib(64));
        assert!(c.problems().is_empty());
    }

    #[test]
    fn every_problem_is_reported() {
        let c = parse(
            "sample_rate: 0\ncollect_interval: 100ms\nring_buffer_size: 3MiB\nmax_stacks: 0\noff_cpu: {max_rate: 0}\nrelabel_configs: [{action: replace, target_label: '0bad'}]\n",
        );
        let paths: Vec<String> = c.problems().into_iter().map(|p| p.path).collect();
        assert_eq!(
            paths,
            [
                "sample_rate",
                "collect_interval",
                "ring_buffer_size",
                "max_stacks",
                "off_cpu.max_rate",
                "relabel_configs.0.target_label"
            ],
            "{paths:?}"
        );
    }

    #[test]
    fn unknown_fields_and_values_are_refused() {
        assert!(serde_saphyr::from_str::<EbpfReceiverConfig>("sample_hz: 19").is_err());
        assert!(serde_saphyr::from_str::<EbpfReceiverConfig>("symbolize: remote").is_err());
    }
}
