use super::*;

const WAIT: Duration = Duration::from_secs(5);

/// Writes `text` to `path` as tools should: a temporary name that no
/// pattern matches, then a rename, so a scan never sees half a file.
fn write(path: &Path, text: &str) {
    let temp = path.with_extension("tmp");
    fs::write(&temp, text).unwrap();
    fs::rename(&temp, path).unwrap();
}

fn group(targets: &[&str], file: &Path) -> TargetGroup {
    TargetGroup {
        targets: targets.iter().map(|t| t.to_string()).collect(),
        labels: [(FILEPATH_LABEL.to_owned(), file.display().to_string())].into(),
    }
}

struct Running {
    updates: mpsc::Receiver<Update>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(files: Vec<PathBuf>, refresh: Duration, poll: Duration) -> Running {
        let mut d = FileDiscoverer::new(&FileSdConfig {
            files,
            refresh_interval: proflow_config::Duration(refresh),
        });
        d.poll = poll;
        let (tx, updates) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(Box::new(d).run(7, tx, shutdown.clone()));
        Running {
            updates,
            shutdown,
            task,
        }
    }

    async fn next(&mut self) -> Vec<TargetGroup> {
        let update = tokio::time::timeout(WAIT, self.updates.recv())
            .await
            .expect("an update within 5s")
            .expect("the discoverer runs");
        assert_eq!(update.provider, 7);
        update.groups
    }

    /// Asserts that no update comes for a while.
    async fn quiet(&mut self, how_long: Duration) {
        if let Ok(update) = tokio::time::timeout(how_long, self.updates.recv()).await {
            panic!("unexpected update {update:?}");
        }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("run ends on shutdown")
            .unwrap();
    }
}

#[test]
fn globs_match_names() {
    for (glob, name, want) in [
        ("*.json", "a.json", true),
        ("*.json", ".json", true),
        ("*.json", "a.json.tmp", false),
        ("*.json", "a.yml", false),
        ("t-*.json", "t-web.json", true),
        ("t-*.json", "u-web.json", false),
        ("*-*.yml", "a-b-c.yml", true),
        ("a?.json", "ab.json", true),
        ("a?.json", "a.json", false),
        ("a?.json", "abc.json", false),
        ("?é*.json", "xé.json", true),
        ("*", "", true),
        ("**a", "bba", true),
        ("*a*b", "xaxxb", true),
        ("*a*b", "xaxxbc", false),
        ("targets.json", "targets.json", true),
        ("targets.json", "targets.jsonx", false),
    ] {
        assert_eq!(glob_match(glob, name), want, "{glob} ~ {name}");
    }
}

#[tokio::test]
async fn added_rewritten_and_removed_files_are_picked_up() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.json"), dir.path().join("b.yml"));
    // A long refresh: only the metadata checks can see these changes.
    let mut sd = Running::start(
        vec![dir.path().join("*.json"), dir.path().join("*.yml")],
        Duration::from_secs(3600),
        Duration::from_millis(20),
    );
    assert_eq!(sd.next().await, []);

    write(&a, r#"[{"targets": ["a:1", "a:2"]}]"#);
    assert_eq!(sd.next().await, [group(&["a:1", "a:2"], &a)]);

    write(&b, "- targets: [b:1]\n");
    fs::write(dir.path().join("c.txt"), "[]").unwrap();
    assert_eq!(
        sd.next().await,
        [group(&["a:1", "a:2"], &a), group(&["b:1"], &b)]
    );

    write(&a, r#"[{"targets": ["a:2", "a:3"]}]"#);
    assert_eq!(
        sd.next().await,
        [group(&["a:2", "a:3"], &a), group(&["b:1"], &b)]
    );

    fs::remove_file(&a).unwrap();
    assert_eq!(sd.next().await, [group(&["b:1"], &b)]);
    sd.stop().await;
}

#[tokio::test]
async fn a_broken_file_keeps_its_last_good_groups() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    write(
        &a,
        "- targets: [a:1, 'not a target']\n  labels: {env: prod}\n",
    );
    let mut sd = Running::start(
        vec![a.clone()],
        Duration::from_secs(3600),
        Duration::from_millis(20),
    );
    let mut want = group(&["a:1"], &a);
    want.labels.insert("env".into(), "prod".into());
    assert_eq!(sd.next().await, [want]);

    write(&a, "- targets: [a:1\n");
    sd.quiet(Duration::from_millis(300)).await;

    write(&a, "- targets: [a:2]\n");
    assert_eq!(sd.next().await, [group(&["a:2"], &a)]);

    // Broken, then gone: its groups go with it.
    write(&a, "- targets: {}\n");
    sd.quiet(Duration::from_millis(200)).await;
    fs::remove_file(&a).unwrap();
    assert_eq!(sd.next().await, []);
    sd.stop().await;
}

