//! The processor against real binaries: a C program compiled here, run,
//! and profiled by hand from its own `/proc/PID/maps` and the runtime
//! addresses it prints; stripped, with its debug file found by build id.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use proflow_core::telemetry::Telemetry;
use proflow_model::model::{Envelope, Labels, Payload};
use proflow_model::pprof;
use proflow_symbolize::elf::ElfInfo;

use super::*;

const PROGRAM: &str = r#"
#include <stdio.h>
#include <unistd.h>
static void *volatile ret;
__attribute__((noinline)) void proflow_leaf(void) {
    ret = __builtin_return_address(0);
    __asm__ volatile("");
}
static inline __attribute__((always_inline)) void proflow_inlined(void) {
    proflow_leaf();
}
__attribute__((noinline)) void proflow_outer(void) {
    proflow_inlined();
    __asm__ volatile("");
}
int main(void) {
    proflow_outer();
    printf("%p %p\n", (void *)proflow_leaf, (void *)((char *)ret - 1));
    fflush(stdout);
    pause();
    return 0;
}
"#;

/// A built program: the stripped binary, its debug file under
/// `debug/.build-id/…`, an unstripped copy, and its build id.
pub(super) struct Built {
    pub(super) dir: PathBuf,
    pub(super) stripped: PathBuf,
    pub(super) full: PathBuf,
    pub(super) build_id: String,
}

pub(super) fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(super) fn build(name: &str) -> Built {
    let dir = std::env::temp_dir().join(format!("proflow-symbolize-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("prog.c"), PROGRAM).unwrap();
    let full = dir.join("prog-full");
    run(Command::new("cc")
        .args(["-O2", "-g", "-Wl,--build-id", "-o"])
        .arg(&full)
        .arg(dir.join("prog.c")));
    let build_id = ElfInfo::read(&full)
        .unwrap()
        .build_id
        .expect("linked with a build id");
    let debug = dir
        .join("debug/.build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..]));
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&full)
        .arg(&debug));
    let stripped = dir.join("prog");
    run(Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&stripped)
        .arg(&full));
    Built {
        dir,
        stripped,
        full,
        build_id,
    }
}

/// A running program and the runtime addresses it printed: its leaf
/// function, and a return address in the function inlined into its caller.
pub(super) struct Running {
    pub(super) child: Child,
    pub(super) leaf: u64,
    pub(super) inlined: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) fn start(binary: &Path) -> Running {
    let mut child = Command::new(binary).stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
    let mut f = line.split_whitespace();
    let (leaf, inlined) = (addr(f.next().unwrap()), addr(f.next().unwrap()));
    Running {
        child,
        leaf,
        inlined,
    }
}

/// A profile of one sample, `[leaf, inlined]`, in the program's executable
/// mapping as `/proc/PID/maps` has it, named as `path` with `build_id`.
pub(super) fn profile_of(r: &Running, path: &str, build_id: Option<&str>) -> pprof::Profile {
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", r.child.id())).unwrap();
    let (start, end, offset) = maps
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (s, e) = f[0].split_once('-')?;
            let (s, e) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            (s <= r.leaf && r.leaf < e && f[1].contains('x'))
                .then(|| (s, e, u64::from_str_radix(f[2], 16).unwrap()))
        })
        .expect("the program's executable mapping");
    let mut strings = vec![
        String::new(),
        "cpu".into(),
        "nanoseconds".into(),
        path.into(),
    ];
    let build_id = build_id.map_or(0, |b| {
        strings.push(b.into());
        strings.len() as i64 - 1
    });
    pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        sample: vec![pprof::Sample {
            location_id: vec![1, 2],
            value: vec![10_000_000],
            label: vec![],
        }],
        mapping: vec![pprof::Mapping {
            id: 1,
            memory_start: start,
            memory_limit: end,
            file_offset: offset,
            filename: 3,
            build_id,
            ..Default::default()
        }],
        location: vec![
            pprof::Location {
                id: 1,
                mapping_id: 1,
                address: r.leaf,
                ..Default::default()
            },
            pprof::Location {
                id: 2,
                mapping_id: 1,
                address: r.inlined,
                ..Default::default()
            },
        ],
        string_table: strings,
        ..Default::default()
    }
}

/// [`profile::symbolize`] on a copy: the named copy, or `None` when
/// nothing changed.
pub(super) fn symbolize_copy(
    p: &pprof::Profile,
    pid: Option<u32>,
    sources: &mut Sources,
    symbols: &mut Symbols,
) -> (Option<pprof::Profile>, profile::Counts) {
    let mut copy = p.clone();
    let (changed, counts) = profile::symbolize(&mut copy, pid, sources, symbols);
    (changed.then_some(copy), counts)
}

