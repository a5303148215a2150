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
//! 10⁹ ticks a second). Samples with the same stack and labels are summed.
//!
//! What the conversion holds is taken from the caller's [`Meter`]: the
//! chunk's metadata and pools, each event's values while it is looked at,
//! every distinct stack and method name, every distinct sample, and the
//! profiles made.

use super::HashMap;

use super::chunk::ChunkHeader;
use super::cursor::{Cursor, JfrString};
use super::events;
use super::labels::LabelsSnapshot;
use super::metadata::{Class, Metadata};
use super::pools::Pools;
use super::stacks::Stacks;
use super::values::Value;
use super::{Meter, Result};
use crate::lost::LostSamples;
use crate::pprof::ProfileBuilder;

/// Pyroscope's sample rate when the client names none.
pub const DEFAULT_SAMPLE_RATE: u32 = 100;

/// One profile made from a recording, encoded.
#[derive(Debug)]
pub struct Converted {
    /// Its `__name__`: `process_cpu`, `wall`, `memory`, `mutex`, `block`.
    pub name: &'static str,
    /// Its sample types and period type (type, unit), as in the profile.
    pub sample_types: &'static [(&'static str, &'static str)],
    pub period_type: Option<(&'static str, &'static str)>,
    /// The pprof profile's bytes (not gzipped).
    pub pprof: Vec<u8>,
}

/// What tells one sample from another: its stack (its key in the chunk's
/// pools) and what labels it: the agent's context, span id and span name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SampleKey {
    stack: u64,
    context: u64,
    span: u64,
    span_name: u64,
}

/// What a recording becomes.
#[derive(Debug)]
pub struct Recording {
    /// One profile per kind of event found.
    pub profiles: Vec<Converted>,
    /// The profiler's `event` setting (async-profiler's: `itimer`, `cpu`,
    /// `wall`, …), which Pyroscope puts on the series as `jfr_event`; none
    /// in the JDK's own recordings.
    pub event: Option<String>,
    /// Samples of the recording that no profile carries, by reason:
    /// `empty_stack` (an event with no stack, or none of whose frames has a
    /// name), `zero_sample_rate` (CPU and wall samples sent with
    /// `sampleRate=0`, which gives them no value), `unsupported_event`
    /// (sampling events Pyroscope makes no profile of, such as
    /// `jdk.NativeMethodSample` and `jdk.CPUTimeSample`). Frames left out
    /// of the stacks that arrive (their method cannot be named) are its
    /// parts: `frame`, `unnamed_frame`, once per distinct stack of each
    /// profile.
    pub lost: LostSamples,
}

/// Samples of one kind: their summed values.
type Summed = HashMap<SampleKey, Vec<i64>>;

/// Where the fields the conversion reads are in an event class.
#[derive(Debug, Clone, Copy)]
struct EventFields {
    state: Option<usize>,
    stack_trace: Option<usize>,
    context_id: Option<usize>,
    span_id: Option<usize>,
    span_name: Option<usize>,
    samples: Option<usize>,
    tlab_size: Option<usize>,
    allocation_size: Option<usize>,
    weight: Option<usize>,
    duration: Option<usize>,
    size: Option<usize>,
}

impl EventFields {
    fn of(class: &Class) -> Self {
        let f = |name: &str| class.field(name);
        EventFields {
            state: f("state"),
            stack_trace: f("stackTrace"),
            context_id: f("contextId"),
            span_id: f("spanId"),
            span_name: f("spanName"),
            samples: f("samples"),
            tlab_size: f("tlabSize"),
            allocation_size: f("allocationSize"),
            weight: f("weight"),
            duration: f("duration"),
            size: f("size"),
        }
    }
}

/// A sample's labels: the agent's context, its span as `profile_id` (16
/// hex digits) and its span's name as `span_name`, as Pyroscope makes them.
fn sample_labels<'l>(
    key: &SampleKey,
    labels: Option<&'l LabelsSnapshot>,
) -> Vec<(&'l str, String)> {
    let mut out: Vec<(&str, String)> = Vec::new();
    if let Some(snapshot) = labels {
        if key.context != 0 {
            out.extend(
                snapshot
                    .labels(key.context as i64)
                    .into_iter()
                    .map(|(k, v)| (k, v.to_owned())),
            );
        }
        if let Some(name) = Some(key.span_name)
            .filter(|&n| n != 0)
            .and_then(|n| snapshot.string(n as i64))
            .filter(|n| !n.is_empty())
        {
            out.push(("span_name", name.to_owned()));
        }
    }
    if key.span != 0 {
        out.push(("profile_id", format!("{:016x}", key.span)));
    }
    out
}

