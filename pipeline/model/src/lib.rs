//! proflow's data model and codecs: what a profile is while it travels and
//! how its bytes are read and written. Lives here: the envelope, labels, the
//! lazily decoded payload and batches ([`model`]), delivery acknowledgement
//! ([`delivery`]), the pprof messages ([`pprof`]), OTLP profiles and the
//! conversions ([`otlp`]), the profile type rules ([`profile_type`]),
//! Pyroscope's push messages ([`push_v1`]), the spans a `traces` pipeline
//! carries ([`spans`]), the protobuf wire walker that bounds untrusted
//! messages before they are decoded ([`wire`]), the bound of a JSON
//! document's decoded size ([`json_shape`]), the in-flight memory budget
//! every decoder of outside bytes runs under ([`memory`], [`inflate`]), and
//! the samples a conversion could not carry ([`lost`]).
//!
//! It depends on no other proflow crate; everything else depends on it.

pub mod delivery;
pub mod inflate;
pub mod jfr;
pub mod json_shape;
pub mod lost;
pub mod memory;
pub mod model;
pub mod otlp;
pub mod pprof;
pub mod profile_type;
pub mod push_v1;
pub mod spans;
#[doc(hidden)]
pub mod testdata;
pub mod wire;
