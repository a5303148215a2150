//! Reload as a diff: what a reload does to each exporter, span-taking
//! processor and receiver, decided from what runs and what the new plan
//! wants before anything is built. These are pure functions of plain data
//! (config fingerprints, queue kinds, claimed resources, signals), tested
//! on their own below; [`Running::apply`](super::Running) carries the
//! result out in steps (`reload.rs`).

use std::collections::BTreeMap;

use super::plan::describe;
use crate::component::Resource;

/// What a reload does with one component.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Change {
    /// New: built and started.
    Start,
    /// Unchanged: keeps running untouched (a receiver gets the new
    /// pipelines behind it).
    Keep,
    /// Changed: its replacement is built and started, then it stops.
    Replace,
    /// Removed or no longer used: it stops (an exporter drains first).
    Stop,
}

impl Change {
    /// Whether the new config's component is built.
    pub(super) fn builds(self) -> bool {
        matches!(self, Change::Start | Change::Replace)
    }
}

/// An exporter as a reload sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ExporterState {
    /// Its config as text without positions.
    pub(super) fingerprint: String,
    /// Whether its queue is kept on disk (`sending_queue.storage`).
    pub(super) persistent: bool,
    /// What it claims (its directory).
    pub(super) resources: Vec<Resource>,
}

/// A receiver as a reload sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ReceiverState {
    /// Its config as text without positions.
    pub(super) fingerprint: String,
    /// Whether it feeds profiles pipelines, and span indexes.
    pub(super) signals: (bool, bool),
}

/// What the reload does with each exporter: those `wanted` (the used ones
/// of the new plan) start, stay or are replaced; the others running stop.
///
/// Refused, so nothing changes: replacing an exporter whose queue is or
/// becomes persistent (its files must have one owner at a time), and an
/// exporter built now claiming a directory that one leaving with this
/// reload still writes while it drains.
pub(super) fn exporters(
    running: &BTreeMap<String, ExporterState>,
    wanted: &BTreeMap<String, ExporterState>,
) -> Result<BTreeMap<String, Change>, String> {
    let changes = changes(running, wanted);
    for (id, change) in &changes {
        if *change == Change::Replace && (running[id].persistent || wanted[id].persistent) {
            return Err(format!(
                "exporter `{id}` has a persistent queue (sending_queue.storage); changing it needs a restart, so its files have one owner at a time"
            ));
        }
    }
    let leaving: Vec<(&String, &ExporterState)> = running
        .iter()
        .filter(|(id, _)| matches!(changes[*id], Change::Replace | Change::Stop))
        .collect();
    for (id, next) in wanted {
        if !changes[id].builds() {
            continue;
        }
        for (other, now) in &leaving {
            if let Some(r) = next.resources.iter().find(|r| now.resources.contains(r)) {
                return Err(format!(
                    "exporter `{id}` would write to {} while exporter `{other}` (changed or removed by this reload) still writes there until it drains; apply this change with a restart",
                    describe(r)
                ));
            }
        }
    }
    Ok(changes)
}

/// What the reload does with each span-taking processor (one instance per
/// collector, its span index inside): kept only when everything it was
/// built for is unchanged (`K`: its config, the forms downstream, whether
/// spans feed it); built anew otherwise; those no longer configured stop.
pub(super) fn span_processors<K: PartialEq>(
    running: &BTreeMap<String, K>,
    wanted: &BTreeMap<String, K>,
) -> BTreeMap<String, Change> {
    changes(running, wanted)
}

/// What the reload does with each receiver: those `wanted` (listed in a
/// pipeline) start, stay (same config and signals; they get the new
/// pipelines behind them) or are replaced; the others running stop.
pub(super) fn receivers(
    running: &BTreeMap<String, ReceiverState>,
    wanted: &BTreeMap<String, ReceiverState>,
) -> BTreeMap<String, Change> {
    changes(running, wanted)
}

