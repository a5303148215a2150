use super::super::sample::tests::record;
use super::*;
use proflow_relabel::Relabeler;

#[test]
fn samples_of_one_stack_count_once_and_become_a_profile() {
    let procs = Processes::new(Relabeler::default(), super::super::config::GroupBy::Process);
    let mut c = Collector::new(procs, None, 10, 19);
    // A process that does not exist (pid far beyond pid_max): its
    // frames keep their addresses, the sample's comm names it.
    let pid = 0x7fff_fff0;
    let rec = record(
        pid,
        "ghost",
        &[0xffff_ffff_8100_0010, 0xffff_ffff_8100_0020],
        &[0x1000, 0x2000],
        (0, 0, 0),
        &[],
    );
    let s = Sample::parse(&rec).unwrap();
    for _ in 0..3 {
        c.add(&s).unwrap();
    }
    let out = c.flush(1_000, 2_000);
    assert_eq!(out.len(), 1);
    let e = &out[0];
    assert_eq!(e.labels.get("__name__"), Some("process_cpu"));
    assert_eq!(e.labels.get("comm"), Some("ghost"));
    assert_eq!(e.labels.get("pid"), Some(pid.to_string().as_str()));
    let p = e.payload.decoded().unwrap();
    assert_eq!(p.sample.len(), 1);
    let period = 1_000_000_000 / 19;
    assert_eq!(p.sample[0].value, [3 * period, 3]);
    // Leaf first: two kernel frames, then two user frames; return
    // addresses are looked up a byte back.
    let addrs: Vec<u64> = p.sample[0]
        .location_id
        .iter()
        .map(|&id| p.location[id as usize - 1].address)
        .collect();
    assert_eq!(
        addrs,
        [0xffff_ffff_8100_0010, 0xffff_ffff_8100_001f, 0x1000, 0x1fff]
    );
    assert_eq!(p.string(p.mapping[0].filename), "[kernel.kallsyms]");
    assert!(
        c.flush(2_000, 3_000).is_empty(),
        "a new interval starts empty"
    );
}

#[test]
fn waits_are_a_profile_of_their_own_with_the_time_waited() {
    let procs = Processes::new(Relabeler::default(), super::super::config::GroupBy::Process);
    let mut c = Collector::new(procs, None, 10, 19);
    let pid = 0x7fff_fff1;
    let tick = record(
        pid,
        "ghost",
        &[0xffff_ffff_8100_0010],
        &[0x1000],
        (0, 0, 0),
        &[],
    );
    let wait = super::super::sample::tests::off_cpu(
        record(
            pid,
            "ghost",
            &[0xffff_ffff_8100_0010],
            &[0x2000],
            (0, 0, 0),
            &[],
        ),
        3_000_000,
    );
    c.add(&Sample::parse(&tick).unwrap()).unwrap();
    for _ in 0..2 {
        c.add(&Sample::parse(&wait).unwrap()).unwrap();
    }
    let mut out = c.flush(1_000, 2_000);
    out.sort_by_key(|e| e.labels.get("__name__").map(str::to_owned));
    assert_eq!(out.len(), 2);
    let (off, cpu) = (&out[0], &out[1]);
    assert_eq!(off.labels.get("__name__"), Some("off_cpu"));
    assert_eq!(cpu.labels.get("__name__"), Some("process_cpu"));
    assert_eq!(off.labels.get("pid"), cpu.labels.get("pid"));
    assert_eq!(
        off.sample_types[0],
        ValueType::new("off_cpu", "nanoseconds")
    );
    let p = off.payload.decoded().unwrap();
    assert_eq!(p.string(p.sample_type[0].r#type), "off_cpu");
    assert_eq!(p.sample.len(), 1);
    assert_eq!(p.sample[0].value, [6_000_000, 2]);
    let p = cpu.payload.decoded().unwrap();
    assert_eq!(p.sample[0].value, [1_000_000_000 / 19, 1]);
}

#[test]
fn a_goroutines_labels_are_its_samples_own() {
    let procs = Processes::new(Relabeler::default(), super::super::config::GroupBy::Process);
    let mut c = Collector::new(procs, None, 10, 19);
    let pid = 0x7fff_fff3;
    let plain = record(pid, "go", &[], &[0x1000], (0, 0, 0), &[]);
    let labelled = |span: &str| {
        super::super::sample::tests::with_go_labels(
            record(pid, "go", &[], &[0x1000], (0, 0, 0), &[]),
            &[("span_id", span), ("route", &"r".repeat(200))],
        )
    };
    let (a, b) = (labelled("00000000000000aa"), labelled("00000000000000bb"));
    for rec in [&plain, &a, &a, &b] {
        c.add(&Sample::parse(rec).unwrap()).unwrap();
    }
    let p = c.flush(0, 1)[0].payload.decoded().unwrap();
    let mut got: Vec<(i64, Vec<(String, String)>)> = p
        .sample
        .iter()
        .map(|s| {
            let labels = s
                .label
                .iter()
                .map(|l| (p.string(l.key).to_owned(), p.string(l.str).to_owned()))
                .collect();
            (s.value[1], labels)
        })
        .collect();
    got.sort();
    let route = format!("{}…", "r".repeat(super::super::sample::GO_VALUE_LEN));
    let with = |span: &str| {
        vec![
            ("span_id".to_owned(), span.to_owned()),
            ("route".to_owned(), route.clone()),
        ]
    };
    assert_eq!(
        got,
        [
            (1, vec![]),
            (1, with("00000000000000bb")),
            (2, with("00000000000000aa")),
        ],
        "one stack, three label sets: three samples, a cut value marked"
    );
}

#[test]
fn stacks_beyond_the_limit_are_dropped_and_counted_by_the_caller() {
    let procs = Processes::new(Relabeler::default(), super::super::config::GroupBy::Process);
    let mut c = Collector::new(procs, None, 1, 19);
    let pid = 0x7fff_fff1;
    let a = record(pid, "x", &[], &[0x1000], (0, 0, 0), &[]);
    let b = record(pid, "x", &[], &[0x2000], (0, 0, 0), &[]);
    c.add(&Sample::parse(&a).unwrap()).unwrap();
    assert_eq!(c.add(&Sample::parse(&b).unwrap()), Err(Dropped::StacksFull));
    c.add(&Sample::parse(&a).unwrap()).unwrap();
    let p = c.flush(0, 1)[0].payload.decoded().unwrap();
    assert_eq!(p.sample[0].value[1], 2);
}

#[test]
fn a_reused_pid_is_a_new_process_and_an_exec_is_seen() {
    // A pid no process has, alive in a `/proc` of the test's own (with
    // nothing to read in it, so names come from the samples).
    let pid = 0x7fff_fff2;
    let proc_root = tempfile::tempdir().unwrap();
    std::fs::create_dir(proc_root.path().join(pid.to_string())).unwrap();
    let procs = Processes::new(Relabeler::default(), super::super::config::GroupBy::Process)
        .with_proc_root(proc_root.path().to_path_buf());
    let mut c = Collector::new(procs, None, 100, 19);
    let first = record(pid, "first", &[], &[0x1000], (0, 0, 0), &[]);
    c.add(&Sample::parse(&first).unwrap()).unwrap();
    // The same pid, started later: another process.
    let mut reused = record(pid, "second", &[], &[0x1000], (0, 0, 0), &[]);
    reused[8..16].copy_from_slice(&99u64.to_le_bytes());
    c.add(&Sample::parse(&reused).unwrap()).unwrap();
    let mut comms: Vec<String> = c
        .flush(0, 1)
        .iter()
        .map(|e| e.labels.get("comm").unwrap_or_default().to_owned())
        .collect();
    comms.sort();
    assert_eq!(comms, ["first", "second"]);

    // The first process exec's another program: same pid and start
    // time, a new executable name, so it is read again.
    let mut exec = record(pid, "third", &[], &[0x1000], (0, 0, 0), &[]);
    exec[32..37].copy_from_slice(b"other");
    c.add(&Sample::parse(&exec).unwrap()).unwrap();
    let out = c.flush(1, 2);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].labels.get("comm"), Some("third"));
    assert_eq!(out[0].labels.get("service_name"), Some("other"));
}

