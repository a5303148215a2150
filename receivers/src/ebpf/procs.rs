//! What the receiver knows of each sampled process: its identity (pid and
//! start time, so a reused pid is a new process), name, executable, cgroup
//! and container, its executable mappings with the ELF files behind them
//! (build id, unwind sections), its labels after relabelling, its unwinder,
//! and its runtime when it has one whose state is read at each sample (an
//! interpreter's frames, a Go program's labels: see [`super::interp`]; the
//! BPF program's `interp_procs` and `go_procs` maps follow what is found
//! and let go here).
//!
//! A process is read from `/proc` when its first sample arrives (the ring
//! buffer is drained as samples come, so even a process that lives a few
//! milliseconds is usually still there). If it is already gone, what the
//! sample itself carries (thread name and executable file name, taken in the
//! kernel at sample time) is used. Its mappings are reread when an exec is
//! seen (the executable name changed), and when an address falls outside
//! every executable mapping (a library loaded later), at most once a second.
//!
//! ELF files are read once per file (device and inode) and shared by every
//! process that maps them; only the build id, the executable segments and
//! an interpreter's two symbols are kept, with the file's descriptor: the
//! symbolizer reads the file through it, so the samples of a process that
//! exited before they were read (the ring buffer is drained late on a busy
//! machine) still name its functions, where the process's
//! `/proc/PID/root/...` path is gone. At most a quarter of this process's
//! open-file limit is held so (sockets keep the rest); a file beyond it is
//! read through its process's root while that process lives. The unwind
//! sections of a file only root can change are used in place from the file
//! mapped (only the pages the unwinder reads are in memory); another user's
//! are copied, and a compressed `.debug_frame` (Go's) is inflated, into a
//! private unlinked file, mapped (`procs/spill.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use framehop::Unwinder;
use framehop::x86_64::UnwinderX86_64;
use proflow_model::model::Labels;
use proflow_relabel::Relabeler;

pub use binary::{Binary, Section};
use binary::{HeldFiles, module, read_binary};
#[cfg(test)]
pub(crate) use binary::{own_maps_line, tests_binary};

use super::config::GroupBy;
use super::perfmap::{Owner, PerfMap};
use super::runtime::{BpfValue, Runtime, Runtimes};
use super::state_budget::StateBudget;

/// Most executable mappings kept per process.
const MAX_MAPPINGS: usize = 65_536;
/// Files kept beyond those a live process maps.
const MAX_IDLE_BINARIES: usize = 256;
/// How often a process's mappings may be reread.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Identity of a process: a pid is reused, a pid with its start time is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcKey {
    pub pid: u32,
    pub start_time: u64,
}

/// One executable mapping of a process.
#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    pub binary: Arc<Binary>,
    /// The file as this process sees it (through `/proc/PID/root`).
    pub open_path: Arc<Path>,
}

impl Mapping {
    /// The file offset of address `addr` in this mapping.
    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }
}

/// A sampled process.
pub struct Process {
    pub key: ProcKey,
    pub comm: String,
    pub exe: String,
    /// The executable's file name as the kernel gave it in the last sample.
    exe_name: Vec<u8>,
    pub cgroup: String,
    pub container_id: Option<String>,
    /// Sorted by start.
    pub mappings: Vec<Mapping>,
    /// The series labels after relabelling, with their key (the selector
    /// string, computed once); `None`: not profiled.
    pub labels: Option<(Labels, String)>,
    /// Every executable range, file-backed or not (JIT code, the vdso): an
    /// address outside all of them means the mappings changed.
    exec_ranges: Vec<(u64, u64)>,
    pub unwinder: UnwinderX86_64<Section>,
    /// Whether `/proc` could be read for it.
    pub from_proc: bool,
    last_reload: Instant,
    /// The collect interval it was last sampled in.
    pub last_seen: u64,
    /// Its perf map, when perf maps are on and `/proc` could be read.
    perf: Option<Perf>,
    /// It exited: only its names and labels are held, for its samples that
    /// were still in the ring buffer, until the next sweep.
    exited: bool,
    /// Its runtime and the functions read, when it runs one whose state is
    /// read.
    pub runtime: Option<Runtime>,
}

/// A change the BPF program's `interp_procs` or `go_procs` map needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeChange {
    /// A process whose runtime is read.
    Put(u32, BpfValue),
    /// The process with this pid and start time is gone (the entry goes
    /// only if it is still this process's).
    Remove(ProcKey),
}

