//! How much memory an `ExportProfilesServiceRequest` will take once prost
//! decodes it, read from its protobuf bytes before anything is decoded: the
//! walk follows the message's schema (which field holds which message) with
//! [`proflow_pipeline::wire`], counting every message prost will allocate a
//! struct for, every string's and bytes' length and every element of a packed
//! field. A decoded OTLP profile takes 10 to 20 times its wire size (a
//! sample of a few bytes becomes an 80-byte struct), so the receiver grants
//! this estimate from the memory budget before decoding, not after.
//!
//! Vectors grow by doubling while prost fills them, so the estimate doubles
//! what the elements take. Nesting deeper than [`MAX_DEPTH`] is refused (only
//! `AnyValue` nests, and no real attribute nests that deep).

use std::mem::size_of;

use proflow_pipeline::otlp::{Resource, collector, common, proto};
use proflow_pipeline::wire::{self, Value};

/// Deepest nesting of messages read (prost itself stops at 100).
pub(crate) const MAX_DEPTH: usize = 64;

/// The messages of a request, by what they decode into.
#[derive(Debug, Clone, Copy)]
enum Msg {
    Request,
    ResourceProfiles,
    Resource,
    EntityRef,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
    ScopeProfiles,
    Scope,
    Profile,
    ValueType,
    Sample,
    Dictionary,
    Mapping,
    Location,
    Line,
    Function,
    Link,
    KeyValueAndUnit,
    Stack,
}

/// What one field holds.
#[derive(Debug, Clone, Copy)]
enum Field {
    Message(Msg),
    /// A string or bytes: its length.
    Bytes,
    /// A repeated varint field of elements this large (packed or not).
    Varints(usize),
    /// A repeated fixed64 field.
    Fixed64s,
    /// A scalar held inside its message's struct.
    Scalar,
}

impl Msg {
    fn size(self) -> usize {
        match self {
            Msg::Request => size_of::<collector::ExportProfilesServiceRequest>(),
            Msg::ResourceProfiles => size_of::<proto::ResourceProfiles>(),
            Msg::Resource => size_of::<Resource>(),
            Msg::EntityRef => size_of::<common::EntityRef>(),
            Msg::KeyValue => size_of::<common::KeyValue>(),
            Msg::AnyValue => size_of::<common::AnyValue>(),
            Msg::ArrayValue => size_of::<common::ArrayValue>(),
            Msg::KeyValueList => size_of::<common::KeyValueList>(),
            Msg::ScopeProfiles => size_of::<proto::ScopeProfiles>(),
            Msg::Scope => size_of::<common::InstrumentationScope>(),
            Msg::Profile => size_of::<proto::Profile>(),
            Msg::ValueType => size_of::<proto::ValueType>(),
            Msg::Sample => size_of::<proto::Sample>(),
            Msg::Dictionary => size_of::<proto::ProfilesDictionary>(),
            Msg::Mapping => size_of::<proto::Mapping>(),
            Msg::Location => size_of::<proto::Location>(),
            Msg::Line => size_of::<proto::Line>(),
            Msg::Function => size_of::<proto::Function>(),
            Msg::Link => size_of::<proto::Link>(),
            Msg::KeyValueAndUnit => size_of::<proto::KeyValueAndUnit>(),
            Msg::Stack => size_of::<proto::Stack>(),
        }
    }

    /// The schema (OTLP profiles 1.10 and the common/resource protos).
    fn field(self, number: u32) -> Field {
        use Field::{Bytes, Fixed64s, Message as M, Scalar, Varints};
        match (self, number) {
            (Msg::Request, 1) => M(Msg::ResourceProfiles),
            (Msg::Request, 2) => M(Msg::Dictionary),
            (Msg::ResourceProfiles, 1) => M(Msg::Resource),
            (Msg::ResourceProfiles, 2) => M(Msg::ScopeProfiles),
            (Msg::ResourceProfiles, 3) => Bytes,
            (Msg::Resource, 1) => M(Msg::KeyValue),
            (Msg::Resource, 3) => M(Msg::EntityRef),
            (Msg::EntityRef, 1..=4) => Bytes,
            (Msg::KeyValue, 1) => Bytes,
            (Msg::KeyValue, 2) => M(Msg::AnyValue),
            (Msg::AnyValue, 1 | 7) => Bytes,
            (Msg::AnyValue, 5) => M(Msg::ArrayValue),
            (Msg::AnyValue, 6) => M(Msg::KeyValueList),
            (Msg::ArrayValue, 1) => M(Msg::AnyValue),
            (Msg::KeyValueList, 1) => M(Msg::KeyValue),
            (Msg::ScopeProfiles, 1) => M(Msg::Scope),
            (Msg::ScopeProfiles, 2) => M(Msg::Profile),
            (Msg::ScopeProfiles, 3) => Bytes,
            (Msg::Scope, 1 | 2) => Bytes,
            (Msg::Scope, 3) => M(Msg::KeyValue),
            (Msg::Profile, 1 | 5) => M(Msg::ValueType),
            (Msg::Profile, 2) => M(Msg::Sample),
            (Msg::Profile, 7 | 9 | 10) => Bytes,
            (Msg::Profile, 11) => Varints(4),
            (Msg::Sample, 2) => Varints(4),
            (Msg::Sample, 4) => Varints(8),
            (Msg::Sample, 5) => Fixed64s,
            (Msg::Dictionary, 1) => M(Msg::Mapping),
            (Msg::Dictionary, 2) => M(Msg::Location),
            (Msg::Dictionary, 3) => M(Msg::Function),
            (Msg::Dictionary, 4) => M(Msg::Link),
            (Msg::Dictionary, 5) => Bytes,
            (Msg::Dictionary, 6) => M(Msg::KeyValueAndUnit),
            (Msg::Dictionary, 7) => M(Msg::Stack),
            (Msg::Mapping, 5) => Varints(4),
            (Msg::Location, 3) => M(Msg::Line),
            (Msg::Location, 4) => Varints(4),
            (Msg::Link, 1 | 2) => Bytes,
            (Msg::KeyValueAndUnit, 2) => M(Msg::AnyValue),
            (Msg::Stack, 1) => Varints(4),
            _ => Scalar,
        }
    }
}

