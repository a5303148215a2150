//! The payload of an envelope: the form a profile arrived in (pprof bytes,
//! plain or gzip, or OTLP sharing its request's dictionary), decoded and
//! converted only when asked, each form kept once made; clones share
//! everything through `Arc`/`Bytes`. It knows nothing of the envelope.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::otlp::{self, ConvertError, Lost, OtlpProfiles};
use crate::pprof::{self, DecodeError};

/// The encoded form of a pprof payload, as it arrived or as we encoded it.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The protobuf bytes, gzipped when `gzipped` is true.
    pub bytes: Bytes,
    pub gzipped: bool,
}

/// The two forms a profile travels in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// pprof (`perftools.profiles`), as bytes or decoded.
    Pprof,
    /// OTLP profiles ([`OtlpProfiles`]): decoded, sharing the dictionary of
    /// the request they came in.
    Otlp,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Pprof => "pprof",
            Format::Otlp => "otlp",
        })
    }
}

/// Why a payload could not give the form asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("{0}")]
    Convert(#[from] ConvertError),
}

/// The pprof form: bytes, a decoded profile, or both.
#[derive(Debug)]
struct PprofForm {
    /// The bytes as they arrived; for a form made from a profile, encoded on
    /// first use and kept (counted in the payload's size from the start).
    encoded: OnceLock<Encoded>,
    /// The profile, for a form made from one.
    profile: Option<Arc<pprof::Profile>>,
}

impl PprofForm {
    fn from_encoded(e: Encoded) -> Self {
        let encoded = OnceLock::new();
        let _ = encoded.set(e);
        PprofForm {
            encoded,
            profile: None,
        }
    }

    fn encoded(&self) -> &Encoded {
        self.encoded.get_or_init(|| match &self.profile {
            Some(p) => Encoded {
                bytes: pprof::encode(p),
                gzipped: false,
            },
            // Unreachable by construction: a form without a profile was made
            // from bytes, which set `encoded`.
            None => Encoded {
                bytes: Bytes::new(),
                gzipped: false,
            },
        })
    }
}

#[derive(Debug)]
struct PayloadInner {
    arrived: Format,
    /// Set when the payload arrived as pprof or was given that form.
    pprof: Option<PprofForm>,
    /// Set when the payload arrived as OTLP or was given that form.
    otlp: Option<Arc<OtlpProfiles>>,
    /// What this payload keeps alive, fixed at construction so queue
    /// accounting never changes while the payload waits.
    size: usize,
    /// Set once anything decoded the pprof bytes (tests and benchmarks check
    /// that pass-through never decodes).
    decoded_once: AtomicBool,
    /// Set once anything converted between the forms.
    converted_once: AtomicBool,
}

/// A profile in the form it arrived in (pprof bytes, a decoded pprof profile,
/// or OTLP), plus any other form the pipeline gave it. Cloning is an `Arc`
/// clone: fan-out copies no payload.
///
/// A form is added only by [`Payload::with_form`], which makes a new payload
/// holding both forms and counting both in its size: the pipeline calls it
/// once per profile, before the profile enters any exporter queue, for the
/// forms the pipeline's exporters declared they want, so every queue counts
/// what it holds and every exporter shares the one conversion.
///
/// Everything else derived is made afresh on each call and never cached (a
/// decoded profile is several times larger than its bytes, and a cache filled
/// after admission would pin memory no queue counted): [`Payload::decoded`],
/// [`Payload::gzipped`] of plain bytes, and a form the payload lacks.
///
/// The one exception is a receiver's own work: a receiver that inflated
/// gzipped bytes to check them may hand the plain bytes along
/// ([`Payload::with_plain`]), held by the request it is answering, so that
/// processors reading the bytes ([`Payload::plain`], [`Payload::decoded`])
/// do not inflate them again. The pipeline drops them
/// ([`Payload::drop_plain`]) before the payload enters any exporter queue.
#[derive(Debug, Clone)]
pub struct Payload {
    inner: Arc<PayloadInner>,
    /// Cap on the decompressed size when decoding (set by the receiver).
    decode_limit: usize,
    /// The gzipped bytes decompressed, while the receiver's request holds
    /// them (see the type's docs).
    plain: Option<Bytes>,
}

impl Payload {
    fn new(
        arrived: Format,
        pprof: Option<PprofForm>,
        otlp: Option<Arc<OtlpProfiles>>,
        size: usize,
        decoded: bool,
        decode_limit: usize,
    ) -> Self {
        Payload {
            inner: Arc::new(PayloadInner {
                arrived,
                pprof,
                otlp,
                size,
                decoded_once: AtomicBool::new(decoded),
                converted_once: AtomicBool::new(false),
            }),
            decode_limit,
            plain: None,
        }
    }

