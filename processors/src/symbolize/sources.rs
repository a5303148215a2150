//! Where a mapping's symbols are: the sources of the `symbolize` processor,
//! tried in order, and the address each one needs.
//!
//! - **kernel**: a mapping named `[kernel.kallsyms]` (or `[kernel…`), or an
//!   address in the kernel's half with no mapping: this host's kallsyms.
//! - **local binary**: the mapping's path on this host, first under
//!   `/proc/<pid>/root` when the series has a `pid` label; taken only when
//!   its build id is the mapping's (or the mapping has none). Its
//!   `.gnu_debuglink` is followed into `debug_dirs`.
//!
//! The two sources that read this host (kernel, local binary) serve a
//! batch as the config says ([`HostSource`]): by default only the batches
//! this host made (its `ebpf` receiver's, [`BatchMeta::this_host`]), whose
//! paths and kernel addresses are this host's. Frames of other batches that
//! only they could have named are counted as [`reason::KERNEL_NOT_THIS_HOST`]
//! and [`reason::LOCAL_NOT_THIS_HOST`].
//!
//! [`BatchMeta::this_host`]: proflow_model::model::BatchMeta::this_host
//! - **debug file by build id**: `<dir>/.build-id/ab/cdef….debug` in each of
//!   `debug_dirs`, with the mapping's build id; preferred over the local
//!   binary when both are found (a stripped binary's debug file has the
//!   lines).
//! - **debuginfod**: the debug file by build id from debuginfod servers
//!   ([`super::debuginfod`]), when `debug_dirs` had none and there is no
//!   local binary with DWARF. A fetch still under way when the batch's
//!   deadline passes leaves the frames unnamed for now; that decision is
//!   not remembered, so the next batch uses the file once it is fetched.
//!
//! Addresses: a pprof location's address is a runtime address. In the file
//! that was mapped it is `address - memory_start + file_offset` (a file
//! offset). A separate debug file (`objcopy --only-keep-debug`) keeps the
//! segments' virtual addresses but not their file offsets, so it is looked
//! up by virtual address: from the local binary's segments when the binary
//! is here too (exact), else from the debug file's executable segment,
//! which the mapping is taken to start at (true of the executable mapping
//! of every file linkers of the field write).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proflow_symbolize::elf::{ElfInfo, build_id_path};

use super::config::HostSource;
use super::debuginfod::{Debuginfod, Lookup};
use proflow_symbolize::{Addr, FileId, FileKey, FileRef, Lines, Symbols};

/// Addresses at or above this are the kernel's (x86-64 and arm64).
pub const KERNEL_START: u64 = 0xffff_8000_0000_0000;

/// How long a decision about a mapping is kept: a debug file installed or
/// a binary replaced is seen within this.
const DECISION_TTL: Duration = Duration::from_secs(30);
/// Most decisions kept; past it they are all dropped and made again.
const MAX_DECISIONS: usize = 10_000;

/// Why a frame was not named (the `result` label of
/// `proflow_symbolize_frames_total`).
pub mod reason {
    pub const SYMBOLIZED: &str = "symbolized";
    /// The location has no mapping and is not a kernel address.
    pub const NO_MAPPING: &str = "no_mapping";
    /// The mapping has no build id and its file is not on this host.
    pub const NO_BUILD_ID: &str = "no_build_id";
    /// No source has the file, or the file does not name the address.
    pub const NOT_FOUND: &str = "not_found";
    /// A kernel frame while `kernel: false`.
    pub const KERNEL_OFF: &str = "kernel_disabled";
    /// A kernel frame of a profile not made on this host, while `kernel`
    /// serves only this host's (`this_host`, the default).
    pub const KERNEL_NOT_THIS_HOST: &str = "kernel_not_this_host";
    /// A frame no debug file named, of a profile not made on this host,
    /// while `local` serves only this host's (`this_host`, the default):
    /// the file at the mapping's path was not looked at.
    pub const LOCAL_NOT_THIS_HOST: &str = "local_not_this_host";
    /// The debug file is being fetched from debuginfod, and was not there
    /// by the batch's deadline.
    pub const DEBUGINFOD_TIMEOUT: &str = "debuginfod_timeout";
}

