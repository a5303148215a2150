//! Tests of the `file` exporter, built the way the collector builds it: YAML →
//! `Factory::parse` → `build`, then `export` called directly.

// The one way a test gives up on a real peer, shared with the end-to-end
// tests: under CI a missing `go` fails the run.
#[path = "../../../tests/common/peer_skip.rs"]
mod peer_skip;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration as StdDuration, SystemTime};

use bytes::Bytes;
use proflow_config::Node;
use proflow_core::component::{BuildContext, ErrorClass, Exporter, ExporterConfig, Resource};
use proflow_core::registry::{AnyConfig, Factory};
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{Envelope, ExportBatch, Labels, Payload, ValueType};
use proflow_model::pprof::{self, ProfileBuilder};
use serde_json::Value;

use super::book::COMPACT_MIN_STALE;
use super::naming::INDEX_FILE;

const START: i64 = 1_700_000_000_000_000_000;

fn factory() -> Factory {
    crate::factories()
        .into_iter()
        .find(|f| f.type_name == "file")
        .expect("file factory is registered")
}

fn parse(yaml: &str) -> Result<Arc<dyn ExporterConfig>, Vec<proflow_config::Error>> {
    let node = Node::parse(yaml).expect("test YAML parses");
    match factory().parse(&node, "exporters.file")? {
        AnyConfig::Exporter(c) => Ok(c),
        other => panic!("file parsed as {other:?}"),
    }
}

fn ctx() -> BuildContext {
    BuildContext {
        id: "file".into(),
        telemetry: Arc::new(Telemetry::new()),
        memory: proflow_model::memory::MemoryBudget::new(1 << 30),
    }
}

/// Builds a file exporter on `dir` with extra YAML lines (indented at top level).
fn exporter(dir: &Path, extra: &str) -> Arc<dyn Exporter> {
    let yaml = format!("directory: '{}'\n{extra}", dir.display());
    let config = parse(&yaml).expect("valid config");
    config.build(&ctx()).expect("file exporter builds")
}

fn gzipped_profile(hot: &str, start: i64) -> Bytes {
    let mut b = ProfileBuilder::new();
    b.sample_type("samples", "count")
        .sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(start, 10_000_000_000);
    b.sample_root_first(["main", "work", hot], vec![3, 30_000_000]);
    b.sample_root_first(["main", "idle"], vec![1, 10_000_000]);
    b.sample_root_first(["main", "work", hot], vec![2, 20_000_000]);
    pprof::gzip(&pprof::encode(&b.build()))
}

fn envelope_from(labels: &[(&str, &str)], start: i64, payload: Payload) -> Envelope {
    Envelope {
        labels: Labels::from_pairs(labels.iter().copied()),
        start_unix_nanos: start,
        end_unix_nanos: start + 10_000_000_000,
        sample_types: vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        period_type: Some(ValueType::new("cpu", "nanoseconds")),
        period: 10_000_000,
        payload,
    }
}

fn envelope(service: Option<&str>, hot: &str) -> Envelope {
    let mut labels = vec![("__name__", "process_cpu"), ("env", "prod")];
    if let Some(s) = service {
        labels.push(("service_name", s));
    }
    let payload = Payload::from_bytes(gzipped_profile(hot, START), 1 << 20);
    envelope_from(&labels, START, payload)
}

fn index_lines(dir: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.join(INDEX_FILE)).expect("index exists");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "index ends with a newline"
    );
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad index line {l:?}: {e}")))
        .collect()
}

/// Every file under `dir` (recursively), relative, `/`-separated.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("readable dir") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).expect("under root");
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn profile_files(dir: &Path) -> Vec<String> {
    files_under(dir)
        .into_iter()
        .filter(|f| f.ends_with(".pb.gz") || f.ends_with(".folded") || f.ends_with(".otlp.json"))
        .collect()
}

