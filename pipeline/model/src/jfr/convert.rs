//! A JFR recording to pprof profiles, one per kind of event, named and
//! valued as Pyroscope's own JFR ingest makes them:
//!
//! | event | `__name__` | sample types | value of one event |
//! |---|---|---|---|
//! | `jdk.ExecutionSample` (not sleeping) | `process_cpu` | cpu nanoseconds | the period |
//! | the same, when the recording's `event` setting is `wall` | `wall` | wall nanoseconds | the period |
//! | `profiler.WallClockSample` | `wall` | wall nanoseconds | `samples` × the period |
//! | `jdk.ObjectAllocationInNewTLAB` | `memory` | alloc_in_new_tlab_objects count, alloc_in_new_tlab_bytes bytes | 1, the TLAB's size |
//! | `jdk.ObjectAllocationOutsideTLAB` | `memory` | alloc_outside_tlab_objects count, alloc_outside_tlab_bytes bytes | 1, the allocation's size |
//! | `jdk.ObjectAllocationSample` | `memory` | alloc_sample_objects count, alloc_sample_bytes bytes | 1, its weight |
//! | `jdk.JavaMonitorEnter` | `mutex` | contentions count, delay nanoseconds | 1, its duration |
//! | `jdk.ThreadPark` | `block` | contentions count, delay nanoseconds | 1, its duration |
//! | `profiler.LiveObject` | `memory` | live count | 1 |
//! | `profiler.Malloc` | `memory` | malloc_objects count, malloc_bytes bytes | 1, its size |
//!
//! The period is 10⁹ / `sampleRate` nanoseconds (Pyroscope's default rate
//! is 100). Durations are converted from ticks to nanoseconds (Pyroscope
//! takes ticks as they are, which is the same for every writer seen, all at
//! 10⁹ ticks a second). Samples with the same stack are summed.

use std::collections::HashMap;

use super::Result;
use super::chunk::ChunkHeader;
use super::cursor::{Cursor, JfrString};
use super::events;
use super::labels::LabelsSnapshot;
use super::metadata::{Class, Metadata};
use super::pools::Pools;
use super::stacks::Stacks;
use super::values::Value;
use crate::pprof::{Profile, ProfileBuilder};

/// Pyroscope's sample rate when the client names none.
pub const DEFAULT_SAMPLE_RATE: u32 = 100;

/// One profile made from a recording.
#[derive(Debug)]
pub struct Converted {
    /// Its `__name__`: `process_cpu`, `wall`, `memory`, `mutex`, `block`.
    pub name: &'static str,
    pub profile: Profile,
}

/// Samples of one kind by stack (frame names and lines, leaf first) and
/// labels: their summed values.
type Summed = HashMap<(Vec<(String, u32)>, Vec<(String, String)>), Vec<i64>>;

/// What a kind of event becomes.
struct Kind {
    name: &'static str,
    sample_types: &'static [(&'static str, &'static str)],
    period_type: Option<(&'static str, &'static str)>,
}

const CPU: Kind = Kind {
    name: "process_cpu",
    sample_types: &[("cpu", "nanoseconds")],
    period_type: Some(("cpu", "nanoseconds")),
};
const WALL: Kind = Kind {
    name: "wall",
    sample_types: &[("wall", "nanoseconds")],
    period_type: Some(("wall", "nanoseconds")),
};
const IN_TLAB: Kind = Kind {
    name: "memory",
    sample_types: &[
        ("alloc_in_new_tlab_objects", "count"),
        ("alloc_in_new_tlab_bytes", "bytes"),
    ],
    period_type: Some(("space", "bytes")),
};
const OUTSIDE_TLAB: Kind = Kind {
    name: "memory",
    sample_types: &[
        ("alloc_outside_tlab_objects", "count"),
        ("alloc_outside_tlab_bytes", "bytes"),
    ],
    period_type: Some(("space", "bytes")),
};
const ALLOC_SAMPLE: Kind = Kind {
    name: "memory",
    sample_types: &[
        ("alloc_sample_objects", "count"),
        ("alloc_sample_bytes", "bytes"),
    ],
    period_type: Some(("space", "bytes")),
};
const MUTEX: Kind = Kind {
    name: "mutex",
    sample_types: &[("contentions", "count"), ("delay", "nanoseconds")],
    period_type: Some(("mutex", "count")),
};
const BLOCK: Kind = Kind {
    name: "block",
    sample_types: &[("contentions", "count"), ("delay", "nanoseconds")],
    period_type: Some(("block", "count")),
};
const LIVE: Kind = Kind {
    name: "memory",
    sample_types: &[("live", "count")],
    period_type: Some(("objects", "count")),
};
const MALLOC: Kind = Kind {
    name: "memory",
    sample_types: &[("malloc_objects", "count"), ("malloc_bytes", "bytes")],
    period_type: None,
};

