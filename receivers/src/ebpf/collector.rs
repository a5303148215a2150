//! Samples → stacks → one pprof profile per series per interval.
//!
//! [`Collector::add`] takes one sample: finds its process, unwinds its user
//! stack (see the module docs of `ebpf` for how), symbolizes new addresses,
//! and counts the stack in the series of the process's labels. Stacks are
//! held as location indices of their series, so a stack seen a thousand
//! times is stored once. [`Collector::flush`] turns each series into a
//! profile and starts the next interval. Waits (off-CPU records) go to a
//! series of their own per label set, a profile named `off_cpu`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use framehop::x86_64::CacheX86_64;
use proflow_model::model::{Envelope, Labels, Payload, ValueType};
use proflow_model::pprof;

use super::frame::Frame;
use super::interp::{InterpFrame, Merged, merge};
use super::procs::{Binary, ProcKey, Process, Processes};
use super::runtime::Runtime;
use super::sample::{FLAG_OFF_CPU, Sample};
use super::symbols::{Line, Lines, Symbols};
pub use super::unwind::Unwound;
use super::unwind::user_stack;

/// Why a sample was not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Its process is not profiled (a relabel rule dropped it).
    Filtered,
    /// `max_stacks` distinct stacks are held already this interval.
    StacksFull,
}

impl Dropped {
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::Filtered => "filtered",
            Dropped::StacksFull => "stacks_full",
        }
    }
}

/// A mapping as a series refers to it.
#[derive(Debug)]
enum MapRef {
    Kernel,
    File {
        start: u64,
        end: u64,
        offset: u64,
        binary: Arc<Binary>,
    },
}

#[derive(Debug)]
struct Location {
    mapping: u32,
    addr: u64,
    lines: Lines,
}

/// What a series counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// CPU ticks: `process_cpu`, `cpu/nanoseconds` and `samples/count`.
    Cpu,
    /// Waits: `off_cpu`, `off_cpu/nanoseconds` (time waited) and
    /// `samples/count` (waits).
    OffCpu,
}

/// The samples of one label set in this interval.
#[derive(Debug)]
struct Series {
    kind: Kind,
    labels: Labels,
    mappings: Vec<MapRef>,
    mapping_index: HashMap<(usize, u64, u64), u32>,
    locations: Vec<Location>,
    location_index: HashMap<(u32, u64), u32>,
    /// Interpreter frames' locations by process, code object (function) and
    /// line (the processes of a `group_by: service` series have code objects
    /// of their own at the same addresses); one that could not be read is
    /// `(pid, 0, 0)`.
    interp_index: HashMap<(u32, u64, u32), u32>,
    /// Per stack and pprof labels (a Go goroutine's; mostly none):
    /// samples, and for waits their nanoseconds.
    stacks: HashMap<StackKey, (u64, u64)>,
    /// Stacks of `stacks` with labels of their own.
    labelled: usize,
}

/// Stacks with pprof labels of their own one series keeps per interval;
/// samples of new label sets past it are kept without their labels.
const MAX_LABELLED_STACKS: usize = 1024;

/// File lookups within an interval after which the pages read are
/// released, and how often at most.
const RELEASE_AFTER: u64 = 256;
const RELEASE_EVERY: Duration = Duration::from_millis(100);

/// A sample's own pprof labels (key, value), as the goroutine had them.
type SampleLabels = Box<[(Box<str>, Box<str>)]>;
/// A stack's locations (leaf first) and its sample's own labels.
type StackKey = (Box<[u32]>, SampleLabels);

impl Series {
    fn new(kind: Kind, labels: Labels) -> Self {
        Series {
            kind,
            labels,
            mappings: Vec::new(),
            mapping_index: HashMap::new(),
            locations: Vec::new(),
            location_index: HashMap::new(),
            interp_index: HashMap::new(),
            stacks: HashMap::new(),
            labelled: 0,
        }
    }

