//! Speedscope JSON bodies of `/ingest` (`format=speedscope`), read as
//! Pyroscope reads them: the file's `$schema` must be speedscope's; each
//! profile, `sampled` (stacks of frame indexes, root first, and their
//! weights) or `evented` (frames opened and closed at times), becomes the
//! stacks the folded conversion takes. Profiles of the same name, type,
//! unit and start are merged. With more than one profile each is named
//! `<app>.<unit>` (which makes its type); every one is labelled
//! `profile_name`.
//!
//! Values are scaled before they are rounded, so no fraction of a unit is
//! lost to truncation:
//! - a time (`seconds`, `milliseconds`, `microseconds`, `nanoseconds`, and
//!   `none`, a sample of 10 ms as Pyroscope takes it) sent with the default
//!   `sampleRate` (100) becomes nanoseconds, rounded to the nearest;
//! - with another `sampleRate` R, a time is a count of samples at R, kept
//!   to a hundredth of its unit (Pyroscope's meaning of R), rounded to the
//!   nearest hundredth; `nanoseconds` are always nanoseconds;
//! - `bytes` are rounded to the nearest byte.
//!
//! A sample whose value was not 0 but rounds to 0, or whose stack has no
//! frame, is counted as lost (its reason in [`Stacks::lost`]).
//!
//! Where this differs from Pyroscope, which truncates each value before it
//! scales it (a 100 Hz sampler's weight of 0.01 s becomes 0 and nothing is
//! stored), does not scale the time before an open in an evented profile,
//! and makes every nanosecond value 0 (its sample rate overflows): here none
//! of these is lost.
//!
//! The document's memory is granted from its shape before it is decoded.

use serde::Deserialize;

use super::folded::{Charge, FoldedError, StackSums, Stacks, TextLimits};

/// The `$schema` every speedscope file names.
const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";
/// With a sample rate of the client's, times are kept to a hundredth of
/// their unit.
const PRECISION: f64 = 100.0;
/// The sample rate of nanoseconds.
const NANOS: u32 = 1_000_000_000;

#[derive(Debug, Deserialize)]
struct File {
    #[serde(rename = "$schema", default)]
    schema: String,
    #[serde(default)]
    shared: Shared,
    #[serde(default)]
    profiles: Vec<Profile>,
}

#[derive(Debug, Default, Deserialize)]
struct Shared {
    #[serde(default)]
    frames: Vec<Frame>,
}