/// What a mapping needs to be looked up.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MappingId {
    pub path: String,
    /// Lowercase hex; `None` when the profile has none (or not a GNU one).
    pub build_id: Option<String>,
    pub pid: Option<u32>,
}

/// Where a mapping's addresses are looked up.
#[derive(Debug, Clone)]
pub enum Source {
    Kernel,
    File {
        key: FileKey,
        path: PathBuf,
        /// The file that was checked (build id, segments): another one
        /// found at `path` later is not read.
        id: Option<FileId>,
        translate: Translate,
    },
    /// Not to be found; the reason.
    Missing(&'static str),
}

/// How a runtime address becomes the address the file is looked up by.
#[derive(Debug, Clone)]
pub enum Translate {
    /// The mapped file itself: by file offset.
    FileOffset,
    /// A debug file, with the mapped file's segments at hand.
    Segments(Arc<ElfInfo>),
    /// A debug file alone: the virtual addresses a mapping starts at when
    /// it maps the whole file (file offset 0) and when it maps the
    /// executable segment.
    Base { whole: u64, executable: u64 },
}

impl Translate {
    /// The address to look `address` up by, in a mapping that starts at
    /// `memory_start` and maps the file from `file_offset`.
    pub fn addr(&self, address: u64, memory_start: u64, file_offset: u64) -> Option<Addr> {
        let into = address.checked_sub(memory_start)?;
        match self {
            Translate::FileOffset => Some(Addr::FileOffset(into.checked_add(file_offset)?)),
            Translate::Segments(info) => info
                .vaddr_of_offset(into.checked_add(file_offset)?)
                .map(Addr::Virtual),
            Translate::Base { whole, executable } => {
                let base = if file_offset == 0 { whole } else { executable };
                base.checked_add(into).map(Addr::Virtual)
            }
        }
    }
}

/// The sources as configured, and the decisions made recently.
pub struct Sources {
    local: HostSource,
    debug_dirs: Vec<PathBuf>,
    kernel: HostSource,
    debuginfod: Option<Arc<Debuginfod>>,
    /// Until when the current batch may wait for debuginfod.
    deadline: Instant,
    /// Whether the current batch was made on this host.
    this_host: bool,
    /// By mapping and whether local files could be used for it.
    decisions: HashMap<(MappingId, bool), (Instant, Source)>,
}

impl Sources {
    pub fn new(local: HostSource, debug_dirs: Vec<PathBuf>, kernel: HostSource) -> Self {
        Sources {
            local,
            debug_dirs,
            kernel,
            debuginfod: None,
            deadline: Instant::now(),
            this_host: false,
            decisions: HashMap::new(),
        }
    }

    /// These sources with debuginfod servers last.
    pub fn with_debuginfod(mut self, debuginfod: Arc<Debuginfod>) -> Self {
        self.debuginfod = Some(debuginfod);
        self
    }

    /// Starts a batch: fetches from debuginfod are waited for until
    /// `deadline`; `this_host` says whether it was made on this host.
    pub fn begin_batch(&mut self, deadline: Instant, this_host: bool) {
        self.deadline = deadline;
        self.this_host = this_host;
    }

    /// The source of kernel frames.
    pub fn kernel(&self) -> Source {
        if self.kernel.serves(self.this_host) {
            Source::Kernel
        } else if self.kernel == HostSource::Never {
            Source::Missing(reason::KERNEL_OFF)
        } else {
            Source::Missing(reason::KERNEL_NOT_THIS_HOST)
        }
    }

    /// Where `m`'s addresses are looked up.
    pub fn find(&mut self, m: &MappingId) -> Source {
        if m.path.starts_with("[kernel") {
            return self.kernel();
        }
        let now = Instant::now();
        let local = self.local.serves(self.this_host);
        // A decision made with local files is never one for a batch that
        // may not use them.
        let key = (m.clone(), local);
        if let Some((at, s)) = self.decisions.get(&key)
            && now.duration_since(*at) < DECISION_TTL
        {
            return s.clone();
        }
        if self.decisions.len() >= MAX_DECISIONS {
            self.decisions.clear();
        }
        let (s, lasting) = self.decide(m, local);
        if lasting {
            self.decisions.insert(key, (now, s.clone()));
        }
        s
    }