#[tokio::test]
async fn pprof_files_are_the_arrived_gzip_bytes_and_are_indexed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "");
    let batch = vec![envelope(Some("checkout"), "hot"), envelope(None, "other")];
    exp.export(&ExportBatch::from(batch.clone()))
        .await
        .expect("export succeeds");

    for e in &batch {
        assert!(!e.payload.is_decoded(), "pprof output must not decode");
    }
    let files = profile_files(tmp.path());
    assert_eq!(files.len(), 2, "{files:?}");
    let lines = index_lines(tmp.path());
    assert_eq!(lines.len(), 2);
    for (line, (e, dir)) in lines
        .iter()
        .zip(batch.iter().zip(["checkout", "unknown_service"]))
    {
        let path = line["path"].as_str().expect("path is a string");
        assert!(
            path.starts_with(&format!("{dir}/{START}-process_cpu-")),
            "{path}"
        );
        assert!(path.ends_with(".pb.gz"), "{path}");
        let written = std::fs::read(tmp.path().join(path)).expect("indexed file exists");
        assert_eq!(
            written,
            e.payload.gzipped().unwrap().as_ref(),
            "bytes are exactly the gzip that arrived"
        );
        assert_eq!(line["labels"]["__name__"], "process_cpu");
        assert_eq!(line["labels"]["env"], "prod");
        assert_eq!(
            line["labels"].as_object().map(|o| o.len()),
            Some(e.labels.len())
        );
        assert_eq!(line["start"], START);
        assert_eq!(line["end"], START + 10_000_000_000);
        assert_eq!(
            line["sample_types"],
            serde_json::json!([
                {"type": "samples", "unit": "count"},
                {"type": "cpu", "unit": "nanoseconds"}
            ])
        );
    }
    assert_eq!(lines[0]["labels"]["service_name"], "checkout");
    assert!(lines[1]["labels"].get("service_name").is_none());
    assert!(!batch[0].payload.is_decoded());
}

#[tokio::test]
async fn fsync_mode_writes_the_same_files() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(
        tmp.path(),
        "fsync: true\nretention:\n  max_total_size: 4KiB\n",
    );
    for i in 0..40 {
        exp.export(&ExportBatch::from(vec![envelope(
            Some("svc"),
            &format!("f{i}"),
        )]))
        .await
        .expect("export succeeds");
    }
    exp.shutdown().await;
    let files = profile_files(tmp.path());
    assert!(!files.is_empty() && files.len() < 40, "{files:?}");
    let lines = index_lines(tmp.path());
    let paths: HashSet<&str> = lines.iter().filter_map(|l| l["path"].as_str()).collect();
    assert!(files.iter().all(|f| paths.contains(f.as_str())));
}

#[tokio::test]
async fn hostile_service_names_stay_inside_the_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("out");
    let exp = exporter(&root, "");
    let batch = vec![
        envelope(Some("../../escape"), "hot"),
        envelope(Some("/etc"), "hot"),
    ];
    exp.export(&ExportBatch::from(batch.clone()))
        .await
        .expect("export succeeds");
    assert_eq!(
        files_under(tmp.path()).len(),
        3,
        "two profiles and the index, all under out/"
    );
    for f in profile_files(&root) {
        let mut parts = f.split('/');
        let dir = parts.next().expect("service dir");
        assert!(!dir.starts_with('.') && !dir.is_empty(), "{f}");
        assert_eq!(parts.count(), 1, "one directory level: {f}");
    }
}

#[tokio::test]
async fn folded_output_has_one_file_per_sample_type() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "format: folded\n");
    exp.export(&ExportBatch::from(vec![envelope(Some("api"), "hot")]))
        .await
        .expect("export succeeds");
    let files = profile_files(tmp.path());
    assert_eq!(files.len(), 2, "{files:?}");
    let lines = index_lines(tmp.path());
    assert_eq!(lines.len(), 2);
    let expected = [
        ("samples", "count", "main;idle 1\nmain;work;hot 5\n"),
        (
            "cpu",
            "nanoseconds",
            "main;idle 10000000\nmain;work;hot 50000000\n",
        ),
    ];
    for (line, (ty, unit, text)) in lines.iter().zip(expected) {
        let path = line["path"].as_str().expect("path");
        assert!(
            path.starts_with("api/") && path.ends_with(&format!("-{ty}.folded")),
            "{path}"
        );
        assert_eq!(
            line["sample_types"],
            serde_json::json!([{"type": ty, "unit": unit}])
        );
        let content = std::fs::read_to_string(tmp.path().join(path)).expect("file exists");
        assert_eq!(content, text);
    }
}