#[derive(Debug, Deserialize)]
struct Frame {
    #[serde(default)]
    name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Profile {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    unit: String,
    #[serde(default)]
    start_value: f64,
    #[serde(default)]
    events: Vec<Event>,
    #[serde(default)]
    samples: Vec<Vec<f64>>,
    #[serde(default)]
    weights: Vec<f64>,
}

#[derive(Debug, Clone, Deserialize)]
struct Event {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    at: f64,
    #[serde(default)]
    frame: f64,
}

/// The most memory decoding `body` may take, from its shape.
pub(crate) fn decode_bound(body: &[u8]) -> usize {
    let shape = proflow_model::json_shape::JsonShape::scan(body);
    let largest = std::mem::size_of::<Profile>()
        .max(std::mem::size_of::<Event>())
        .max(std::mem::size_of::<Frame>());
    // A scalar is a number (8 bytes) or, in `samples`, an array of them
    // (a vector's 24 bytes, counted with the arrays).
    shape
        .built_bytes(largest, std::mem::size_of::<f64>())
        .saturating_add(
            shape
                .arrays
                .saturating_mul(4 * std::mem::size_of::<Vec<f64>>()),
        )
}

/// One profile of the file: its name, unit, the sample rate its values are
/// worth, and its stacks.
pub(crate) struct Converted {
    pub name: String,
    pub unit: String,
    pub sample_rate: u32,
    pub stacks: Stacks<'static>,
}

fn bad(what: String) -> FoldedError {
    FoldedError::Malformed(format!(
        "{what}; send a speedscope file (https://www.speedscope.app/file-format-schema.json) of sampled or evented profiles"
    ))
}

/// The sample rate a profile's values are worth, and what a value of
/// `unit` is multiplied by before it is rounded.
fn unit_rate(unit: &str, sample_rate: u32) -> Result<(u32, f64), FoldedError> {
    let nanos_per_unit = match unit {
        // One sample of 10 ms, as Pyroscope takes it (its rate 10,000 for a
        // hundredth of a sample).
        "none" => 1e7,
        "nanoseconds" => return Ok((NANOS, 1.0)),
        "microseconds" => 1e3,
        "milliseconds" => 1e6,
        "seconds" => 1e9,
        "bytes" => return Ok((0, 1.0)),
        other => return Err(bad(format!("unknown unit {other:?}"))),
    };
    Ok(if sample_rate == 100 {
        (NANOS, nanos_per_unit)
    } else {
        (sample_rate, PRECISION)
    })
}

/// The profiles of a speedscope body.
pub(crate) fn parse(
    body: &[u8],
    sample_rate: u32,
    limits: TextLimits,
    charge: &mut Charge<'_>,
) -> Result<Vec<Converted>, FoldedError> {
    let file: File =
        serde_json::from_slice(body).map_err(|e| bad(format!("unreadable JSON ({e})")))?;
    if file.schema != SCHEMA {
        return Err(bad(format!("unknown $schema {:?}", file.schema)));
    }
    let names: Vec<&str> = file.shared.frames.iter().map(|f| f.name.as_str()).collect();
    // Merged by name, type, unit and start, in order of start.
    let mut merged: Vec<Profile> = Vec::new();
    for p in file.profiles {
        match merged.iter_mut().find(|m| {
            m.name == p.name
                && m.kind == p.kind
                && m.unit == p.unit
                && m.start_value == p.start_value
        }) {
            Some(m) => {
                m.samples.extend(p.samples);
                m.events.extend(p.events);
                m.weights.extend(p.weights);
            }
            None => merged.push(p),
        }
    }
    merged.sort_by(|a, b| a.start_value.total_cmp(&b.start_value));
    let mut out = Vec::with_capacity(merged.len());
    for p in &merged {
        let (rate, multiplier) = unit_rate(&p.unit, sample_rate)?;
        let mut stacks = StackSums::new(limits);
        let mut sums = Sums {
            out: &mut stacks,
            multiplier,
            charge,
        };
        match p.kind.as_str() {
            "sampled" => sampled(p, &names, &mut sums)?,
            "evented" => evented(p, &names, &mut sums)?,
            other => {
                return Err(bad(format!(
                    "profile type {other:?} is neither sampled nor evented"
                )));
            }
        }
        out.push(Converted {
            name: p.name.clone(),
            unit: p.unit.clone(),
            sample_rate: rate,
            stacks: stacks.into_stacks(),
        });
    }
    Ok(out)
}

/// Where one profile's values go: its stacks, the scale of its unit, the
/// request's charge and what it lost.
struct Sums<'a, 'c> {
    out: &'a mut StackSums,
    multiplier: f64,
    charge: &'a mut Charge<'c>,
}

impl Sums<'_, '_> {
    /// Adds `value` (in the profile's unit, not negative) to the stack of
    /// `frames` (root first), scaled and then rounded to the nearest. A
    /// value that was not 0 is lost when it rounds to 0 or has no frame,
    /// and capped when it does not fit.
    fn add(&mut self, frames: &[&str], value: f64) -> Result<(), FoldedError> {
        if value.is_nan() || value <= 0.0 {
            return Ok(());
        }
        if frames.is_empty() {
            self.out.lost.add("empty_stack", 1);
            return Ok(());
        }
        let scaled = (value * self.multiplier).round();
        if scaled < 1.0 {
            self.out.lost.add("rounded_to_zero", 1);
            return Ok(());
        }
        let scaled = if scaled >= i64::MAX as f64 {
            self.out.lost.add("value_capped", 1);
            i64::MAX
        } else {
            scaled as i64
        };
        (self.charge)(frames.iter().map(|f| f.len() + 1).sum()).map_err(FoldedError::Memory)?;
        self.out.add(&frames.join(";"), scaled, self.charge)
    }
}

fn frame<'n>(names: &[&'n str], index: f64) -> Result<&'n str, FoldedError> {
    // Go's int() of a float truncates.
    let i = index.trunc();
    if !(0.0..names.len() as f64).contains(&i) {
        return Err(bad(format!(
            "frame {index} is not one of the {} frames",
            names.len()
        )));
    }
    Ok(names[i as usize])
}

