//! Java services with the stock Pyroscope Java agent (`io.pyroscope:agent`
//! from Maven Central, async-profiler inside), which uploads JFR to
//! `/ingest?format=jfr`: a multipart form with the gzipped recording and the
//! app's dynamic labels.
//!
//! The app (`tests/peers/apps/java/App.java`) burns CPU in `javaHot` and
//! `javaWarm` about 2:1 under the dynamic labels `endpoint=/hot` and
//! `endpoint=/warm`, allocates in `javaAlloc` and contends for a monitor in
//! `javaContend`. Through proflow:
//! - to `file`: `go tool pprof` reads every profile; the CPU split is 2:1
//!   within ten points; `javaAlloc` and `javaContend` lead their profiles;
//!   the static and dynamic labels are there;
//! - to the real Pyroscope (`pyroscope` exporter): the functions' totals are
//!   those the files got, and a dynamic label selects its samples;
//! - one captured upload, sent to Pyroscope directly under one service name
//!   and through proflow under another, reads back the same: the same
//!   profile types with the same totals for the app's functions.
//!
//! And a recording of the JDK's own Flight Recorder
//! (`-XX:StartFlightRecording`, `tests/peers/apps/java/Plain.java`), sent raw:
//! its CPU split and allocations in the files, and the same in Pyroscope
//! whether sent directly or through proflow. async-profiler's own collapsed
//! and JFR files are in `java_cases/async_profiler.rs`.

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use common::{IndexEntry, Proflow, Totals};

#[path = "java_cases/async_profiler.rs"]
mod async_profiler;

/// How long the app runs; the agent uploads every [`UPLOAD_INTERVAL`].
const RUN_SECONDS: &str = "7";
const UPLOAD_INTERVAL: &str = "2s";
const RUN_TIMEOUT: Duration = Duration::from_secs(90);
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

const CPU_FUNCTIONS: [&str; 2] = ["App.javaHot", "App.javaWarm"];
const ALL_FUNCTIONS: [&str; 4] = [
    "App.javaHot",
    "App.javaWarm",
    "App.javaAlloc",
    "App.javaContend",
];

/// The profile types Pyroscope makes of the agent's uploads (itimer CPU,
/// allocations in new TLABs, monitor contention).
const PROFILE_TYPES: [&str; 5] = [
    "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
    "memory:alloc_in_new_tlab_objects:count:space:bytes",
    "memory:alloc_in_new_tlab_bytes:bytes:space:bytes",
    "mutex:contentions:count:mutex:count",
    "mutex:delay:nanoseconds:mutex:count",
];

fn java_and_agent() -> Option<(PathBuf, PathBuf)> {
    match common::java_agent() {
        Ok(j) => Some(j),
        Err(why) => common::missing_peer(&format!("the Pyroscope Java agent: {why}")),
    }
}

/// Runs the app with the agent uploading to `server` as `app`, to its end.
fn run_app(java: &Path, agent: &Path, server: &str, app: &str, log: &Path) {
    let agent_arg = format!("-javaagent:{}", agent.display());
    let (status, output) = common::run_bounded(
        Command::new(java)
            .env("PYROSCOPE_SERVER_ADDRESS", server)
            .env("PYROSCOPE_APPLICATION_NAME", app)
            .env("PYROSCOPE_LABELS", "peer=java")
            .env("PYROSCOPE_PROFILER_EVENT", "itimer")
            .env("PYROSCOPE_PROFILER_ALLOC", "256k")
            .env("PYROSCOPE_PROFILER_LOCK", "1ms")
            .env("PYROSCOPE_UPLOAD_INTERVAL", UPLOAD_INTERVAL)
            .env("PYROSCOPE_LOG_LEVEL", "debug")
            .arg(&agent_arg)
            .arg("-cp")
            .arg(agent)
            .arg(common::peers_dir().join("apps/java/App.java"))
            .arg(RUN_SECONDS),
        log,
        RUN_TIMEOUT,
    );
    assert!(
        status.success(),
        "the Java app failed ({status}):\n{output}"
    );
    assert!(
        output.contains("Upload attempt 1"),
        "the agent uploaded nothing:\n{output}"
    );
    assert!(
        !output.contains("Error uploading"),
        "the agent's uploads were refused:\n{output}"
    );
}