pub(super) fn limits() -> Limits {
    Limits {
        max_entries: 1000,
        max_open: 4,
        max_debug_info: 64 << 20,
    }
}

/// Each location's lines as (function, file's base name, has a line).
pub(super) fn names(p: &pprof::Profile) -> Vec<Vec<(String, String, bool)>> {
    let s = |i: i64| p.string_table[i as usize].clone();
    p.location
        .iter()
        .map(|l| {
            l.line
                .iter()
                .map(|line| {
                    let f = p
                        .function
                        .iter()
                        .find(|f| f.id == line.function_id)
                        .unwrap();
                    let file = s(f.filename);
                    let base = file.rsplit('/').next().unwrap_or("").to_owned();
                    (s(f.name), base, line.line > 0)
                })
                .collect()
        })
        .collect()
}

pub(super) fn expect_full_names(p: &pprof::Profile) {
    let n = names(p);
    assert_eq!(
        n[0],
        [("proflow_leaf".into(), "prog.c".into(), true)],
        "{n:?}"
    );
    assert_eq!(
        n[1],
        [
            ("proflow_inlined".into(), "prog.c".into(), true),
            ("proflow_outer".into(), "prog.c".into(), true),
        ],
        "the inlined function first, then its caller: {n:?}"
    );
    let m = &p.mapping[0];
    assert!(
        m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames,
        "{m:?}"
    );
}

#[test]
fn a_stripped_binary_named_from_its_debug_file_by_build_id() {
    let b = build("debugfile");
    let r = start(&b.stripped);
    let profile = profile_of(&r, b.stripped.to_str().unwrap(), Some(&b.build_id));
    let debug_dirs = vec![b.dir.join("debug")];

    // The binary here too: its segments give the exact virtual address.
    let mut sources = Sources::new(HostSource::Every, debug_dirs.clone(), HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(debug_dirs.clone()));
    let (named, counts) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    expect_full_names(&named.expect("named"));
    assert_eq!(counts.get("symbolized"), Some(&2), "{counts:?}");

    // The debug file alone (the binary is on another host).
    let mut sources = Sources::new(HostSource::Never, debug_dirs.clone(), HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(debug_dirs));
    let (named, _) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    expect_full_names(&named.expect("named from the debug file alone"));

    // No debug file: a stripped binary names nothing; counted, not touched.
    let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(vec![]));
    let (named, counts) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    assert!(named.is_none());
    assert_eq!(counts.get("not_found"), Some(&2), "{counts:?}");
    let _ = std::fs::remove_dir_all(&b.dir);
}

#[test]
fn a_local_binary_with_dwarf_and_the_cases_that_cannot_be_named() {
    let b = build("local");
    let r = start(&b.full);
    let path = b.full.to_str().unwrap();

    // By file offset in the binary itself, found through /proc/PID/root.
    let profile = profile_of(&r, path, Some(&b.build_id));
    let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(vec![]));
    let (named, _) = symbolize_copy(&profile, Some(r.child.id()), &mut sources, &mut symbols);
    expect_full_names(&named.expect("named"));

    // A build id that is not the file's: the file is not used.
    let other = "0123456789abcdef0123456789abcdef01234567";
    let profile = profile_of(&r, path, Some(other));
    let (named, counts) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    assert!(named.is_none());
    assert_eq!(counts.get("not_found"), Some(&2), "{counts:?}");

    // No build id and no file at that path.
    let profile = profile_of(&r, "/nonexistent/prog", None);
    let (named, counts) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    assert!(named.is_none());
    assert_eq!(counts.get("no_build_id"), Some(&2), "{counts:?}");

    // A named profile has nothing to do.
    let profile = profile_of(&r, path, Some(&b.build_id));
    let (named, _) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    let (again, counts) = symbolize_copy(&named.unwrap(), None, &mut sources, &mut symbols);
    assert!(again.is_none() && counts.is_empty(), "{counts:?}");
    let _ = std::fs::remove_dir_all(&b.dir);
}

/// A processor with `b`'s debug directory, and its telemetry.
fn processor_for(b: &Built) -> (SymbolizeProcessor, Arc<Telemetry>) {
    let telemetry = Arc::new(Telemetry::new());
    let config = SymbolizeProcessorConfig {
        debug_dirs: vec![b.dir.join("debug")],
        ..Default::default()
    };
    let processor =
        SymbolizeProcessor::new(&config, SymbolizeTelemetry::new(&telemetry, "symbolize"));
    (processor, telemetry)
}