    /// Counts a sample of `stack` (waited `waited` ns): `Some(true)` when it
    /// is a new stack, taken only if there is `room` for one (`None` when
    /// there is not). A label set per
    /// request (a span id) must not take every stack of the node: past
    /// [`MAX_LABELLED_STACKS`] new stacks go unlabelled.
    fn count(&mut self, mut stack: StackKey, waited: u64, room: bool) -> Option<bool> {
        if !stack.1.is_empty()
            && self.labelled >= MAX_LABELLED_STACKS
            && !self.stacks.contains_key(&stack)
        {
            stack.1 = Box::default();
        }
        if let Some((n, ns)) = self.stacks.get_mut(&stack) {
            *n += 1;
            *ns = ns.saturating_add(waited);
            return Some(false);
        }
        if !room {
            return None;
        }
        if !stack.1.is_empty() {
            self.labelled += 1;
        }
        self.stacks.insert(stack, (1, waited));
        Some(true)
    }

    fn mapping(&mut self, key: (usize, u64, u64), make: impl FnOnce() -> MapRef) -> u32 {
        if let Some(&i) = self.mapping_index.get(&key) {
            return i;
        }
        let i = self.mappings.len() as u32;
        self.mappings.push(make());
        self.mapping_index.insert(key, i);
        i
    }
}

pub struct Collector {
    pub procs: Processes,
    symbols: Option<Symbols>,
    cache: CacheX86_64,
    series: HashMap<String, Series>,
    stacks: usize,
    max_stacks: usize,
    /// Collect intervals so far (processes remember the last they were in).
    interval: u64,
    period_ns: i64,
    /// User stacks by how they were found (indexed as [`Unwound::ALL`]),
    /// since [`Collector::take_unwound`].
    unwound: [u64; 4],
    /// When file pages were last released, and the symbolizer's files
    /// opened and file lookups then ([`Collector::release_pages_read`]).
    released: (Instant, (u64, u64)),
}

impl Collector {
    /// How user stacks were found since the last call.
    pub fn take_unwound(&mut self) -> [(Unwound, u64); 4] {
        let counts = std::mem::take(&mut self.unwound);
        std::array::from_fn(|i| (Unwound::ALL[i], counts[i]))
    }

    pub fn new(
        procs: Processes,
        symbols: Option<Symbols>,
        max_stacks: usize,
        sample_rate: u64,
    ) -> Self {
        Collector {
            procs,
            symbols,
            cache: CacheX86_64::new(),
            series: HashMap::new(),
            stacks: 0,
            max_stacks,
            interval: 1,
            period_ns: (1_000_000_000 / sample_rate.max(1)) as i64,
            unwound: [0; 4],
            released: (Instant::now(), (0, 0)),
        }
    }

    /// Within an interval, after a file was opened to be symbolized or
    /// [`RELEASE_AFTER`] lookups read files, at most every
    /// [`RELEASE_EVERY`]: the file pages read since go back to the page
    /// cache (as at each flush). The first interval opens every binary and
    /// debug file of the node (as does a burst of new programs); released
    /// only at its end, their pages were mapped all at once, the receiver's
    /// peak RSS. In the steady state, files are open already and few
    /// addresses new: pages are released at the flush only (the unwinder's
    /// sections read in place are not faulted in again and again).
    fn release_pages_read(&mut self) {
        let now = (self.files_opened(), self.file_lookups());
        let (at, (opened, lookups)) = self.released;
        let due = now.0 != opened || now.1.saturating_sub(lookups) >= RELEASE_AFTER;
        if due && at.elapsed() >= RELEASE_EVERY {
            let released = proflow_symbolize::resident::release_file_pages();
            tracing::trace!(mappings = released, "file pages released");
            self.released = (Instant::now(), now);
        }
    }

    fn files_opened(&self) -> u64 {
        self.symbols.as_ref().map_or(0, Symbols::files_opened)
    }

    fn file_lookups(&self) -> u64 {
        self.symbols.as_ref().map_or(0, Symbols::file_lookups)
    }

    pub fn symbol_entries(&self) -> usize {
        self.symbols.as_ref().map_or(0, Symbols::len)
    }