#[inline(never)]
fn a_function_to_name() -> u64 {
    std::hint::black_box(11)
}

/// The function names of the samples of `c`'s next profile, leaf first.
fn names_of(c: &mut Collector) -> Vec<String> {
    let out = c.flush(0, 1);
    let p = out[0].payload.decoded().unwrap();
    p.sample
        .iter()
        .flat_map(|s| s.location_id.iter())
        .flat_map(|&id| p.location[id as usize - 1].line.iter())
        .map(|l| {
            p.string(p.function[l.function_id as usize - 1].name)
                .to_owned()
        })
        .collect()
}

#[test]
fn a_process_gone_before_its_samples_are_read_is_still_named() {
    let addr = a_function_to_name as *const () as u64;
    let _ = a_function_to_name();
    // This test binary's executable mapping, as a process's `/proc/PID`
    // of the test's own gives it (its root: this machine's).
    let line = super::super::procs::own_maps_line(addr);
    let run = |max_held: usize| {
        let pid = 0x7fff_fff3;
        let proc_root = tempfile::tempdir().unwrap();
        let dir = proc_root.path().join(pid.to_string());
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("maps"), format!("{line}\n")).unwrap();
        std::os::unix::fs::symlink("/", dir.join("root")).unwrap();
        let procs = Processes::new(Relabeler::default(), super::super::config::GroupBy::Process)
            .with_proc_root(proc_root.path().to_path_buf())
            .with_max_held(max_held);
        let symbols = Symbols::new(
            super::super::symbols::Limits {
                max_entries: 100,
                max_open: 4,
                max_debug_info: 0,
            },
            Some(Vec::new()),
        );
        let mut c = Collector::new(procs, Some(symbols), 100, 19);
        // Its first sample, in code no file maps: its mappings are read.
        let first = record(pid, "app", &[], &[0x1000], (0, 0, 0), &[]);
        c.add(&Sample::parse(&first).unwrap()).unwrap();
        assert_eq!(c.procs.held_files(), max_held.min(1));
        let _ = names_of(&mut c);
        // It exits; a sample of it read later, in the function.
        std::fs::remove_dir_all(&dir).unwrap();
        let late = record(pid, "app", &[], &[addr], (0, 0, 0), &[]);
        c.add(&Sample::parse(&late).unwrap()).unwrap();
        names_of(&mut c)
    };
    let names = run(8);
    assert!(
        names.iter().any(|n| n.contains("a_function_to_name")),
        "{names:?}"
    );
    // Without the file held, its path is all there is, and it is gone.
    let names = run(0);
    assert!(names.is_empty(), "{names:?}");
}
