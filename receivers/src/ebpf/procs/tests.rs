//! Tests of the process table: container ids and cgroup paths, maps lines,
//! labels, a process that exits, and the files read.

use std::os::unix::fs::MetadataExt;

use super::*;

const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn container_ids_of_every_runtime() {
    for path in [
        format!("/docker/{ID}"),
        format!("/system.slice/docker-{ID}.scope"),
        format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice/cri-containerd-{ID}.scope"
        ),
        format!("/kubepods/burstable/pod7a3f/{ID}"),
        format!("/kubepods.slice/kubepods-pod1.slice/crio-{ID}.scope"),
        format!("/machine.slice/libpod-{ID}.scope/container"),
        format!("/libpod_parent/libpod-{ID}"),
    ] {
        let cgroups = format!("12:cpu:{path}\n0::/\n");
        assert_eq!(container_id(&cgroups).as_deref(), Some(ID), "{path}");
    }
    assert_eq!(container_id("0::/user.slice/session-1.scope\n"), None);
    assert_eq!(
        container_id(&format!("0::/kubepods.slice/crio-conmon-{ID}.scope\n")),
        None
    );
    assert_eq!(
        container_id("0::/docker/abc\n"),
        None,
        "too short for an id"
    );
}

#[test]
fn the_cgroup_path_prefers_v2_then_systemd() {
    assert_eq!(
        cgroup_path("0::/system.slice/x.service\n"),
        "/system.slice/x.service"
    );
    assert_eq!(
        cgroup_path("4:cpu:/a\n1:name=systemd:/b\n0::/\n"),
        "/b",
        "hybrid hierarchy: v2 at the root, v1 systemd's path"
    );
    assert_eq!(cgroup_path("4:cpu:/a\n0::/\n"), "/a");
    assert_eq!(cgroup_path(""), "/");
}

#[test]
fn maps_lines() {
    let l = parse_maps_line(
        "7f0c1a600000-7f0c1a795000 r-xp 00028000 fe:01 1311 /usr/lib/x86_64-linux-gnu/libc.so.6",
    )
    .unwrap();
    assert_eq!(
        (l.start, l.end, l.offset, l.dev, l.inode, l.path),
        (
            0x7f0c1a600000,
            0x7f0c1a795000,
            0x28000,
            "fe:01",
            1311,
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        )
    );
    assert!(parse_maps_line("7f00-7f10 rw-p 00000000 00:00 0 [heap]").is_none());
    assert!(parse_maps_line("7f00-7f10 r-xp 00000000 00:00 0 [vdso]").is_none());
    assert!(parse_maps_line("7f00-7f10 r--p 00000000 fe:01 1 /bin/x").is_none());
    assert!(parse_maps_line("garbage").is_none());
    assert_eq!(
        exec_range("7f00-7f10 r-xp 00000000 00:00 0 [vdso]"),
        Some((0x7f00, 0x7f10))
    );
    assert_eq!(
        exec_range("7f00-7f10 rwxp 00000000 00:00 0"),
        Some((0x7f00, 0x7f10)),
        "JIT code"
    );
    assert_eq!(exec_range("7f00-7f10 rw-p 00000000 00:00 0"), None);
    let d = parse_maps_line("1000-2000 r-xp 00000000 fe:01 9 /tmp/a (deleted)").unwrap();
    assert_eq!(d.path, "/tmp/a");
}

#[test]
fn labels_follow_relabelling_and_the_service_name_rule() {
    let procs = Processes::new(Relabeler::default(), GroupBy::Process);
    let l = procs
        .labels(
            42,
            "postgres",
            "/usr/lib/postgresql/bin/postgres",
            "/",
            Some(ID),
        )
        .unwrap();
    assert_eq!(l.get("pid"), Some("42"));
    assert_eq!(l.get("comm"), Some("postgres"));
    assert_eq!(l.get("container_id"), Some(ID));
    assert_eq!(l.get("service_name"), Some("postgres"));
    assert_eq!(l.get("__name__"), Some("process_cpu"));
    assert!(l.get("__meta_process_exe").is_none());

    let configs: Vec<proflow_relabel::RelabelConfig> = serde_saphyr::from_str(
        "- {source_labels: [__meta_process_comm], regex: 'kworker.*', action: drop}\n- {source_labels: [__meta_container_id], regex: '(.{12}).*', target_label: service_name, replacement: 'ctr-$1'}\n",
    )
    .unwrap();
    let procs = Processes::new(Relabeler::new(&configs).unwrap(), GroupBy::Service);
    assert!(procs.labels(1, "kworker/0:1", "", "/", None).is_none());
    let l = procs.labels(2, "app", "/app", "/", Some(ID)).unwrap();
    assert_eq!(l.get("service_name"), Some("ctr-0123456789ab"));
    assert_eq!(l.get("pid"), None, "group_by: service has no pid label");
}

