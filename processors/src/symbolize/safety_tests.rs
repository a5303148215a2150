//! What a sender or a local user cannot make the processor do: read this
//! host's files or kallsyms for profiles from elsewhere (by default), open
//! a FIFO swapped in for a file (directly, through a `.gnu_debuglink`, or
//! through a dwz `.gnu_debugaltlink`), or pile up stuck workers.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Payload};
use proflow_model::pprof;
use proflow_symbolize::elf::ElfInfo;

use super::tests::{
    Built, build, envelope, expect_full_names, limits, names, profile_of, run, schedule_address,
    start, symbolize_copy,
};
use super::*;

fn pushed() -> BatchMeta {
    BatchMeta {
        receiver: "pprof_push".into(),
        ..Default::default()
    }
}

fn from_ebpf() -> BatchMeta {
    BatchMeta {
        receiver: "ebpf".into(),
        this_host: true,
        ..Default::default()
    }
}

fn metric(t: &Telemetry, name: &str, label: &str) -> f64 {
    let text = t.render();
    let prefix = format!("{name}{{processor=\"symbolize\",{label}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.parse().unwrap())
}

fn frames(t: &Telemetry, result: &str) -> f64 {
    metric(
        t,
        "proflow_symbolize_frames_total",
        &format!("result=\"{result}\""),
    )
}

/// `f` on another thread; panics if it has not returned within a minute
/// (it would be blocked in an open or read: nothing here takes that long).
fn without_blocking<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what}: blocked"))
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    run(Command::new("mkfifo").arg(path));
}

/// A profile of `r` mapping `path` with `b`'s build id, with one more
/// location: a kernel address with no mapping.
fn with_kernel_frame(b: &Built, r: &super::tests::Running, path: &str) -> pprof::Profile {
    let mut p = profile_of(r, path, Some(&b.build_id));
    p.location.push(pprof::Location {
        id: 3,
        mapping_id: 0,
        address: schedule_address() + 1,
        ..Default::default()
    });
    p
}

#[tokio::test]
async fn profiles_from_elsewhere_get_no_local_files_or_kallsyms_by_default() {
    let b = build("origin");
    let r = start(&b.full);
    let profile = with_kernel_frame(&b, &r, b.full.to_str().unwrap());
    let payload = Payload::from_bytes(pprof::encode(&profile), 1 << 20);
    let telemetry = Arc::new(Telemetry::new());
    let config = SymbolizeProcessorConfig {
        debug_dirs: vec![],
        ..Default::default()
    };
    let processor =
        SymbolizeProcessor::new(&config, SymbolizeTelemetry::new(&telemetry, "symbolize"));

    // Pushed: the binary at the named path has the mapping's build id and
    // its DWARF, and the kernel address is one kallsyms names; neither is
    // read for it.
    let out = processor
        .process(vec![envelope(payload.clone())], &pushed())
        .await;
    assert_eq!(out[0].payload.identity(), payload.identity(), "as it came");
    assert_eq!(frames(&telemetry, "local_not_this_host"), 2.0);
    assert_eq!(frames(&telemetry, "kernel_not_this_host"), 1.0);

    // The same profile made by this host's ebpf receiver: named.
    let out = processor
        .process(vec![envelope(payload.clone())], &from_ebpf())
        .await;
    let named = out[0].payload.decoded().unwrap();
    expect_full_names(&named);
    assert_eq!(names(&named)[2][0].0, "schedule");

    // Pushed again: what was decided and opened for this host's profile
    // is not used for it.
    let out = processor
        .process(vec![envelope(payload.clone())], &pushed())
        .await;
    assert_eq!(out[0].payload.identity(), payload.identity());
    assert_eq!(frames(&telemetry, "local_not_this_host"), 4.0);
    assert_eq!(frames(&telemetry, "kernel_not_this_host"), 2.0);

    // `local: true` and `kernel: true`: every profile, pushed ones too.
    let trusting = SymbolizeProcessorConfig {
        local: HostSource::Every,
        kernel: HostSource::Every,
        ..config.clone()
    };
    let t2 = Arc::new(Telemetry::new());
    let processor = SymbolizeProcessor::new(&trusting, SymbolizeTelemetry::new(&t2, "symbolize"));
    let out = processor
        .process(vec![envelope(payload.clone())], &pushed())
        .await;
    let named = out[0].payload.decoded().unwrap();
    expect_full_names(&named);
    assert_eq!(names(&named)[2][0].0, "schedule");
    assert_eq!(frames(&t2, "symbolized"), 3.0);

    // `false`: not even this host's.
    let never = SymbolizeProcessorConfig {
        local: HostSource::Never,
        kernel: HostSource::Never,
        ..config
    };
    let t3 = Arc::new(Telemetry::new());
    let processor = SymbolizeProcessor::new(&never, SymbolizeTelemetry::new(&t3, "symbolize"));
    let out = processor
        .process(vec![envelope(payload.clone())], &from_ebpf())
        .await;
    assert_eq!(out[0].payload.identity(), payload.identity());
    assert_eq!(frames(&t3, "kernel_disabled"), 1.0);
    assert_eq!(frames(&t3, "not_found"), 2.0);
    let _ = std::fs::remove_dir_all(&b.dir);
}

