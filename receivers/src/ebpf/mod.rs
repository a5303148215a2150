//! The `ebpf` receiver: system-wide CPU profiling of every process on the
//! node, with no change to any of them, as the Parca agent, Grafana Alloy's
//! `pyroscope.ebpf` and the OpenTelemetry eBPF profiler do.
//!
//! - `bpf/profile.bpf.c`: the BPF program (C, CO-RE, built by
//!   `scripts/build-bpf`; the object beside it is committed and embedded,
//!   so building proflow needs no clang). It runs on a cpu-clock perf event
//!   at `sample_rate` Hz on every CPU and sends each sample through a ring
//!   buffer.
//! - [`config`]: the config (Parca's and Alloy's names and defaults).
//! - [`ring`]: the ring buffer read in passes of a bounded number of
//!   records.
//! - [`sample`]: one ring-buffer record, read with every length checked.
//! - [`procs`]: processes (identity, labels, cgroup and container,
//!   mappings, ELF files with build ids and unwind sections).
//! - [`interp`]: what the interpreters whose frames the BPF program walks
//!   share: the walk's offsets, functions read from the process, their
//!   frames merged into the native stack.
//! - [`runtime`]: which runtime a process runs (an interpreter, a Go
//!   program, a JVM), and its entry in the BPF program's maps.
//! - [`python`]: CPython 3.8–3.13 processes: their interpreter found from
//!   its symbols, the offsets of each version, code objects read and named.
//! - [`golang`]: Go programs: the offsets to the running goroutine's
//!   pprof labels, by Go version.
//! - [`perl`]: Perl 5.36 processes: `PL_curinterp` and
//!   `Perl_runops_standard`, the offsets, subs read and named.
//! - [`ruby`]: Ruby 3.1 processes: `ruby_current_vm_ptr` and
//!   `rb_vm_exec`, the offsets, iseqs read and named; [`rubylines`]: their
//!   line tables decoded.
//! - [`php`]: PHP 8.2 processes: `executor_globals` and `execute_ex`, the
//!   offsets, functions read and named.
//! - [`jvm`]: HotSpot JVMs: their own struct tables read, the code cache,
//!   Java frames stepped in the copied stack and named (compiled scopes,
//!   line tables); [`jvmlines`]: their line tables and integers decoded.
//! - [`v8`]: Node (V8): the `v8dbg_*` metadata, JavaScript frames found
//!   by their frame pointers in V8's code, named and at their lines (with
//!   what optimized code inlined); [`v8lines`]: source position tables
//!   and line ends decoded.
//! - [`unwind`]: a sample's user stack (framehop, frame pointers, CPython's
//!   trampolines, Java frames).
//! - [`collector`]: samples → stacks → one profile per process (or
//!   service) per interval.
//! - [`symbols`]: addresses → functions, files and lines (blazesym).
//!
//! # How user stacks are unwound, and why this way
//!
//! Kernel stacks are walked in the kernel (`bpf_get_stack`). User stacks
//! are the hard part: most distribution C/C++ libraries and Rust release
//! builds have no frame pointers, so a frame-pointer walk stops (or goes
//! wrong) at the first such frame. The two known answers:
//!
//! 1. **Unwind tables in BPF maps** (the OpenTelemetry profiler): user space
//!    turns every binary's `.eh_frame` into compact tables loaded into BPF
//!    maps, and the BPF program unwinds in the kernel. Samples are
//!    aggregated in the kernel and only stack hashes cross over. This is the
//!    cheapest per sample at high rates, but it needs a table compiler and a
//!    bounded in-kernel DWARF interpreter that must pass the verifier, map
//!    memory for every binary on the node (the profiler's 250 MB and more),
//!    and a protocol to keep tables and processes in step.
//! 2. **Stack copy, unwound in user space** (perf's `--call-graph dwarf`,
//!    samply): the BPF program copies the user registers and the top of the
//!    user stack (here at most 16 KiB, page by page, stopping at the stack's
//!    end), and user space unwinds it with the binary's `.eh_frame`
//!    (framehop, which falls back to frame pointers where a module has no
//!    unwind information).
//!
//! proflow takes (2), with the kernel's own frame-pointer walk sent beside
//! the copy: when framehop does not reach the outermost frame (a stack
//! deeper than the copy), the frame-pointer stack is used if it has more
//! frames, so deep stacks of frame-pointer code (Go, the kernel's own
//! habit, most JITs) stay whole. Reasons:
//! - At the rates continuous profiling uses (19–100 Hz per CPU) the copy
//!   costs little: a sample is 3.6 KiB (kernel, frame-pointer and interpreter
//!   frames) plus the stack actually in use,
//!   typically a few KiB, so 19 Hz on 64 CPUs is a few MB/s, and framehop
//!   unwinds a stack in microseconds with its rule cache. Measured
//!   (`scripts/bench-ebpf`, BENCHMARKS.md, 99 Hz on 2 CPUs for 60 s): the BPF
//!   program takes about 6 µs per sample (0.116% of a core), the receiver's
//!   thread about 5 µs per sample once started (0.093%).
//! - Memory stays small: only each binary's `.eh_frame` (and
//!   `.eh_frame_hdr`) is kept, shared by every process that maps it, and no
//!   per-binary table is precomputed; the goal is ≤ 60 MB RSS.
//! - Correctness comes from a mature DWARF CFI evaluator (gimli, via
//!   framehop) rather than a subset that fits the verifier, including
//!   signal frames and prologues. Shown by the tests in `tests/ebpf.rs`:
//!   C built with `-fomit-frame-pointer`, a Rust release binary and Go
//!   (whose frameless leaf functions hide their caller from a frame-pointer
//!   walk; its `.debug_frame` does not) all unwind to `main` at the
//!   programs' 2:1 split. Frame pointers alone are not enough even where
//!   they are asked for: GCC 12 leaves them out of leaf functions with
//!   `-fno-omit-frame-pointer`, so a frame-pointer walk of such a build
//!   never sees the leaf's caller.
//! - Not measured here: approach (1) was not built, so its cost on this
//!   machine is not known; the published figures of the OpenTelemetry
//!   profiler are beside ours in BENCHMARKS.md.
//! - Its limit, said plainly: a frame deeper than 16 KiB of stack that
//!   has no frame pointer is lost (the stack ends there), where in-kernel
//!   unwinding has no such limit. Large stack buffers in outer frames hit
//!   this. The copy size is a constant of the BPF program (`STACK_COPY`).
//!
//! # Privileges
//!
//! Loading BPF and opening system-wide perf events needs root, or
//! CAP_BPF + CAP_PERFMON (kernel 5.8+); reading other processes' `/proc`
//! maps and files needs CAP_SYS_PTRACE too when not root. Without them the
//! receiver logs one error naming what is missing and stays idle; the rest
//! of the collector runs on.