/// Where a process's perf map is and what of it was read.
#[derive(Debug)]
struct Perf {
    dir: PathBuf,
    owner: Owner,
    map: PerfMap,
    max_size: u64,
}

impl Process {
    fn in_exec_range(&self, addr: u64) -> bool {
        let i = self
            .exec_ranges
            .partition_point(|&(start, _)| start <= addr);
        i.checked_sub(1)
            .is_some_and(|i| addr < self.exec_ranges[i].1)
    }

    /// The name its perf map gives the JIT code at `addr` (see
    /// [`super::perfmap`]).
    pub fn jit_name(&mut self, addr: u64) -> Option<Arc<str>> {
        self.jit_entry(addr).map(|e| e.name)
    }

    fn jit_entry(&mut self, addr: u64) -> Option<super::perfmap::Entry> {
        let perf = self.perf.as_mut()?;
        perf.map.lookup(&perf.dir, &perf.owner, addr, perf.max_size)
    }

    /// Whether `ra` is the return address of the call in one of CPython's
    /// perf trampolines (`-X perf`, 3.12 and later): `sub $8, %rsp` (4
    /// bytes), `call *%rcx` (2), `add $8, %rsp` (4), `ret` (1), named
    /// `py::FUNCTION:FILE` in its perf map.
    pub fn is_cpython_trampoline_return(&mut self, ra: u64) -> bool {
        self.jit_entry(ra.saturating_sub(1)).is_some_and(|e| {
            e.name.starts_with("py::") && e.end - e.start == 11 && ra - e.start == 6
        })
    }

    /// Entries of its perf map held.
    pub fn perf_map_entries(&self) -> usize {
        self.perf.as_ref().map_or(0, |p| p.map.len())
    }

    /// The mapping holding `addr`.
    pub fn mapping(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }
}

/// Device and inode of a mapped file, with its path (a file replaced on
/// disk gets a new inode).
type BinKey = (String, u64, Arc<str>);

/// Every process and file the receiver knows.
pub struct Processes {
    procs: HashMap<ProcKey, Process>,
    binaries: HashMap<BinKey, Arc<Binary>>,
    relabel: Relabeler,
    group_by: GroupBy,
    /// `/proc`; tests point it elsewhere.
    proc_root: PathBuf,
    /// The bound on the files' descriptors held open.
    held: HeldFiles,
    /// Most bytes read of one process's perf map; `None`: perf maps off.
    perf_map_max: Option<u64>,
    /// What perf maps and copied unwind sections may take together.
    state: Arc<StateBudget>,
    /// Processes relabelling dropped since [`Processes::take_dropped`].
    dropped: Vec<ProcKey>,
    /// Where runtime processes found and gone are told (the BPF program's
    /// maps), at once: such a process's next sample already has its frames
    /// or labels. `None`: no runtime is read.
    runtime_sink: Option<RuntimeSink>,
    /// Which runtimes are read.
    runtimes: Runtimes,
}

/// Takes each change of the runtime processes.
pub type RuntimeSink = Box<dyn FnMut(RuntimeChange)>;

impl Processes {
    pub fn new(relabel: Relabeler, group_by: GroupBy) -> Self {
        Processes {
            procs: HashMap::new(),
            binaries: HashMap::new(),
            relabel,
            group_by,
            proc_root: PathBuf::from("/proc"),
            held: HeldFiles::new(),
            perf_map_max: None,
            state: StateBudget::unbounded(),
            dropped: Vec::new(),
            runtime_sink: None,
            runtimes: Runtimes::default(),
        }
    }

    /// Reads the `runtimes` on (see [`super::interp`]), telling `sink` each
    /// process found and gone.
    pub fn with_runtimes(mut self, runtimes: Runtimes, sink: RuntimeSink) -> Self {
        self.runtimes = runtimes;
        self.runtime_sink = Some(sink);
        self
    }

    fn runtime_change(sink: &mut Option<RuntimeSink>, change: RuntimeChange) {
        if let Some(sink) = sink {
            sink(change);
        }
    }

    /// Reads processes from `root` instead of `/proc`.
    #[cfg(test)]
    pub(crate) fn with_proc_root(mut self, root: PathBuf) -> Self {
        self.proc_root = root;
        self
    }