/// Each context of the agent's labels by the first context with the same
/// labels: the agent makes a context per labelled call, so thousands can
/// share one set of labels, and their samples are one sample.
fn canonical_contexts(
    labels: Option<&LabelsSnapshot>,
    meter: &mut Meter<'_>,
) -> Result<HashMap<u64, u64>> {
    let mut out = HashMap::default();
    let Some(snapshot) = labels else {
        return Ok(out);
    };
    let mut ids: Vec<i64> = snapshot.contexts.keys().copied().collect();
    ids.sort_unstable();
    let mut first: HashMap<Vec<(&str, &str)>, u64> = HashMap::default();
    meter.take(ids.len() * 4 * std::mem::size_of::<(u64, u64)>())?;
    for id in ids {
        let set = snapshot.labels(id);
        if set.is_empty() {
            continue;
        }
        meter.take(set.len() * std::mem::size_of::<(&str, &str)>())?;
        let canonical = *first.entry(set).or_insert(id as u64);
        out.insert(id as u64, canonical);
    }
    Ok(out)
}

/// The names of the thread states (`STATE_RUNNABLE`, …) by key.
fn thread_states(
    md: &Metadata,
    pools: &Pools<'_>,
    meter: &mut Meter<'_>,
) -> Result<HashMap<u64, String>> {
    let mut out = HashMap::default();
    let Some(class) = md.class_named("jdk.types.ThreadState") else {
        return Ok(out);
    };
    let Some(name) = class.field("name") else {
        return Ok(out);
    };
    for key in pools.keys(class.id) {
        let before = meter.held();
        let value = pools.value(md, class, key, meter)?;
        let text = match value.as_ref().and_then(|v| v.fields().get(name)) {
            Some(Value::Str(JfrString::Text(s))) => Some(s.clone()),
            _ => None,
        };
        drop(value);
        meter.give_back(meter.held() - before);
        if let Some(text) = text {
            meter.take(2 * std::mem::size_of::<(u64, String)>() + text.len())?;
            out.insert(key, text);
        }
    }
    Ok(out)
}

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
    meter: &mut Meter<'_>,
) -> Result<Recording> {
    let period = if sample_rate == 0 {
        0
    } else {
        1_000_000_000 / i64::from(sample_rate)
    };
    let contexts = canonical_contexts(labels, meter)?;
    let mut lost = LostSamples::default();
    let mut event = None;
    // The `event` setting last seen: a chunk without one keeps it, as
    // Pyroscope's reader does.
    let mut mode: Option<String> = None;
    let mut profiles = Profiles::new(from, until);
    let mut c = Cursor::new(jfr);
    while c.remaining() > 0 {
        let start = c.position();
        let header = ChunkHeader::read(&mut c)?;
        let chunk = &jfr[start..start + header.size];
        // What this chunk holds (its metadata, pools, stacks and sums) is
        // given back when the next begins; the profiles stay.
        let chunk_held = meter.held();
        let mut m = Cursor::new(chunk);
        m.seek(header.metadata_offset)?;
        let md = Metadata::read(&mut m, meter)?;
        let pools = Pools::read(chunk, header.constant_pool_offset, &md, meter)?;
        let setting = event_setting(chunk, &md, meter)?;
        if setting.is_some() {
            mode.clone_from(&setting);
        }
        let wall_mode = mode.as_deref() == Some("wall");
        if event.is_none() {
            event = setting;
        }
        let states = thread_states(&md, &pools, meter)?;
        let mut stacks = Stacks::new(&md, &pools);
        let mut sums = ChunkSums {
            header: &header,
            contexts: &contexts,
            states: &states,
            period,
            wall_mode,
            kinds: Vec::new(),
            lost: &mut lost,
            meter,
        };
        sum_chunk_events(chunk, &md, &mut stacks, &mut sums)?;
        let kinds = sums.kinds;
        let before_profiles = meter.held();
        // In the last chunk each profile is done once its samples are in:
        // encoded, and its builder let go, before the next is made.
        let last_chunk = start + header.size >= jfr.len();
        let chunk_samples = ChunkSamples {
            kinds,
            stacks: &stacks,
            labels,
            last_chunk,
        };
        profiles.add_chunk(chunk_samples, &mut lost, meter)?;
        // What the profiles hold stays taken; the rest of the chunk's
        // reading is dropped here.
        let profiles_taken = meter.held().saturating_sub(before_profiles);
        meter.give_back(
            meter
                .held()
                .saturating_sub(chunk_held.saturating_add(profiles_taken)),
        );
        c.seek(start + header.size)?;
    }
    Ok(Recording {
        profiles: profiles.finish_all(meter)?,
        event,
        lost,
    })
}

