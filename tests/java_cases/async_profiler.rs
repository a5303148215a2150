//! async-profiler (`tools.profiler:async-profiler` from Maven Central) run
//! by hand on `Plain.java` (`-agentpath`, `event=itimer`, 10 ms), writing
//! its own files: collapsed text and JFR. Each is sent to the real
//! Pyroscope directly and through proflow, and checked against the file's
//! own numbers, exactly:
//! - collapsed: per function, the counts of the lines that hold it, times
//!   10 ms (`sampleRate=100`), is what proflow writes, and Pyroscope reads
//!   the same directly and through proflow;
//! - JFR: per function, the `jdk.ExecutionSample` events that hold it (as
//!   the JDK's own `jfr print` lists them) times 10 ms is what proflow
//!   writes, and Pyroscope reads the same directly and through proflow.

use super::*;

/// async-profiler's sampling interval, and the `sampleRate` that says it.
const INTERVAL_NANOS: i64 = 10_000_000;
const SAMPLE_RATE: &str = "100";
const PLAIN_FUNCTIONS: [&str; 2] = ["Plain.plainHot", "Plain.plainWarm"];
const CPU_TYPE: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// Java, async-profiler's agent and Pyroscope, or `None` when one is missing
/// and skipping is allowed.
fn peers() -> Option<(PathBuf, PathBuf, peer_env::Peer)> {
    let pyroscope = peer_env::peer("pyroscope")?;
    let (java, _) = java_and_agent()?;
    let lib = match common::async_profiler() {
        Ok(l) => l,
        Err(why) => return common::missing_peer(&format!("async-profiler: {why}")),
    };
    Some((java, lib, pyroscope))
}

/// Runs `Plain.java` under async-profiler writing `output` (`collapsed` or
/// `jfr`) to `file`.
fn profile_plain(java: &Path, lib: &Path, output: &str, file: &Path) {
    let log = file.with_extension("log");
    let (status, text) = common::run_bounded(
        Command::new(java)
            .arg(format!(
                "-agentpath:{}=start,event=itimer,interval={INTERVAL_NANOS},{output},file={}",
                lib.display(),
                file.display()
            ))
            .arg(common::peers_dir().join("apps/java/Plain.java"))
            .arg("4"),
        &log,
        RUN_TIMEOUT,
    );
    assert!(
        status.success() && file.is_file(),
        "Plain.java under async-profiler ({output}) failed ({status}) or wrote no {}:\n{text}",
        file.display()
    );
}

/// Sends `body` to Pyroscope directly and through proflow (as two service
/// names, `query` after the name); returns proflow and the two names.
fn send_both(
    pyroscope: &peer_env::Peer,
    what: &str,
    query: &str,
    body: Vec<u8>,
) -> (Proflow, String, String) {
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!("endpoint: {}\n", pyroscope.http_base()),
    );
    let direct = common::unique_name(&format!("asprof-{what}-direct"));
    let through = common::unique_name(&format!("asprof-{what}-proflow"));
    let http = common::http_client();
    for (to, name) in [
        (&pyroscope.http_base(), &direct),
        (&proflow.receiver_url(""), &through),
    ] {
        readback::post_ok(
            &http,
            &format!("{to}/ingest?name={name}{query}"),
            "application/octet-stream",
            body.clone(),
        );
    }
    (proflow, direct, through)
}

/// What proflow wrote of `app` as `process_cpu`, per function.
fn written_cpu(proflow: &Proflow, app: &str) -> Totals {
    let entries = app_files(proflow, app, 1);
    let mut totals = Totals::new();
    for path in files_named(&entries, "process_cpu") {
        common::add_function_totals(
            &mut totals,
            &common::read_profile(&path),
            &PLAIN_FUNCTIONS,
            Some("cpu"),
        );
    }
    totals
}

/// Pyroscope reads the same totals of the two services.
fn same_in_pyroscope(pyroscope: &peer_env::Peer, direct: &str, through: &str, proflow: &Proflow) {
    let http = common::http_client();
    match readback::same_service_totals(
        &http,
        &pyroscope.http_base(),
        direct,
        through,
        &PLAIN_FUNCTIONS,
        CPU_TYPE,
        READ_BACK_TIMEOUT,
        |t| t.len() == PLAIN_FUNCTIONS.len(),
    ) {
        Ok(t) => eprintln!("Pyroscope reads {t:?} directly and through proflow"),
        Err((a, b)) => panic!(
            "Pyroscope directly {a:?}, through proflow {b:?}\nlog:\n{}",
            proflow.log_text()
        ),
    }
}