/// The race a FIFO swap exploits: the file is checked (build id), then
/// swapped for a FIFO, then opened to be read. The open finds the FIFO,
/// refuses it without waiting for a writer, and the frames go unnamed.
#[test]
fn a_file_swapped_for_a_fifo_after_it_was_checked_is_not_opened() {
    let b = build("swap");
    let r = start(&b.full);
    let app = b.dir.join("app");
    std::fs::copy(&b.full, &app).unwrap();
    let profile = profile_of(&r, app.to_str().unwrap(), Some(&b.build_id));
    let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
    let mapping = sources::MappingId {
        path: app.to_string_lossy().into_owned(),
        build_id: Some(b.build_id.clone()),
        pid: None,
    };
    let source = sources.find(&mapping);
    assert!(matches!(source, sources::Source::File { .. }), "{source:?}");
    mkfifo(&app);
    let m = &profile.mapping[0];
    let kind = sources::AddressKind::Runtime {
        memory_start: m.memory_start,
        memory_limit: m.memory_limit,
        file_offset: m.file_offset,
    };
    let leaf = r.leaf;
    let found = without_blocking("the lookup after the swap", move || {
        let mut symbols = Symbols::new(limits(), Some(vec![]));
        sources::lookup(&source, leaf, kind, &mut symbols)
    });
    assert_eq!(found, Err(sources::reason::NOT_FOUND));

    // A new decision refuses the FIFO too, and so does the whole
    // processor path.
    let (named, counts) = without_blocking("a new decision", move || {
        let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
        let mut symbols = Symbols::new(limits(), Some(vec![]));
        symbolize_copy(&profile, None, &mut sources, &mut symbols)
    });
    assert!(named.is_none());
    assert_eq!(counts.get("not_found"), Some(&2), "{counts:?}");
    let _ = std::fs::remove_dir_all(&b.dir);
}

/// Once open, a file is read through its descriptor: swapped for a FIFO
/// between two profiles, the second is still named from the file that was
/// checked, and nothing opens the FIFO.
#[tokio::test]
async fn a_file_swapped_for_a_fifo_between_two_profiles_does_not_block_the_worker() {
    let b = build("swap2");
    let r = start(&b.full);
    let app = b.dir.join("app");
    std::fs::copy(&b.full, &app).unwrap();
    let telemetry = Arc::new(Telemetry::new());
    let config = SymbolizeProcessorConfig {
        local: HostSource::Every,
        debug_dirs: vec![],
        ..Default::default()
    };
    let processor =
        SymbolizeProcessor::new(&config, SymbolizeTelemetry::new(&telemetry, "symbolize"));
    let first = profile_of(&r, app.to_str().unwrap(), Some(&b.build_id));
    let out = processor
        .process(
            vec![envelope(Payload::from_bytes(
                pprof::encode(&first),
                1 << 20,
            ))],
            &pushed(),
        )
        .await;
    expect_full_names(&out[0].payload.decoded().unwrap());
    mkfifo(&app);
    // Other addresses of the same function: not in the frame cache.
    let mut second = first.clone();
    for l in &mut second.location {
        l.address += 1;
    }
    let out = processor
        .process(
            vec![envelope(Payload::from_bytes(
                pprof::encode(&second),
                1 << 20,
            ))],
            &pushed(),
        )
        .await;
    let n = names(&out[0].payload.decoded().unwrap());
    assert_eq!(n[0][0].0, "proflow_leaf", "{n:?}");
    assert_eq!(frames(&telemetry, "symbolized"), 4.0);
    assert_eq!(
        metric(
            &telemetry,
            "proflow_symbolize_skipped_profiles_total",
            "reason=\"worker_timeout\""
        ),
        0.0
    );
    let _ = std::fs::remove_dir_all(&b.dir);
}