/// Each id wanted starts (not running), stays (running as wanted) or is
/// replaced (running otherwise); each id running and not wanted stops.
fn changes<K: PartialEq>(
    running: &BTreeMap<String, K>,
    wanted: &BTreeMap<String, K>,
) -> BTreeMap<String, Change> {
    let mut changes: BTreeMap<String, Change> = wanted
        .iter()
        .map(|(id, next)| {
            let change = match running.get(id) {
                None => Change::Start,
                Some(now) if now == next => Change::Keep,
                Some(_) => Change::Replace,
            };
            (id.clone(), change)
        })
        .collect();
    for id in running.keys() {
        changes.entry(id.clone()).or_insert(Change::Stop);
    }
    changes
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn exporter(fingerprint: &str, persistent: bool, dir: Option<&str>) -> ExporterState {
        ExporterState {
            fingerprint: fingerprint.to_owned(),
            persistent,
            resources: dir
                .map(|d| vec![Resource::Directory(PathBuf::from(d))])
                .unwrap_or_default(),
        }
    }

    fn map<V: Clone>(entries: &[(&str, V)]) -> BTreeMap<String, V> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn exporters_start_stay_are_replaced_or_stop() {
        let running = map(&[
            ("same", exporter("a", false, None)),
            ("changed", exporter("b", false, None)),
            ("removed", exporter("c", false, None)),
        ]);
        let wanted = map(&[
            ("same", exporter("a", false, None)),
            ("changed", exporter("b2", false, None)),
            ("new", exporter("d", false, None)),
        ]);
        assert_eq!(
            exporters(&running, &wanted).unwrap(),
            map(&[
                ("same", Change::Keep),
                ("changed", Change::Replace),
                ("removed", Change::Stop),
                ("new", Change::Start),
            ])
        );
        // Nothing running: everything starts; nothing wanted: all stop.
        assert_eq!(
            exporters(&BTreeMap::new(), &wanted)
                .unwrap()
                .values()
                .collect::<Vec<_>>(),
            vec![&Change::Start; 3]
        );
        assert_eq!(
            exporters(&running, &BTreeMap::new())
                .unwrap()
                .values()
                .collect::<Vec<_>>(),
            vec![&Change::Stop; 3]
        );
    }

    #[test]
    fn a_persistent_queue_is_never_replaced() {
        let running = map(&[("disk", exporter("a", true, None))]);
        // Changed while persistent, or made persistent: refused.
        let err = exporters(&running, &map(&[("disk", exporter("a2", true, None))])).unwrap_err();
        assert!(
            err.contains("exporter `disk` has a persistent queue"),
            "{err}"
        );
        let running = map(&[("mem", exporter("a", false, None))]);
        let err = exporters(&running, &map(&[("mem", exporter("a2", true, None))])).unwrap_err();
        assert!(err.contains("needs a restart"), "{err}");
        // Unchanged, or removed: fine (removed, it keeps its files).
        let running = map(&[("disk", exporter("a", true, None))]);
        assert_eq!(
            exporters(&running, &map(&[("disk", exporter("a", true, None))])).unwrap()["disk"],
            Change::Keep
        );
        assert_eq!(
            exporters(&running, &BTreeMap::new()).unwrap()["disk"],
            Change::Stop
        );
    }

    #[test]
    fn a_directory_has_one_writer_while_the_old_one_drains() {
        // A new exporter on the directory of one being removed: refused.
        let running = map(&[("old", exporter("a", false, Some("/p")))]);
        let err =
            exporters(&running, &map(&[("new", exporter("b", false, Some("/p")))])).unwrap_err();
        assert!(
            err.contains("exporter `new` would write to") && err.contains("exporter `old`"),
            "{err}"
        );
        // A changed exporter keeping its directory: its old self still
        // writes there while it drains.
        let err = exporters(
            &running,
            &map(&[("old", exporter("a2", false, Some("/p")))]),
        )
        .unwrap_err();
        assert!(err.contains("exporter `old` would write to"), "{err}");
        // Kept beside a new one elsewhere, or a new one where nobody
        // leaves: fine.
        let wanted = map(&[
            ("old", exporter("a", false, Some("/p"))),
            ("new", exporter("b", false, Some("/q"))),
        ]);
        assert!(exporters(&running, &wanted).is_ok());
    }

    #[test]
    fn span_processors_are_kept_only_when_everything_they_were_built_for_is() {
        let running = map(&[("kept", 1), ("rebuilt", 2), ("gone", 3)]);
        let wanted = map(&[("kept", 1), ("rebuilt", 20), ("new", 4)]);
        assert_eq!(
            span_processors(&running, &wanted),
            map(&[
                ("kept", Change::Keep),
                ("rebuilt", Change::Replace),
                ("gone", Change::Stop),
                ("new", Change::Start),
            ])
        );
    }

    #[test]
    fn a_receiver_is_replaced_when_its_config_or_signals_change() {
        let state = |f: &str, signals| ReceiverState {
            fingerprint: f.to_owned(),
            signals,
        };
        let running = map(&[
            ("same", state("a", (true, false))),
            ("config", state("b", (true, false))),
            ("signals", state("c", (true, false))),
            ("removed", state("d", (true, false))),
        ]);
        let wanted = map(&[
            ("same", state("a", (true, false))),
            ("config", state("b2", (true, false))),
            ("signals", state("c", (true, true))),
            ("new", state("e", (false, true))),
        ]);
        assert_eq!(
            receivers(&running, &wanted),
            map(&[
                ("same", Change::Keep),
                ("config", Change::Replace),
                ("signals", Change::Replace),
                ("removed", Change::Stop),
                ("new", Change::Start),
            ])
        );
    }
}