    /// The source of `m`, and whether that may be remembered (not while a
    /// debuginfod fetch for it is under way).
    fn decide(&self, m: &MappingId, local: bool) -> (Source, bool) {
        let binary = if local {
            local_candidates(m).into_iter().find_map(|p| {
                let info = ElfInfo::read(&p)?;
                let matches = match (&m.build_id, &info.build_id) {
                    (Some(want), Some(have)) => want == have,
                    (Some(_), None) => false,
                    (None, _) => true,
                };
                matches.then(|| (p, Arc::new(info)))
            })
        } else {
            None
        };
        let matching = |p: PathBuf, id: &str| {
            let info = ElfInfo::read(&p)?;
            (info.build_id.as_deref() == Some(id)).then_some((p, info))
        };
        let mut debug = m.build_id.as_deref().and_then(|id| {
            self.debug_dirs
                .iter()
                .find_map(|dir| matching(build_id_path(dir, id)?, id))
        });
        let has_dwarf = binary.as_ref().is_some_and(|(_, b)| b.debug_size > 0);
        let mut lasting = true;
        if let (None, false, Some(d), Some(id)) =
            (&debug, has_dwarf, &self.debuginfod, m.build_id.as_deref())
        {
            match d.get(id, self.deadline) {
                Lookup::Found(p) => debug = matching(p, id),
                Lookup::Missing => {}
                Lookup::TimedOut if binary.is_none() => {
                    return (Source::Missing(reason::DEBUGINFOD_TIMEOUT), false);
                }
                // The local binary's symbol table names the frames for now.
                Lookup::TimedOut => lasting = false,
            }
        }
        // The symbolizer keeps files open and caches frames by key. A binary
        // is keyed by its own build id, else by the path it was found at
        // (two containers' /usr/bin/app are different files); a debug file
        // by its path (the binary of the same build id may be open too).
        let binary_key = |path: &Path, info: &ElfInfo| match &info.build_id {
            Some(id) => FileKey::BuildId(id.as_str().into()),
            None => FileKey::Path(path.to_string_lossy().into()),
        };
        let source = match (binary, debug) {
            (binary, Some((path, info))) => {
                let translate = match binary {
                    Some((_, b)) => Translate::Segments(b),
                    None => match (info.first_base(), info.executable_base()) {
                        (Some(whole), Some(executable)) => Translate::Base { whole, executable },
                        _ => return (Source::Missing(reason::NOT_FOUND), lasting),
                    },
                };
                Source::File {
                    key: FileKey::Path(path.to_string_lossy().into()),
                    path,
                    id: info.file,
                    translate,
                }
            }
            (Some((path, info)), None) => Source::File {
                key: binary_key(&path, &info),
                path,
                id: info.file,
                translate: Translate::FileOffset,
            },
            // Only this host's files could have named it, and they are not
            // for this batch.
            (None, None)
                if !local && self.local != HostSource::Never && m.path.starts_with('/') =>
            {
                Source::Missing(reason::LOCAL_NOT_THIS_HOST)
            }
            (None, None) if m.build_id.is_none() => Source::Missing(reason::NO_BUILD_ID),
            (None, None) => Source::Missing(reason::NOT_FOUND),
        };
        (source, lasting)
    }
}

/// How a frame's address is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    /// A runtime address in a mapping that starts at `memory_start`, ends
    /// before `memory_limit` (0: not known) and maps the file from
    /// `file_offset` (pprof's, and OTLP's by default).
    Runtime {
        memory_start: u64,
        memory_limit: u64,
        file_offset: u64,
    },
    /// Already an ELF virtual address (the OpenTelemetry eBPF profiler's
    /// native frames).
    Virtual,
}