#[tokio::test]
async fn nothing_is_sent_while_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.json");
    write(&a, r#"[{"targets": ["a:1"]}]"#);
    // Full rereads every 30ms and new metadata (the same text written
    // again) must not send the same groups again.
    let mut sd = Running::start(
        vec![dir.path().join("*.json")],
        Duration::from_millis(30),
        Duration::from_millis(30),
    );
    assert_eq!(sd.next().await, [group(&["a:1"], &a)]);
    write(&a, r#"[{"targets": ["a:1"]}]"#);
    sd.quiet(Duration::from_millis(300)).await;
    sd.stop().await;
}

#[tokio::test]
async fn run_ends_when_nobody_listens() {
    let dir = tempfile::tempdir().unwrap();
    let mut sd = Running::start(
        vec![dir.path().join("*.json")],
        Duration::from_millis(10),
        Duration::from_millis(10),
    );
    assert_eq!(sd.next().await, []);
    drop(sd.updates);
    tokio::time::timeout(WAIT, sd.task)
        .await
        .expect("run ends when the receiver is dropped")
        .unwrap();
}

#[test]
fn a_full_refresh_rereads_what_metadata_cannot_tell() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.json");
    fs::write(&a, r#"[{"targets": ["a:1"]}]"#).unwrap();
    let mut files = Files::new(std::slice::from_ref(&a));
    files.scan(false);
    assert_eq!(files.groups(), [group(&["a:1"], &a)]);

    // Same length, same inode, modification time put back: a change
    // that only a reread sees.
    let modified = fs::metadata(&a).unwrap().modified().unwrap();
    let file = fs::OpenOptions::new().write(true).open(&a).unwrap();
    std::io::Write::write_all(&mut &file, br#"[{"targets": ["b:2"]}]"#).unwrap();
    file.set_modified(modified).unwrap();
    drop(file);
    files.scan(false);
    assert_eq!(files.groups(), [group(&["a:1"], &a)]);
    files.scan(true);
    assert_eq!(files.groups(), [group(&["b:2"], &a)]);
}

#[test]
fn files_too_large_are_refused_before_reading() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.json");
    fs::write(&a, r#"[{"targets": ["a:1"]}]"#).unwrap();
    let mut files = Files::new(&[dir.path().join("*.json")]);
    files.scan(false);
    assert_eq!(files.groups(), [group(&["a:1"], &a)]);

    // Sparse: no 16 MiB are written, and none are read.
    let file = fs::OpenOptions::new().write(true).open(&a).unwrap();
    file.set_len(MAX_SD_BYTES as u64 + 1).unwrap();
    drop(file);
    assert!(matches!(read_bounded(&a), Err(ReadError::Failed(e)) if e.contains("16 MiB")));
    files.scan(false);
    assert_eq!(files.groups(), [group(&["a:1"], &a)], "last good kept");
}

#[test]
fn directories_and_missing_dirs_match_nothing() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("d.json")).unwrap();
    let mut files = Files::new(&[
        dir.path().join("*.json"),
        dir.path().join("missing/*.json"),
        dir.path().join("missing.json"),
    ]);
    files.scan(true);
    assert_eq!(files.groups(), []);
    assert!(files.patterns.iter().all(|p| p.said_no_match));
}