pub(super) fn envelope(payload: Payload) -> Envelope {
    Envelope {
        labels: Labels::from_pairs([("__name__", "process_cpu"), ("service_name", "prog")]),
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        sample_types: vec![],
        period_type: None,
        period: 0,
        payload,
    }
}

#[tokio::test]
async fn the_processor_names_pprof_payloads_and_passes_the_rest_as_they_came() {
    let b = build("processor");
    let r = start(&b.stripped);
    let profile = profile_of(&r, b.stripped.to_str().unwrap(), Some(&b.build_id));
    let (processor, telemetry) = processor_for(&b);
    let bytes = pprof::encode(&profile);
    let gz = pprof::gzip(&bytes);
    let named_already = Payload::from_bytes(
        pprof::encode(&{
            let mut p = profile.clone();
            p.location.clear();
            p.sample.clear();
            p
        }),
        1 << 20,
    );
    let out = processor
        .process(
            vec![
                envelope(Payload::from_bytes(gz, 1 << 20)),
                envelope(named_already.clone()),
            ],
            &BatchMeta::default(),
        )
        .await;
    assert_eq!(out.len(), 2);
    expect_full_names(&out[0].payload.decoded().unwrap());
    assert_eq!(out[0].labels.get("service_name"), Some("prog"));
    assert_eq!(
        out[1].payload.identity(),
        named_already.identity(),
        "nothing to name: the same payload, not re-encoded"
    );
    let metrics = telemetry.render();
    assert!(
        metrics.contains(
            r#"proflow_symbolize_frames_total{processor="symbolize",result="symbolized"} 2"#
        ),
        "{metrics}"
    );

    // The second time, from the cache.
    let again = processor
        .process(
            vec![envelope(Payload::from_bytes(bytes, 1 << 20))],
            &BatchMeta::default(),
        )
        .await;
    expect_full_names(&again[0].payload.decoded().unwrap());
    assert!(
        telemetry
            .render()
            .contains(r#"proflow_symbolize_cache_hits_total{processor="symbolize"} 2"#),
        "{}",
        telemetry.render()
    );
    let _ = std::fs::remove_dir_all(&b.dir);
}

/// The kernel's `schedule` function. Needs root: kallsyms shows other
/// users zero addresses.
pub(super) fn schedule_address() -> u64 {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let schedule = kallsyms
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[1] == "T" && f[2] == "schedule")
                .then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .expect("the kernel has a `schedule` function");
    assert_ne!(
        schedule, 0,
        "kallsyms shows zero addresses: this test needs root (run the test command as root, as CI does)"
    );
    schedule
}

/// Kernel frames, in a `[kernel.kallsyms]` mapping or in no mapping at a
/// kernel address, named from this host's kallsyms. Needs root (CI runs as
/// root): kallsyms shows other users zero addresses.
#[test]
fn kernel_frames_named_from_kallsyms() {
    let schedule = schedule_address();
    let profile = pprof::Profile {
        mapping: vec![pprof::Mapping {
            id: 1,
            filename: 1,
            ..Default::default()
        }],
        location: vec![
            pprof::Location {
                id: 1,
                mapping_id: 1,
                address: schedule + 1,
                ..Default::default()
            },
            pprof::Location {
                id: 2,
                mapping_id: 0,
                address: schedule + 2,
                ..Default::default()
            },
        ],
        string_table: vec![String::new(), "[kernel.kallsyms]".into()],
        ..Default::default()
    };
    let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(vec![]));
    let (named, counts) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    let named = named.expect("named");
    assert_eq!(
        names(&named),
        [
            vec![("schedule".to_owned(), String::new(), false)],
            vec![("schedule".to_owned(), String::new(), false)],
        ]
    );
    assert_eq!(counts.get("symbolized"), Some(&2), "{counts:?}");

    let mut off = Sources::new(HostSource::Every, vec![], HostSource::Never);
    let (named, counts) = symbolize_copy(&profile, None, &mut off, &mut symbols);
    assert!(named.is_none());
    assert_eq!(counts.get("kernel_disabled"), Some(&2), "{counts:?}");
}