    /// A payload from pprof bytes as they arrived (gzip detected by magic bytes).
    ///
    /// The payload keeps `bytes` alive, and with them the whole buffer they
    /// are a slice of: a receiver that cut several profiles out of one request
    /// buffer should [`Payload::detach`] them so each pins only itself.
    pub fn from_bytes(bytes: Bytes, decode_limit: usize) -> Self {
        let gzipped = pprof::is_gzip(&bytes);
        let size = bytes.len();
        let form = PprofForm::from_encoded(Encoded { bytes, gzipped });
        Payload::new(Format::Pprof, Some(form), None, size, false, decode_limit)
    }

    /// A payload from a decoded profile (for example converted from folded text
    /// or changed by a processor). Bytes are made when first needed and kept;
    /// the size counts both.
    pub fn from_profile(profile: pprof::Profile) -> Self {
        let size = heap_size(&profile) + prost::Message::encoded_len(&profile);
        let form = PprofForm {
            encoded: OnceLock::new(),
            profile: Some(Arc::new(profile)),
        };
        Payload::new(
            Format::Pprof,
            Some(form),
            None,
            size,
            true,
            pprof::DEFAULT_MAX_DECOMPRESSED,
        )
    }

    /// A payload that arrived as OTLP.
    pub fn from_otlp(otlp: OtlpProfiles) -> Self {
        let size = otlp.size_bytes();
        Payload::new(
            Format::Otlp,
            None,
            Some(Arc::new(otlp)),
            size,
            false,
            pprof::DEFAULT_MAX_DECOMPRESSED,
        )
    }

    /// This payload carrying `plain`, the decompression of its gzipped
    /// bytes the receiver made within [`Payload::decode_limit`] while
    /// checking them, and whose memory the receiver's request holds until it
    /// is answered. Ignored for a payload that did not arrive as gzipped
    /// pprof bytes.
    pub fn with_plain(mut self, plain: Bytes) -> Payload {
        let gzipped = match &self.inner.pprof {
            Some(f) if f.profile.is_none() => f.encoded.get().is_some_and(|e| e.gzipped),
            _ => false,
        };
        // Plain means plain: a profile gzipped twice keeps no "plain" gzip.
        if gzipped && plain.len() <= self.decode_limit && !pprof::is_gzip(&plain) {
            self.plain = Some(plain);
        }
        self
    }

    /// Forgets the plain bytes a receiver handed along: the pipeline calls
    /// it before the payload enters an exporter queue, so no queue keeps
    /// memory it did not count.
    pub fn drop_plain(&mut self) {
        self.plain = None;
    }

    /// True while the payload carries its receiver's plain bytes.
    pub fn has_plain(&self) -> bool {
        self.plain.is_some()
    }

    /// The pprof bytes, uncompressed: the receiver's plain bytes when it
    /// handed them along, the bytes themselves when they are not gzipped,
    /// else inflated now within [`Payload::decode_limit`] (not cached).
    pub fn plain(&self) -> Result<Bytes, PayloadError> {
        if let Some(p) = &self.plain {
            return Ok(p.clone());
        }
        let e = self.encoded()?;
        Ok(pprof::decompress(&e.bytes, self.decode_limit)?)
    }

    /// The cap on the decompressed size the receiver set, for components
    /// that read the bytes themselves.
    pub fn decode_limit(&self) -> usize {
        self.decode_limit
    }

    /// The form the payload arrived in.
    pub fn arrived_as(&self) -> Format {
        self.inner.arrived
    }

    /// True when the payload holds `format` without converting.
    pub fn has(&self, format: Format) -> bool {
        match format {
            Format::Pprof => self.inner.pprof.is_some(),
            Format::Otlp => self.inner.otlp.is_some(),
        }
    }

    /// This payload with `format` added (converted once, now), or this
    /// payload itself when it has that form already. The new payload's size
    /// counts both forms. Whatever the conversion could not carry is added
    /// to `lost`.
    pub fn with_form(&self, format: Format, lost: &mut Lost) -> Result<Payload, PayloadError> {
        self.with_form_cached(format, lost, &mut ConvertCache::default())
    }