pub mod collector;
pub mod config;
pub mod frame;
pub mod golang;
pub mod interp;
pub mod jvm;
pub mod jvmlines;
pub mod perfmap;
pub mod perl;
pub mod php;
pub mod procs;
pub mod pylines;
pub mod python;
pub mod ring;
pub mod ruby;
pub mod rubylines;
pub mod runtime;
pub mod sample;
pub mod state_budget;
pub mod symbols;
pub mod telemetry;
pub mod unwind;
pub mod v8;
pub mod v8lines;

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use aya::maps::{MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, PerfEvent};
use proflow_core::component::no_problems;
use proflow_core::component::{
    Admission, BuildContext, BuildError, ConsumeError, FieldError, Receiver, ReceiverConfig,
    ReceiverContext, ServeFuture, Validate,
};
use proflow_model::model::{Batch, BatchMeta, Envelope};
use proflow_relabel::Relabeler;

use collector::Collector;
pub use config::EbpfReceiverConfig;
use config::Symbolize;
use golang::GoProcValue;
use interp::InterpProcValue;
use procs::{Processes, RuntimeChange};
use proflow_symbolize::kallsyms::Kallsyms;
use runtime::{BpfValue, Runtimes};
use sample::Sample;
use symbols::Symbols;
use telemetry::EbpfTelemetry;

/// The BPF object built from `bpf/profile.bpf.c` by `scripts/build-bpf`.
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!("bpf/profile.bpf.o");

/// Counter slots of the BPF program's `counters` map.
const COUNT_LOST: u32 = 1;
/// Off-CPU waits past `max_rate` (`COUNT_OFFCPU_RATE`), and waits not noted
/// because the table of waiting threads was full.
const COUNT_OFFCPU_RATE: u32 = 5;
const COUNT_OFFCPU_UNTRACKED: u32 = 6;
/// Off-CPU waits outside a system call (a page fault): not sent.
const COUNT_OFFCPU_NO_SYSCALL: u32 = 7;