/// Each own count in nanoseconds.
fn in_nanos(counts: &Totals) -> Totals {
    counts
        .iter()
        .map(|(f, n)| (f.clone(), n * INTERVAL_NANOS))
        .collect()
}

#[test]
fn async_profiler_collapsed_output_arrives_with_its_own_totals() {
    let Some((java, lib, pyroscope)) = peers() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("plain.collapsed");
    profile_plain(&java, &lib, "collapsed", &file);
    let text = std::fs::read_to_string(&file).expect("the collapsed file");
    let mut own = Totals::new();
    for line in text.lines() {
        let (stack, count) = line.rsplit_once(' ').expect("`stack count` lines");
        let count: i64 = count.parse().expect("a count");
        let frames: Vec<&str> = stack.split(';').collect();
        for f in PLAIN_FUNCTIONS {
            if frames.contains(&f) {
                *own.entry(f.to_owned()).or_default() += count;
            }
        }
    }
    assert_eq!(own.len(), 2, "the file holds both functions: {own:?}");
    let query = format!(".cpu&format=folded&sampleRate={SAMPLE_RATE}&spyName=asprof");
    let (proflow, direct, through) = send_both(&pyroscope, "collapsed", &query, text.into_bytes());
    let written = written_cpu(&proflow, &through);
    assert_eq!(
        written,
        in_nanos(&own),
        "proflow wrote per function the file's own counts x 10 ms (counts {own:?})"
    );
    same_in_pyroscope(&pyroscope, &direct, &through, &proflow);
    eprintln!("async-profiler collapsed: counts {own:?}, written {written:?}");
}

#[test]
fn async_profiler_jfr_arrives_with_its_own_sample_counts() {
    let Some((java, lib, pyroscope)) = peers() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("plain.jfr");
    profile_plain(&java, &lib, "jfr", &file);
    // The JDK's own reading of the recording: every execution sample and
    // its whole stack.
    let jfr_tool = java.with_file_name("jfr");
    let out = Command::new(&jfr_tool)
        .args(["print", "--json", "--stack-depth", "4096", "--events"])
        .arg("jdk.ExecutionSample")
        .arg(&file)
        .output()
        .unwrap_or_else(|e| panic!("{} print: {e}", jfr_tool.display()));
    assert!(out.status.success(), "jfr print failed: {out:?}");
    let printed: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("jfr print --json is JSON");
    let events = printed["recording"]["events"]
        .as_array()
        .expect("the recording's events");
    let mut own = Totals::new();
    for e in events {
        let frames: Vec<String> = e["values"]["stackTrace"]["frames"]
            .as_array()
            .map(|fs| {
                fs.iter()
                    .map(|f| {
                        format!(
                            "{}.{}",
                            f["method"]["type"]["name"].as_str().unwrap_or_default(),
                            f["method"]["name"].as_str().unwrap_or_default()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        for f in PLAIN_FUNCTIONS {
            if frames.iter().any(|x| x == f) {
                *own.entry(f.to_owned()).or_default() += 1;
            }
        }
    }
    assert_eq!(own.len(), 2, "the recording holds both functions: {own:?}");
    let query = format!("&format=jfr&sampleRate={SAMPLE_RATE}&spyName=asprof");
    let body = std::fs::read(&file).expect("the recording");
    let (proflow, direct, through) = send_both(&pyroscope, "jfr", &query, body);
    let written = written_cpu(&proflow, &through);
    assert_eq!(
        written,
        in_nanos(&own),
        "proflow wrote per function the recording's own samples x 10 ms ({} events; counts {own:?})",
        events.len()
    );
    same_in_pyroscope(&pyroscope, &direct, &through, &proflow);
    eprintln!(
        "async-profiler JFR: {} execution samples, per function {own:?}, written {written:?}",
        events.len()
    );
}