/// `objcopy --only-keep-debug` and `--add-gnu-debuglink`, as a build that
/// ships debug files next to its binaries does: the stripped binary's
/// `.gnu_debuglink` is followed here (not by blazesym), to a file checked
/// by build id; a FIFO in its place is refused and the symbol table names
/// the frames.
#[test]
fn a_debuglink_is_followed_to_a_checked_file_and_never_to_a_fifo() {
    let b = build("debuglink");
    let r = start(&b.full);
    let dir = b.dir.join("linked");
    std::fs::create_dir_all(&dir).unwrap();
    let debug = dir.join("app.debug");
    let app = dir.join("app");
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&b.full)
        .arg(&debug));
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&b.full)
        .arg(&app));
    let info = ElfInfo::read(&app).unwrap();
    assert!(info.links.debuglink.is_some() && info.debug_size == 0);
    let profile = profile_of(&r, app.to_str().unwrap(), Some(&b.build_id));
    let name = |p: pprof::Profile| {
        without_blocking("symbolize", move || {
            let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
            let mut symbols = Symbols::new(limits(), Some(vec![]));
            symbolize_copy(&p, None, &mut sources, &mut symbols).0
        })
    };
    expect_full_names(&name(profile.clone()).expect("named from the linked debug file"));

    mkfifo(&debug);
    let named = name(profile).expect("named from the symbol table");
    let n = names(&named);
    assert_eq!(
        n[0],
        [("proflow_leaf".into(), String::new(), false)],
        "the symbol table's name, no file or line: {n:?}"
    );
    let _ = std::fs::remove_dir_all(&b.dir);
}

/// A `.gnu_debugaltlink` (what dwz writes) names a supplementary file by
/// path and build id. It is found here by build id in the debug
/// directories and handed to blazesym through the private directory; one
/// that cannot be found (here: the path it names is a FIFO) means the
/// file is read without DWARF, rather than blazesym opening that path.
#[test]
fn a_dwz_supplementary_file_is_found_by_build_id_and_a_fifo_path_is_never_opened() {
    let b = build("altlink");
    let r = start(&b.full);
    // Any ELF file with a build id serves as the supplementary file: this
    // binary's DWARF does not refer into it, but blazesym loads it all the
    // same when the link is there.
    let other = build("altlink-sup");
    let sup_id = other.build_id.clone();
    let debug_dir = b.dir.join("debug-sup");
    let sup = proflow_symbolize::elf::build_id_path(&debug_dir, &sup_id).unwrap();
    std::fs::create_dir_all(sup.parent().unwrap()).unwrap();
    std::fs::copy(&other.full, &sup).unwrap();
    let fifo = b.dir.join("common.dwz");
    mkfifo(&fifo);
    let mut section = fifo.to_str().unwrap().as_bytes().to_vec();
    section.push(0);
    section.extend(
        (0..sup_id.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&sup_id[i..i + 2], 16).unwrap()),
    );
    let section_file = b.dir.join("altlink.section");
    std::fs::write(&section_file, section).unwrap();
    let app = b.dir.join("app");
    run(Command::new("objcopy")
        .arg(format!(
            "--add-section=.gnu_debugaltlink={}",
            section_file.display()
        ))
        .arg(&b.full)
        .arg(&app));
    let info = ElfInfo::read(&app).unwrap();
    assert_eq!(info.links.altlink, Some((fifo.clone(), sup_id.clone())));
    let profile = profile_of(&r, app.to_str().unwrap(), Some(&b.build_id));
    let name = |p: pprof::Profile, dirs: Vec<std::path::PathBuf>| {
        without_blocking("symbolize", move || {
            let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
            let mut symbols = Symbols::new(limits(), Some(dirs));
            let named = symbolize_copy(&p, None, &mut sources, &mut symbols).0;
            (named, symbols.open_files())
        })
    };
    let (named, open) = name(profile.clone(), vec![debug_dir]);
    expect_full_names(&named.expect("named with DWARF"));
    assert_eq!(open, 2, "the binary and its supplementary file");

    // Not in the debug directories: only the FIFO at the named path.
    let (named, open) = name(profile, vec![]);
    let n = names(&named.expect("named from the symbol table"));
    assert_eq!(
        n[0],
        [("proflow_leaf".into(), String::new(), false)],
        "{n:?}"
    );
    assert_eq!(open, 1);
    let _ = std::fs::remove_dir_all(&b.dir);
    let _ = std::fs::remove_dir_all(&other.dir);
}