/// The app's files (at least `least`), once the file exporter has written
/// every profile the receiver accepted: the caller's client has exited (the
/// agent flushed at exit) or had its upload answered, so that count is final.
fn app_files(proflow: &Proflow, app: &str, least: usize) -> Vec<IndexEntry> {
    common::wait_all_written(proflow, READ_BACK_TIMEOUT);
    proflow.wait_for_files(least, |e| e.label("service_name") == Some(app))
}

fn files_named(entries: &[IndexEntry], name: &str) -> Vec<PathBuf> {
    entries
        .iter()
        .filter(|e| e.label("__name__") == Some(name))
        .map(|e| e.path.clone())
        .collect()
}

/// `go tool pprof -top` of `files`: the first function line's name.
fn top_function(go: &Path, files: &[PathBuf]) -> String {
    let out = Command::new(go)
        .args(["tool", "pprof", "-top", "-nodecount=1"])
        .args(files)
        .output()
        .expect("go tool pprof runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "go tool pprof -top failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .last()
        .and_then(|l| l.split_whitespace().last())
        .unwrap_or_default()
        .to_owned()
}

/// Per function, the values in `sample_type` of the files' samples whose
/// stack holds it, with the label `endpoint` of those samples.
fn file_totals(files: &[PathBuf], functions: &[&str], sample_type: &str) -> Totals {
    let mut totals = Totals::new();
    for f in files {
        common::add_function_totals(
            &mut totals,
            &common::read_profile(f),
            functions,
            Some(sample_type),
        );
    }
    totals
}

/// The `endpoint` labels on the samples of each of `functions` in `files`.
fn endpoints(files: &[PathBuf], function: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for f in files {
        let p = common::read_profile(f);
        let funcs: std::collections::HashMap<u64, &str> = p
            .function
            .iter()
            .map(|f| (f.id, p.string(f.name)))
            .collect();
        let locs: std::collections::HashMap<u64, u64> = p
            .location
            .iter()
            .filter_map(|l| Some((l.id, l.line.first()?.function_id)))
            .collect();
        for s in &p.sample {
            let has = s
                .location_id
                .iter()
                .any(|l| locs.get(l).and_then(|f| funcs.get(f)) == Some(&function));
            if !has {
                continue;
            }
            let endpoint = s
                .label
                .iter()
                .find(|l| p.string(l.key) == "endpoint")
                .map(|l| p.string(l.str).to_owned())
                .unwrap_or_default();
            out.insert(endpoint);
        }
    }
    out
}

#[test]
fn java_agent_uploads_reach_files_with_its_split_and_labels() {
    let Some((java, agent)) = java_and_agent() else {
        return;
    };
    let go = match common::go() {
        Ok(go) => go,
        Err(why) => return common::missing_peer(&why).unwrap_or(()),
    };
    let proflow = Proflow::start_default("");
    let app = common::unique_name("java-e2e");
    let log = proflow.dir.path().join("java.log");
    run_app(&java, &agent, &proflow.receiver_url(""), &app, &log);
    let entries = app_files(&proflow, &app, 3);
    for e in &entries {
        // The agent's static labels, Pyroscope's and the relabel processor's.
        for (k, v) in [
            ("peer", "java"),
            ("pyroscope_spy", "javaspy"),
            ("jfr_event", "itimer"),
            ("__delta__", "false"),
            ("team", "core"),
        ] {
            assert_eq!(e.label(k), Some(v), "{k}: {:?}", e.raw);
        }
    }
    let cpu = files_named(&entries, "process_cpu");
    let memory = files_named(&entries, "memory");
    let mutex = files_named(&entries, "mutex");
    assert!(
        !cpu.is_empty() && !memory.is_empty() && !mutex.is_empty(),
        "process_cpu, memory and mutex profiles expected: {:?}",
        entries.iter().map(|e| &e.raw).collect::<Vec<_>>()
    );
    // The split, read by go tool pprof.
    let (totals, traces) = common::pprof_trace_totals(&go, &cpu, &CPU_FUNCTIONS);
    let share = 100.0 * totals[0] / (totals[0] + totals[1]);
    assert!(
        (56.7..=76.7).contains(&share),
        "javaHot should take 2/3 of javaHot + javaWarm, took {share:.1}% ({totals:?}):\n{traces}"
    );
    assert_eq!(top_function(&go, &memory), "App.javaAlloc");
    assert_eq!(top_function(&go, &mutex), "App.javaContend");
    // The dynamic labels, on the samples they were set for.
    assert_eq!(
        endpoints(&cpu, "App.javaHot"),
        ["/hot".to_owned()].into(),
        "javaHot's samples"
    );
    assert_eq!(
        endpoints(&cpu, "App.javaWarm"),
        ["/warm".to_owned()].into(),
        "javaWarm's samples"
    );
    eprintln!(
        "{app}: {} files; javaHot {:.0} javaWarm {:.0} ({share:.1}% hot)",
        entries.len(),
        totals[0],
        totals[1]
    );
}

#[test]
fn java_agent_uploads_reach_pyroscope_through_proflow() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some((java, agent)) = java_and_agent() else {
        return;
    };
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!("endpoint: {}\n", pyroscope.http_base()),
    );
    let app = common::unique_name("java-pyro");
    let log = proflow.dir.path().join("java.log");
    run_app(&java, &agent, &proflow.receiver_url(""), &app, &log);
    let entries = app_files(&proflow, &app, 3);
    let cpu = files_named(&entries, "process_cpu");
    let want = file_totals(&cpu, &CPU_FUNCTIONS, "cpu");
    assert_eq!(
        want.len(),
        2,
        "the files lack the app's functions: {want:?}"
    );
    let http = common::http_client();
    let base = pyroscope.http_base();
    let selector = format!("{{service_name=\"{app}\"}}");
    let mut last = (Totals::new(), String::new());
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = readback::pyroscope_totals(
            &http,
            &base,
            &selector,
            &CPU_FUNCTIONS,
            Some(PROFILE_TYPES[0]),
        );
        common::totals_close(&last.0, &want).then_some(())
    });
    assert!(
        same.is_some(),
        "Pyroscope has {:?} ({}) for {app}, the files {want:?}\nlog:\n{}",
        last.0,
        last.1,
        proflow.log_text()
    );
    // A dynamic label selects the samples it was set on.
    let (hot_only, _) = readback::pyroscope_totals(
        &http,
        &base,
        &format!("{{service_name=\"{app}\", endpoint=\"/hot\"}}"),
        &CPU_FUNCTIONS,
        Some(PROFILE_TYPES[0]),
    );
    assert_eq!(
        hot_only.get("App.javaHot"),
        want.get("App.javaHot"),
        "endpoint=/hot: {hot_only:?}"
    );
    assert_eq!(hot_only.get("App.javaWarm"), None, "{hot_only:?}");
    eprintln!("{app}: files {want:?}, Pyroscope {:?}", last.0);
}