impl Validate for EbpfReceiverConfig {
    fn validate(&self) -> Vec<FieldError> {
        self.problems()
    }
}

impl ReceiverConfig for EbpfReceiverConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Receiver>, BuildError> {
        no_problems(self.problems())?;
        let relabel = Relabeler::new(&self.relabel_configs)?;
        Ok(Box::new(EbpfReceiver {
            config: self.clone(),
            relabel,
            ebpf: EbpfTelemetry::new(&ctx.telemetry, &ctx.id),
        }))
    }
}

pub struct EbpfReceiver {
    config: EbpfReceiverConfig,
    relabel: Relabeler,
    ebpf: EbpfTelemetry,
}

/// The capabilities this process lacks for loading BPF and sampling every
/// CPU (empty: it has them).
pub fn missing_capabilities() -> Vec<&'static str> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1 << cap) != 0;
    if has(CAP_SYS_ADMIN) {
        return Vec::new();
    }
    let mut missing = Vec::new();
    if !has(CAP_BPF) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) {
        missing.push("CAP_PERFMON");
    }
    missing
}

/// The BPF program loaded and attached to every online CPU, with its ring
/// buffer and counters.
struct Loaded {
    bpf: aya::Ebpf,
    ring: RingBuf<MapData>,
    /// Processes whose waits the off-CPU programs do not note (when on).
    offcpu_skip: Option<aya::maps::HashMap<MapData, SkipKey, u8>>,
    /// Runtime processes the BPF program reads: interpreters whose frames
    /// it walks, Go programs whose labels it reads.
    runtime_maps: Option<RuntimeMaps>,
    counters: PerCpuArray<MapData, u64>,
    /// CPUs the perf event is open on. A CPU that goes offline keeps its
    /// event (it samples again when the CPU returns); one that comes online
    /// later is added at the next interval.
    attached: std::collections::BTreeSet<u32>,
    sample_rate: u64,
}

impl Loaded {
    /// Opens the perf event on every online CPU that has none yet; returns
    /// how many were added.
    fn attach_new_cpus(&mut self) -> Result<usize, String> {
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| format!("cannot read {what}: {e}"))?;
        let program: &mut PerfEvent = self
            .bpf
            .program_mut("sample")
            .ok_or("the BPF object has no `sample` program")?
            .try_into()
            .map_err(|e| format!("the BPF object's `sample` is not a perf_event program: {e}"))?;
        let mut added = 0;
        for cpu in cpus {
            if self.attached.contains(&cpu) {
                continue;
            }
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(self.sample_rate),
                    false,
                )
                .map_err(|e| format!("cannot open the cpu-clock perf event on CPU {cpu}: {e}"))?;
            self.attached.insert(cpu);
            added += 1;
        }
        Ok(added)
    }
}