    /// Counts one sample.
    pub fn add(&mut self, s: &Sample<'_>) -> Result<(), Dropped> {
        self.release_pages_read();
        let key = ProcKey {
            pid: s.tgid,
            start_time: s.start_time,
        };
        let addr = (s.ip != 0).then_some(s.ip);
        let process = self.procs.get(key, s.comm, s.exe, addr, self.interval);
        if process.labels.is_none() {
            return Err(Dropped::Filtered);
        }
        let (native, how, java) = user_stack(&mut *process, &mut self.cache, s);
        let user = with_interpreter_frames(process.runtime.as_mut(), native, s);
        let user = with_java_frames(user, java);
        self.unwound[Unwound::ALL.iter().position(|&u| u == how).unwrap_or(3)] += 1;
        let Some((labels, series_key)) = &process.labels else {
            return Err(Dropped::Filtered);
        };
        let kind = if s.flags & FLAG_OFF_CPU != 0 {
            Kind::OffCpu
        } else {
            Kind::Cpu
        };
        let series_key = match kind {
            Kind::Cpu => std::borrow::Cow::Borrowed(series_key.as_str()),
            Kind::OffCpu => std::borrow::Cow::Owned(format!("off_cpu{series_key}")),
        };
        if !self.series.contains_key(series_key.as_ref()) {
            let mut labels = labels.clone();
            if kind == Kind::OffCpu {
                labels.set("__name__", "off_cpu");
            }
            self.series
                .insert(series_key.to_string(), Series::new(kind, labels));
        }
        let series = self
            .series
            .get_mut(series_key.as_ref())
            .expect("inserted above");

        let mut stack = Vec::with_capacity(s.kernel.len() + user.len());
        for (i, &addr) in s.kernel.iter().enumerate() {
            let frame = Frame {
                addr,
                is_return: i > 0,
            };
            let m = series.mapping((0, 0, 0), || MapRef::Kernel);
            let loc = location(
                series,
                m,
                frame,
                |symbols| symbols.kernel(frame.lookup()),
                &mut self.symbols,
            );
            stack.push(loc);
        }
        for frame in user {
            let frame = match frame {
                Merged::Native(f) => f,
                Merged::Interp(f) => {
                    stack.push(interp_location(
                        series,
                        key.pid,
                        process.runtime.as_mut(),
                        f,
                    ));
                    continue;
                }
            };
            let m = process.mapping(frame.addr).map(|m| {
                let key = (Arc::as_ptr(&m.binary) as usize, m.start, m.offset);
                let index = series.mapping(key, || MapRef::File {
                    start: m.start,
                    end: m.end,
                    offset: m.offset,
                    binary: m.binary.clone(),
                });
                (index, m)
            });
            let loc = match m {
                Some((index, mapping)) => location(
                    series,
                    index,
                    frame,
                    |symbols| super::symbols::user(symbols, mapping, frame.lookup()),
                    &mut self.symbols,
                ),
                // An address in no file mapping: JIT code named by its
                // runtime's perf map, else (the vdso, JIT code without a
                // map, a process gone before /proc was read) kept as an
                // address.
                None => jit_location(series, process, frame),
            };
            stack.push(loc);
        }
        let stack = (stack.into_boxed_slice(), sample_labels(s));
        let waited = if kind == Kind::OffCpu {
            s.off_cpu_ns
        } else {
            0
        };
        match series.count(stack, waited, self.stacks < self.max_stacks) {
            Some(new) => {
                self.stacks += usize::from(new);
                Ok(())
            }
            None => Err(Dropped::StacksFull),
        }
    }

    /// This interval's profiles, one per series, and a fresh interval.
    pub fn flush(&mut self, start_unix_nanos: i64, end_unix_nanos: i64) -> Vec<Envelope> {
        let series = std::mem::take(&mut self.series);
        self.stacks = 0;
        // Processes that exited, or were not sampled in this interval or the
        // one before, are let go.
        self.procs.sweep(self.interval.saturating_sub(1));
        if let Some(symbols) = &mut self.symbols {
            symbols.close_idle(proflow_symbolize::IDLE_CLOSE);
        }
        // The pages of the files read in place this interval (symbol
        // tables, DWARF, unwind sections) go back to the page cache, so RSS
        // holds what the next interval touches, not every page ever read.
        let released = proflow_symbolize::resident::release_file_pages();
        tracing::trace!(mappings = released, "file pages released");
        self.released = (Instant::now(), (self.files_opened(), self.file_lookups()));
        self.interval += 1;
        let symbolized = self.symbols.is_some();
        series
            .into_values()
            .filter(|s| !s.stacks.is_empty())
            .map(|s| {
                let labels = s.labels.clone();
                let (value, period) = match s.kind {
                    Kind::Cpu => ("cpu", self.period_ns),
                    Kind::OffCpu => ("off_cpu", 0),
                };
                let profile = to_pprof(
                    s,
                    self.period_ns,
                    start_unix_nanos,
                    end_unix_nanos,
                    symbolized,
                );
                Envelope {
                    labels,
                    start_unix_nanos,
                    end_unix_nanos,
                    sample_types: vec![
                        ValueType::new(value, "nanoseconds"),
                        ValueType::new("samples", "count"),
                    ],
                    period_type: Some(ValueType::new(value, "nanoseconds")),
                    period,
                    payload: Payload::from_profile(profile),
                }
            })
            .collect()
    }
}