/// Each of `types` reads back from Pyroscope with the same (non-empty)
/// totals of `functions` for the service sent `direct` and the one sent
/// `through` proflow.
fn same_types(
    http: &reqwest::blocking::Client,
    base: &str,
    direct: &str,
    through: &str,
    types: &[&str],
    functions: &[&str],
    proflow: &Proflow,
) {
    for ty in types {
        match readback::same_service_totals(
            http,
            base,
            direct,
            through,
            functions,
            ty,
            READ_BACK_TIMEOUT,
            |t| !t.is_empty(),
        ) {
            Ok(totals) => eprintln!("{ty}: {totals:?}"),
            Err((a, b)) => panic!(
                "{ty}: Pyroscope directly {a:?}, through proflow {b:?}\nlog:\n{}",
                proflow.log_text()
            ),
        }
    }
}

/// One request as a client sent it.
struct Upload {
    path_and_query: String,
    content_type: String,
    body: Vec<u8>,
}

/// A bare HTTP/1.1 server on a free port that answers 200 to everything
/// and hands over every request (bodies plain or chunked).
fn capture_server() -> (String, mpsc::Receiver<Upload>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut writer = stream;
                while let Some(upload) = read_request(&mut reader) {
                    let _ = writer.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
                    if tx.send(upload).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (base, rx)
}

fn read_request(r: &mut impl BufRead) -> Option<Upload> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let path_and_query = line.split_whitespace().nth(1)?.to_owned();
    let (mut length, mut chunked, mut content_type) = (0usize, false, String::new());
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = v.trim().parse().ok()?,
            "transfer-encoding" => chunked = v.trim().eq_ignore_ascii_case("chunked"),
            "content-type" => content_type = v.trim().to_owned(),
            _ => {}
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            if size == 0 {
                let mut end = String::new();
                r.read_line(&mut end).ok()?;
                break;
            }
            let at = body.len();
            body.resize(at + size, 0);
            r.read_exact(&mut body[at..]).ok()?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).ok()?;
        }
    } else {
        body.resize(length, 0);
        r.read_exact(&mut body).ok()?;
    }
    Some(Upload {
        path_and_query,
        content_type,
        body,
    })
}

