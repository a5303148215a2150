//! Reading a profile's protobuf as the delta needs it, and the sinks the
//! delta is counted and written through.

use super::*;

/// Where the profile's top-level fields are, as slices of its bytes.
pub(super) struct Parts<'a> {
    /// (type, unit) string indices of each sample type.
    pub(super) sample_types: Vec<(i64, i64)>,
    pub(super) samples: Vec<&'a [u8]>,
    pub(super) locations: Vec<&'a [u8]>,
    pub(super) functions: Vec<&'a [u8]>,
    pub(super) strings: Vec<&'a [u8]>,
    pub(super) time_nanos: i64,
    pub(super) duration_nanos: i64,
    /// The scratch this call takes, from the counts.
    pub(super) work: usize,
}

impl<'a> Parts<'a> {
    /// Counts the fields, checks the work fits in `granted`, then notes
    /// where each one is.
    pub(super) fn read(plain: &'a [u8], granted: usize) -> Result<Parts<'a>, DeltaError> {
        let mut count = [0usize; 7];
        for field in wire::fields(plain) {
            let (tag, value) = field?;
            if let (1..=6, Value::Bytes(_)) = (tag, value) {
                count[tag as usize] += 1;
            }
        }
        let [_, types, samples, _, locations, functions, strings] = count;
        let work = [
            types.saturating_mul(size_of::<(i64, i64)>() + size_of::<Option<usize>>()),
            samples.saturating_mul(WORK_PER_SAMPLE),
            locations
                .saturating_add(functions)
                .saturating_mul(WORK_PER_ENTRY),
            strings.saturating_mul(WORK_PER_STRING),
        ]
        .into_iter()
        .fold(0, usize::saturating_add);
        if work > granted {
            return Err(DeltaError::OverBudget {
                need: work,
                granted,
            });
        }
        let mut parts = Parts {
            sample_types: Vec::with_capacity(types),
            samples: Vec::with_capacity(samples),
            locations: Vec::with_capacity(locations),
            functions: Vec::with_capacity(functions),
            strings: Vec::with_capacity(strings),
            time_nanos: 0,
            duration_nanos: 0,
            work,
        };
        for field in wire::fields(plain) {
            match field? {
                (1, Value::Bytes(b)) => parts.sample_types.push(value_type(b)?),
                (2, Value::Bytes(b)) => parts.samples.push(b),
                (4, Value::Bytes(b)) => parts.locations.push(b),
                (5, Value::Bytes(b)) => parts.functions.push(b),
                (6, Value::Bytes(b)) => parts.strings.push(b),
                // Mappings and the period type: copied, never read.
                (3 | 11, Value::Bytes(_)) => {}
                (1..=6 | 11, _) => {
                    return Err(malformed("a message field is not length-delimited"));
                }
                (9, Value::Varint(v)) => parts.time_nanos = v as i64,
                (10, Value::Varint(v)) => parts.duration_nanos = v as i64,
                (7..=10 | 12, Value::Bytes(_) | Value::Fixed32(_) | Value::Fixed64(_)) => {
                    return Err(malformed("an integer field is not a varint"));
                }
                _ => {}
            }
        }
        Ok(parts)
    }

    /// For each sample type, its column among the cumulative values (`None`
    /// for the others).
    pub(super) fn cumulative_columns(&self, hasher: &StackHasher) -> Vec<Option<usize>> {
        let mut next = 0;
        self.sample_types
            .iter()
            .map(|&(t, _)| {
                let name = hasher.string_bytes(self, t);
                CUMULATIVE_TYPES
                    .iter()
                    .any(|c| c.as_bytes() == name)
                    .then(|| {
                        next += 1;
                        next - 1
                    })
            })
            .collect()
    }
}

/// For each cumulative column, whether a value of it going down means the
/// process restarted. Go's `alloc_objects` is an estimate (its count scaled
/// by the stack's average allocation size against the sampling rate), which
/// goes down when a stack's average size grows; the other cumulative types
/// never go down in a running process. A profile whose only cumulative
/// type is `alloc_objects` is judged by it.
pub(super) fn restart_columns(
    parts: &Parts<'_>,
    hasher: &StackHasher,
    column: &[Option<usize>],
) -> Vec<bool> {
    let width = column.iter().flatten().count();
    let mut restarts = vec![true; width];
    for (&(t, _), k) in parts.sample_types.iter().zip(column) {
        if let Some(&k) = k.as_ref()
            && hasher.string_bytes(parts, t) == ESTIMATED_TYPE.as_bytes()
        {
            restarts[k] = false;
        }
    }
    if restarts.iter().all(|r| !r) {
        restarts.fill(true);
    }
    restarts
}

/// The cumulative sample type whose values may go down between two scrapes
/// of a running Go process.
const ESTIMATED_TYPE: &str = "alloc_objects";

/// Fields 1 to `N` of a message whose fields are all integers (a
/// ValueType, Function, Line or Label), 0 when absent, the last when
/// repeated; other field numbers are skipped, as a decoder skips unknown
/// ones. `what` names the message in the error.
pub(super) fn varints<const N: usize>(message: &[u8], what: &str) -> Result<[u64; N], DeltaError> {
    let mut out = [0u64; N];
    for field in wire::fields(message) {
        let (tag, value) = field?;
        let Some(slot) = (tag as usize).checked_sub(1).and_then(|i| out.get_mut(i)) else {
            continue;
        };
        match value {
            Value::Varint(v) => *slot = v,
            _ => {
                return Err(DeltaError::Malformed(format!(
                    "field {tag} of a {what} is not a varint"
                )));
            }
        }
    }
    Ok(out)
}

/// A ValueType's (type, unit) string indices.
pub(super) fn value_type(bytes: &[u8]) -> Result<(i64, i64), DeltaError> {
    let [t, u] = varints(bytes, "ValueType")?;
    Ok((t as i64, u as i64))
}

/// Calls `f` with each varint of a repeated integer field met as `value`:
/// one unpacked element, or every element of a packed run.
pub(super) fn for_each_varint(value: Value<'_>, mut f: impl FnMut(u64)) -> Result<(), DeltaError> {
    match value {
        Value::Varint(v) => f(v),
        Value::Bytes(mut packed) => {
            while !packed.is_empty() {
                f(wire::read_varint(&mut packed)?);
            }
        }
        Value::Fixed32(_) | Value::Fixed64(_) => {
            return Err(malformed(
                "a repeated integer field is neither varint nor packed",
            ));
        }
    }
    Ok(())
}

/// Calls `f` with (index, value) of each value of a sample, in order.
pub(super) fn for_each_value(
    sample: &[u8],
    mut f: impl FnMut(usize, i64),
) -> Result<(), DeltaError> {
    let mut index = 0usize;
    for field in wire::fields(sample) {
        let (tag, value) = field?;
        if tag == 2 {
            for_each_varint(value, |v| {
                f(index, v as i64);
                index += 1;
            })?;
        }
    }
    Ok(())
}

/// Calls `f` with each field of `message` as (field number, its bytes on
/// the wire, key included).
pub(super) fn each_raw_field(
    message: &[u8],
    mut f: impl FnMut(u32, &[u8]),
) -> Result<(), DeltaError> {
    let mut fields = wire::fields(message);
    loop {
        let start = message.len() - fields.rest().len();
        let Some(field) = fields.next() else {
            return Ok(());
        };
        let (tag, _) = field?;
        f(tag, &message[start..message.len() - fields.rest().len()]);
    }
}

/// Bytes the varint of `v` takes.
pub(super) fn varint_len(v: u64) -> usize {
    // 1 for 0..=127, one more per 7 bits.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Where the delta is written: counted first, then written into a buffer
/// of exactly that length.
pub(super) trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn varint(&mut self, v: u64);
}

/// A sink that only counts.
pub(super) struct Count(pub(super) usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
    fn varint(&mut self, v: u64) {
        self.0 += varint_len(v);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.push(v as u8);
    }
}