/// The profiles of every chunk of `jfr`, for the interval `from`..`until`
/// (Unix nanoseconds).
/// `labels`: the agent's dynamic labels, which events name by `contextId`;
/// an event's `spanId` becomes `profile_id` (16 hex digits) and its
/// `spanName` `span_name`, as Pyroscope labels them.
pub fn to_pprof(
    jfr: &[u8],
    labels: Option<&LabelsSnapshot>,
    sample_rate: u32,
    from: i64,
    until: i64,
) -> Result<Vec<Converted>> {
    let period = if sample_rate == 0 {
        0
    } else {
        1_000_000_000 / i64::from(sample_rate)
    };
    // Samples by kind, then by stack: summed values.
    let mut kinds: Vec<(&'static Kind, Summed)> = Vec::new();
    let mut c = Cursor::new(jfr);
    while c.remaining() > 0 {
        let start = c.position();
        let header = ChunkHeader::read(&mut c)?;
        let chunk = &jfr[start..start + header.size];
        let mut m = Cursor::new(chunk);
        m.seek(header.metadata_offset)?;
        let md = Metadata::read(&mut m)?;
        let pools = Pools::read(chunk, header.constant_pool_offset, &md)?;
        let wall_mode = event_setting(chunk, &md)?.as_deref() == Some("wall");
        let mut stacks = Stacks::new(&md, &pools);
        let state = |class: &Class, v: &Value| -> Option<String> {
            let key = field(class, v, "state")?.int()?;
            let pool_class = md.class_named("jdk.types.ThreadState")?;
            let entry = pools.get(pool_class.id, key)?;
            match entry.fields().get(pool_class.field("name")?)? {
                Value::Str(JfrString::Text(s)) => Some(s.clone()),
                _ => None,
            }
        };
        events::for_each(
            chunk,
            &md,
            |class| KNOWN.contains(&class.name.as_str()),
            |class, v| {
                let int = |name: &str| field(class, &v, name).and_then(Value::int);
                let ticks = |name: &str| int(name).map_or(0, |t| header.ticks_to_nanos(t as i64));
                let mut sample_labels: Vec<(String, String)> = Vec::new();
                if let Some(snapshot) = labels {
                    if let Some(id) = int("contextId") {
                        sample_labels.extend(
                            snapshot
                                .labels(id as i64)
                                .into_iter()
                                .map(|(k, v)| (k.to_owned(), v.to_owned())),
                        );
                    }
                    if let Some(name) = int("spanName")
                        .filter(|&n| n != 0)
                        .and_then(|n| snapshot.string(n as i64))
                        .filter(|n| !n.is_empty())
                    {
                        sample_labels.push(("span_name".into(), name.to_owned()));
                    }
                }
                if let Some(span) = int("spanId").filter(|&s| s != 0) {
                    sample_labels.push(("profile_id".into(), format!("{span:016x}")));
                }
                let mut add = |kind: &'static Kind, values: Vec<i64>| {
                    let Some(key) = int("stackTrace") else { return };
                    let frames: Vec<(String, u32)> = stacks
                        .frames(key)
                        .iter()
                        .map(|f| (f.name.clone(), f.line))
                        .collect();
                    if frames.is_empty() {
                        return;
                    }
                    let i = match kinds.iter().position(|(k, _)| std::ptr::eq(*k, kind)) {
                        Some(i) => i,
                        None => {
                            kinds.push((kind, HashMap::new()));
                            kinds.len() - 1
                        }
                    };
                    let sum = kinds[i]
                        .1
                        .entry((frames, sample_labels.clone()))
                        .or_insert_with(|| vec![0; values.len()]);
                    for (s, v) in sum.iter_mut().zip(values) {
                        *s = s.saturating_add(v);
                    }
                };
                match class.name.as_str() {
                    "jdk.ExecutionSample" => match state(class, &v).as_deref() {
                        None | Some("STATE_SLEEPING") => {}
                        Some(_) => {
                            add(&CPU, vec![period]);
                            if wall_mode {
                                add(&WALL, vec![period]);
                            }
                        }
                    },
                    "profiler.WallClockSample" => {
                        let samples = int("samples").unwrap_or(1) as i64;
                        add(&WALL, vec![samples.saturating_mul(period)]);
                        if wall_mode && state(class, &v).as_deref() == Some("STATE_RUNNABLE") {
                            add(&CPU, vec![samples.saturating_mul(period)]);
                        }
                    }
                    "jdk.ObjectAllocationInNewTLAB" => {
                        add(&IN_TLAB, vec![1, int("tlabSize").unwrap_or(0) as i64])
                    }
                    "jdk.ObjectAllocationOutsideTLAB" => add(
                        &OUTSIDE_TLAB,
                        vec![1, int("allocationSize").unwrap_or(0) as i64],
                    ),
                    "jdk.ObjectAllocationSample" => {
                        add(&ALLOC_SAMPLE, vec![1, int("weight").unwrap_or(0) as i64])
                    }
                    "jdk.JavaMonitorEnter" => add(&MUTEX, vec![1, ticks("duration")]),
                    "jdk.ThreadPark" => add(&BLOCK, vec![1, ticks("duration")]),
                    "profiler.LiveObject" => add(&LIVE, vec![1]),
                    "profiler.Malloc" => add(&MALLOC, vec![1, int("size").unwrap_or(0) as i64]),
                    _ => {}
                }
                Ok(())
            },
        )?;
        c.seek(start + header.size)?;
    }
    Ok(kinds
        .into_iter()
        .map(|(kind, samples)| {
            let mut b = ProfileBuilder::new();
            for (t, u) in kind.sample_types {
                b.sample_type(t, u);
            }
            if let Some((t, u)) = kind.period_type {
                b.period(t, u, 0);
            }
            b.time(from, until.saturating_sub(from));
            for ((frames, labels), values) in samples {
                let locations = frames
                    .iter()
                    .map(|(name, line)| b.frame_at(name, i64::from(*line)))
                    .collect();
                let labels: Vec<(&str, &str)> = labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                b.sample_with_labels(locations, values, &labels);
            }
            Converted {
                name: kind.name,
                profile: b.build(),
            }
        })
        .collect())
}