fn empty() -> Lines {
    Arc::from(Vec::new())
}

/// The series' location of `frame` in mapping `m` (`u32::MAX`: none),
/// symbolizing it with `resolve` when new and symbols are on.
fn location(
    series: &mut Series,
    m: u32,
    frame: Frame,
    resolve: impl FnOnce(&mut Symbols) -> Lines,
    symbols: &mut Option<Symbols>,
) -> u32 {
    let addr = frame.lookup();
    if let Some(&i) = series.location_index.get(&(m, addr)) {
        return i;
    }
    let lines = match symbols {
        Some(s) => resolve(s),
        None => empty(),
    };
    let i = series.locations.len() as u32;
    series.locations.push(Location {
        mapping: m,
        addr,
        lines,
    });
    series.location_index.insert((m, addr), i);
    i
}

/// The series' location of `frame`, an address no file maps: named from
/// the process's perf map when it has one there.
fn jit_location(series: &mut Series, process: &mut Process, frame: Frame) -> u32 {
    let addr = frame.lookup();
    if let Some(&i) = series.location_index.get(&(u32::MAX, addr)) {
        return i;
    }
    let lines = match process.jit_name(addr) {
        Some(function) => Arc::from(vec![Line {
            function,
            file: None,
            line: 0,
        }]),
        None => empty(),
    };
    let i = series.locations.len() as u32;
    series.locations.push(Location {
        mapping: u32::MAX,
        addr,
        lines,
    });
    series.location_index.insert((u32::MAX, addr), i);
    i
}

/// The native frames with an interpreter's in place of its evaluation
/// function's calls, when the process runs one and the sample has its
/// frames.
fn with_interpreter_frames(
    runtime: Option<&mut Runtime>,
    native: Vec<Frame>,
    s: &Sample<'_>,
) -> Vec<Merged> {
    match runtime {
        Some(interp) if !s.interp.is_empty() => {
            let frames = interp.frames(&s.interp);
            merge(
                &native,
                &frames,
                |a| interp.is_eval(a),
                interp.loop_is_callee(),
            )
        }
        _ => native.into_iter().map(Merged::Native).collect(),
    }
}

/// The stack with each frame of a JVM's code in place of its native frame
/// (`java`: by index in it; a compiled frame's inlined methods share one).
/// A JVM has no interpreter frames from the BPF program, so the stack is
/// still one frame a native frame.
fn with_java_frames(user: Vec<Merged>, java: Vec<(usize, InterpFrame)>) -> Vec<Merged> {
    if java.is_empty() {
        return user;
    }
    let mut java = java.into_iter().peekable();
    let mut out = Vec::with_capacity(user.len() + java.len());
    for (i, m) in user.into_iter().enumerate() {
        let mut replaced = false;
        while let Some((_, f)) = java.next_if(|&(j, _)| j == i) {
            out.push(Merged::Interp(f));
            replaced = true;
        }
        if !replaced {
            out.push(m);
        }
    }
    out
}

/// A Go sample's pprof labels as text (a key or value cut by the BPF
/// program ends in `…`); none for any other sample.
fn sample_labels(s: &Sample<'_>) -> SampleLabels {
    s.go_labels
        .iter()
        .filter(|l| !l.key.is_empty())
        .map(|l| {
            let text = |b: &[u8], cut: bool| {
                let mut t = String::from_utf8_lossy(b).into_owned();
                if cut {
                    t.push('…');
                }
                t.into_boxed_str()
            };
            (text(l.key, l.key_cut), text(l.value, l.value_cut))
        })
        .collect()
}