/// The upload's query with the service name `name` (and its tags kept).
fn renamed(path_and_query: &str, name: &str) -> String {
    let (path, query) = path_and_query.split_once('?').expect("a query");
    let query: Vec<String> = query
        .split('&')
        .map(|kv| match kv.split_once('=') {
            Some(("name", v)) => {
                // `app{tags}`, URL-encoded: the tags start at `%7B`.
                let tags = v.find("%7B").map_or("", |i| &v[i..]);
                format!("name={name}{tags}")
            }
            _ => kv.to_owned(),
        })
        .collect();
    format!("{path}?{}", query.join("&"))
}

#[test]
fn a_captured_upload_reads_the_same_from_pyroscope_directly_and_through_proflow() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some((java, agent)) = java_and_agent() else {
        return;
    };
    let (capture, uploads) = capture_server();
    let dir = tempfile::tempdir().expect("tempdir");
    run_app(
        &java,
        &agent,
        &capture,
        "captured.app",
        &dir.path().join("java.log"),
    );
    let uploads: Vec<Upload> = uploads
        .try_iter()
        .filter(|u| u.path_and_query.contains("format=jfr"))
        .collect();
    assert!(!uploads.is_empty(), "the agent sent no JFR upload");
    assert!(
        uploads
            .iter()
            .all(|u| u.content_type.starts_with("multipart/form-data")),
        "the agent sends multipart forms"
    );
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!("endpoint: {}\n", pyroscope.http_base()),
    );
    let direct = common::unique_name("jfr-direct");
    let through = common::unique_name("jfr-proflow");
    let http = common::http_client();
    let base = pyroscope.http_base();
    for u in &uploads {
        for (to, name) in [(&base, &direct), (&proflow.receiver_url(""), &through)] {
            readback::post_ok(
                &http,
                &format!("{to}{}", renamed(&u.path_and_query, name)),
                &u.content_type,
                u.body.clone(),
            );
        }
    }
    // Every type Pyroscope made of the uploads comes back the same through
    // proflow.
    same_types(
        &http,
        &base,
        &direct,
        &through,
        &PROFILE_TYPES,
        &ALL_FUNCTIONS,
        &proflow,
    );
}