    /// Holds at most `max` files' descriptors open (0 without a
    /// symbolizer to read them).
    pub fn with_max_held(mut self, max: usize) -> Self {
        self.held = HeldFiles::with_max(max);
        self
    }

    /// Files' descriptors held open now.
    #[cfg(test)]
    pub(crate) fn held_files(&self) -> usize {
        self.held.len()
    }

    /// Processes relabelling dropped since the last call (the off-CPU
    /// programs stop noting their waits).
    pub fn take_dropped(&mut self) -> Vec<ProcKey> {
        std::mem::take(&mut self.dropped)
    }

    /// Names JIT code from perf maps, reading at most `max_size` bytes of
    /// each.
    pub fn with_perf_maps(mut self, max_size: u64) -> Self {
        self.perf_map_max = Some(max_size);
        self
    }

    /// Holds perf map entries and copied unwind sections within
    /// `max_bytes` together (the receiver's `max_state_size`).
    pub fn with_state_budget(mut self, max_bytes: usize) -> Self {
        self.state = StateBudget::new(max_bytes);
        self
    }

    /// The state budget: bytes charged now, refusals by use.
    pub fn state_budget(&self) -> &StateBudget {
        &self.state
    }

    /// Perf map entries held over all processes.
    pub fn perf_map_entries(&self) -> usize {
        self.procs.values().map(Process::perf_map_entries).sum()
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The process of a sample, read from `/proc` if new, reread if it
    /// exec'd (`exe_name` changed) or `addr` is outside its mappings.
    pub fn get(
        &mut self,
        key: ProcKey,
        comm: &[u8],
        exe_name: &[u8],
        addr: Option<u64>,
        interval: u64,
    ) -> &mut Process {
        let (stale, exec) = match self.procs.get(&key) {
            None => (true, true),
            // Its `/proc` is gone: what was read of it stays.
            Some(p) if p.exited => (false, false),
            Some(p) => {
                let exec = !exe_name.is_empty() && p.exe_name != exe_name;
                let unknown =
                    p.from_proc && p.labels.is_some() && addr.is_some_and(|a| !p.in_exec_range(a));
                (
                    exec || (unknown && p.last_reload.elapsed() >= RELOAD_EVERY),
                    exec,
                )
            }
        };
        if stale {
            let mut p = self.load(key, comm, exe_name);
            // New code pages (a JIT's) reread the mappings, not the perf map
            // read so far; an exec starts a new one.
            if !exec
                && let Some(old) = self.procs.get_mut(&key).and_then(|o| o.perf.take())
                && p.perf.is_some()
            {
                p.perf = Some(old);
            }
            // The functions read so far stay while the runtime does; an exec
            // into something else is no runtime process any more.
            if let Some(old) = self.procs.get_mut(&key).and_then(|o| o.runtime.take()) {
                match &p.runtime {
                    Some(new) if !exec && new.runtime() == old.runtime() => p.runtime = Some(old),
                    // Another runtime (maybe in the other map of the BPF
                    // program), or none: the old entry goes first.
                    _ => Self::runtime_change(&mut self.runtime_sink, RuntimeChange::Remove(key)),
                }
            }
            if let Some(v) = p.runtime.as_ref().and_then(|r| r.bpf_value(key.start_time)) {
                Self::runtime_change(&mut self.runtime_sink, RuntimeChange::Put(key.pid, v));
            }
            self.procs.insert(key, p);
        }
        let p = self.procs.get_mut(&key).expect("inserted above");
        p.last_seen = interval;
        p
    }

    /// Forgets processes not sampled since interval `before`, and files no
    /// process maps beyond a few. Called between intervals: a process that
    /// exited lets go of its mappings, unwinder and perf map at once (a
    /// short-lived one holds them for one interval at most, not two), and
    /// its names and labels at the next sweep, so a sample of it still in
    /// the ring buffer keeps its series.
    pub fn sweep(&mut self, before: u64) {
        let root = &self.proc_root;
        let runtime_sink = &mut self.runtime_sink;
        self.procs.retain(|key, p| {
            if p.exited || p.last_seen < before {
                if p.runtime.is_some() {
                    Self::runtime_change(runtime_sink, RuntimeChange::Remove(*key));
                }
                return false;
            }
            // A pid reused since is kept until it ages out (its start time
            // would tell, at the cost of reading its stat).
            if !root.join(key.pid.to_string()).exists() {
                p.exited = true;
                p.mappings = Vec::new();
                p.exec_ranges = Vec::new();
                p.unwinder = UnwinderX86_64::new();
                p.perf = None;
                if p.runtime.take().is_some() {
                    Self::runtime_change(runtime_sink, RuntimeChange::Remove(*key));
                }
            }
            true
        });
        // An idle file whose sections were copied goes at once (that
        // memory is the state budget's, given back with it), and so does one
        // whose section the budget refused (read again by the next process
        // that maps it, when there may be room); the others are kept for a
        // process that maps them again, up to the bound.
        self.binaries
            .retain(|_, b| Arc::strong_count(b) > 1 || (b.copied_bytes() == 0 && !b.state_refused));
        if self.binaries.len() > MAX_IDLE_BINARIES {
            self.binaries.retain(|_, b| Arc::strong_count(b) > 1);
        }
    }

    fn load(&mut self, key: ProcKey, comm: &[u8], exe_name: &[u8]) -> Process {
        let dir = self.proc_root.join(key.pid.to_string());
        let thread_comm = String::from_utf8_lossy(comm).into_owned();
        let sample_exe = String::from_utf8_lossy(exe_name).into_owned();
        // The process's own name (the sample's is its thread's).
        let comm = std::fs::read_to_string(dir.join("comm"))
            .map(|s| s.trim_end_matches('\n').to_owned())
            .unwrap_or(thread_comm);
        let exe = std::fs::read_link(dir.join("exe"))
            .map(|p| {
                let s = p.to_string_lossy().into_owned();
                s.strip_suffix(" (deleted)").map(str::to_owned).unwrap_or(s)
            })
            .unwrap_or(sample_exe);
        let cgroups = std::fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
        let cgroup = cgroup_path(&cgroups).to_owned();
        let container_id = container_id(&cgroups);
        let labels = self
            .labels(key.pid, &comm, &exe, &cgroup, container_id.as_deref())
            .map(|l| {
                let key = l.to_selector_string();
                (l, key)
            });
        if labels.is_none() && self.dropped.len() < MAX_MAPPINGS {
            self.dropped.push(key);
        }
        // A process relabelling drops needs no mappings, files or unwinder.
        let maps = if labels.is_some() {
            std::fs::read_to_string(dir.join("maps"))
        } else {
            Ok(String::new())
        };
        let from_proc = maps.is_ok();
        let root = dir.join("root");
        let mut mappings = Vec::new();
        let mut exec_ranges = Vec::new();
        for line in maps.as_deref().unwrap_or("").lines() {
            if mappings.len() >= MAX_MAPPINGS || exec_ranges.len() >= MAX_MAPPINGS {
                break;
            }
            if let Some(range) = exec_range(line) {
                exec_ranges.push(range);
            }
            let Some(m) = parse_maps_line(line) else {
                continue;
            };
            let binary = match self
                .binaries
                .get(&(m.dev.to_owned(), m.inode, m.path.into()))
            {
                Some(b) => b.clone(),
                None => {
                    let open = root.join(m.path.trim_start_matches('/'));
                    let b = Arc::new(read_binary(&open, m.path, &self.held, &self.state));
                    self.binaries
                        .insert((m.dev.to_owned(), m.inode, m.path.into()), b.clone());
                    b
                }
            };
            let open_path: Arc<Path> = root.join(m.path.trim_start_matches('/')).into();
            mappings.push(Mapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                binary,
                open_path,
            });
        }
        mappings.sort_by_key(|m| m.start);
        exec_ranges.sort_unstable();
        let mut unwinder = UnwinderX86_64::new();
        for m in &mappings {
            if let Some(module) = module(m) {
                unwinder.add_module(module);
            }
        }
        let runtime = if self.runtime_sink.is_some() {
            mappings.iter().find_map(|m| {
                let binary = m.binary.runtime.as_ref()?;
                Runtime::new(
                    key.pid,
                    binary,
                    m.binary.bias(m)?,
                    self.runtimes,
                    &self.state,
                )
            })
        } else {
            None
        };
        let perf = match self.perf_map_max {
            Some(max_size) if from_proc => owner(&dir).map(|owner| Perf {
                dir: dir.clone(),
                owner,
                map: PerfMap::with_budget(self.state.clone()),
                max_size,
            }),
            _ => None,
        };
        Process {
            perf,
            key,
            comm,
            exe,
            exe_name: exe_name.to_vec(),
            cgroup,
            container_id,
            mappings,
            labels,
            exec_ranges,
            unwinder,
            from_proc,
            last_reload: Instant::now(),
            last_seen: 0,
            exited: false,
            runtime,
        }
    }