/// A worker held (as by a file system that does not answer) past the
/// timeout is given up on and replaced, at most MAX_STUCK_WORKERS at a
/// time: then batches go on unnamed at once, counted, and no thread
/// starts; once a stuck worker returns it ends and a new one may start.
#[tokio::test]
async fn stuck_workers_are_given_up_on_and_bounded() {
    let telemetry = Arc::new(Telemetry::new());
    let config = SymbolizeProcessorConfig {
        debug_dirs: vec![],
        ..Default::default()
    };
    let mut processor =
        SymbolizeProcessor::new(&config, SymbolizeTelemetry::new(&telemetry, "symbolize"));
    processor.worker_timeout = Duration::from_millis(50);
    let skipped = |reason: &str| {
        metric(
            &telemetry,
            "proflow_symbolize_skipped_profiles_total",
            &format!("reason=\"{reason}\""),
        )
    };
    let stuck_gauge = || {
        telemetry
            .render()
            .lines()
            .find_map(|l| {
                l.strip_prefix("proflow_symbolize_stuck_workers{processor=\"symbolize\"} ")
                    .map(|v| v.parse::<f64>().unwrap())
            })
            .unwrap()
    };
    let batch = || {
        vec![envelope(Payload::from_bytes(
            pprof::encode(&pprof::Profile::default()),
            1 << 20,
        ))]
    };

    let mut holds = Vec::new();
    for n in 1..=MAX_STUCK_WORKERS {
        holds.push(processor.stall_worker());
        let out = processor.process(batch(), &pushed()).await;
        assert_eq!(out.len(), 1, "the batch goes on");
        assert_eq!(skipped("worker_timeout"), n as f64);
        assert_eq!(stuck_gauge(), n as f64);
    }
    let started = lock(&processor.workers).started;
    assert_eq!(started, MAX_STUCK_WORKERS as u64);
    // The most are stuck: no worker starts, the batch goes on at once.
    let out = processor.process(batch(), &pushed()).await;
    assert_eq!(out.len(), 1);
    assert_eq!(skipped("workers_stuck"), 1.0);
    assert_eq!(lock(&processor.workers).started, started);

    // One returns: it ends (its caches with it), and the next batch gets a
    // new worker, which answers.
    drop(holds.remove(0));
    for _ in 0..600 {
        if stuck_gauge() < MAX_STUCK_WORKERS as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(stuck_gauge(), (MAX_STUCK_WORKERS - 1) as f64);
    processor.worker_timeout = WORKER_TIMEOUT;
    let out = processor.process(batch(), &pushed()).await;
    assert_eq!(out.len(), 1);
    assert_eq!(lock(&processor.workers).started, started + 1);
    assert_eq!(skipped("worker_timeout"), MAX_STUCK_WORKERS as f64);
    assert_eq!(skipped("workers_stuck"), 1.0);
    drop(holds);
}