fn load(config: &EbpfReceiverConfig) -> Result<Loaded, String> {
    let missing = missing_capabilities();
    if !missing.is_empty() {
        return Err(format!(
            "cannot profile the system: this process lacks {} (run proflow as root, or grant them: setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep $(which proflow))",
            missing.join(" and ")
        ));
    }
    // Sized as for 8 CPUs when they cannot be counted.
    let cpus = aya::util::online_cpus().map_or(8, |c| c.len());
    let ring_size = u32::try_from(config.ring_size(cpus)).unwrap_or(1 << 30);
    let threshold_ns = config.off_cpu.as_ref().map_or(0, |o| {
        u64::try_from(o.threshold.get().as_nanos()).unwrap_or(u64::MAX)
    });
    let max_rate = config.off_cpu.as_ref().map_or(0, |o| o.max_rate);
    let mut bpf = aya::EbpfLoader::new()
        .map_max_entries("samples", ring_size)
        .override_global("offcpu_threshold_ns", &threshold_ns, true)
        .override_global("offcpu_max_rate", &max_rate, true)
        .load(BPF_OBJECT)
        .map_err(|e| format!("cannot load the BPF program: {e} ({e:?})"))?;
    let program: &mut PerfEvent = bpf
        .program_mut("sample")
        .ok_or("the BPF object has no `sample` program")?
        .try_into()
        .map_err(|e| format!("the BPF object's `sample` is not a perf_event program: {e}"))?;
    program
        .load()
        .map_err(|e| format!("the kernel refused the BPF program: {e} ({e:?})"))?;
    let ring = RingBuf::try_from(
        bpf.take_map("samples")
            .ok_or("the BPF object has no `samples` map")?,
    )
    .map_err(|e| format!("the `samples` map is not a ring buffer: {e}"))?;
    let counters = PerCpuArray::try_from(
        bpf.take_map("counters")
            .ok_or("the BPF object has no `counters` map")?,
    )
    .map_err(|e| format!("the `counters` map is not a per-CPU array: {e}"))?;
    let interp = aya::maps::HashMap::try_from(
        bpf.take_map("interp_procs")
            .ok_or("the BPF object has no `interp_procs` map")?,
    )
    .map_err(|e| format!("the `interp_procs` map is not a hash map: {e}"))?;
    let go = aya::maps::HashMap::try_from(
        bpf.take_map("go_procs")
            .ok_or("the BPF object has no `go_procs` map")?,
    )
    .map_err(|e| format!("the `go_procs` map is not a hash map: {e}"))?;
    let offcpu_skip = match config.off_cpu {
        Some(_) => {
            attach_off_cpu(&mut bpf)?;
            let map = bpf
                .take_map("offcpu_skip")
                .ok_or("the BPF object has no `offcpu_skip` map")?;
            Some(
                aya::maps::HashMap::try_from(map)
                    .map_err(|e| format!("the `offcpu_skip` map is not a hash map: {e}"))?,
            )
        }
        None => None,
    };
    let mut loaded = Loaded {
        bpf,
        offcpu_skip,
        runtime_maps: Some(RuntimeMaps { interp, go }),
        ring,
        counters,
        attached: Default::default(),
        sample_rate: config.sample_rate,
    };
    loaded.attach_new_cpus()?;
    Ok(loaded)
}

/// A process in the BPF program's `offcpu_skip` map (`struct proc_key`).
#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct SkipKey {
    tgid: u32,
    pad: u32,
    start_time: u64,
}

// SAFETY: plain integers, `repr(C)`, no padding left implicit.
unsafe impl aya::Pod for SkipKey {}

/// Attaches the off-CPU programs, to tracepoints only (no kprobe: some
/// kernels have none): `sched_switch` notes waits, `sys_enter` drops those
/// outside a system call, `sys_exit` sends them.
fn attach_off_cpu(bpf: &mut aya::Ebpf) -> Result<(), String> {
    let btf = aya::Btf::from_sys_fs()
        .map_err(|e| format!("off_cpu needs the kernel's BTF (/sys/kernel/btf/vmlinux): {e}"))?;
    for (program, tracepoint) in [
        ("offcpu_switch", "sched_switch"),
        ("offcpu_enter", "sys_enter"),
        ("offcpu_exit", "sys_exit"),
    ] {
        let p: &mut BtfTracePoint = bpf
            .program_mut(program)
            .ok_or_else(|| format!("the BPF object has no `{program}` program"))?
            .try_into()
            .map_err(|e| format!("`{program}` is not a BTF tracepoint program: {e}"))?;
        p.load(tracepoint, &btf).map_err(|e| {
            format!("the kernel refused the off-CPU program `{program}`: {e} ({e:?})")
        })?;
        p.attach()
            .map_err(|e| format!("cannot attach the off-CPU program to {tracepoint}: {e}"))?;
    }
    Ok(())
}