/// One chunk's samples, summed by kind, as they go into the profiles.
struct ChunkSums<'c, 'm> {
    header: &'c ChunkHeader,
    /// Each context of the agent's labels by its canonical context.
    contexts: &'c HashMap<u64, u64>,
    /// The names of the thread states by key.
    states: &'c HashMap<u64, String>,
    /// The period in nanoseconds (0 when the sample rate is 0).
    period: i64,
    /// Whether the profiler samples wall time (its `event` setting).
    wall_mode: bool,
    /// Samples by kind, then by stack and labels: summed values.
    kinds: Vec<(&'static Kind, Summed)>,
    lost: &'c mut LostSamples,
    meter: &'c mut Meter<'m>,
}

impl ChunkSums<'_, '_> {
    /// Adds `values` to the sum of `kind`'s sample `key` (a new sample is
    /// taken from the meter); CPU and wall samples without a period are lost.
    fn add(&mut self, kind: &'static Kind, key: SampleKey, values: Vec<i64>) -> Result<()> {
        if self.period == 0 && (kind.name == CPU.name || kind.name == WALL.name) {
            self.lost.add("zero_sample_rate", 1);
            return Ok(());
        }
        let i = match self.kinds.iter().position(|(k, _)| std::ptr::eq(*k, kind)) {
            Some(i) => i,
            None => {
                self.kinds.push((kind, HashMap::default()));
                self.kinds.len() - 1
            }
        };
        let sums = &mut self.kinds[i].1;
        if let Some(sum) = sums.get_mut(&key) {
            for (s, v) in sum.iter_mut().zip(&values) {
                *s = s.saturating_add(*v);
            }
        } else {
            self.meter.take(
                2 * std::mem::size_of::<(SampleKey, Vec<i64>)>()
                    + values.len() * std::mem::size_of::<i64>(),
            )?;
            sums.insert(key, values);
        }
        Ok(())
    }

    /// The name of the thread state of the event `v`, if it has one.
    fn state(&self, f: &EventFields, v: &[u64]) -> Option<&str> {
        let key = v.get(f.state?)?;
        self.states.get(key).map(String::as_str)
    }

