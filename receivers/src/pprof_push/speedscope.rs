//! Speedscope JSON bodies of `/ingest` (`format=speedscope`), read as
//! Pyroscope reads them: the file's `$schema` must be speedscope's; each
//! profile, `sampled` (stacks of frame indexes, root first, and their
//! weights) or `evented` (frames opened and closed at times), becomes the
//! stacks the folded conversion takes, with its values scaled as Pyroscope
//! scales them: times are kept to a hundredth of their unit and converted
//! to nanoseconds by a sample rate chosen from the unit (when the client
//! sent the default 100), bytes are taken as they are. Profiles of the same
//! name, type, unit and start are merged. With more than one profile each
//! is named `<app>.<unit>` (which makes its type); every one is labelled
//! `profile_name`.
//!
//! One difference: nanoseconds. Pyroscope's sample rate for them overflows
//! and every value becomes 0; here a nanosecond profile keeps its values in
//! nanoseconds.
//!
//! The document's memory is granted from its shape before it is decoded.

use serde::Deserialize;

use super::folded::{Charge, FoldedError, StackSums, Stacks, TextLimits};

/// The `$schema` every speedscope file names.
const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";
/// Times are kept to a hundredth of their unit.
const PRECISION: u64 = 100;

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
    let shape = proflow_pipeline::json_shape::JsonShape::scan(body);
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

/// The unit's sample rate when the client sent the default (100), and what
/// a value is multiplied by.
fn unit_rate(unit: &str, sample_rate: u32) -> Result<(u32, u64), FoldedError> {
    let (default, multiplier) = match unit {
        "none" => (10_000, PRECISION),
        "nanoseconds" => return Ok((1_000_000_000, 1)),
        "microseconds" => (100_000_000, PRECISION),
        "milliseconds" => (100_000, PRECISION),
        "seconds" => (100, PRECISION),
        "bytes" => (0, 1),
        other => return Err(bad(format!("unknown unit {other:?}"))),
    };
    Ok((
        if sample_rate == 100 {
            default
        } else {
            sample_rate
        },
        multiplier,
    ))
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
        match p.kind.as_str() {
            "sampled" => sampled(p, &names, multiplier, &mut stacks, charge)?,
            "evented" => evented(p, &names, multiplier, &mut stacks, charge)?,
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

/// Adds `value` to the stack of `frames` (root first).
fn add(
    sums: &mut StackSums,
    frames: &[&str],
    value: u64,
    charge: &mut Charge<'_>,
) -> Result<(), FoldedError> {
    if value == 0 || frames.is_empty() {
        return Ok(());
    }
    charge(frames.iter().map(|f| f.len() + 1).sum()).map_err(FoldedError::Memory)?;
    let value = i64::try_from(value).unwrap_or(i64::MAX);
    sums.add(&frames.join(";"), value, charge)
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

/// A float as Go's `uint64()` takes it: truncated, negative and NaN as 0,
/// too large as the largest.
fn to_u64(v: f64) -> u64 {
    if v.is_nan() || v <= 0.0 {
        0
    } else if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v as u64
    }
}

fn sampled(
    p: &Profile,
    names: &[&str],
    multiplier: u64,
    out: &mut StackSums,
    charge: &mut Charge<'_>,
) -> Result<(), FoldedError> {
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
        add(
            out,
            &stack,
            to_u64(weight).saturating_mul(multiplier),
            charge,
        )?;
    }
    Ok(())
}

fn evented<'p>(
    p: &Profile,
    names: &[&'p str],
    multiplier: u64,
    out: &mut StackSums,
    charge: &mut Charge<'_>,
) -> Result<(), FoldedError> {
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
                let value = to_u64(ev.at - last).saturating_mul(multiplier);
                if value != 0 {
                    add(out, &stack(&open), value, charge)?;
                }
                open.pop();
            }
            "O" => {
                // As Pyroscope does: the time up to an open is not scaled.
                let value = to_u64(ev.at - last);
                if value != 0 {
                    add(out, &stack(&open), value, charge)?;
                }
                charge(std::mem::size_of::<(usize, &str)>()).map_err(FoldedError::Memory)?;
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

    fn ok(_: usize) -> Result<(), proflow_pipeline::memory::OverBudget> {
        Ok(())
    }

    fn stacks(c: &Converted) -> Vec<(String, i64)> {
        c.stacks
            .stacks
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }

    #[test]
    fn sampled_and_evented_as_pyroscope_reads_them() {
        let body = br#"{"$schema": "https://www.speedscope.app/file-format-schema.json",
            "shared": {"frames": [{"name": "main"}, {"name": "foo"}, {"name": "bar"}]},
            "profiles": [
              {"type": "sampled", "name": "s", "unit": "milliseconds", "startValue": 0, "endValue": 9,
               "samples": [[0, 1], [0, 2], [0, 1]], "weights": [3, 2, 1.5]},
              {"type": "evented", "name": "e", "unit": "seconds", "startValue": 10, "endValue": 20,
               "events": [{"type": "O", "at": 10, "frame": 0}, {"type": "O", "at": 12, "frame": 1},
                          {"type": "C", "at": 15, "frame": 1}, {"type": "C", "at": 16, "frame": 0}]}
            ]}"#;
        let got = parse(body, 100, TextLimits::default(), &mut ok).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].name.as_str(), got[0].sample_rate), ("s", 100_000));
        assert_eq!(
            stacks(&got[0]),
            vec![("main;foo".into(), 400), ("main;bar".into(), 200)]
        );
        assert_eq!((got[1].unit.as_str(), got[1].sample_rate), ("seconds", 100));
        // main opened at 10: 2 s unscaled up to foo's open, foo 3 s, main 1 s.
        assert_eq!(
            stacks(&got[1]),
            vec![("main".into(), 2 + 100), ("main;foo".into(), 300)]
        );
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