#[test]
fn a_process_that_exited_is_forgotten_at_the_next_sweep() {
    let mut procs = Processes::new(Relabeler::default(), GroupBy::Process);
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let key = ProcKey {
        pid: child.id(),
        start_time: 1,
    };
    let me = ProcKey {
        pid: std::process::id(),
        start_time: 2,
    };
    // Once it runs sleep (until its exec it is a copy of this test; the
    // exec names it before it maps sleep's code).
    let (comm, maps) = (
        format!("/proc/{}/comm", key.pid),
        format!("/proc/{}/maps", key.pid),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&comm).unwrap_or_default() != "sleep\n"
        || !std::fs::read_to_string(&maps)
            .unwrap_or_default()
            .lines()
            .any(|l| l.contains(" r-xp ") && l.ends_with("/sleep"))
    {
        assert!(Instant::now() < deadline, "sleep did not start");
        std::thread::sleep(Duration::from_millis(5));
    }
    procs.get(key, b"sleep", b"sleep", None, 5);
    procs.get(me, b"test", b"test", None, 5);
    let held = &procs.procs[&key];
    assert!(held.from_proc && !held.mappings.is_empty());
    let labels = held.labels.clone();
    assert_eq!(
        labels.as_ref().and_then(|(l, _)| l.get("comm")),
        Some("sleep")
    );
    procs.sweep(4);
    assert_eq!(procs.len(), 2, "both live and sampled in interval 5");
    child.kill().unwrap();
    child.wait().unwrap();
    procs.sweep(4);
    let gone = &procs.procs[&key];
    assert!(gone.exited, "its /proc is gone");
    assert!(
        gone.mappings.is_empty() && gone.exec_ranges.is_empty(),
        "its mappings are let go at once"
    );
    // A sample of it still in the ring buffer keeps its labels (read
    // from /proc again, the comm would be the sample's thread's).
    let late = procs.get(key, b"thread-1", b"sleep", Some(0x1000), 6);
    assert_eq!(late.labels, labels);
    procs.sweep(4);
    assert_eq!(procs.len(), 1, "the exited one is gone at the next sweep");
    assert!(procs.procs.contains_key(&me));
    procs.sweep(6);
    assert!(procs.is_empty(), "not sampled since interval 6");
}

#[test]
fn the_test_binary_reads_with_build_id_and_unwind_sections() {
    let me = std::env::current_exe().unwrap();
    let held = HeldFiles::with_max(1);
    let b = read_binary(&me, &me.to_string_lossy(), &held, &StateBudget::unbounded());
    assert!(b.unwind.is_some(), "a Rust test binary has .eh_frame");
    assert!(!b.exec_segments.is_empty());
    let missing = read_binary(
        Path::new("/nonexistent"),
        "/nonexistent",
        &held,
        &StateBudget::unbounded(),
    );
    assert!(missing.build_id.is_none() && missing.unwind.is_none());

    // Its descriptor is held (the same file), within the bound, until the
    // binary goes.
    let path = b.held_path().expect("held").to_path_buf();
    let id = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.dev(), m.ino())
    };
    assert_eq!(id(&path), id(&me));
    assert!(missing.held_path().is_none());
    assert_eq!(held.len(), 1);
    let second = read_binary(&me, &me.to_string_lossy(), &held, &StateBudget::unbounded());
    assert!(second.held_path().is_none(), "beyond the bound");
    assert!(second.build_id.is_some(), "read all the same");
    drop(b);
    assert_eq!(held.len(), 0);
}