    /// Adds the event `v` of the class `class` (sample `key`) to the kinds
    /// it counts as, with its values.
    fn add_event(&mut self, class: &str, key: SampleKey, f: &EventFields, v: &[u64]) -> Result<()> {
        let int = |i: Option<usize>| i.and_then(|i| v.get(i)).copied();
        let header = self.header;
        let ticks = |i| int(i).map_or(0, |t| header.ticks_to_nanos(t as i64));
        let period = self.period;
        match class {
            "jdk.ExecutionSample" => {
                let (cpu, wall) = execution_sample(self.state(f, v), self.wall_mode);
                if cpu {
                    self.add(&CPU, key, vec![period])?;
                }
                if wall {
                    self.add(&WALL, key, vec![period])?;
                }
            }
            "profiler.WallClockSample" => {
                let samples = int(f.samples).unwrap_or(1) as i64;
                self.add(&WALL, key, vec![samples.saturating_mul(period)])?;
                if self.wall_mode && self.state(f, v) == Some("STATE_RUNNABLE") {
                    self.add(&CPU, key, vec![samples.saturating_mul(period)])?;
                }
            }
            "jdk.ObjectAllocationInNewTLAB" => {
                self.add(&IN_TLAB, key, vec![1, int(f.tlab_size).unwrap_or(0) as i64])?
            }
            "jdk.ObjectAllocationOutsideTLAB" => self.add(
                &OUTSIDE_TLAB,
                key,
                vec![1, int(f.allocation_size).unwrap_or(0) as i64],
            )?,
            "jdk.ObjectAllocationSample" => self.add(
                &ALLOC_SAMPLE,
                key,
                vec![1, int(f.weight).unwrap_or(0) as i64],
            )?,
            "jdk.JavaMonitorEnter" => self.add(&MUTEX, key, vec![1, ticks(f.duration)])?,
            "jdk.ThreadPark" => self.add(&BLOCK, key, vec![1, ticks(f.duration)])?,
            "profiler.LiveObject" => self.add(&LIVE, key, vec![1])?,
            "profiler.Malloc" => {
                self.add(&MALLOC, key, vec![1, int(f.size).unwrap_or(0) as i64])?
            }
            _ => {}
        }
        Ok(())
    }
}

/// Sums the known events of `chunk` into `sums`, counting those without a
/// named frame and the unsupported sampling events as lost.
fn sum_chunk_events(
    chunk: &[u8],
    md: &Metadata,
    stacks: &mut Stacks<'_>,
    sums: &mut ChunkSums<'_, '_>,
) -> Result<()> {
    let mut fields: HashMap<u64, EventFields> = HashMap::default();
    let unsupported = std::cell::Cell::new(0u64);
    events::for_each_flat(
        chunk,
        md,
        |class| {
            let name = class.name.as_str();
            if UNSUPPORTED_SAMPLES.contains(&name) {
                unsupported.set(unsupported.get() + 1);
            }
            KNOWN.contains(&name)
        },
        |class, v| {
            let f = *fields
                .entry(class.id)
                .or_insert_with(|| EventFields::of(class));
            let int = |i: Option<usize>| i.and_then(|i| v.get(i)).copied();
            let Some(stack) = int(f.stack_trace) else {
                sums.lost.add("empty_stack", 1);
                return Ok(());
            };
            let key = SampleKey {
                stack,
                context: int(f.context_id)
                    .and_then(|c| sums.contexts.get(&c).copied())
                    .unwrap_or(0),
                span: int(f.span_id).unwrap_or(0),
                span_name: int(f.span_name).unwrap_or(0),
            };
            if !stacks.has_frames(stack, sums.meter)? {
                sums.lost.add("empty_stack", 1);
                return Ok(());
            }
            sums.add_event(class.name.as_str(), key, &f, v)
        },
    )?;
    sums.lost.add("unsupported_event", unsupported.get());
    Ok(())
}

/// One chunk's summed samples, with what names their stacks and labels.
struct ChunkSamples<'c, 'a, 'l> {
    kinds: Vec<(&'static Kind, Summed)>,
    stacks: &'c Stacks<'a>,
    labels: Option<&'l LabelsSnapshot>,
    /// Whether it is the recording's last chunk.
    last_chunk: bool,
}

/// The profiles of a recording as its chunks are read.
struct Profiles {
    /// A profile by kind, being made.
    building: Vec<(&'static Kind, ProfileBuilder)>,
    /// The profiles done, encoded.
    done: Vec<Converted>,
    from: i64,
    until: i64,
}

impl Profiles {
    /// No profiles yet, for the interval `from`..`until`.
    fn new(from: i64, until: i64) -> Self {
        Profiles {
            building: Vec::new(),
            done: Vec::new(),
            from,
            until,
        }
    }

    /// Every profile encoded: those done, then those of kinds the last
    /// chunk had none of.
    fn finish_all(self, meter: &mut Meter<'_>) -> Result<Vec<Converted>> {
        let mut done = self.done;
        for (kind, b) in self.building {
            done.push(finish(kind, b, meter)?);
        }
        Ok(done)
    }

