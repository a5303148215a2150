//! A queued batch as the bytes of one disk record, and back.
//!
//! The layout is proflow's own (little-endian; `str` and `bytes` are a `u32`
//! length then the bytes):
//!
//! ```text
//! u8  version (1)
//! u32 profiles
//! str receiver · u8 has tenant [str tenant] · u8 has client [str client]
//! per profile:
//!   u32 labels, then (str name, str value) each
//!   i64 start, i64 end (unix nanoseconds)
//!   u32 sample types, then (str type, str unit) each
//!   u8 has period type [str type, str unit] · i64 period
//!   u8 payload kind (0 pprof, 1 gzip pprof, 2 OTLP request) · u64 decode limit
//!   bytes payload
//! ```
//!
//! A payload keeps one form on disk: its pprof bytes as they arrived when it
//! has them, else (a profile that arrived as OTLP) one
//! `ExportProfilesServiceRequest` holding it. Forms a processor added (an
//! OTLP form with links, say) are made again from that form after a restart.
//!
//! Reading checks every length against what is left before allocating: a
//! record passed its checksum, but its bytes are still treated as input.

use std::sync::Arc;

use bytes::Bytes;

use proflow_model::model::{BatchMeta, Envelope, Format, Labels, Payload, ValueType};
use proflow_model::otlp;

const VERSION: u8 = 1;
const KIND_PPROF: u8 = 0;
const KIND_PPROF_GZIP: u8 = 1;
const KIND_OTLP: u8 = 2;