fn sampled(p: &Profile, names: &[&str], sums: &mut Sums<'_, '_>) -> Result<(), FoldedError> {
    if p.samples.len() != p.weights.len() {
        return Err(bad(format!(
            "{} samples but {} weights",
            p.samples.len(),
            p.weights.len()
        )));
    }
    let mut stack: Vec<&str> = Vec::new();
    for (sample, &weight) in p.samples.iter().zip(&p.weights) {
        if weight < 0.0 {
            return Err(bad(format!("negative weight {weight}")));
        }
        stack.clear();
        for &f in sample {
            stack.push(frame(names, f)?);
        }
        sums.add(&stack, weight)?;
    }
    Ok(())
}

fn evented<'p>(p: &Profile, names: &[&'p str], sums: &mut Sums<'_, '_>) -> Result<(), FoldedError> {
    let mut last = p.start_value;
    let mut open: Vec<(usize, &'p str)> = Vec::new();
    for ev in &p.events {
        if ev.at < last {
            return Err(bad(format!("events out of order, {} before {last}", ev.at)));
        }
        let name = frame(names, ev.frame)?;
        let index = ev.frame.trunc() as usize;
        // The open frames as a stack, made only for time to add: a run of
        // opens at one instant costs nothing per open but the open itself
        // (building it for each would be quadratic in the depth).
        let stack =
            |open: &[(usize, &'p str)]| -> Vec<&'p str> { open.iter().map(|(_, n)| *n).collect() };
        match ev.kind.as_str() {
            "C" => {
                if open.last().map(|(i, _)| *i) != Some(index) {
                    return Err(bad(format!(
                        "frame {index} is closed at {} but not open",
                        ev.at
                    )));
                }
                if ev.at > last {
                    sums.add(&stack(&open), ev.at - last)?;
                }
                open.pop();
            }
            "O" => {
                // The time up to an open is the open frames' own (none
                // open: time outside the profile, not a sample).
                if ev.at > last && !open.is_empty() {
                    sums.add(&stack(&open), ev.at - last)?;
                }
                (sums.charge)(std::mem::size_of::<(usize, &str)>()).map_err(FoldedError::Memory)?;
                open.push((index, name));
            }
            other => return Err(bad(format!("unknown event type {other:?}"))),
        }
        last = ev.at;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_model::lost::LostSamples;

    fn ok(_: usize) -> Result<(), proflow_model::memory::OverBudget> {
        Ok(())
    }

    fn stacks(c: &Converted) -> Vec<(String, i64)> {
        c.stacks
            .stacks
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }

    fn parse_all(body: &[u8], sample_rate: u32) -> (Vec<Converted>, LostSamples) {
        let got = parse(body, sample_rate, TextLimits::default(), &mut ok).unwrap();
        let mut lost = LostSamples::default();
        got.iter().for_each(|c| lost.merge(&c.stacks.lost));
        (got, lost)
    }

    #[test]
    fn sampled_and_evented_in_nanoseconds() {
        let body = br#"{"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": [{"name": "main"}, {"name": "foo"}, {"name": "bar"}]},
            "profiles": [
              {"type": "sampled", "name": "s", "unit": "milliseconds", "startValue": 0, "endValue": 9,
               "samples": [[0, 1], [0, 2], [0, 1]], "weights": [3, 2, 1.5]},
              {"type": "evented", "name": "e", "unit": "seconds", "startValue": 10, "endValue": 20,
               "events": [{"type": "O", "at": 10, "frame": 0}, {"type": "O", "at": 12, "frame": 1},
                          {"type": "C", "at": 15, "frame": 1}, {"type": "C", "at": 16, "frame": 0}]}
            ]}"#;
        let (got, lost) = parse_all(body, 100);
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].name.as_str(), got[0].sample_rate), ("s", NANOS));
        // 1.5 ms is 1.5 ms (Pyroscope truncates it to 1 ms).
        assert_eq!(
            stacks(&got[0]),
            vec![
                ("main;foo".into(), 4_500_000),
                ("main;bar".into(), 2_000_000)
            ]
        );
        assert_eq!(
            (got[1].unit.as_str(), got[1].sample_rate),
            ("seconds", NANOS)
        );
        // main opened at 10: 2 s up to foo's open (Pyroscope leaves these
        // unscaled), foo 3 s, main 1 s.
        assert_eq!(
            stacks(&got[1]),
            vec![
                ("main".into(), 3_000_000_000),
                ("main;foo".into(), 3_000_000_000)
            ]
        );
        assert!(lost.is_empty(), "{lost:?}");
    }

    #[test]
    fn fractions_of_a_unit_are_kept() {
        // A 100 Hz sampler writing seconds: Pyroscope stores nothing.
        let body = br#"{"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": [{"name": "main"}, {"name": "work"}]},
            "profiles": [{"type": "sampled", "name": "py", "unit": "seconds", "startValue": 0, "endValue": 0.03,
               "samples": [[0, 1], [0, 1], [0]], "weights": [0.01, 0.01, 0.01]}]}"#;
        let (got, lost) = parse_all(body, 100);
        assert_eq!(got[0].sample_rate, NANOS);
        assert_eq!(
            stacks(&got[0]),
            vec![
                ("main;work".into(), 20_000_000),
                ("main".into(), 10_000_000)
            ]
        );
        assert!(lost.is_empty(), "{lost:?}");
        // With the client's own sample rate, hundredths of a sample at it.
        let (got, _) = parse_all(body, 97);
        assert_eq!(got[0].sample_rate, 97);
        assert_eq!(
            stacks(&got[0]),
            vec![("main;work".into(), 2), ("main".into(), 1)]
        );
    }

    #[test]
    fn what_cannot_be_carried_is_counted() {
        let body = br#"{"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": [{"name": "main"}]},
            "profiles": [{"type": "sampled", "name": "p", "unit": "seconds", "startValue": 0, "endValue": 1,
               "samples": [[0], [], [0], [0], []], "weights": [1e-10, 0.5, 0, 1e300, 0]}]}"#;
        let (got, lost) = parse_all(body, 100);
        assert_eq!(stacks(&got[0]), vec![("main".into(), i64::MAX)]);
        // The zero weights are nothing to store, not losses.
        assert_eq!(
            lost.iter().collect::<Vec<_>>(),
            vec![
                ("rounded_to_zero", 1),
                ("empty_stack", 1),
                ("value_capped", 1)
            ]
        );
        // A hundredth of a sample is the precision at the client's rate.
        let (_, lost) = parse_all(body, 97);
        assert_eq!(lost.samples("rounded_to_zero"), 1);
    }

    #[test]
    fn what_pyroscope_refuses_is_refused() {
        for body in [
            &br#"{"$schema": "x", "profiles": []}"#[..],
            br#"{"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {"frames": [{"name": "a"}]},
                "profiles": [{"type": "sampled", "unit": "none", "samples": [[1]], "weights": [1]}]}"#,
            br#"{"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {"frames": [{"name": "a"}]},
                "profiles": [{"type": "sampled", "unit": "none", "samples": [[0]], "weights": []}]}"#,
            br#"{"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {"frames": [{"name": "a"}]},
                "profiles": [{"type": "evented", "unit": "none", "events": [{"type": "C", "at": 1, "frame": 0}]}]}"#,
            br#"{"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {"frames": [{"name": "a"}]},
                "profiles": [{"type": "sampled", "unit": "furlongs", "samples": [], "weights": []}]}"#,
            b"not json",
        ] {
            assert!(
                matches!(
                    parse(body, 100, TextLimits::default(), &mut ok),
                    Err(FoldedError::Malformed(_))
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }
}
