//! Every text and binary body of Pyroscope's `/ingest` (folded `groups`,
//! `lines`, the `tree` and `trie` of older agents, by `format` or by
//! `Content-Type`, and speedscope JSON, sampled, evented and several
//! profiles in one file), sent to the real Pyroscope directly under one service
//! name and through proflow's `pyroscope` exporter under another: both read
//! back with the same totals per function, in the profile type the app
//! name's suffix chose.

mod common;
#[allow(clippy::duplicate_mod)]
mod peer_env;
mod readback;

use std::time::Duration;

const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);
const FUNCTIONS: [&str; 4] = ["main", "foo", "bar", "idle"];

/// One node of a tree or trie body: name, value, child count.
fn node(out: &mut Vec<u8>, name: &str, value: u64, children: u64) {
    uvarint(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
    uvarint(out, value);
    uvarint(out, children);
}

fn uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// main (1) → foo (300), bar (200); idle (40): as a tree.
fn tree() -> Vec<u8> {
    let mut b = Vec::new();
    node(&mut b, "", 0, 2);
    node(&mut b, "main", 1, 2);
    node(&mut b, "foo", 300, 0);
    node(&mut b, "bar", 200, 0);
    node(&mut b, "idle", 40, 0);
    b
}

/// The same stacks as a trie (pieces of `;`-joined keys).
fn trie() -> Vec<u8> {
    let mut b = Vec::new();
    node(&mut b, "", 0, 2);
    node(&mut b, "main", 1, 1);
    node(&mut b, ";", 0, 2);
    node(&mut b, "foo", 300, 0);
    node(&mut b, "bar", 200, 0);
    node(&mut b, "idle", 40, 0);
    b
}

const GROUPS: &str = "main 1\nmain;foo 300\nmain;bar 200\nidle 40\n";

fn lines() -> Vec<u8> {
    let mut out = String::new();
    for (stack, n) in [("main;foo", 30), ("main;bar", 20), ("idle", 4), ("main", 1)] {
        for _ in 0..n {
            out.push_str(stack);
            out.push('\n');
        }
    }
    out.into_bytes()
}

/// Sends `body` as `name.suffix` to Pyroscope and through proflow, and
/// compares what both read back in `profile_type`.
fn same_in_pyroscope(
    what: &str,
    suffix: &str,
    query: &str,
    content_type: &str,
    body: Vec<u8>,
    profile_type: &str,
) {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!("endpoint: {}\n", pyroscope.http_base()),
    );
    let direct = common::unique_name(&format!("fmt-{what}-direct"));
    let through = common::unique_name(&format!("fmt-{what}-proflow"));
    let http = common::http_client();
    let base = pyroscope.http_base();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let (from, until) = (now - 10, now);
    for (to, name) in [(&base, &direct), (&proflow.receiver_url(""), &through)] {
        readback::post_ok(
            &http,
            &format!("{to}/ingest?name={name}{suffix}&from={from}&until={until}{query}"),
            content_type,
            body.clone(),
        );
    }
    match readback::same_service_totals(
        &http,
        &base,
        &direct,
        &through,
        &FUNCTIONS,
        profile_type,
        READ_BACK_TIMEOUT,
        |t| t.len() == FUNCTIONS.len(),
    ) {
        Ok(totals) => eprintln!("{what}: {totals:?}"),
        Err((a, b)) => panic!(
            "{what}: Pyroscope directly {a:?}, through proflow {b:?}\nlog:\n{}",
            proflow.log_text()
        ),
    }
}

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const OCTET: &str = "binary/octet-stream";

#[test]
fn tree_by_format() {
    same_in_pyroscope("tree", ".cpu", "&format=tree", OCTET, tree(), CPU);
}

#[test]
fn tree_by_content_type() {
    same_in_pyroscope(
        "tree-ct",
        "",
        "&sampleRate=50",
        "binary/octet-stream+tree",
        tree(),
        CPU,
    );
}

#[test]
fn trie_by_format() {
    same_in_pyroscope(
        "trie",
        ".alloc_objects",
        "&format=trie",
        OCTET,
        trie(),
        "memory:alloc_objects:count::",
    );
}

#[test]
fn trie_by_content_type() {
    same_in_pyroscope(
        "trie-ct",
        ".cpu",
        "&spyName=gospy",
        "binary/octet-stream+trie",
        trie(),
        CPU,
    );
}

#[test]
fn groups_without_a_format() {
    same_in_pyroscope(
        "groups",
        ".wall",
        "",
        OCTET,
        GROUPS.as_bytes().to_vec(),
        "wall:wall:nanoseconds:cpu:nanoseconds",
    );
}

#[test]
fn lines_by_format() {
    same_in_pyroscope("lines", ".cpu", "&format=lines", OCTET, lines(), CPU);
}

const SPEEDSCOPE_FRAMES: &str = r#""shared": {"frames": [{"name": "main"}, {"name": "foo"}, {"name": "bar"}, {"name": "idle"}]}"#;

fn speedscope(profiles: &str) -> Vec<u8> {
    format!(
        r#"{{"$schema": "https://www.speedscope.app/file-format-schema.json", {SPEEDSCOPE_FRAMES}, "profiles": [{profiles}], "name": "t", "exporter": "test"}}"#
    )
    .into_bytes()
}

const SAMPLED: &str = r#"{"type": "sampled", "name": "first", "unit": "milliseconds", "startValue": 0, "endValue": 7,
    "samples": [[0, 1], [0, 2], [3], [0]], "weights": [3, 2, 1.5, 1]}"#;
const EVENTED: &str = r#"{"type": "evented", "name": "second", "unit": "milliseconds", "startValue": 0, "endValue": 8,
    "events": [{"type": "O", "at": 0, "frame": 0}, {"type": "O", "at": 1, "frame": 1}, {"type": "C", "at": 4, "frame": 1},
               {"type": "O", "at": 4, "frame": 2}, {"type": "C", "at": 6.5, "frame": 2}, {"type": "C", "at": 7, "frame": 0},
               {"type": "O", "at": 7, "frame": 3}, {"type": "C", "at": 8, "frame": 3}]}"#;

#[test]
fn speedscope_sampled() {
    same_in_pyroscope(
        "speedscope-sampled",
        "",
        "&format=speedscope",
        "application/json",
        speedscope(SAMPLED),
        CPU,
    );
}

#[test]
fn speedscope_evented() {
    same_in_pyroscope(
        "speedscope-evented",
        ".cpu",
        "&format=speedscope",
        "application/json",
        speedscope(EVENTED),
        CPU,
    );
}

#[test]
fn speedscope_of_two_profiles() {
    // Each is named after its unit, which makes it a wall profile.
    same_in_pyroscope(
        "speedscope-two",
        "",
        "&format=speedscope",
        "application/json",
        speedscope(&format!("{SAMPLED}, {EVENTED}")),
        "wall:wall:nanoseconds:cpu:nanoseconds",
    );
}