/// A binary whose `.eh_frame` is gone and whose compressed `.debug_frame`
/// states `inflated` bytes (zeros: a few KB on disk), as a user of the node
/// can make one.
fn compressed_debug_frame(dir: &Path, inflated: usize) -> PathBuf {
    let src = dir.join("tiny.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let bin = dir.join("tiny");
    let zeros = dir.join("zeros");
    std::fs::write(&zeros, vec![0u8; inflated]).unwrap();
    let run = |cmd: &mut std::process::Command| {
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(std::process::Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src));
    run(std::process::Command::new("objcopy")
        .args([
            "--remove-section",
            ".eh_frame",
            "--remove-section",
            ".eh_frame_hdr",
        ])
        .arg("--add-section")
        .arg(format!(".debug_frame={}", zeros.display()))
        .arg(&bin));
    // Compressed in a second step: the step that adds a section does not
    // compress it.
    run(std::process::Command::new("objcopy")
        .arg("--compress-debug-sections=zlib-gabi")
        .arg(&bin));
    assert!(std::fs::metadata(&bin).unwrap().len() < (inflated / 4) as u64);
    bin
}

#[test]
fn an_inflated_debug_frame_is_charged_before_it_is_inflated() {
    let dir = tempfile::tempdir().unwrap();
    let bin = compressed_debug_frame(dir.path(), 4 << 20);
    let held = HeldFiles::with_max(0);
    let path = bin.to_string_lossy();
    // Room for it: inflated, charged at its size until the binary goes.
    let roomy = StateBudget::new(8 << 20);
    let b = read_binary(&bin, &path, &held, &roomy);
    let unwind = b.unwind.as_ref().expect("unwind sections");
    assert!(unwind.eh_frame.is_none());
    assert_eq!(unwind.debug_frame.as_ref().map(|d| d.len()), Some(4 << 20));
    assert!(
        matches!(&unwind.debug_frame, Some(Section::Copied(c)) if c.in_file()),
        "inflated into a private file, not onto the heap"
    );
    assert_eq!(roomy.used_bytes(), 4 << 20);
    let again = read_binary(&bin, &path, &held, &roomy);
    assert!(again.unwind.is_some());
    // A third copy finds no room: left out, counted, nothing inflated.
    let third = read_binary(&bin, &path, &held, &roomy);
    assert!(third.unwind.is_none());
    assert!(third.build_id.is_some(), "the rest of the file is read");
    assert_eq!(
        roomy.refusals(super::super::state_budget::Use::UnwindSection),
        1
    );
    assert_eq!(roomy.used_bytes(), 8 << 20);
    drop((b, again, third));
    assert_eq!(roomy.used_bytes(), 0, "given back with the binaries");
}

/// A file another user could change is not mapped: its unwind sections are
/// copied into private files, charged, and read as they were in the file.
#[test]
fn a_users_file_has_its_sections_copied_into_private_files() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tiny.c");
    std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
    let bin = dir.path().join("tiny");
    let out = std::process::Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Group-writable: not a file only root can change.
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o775)).unwrap();
    let budget = StateBudget::new(1 << 20);
    let b = read_binary(
        &bin,
        &bin.to_string_lossy(),
        &HeldFiles::with_max(0),
        &budget,
    );
    let unwind = b.unwind.as_ref().expect("unwind sections");
    let data = std::fs::read(&bin).unwrap();
    let elf = object::File::parse(&data[..]).unwrap();
    let mut charged = 0;
    for (name, kept) in [
        (".eh_frame", &unwind.eh_frame),
        (".eh_frame_hdr", &unwind.eh_frame_hdr),
    ] {
        let Some((_, Section::Copied(c))) = kept else {
            panic!("{name} copied: {kept:?}");
        };
        assert!(c.in_file(), "{name} in a private file");
        let want =
            object::ObjectSection::data(&object::Object::section_by_name(&elf, name).unwrap())
                .unwrap();
        assert_eq!(c.bytes(), want, "{name}");
        charged += want.len();
    }
    assert_eq!(budget.used_bytes(), charged);
    assert_eq!(b.copied_bytes(), charged);
    drop(b);
    assert_eq!(budget.used_bytes(), 0);
}