#[tokio::test]
async fn undecodable_payload_is_a_partial_failure_and_the_rest_is_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "format: folded\n");
    let corrupt = Payload::from_bytes(Bytes::from_static(&[0x1f, 0x8b, 1, 2, 3]), 1 << 20);
    let bad = envelope_from(&[("service_name", "bad")], START, corrupt);
    let err = exp
        .export(&ExportBatch::from(vec![bad, envelope(Some("good"), "hot")]))
        .await
        .expect_err("corrupt payload fails");
    assert_eq!(err.class, ErrorClass::Permanent);
    assert_eq!(err.reason, "decode");
    assert_eq!(
        err.refused,
        Some(vec![0]),
        "only the corrupt profile failed; the queue counts the other as delivered"
    );
    assert!(
        err.message.contains("service_name=\"bad\""),
        "{}",
        err.message
    );
    let files = profile_files(tmp.path());
    assert_eq!(files.len(), 2, "the good profile was written: {files:?}");
    assert!(files.iter().all(|f| f.starts_with("good/")));
    assert_eq!(index_lines(tmp.path()).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_exports_never_collide_or_interleave() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "sending_queue:\n  num_consumers: 16\n");
    let mut tasks = tokio::task::JoinSet::new();
    // Same service, name and start for all: only the sequence number tells them apart.
    for i in 0..64 {
        let exp = Arc::clone(&exp);
        tasks.spawn(async move {
            let batch = vec![envelope(Some("svc"), &format!("hot{i}")); 1 + i % 3];
            exp.export(&ExportBatch::from(batch.clone()))
                .await
                .map(|()| batch.len())
        });
    }
    let mut expected = 0;
    while let Some(done) = tasks.join_next().await {
        expected += done.expect("task ran").expect("export succeeds");
    }
    let files = profile_files(tmp.path());
    assert_eq!(files.len(), expected);
    let lines = index_lines(tmp.path());
    assert_eq!(lines.len(), expected);
    let paths: HashSet<&str> = lines.iter().filter_map(|l| l["path"].as_str()).collect();
    assert_eq!(paths.len(), expected, "every line names a distinct file");
    for f in &files {
        assert!(paths.contains(f.as_str()), "{f} is indexed");
    }
    assert!(!files_under(tmp.path()).iter().any(|f| f.ends_with(".tmp")));
}

#[tokio::test]
async fn size_retention_deletes_the_oldest_and_compacts_the_index() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "retention:\n  max_total_size: 64KiB\n");
    let mut written = Vec::new();
    for i in 0..120 {
        exp.export(&ExportBatch::from(vec![envelope(
            Some("svc"),
            &format!("hot{i}"),
        )]))
        .await
        .expect("export succeeds");
        let newest = index_lines(tmp.path())
            .last()
            .and_then(|l| l["path"].as_str().map(str::to_owned))
            .expect("a line for the newest file");
        written.push(newest);
    }
    let files = profile_files(tmp.path());
    let total = disk_usage(tmp.path());
    assert!(total <= 64 << 10, "{total} bytes on disk");
    assert!(files.len() >= 2, "{files:?}");
    // Exactly the newest files survive.
    let newest: Vec<String> = written[written.len() - files.len()..].to_vec();
    let mut newest_sorted = newest.clone();
    newest_sorted.sort();
    assert_eq!(files, newest_sorted);
    assert!(!tmp.path().join(&written[0]).exists());
    // Every live file is indexed, and stale lines were compacted away.
    let lines = index_lines(tmp.path());
    let paths: HashSet<&str> = lines.iter().filter_map(|l| l["path"].as_str()).collect();
    for f in &files {
        assert!(paths.contains(f.as_str()), "{f} is indexed");
    }
    let stale = lines.len() - files.len();
    assert!(
        stale as u64 <= (files.len() as u64).max(COMPACT_MIN_STALE),
        "{stale} stale lines for {} files",
        files.len()
    );
}

/// What everything under `dir` takes on disk: files' and directories'
/// allocated blocks (or their length when more), `dir` itself not counted.
fn disk_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).expect("list").flatten() {
        let meta = entry.metadata().expect("stat");
        total += meta.len().max(meta.blocks() * 512);
        if meta.is_dir() {
            total += disk_usage(&entry.path());
        }
    }
    total
}