#[test]
fn jdk_flight_recordings_read_the_same_through_proflow() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some((java, _)) = java_and_agent() else {
        return;
    };
    let go = match common::go() {
        Ok(go) => go,
        Err(why) => return common::missing_peer(&why).unwrap_or(()),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let recording = dir.path().join("plain.jfr");
    let (status, output) = common::run_bounded(
        Command::new(&java)
            .arg(format!(
                "-XX:StartFlightRecording=filename={},settings=profile",
                recording.display()
            ))
            .arg(common::peers_dir().join("apps/java/Plain.java"))
            .arg(RUN_SECONDS),
        &dir.path().join("java.log"),
        RUN_TIMEOUT,
    );
    assert!(
        status.success(),
        "the Java program failed ({status}):\n{output}"
    );
    let body = std::fs::read(&recording).expect("the recording");
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!("endpoint: {}\n", pyroscope.http_base()),
    );
    let direct = common::unique_name("jdk-direct");
    let through = common::unique_name("jdk-proflow");
    let http = common::http_client();
    let base = pyroscope.http_base();
    for (to, name) in [(&base, &direct), (&proflow.receiver_url(""), &through)] {
        readback::post_ok(
            &http,
            &format!("{to}/ingest?name={name}&format=jfr&spyName=jfr"),
            "application/octet-stream",
            body.clone(),
        );
    }
    let entries = app_files(&proflow, &through, 2);
    let cpu = files_named(&entries, "process_cpu");
    let memory = files_named(&entries, "memory");
    let functions = ["Plain.plainHot", "Plain.plainWarm"];
    let (totals, traces) = common::pprof_trace_totals(&go, &cpu, &functions);
    let share = 100.0 * totals[0] / (totals[0] + totals[1]);
    assert!(
        (56.7..=76.7).contains(&share),
        "plainHot should take 2/3 of plainHot + plainWarm, took {share:.1}% ({totals:?}):\n{traces}"
    );
    assert_eq!(top_function(&go, &memory), "Plain.plainAlloc");
    let all = ["Plain.plainHot", "Plain.plainWarm", "Plain.plainAlloc"];
    same_types(
        &http,
        &base,
        &direct,
        &through,
        &[
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
            "memory:alloc_sample_objects:count:space:bytes",
            "memory:alloc_sample_bytes:bytes:space:bytes",
        ],
        &all,
        &proflow,
    );
    // The sampling events Pyroscope makes no profile of are counted as
    // lost, as many as the JDK's own `jfr summary` finds.
    let jfr_tool = java.with_file_name("jfr");
    let summary = Command::new(&jfr_tool)
        .arg("summary")
        .arg(&recording)
        .output()
        .unwrap_or_else(|e| panic!("{} summary: {e}", jfr_tool.display()));
    let summary = String::from_utf8_lossy(&summary.stdout);
    let unsupported: u64 = summary
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            let count = words.next()?.parse::<u64>().ok()?;
            [
                "jdk.NativeMethodSample",
                "jdk.CPUTimeSample",
                "jdk.OldObjectSample",
            ]
            .contains(&name)
            .then_some(count)
        })
        .sum();
    let lost = common::metric_sum(
        &proflow.metrics(),
        "proflow_receiver_lost_samples_total",
        &[("reason", "unsupported_event")],
    );
    assert_eq!(
        lost, unsupported as f64,
        "unsupported sampling events counted as lost; jfr summary:\n{summary}"
    );
    // The JDK names every frame it records.
    let parts = common::metric_sum(&proflow.metrics(), "proflow_receiver_lost_parts_total", &[]);
    assert_eq!(parts, 0.0, "no frame of a JDK recording is left out");
    eprintln!(
        "JDK recording: {share:.1}% hot ({totals:?}); {unsupported} sampling events of kinds Pyroscope makes no profile of, counted as lost"
    );
}