/// `profile` as an OTLP payload (proflow's conversion: runtime addresses,
/// the build id as `process.executable.build_id.gnu`); `native` rewrites its
/// locations as the OpenTelemetry eBPF profiler writes native frames: ELF
/// virtual addresses, marked `profile.frame.type: native`.
fn otlp_payload(profile: &pprof::Profile, native: Option<&ElfInfo>) -> Payload {
    use proflow_model::otlp::{self, OtlpProfiles, common};
    let mut dict = otlp::DictionaryBuilder::new();
    let mut lost = otlp::Lost::default();
    let profiles = otlp::pprof_to_otlp(profile, &mut dict, &mut lost).unwrap();
    let mut dict = dict.finish();
    if let Some(info) = native {
        dict.string_table.push(otlp_frame_type_key());
        let key = dict.string_table.len() as i32 - 1;
        dict.attribute_table.push(otlp::proto::KeyValueAndUnit {
            key_strindex: key,
            value: Some(common::AnyValue {
                value: Some(common::any_value::Value::StringValue("native".into())),
            }),
            unit_strindex: 0,
        });
        let attr = dict.attribute_table.len() as i32 - 1;
        let mappings = dict.mapping_table.clone();
        for loc in dict.location_table.iter_mut().skip(1) {
            let m = &mappings[loc.mapping_index as usize];
            loc.address = info
                .vaddr_of_offset(loc.address - m.memory_start + m.file_offset)
                .unwrap();
            loc.attribute_indices.push(attr);
        }
    }
    Payload::from_otlp(OtlpProfiles::decoded(dict, profiles))
}

fn otlp_frame_type_key() -> String {
    super::otlp::FRAME_TYPE_KEY.to_owned()
}

#[tokio::test]
async fn otlp_payloads_named_in_their_dictionary_once_per_request() {
    let b = build("otlp");
    let r = start(&b.stripped);
    let profile = profile_of(&r, b.stripped.to_str().unwrap(), Some(&b.build_id));
    let (processor, telemetry) = processor_for(&b);
    let full = ElfInfo::read(&b.full).unwrap();
    let runtime = otlp_payload(&profile, None);
    let native = otlp_payload(&profile, Some(&full));
    // Two envelopes of one request share its dictionary.
    let out = processor
        .process(
            vec![
                envelope(runtime.clone()),
                envelope(runtime),
                envelope(native),
            ],
            &BatchMeta::default(),
        )
        .await;
    for e in &out {
        assert!(e.payload.has(Format::Otlp) && !e.payload.has(Format::Pprof));
        expect_names_only(&e.payload.decoded().unwrap());
    }
    let a = out[0].payload.otlp().unwrap();
    let b2 = out[1].payload.otlp().unwrap();
    assert!(
        Arc::ptr_eq(&a.dictionary, &b2.dictionary),
        "one named dictionary for the payloads that shared one"
    );
    assert!(
        telemetry.render().contains(
            r#"proflow_symbolize_frames_total{processor="symbolize",result="symbolized"} 4"#
        ),
        "2 frames for the shared dictionary, 2 for the native one: {}",
        telemetry.render()
    );
    let _ = std::fs::remove_dir_all(&b.dir);
}

/// The names and lines of [`expect_full_names`], without the pprof mapping
/// flags (OTLP mappings have none).
fn expect_names_only(p: &pprof::Profile) {
    let n = names(p);
    let leaf = n.iter().find(|l| l.len() == 1).expect("the leaf location");
    assert_eq!(
        leaf,
        &[("proflow_leaf".into(), "prog.c".into(), true)],
        "{n:?}"
    );
    assert!(
        n.contains(&vec![
            ("proflow_inlined".into(), "prog.c".into(), true),
            ("proflow_outer".into(), "prog.c".into(), true),
        ]),
        "{n:?}"
    );
}

const CPP_PROGRAM: &str = r#"
#include <cstdio>
#include <unistd.h>
namespace proflow {
__attribute__((noinline)) int leaf(int x) { return x * 3; }
}
int main() {
    std::printf("%p %p\n", (void *)&proflow::leaf, (void *)&proflow::leaf);
    std::fflush(stdout);
    pause();
    return proflow::leaf(1);
}
"#;

const RUST_PROGRAM: &str = r#"
mod proflow {
    #[inline(never)]
    pub fn leaf(x: u64) -> u64 {
        std::hint::black_box(x * 3)
    }
}
fn main() {
    let f = proflow::leaf as fn(u64) -> u64 as usize;
    println!("{f:#x} {f:#x}");
    std::thread::sleep(std::time::Duration::from_secs(60));
    std::process::exit(proflow::leaf(1) as i32);
}
"#;