#[tokio::test]
async fn size_retention_holds_on_disk_with_ten_thousand_series() {
    // Each series a service of its own: a folder, a file of a few hundred
    // bytes (a 4 KiB block) and an index line each. Retention counted only
    // the files' lengths: 9,000 series under a 1 MiB cap took 74 MB.
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "retention:\n  max_total_size: 1MiB\n");
    let mut peak = 0;
    for batch in 0..100 {
        let envelopes: Vec<Envelope> = (0..100)
            .map(|i| envelope(Some(&format!("svc-{batch}-{i}")), "hot"))
            .collect();
        exp.export(&ExportBatch::from(envelopes))
            .await
            .expect("export succeeds");
        if batch % 10 == 9 {
            peak = peak.max(disk_usage(tmp.path()));
        }
    }
    let total = disk_usage(tmp.path());
    let dirs = std::fs::read_dir(tmp.path())
        .expect("list")
        .flatten()
        .filter(|e| e.path().is_dir())
        .count();
    let files = profile_files(tmp.path());
    eprintln!(
        "10,000 series under 1 MiB: {total} bytes on disk at the end, {peak} at most; {} files, {dirs} folders",
        files.len()
    );
    let cap = 1u64 << 20;
    assert!(
        peak <= cap + cap / 10,
        "{peak} bytes on disk under a {cap}-byte cap"
    );
    assert_eq!(dirs, files.len(), "one folder per live file's service");
    assert!(files.len() >= 50, "{} files kept", files.len());
    // The newest series is always there.
    assert!(
        files.iter().any(|f| f.starts_with("svc-99-99/")),
        "{files:?}"
    );
}

fn age(dir: &Path, files: &[String], by: StdDuration) {
    let when = SystemTime::now() - by;
    for f in files {
        let file = std::fs::File::options()
            .write(true)
            .open(dir.join(f))
            .expect("open to set mtime");
        file.set_modified(when).expect("set mtime");
    }
}

#[tokio::test]
async fn age_retention_applies_at_start_and_after_writes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    {
        let first = exporter(tmp.path(), "");
        first
            .export(&ExportBatch::from(vec![
                envelope(Some("a"), "x"),
                envelope(Some("b"), "y"),
            ]))
            .await
            .expect("export succeeds");
    }
    let old = profile_files(tmp.path());
    assert_eq!(old.len(), 2);
    age(tmp.path(), &old, StdDuration::from_secs(7200));
    let exp = exporter(tmp.path(), "retention:\n  max_age: 1h\n");
    assert!(profile_files(tmp.path()).is_empty(), "expired at start");
    exp.export(&ExportBatch::from(vec![envelope(Some("a"), "z")]))
        .await
        .expect("export succeeds");
    assert_eq!(profile_files(tmp.path()).len(), 1);
}

#[tokio::test]
async fn start_removes_stale_temp_files_repairs_the_index_and_never_reuses_names() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let first_name = {
        let first = exporter(tmp.path(), "");
        first
            .export(&ExportBatch::from(vec![envelope(Some("svc"), "x")]))
            .await
            .expect("export succeeds");
        profile_files(tmp.path()).remove(0)
    };
    let root = tmp.path();
    std::fs::write(root.join(".proflow-77.tmp"), b"partial").expect("write");
    std::fs::write(root.join(".proflow-index.tmp"), b"partial").expect("write");
    std::fs::write(root.join("svc/.proflow-5.tmp"), b"partial").expect("write");
    std::fs::write(root.join("svc/notes.txt"), b"not ours").expect("write");
    // A crash in the middle of an append.
    let mut index = std::fs::read(root.join(INDEX_FILE)).expect("index");
    index.extend_from_slice(br#"{"path":"svc/tru"#);
    std::fs::write(root.join(INDEX_FILE), index).expect("write");

    let exp = exporter(root, "");
    let left = files_under(root);
    assert!(!left.iter().any(|f| f.ends_with(".tmp")), "{left:?}");
    assert!(
        left.contains(&"svc/notes.txt".to_owned()),
        "other files are left alone"
    );
    exp.export(&ExportBatch::from(vec![envelope(Some("svc"), "x")]))
        .await
        .expect("export succeeds");
    let files = profile_files(root);
    assert_eq!(
        files.len(),
        2,
        "same start and name, new sequence number: {files:?}"
    );
    assert!(
        files.contains(&first_name),
        "the first file was not overwritten"
    );
    let lines = index_lines(root);
    assert_eq!(lines.len(), 2, "the partial line was cut");
}

#[tokio::test]
async fn io_errors_are_retryable_with_advice() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("out");
    let exp = exporter(&root, "");
    // Replace a service directory by a file: writing under it cannot work until
    // someone fixes it, which is what retry is for.
    std::fs::write(root.join("svc"), b"in the way").expect("write");
    let err = exp
        .export(&ExportBatch::from(vec![envelope(Some("svc"), "x")]))
        .await
        .expect_err("cannot write under a file");
    assert!(matches!(err.class, ErrorClass::Retryable { .. }), "{err:?}");
    assert_eq!(err.reason, "io");
    assert!(err.message.contains("svc"), "{}", err.message);
    assert!(
        err.message.contains("in the way"),
        "says what to do: {}",
        err.message
    );
    assert!(
        index_lines(&root).is_empty(),
        "nothing indexed for a failed export"
    );
}