    /// Adds a chunk's sums to the profiles, each sample taken from the
    /// meter: its locations, values and labels (names and lines are
    /// interned by the builder, at most once per method and line). In the
    /// last chunk each profile is finished once its samples are in.
    fn add_chunk(
        &mut self,
        chunk: ChunkSamples<'_, '_, '_>,
        lost: &mut LostSamples,
        meter: &mut Meter<'_>,
    ) -> Result<()> {
        let stacks = chunk.stacks;
        // The frames of one sample at a time (as many as the deepest stack).
        let mut frames = Vec::new();
        for (kind, sums) in chunk.kinds {
            let i = match self
                .building
                .iter()
                .position(|(k, _)| std::ptr::eq(*k, kind))
            {
                Some(i) => i,
                None => {
                    self.building
                        .push((kind, new_builder(kind, self.from, self.until)));
                    self.building.len() - 1
                }
            };
            let b = &mut self.building[i].1;
            for (key, values) in sums {
                let labels = sample_labels(&key, chunk.labels);
                let left_out = stacks.frames_into(key.stack, &mut frames)?;
                // Per distinct stack of each profile.
                lost.add_part("frame", "unnamed_frame", left_out as u64);
                let labels: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                // The most the sample can add, given back down to what it did.
                let bound = ProfileBuilder::sample_bound(
                    frames.iter().map(|f| stacks.name(f.method).len()),
                    values.len(),
                    labels.len(),
                    labels.iter().map(|(k, v)| k.len() + v.len()).sum(),
                );
                meter.take(bound)?;
                let before = b.held_bytes();
                let locations = frames
                    .iter()
                    .map(|f| b.frame_at(stacks.name(f.method), i64::from(f.line)))
                    .collect();
                b.sample_with_labels(locations, values, &labels);
                meter.give_back(bound.saturating_sub(b.held_bytes() - before));
            }
            if chunk.last_chunk {
                let (kind, b) = self.building.remove(i);
                self.done.push(finish(kind, b, meter)?);
            }
        }
        Ok(())
    }
}

/// A kind's profile encoded, the bytes taken from the meter and what the
/// builder held given back.
fn finish(kind: &'static Kind, b: ProfileBuilder, meter: &mut Meter<'_>) -> Result<Converted> {
    let held = b.held_bytes();
    let profile = b.build();
    let len = prost::Message::encoded_len(&profile);
    meter.take(len)?;
    let mut pprof = Vec::with_capacity(len);
    prost::Message::encode(&profile, &mut pprof).expect("a Vec has room for the encoded length");
    drop(profile);
    meter.give_back(held);
    Ok(Converted {
        name: kind.name,
        sample_types: kind.sample_types,
        period_type: kind.period_type,
        pprof,
    })
}

fn new_builder(kind: &Kind, from: i64, until: i64) -> ProfileBuilder {
    let mut b = ProfileBuilder::new();
    for (t, u) in kind.sample_types {
        b.sample_type(t, u);
    }
    if let Some((t, u)) = kind.period_type {
        b.period(t, u, 0);
    }
    b.time(from, until.saturating_sub(from));
    b
}

/// Whether an execution sample of a thread in `state` counts as CPU and as
/// wall time: CPU unless the thread slept (or its state is not known);
/// wall whenever the profiler samples wall (its `event` setting), whatever
/// the state, as Pyroscope's reader counts it: a sleeping thread's time is
/// wall time.
fn execution_sample(state: Option<&str>, wall_mode: bool) -> (bool, bool) {
    (!matches!(state, None | Some("STATE_SLEEPING")), wall_mode)
}

/// Sampling events (of the JDK and async-profiler) that Pyroscope makes no
/// profile of: counted as lost.
const UNSUPPORTED_SAMPLES: &[&str] = &[
    "jdk.NativeMethodSample",
    "jdk.CPUTimeSample",
    "jdk.OldObjectSample",
    "profiler.Free",
];

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
fn event_setting(chunk: &[u8], md: &Metadata, meter: &mut Meter<'_>) -> Result<Option<String>> {
    let mut found = None;
    events::for_each(
        chunk,
        md,
        |c| c.name == "jdk.ActiveSetting",
        meter,
        |class, v, _| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleeping_thread_is_wall_time_when_the_profiler_samples_wall() {
        assert_eq!(
            execution_sample(Some("STATE_RUNNABLE"), false),
            (true, false)
        );
        assert_eq!(
            execution_sample(Some("STATE_SLEEPING"), false),
            (false, false)
        );
        assert_eq!(execution_sample(None, false), (false, false));
        assert_eq!(execution_sample(Some("STATE_RUNNABLE"), true), (true, true));
        // It used to be neither.
        assert_eq!(
            execution_sample(Some("STATE_SLEEPING"), true),
            (false, true)
        );
        assert_eq!(execution_sample(None, true), (false, true));
    }
}
