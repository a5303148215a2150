//! A debuginfod fetch started by a pushed profile's build id holds the
//! file in memory only as granted from `service.limits.max_in_flight_bytes`.

use std::path::Path;
use std::process::Command;

use super::{
    KillOnDrop, Ports, Proflow, Stripped, common, ebpf_targets, metric, names_of, peer_env,
    profile_of, push, serve_file, stripped,
};
use proflow_symbolize::elf::ElfInfo;

/// A debug file with a build id of its own, padded to `pad` bytes more by a
/// section nothing reads, served by `server`; returns its build id. Made
/// from the C target's source, so the address ranges match `s`'s.
fn serve_padded(server: &peer_env::Peer, s: &Stripped, pad: usize) -> String {
    let id: String = (0..20)
        .map(|i| {
            format!(
                "{:02x}",
                (peer_env::now_nanos() >> (i % 8 * 8)) as u8 ^ i as u8
            )
        })
        .collect();
    let bin = s.dir.join("padded");
    let debug = s.dir.join("padded.debug");
    let padding = s.dir.join("padding");
    // Not compressible, so the file on the wire is as large as on disk.
    let mut state = peer_env::now_nanos() as u64 | 1;
    let bytes: Vec<u8> = (0..pad)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    std::fs::write(&padding, bytes).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ebpf_targets/hot.c");
    let section = format!(".proflow_pad={}", padding.display());
    for (tool, args) in [
        (
            "cc",
            vec![
                "-O2".to_owned(),
                "-g".to_owned(),
                // As ebpf_targets builds `s` (a build id of the same
                // length), so the code is at the same addresses.
                "-fomit-frame-pointer".to_owned(),
                format!("-Wl,--build-id=0x{id}"),
                "-o".to_owned(),
                bin.display().to_string(),
                source.display().to_string(),
            ],
        ),
        (
            "objcopy",
            vec![
                "--only-keep-debug".to_owned(),
                bin.display().to_string(),
                debug.display().to_string(),
            ],
        ),
        (
            "objcopy",
            vec![
                "--add-section".to_owned(),
                section,
                debug.display().to_string(),
            ],
        ),
    ] {
        let status = Command::new(tool).args(&args).status().unwrap();
        assert!(status.success(), "{tool} {args:?} failed");
    }
    assert_eq!(
        ElfInfo::read(&debug).and_then(|i| i.build_id).as_deref(),
        Some(id.as_str())
    );
    let size = std::fs::metadata(&debug).unwrap().len() as usize;
    assert!(size > pad, "{size} bytes");
    serve_file(server, &debug, &id, "padded");
    id
}

/// A pushed profile can name any build id, and each one it names starts a
/// fetch that holds the file in memory: the fetch is granted from the
/// in-flight budget like a request. With a 512 KiB budget (the receiver's
/// limits lowered to fit it), a 1 MiB debug
/// file from the real debuginfod is not fetched (counted as an error, not
/// cached, the profile written unnamed); with the default budget the same
/// file is.
#[test]
fn a_debuginfod_fetch_is_granted_from_the_in_flight_budget() {
    let Some(server) = peer_env::peer("debuginfod") else {
        return;
    };
    let s = stripped();
    let id = serve_padded(&server, &s, 1 << 20);
    let (child, pid) = ebpf_targets::spawn(&s.binary, 60);
    let _child = KillOnDrop(child);
    let start = |budget: &str, cache: &Path| {
        let url = server.http_base();
        let cache = cache.to_path_buf();
        let budget = budget.to_owned();
        Proflow::start(move |ports: &Ports, profiles: &Path| {
            format!(
                "receivers:\n  pprof_push:\n    endpoint: {}\n    max_request_body_size: 64KiB\n    max_decompressed_size: 256KiB\nprocessors:\n  symbolize:\n    local: false\n    debug_dirs: []\n    debuginfod:\n      urls: [{url}]\n      timeout: 30s\n      cache_dir: {}\nexporters:\n  file:\n    directory: {}\nservice:\n  limits:\n    max_in_flight_bytes: {budget}\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n      processors: [symbolize]\n      exporters: [file]\n",
                ports.receiver,
                cache.display(),
                profiles.display(),
                ports.telemetry
            )
        })
    };
    let fetches =
        |p: &Proflow, result: &str| metric(p, "proflow_symbolize_debuginfod_fetches_total", result);

    let cache = s.dir.join("small-cache");
    let small = start("512KiB", &cache);
    let app = common::unique_name("budget");
    push(&small, &app, profile_of(&s, pid, &id));
    let names = names_of(&small, &app, 1);
    assert!(
        !names.iter().any(|f| f == "proflow_hot_two"),
        "named from a file the budget had no room for: {names:?}"
    );
    assert_eq!(fetches(&small, "error"), 1.0, "{}", small.metrics());
    assert_eq!(fetches(&small, "found"), 0.0, "{}", small.metrics());
    assert!(!cache.join(&id).join("debuginfo").exists());
    let log = small.log_text();
    assert!(
        log.contains("than one fetch may hold of service.limits.max_in_flight_bytes"),
        "{log}"
    );

    let cache = s.dir.join("default-cache");
    let default = start("256MiB", &cache);
    push(&default, &app, profile_of(&s, pid, &id));
    let names = names_of(&default, &app, 1);
    assert!(
        names.iter().any(|f| f == "proflow_hot_two"),
        "not named with the default budget: {names:?}\n{}",
        default.log_text()
    );
    assert_eq!(fetches(&default, "found"), 1.0, "{}", default.metrics());
    assert!(cache.join(&id).join("debuginfo").is_file());
}