/// The series' location of an interpreter frame: its function's (code
/// object's) qualified name and file, at the line the thread is at.
fn interp_location(
    series: &mut Series,
    pid: u32,
    interp: Option<&mut Runtime>,
    frame: InterpFrame,
) -> u32 {
    let unknown = interp.as_ref().map_or("[unknown frame]", |i| i.unknown());
    let found = interp.and_then(|i| i.frame(frame));
    let key = match &found {
        Some((_, line)) => (pid, frame.code, *line),
        None => (pid, 0, 0),
    };
    if let Some(&i) = series.interp_index.get(&key) {
        return i;
    }
    let line = match found {
        Some((code, line)) => Line {
            function: code.name.clone(),
            file: Some(code.file.clone()),
            line,
        },
        None => Line {
            function: unknown.into(),
            file: None,
            line: 0,
        },
    };
    let i = series.locations.len() as u32;
    series.locations.push(Location {
        mapping: u32::MAX,
        addr: 0,
        lines: Arc::from(vec![line]),
    });
    series.interp_index.insert(key, i);
    i
}

/// A series as a pprof profile: `cpu/nanoseconds` (each sample one period)
/// or `off_cpu/nanoseconds` (the time waited), and `samples/count`.
fn to_pprof(s: Series, period_ns: i64, start: i64, end: i64, symbolized: bool) -> pprof::Profile {
    let mut strings = Strings::default();
    strings.get("");
    let value = match s.kind {
        Kind::Cpu => "cpu",
        Kind::OffCpu => "off_cpu",
    };
    let mut p = pprof::Profile {
        sample_type: vec![
            pprof::ValueType {
                r#type: strings.get(value),
                unit: strings.get("nanoseconds"),
            },
            pprof::ValueType {
                r#type: strings.get("samples"),
                unit: strings.get("count"),
            },
        ],
        period_type: Some(pprof::ValueType {
            r#type: strings.get(value),
            unit: strings.get("nanoseconds"),
        }),
        period: if s.kind == Kind::Cpu { period_ns } else { 0 },
        time_nanos: start,
        duration_nanos: (end - start).max(0),
        ..Default::default()
    };
    for (i, m) in s.mappings.iter().enumerate() {
        let id = i as u64 + 1;
        p.mapping.push(match m {
            MapRef::Kernel => pprof::Mapping {
                id,
                filename: strings.get("[kernel.kallsyms]"),
                has_functions: symbolized,
                ..Default::default()
            },
            MapRef::File {
                start,
                end,
                offset,
                binary,
            } => pprof::Mapping {
                id,
                memory_start: *start,
                memory_limit: *end,
                file_offset: *offset,
                filename: strings.get(&binary.path),
                build_id: binary.build_id.as_deref().map_or(0, |b| strings.get(b)),
                has_functions: symbolized,
                has_filenames: symbolized,
                has_line_numbers: symbolized,
                has_inline_frames: symbolized,
            },
        });
    }
    let mut functions: HashMap<(i64, i64), u64> = HashMap::new();
    for (i, loc) in s.locations.iter().enumerate() {
        let mut lines = Vec::with_capacity(loc.lines.len());
        for l in loc.lines.iter() {
            let name = strings.get(&l.function);
            let file = l.file.as_deref().map_or(0, |f| strings.get(f));
            let next = functions.len() as u64 + 1;
            let id = *functions.entry((name, file)).or_insert_with(|| {
                p.function.push(pprof::Function {
                    id: next,
                    name,
                    system_name: name,
                    filename: file,
                    start_line: 0,
                });
                next
            });
            lines.push(pprof::Line {
                function_id: id,
                line: i64::from(l.line),
                column: 0,
            });
        }
        p.location.push(pprof::Location {
            id: i as u64 + 1,
            mapping_id: if loc.mapping == u32::MAX {
                0
            } else {
                u64::from(loc.mapping) + 1
            },
            address: loc.addr,
            line: lines,
            is_folded: false,
        });
    }
    for ((stack, labels), (n, waited)) in s.stacks {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let first = match s.kind {
            Kind::Cpu => n.saturating_mul(period_ns),
            Kind::OffCpu => i64::try_from(waited).unwrap_or(i64::MAX),
        };
        p.sample.push(pprof::Sample {
            location_id: stack.iter().map(|&l| u64::from(l) + 1).collect(),
            value: vec![first, n],
            label: labels
                .iter()
                .map(|(k, v)| pprof::Label {
                    key: strings.get(k),
                    str: strings.get(v),
                    num: 0,
                    num_unit: 0,
                })
                .collect(),
        });
    }
    p.string_table = strings.table;
    p
}

#[derive(Default)]
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn get(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_owned());
        self.index.insert(s.to_owned(), i);
        i
    }
}

#[cfg(test)]
mod tests;