#[test]
fn build_fails_with_advice_when_the_directory_cannot_be_created() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let blocker = tmp.path().join("file");
    std::fs::write(&blocker, b"x").expect("write");
    let config =
        parse(&format!("directory: '{}'\n", blocker.join("sub").display())).expect("valid config");
    let err = match config.build(&ctx()) {
        Ok(_) => panic!("a directory under a file cannot be created"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("exporter `file`"), "{err}");
    assert!(err.contains("create directory"), "{err}");
    assert!(err.contains("not a directory"), "says what to do: {err}");
}

#[test]
fn config_defaults_and_resources() {
    let config = parse("directory: out/./profiles\n").expect("valid config");
    let expected = std::env::current_dir()
        .expect("cwd")
        .join("out")
        .join("profiles");
    assert_eq!(config.resources(), vec![Resource::Directory(expected)]);
    assert_eq!(config.sending().sending_queue.num_consumers, 4);
    assert!(config.sending().retry_on_failure.enabled);
    let other = parse("directory: out/x/../profiles\n").expect("valid config");
    assert_eq!(
        other.resources(),
        config.resources(),
        "same directory, same claim"
    );
}

#[test]
fn validation_reports_every_problem_with_its_path() {
    let yaml =
        "directory: ''\nretention:\n  max_total_size: 512\nsending_queue:\n  num_consumers: 0\n";
    let errors = parse(yaml).expect_err("invalid config");
    let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "exporters.file.directory",
            "exporters.file.retention.max_total_size",
            "exporters.file.sending_queue.num_consumers",
        ]
    );
    assert_eq!(errors[1].line, 3, "{:?}", errors[1]);
    assert!(
        errors[1].message.contains("512MiB"),
        "{}",
        errors[1].message
    );

    let missing = parse("format: pprof\n").expect_err("directory is required");
    assert!(missing[0].message.contains("directory"), "{missing:?}");
    let unknown = parse("directory: x\nrotation: {}\n").expect_err("unknown field");
    assert!(unknown[0].message.contains("rotation"), "{unknown:?}");
    let bad_format = parse("directory: x\nformat: json\n").expect_err("unknown format");
    assert!(bad_format[0].path.ends_with("format"), "{bad_format:?}");
    let bad_age = parse("directory: x\nretention:\n  max_age: soon\n").expect_err("bad duration");
    assert!(
        bad_age[0].path.ends_with("retention.max_age"),
        "{bad_age:?}"
    );
}

/// The real-peer check: Go's own pprof reads what we wrote.
#[tokio::test]
async fn go_tool_pprof_reads_the_written_file() {
    let Some(go) = find_go().or_else(|| {
        peer_skip::unavailable(
            "`go` was not found on PATH nor at /usr/local/go/bin/go",
            "Install Go (tests/peers/install-clients) to run the real-peer check.",
        )
    }) else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "");
    exp.export(&ExportBatch::from(vec![envelope(
        Some("svc"),
        "very_hot_function",
    )]))
    .await
    .expect("export succeeds");
    let file = tmp.path().join(profile_files(tmp.path()).remove(0));
    let mut cmd = std::process::Command::new(&go);
    cmd.args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(&file)
        // Never download a toolchain in a test.
        .env("GOTOOLCHAIN", "local");
    if std::env::var_os("GOCACHE").is_none() && std::env::var_os("HOME").is_none() {
        cmd.env("GOCACHE", std::env::temp_dir().join("proflow-go-cache"));
    }
    let out = cmd.output().expect("run go tool pprof");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "go tool pprof failed: {stderr}");
    assert!(stdout.contains("very_hot_function"), "{stdout}\n{stderr}");
    assert!(stdout.contains("samples/count cpu/nanoseconds"), "{stdout}");
}

fn find_go() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("go"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let fallback = PathBuf::from("/usr/local/go/bin/go");
        fallback.is_file().then_some(fallback)
    })
}