/// The demangled name of the function a program prints the address of.
fn leaf_name_of(name: &str, compile: impl FnOnce(&Path, &Path)) -> String {
    let dir = std::env::temp_dir().join(format!("proflow-demangle-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join(name);
    compile(&dir, &bin);
    let r = start(&bin);
    let build_id = ElfInfo::read(&bin).and_then(|i| i.build_id);
    let profile = profile_of(&r, bin.to_str().unwrap(), build_id.as_deref());
    let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(vec![]));
    let (named, _) = symbolize_copy(&profile, None, &mut sources, &mut symbols);
    let n = names(&named.expect("named"));
    let _ = std::fs::remove_dir_all(&dir);
    n[0][0].0.clone()
}

#[test]
fn cpp_and_rust_names_are_demangled() {
    let cpp = leaf_name_of("cpp", |dir, bin| {
        std::fs::write(dir.join("prog.cc"), CPP_PROGRAM).unwrap();
        run(Command::new("c++")
            .args(["-O2", "-g", "-o"])
            .arg(bin)
            .arg(dir.join("prog.cc")));
    });
    assert_eq!(cpp, "proflow::leaf(int)");
    let rust = leaf_name_of("rust", |dir, bin| {
        std::fs::write(dir.join("prog.rs"), RUST_PROGRAM).unwrap();
        run(Command::new("rustc")
            .args(["-O", "-g", "-o"])
            .arg(bin)
            .arg(dir.join("prog.rs")));
    });
    assert!(
        rust.ends_with("proflow::leaf") && !rust.starts_with("_ZN") && !rust.contains("::h"),
        "{rust}"
    );
}

/// What a hostile or broken sender can put in a profile: ids and indexes
/// out of range, a function id at the top of its range, no tables at all,
/// a mapping naming a FIFO. Nothing panics, blocks or is named wrongly.
#[test]
fn hostile_profiles_neither_panic_nor_block() {
    let b = build("hostile");
    let r = start(&b.full);
    let path = b.full.to_str().unwrap();
    let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(vec![]));

    // A function id of u64::MAX leaves no room for new ones: as it came.
    let mut p = profile_of(&r, path, Some(&b.build_id));
    p.function.push(pprof::Function {
        id: u64::MAX,
        name: 0,
        ..Default::default()
    });
    let (named, counts) = symbolize_copy(&p, None, &mut sources, &mut symbols);
    assert!(named.is_none());
    assert_eq!(counts.get("symbolized"), Some(&2), "{counts:?}");

    // Mapping ids, string indexes and addresses out of range.
    let mut p = profile_of(&r, path, Some(&b.build_id));
    p.location[0].mapping_id = 99;
    p.mapping[0].filename = i64::MAX;
    p.mapping[0].build_id = -5;
    p.location[1].address = u64::MAX;
    let (_, counts) = symbolize_copy(&p, None, &mut sources, &mut symbols);
    assert_eq!(counts.get("no_mapping"), Some(&1), "{counts:?}");

    // A mapping naming a FIFO (opening it for reading would block).
    let fifo = b.dir.join("fifo");
    run(Command::new("mkfifo").arg(&fifo));
    let p = profile_of(&r, fifo.to_str().unwrap(), None);
    let (named, counts) = symbolize_copy(&p, None, &mut sources, &mut symbols);
    assert!(named.is_none());
    assert_eq!(counts.get("no_build_id"), Some(&2), "{counts:?}");

    // OTLP without string or function tables (addresses only).
    let mut dict = proflow_model::otlp::proto::ProfilesDictionary::default();
    dict.mapping_table.push(Default::default());
    dict.location_table.push(Default::default());
    dict.location_table
        .push(proflow_model::otlp::proto::Location {
            mapping_index: 7,
            address: schedule_address() + 1,
            ..Default::default()
        });
    let shared = proflow_model::otlp::SharedDictionary::from_decoded(dict);
    let (named, _) = super::otlp::symbolize(&shared, None, &mut sources, &mut symbols);
    let d = named.expect("the kernel frame is named");
    let d = d.decoded().unwrap();
    assert_eq!(d.string_table[0], "", "string 0 stays empty");
    assert_eq!(
        d.function_table[0],
        Default::default(),
        "function 0 stays the zero value"
    );
    let f = d.location_table[1].lines[0].function_index as usize;
    assert!(f > 0);
    assert_eq!(
        d.string_table[d.function_table[f].name_strindex as usize],
        "schedule"
    );
    let _ = std::fs::remove_dir_all(&b.dir);
}