/// The lines `source` gives `address`, or why there are none.
pub fn lookup(
    source: &Source,
    address: u64,
    kind: AddressKind,
    symbols: &mut Symbols,
) -> Result<Lines, &'static str> {
    let lines = match source {
        Source::Kernel => symbols.kernel(address),
        Source::Missing(why) => return Err(why),
        Source::File {
            key,
            path,
            id,
            translate,
        } => {
            let addr = match kind {
                AddressKind::Virtual => Some(Addr::Virtual(address)),
                AddressKind::Runtime { memory_limit, .. }
                    if memory_limit != 0 && address >= memory_limit =>
                {
                    None
                }
                AddressKind::Runtime {
                    memory_start,
                    file_offset,
                    ..
                } => translate.addr(address, memory_start, file_offset),
            };
            let Some(addr) = addr else {
                return Err(reason::NOT_FOUND);
            };
            let file = FileRef {
                key,
                path,
                id: *id,
                held: None,
            };
            symbols.file(file, addr)
        }
    };
    if lines.is_empty() {
        Err(reason::NOT_FOUND)
    } else {
        Ok(lines)
    }
}

/// The local paths `m`'s file may be at, in order.
fn local_candidates(m: &MappingId) -> Vec<PathBuf> {
    let path = Path::new(&m.path);
    if !path.is_absolute() {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(2);
    if let Some(pid) = m.pid {
        let mut rooted = PathBuf::from(format!("/proc/{pid}/root"));
        rooted.push(path.strip_prefix("/").unwrap_or(path));
        out.push(rooted);
    }
    out.push(path.to_path_buf());
    out
}

/// A profile's build id string as lowercase hex, or `None` when it is
/// empty or not hex (a Go build id, for one: it cannot find a debug file).
pub fn normalize_build_id(id: &str) -> Option<String> {
    let id = id.trim();
    (id.len() >= 4 && id.len().is_multiple_of(2) && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| id.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translations() {
        assert_eq!(
            Translate::FileOffset.addr(0x5000_1234, 0x5000_0000, 0x1000),
            Some(Addr::FileOffset(0x2234))
        );
        let base = Translate::Base {
            whole: 0,
            executable: 0x1000,
        };
        assert_eq!(
            base.addr(0x5000_1234, 0x5000_0000, 0x1000),
            Some(Addr::Virtual(0x2234)),
            "a mapping of the executable segment"
        );
        assert_eq!(
            base.addr(0x5000_1234, 0x5000_0000, 0),
            Some(Addr::Virtual(0x1234)),
            "a mapping of the whole file"
        );
        assert_eq!(
            Translate::FileOffset.addr(u64::MAX, 0, u64::MAX),
            None,
            "no overflow"
        );
        assert_eq!(
            Translate::FileOffset.addr(0x10, 0x5000_0000, 0),
            None,
            "an address before its mapping"
        );
    }

    #[test]
    fn build_ids() {
        assert_eq!(normalize_build_id("ABcd12"), Some("abcd12".into()));
        assert_eq!(normalize_build_id("go-build/abc"), None);
        assert_eq!(normalize_build_id(""), None);
    }

    #[test]
    fn local_paths_under_the_process_root_first() {
        let m = MappingId {
            path: "/usr/bin/app".into(),
            build_id: None,
            pid: Some(42),
        };
        assert_eq!(
            local_candidates(&m),
            [
                PathBuf::from("/proc/42/root/usr/bin/app"),
                PathBuf::from("/usr/bin/app")
            ]
        );
        let m = MappingId {
            path: "[vdso]".into(),
            build_id: None,
            pid: None,
        };
        assert!(local_candidates(&m).is_empty());
    }

    #[test]
    fn a_missing_file_without_build_id_says_so() {
        let mut s = Sources::new(HostSource::Every, vec![], HostSource::Every);
        let m = MappingId {
            path: "/nonexistent/app".into(),
            build_id: None,
            pid: None,
        };
        assert!(matches!(s.find(&m), Source::Missing(reason::NO_BUILD_ID)));
        let m = MappingId {
            build_id: Some("abcd".into()),
            ..m
        };
        assert!(matches!(s.find(&m), Source::Missing(reason::NOT_FOUND)));
        let m = MappingId {
            path: "[kernel.kallsyms]".into(),
            build_id: None,
            pid: None,
        };
        assert!(matches!(s.find(&m), Source::Kernel));
        let mut off = Sources::new(HostSource::Every, vec![], HostSource::Never);
        assert!(matches!(off.find(&m), Source::Missing(reason::KERNEL_OFF)));
    }
}
