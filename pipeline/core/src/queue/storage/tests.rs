//! The store against real files: replay after a restart, deletion of
//! finished segments, damage, and the directory lock.

use super::*;
use crate::telemetry::Telemetry;
use proflow_config::ByteSize;

fn settings(dir: &Path, fsync: Fsync) -> StorageSettings {
    StorageSettings {
        directory: dir.to_owned(),
        max_size: ByteSize::mib(1),
        fsync,
    }
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "proflow-store-{name}-{}-{}",
        std::process::id(),
        proflow_model::model::now_unix_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn open(s: &StorageSettings) -> (Arc<Store>, Vec<Replay>, Arc<Telemetry>) {
    let t = Arc::new(Telemetry::new());
    let (store, replay) = Store::open(s, "pyroscope/eu", t.exporter("pyroscope/eu")).unwrap();
    (store, replay, t)
}

/// A record as the queue writes them: `profiles` then filler.
fn record(profiles: u32, fill: u8, len: usize) -> Vec<u8> {
    let mut r = vec![1u8];
    r.extend_from_slice(&profiles.to_le_bytes());
    r.resize(len, fill);
    r
}

#[tokio::test]
async fn unfinished_records_come_back_in_order_and_finished_ones_do_not() {
    let dir = temp("replay");
    let s = settings(&dir, Fsync::Always);
    let ids: Vec<RecordId> = {
        let (store, replay, _) = open(&s);
        assert!(replay.is_empty());
        let mut ids = Vec::new();
        for i in 0..10u8 {
            let (id, durable) = store.append(&record(u32::from(i) + 1, i, 100));
            store.durable(durable).await.unwrap();
            ids.push(id.unwrap());
        }
        store.ack(ids[0]);
        store.ack(ids[4]);
        ids
    };
    let (store, replay, t) = open(&s);
    let back: Vec<RecordId> = replay.iter().map(|r| r.id).collect();
    let want: Vec<RecordId> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 0 && *i != 4)
        .map(|(_, id)| *id)
        .collect();
    assert_eq!(back, want);
    assert_eq!(replay[0].profiles, 2);
    assert_eq!(store.read(want[1]).unwrap(), record(3, 2, 100));
    assert!(
        t.render().contains(
            r#"proflow_exporter_queue_replayed_records_total{exporter="pyroscope/eu"} 8"#
        )
    );
    // The folder is named after the id, `/` escaped.
    assert!(dir.join("pyroscope~2feu").is_dir());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn finished_segments_are_deleted_and_disk_use_returns() {
    let dir = temp("delete");
    let s = settings(&dir, Fsync::Never);
    let (store, _, _) = open(&s);
    let empty = store.disk_bytes();
    // 1 MiB max_size: segments of 1 MiB; 3 MiB of records make several.
    let mut ids = Vec::new();
    for i in 0..30u8 {
        let (id, _) = store.append(&record(1, i, 100_000));
        ids.push(id.unwrap());
    }
    let folder = s.folder("pyroscope/eu");
    assert!(segment::list(&folder).unwrap().len() >= 3);
    for id in ids {
        store.ack(id);
    }
    // Every sealed segment is gone; the one being written stays.
    assert_eq!(segment::list(&folder).unwrap().len(), 1);
    assert!(
        store.disk_bytes() < empty + 1_100_000,
        "{}",
        store.disk_bytes()
    );
    drop(store);
    let (_, replay, _) = open(&s);
    assert!(replay.is_empty(), "{replay:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn batch_fsync_groups_writes_and_answers_every_one() {
    let dir = temp("group");
    let s = settings(&dir, Fsync::Batch);
    let (store, _, t) = open(&s);
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(store.clone().group_commit(stop.clone()));
    let waits: Vec<_> = (0..50u8)
        .map(|i| {
            let (_, d) = store.append(&record(1, i, 1000));
            let store = store.clone();
            tokio::spawn(async move { store.durable(d).await })
        })
        .collect();
    // Every write is answered (how fast is the machine's, not the code's:
    // the grouping is what the sync count below checks).
    for w in waits {
        w.await.unwrap().unwrap();
    }
    let text = t.render();
    let syncs: f64 = text
        .lines()
        .find(|l| l.starts_with("proflow_exporter_queue_fsync_duration_seconds_count"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        (1.0..=3.0).contains(&syncs),
        "50 writes took {syncs} syncs\n{text}"
    );
    stop.cancel();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_folder_in_use_is_refused_with_a_clear_error() {
    let dir = temp("lock");
    let s = settings(&dir, Fsync::Never);
    let (_held, _, _) = open(&s);
    let t = Arc::new(Telemetry::new());
    let err = Store::open(&s, "pyroscope/eu", t.exporter("x")).unwrap_err();
    assert!(err.contains("another process"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn damage_anywhere_is_counted_and_every_intact_record_kept() {
    let dir = temp("damage");
    let s = settings(&dir, Fsync::Never);
    let ids: Vec<RecordId> = {
        let (store, _, _) = open(&s);
        (0..20u8)
            .map(|i| store.append(&record(1, i, 500 + usize::from(i))).0.unwrap())
            .collect()
    };
    let folder = s.folder("pyroscope/eu");
    let seg = segment::segment_path(&folder, ids[0].segment);
    let original = std::fs::read(&seg).unwrap();
    // A pseudo-random walk of offsets (no RNG dependency needed).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut damaged = original.clone();
        let at = (x % original.len() as u64) as usize;
        if round % 2 == 0 {
            damaged.truncate(at);
        } else {
            damaged[at] ^= 0xff;
        }
        std::fs::write(&seg, &damaged).unwrap();
        let (_, replay, t) = open(&s);
        // Exactly the records wholly intact survive.
        let want: Vec<RecordId> = ids
            .iter()
            .filter(|id| {
                let end = (id.offset + segment::FRAME_HEADER as u64 + u64::from(id.len)) as usize;
                // A damaged header (magic or salt) loses the whole segment.
                if at < segment::SEGMENT_HEADER {
                    return false;
                }
                if round % 2 == 0 {
                    end <= at
                } else {
                    !(id.offset as usize..end).contains(&at)
                }
            })
            .copied()
            .collect();
        let got: Vec<RecordId> = replay.iter().map(|r| r.id).collect();
        assert_eq!(got, want, "round {round}: damage at {at}");
        let damaged_count = ids.len() - want.len();
        if damaged_count > 0 || (round % 2 == 0 && at < original.len()) {
            assert!(
                t.render()
                    .contains(r#"proflow_exporter_queue_corrupt_total{exporter="pyroscope/eu"} 1"#)
                    || at < segment::SEGMENT_HEADER,
                "round {round}: damage at {at} not counted"
            );
        }
        // The new segment each open made is empty: remove it so the next
        // round opens the damaged one alone.
        for n in segment::list(&folder).unwrap() {
            if n != ids[0].segment {
                std::fs::remove_file(segment::segment_path(&folder, n)).unwrap();
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