/// The bytes of one record holding `envelopes` and `meta`, or why a profile
/// has no form that can be stored.
pub fn encode(envelopes: &[Envelope], meta: &BatchMeta) -> Result<Vec<u8>, String> {
    let mut w = Writer(Vec::with_capacity(
        64 + envelopes
            .iter()
            .map(|e| e.size_bytes() + 256)
            .sum::<usize>(),
    ));
    w.u8(VERSION);
    w.u32(len32(envelopes.len())?);
    w.str(&meta.receiver)?;
    w.opt_str(meta.tenant.as_deref())?;
    w.opt_str(meta.client.map(|c| c.to_string()).as_deref())?;
    for e in envelopes {
        w.u32(len32(e.labels.len())?);
        for l in &e.labels {
            w.str(&l.name)?;
            w.str(&l.value)?;
        }
        w.i64(e.start_unix_nanos);
        w.i64(e.end_unix_nanos);
        w.u32(len32(e.sample_types.len())?);
        for t in &e.sample_types {
            w.str(&t.r#type)?;
            w.str(&t.unit)?;
        }
        match &e.period_type {
            Some(t) => {
                w.u8(1);
                w.str(&t.r#type)?;
                w.str(&t.unit)?;
            }
            None => w.u8(0),
        }
        w.i64(e.period);
        let (kind, bytes) = if e.payload.has(Format::Pprof) || !e.payload.has(Format::Otlp) {
            let encoded = e.payload.encoded().map_err(|err| {
                format!(
                    "profile {} has no pprof bytes: {err}",
                    e.labels.to_selector_string()
                )
            })?;
            let kind = if encoded.gzipped {
                KIND_PPROF_GZIP
            } else {
                KIND_PPROF
            };
            (kind, encoded.bytes)
        } else {
            let profiles = e.payload.otlp().map_err(|err| {
                format!(
                    "profile {} has no OTLP form: {err}",
                    e.labels.to_selector_string()
                )
            })?;
            let mut builder = otlp::RequestBuilder::new();
            builder.push(&e.labels, &profiles);
            let request = builder.build().map_err(|err| {
                format!(
                    "profile {} cannot be written as OTLP: {err}",
                    e.labels.to_selector_string()
                )
            })?;
            (KIND_OTLP, Bytes::from(request.encode()))
        };
        w.u8(kind);
        w.u64(e.payload.decode_limit() as u64);
        w.bytes(&bytes)?;
    }
    Ok(w.0)
}

/// How many profiles a record holds, from its first bytes (for the replay
/// scan, which reads no more).
pub fn profiles(record: &[u8]) -> Result<usize, String> {
    let mut r = Reader::new(record);
    let version = r.u8()?;
    if version != VERSION {
        return Err(format!(
            "record version {version}, this proflow reads {VERSION}"
        ));
    }
    Ok(r.u32()? as usize)
}

/// The profiles and meta a record holds. `record` is shared by the payloads
/// (their bytes are slices of it).
pub fn decode(record: &Bytes) -> Result<(Vec<Envelope>, Arc<BatchMeta>), String> {
    let mut r = Reader::new(record);
    let version = r.u8()?;
    if version != VERSION {
        return Err(format!(
            "record version {version}, this proflow reads {VERSION}"
        ));
    }
    // The smallest profile takes 46 bytes (every length and number, no bytes).
    let n = r.count(46)?;
    let receiver: Arc<str> = Arc::from(r.str()?);
    let tenant = r.opt_str()?.map(str::to_owned);
    let client = r
        .opt_str()?
        .map(|c| c.parse().map_err(|e| format!("client address {c:?}: {e}")))
        .transpose()?;
    let meta = Arc::new(BatchMeta {
        receiver,
        tenant,
        tenant_bound: false,
        client,
        // Not stored: the queue is after the processors, the only readers.
        this_host: false,
    });
    let mut envelopes = Vec::with_capacity(n);
    for _ in 0..n {
        let labels_n = r.count(8)?;
        let mut pairs = Vec::with_capacity(labels_n);
        for _ in 0..labels_n {
            pairs.push((r.str()?.to_owned(), r.str()?.to_owned()));
        }
        let labels = Labels::from_pairs(pairs);
        let start = r.i64()?;
        let end = r.i64()?;
        let types_n = r.count(8)?;
        let mut sample_types = Vec::with_capacity(types_n);
        for _ in 0..types_n {
            sample_types.push(ValueType::new(r.str()?, r.str()?));
        }
        let period_type = match r.u8()? {
            0 => None,
            _ => Some(ValueType::new(r.str()?, r.str()?)),
        };
        let period = r.i64()?;
        let kind = r.u8()?;
        let decode_limit = usize::try_from(r.u64()?).unwrap_or(usize::MAX);
        let (from, to) = r.bytes_range()?;
        let bytes = record.slice(from..to);
        let payload = match kind {
            KIND_PPROF | KIND_PPROF_GZIP => Payload::from_bytes(bytes, decode_limit),
            KIND_OTLP => {
                let split = otlp::split_raw(&bytes, &otlp::AttributeLabels::default())
                    .map_err(|e| format!("stored OTLP profile: {e}"))?;
                let mut envelopes = split.envelopes.into_iter();
                match (envelopes.next(), envelopes.next()) {
                    (Some(e), None) => e.payload,
                    _ => return Err("a stored OTLP request does not hold one profile".to_owned()),
                }
            }
            other => return Err(format!("unknown payload kind {other}")),
        };
        envelopes.push(Envelope {
            labels,
            start_unix_nanos: start,
            end_unix_nanos: end,
            sample_types,
            period_type,
            period,
            payload,
        });
    }
    if r.rest() != 0 {
        return Err(format!("{} bytes after the last profile", r.rest()));
    }
    Ok((envelopes, meta))
}

fn len32(n: usize) -> Result<u32, String> {
    u32::try_from(n).map_err(|_| format!("{n} is too large for a queue record"))
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) -> Result<(), String> {
        self.u32(len32(b.len())?);
        self.0.extend_from_slice(b);
        Ok(())
    }
    fn str(&mut self, s: &str) -> Result<(), String> {
        self.bytes(s.as_bytes())
    }
    fn opt_str(&mut self, s: Option<&str>) -> Result<(), String> {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s)
            }
            None => {
                self.u8(0);
                Ok(())
            }
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn rest(&self) -> usize {
        self.buf.len() - self.at
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.rest() {
            return Err(format!(
                "the record ends {} bytes early at byte {}",
                n - self.rest(),
                self.at
            ));
        }
        let s = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(self.array()?))
    }

    /// A count of items at least `min_bytes` long each: refused when the
    /// rest of the record cannot hold that many.
    fn count(&mut self, min_bytes: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_bytes) > self.rest() {
            return Err(format!(
                "the record claims {n} items in its last {} bytes",
                self.rest()
            ));
        }
        Ok(n)
    }

    fn bytes_range(&mut self) -> Result<(usize, usize), String> {
        let n = self.u32()? as usize;
        let from = self.at;
        self.take(n)?;
        Ok((from, from + n))
    }

    fn str(&mut self) -> Result<&'a str, String> {
        let (from, to) = self.bytes_range()?;
        std::str::from_utf8(&self.buf[from..to])
            .map_err(|e| format!("a string that is not UTF-8: {e}"))
    }

    fn opt_str(&mut self) -> Result<Option<&'a str>, String> {
        match self.u8()? {
            0 => Ok(None),
            _ => self.str().map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_model::pprof::ProfileBuilder;

    fn envelope(seq: i64) -> Envelope {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .sample_root_first(["main", "hot"], vec![seq]);
        Envelope {
            labels: Labels::from_pairs([("service_name", "a"), ("seq", &seq.to_string())]),
            start_unix_nanos: 1,
            end_unix_nanos: 2 + seq,
            sample_types: vec![ValueType::new("cpu", "nanoseconds")],
            period_type: Some(ValueType::new("cpu", "nanoseconds")),
            period: 10_000_000,
            payload: Payload::from_bytes(
                proflow_model::pprof::gzip(&proflow_model::pprof::encode(&b.build())),
                1 << 20,
            ),
        }
    }

    #[test]
    fn a_record_gives_back_what_was_written() {
        let meta = BatchMeta {
            receiver: Arc::from("pprof_push"),
            tenant: Some("team".to_owned()),
            tenant_bound: false,
            client: Some("127.0.0.1:9".parse().unwrap()),
            this_host: false,
        };
        let envelopes = vec![envelope(1), envelope(2)];
        let bytes = Bytes::from(encode(&envelopes, &meta).unwrap());
        assert_eq!(profiles(&bytes).unwrap(), 2);
        let (back, back_meta) = decode(&bytes).unwrap();
        assert_eq!(*back_meta, meta);
        assert_eq!(back.len(), 2);
        for (a, b) in envelopes.iter().zip(&back) {
            assert_eq!(a.labels, b.labels);
            assert_eq!(
                (a.start_unix_nanos, a.end_unix_nanos, a.period),
                (b.start_unix_nanos, b.end_unix_nanos, b.period)
            );
            assert_eq!(a.sample_types, b.sample_types);
            assert_eq!(a.period_type, b.period_type);
            assert_eq!(
                a.payload.encoded().unwrap().bytes,
                b.payload.encoded().unwrap().bytes
            );
            assert!(b.payload.encoded().unwrap().gzipped);
        }
    }

    #[test]
    fn an_otlp_profile_is_stored_as_otlp_and_read_back() {
        let pprof = envelope(7);
        let mut lost = otlp::Lost::default();
        let otlp_only = Payload::from_otlp(
            (*pprof
                .payload
                .with_form(Format::Otlp, &mut lost)
                .unwrap()
                .otlp()
                .unwrap())
            .clone(),
        );
        let e = Envelope {
            payload: otlp_only,
            ..pprof
        };
        let bytes = Bytes::from(encode(std::slice::from_ref(&e), &BatchMeta::default()).unwrap());
        let (back, _) = decode(&bytes).unwrap();
        assert!(back[0].payload.has(Format::Otlp) && !back[0].payload.has(Format::Pprof));
        assert_eq!(back[0].labels, e.labels);
        let p = back[0].payload.decoded().unwrap();
        assert_eq!(p.sample.iter().map(|s| s.value[0]).sum::<i64>(), 7);
    }

    #[test]
    fn damaged_records_are_refused_without_large_allocations() {
        let bytes = encode(&[envelope(1)], &BatchMeta::default()).unwrap();
        for cut in 0..bytes.len() {
            assert!(
                decode(&Bytes::copy_from_slice(&bytes[..cut])).is_err(),
                "cut at {cut}"
            );
        }
        // A count claiming 4 billion labels in a short record.
        let mut claim = bytes.clone();
        let labels_at = 1 + 4 + 4 + "".len() + 1 + 1; // version, profiles, receiver "", no tenant, no client
        claim[labels_at..labels_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = decode(&Bytes::from(claim)).unwrap_err();
        assert!(err.contains("claims"), "{err}");
        assert!(
            decode(&Bytes::from_static(&[9, 0, 0, 0, 0]))
                .unwrap_err()
                .contains("version")
        );
    }
}