#[async_trait]
impl Receiver for EbpfReceiver {
    async fn start(self: Box<Self>, ctx: ReceiverContext) -> Result<ServeFuture, BuildError> {
        let id = ctx.id.clone();
        // Read before the programs are attached: reading them takes a while
        // (a tenth of a second; ten times that in a debug build), and the
        // samples taken meanwhile would wait in the ring buffer, of
        // processes that may be gone when they are read (and, for interpreters,
        // without the frames user space turns on at a process's first
        // sample).
        let kallsyms = (self.config.symbolize == Symbolize::Local).then(|| {
            let k = Kallsyms::from_proc();
            if k.is_empty() {
                tracing::warn!(
                    receiver = %id,
                    "/proc/kallsyms names no kernel symbol (kernel.kptr_restrict hides them from this user): kernel frames keep their addresses"
                );
            }
            k
        });
        let loaded = match load(&self.config) {
            Ok(l) => l,
            Err(e) => {
                // Not fatal: the other receivers serve on; this one idles.
                tracing::error!(receiver = %id, "{e}; this receiver is idle, the rest of the collector runs on");
                let shutdown = ctx.shutdown.clone();
                return Ok(Box::pin(async move { shutdown.cancelled().await }));
            }
        };
        // Loading parsed the kernel's BTF (several MB, freed now): give the
        // freed heap back rather than carry it as resident memory.
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only releases free heap memory.
        unsafe {
            libc::malloc_trim(0);
        }
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<Envelope>>(2);
        let stop = Arc::new(AtomicBool::new(false));
        let config = self.config.clone();
        let telemetry = self.ebpf.clone();
        let relabel = self.relabel.clone();
        let thread_stop = stop.clone();
        let sampler = std::thread::Builder::new()
            .name("proflow-ebpf".into())
            .spawn(move || {
                let symbols = local_symbols(&config, kallsyms);
                sample_loop(loaded, symbols, config, relabel, telemetry, tx, thread_stop)
            })
            .map_err(|e| BuildError::new(format!("cannot start the sampling thread: {e}")))?;
        tracing::info!(
            receiver = %id,
            sample_rate = self.config.sample_rate,
            "sampling every CPU"
        );
        let meta = Arc::new(BatchMeta {
            receiver: id.as_str().into(),
            tenant: None,
            tenant_bound: false,
            client: None,
            // Made here, from this host's processes: the symbolize processor
            // may read their files and this kernel's symbols.
            this_host: true,
        });
        let shutdown = ctx.shutdown.clone();
        Ok(Box::pin(async move {
            let forward = async {
                while let Some(envelopes) = rx.recv().await {
                    let n = envelopes.len() as u64;
                    let bytes: u64 = envelopes.iter().map(|e| e.size_bytes() as u64).sum();
                    match ctx
                        .consumer
                        .consume(Batch::new(envelopes, meta.clone()), Admission::Wait)
                        .await
                    {
                        Ok(()) => ctx.telemetry.accepted(n, bytes),
                        // A queue closes under a running receiver only when a
                        // reload retires its exporter: not a reason to stop.
                        Err(ConsumeError::ShuttingDown) if ctx.shutdown.is_cancelled() => break,
                        Err(e) => {
                            ctx.telemetry.refused("backpressure", n);
                            tracing::warn!(receiver = %id, "profiles of one interval not taken: {e}");
                        }
                    }
                }
            };
            // On shutdown the sampler sends what the interval has so far and
            // ends (it sees the flag within a poll timeout), which closes the
            // channel and so ends `forward` (the collector bounds this by its
            // shutdown timeout).
            let stop_on_shutdown = async {
                shutdown.cancelled().await;
                stop.store(true, Ordering::Relaxed);
                std::future::pending::<()>().await
            };
            tokio::select! {
                _ = forward => {}
                _ = stop_on_shutdown => {}
            }
            stop.store(true, Ordering::Relaxed);
            let _ = tokio::task::spawn_blocking(move || sampler.join()).await;
        }))
    }
}

