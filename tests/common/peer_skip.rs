//! The one way an end-to-end test gives up on a real peer (Pyroscope, Kafka, a
//! client library, Go, ...) it cannot have. Used by `common` and `peer_env`.
//!
//! Under `CI` a missing peer is a failure, always. Locally it is a failure
//! too, unless `PROFLOW_SKIP_PEERS=1`: then [`unavailable`] returns `None`, the
//! test returns early and passes, and the skip is made visible twice:
//! - written straight to the process's stderr, which libtest does not capture
//!   (it captures only the `print!`/`eprint!` macros), so the notice shows in
//!   `cargo test` output even though the test passes;
//! - appended to `skipped-peers.txt` in the target directory, which
//!   `scripts/test` prints at the end of the run.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Reports a peer that cannot be had: panics under `CI` and by default (the
/// message says what is missing and `how_to_get_it`); returns `None` after a
/// visible, recorded notice only when `PROFLOW_SKIP_PEERS=1` and `CI` is unset.
pub fn unavailable<T>(what: &str, how_to_get_it: &str) -> Option<T> {
    if std::env::var_os("CI").is_some() {
        panic!("{what}\n(CI is set: a missing peer fails the run)");
    }
    if std::env::var("PROFLOW_SKIP_PEERS").as_deref() != Ok("1") {
        panic!(
            "{what}\n{how_to_get_it} To skip tests that need it locally, set PROFLOW_SKIP_PEERS=1."
        );
    }
    let test = test_name();
    let notice = format!(
        "\n################################################################\n\
         ## SKIPPED {test} (PROFLOW_SKIP_PEERS=1): {what}\n\
         ################################################################\n\n"
    );
    // Not eprint!: libtest would capture it and show it only for a failure.
    let _ = std::io::stderr().write_all(notice.as_bytes());
    record(&format!("{test}: {}", first_line(what)));
    None
}

/// `binary::test` of the running test: libtest names each test's thread
/// after the test.
fn test_name() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        // Cargo appends `-<hash>` to test binaries.
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, _hash)) => name.to_owned(),
            None => stem,
        })
        .unwrap_or_else(|| "?".to_owned());
    let thread = std::thread::current();
    format!("{binary}::{}", thread.name().unwrap_or("?"))
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text)
}

/// The file skips are recorded in: `skipped-peers.txt` in the target directory
/// (`CARGO_TARGET_DIR`, else `target/` of the workspace: the nearest directory
/// with a `Cargo.lock` above the crate whose test is running).
pub fn skip_record() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or(manifest);
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"))
        .join("skipped-peers.txt")
}

/// Appends one line to [`skip_record`]; a failure to record is itself shown.
fn record(line: &str) {
    let path = skip_record();
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        // One write call per line, so lines of parallel tests do not interleave.
        .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
    if let Err(e) = written {
        let _ = std::io::stderr().write_all(
            format!("(could not record the skip in {}: {e})\n", path.display()).as_bytes(),
        );
    }
}
