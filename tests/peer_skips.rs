//! The peer-skip helper (`tests/common/peer_skip.rs`) that every peer-dependent test
//! goes through: a skip is shown even when libtest captures the test's
//! output, is recorded for `scripts/test`, and is impossible under `CI`.
//!
//! Each case runs this test binary again as a child process, with the
//! environment of the case, on the ignored test [`skips_a_fake_peer`].

#[path = "common/peer_skip.rs"]
mod peer_skip;

use std::process::{Command, Output};

#[test]
#[ignore = "run by the tests below in a child process, with the environment they set"]
fn skips_a_fake_peer() {
    let skipped: Option<()> = peer_skip::unavailable(
        "peer 'fake' is not available.\nsecond line of the report",
        "Nothing installs it.",
    );
    assert!(skipped.is_none());
}

/// Runs [`skips_a_fake_peer`] with output captured as usual, `CI` and
/// `PROFLOW_SKIP_PEERS` as given, and the target directory in `target`.
fn run_child(ci: bool, skip_peers: bool, target: &std::path::Path) -> Output {
    let mut cmd = Command::new(std::env::current_exe().expect("the test binary"));
    cmd.args([
        "--ignored",
        "--exact",
        "skips_a_fake_peer",
        "--test-threads=1",
    ])
    .env_remove("CI")
    .env_remove("PROFLOW_SKIP_PEERS")
    .env("CARGO_TARGET_DIR", target);
    if ci {
        cmd.env("CI", "true");
    }
    if skip_peers {
        cmd.env("PROFLOW_SKIP_PEERS", "1");
    }
    cmd.output().expect("run the test binary")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn skip_is_shown_despite_capture_and_recorded() {
    let target = tempfile::tempdir().expect("a temporary directory");
    let out = run_child(false, true, target.path());
    let all = text(&out);
    assert!(out.status.success(), "the skipping test passes:\n{all}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SKIPPED peer_skips::skips_a_fake_peer (PROFLOW_SKIP_PEERS=1): peer 'fake' is not available."),
        "the notice is on stderr although libtest captured the output:\n{all}"
    );
    let record = std::fs::read_to_string(target.path().join("skipped-peers.txt"))
        .expect("the skip is recorded");
    assert_eq!(
        record,
        "peer_skips::skips_a_fake_peer: peer 'fake' is not available.\n"
    );
}

#[test]
fn under_ci_a_missing_peer_fails_even_with_skip_set() {
    let target = tempfile::tempdir().expect("a temporary directory");
    let out = run_child(true, true, target.path());
    let all = text(&out);
    assert!(!out.status.success(), "must fail under CI:\n{all}");
    assert!(
        all.contains("CI is set: a missing peer fails the run"),
        "{all}"
    );
    assert!(!target.path().join("skipped-peers.txt").exists());
}

#[test]
fn without_skip_set_a_missing_peer_fails_with_the_way_out() {
    let target = tempfile::tempdir().expect("a temporary directory");
    let out = run_child(false, false, target.path());
    let all = text(&out);
    assert!(!out.status.success(), "must fail by default:\n{all}");
    assert!(all.contains("Nothing installs it."), "{all}");
    assert!(all.contains("set PROFLOW_SKIP_PEERS=1"), "{all}");
    assert!(!target.path().join("skipped-peers.txt").exists());
}
