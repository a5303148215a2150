//! The scrape receiver's cumulative profiles (memory, mutex, block) as
//! deltas, against goscrape: each delta the difference of the profiles
//! served (exactly), steady totals per interval, a target whose
//! process restarts at the same address, and the godeltaprof and fgprof
//! endpoints, whose profiles are passed on as served.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proflow_model::pprof::Profile;

/// The total of sample type `ty` over every sample.
fn type_total(p: &Profile, ty: &str) -> i64 {
    let Some(i) = p.sample_type.iter().position(|t| p.string(t.r#type) == ty) else {
        return 0;
    };
    p.sample.iter().filter_map(|s| s.value.get(i)).sum()
}

/// Whether `p` is what a first scrape (or the first after a restart)
/// emits: its in-use values, nothing allocated.
fn in_use_only(p: &Profile) -> bool {
    type_total(p, "alloc_space") == 0
        && type_total(p, "alloc_objects") == 0
        && type_total(p, "inuse_space") > 0
}

use super::{ALLOC_RATE, go_target, only, start, total_in, wait_entries, wait_targets};
use crate::common::{self, IndexEntry, Proflow};

#[test]
fn cumulative_profiles_arrive_as_deltas_with_steady_totals() {
    // Every allocation recorded (not one per 512 KiB on average): a delta's
    // total is then the bytes goAllocLoop really allocated in it, not a
    // scaled sample of two dozen, which strayed past a factor of two.
    let Some(target) = go_target(&["-mem-profile-rate", "1"]) else {
        return;
    };
    let proflow = start(&format!(
        "- job_name: delta-job\n  scrape_interval: 3s\n  scrape_timeout: 2s\n  \
         static_configs: [{{targets: ['{}']}}]\n  {}\n",
        target.endpoint,
        only(&["memory", "mutex", "block"])
    ));
    let memory = wait_entries(&proflow, 6, Duration::from_secs(60), |e| {
        e.label("__name__") == Some("memory")
    });
    // The first scrape primes the deltas and sends what is in use now.
    let first = common::read_profile(&memory[0].path);
    assert!(
        in_use_only(&first),
        "the first memory profile holds its in-use values alone: alloc_space {}, inuse_space {}",
        type_total(&first, "alloc_space"),
        type_total(&first, "inuse_space")
    );
    let mut rates = Vec::new();
    let (mut all_bytes, mut all_seconds) = (0i64, 0.0f64);
    for e in &memory[1..6] {
        let p = common::read_profile(&e.path);
        let seconds = p.duration_nanos as f64 / 1e9;
        assert!(
            (2.0..=4.5).contains(&seconds),
            "a delta covers one interval (3s), this one {seconds}s"
        );
        let bytes = total_in(&p, "alloc_space", "main.goAllocLoop");
        assert!(bytes > 0, "a delta of goAllocLoop with {bytes} bytes");
        rates.push(bytes as f64 / seconds);
        all_bytes += bytes;
        all_seconds += seconds;
        // inuse_* are snapshots, not deltas: still there.
        assert!(
            p.sample_type
                .iter()
                .any(|t| p.string(t.r#type) == "inuse_space")
        );
    }
    // What a delta holds is what Go published between two scrapes, and Go
    // publishes the allocation profile at the end of each GC cycle (about
    // one a second at 4 MiB/s): one delta's window is the interval give or
    // take one cycle at either end, so one delta of 3 s holds about 2 to 4
    // s of allocations (measured over six runs of five deltas: 0.68x to
    // 1.30x the rate; a late scrape on a busy machine adds to that, so
    // each is allowed ±50%). Over the five deltas those edges cancel but
    // for the two outer ones: the bytes of all five over their seconds
    // stayed within 6% of the rate (0.94x to 1.05x). A delta over two
    // intervals, or a cumulative profile (the fifth 5x the first), is 2x
    // or more.
    let overall = all_bytes as f64 / all_seconds;
    assert!(
        (ALLOC_RATE * 0.85..=ALLOC_RATE * 1.15).contains(&overall),
        "goAllocLoop allocated {overall:.0} B/s over five deltas, want {ALLOC_RATE} ±15%; per delta {rates:?}"
    );
    for r in &rates {
        assert!(
            (ALLOC_RATE * 0.5..=ALLOC_RATE * 1.5).contains(r),
            "alloc_space rates of goAllocLoop per delta {rates:?} B/s, want {ALLOC_RATE} within one GC cycle (±50%)"
        );
    }
    // goMutexContend waits about half of each second for its mutex (0.46
    // measured) and goBlockWait about all of it for its channel, each in
    // about 100 waits a second (goscrape's header); a cumulative delay
    // would grow with every scrape.
    let mut waits = Vec::new();
    for (name, function, low, high) in [
        ("mutex", "main.goMutexContend", 0.35, 0.6),
        ("block", "main.goBlockWait", 0.8, 1.2),
    ] {
        let entries = wait_entries(&proflow, 3, Duration::from_secs(30), |e| {
            e.label("__name__") == Some(name)
        });
        for e in &entries[1..3] {
            let p = common::read_profile(&e.path);
            let seconds = p.duration_nanos as f64 / 1e9;
            let waited = total_in(&p, "delay", function) as f64 / 1e9 / seconds;
            let per_second = total_in(&p, "contentions", function) as f64 / seconds;
            waits.push(format!("{name} {waited:.3} s/s {per_second:.0}/s"));
            assert!(
                (low..=high).contains(&waited) && (60.0..=110.0).contains(&per_second),
                "{name}: {function} waited {waited:.3} s a second in {per_second:.0} waits a second over {seconds:.2} s, want {low} to {high} s in about 100"
            );
        }
    }
    let metrics = proflow.metrics();
    let series = common::metric_sum(&metrics, "proflow_scrape_delta_series", &[]);
    let bytes = common::metric_sum(&metrics, "proflow_scrape_delta_state_bytes", &[]);
    assert_eq!(
        series, 3.0,
        "memory, mutex and block hold state:\n{metrics}"
    );
    assert!(bytes > 0.0, "{metrics}");
    eprintln!(
        "alloc rates of the deltas: {rates:?} B/s, {overall:.0} B/s over all five; {waits:?}; delta state {bytes} bytes"
    );
}

/// A proxy to the target at `endpoint` that keeps every profile it serves.
fn recording_proxy(endpoint: &str) -> (super::LocalServer, Arc<Mutex<Vec<Profile>>>) {
    let served: Arc<Mutex<Vec<Profile>>> = Arc::default();
    let kept = served.clone();
    let upstream = format!("http://{endpoint}");
    let http = reqwest::blocking::Client::new();
    let proxy = super::local_server(move |path| {
        let body = http
            .get(format!("{upstream}{path}"))
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.bytes());
        match body {
            Ok(body) => {
                let profile = proflow_model::pprof::decode(&body, 256 << 20)
                    .unwrap_or_else(|e| panic!("the target served no pprof at {path}: {e}"));
                kept.lock().unwrap().push(profile);
                ("200 OK", body.to_vec(), Duration::ZERO)
            }
            Err(e) => (
                "502 Bad Gateway",
                e.to_string().into_bytes(),
                Duration::ZERO,
            ),
        }
    });
    (proxy, served)
}

/// The served profile with the time of `written` (Go stamps each profile
/// with the time it wrote it, and proflow keeps it); its index.
fn served_at(served: &[Profile], written: &Profile) -> usize {
    served
        .iter()
        .position(|p| p.time_nanos == written.time_nanos)
        .unwrap_or_else(|| {
            panic!(
                "no served profile has the time {} of a written one; served: {:?}",
                written.time_nanos,
                served.iter().map(|p| p.time_nanos).collect::<Vec<_>>()
            )
        })
}

/// godeltaprof's profiles are already deltas: each is written with the
/// values it was served with, every sample type, exactly.
#[test]
fn godeltaprof_profiles_are_written_with_the_values_served() {
    let Some(target) = go_target(&["-mem-profile-rate", "1"]) else {
        return;
    };
    let (proxy, served) = recording_proxy(&target.endpoint);
    let proflow = start(&format!(
        "- job_name: godelta-exact\n  scrape_interval: 2s\n  scrape_timeout: 1s\n  \
         static_configs: [{{targets: ['{}']}}]\n  \
         profiling_config: {{pprof_config: {{process_cpu: {{enabled: false}}, memory: {{enabled: false}}, \
         goroutine: {{enabled: false}}, mutex: {{enabled: false}}, block: {{enabled: false}}, \
         godeltaprof_memory: {{enabled: true}}}}}}\n",
        proxy.address
    ));
    let entries = wait_entries(&proflow, 4, Duration::from_secs(60), |e| {
        e.label("__name__") == Some("memory")
    });
    let served: Vec<Profile> = served.lock().unwrap().clone();
    let mut checked = Vec::new();
    for e in &entries {
        let written = common::read_profile(&e.path);
        let from = &served[served_at(&served, &written)];
        for ty in [
            "alloc_objects",
            "alloc_space",
            "inuse_objects",
            "inuse_space",
        ] {
            assert_eq!(
                type_total(&written, ty),
                type_total(from, ty),
                "{ty}: written as served"
            );
        }
        assert_eq!(written.sample.len(), from.sample.len());
        checked.push(total_in(&written, "alloc_space", "main.goAllocLoop"));
    }
    eprintln!(
        "{} godeltaprof profiles written as served: goAllocLoop alloc_space {checked:?}",
        checked.len()
    );
}

/// The producer's own numbers, exactly: a proxy in front of goscrape keeps
/// every memory profile it serves to proflow (cumulative, every allocation
/// recorded), and each delta proflow writes holds, per function, the
/// allocations of the profile it was made from less those of the one
/// before, and its in-use values as served.
#[test]
fn each_delta_is_the_difference_of_the_profiles_served() {
    let Some(target) = go_target(&["-mem-profile-rate", "1"]) else {
        return;
    };
    let (proxy, served) = recording_proxy(&target.endpoint);
    let proflow = start(&format!(
        "- job_name: exact-job\n  scrape_interval: 2s\n  scrape_timeout: 1s\n  \
         static_configs: [{{targets: ['{}']}}]\n  {}\n",
        proxy.address,
        only(&["memory"])
    ));
    let entries = wait_entries(&proflow, 5, Duration::from_secs(60), |e| {
        e.label("__name__") == Some("memory")
    });
    let served: Vec<Profile> = served.lock().unwrap().clone();
    let function = "main.goAllocLoop";
    let mut checked = Vec::new();
    for e in &entries[1..] {
        let written = common::read_profile(&e.path);
        // A delta keeps the time of the profile it was made from.
        let at = served_at(&served, &written);
        assert!(at > 0, "a delta made from the first profile served");
        let (now, before) = (&served[at], &served[at - 1]);
        for ty in ["alloc_objects", "alloc_space"] {
            let want = total_in(now, ty, function) - total_in(before, ty, function);
            assert_eq!(
                total_in(&written, ty, function),
                want,
                "{ty} of {function}: the delta is the served profile less the one before"
            );
            assert_eq!(
                type_total(&written, ty),
                type_total(now, ty) - type_total(before, ty),
                "{ty} of every stack"
            );
        }
        for ty in ["inuse_objects", "inuse_space"] {
            assert_eq!(
                type_total(&written, ty),
                type_total(now, ty),
                "{ty} is a snapshot, written as served"
            );
        }
        checked.push(total_in(&written, "alloc_space", function));
    }
    assert!(
        checked.iter().all(|b| *b > 0),
        "goAllocLoop allocates in every delta: {checked:?}"
    );
    eprintln!(
        "{} deltas equal to the served profiles' differences: goAllocLoop alloc_space {checked:?}",
        checked.len()
    );
}

#[test]
fn a_restarted_target_starts_its_deltas_again_from_the_new_process() {
    // The same address, a new process: its allocation counters start again
    // from zero, below the last ones proflow holds for that target.
    let addr = format!("127.0.0.1:{}", common::free_port());
    let args = ["-mem-profile-rate", "1", "-addr", addr.as_str()];
    let Some(old) = go_target(&args) else {
        return;
    };
    let proflow = start(&format!(
        "- job_name: restart-job\n  scrape_interval: 3s\n  scrape_timeout: 2s\n  \
         static_configs: [{{targets: ['{addr}']}}]\n  {}\n",
        only(&["memory"])
    ));
    let is_memory = |e: &IndexEntry| e.label("__name__") == Some("memory");
    wait_entries(&proflow, 2, Duration::from_secs(60), is_memory);
    drop(old);
    let restarted_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    let Some(_new) = go_target(&args) else {
        return;
    };
    // Profiles the new process wrote (Go stamps each with the time it was
    // written): its in-use values when the restart is seen, then three
    // deltas.
    let after =
        |e: &IndexEntry| is_memory(e) && common::read_profile(&e.path).time_nanos > restarted_at;
    let entries = wait_entries(&proflow, 4, Duration::from_secs(60), after);
    let restarted = common::read_profile(&entries[0].path);
    assert!(
        in_use_only(&restarted),
        "the scrape that saw the restart sends its in-use values alone: alloc_space {}, inuse_space {}",
        type_total(&restarted, "alloc_space"),
        type_total(&restarted, "inuse_space")
    );
    let mut rates = Vec::new();
    for e in &entries[1..4] {
        let p = common::read_profile(&e.path);
        let seconds = p.duration_nanos as f64 / 1e9;
        // A delta against the old process's counters would span the
        // restart, and its values would be the new counters less the old:
        // below zero.
        assert!(
            (2.0..=4.5).contains(&seconds),
            "a delta after the restart covers one interval (3s), this one {seconds}s"
        );
        let negative = p
            .sample
            .iter()
            .flat_map(|s| &s.value)
            .filter(|v| **v < 0)
            .count();
        let bytes = total_in(&p, "alloc_space", "main.goAllocLoop");
        assert_eq!(
            negative, 0,
            "{negative} values below zero in a delta after the restart (goAllocLoop: {bytes} bytes in {seconds}s)"
        );
        rates.push(bytes as f64 / seconds);
    }
    // One delta's bounds, as in the test above: the interval give or take
    // one GC cycle at either end.
    for r in &rates {
        assert!(
            (ALLOC_RATE * 0.5..=ALLOC_RATE * 1.5).contains(r),
            "alloc_space rates of goAllocLoop per delta after the restart {rates:?} B/s, want {ALLOC_RATE} (±50%)"
        );
    }
    let log = proflow.log_text();
    let resets = log
        .lines()
        .filter(|l| l.contains("the target restarted"))
        .count();
    assert_eq!(resets, 1, "the restart was noticed {resets} times:\n{log}");
    eprintln!("alloc rates of the deltas after the restart: {rates:?} B/s");
}

/// The seconds between profiles one after another (their `time_nanos`).
fn seconds_between(profiles: &[Profile]) -> Vec<f64> {
    profiles
        .windows(2)
        .map(|w| (w[1].time_nanos - w[0].time_nanos) as f64 / 1e9)
        .collect()
}

/// The profiles written under `__name__` `name`, in the order of the
/// times their target wrote them.
fn profiles_named(proflow: &Proflow, n: usize, name: &str) -> Vec<Profile> {
    let entries = wait_entries(proflow, n, Duration::from_secs(60), |e| {
        e.label("__name__") == Some(name)
    });
    let mut profiles: Vec<Profile> = entries
        .iter()
        .map(|e| common::read_profile(&e.path))
        .collect();
    profiles.sort_by_key(|p| p.time_nanos);
    profiles
}

#[test]
fn godeltaprof_and_fgprof_endpoints_are_scraped_as_they_are_served() {
    // Every allocation recorded, as in the delta test above.
    let Some(target) = go_target(&["-mem-profile-rate", "1"]) else {
        return;
    };
    let proflow = start(&format!(
        "- job_name: lib-job\n  scrape_interval: 4s\n  scrape_timeout: 3s\n  \
         static_configs: [{{targets: ['{}']}}]\n  \
         profiling_config: {{pprof_config: {{process_cpu: {{enabled: false}}, memory: {{enabled: false}}, \
         goroutine: {{enabled: false}}, mutex: {{enabled: false}}, block: {{enabled: false}}, \
         godeltaprof_memory: {{enabled: true}}, godeltaprof_mutex: {{enabled: true}}, \
         godeltaprof_block: {{enabled: true}}, fgprof: {{enabled: true}}}}}}\n",
        target.endpoint
    ));
    let base = format!("http://{}", target.endpoint);
    let mut urls: Vec<String> = [
        "/debug/pprof/delta_heap",
        "/debug/pprof/delta_mutex",
        "/debug/pprof/delta_block",
        "/debug/fgprof?seconds=3",
    ]
    .iter()
    .map(|p| format!("{base}{p}"))
    .collect();
    urls.sort();
    wait_targets(&proflow, &urls, Duration::from_secs(10));

    let mut seen = Vec::new();
    // fgprof samples every goroutine for the seconds asked (the interval
    // less one): each of goscrape's loops has that long under its stack,
    // goMutexContend's two goroutines twice that.
    for p in &profiles_named(&proflow, 2, "fgprof")[..2] {
        let seconds = p.duration_nanos as f64 / 1e9;
        assert!(
            (2.9..=3.5).contains(&seconds),
            "fgprof sampled {seconds} s, asked for 3"
        );
        for (function, goroutines) in [
            ("main.goAllocLoop", 1.0),
            ("main.goBlockWait", 1.0),
            ("main.work", 1.0),
            ("main.goMutexContend", 2.0),
        ] {
            let wall = total_in(p, "time", function) as f64 / 1e9;
            seen.push(format!("fgprof {function} {:.3}x", wall / seconds));
            assert!(
                (goroutines * seconds * 0.9..=goroutines * seconds * 1.1).contains(&wall),
                "fgprof: {wall:.2} s under {function} in {seconds:.2} s, want {goroutines} goroutine(s) x {seconds:.2} s ±10%"
            );
        }
    }

    // godeltaprof answers what happened since its previous answer (the
    // first: since the program started), stamped with the time it was
    // written. proflow passes it on under the plain profile's name, so
    // from the second profile on each holds about the rate times the time
    // since the one before; differenced again it would hold about nothing.
    let memory = profiles_named(&proflow, 4, "memory");
    let gaps = seconds_between(&memory[..4]);
    let bytes: Vec<i64> = memory[1..4]
        .iter()
        .map(|p| total_in(p, "alloc_space", "main.goAllocLoop"))
        .collect();
    let rates: Vec<f64> = bytes
        .iter()
        .zip(&gaps)
        .map(|(b, s)| *b as f64 / s)
        .collect();
    let overall = bytes.iter().sum::<i64>() as f64 / gaps.iter().sum::<f64>();
    // The bounds of the delta test above: each within one GC cycle at
    // either end, all together within 15%.
    assert!(
        (ALLOC_RATE * 0.85..=ALLOC_RATE * 1.15).contains(&overall)
            && rates
                .iter()
                .all(|r| (ALLOC_RATE * 0.5..=ALLOC_RATE * 1.5).contains(r)),
        "godeltaprof memory: goAllocLoop at {overall:.0} B/s over {gaps:?} s (per profile {rates:?}), want {ALLOC_RATE}"
    );
    // goMutexContend waits about half of each second for its mutex (a
    // little less when its sleeps overrun: 0.46 measured), and goBlockWait
    // about all of it for its channel (goscrape's header); counted twice
    // it would be 0.9 and 2.
    for (name, function, low, high) in [
        ("mutex", "main.goMutexContend", 0.35, 0.6),
        ("block", "main.goBlockWait", 0.8, 1.2),
    ] {
        let profiles = profiles_named(&proflow, 3, name);
        for (p, gap) in profiles[1..3].iter().zip(seconds_between(&profiles[..3])) {
            let waited = total_in(p, "delay", function) as f64 / 1e9 / gap;
            seen.push(format!("{name} {waited:.3} s/s"));
            assert!(
                (low..=high).contains(&waited),
                "godeltaprof {name}: {function} waited {waited:.3} s a second over {gap:.2} s, want {low} to {high}"
            );
        }
    }

    // Nothing of these is differenced, so no state is held for them.
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(&metrics, "proflow_scrape_delta_series", &[]),
        0.0,
        "{metrics}"
    );
    eprintln!("godeltaprof memory: {rates:?} B/s, {overall:.0} over all; {seen:?}");
}
