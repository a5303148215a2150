//! `multipart/form-data` bodies of `/ingest`, as pyroscope-go (and newer
//! @pyroscope/nodejs) send them: a `profile` part holding the pprof bytes and,
//! optionally, a `sample_type_config` part holding JSON; or as the Pyroscope
//! Java agent sends them: a `jfr` part and, optionally, a `labels` part.
//! Parsing uses `multer` over the body already read (and size-checked), with
//! a per-part limit too.

use std::convert::Infallible;

use bytes::Bytes;

use super::error::IngestError;

const PROFILE_PART: &str = "profile";
const SAMPLE_TYPE_CONFIG_PART: &str = "sample_type_config";
const JFR_PART: &str = "jfr";
const LABELS_PART: &str = "labels";
/// Old pyroscope-go clients sent the previous cumulative profile for the
/// server to subtract; Pyroscope refuses such requests and so do we.
const PREV_PROFILE_PART: &str = "prev_profile";

/// The parts of a multipart ingest body that matter.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct IngestForm {
    pub profile: Option<Bytes>,
    pub sample_type_config: Option<Bytes>,
    pub jfr: Option<Bytes>,
    pub labels: Option<Bytes>,
}

/// How large one part may be, and which setting says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartLimit {
    /// The body arrived uncompressed: no part can outgrow
    /// `max_request_body_size` (this many bytes).
    RequestBody(usize),
    /// The body was decompressed: a part may take no more than `remaining`,
    /// what is left of the request's `max_decompressed_size` (`setting`).
    Decompressed { remaining: usize, setting: usize },
}

impl PartLimit {
    fn bytes(self) -> usize {
        match self {
            PartLimit::RequestBody(limit) => limit,
            PartLimit::Decompressed { remaining, .. } => remaining,
        }
    }

    fn exceeded(self) -> IngestError {
        match self {
            PartLimit::RequestBody(limit) => IngestError::BodyTooLarge { limit },
            PartLimit::Decompressed { setting, .. } => IngestError::DecompressedTooLarge {
                what: "a multipart part, with the decompressed request body,".to_owned(),
                limit: setting,
            },
        }
    }
}

/// True when `content_type` is `multipart/form-data` (any parameters).
pub(crate) fn is_multipart(content_type: Option<&str>) -> bool {
    content_type.is_some_and(|ct| {
        ct.split(';')
            .next()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("multipart/form-data"))
    })
}

/// Reads the parts of `body`. Other parts are skipped; a repeated part keeps
/// the first, as Go's form reader does.
pub(crate) async fn read_form(
    content_type: &str,
    body: Bytes,
    part_limit: PartLimit,
) -> Result<IngestForm, IngestError> {
    let boundary = multer::parse_boundary(content_type).map_err(|e| {
        IngestError::bad_request(format!(
            "multipart request without a usable boundary ({e}); send Content-Type: multipart/form-data; boundary=..."
        ))
    })?;
    let whole = body.len() as u64;
    let constraints = multer::Constraints::new().size_limit(
        multer::SizeLimit::new()
            .whole_stream(whole)
            .per_field(part_limit.bytes() as u64),
    );
    let stream = futures_util::stream::once(async move { Ok::<Bytes, Infallible>(body) });
    let mut multipart = multer::Multipart::with_constraints(stream, boundary, constraints);
    let mut form = IngestForm::default();
    let bad = |e: multer::Error| match e {
        multer::Error::FieldSizeExceeded { .. } | multer::Error::StreamSizeExceeded { .. } => {
            part_limit.exceeded()
        }
        e => IngestError::bad_request(format!(
            "malformed multipart body ({e}); send multipart/form-data with a `profile` part"
        )),
    };
    while let Some(field) = multipart.next_field().await.map_err(bad)? {
        let slot = match field.name() {
            Some(PROFILE_PART) => &mut form.profile,
            Some(SAMPLE_TYPE_CONFIG_PART) => &mut form.sample_type_config,
            Some(JFR_PART) => &mut form.jfr,
            Some(LABELS_PART) => &mut form.labels,
            Some(PREV_PROFILE_PART) => {
                return Err(IngestError::bad_request(
                    "the request has a prev_profile part, which only old pyroscope-go versions send (cumulative profiles); update github.com/grafana/pyroscope-go to a current version",
                ));
            }
            _ => continue,
        };
        let data = field.bytes().await.map_err(bad)?;
        if slot.is_none() {
            *slot = Some(data);
        }
    }
    Ok(form)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A multipart body as Go's `mime/multipart` writes it.
    pub(crate) fn form_body(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in parts {
            out.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
            out.extend_from_slice(
                format!(
                    "Content-Disposition: form-data; name=\"{name}\"; filename=\"{name}.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                )
                .as_bytes(),
            );
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        out
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    const CT: &str = "multipart/form-data; boundary=XyZ";

    #[test]
    fn reads_profile_and_config() {
        let body = form_body(
            "XyZ",
            &[
                ("profile", b"\x1f\x8bpprof"),
                ("other", b"ignored"),
                ("sample_type_config", b"{}"),
            ],
        );
        let form = run(read_form(
            CT,
            Bytes::from(body),
            PartLimit::RequestBody(1 << 20),
        ))
        .unwrap();
        assert_eq!(form.profile.as_deref(), Some(&b"\x1f\x8bpprof"[..]));
        assert_eq!(form.sample_type_config.as_deref(), Some(&b"{}"[..]));
    }

    #[test]
    fn refusals() {
        assert!(is_multipart(Some("multipart/form-data; boundary=a")));
        assert!(is_multipart(Some("Multipart/Form-Data")));
        assert!(!is_multipart(Some("application/octet-stream")));
        assert!(!is_multipart(None));
        let err = run(read_form(
            "multipart/form-data",
            Bytes::new(),
            PartLimit::RequestBody(10),
        ))
        .unwrap_err();
        assert!(err.to_string().contains("boundary"), "{err}");
        let prev = form_body("XyZ", &[("profile", b"a"), ("prev_profile", b"b")]);
        let err = run(read_form(
            CT,
            Bytes::from(prev),
            PartLimit::RequestBody(1 << 20),
        ))
        .unwrap_err();
        assert!(err.to_string().contains("pyroscope-go"), "{err}");
        let big = form_body("XyZ", &[("profile", &[7u8; 100])]);
        let err = run(read_form(
            CT,
            Bytes::from(big.clone()),
            PartLimit::RequestBody(50),
        ))
        .unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            err.to_string().contains("max_request_body_size (50 bytes)"),
            "{err}"
        );
        let limit = PartLimit::Decompressed {
            remaining: 50,
            setting: 4096,
        };
        let err = run(read_form(CT, Bytes::from(big), limit)).unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            err.to_string()
                .contains("max_decompressed_size (4096 bytes)"),
            "{err}"
        );
        let err = run(read_form(
            CT,
            Bytes::from_static(b"--XyZ\r\ngarbage"),
            PartLimit::RequestBody(50),
        ))
        .unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = run(read_form(CT, Bytes::from(body), PartLimit::RequestBody(256)));
        }

        #[test]
        fn never_panics_on_near_valid_bodies(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..128),
            cut in 0usize..200,
        ) {
            let mut body = form_body("XyZ", &[("profile", &data)]);
            body.truncate(cut.min(body.len()));
            let _ = run(read_form(CT, Bytes::from(body), PartLimit::RequestBody(256)));
        }
    }
}