/// The event classes a profile is made from (and the settings).
const KNOWN: &[&str] = &[
    "jdk.ExecutionSample",
    "profiler.WallClockSample",
    "jdk.ObjectAllocationInNewTLAB",
    "jdk.ObjectAllocationOutsideTLAB",
    "jdk.ObjectAllocationSample",
    "jdk.JavaMonitorEnter",
    "jdk.ThreadPark",
    "profiler.LiveObject",
    "profiler.Malloc",
];

fn field<'v>(class: &Class, v: &'v Value, name: &str) -> Option<&'v Value> {
    v.fields().get(class.field(name)?)
}

/// The recording's `event` setting (async-profiler's `jdk.ActiveSetting`
/// named `event`: `cpu`, `itimer`, `wall`, …), if it has one.
fn event_setting(chunk: &[u8], md: &Metadata) -> Result<Option<String>> {
    let mut found = None;
    events::for_each(
        chunk,
        md,
        |c| c.name == "jdk.ActiveSetting",
        |class, v| {
            let text = |name: &str| match field(class, &v, name) {
                Some(Value::Str(JfrString::Text(s))) => Some(s.clone()),
                _ => None,
            };
            if text("name").as_deref() == Some("event") {
                found = text("value");
            }
            Ok(())
        },
    )?;
    Ok(found)
}