    /// Discovery labels → relabelled series labels (see `config.rs`).
    fn labels(
        &self,
        pid: u32,
        comm: &str,
        exe: &str,
        cgroup: &str,
        container_id: Option<&str>,
    ) -> Option<Labels> {
        let mut l = Labels::new();
        l.set("__meta_process_pid", pid.to_string());
        l.set("__meta_process_comm", comm);
        l.set("__meta_process_exe", exe);
        l.set("__meta_process_cgroup", cgroup);
        if self.group_by == GroupBy::Process {
            l.set("pid", pid.to_string());
            l.set("comm", comm);
        }
        if let Some(id) = container_id {
            l.set("__meta_container_id", id);
            l.set("container_id", id);
        }
        if !self.relabel.apply(&mut l) {
            return None;
        }
        l.retain(|label| !label.name.starts_with("__"));
        if l.get("service_name").is_none_or(str::is_empty) {
            l.set("service_name", service_name(exe, comm));
        }
        l.set("__name__", "process_cpu");
        Some(l)
    }
}

/// The default `service_name`: the executable's file name, else the
/// process name (what `top` shows), which is what a node with no service
/// labels can say of a process.
/// A process's pid in its own PID namespace and its effective user, from
/// `/proc/PID/status`.
fn owner(dir: &Path) -> Option<Owner> {
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
    };
    let ns_pid = field("NSpid:")?.last()?.parse().ok()?;
    let uid = field("Uid:")?.get(1)?.parse().ok()?;
    Some(Owner { ns_pid, uid })
}