    /// [`Payload::with_form`] for one of a batch of payloads: `cache` keeps
    /// the dictionary the last conversion decoded, so the payloads of one
    /// OTLP request (which share it) decode and check it once in all.
    pub fn with_form_cached(
        &self,
        format: Format,
        lost: &mut Lost,
        cache: &mut ConvertCache,
    ) -> Result<Payload, PayloadError> {
        if self.has(format) {
            return Ok(self.clone());
        }
        let inner = &self.inner;
        let decoded = inner.decoded_once.load(Ordering::Relaxed);
        let payload = match format {
            Format::Otlp => self.with_otlp(Arc::new(self.convert_to_otlp(lost)?)),
            Format::Pprof => {
                let encoded = self.convert_to_pprof(lost, cache)?;
                let size = inner.size + encoded.bytes.len();
                Payload::new(
                    inner.arrived,
                    Some(PprofForm::from_encoded(encoded)),
                    inner.otlp.clone(),
                    size,
                    decoded,
                    self.decode_limit,
                )
            }
        };
        payload.inner.converted_once.store(true, Ordering::Relaxed);
        self.inner.converted_once.store(true, Ordering::Relaxed);
        Ok(payload)
    }

    /// This payload with `otlp` as its OTLP form (replacing any it had), for
    /// a processor that made that form itself (cheaper, or carrying what the
    /// pprof form does not, such as links). The size counts both forms.
    pub fn with_otlp(&self, otlp: Arc<OtlpProfiles>) -> Payload {
        let inner = &self.inner;
        let pprof = inner.pprof.as_ref().map(|f| PprofForm {
            encoded: f.encoded.clone(),
            profile: f.profile.clone(),
        });
        // What the pprof form accounts for (none when there is none).
        let own = match (&pprof, &inner.otlp) {
            (None, _) => 0,
            (Some(_), Some(o)) => inner.size.saturating_sub(o.size_bytes()),
            (Some(_), None) => inner.size,
        };
        let size = own + otlp.size_bytes();
        let mut payload = Payload::new(
            inner.arrived,
            pprof,
            Some(otlp),
            size,
            inner.decoded_once.load(Ordering::Relaxed),
            self.decode_limit,
        );
        payload.inner.converted_once.store(true, Ordering::Relaxed);
        // The pprof form is this payload's own: its plain bytes still are.
        payload.plain = self.plain.clone();
        payload
    }

    /// The same payload holding its own copy of the bytes, so it no longer
    /// keeps a larger buffer (a whole request) alive. A payload made from a
    /// profile or holding OTLP is returned as it is.
    pub fn detach(&self) -> Payload {
        match (&self.inner.pprof, &self.inner.otlp) {
            (Some(f), None) if f.profile.is_none() => {
                let mut detached = Payload::from_bytes(
                    Bytes::copy_from_slice(&f.encoded().bytes),
                    self.decode_limit,
                );
                // Plain bytes are the receiver's own buffer, never a slice of
                // the request's.
                detached.plain = self.plain.clone();
                detached
            }
            _ => self.clone(),
        }
    }

    /// The pprof bytes: as they arrived, encoded once from the payload's
    /// profile, or converted now from OTLP (not cached).
    pub fn encoded(&self) -> Result<Encoded, PayloadError> {
        match &self.inner.pprof {
            Some(f) => Ok(f.encoded().clone()),
            None => self.convert_to_pprof(&mut Lost::default(), &mut ConvertCache::default()),
        }
    }

    /// Gzipped pprof bytes: the arrived bytes when they were gzipped (shared,
    /// no copy), else compressed now.
    pub fn gzipped(&self) -> Result<Bytes, PayloadError> {
        let e = self.encoded()?;
        Ok(if e.gzipped {
            e.bytes
        } else {
            pprof::gzip(&e.bytes)
        })
    }

    /// The decoded pprof profile: the payload's own for one made from a
    /// profile, else decoded (or converted) now (not cached; see the type's docs).
    pub fn decoded(&self) -> Result<Arc<pprof::Profile>, PayloadError> {
        if let Some(p) = self.inner.pprof.as_ref().and_then(|f| f.profile.as_ref()) {
            return Ok(p.clone());
        }
        let bytes = match &self.plain {
            Some(p) => p.clone(),
            None => self.encoded()?.bytes,
        };
        self.inner.decoded_once.store(true, Ordering::Relaxed);
        Ok(pprof::decode(&bytes, self.decode_limit).map(Arc::new)?)
    }

    /// The OTLP form: the payload's own, or converted now (not cached).
    pub fn otlp(&self) -> Result<Arc<OtlpProfiles>, PayloadError> {
        match &self.inner.otlp {
            Some(o) => Ok(o.clone()),
            None => Ok(Arc::new(self.convert_to_otlp(&mut Lost::default())?)),
        }
    }

    fn convert_to_otlp(&self, lost: &mut Lost) -> Result<OtlpProfiles, PayloadError> {
        self.inner.converted_once.store(true, Ordering::Relaxed);
        let profile = self.decoded()?;
        let mut dict = otlp::DictionaryBuilder::new();
        let profiles = otlp::pprof_to_otlp(&profile, &mut dict, lost)?;
        Ok(OtlpProfiles::decoded(dict.finish(), profiles))
    }