#[tokio::test]
async fn otlp_json_files_hold_one_request_with_the_profile_and_its_labels() {
    use proflow_model::otlp;
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "format: otlp_json\n");
    let e = envelope(Some("checkout"), "hot_fn");
    exp.export(&ExportBatch::from(vec![e.clone()]))
        .await
        .expect("export succeeds");
    let files = profile_files(tmp.path());
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(
        files[0].starts_with("checkout/") && files[0].ends_with(".otlp.json"),
        "{files:?}"
    );
    let index = index_lines(tmp.path());
    assert_eq!(index[0]["path"], files[0].as_str());

    let bytes = std::fs::read(tmp.path().join(&files[0])).expect("read");
    let request = otlp::json::decode_request(&bytes).expect("OTLP JSON");
    let rp = &request.resource_profiles[0];
    let attrs: Vec<(String, String)> = rp
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .map(|kv| {
            let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(otlp::common::any_value::Value::StringValue(s)) => s.clone(),
                other => panic!("{other:?}"),
            };
            (kv.key.clone(), v)
        })
        .collect();
    assert_eq!(
        attrs,
        vec![
            ("env".into(), "prod".into()),
            ("service.name".into(), "checkout".into())
        ],
        "labels become resource attributes; __name__ stays proflow's"
    );
    let profiles = &rp.scope_profiles[0].profiles;
    assert_eq!(profiles.len(), 2, "one OTLP profile per sample type");
    let dict = request.dictionary.as_ref().unwrap();
    let back =
        otlp::otlp_to_pprof(dict, profiles, &mut otlp::Lost::default()).expect("converts back");
    let original = e.payload.decoded().unwrap();
    let totals = |p: &pprof::Profile| -> Vec<i64> {
        (0..p.sample_type.len())
            .map(|t| p.sample.iter().map(|s| s.value[t]).sum())
            .collect()
    };
    assert_eq!(totals(&back[0]), totals(&original));
    let names: std::collections::BTreeSet<&str> = back[0]
        .function
        .iter()
        .map(|f| back[0].string_table[f.name as usize].as_str())
        .collect();
    assert!(
        names.contains("hot_fn") && names.contains("main"),
        "{names:?}"
    );
}

#[tokio::test]
async fn an_otlp_profile_is_written_with_its_own_attributes_and_never_converted() {
    use proflow_model::otlp::{self, OtlpContext, OtlpProfiles, common};
    let tmp = tempfile::tempdir().expect("tempdir");
    let exp = exporter(tmp.path(), "format: otlp_json\n");
    // An OTLP profile as a receiver makes it: its resource has an int and an
    // array attribute, which labels cannot carry.
    let pprof_form = envelope(Some("checkout"), "hot_fn").payload.otlp().unwrap();
    let kv = |k: &str, v: common::any_value::Value| common::KeyValue {
        key: k.into(),
        value: Some(common::AnyValue { value: Some(v) }),
        key_strindex: 0,
    };
    let resource = otlp::Resource {
        attributes: vec![
            kv(
                "service.name",
                common::any_value::Value::StringValue("checkout".into()),
            ),
            kv("process.pid", common::any_value::Value::IntValue(42)),
            kv(
                "host.ids",
                common::any_value::Value::ArrayValue(common::ArrayValue {
                    values: vec![common::AnyValue {
                        value: Some(common::any_value::Value::StringValue("a".into())),
                    }],
                }),
            ),
        ],
        ..Default::default()
    };
    let scope = common::InstrumentationScope {
        name: "ebpf-profiler".into(),
        version: "1.0".into(),
        ..Default::default()
    };
    let labels = otlp::AttributeLabels::default().labels(
        &resource,
        &scope,
        &mut proflow_model::lost::LostSamples::default(),
    );
    let ctx = std::sync::Arc::new(OtlpContext {
        resource: resource.clone(),
        scope: scope.clone(),
        labels: labels.clone(),
        ..Default::default()
    });
    let payload = Payload::from_otlp(OtlpProfiles::new(
        pprof_form.dictionary.clone(),
        Some(ctx),
        pprof_form.profiles[..1].to_vec(),
        0,
    ));
    let mut e = envelope(Some("checkout"), "hot_fn");
    e.labels = labels;
    e.payload = payload.clone();
    exp.export(&ExportBatch::from(vec![e]))
        .await
        .expect("export succeeds");
    let files = profile_files(tmp.path());
    let bytes = std::fs::read(tmp.path().join(&files[0])).expect("read");
    let request = otlp::json::decode_request(&bytes).expect("OTLP JSON");
    let rp = &request.resource_profiles[0];
    assert_eq!(
        rp.resource.as_ref(),
        Some(&resource),
        "every attribute as it arrived"
    );
    assert_eq!(rp.scope_profiles[0].scope.as_ref(), Some(&scope));
    assert_eq!(rp.scope_profiles[0].profiles.len(), 1);
    assert!(!payload.is_converted(), "OTLP to OTLP never converts");
}