fn service_name(exe: &str, comm: &str) -> String {
    match exe.rsplit('/').next() {
        Some(name) if !name.is_empty() => name.to_owned(),
        _ if !comm.is_empty() => comm.to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// The range of a `/proc/PID/maps` line that is executable, whatever it maps.
fn exec_range(line: &str) -> Option<(u64, u64)> {
    let mut f = line.split(' ');
    let (range, perms) = (f.next()?, f.next()?);
    if !perms.contains('x') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
}

/// One line of `/proc/PID/maps` that maps a file executable.
#[derive(Debug, PartialEq)]
struct MapsLine<'a> {
    start: u64,
    end: u64,
    offset: u64,
    dev: &'a str,
    inode: u64,
    path: &'a str,
}

fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut f = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let path = f.next()?.trim_start();
    if !perms.contains('x') || !path.starts_with('/') {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let path = path.strip_suffix(" (deleted)").unwrap_or(path);
    (start < end).then_some(MapsLine {
        start,
        end,
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev,
        inode: inode.parse().ok()?,
        path,
    })
}

/// The cgroup a process is in: the unified (v2) path if it is not the root,
/// else the first non-root v1 path (systemd's, then the others in order).
pub fn cgroup_path(cgroups: &str) -> &str {
    let mut v1 = None;
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if id == "0" && controllers.is_empty() && path != "/" {
            return path;
        }
        if path != "/" && (v1.is_none() || controllers == "name=systemd") {
            v1 = Some(path);
        }
    }
    v1.unwrap_or("/")
}

/// The container id in a process's cgroup paths: the 64-hex-digit id that
/// Docker, containerd, CRI-O and Podman name their cgroups after, with or
/// without the systemd driver's decoration (`docker-ID.scope`,
/// `cri-containerd-ID.scope`, `crio-ID.scope`, `libpod-ID.scope`, or a bare
/// `ID` under `/docker/`, `/kubepods/...`, `/libpod_parent/`).
pub fn container_id(cgroups: &str) -> Option<String> {
    for line in cgroups.lines() {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        for part in path.rsplit('/') {
            let part = part.strip_suffix(".scope").unwrap_or(part);
            if part.starts_with("crio-conmon-") {
                continue;
            }
            let id = ["docker-", "cri-containerd-", "crio-", "libpod-", ""]
                .iter()
                .find_map(|prefix| part.strip_prefix(prefix).filter(|id| is_id(id)));
            if let Some(id) = id {
                return Some(id.to_owned());
            }
        }
    }
    None
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

mod binary;
mod spill;
#[cfg(test)]
mod tests;