    fn convert_to_pprof(
        &self,
        lost: &mut Lost,
        cache: &mut ConvertCache,
    ) -> Result<Encoded, PayloadError> {
        self.inner.converted_once.store(true, Ordering::Relaxed);
        let Some(o) = &self.inner.otlp else {
            return Err(ConvertError("the payload holds no profile".to_owned()).into());
        };
        let dictionary = cache.dictionary(&o.dictionary)?;
        let decoded = otlp::decode_all(&o.profiles)?;
        let mut profiles = otlp::otlp_to_pprof_checked(&dictionary, &decoded, lost)?.into_iter();
        let profile = match (profiles.next(), profiles.next()) {
            (Some(p), None) => p,
            _ => {
                return Err(ConvertError(format!(
                    "these {} OTLP profiles do not share one time window, so they do not make one pprof profile",
                    o.profiles.len()
                ))
                .into());
            }
        };
        Ok(Encoded {
            bytes: pprof::encode(&profile),
            gzipped: false,
        })
    }

    /// The decoded profile the payload holds, if it holds one (nothing is
    /// decoded here).
    pub fn profile(&self) -> Option<Arc<pprof::Profile>> {
        self.inner.pprof.as_ref().and_then(|f| f.profile.clone())
    }

    /// True when the payload holds a decoded profile or was ever decoded (for
    /// tests and benchmarks that check the pass-through path never decodes).
    pub fn is_decoded(&self) -> bool {
        self.inner.decoded_once.load(Ordering::Relaxed)
    }

    /// An identity for this payload's shared contents: equal for clones,
    /// different for payloads alive at the same time with other contents.
    pub fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// True when anything converted this payload between pprof and OTLP.
    pub fn is_converted(&self) -> bool {
        self.inner.converted_once.load(Ordering::Relaxed)
    }

    /// Bytes of memory this payload keeps alive, as queues account them: the
    /// bytes' length, an estimate of a decoded profile's heap plus its
    /// encoding, or the OTLP form's estimate; for a payload holding two
    /// forms, both.
    pub fn size_bytes(&self) -> usize {
        self.inner.size
    }
}

/// What the conversions of one batch share: the dictionary the last one
/// decoded and checked, kept while the next payload has the same one (the
/// payloads of an OTLP request share theirs, so a request of many profiles
/// and a large dictionary costs one decode, not one per profile). Held only
/// while the batch is converted, then dropped with it.
#[derive(Debug, Default)]
pub struct ConvertCache {
    last: Option<(
        Arc<otlp::SharedDictionary>,
        Arc<otlp::proto::ProfilesDictionary>,
    )>,
}

impl ConvertCache {
    fn dictionary(
        &mut self,
        shared: &Arc<otlp::SharedDictionary>,
    ) -> Result<Arc<otlp::proto::ProfilesDictionary>, ConvertError> {
        if let Some((s, d)) = &self.last
            && Arc::ptr_eq(s, shared)
        {
            return Ok(d.clone());
        }
        self.last = None;
        let decoded = shared.decoded()?.into_owned();
        otlp::check_dictionary(&decoded)?;
        let decoded = Arc::new(decoded);
        self.last = Some((shared.clone(), decoded.clone()));
        Ok(decoded)
    }
}

/// The heap a decoded profile holds: every vector's capacity and string's
/// capacity (a close estimate; allocator overhead is not counted).
fn heap_size(p: &pprof::Profile) -> usize {
    use std::mem::size_of;
    let samples: usize = p
        .sample
        .iter()
        .map(|s| {
            s.location_id.capacity() * size_of::<u64>()
                + s.value.capacity() * size_of::<i64>()
                + s.label.capacity() * size_of::<pprof::Label>()
        })
        .sum();
    let locations: usize = p
        .location
        .iter()
        .map(|l| l.line.capacity() * size_of::<pprof::Line>())
        .sum();
    let strings: usize = p.string_table.iter().map(String::capacity).sum();
    size_of::<pprof::Profile>()
        + p.sample_type.capacity() * size_of::<pprof::ValueType>()
        + p.sample.capacity() * size_of::<pprof::Sample>()
        + samples
        + p.mapping.capacity() * size_of::<pprof::Mapping>()
        + p.location.capacity() * size_of::<pprof::Location>()
        + locations
        + p.function.capacity() * size_of::<pprof::Function>()
        + p.string_table.capacity() * size_of::<String>()
        + strings
        + p.comment.capacity() * size_of::<i64>()
}

#[cfg(test)]
mod tests;