fn unix_nanos(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The sampling thread: drains the ring buffer as samples arrive, and every
/// `collect_interval` hands the interval's profiles to the receiver's task.
fn sample_loop(
    mut loaded: Loaded,
    symbols: Option<Symbols>,
    config: EbpfReceiverConfig,
    relabel: Relabeler,
    telemetry: EbpfTelemetry,
    tx: tokio::sync::mpsc::Sender<Vec<Envelope>>,
    stop: Arc<AtomicBool>,
) {
    let mut collector = new_collector(&mut loaded, symbols, &config, relabel);
    let interval = config.collect_interval.get();
    let mut started = SystemTime::now();
    let mut next = Instant::now() + interval;
    let mut before = CountersBefore::default();
    let fd = loaded.ring.as_fd().as_raw_fd();
    let mut more = false;
    loop {
        let stopping = stop.load(Ordering::Relaxed);
        // The BPF program wakes this thread only when the ring is an eighth
        // full; otherwise it drains every 100 ms (not once per sample).
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        // After a full pass the ring may hold more: read on at once.
        if !stopping && !more {
            poll_readable(fd, wait);
        }
        more = drain_ring(&mut loaded, &mut collector, &telemetry, stopping);
        skip_dropped_off_cpu(&mut loaded, &mut collector);
        if stopping || Instant::now() >= next {
            let now = SystemTime::now();
            let envelopes = collector.flush(unix_nanos(started), unix_nanos(now));
            started = now;
            next += interval;
            if Instant::now() > next {
                next = Instant::now() + interval;
            }
            report_bpf_counters(&loaded, &telemetry, &mut before);
            report_collector_state(&mut collector, &telemetry, &mut before.refusals);
            match loaded.attach_new_cpus() {
                Ok(0) => {}
                Ok(n) => tracing::info!("sampling {n} more CPU(s) that came online"),
                Err(e) => tracing::warn!("{e}"),
            }
            if !envelopes.is_empty() && tx.blocking_send(envelopes).is_err() {
                return;
            }
        }
        if stopping {
            return;
        }
    }
}

/// The sampling thread's collector: its processes' state budget, interpreter
/// frames and perf map reading as configured.
fn new_collector(
    loaded: &mut Loaded,
    symbols: Option<Symbols>,
    config: &EbpfReceiverConfig,
    relabel: Relabeler,
) -> Collector {
    let mut procs = Processes::new(relabel, config.group_by)
        .with_state_budget(usize::try_from(config.max_state_size.bytes()).unwrap_or(usize::MAX));
    if symbols.is_none() {
        procs = procs.with_max_held(0);
    }
    let runtimes = Runtimes {
        python: config.python,
        php: config.php,
        perl: config.perl,
        ruby: config.ruby,
        jvm: config.jvm,
        node: config.node,
        go_labels: config.go_labels,
    };
    if let Some(maps) = loaded
        .runtime_maps
        .take()
        .filter(|_| runtimes != Runtimes::default())
    {
        procs = procs.with_runtimes(runtimes, runtime_sink(maps));
    }
    let procs = if config.perf_maps {
        procs.with_perf_maps(config.max_perf_map_size.bytes())
    } else {
        procs
    };
    Collector::new(procs, symbols, config.max_stacks, config.sample_rate)
}

/// Reads one pass of the ring buffer into `collector` (bounded unless
/// `stopping`); true when the pass was full and the ring may hold more.
fn drain_ring(
    loaded: &mut Loaded,
    collector: &mut Collector,
    telemetry: &EbpfTelemetry,
    stopping: bool,
) -> bool {
    // Bounded, so that a flood does not hold back the interval's end;
    // when stopping, everything already sent is read.
    let pass = ring::read_pass(
        &mut loaded.ring,
        (!stopping).then_some(ring::MAX_PASS),
        |item| match Sample::parse(item) {
            Ok(s) => {
                if let Err(d) = collector.add(&s) {
                    telemetry.dropped(d.as_str());
                }
            }
            Err(e) => {
                telemetry.dropped("bad_record");
                tracing::debug!("bad sample record: {e}");
            }
        },
    );
    if pass.records > 0 {
        telemetry.samples(pass.records, pass.bytes);
    }
    pass.full
}

/// Marks the processes the collector dropped as unprofiled for the off-CPU
/// programs (when on).
fn skip_dropped_off_cpu(loaded: &mut Loaded, collector: &mut Collector) {
    let dropped = collector.procs.take_dropped();
    if let Some(skip) = loaded.offcpu_skip.as_mut() {
        for key in dropped {
            let key = SkipKey {
                tgid: key.pid,
                pad: 0,
                start_time: key.start_time,
            };
            if let Err(e) = skip.insert(key, 1, 0) {
                tracing::debug!("cannot mark a process unprofiled for off_cpu: {e}");
            }
        }
    }
}

/// What the sampling thread last read of cumulative counters, so that each
/// interval reports the increase since.
#[derive(Default)]
struct CountersBefore {
    lost: u64,
    off_cpu_rate: u64,
    off_cpu_untracked: u64,
    off_cpu_no_syscall: u64,
    /// State budget refusals, by [`state_budget::Use::ALL`].
    refusals: [u64; state_budget::Use::ALL.len()],
}

/// Reports the BPF program's lost samples and off-CPU drops since the
/// last interval.
fn report_bpf_counters(loaded: &Loaded, telemetry: &EbpfTelemetry, before: &mut CountersBefore) {
    let lost: u64 = loaded
        .counters
        .get(&COUNT_LOST, 0)
        .map(|v| v.iter().sum())
        .unwrap_or(before.lost);
    if lost > before.lost {
        telemetry.lost(lost - before.lost);
        before.lost = lost;
    }
    for (slot, reason, before) in [
        (COUNT_OFFCPU_RATE, "off_cpu_rate", &mut before.off_cpu_rate),
        (
            COUNT_OFFCPU_UNTRACKED,
            "off_cpu_untracked",
            &mut before.off_cpu_untracked,
        ),
        (
            COUNT_OFFCPU_NO_SYSCALL,
            "off_cpu_outside_syscall",
            &mut before.off_cpu_no_syscall,
        ),
    ] {
        let now: u64 = loaded
            .counters
            .get(&slot, 0)
            .map(|v| v.iter().sum())
            .unwrap_or(*before);
        telemetry.dropped_n(reason, now.saturating_sub(*before));
        *before = now.max(*before);
    }
}

/// Reports the collector's state: its size, the state budget's use and
/// refusals since the last interval, and how stacks were unwound.
fn report_collector_state(
    collector: &mut Collector,
    telemetry: &EbpfTelemetry,
    refusals_before: &mut [u64; state_budget::Use::ALL.len()],
) {
    telemetry.state(collector.procs.len(), collector.symbol_entries());
    let state = collector.procs.state_budget();
    telemetry.state_bytes(state.used_bytes());
    for (what, before) in state_budget::Use::ALL.iter().zip(refusals_before) {
        let now = state.refusals(*what);
        telemetry.state_refused(what.as_str(), now.saturating_sub(*before));
        *before = now.max(*before);
    }
    for (how, n) in collector.take_unwound() {
        telemetry.unwound(how.as_str(), n);
    }
}

/// The symbolizer of `symbolize: local` (`kallsyms` is read only then),
/// with the kernel's symbols read before sampling started.
fn local_symbols(config: &EbpfReceiverConfig, kallsyms: Option<Kallsyms>) -> Option<Symbols> {
    let kallsyms = kallsyms?;
    let symbols = Symbols::new(
        symbols::Limits {
            max_entries: config.symbol_cache_entries,
            max_open: config.open_binaries,
            max_debug_info: config.max_debug_info.bytes(),
        },
        None,
    );
    Some(symbols.with_kallsyms(kallsyms))
}

/// The BPF program's maps of the processes whose runtime it reads.
struct RuntimeMaps {
    interp: aya::maps::HashMap<MapData, u32, InterpProcValue>,
    go: aya::maps::HashMap<MapData, u32, GoProcValue>,
}

/// Puts each runtime process found in its map of the BPF program
/// (`interp_procs`, `go_procs`), and takes each one gone out of them.
fn runtime_sink(mut maps: RuntimeMaps) -> procs::RuntimeSink {
    /// Puts `value` unless a later process has the pid (one whose pid was
    /// reused since, read again late).
    fn put<V: aya::Pod>(
        map: &mut aya::maps::HashMap<MapData, u32, V>,
        pid: u32,
        value: V,
        start_time: impl Fn(&V) -> u64,
    ) {
        if map
            .get(&pid, 0)
            .is_ok_and(|v| start_time(&v) > start_time(&value))
        {
            return;
        }
        if let Err(e) = map.insert(pid, value, 0) {
            tracing::debug!(pid, "cannot read a runtime's state: {e}");
        }
    }
    /// Removes the entry of `key`'s pid only if it is still that process's
    /// (a new process may have the pid by now).
    fn remove<V: aya::Pod>(
        map: &mut aya::maps::HashMap<MapData, u32, V>,
        key: procs::ProcKey,
        start_time: impl Fn(&V) -> u64,
    ) {
        if map
            .get(&key.pid, 0)
            .is_ok_and(|v| start_time(&v) == key.start_time)
        {
            let _ = map.remove(&key.pid);
        }
    }
    Box::new(move |change| match change {
        RuntimeChange::Put(pid, BpfValue::Interp(v)) => {
            put(&mut maps.interp, pid, v, |v| v.start_time);
        }
        RuntimeChange::Put(pid, BpfValue::Go(v)) => put(&mut maps.go, pid, v, |v| v.start_time),
        RuntimeChange::Remove(key) => {
            remove(&mut maps.interp, key, |v| v.start_time);
            remove(&mut maps.go, key, |v| v.start_time);
        }
    })
}

/// Waits until `fd` is readable or `timeout` passes.
fn poll_readable(fd: i32, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd, its count 1; poll only writes `revents`.
    unsafe {
        libc::poll(&mut pfd, 1, ms);
    }
}