/// Why the bytes cannot be estimated (and would not decode either).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EstimateError {
    #[error("not a valid protobuf message: {0}")]
    Wire(#[from] wire::WireError),
    #[error("messages nest deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// The bytes an `ExportProfilesServiceRequest` of these protobuf bytes
/// will hold once decoded (see the module docs).
pub(crate) fn decoded_size(request: &[u8]) -> Result<usize, EstimateError> {
    let elements = walk(request, Msg::Request, 0)?;
    Ok(elements.saturating_mul(2))
}

fn walk(bytes: &[u8], msg: Msg, depth: usize) -> Result<usize, EstimateError> {
    if depth > MAX_DEPTH {
        return Err(EstimateError::TooDeep);
    }
    let mut total = msg.size();
    for field in wire::fields(bytes) {
        let (number, value) = field?;
        let add = match (msg.field(number), value) {
            (Field::Message(child), Value::Bytes(b)) => walk(b, child, depth + 1)?,
            (Field::Varints(each), Value::Bytes(b)) => wire::count_varints(b) * each,
            (Field::Varints(each), _) => each,
            (Field::Fixed64s, Value::Bytes(b)) => b.len(),
            (Field::Fixed64s, _) => 8,
            // A string, bytes, or a field this schema does not know (prost
            // keeps no unknown fields, so counting them overestimates).
            (_, Value::Bytes(b)) => b.len(),
            _ => 0,
        };
        total = total.saturating_add(add);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_pipeline::otlp::{dictionary_heap_size, profile_heap_size};
    use prost::Message;

    #[test]
    fn the_estimate_covers_what_prost_allocates() {
        let mut b = proflow_pipeline::otlp::DictionaryBuilder::new();
        let name = b.string("main");
        let f = b.function(proto::Function {
            name_strindex: name,
            ..Default::default()
        });
        let l = b.location(proto::Location {
            lines: vec![proto::Line {
                function_index: f,
                ..Default::default()
            }],
            ..Default::default()
        });
        let stack = b.stack(vec![l]);
        let samples = (0..1000)
            .map(|i| proto::Sample {
                stack_index: stack,
                values: vec![i],
                ..Default::default()
            })
            .collect();
        let request = collector::ExportProfilesServiceRequest {
            resource_profiles: vec![proto::ResourceProfiles {
                scope_profiles: vec![proto::ScopeProfiles {
                    profiles: vec![proto::Profile {
                        samples,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            dictionary: Some(b.finish()),
        };
        let bytes = request.encode_to_vec();
        let estimate = decoded_size(&bytes).unwrap();
        let decoded = collector::ExportProfilesServiceRequest::decode(bytes.as_slice()).unwrap();
        let p = &decoded.resource_profiles[0].scope_profiles[0].profiles[0];
        let actual =
            dictionary_heap_size(decoded.dictionary.as_ref().unwrap()) + profile_heap_size(p);
        assert!(estimate >= actual, "{estimate} < {actual}");
        assert!(
            estimate > 10 * bytes.len(),
            "a sample-heavy profile decodes to far more than its bytes: {estimate} for {}",
            bytes.len()
        );
    }

    #[test]
    fn deep_nesting_and_broken_framing_are_refused() {
        // AnyValue{array_value: ArrayValue{values: [AnyValue{...}]}} nested
        // 100 deep, under Request.resource_profiles.resource.attributes.value.
        let mut any: Vec<u8> = Vec::new();
        for _ in 0..100 {
            let mut array = vec![0x0a];
            prost::encoding::encode_varint(any.len() as u64, &mut array);
            array.extend_from_slice(&any);
            any = vec![0x2a];
            prost::encoding::encode_varint(array.len() as u64, &mut any);
            any.extend_from_slice(&array);
        }
        let wrap = |field: u8, inner: &[u8]| {
            let mut out = vec![field];
            prost::encoding::encode_varint(inner.len() as u64, &mut out);
            out.extend_from_slice(inner);
            out
        };
        let kv = wrap(0x12, &any);
        let resource = wrap(0x0a, &kv);
        let rp = wrap(0x0a, &resource);
        let request = wrap(0x0a, &rp);
        assert_eq!(decoded_size(&request), Err(EstimateError::TooDeep));
        assert!(matches!(
            decoded_size(&[0x0a, 0x05, 1]),
            Err(EstimateError::Wire(_))
        ));
    }
}
