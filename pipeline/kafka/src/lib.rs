//! What the `kafka` exporter and receiver share, without depending on a Kafka
//! client: the client settings both configure the same way
//! ([`ClientSettings`], turned into librdkafka properties), proflow's record
//! format ([`RecordHeaders`]: the encoding, labels, time range and tenant as
//! record headers), the record key ([`series_key`]) and the exporter's topic
//! templates ([`TopicTemplate`]).
//!
//! ## Record format
//! One profile per record. The value is the profile: gzip pprof
//! (`encoding: pprof`) or one `ExportProfilesServiceRequest` (`otlp_proto`,
//! `otlp_json`). The headers, all UTF-8:
//!
//! | header | value |
//! |---|---|
//! | `proflow.encoding` | `pprof`, `otlp_proto` or `otlp_json` |
//! | `proflow.start`, `proflow.end` | the profiled interval, unix nanoseconds, decimal |
//! | `proflow.tenant` | the tenant the profile arrived with, if any |
//! | `proflow.label.<name>` | one per series label, `__name__` included |
//!
//! A receiver reads the labels from the headers when there are any, so a
//! profile comes out of Kafka with exactly the labels it went in with. Records
//! from other producers (the OpenTelemetry Collector's `kafka` exporter sends
//! bare OTLP) have no such headers: their encoding is configured or sniffed
//! ([`sniff_encoding`]) and their labels come from the profile itself.
//!
//! The key is [`series_key`] of the labels: a stable hash, so one series
//! always lands on the same partition and stays in order.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use proflow_config::{ClientTlsSettings, FieldError};
use proflow_model::model::{Labels, is_valid_label_name};

/// Header naming the record's encoding.
pub const ENCODING_HEADER: &str = "proflow.encoding";
/// Header with the start of the profiled interval (unix nanoseconds).
pub const START_HEADER: &str = "proflow.start";
/// Header with the end of the profiled interval (unix nanoseconds).
pub const END_HEADER: &str = "proflow.end";
/// Header with the tenant.
pub const TENANT_HEADER: &str = "proflow.tenant";
/// Prefix of the label headers.
pub const LABEL_HEADER_PREFIX: &str = "proflow.label.";

/// How a record's value is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// A gzip pprof profile.
    Pprof,
    /// An OTLP `ExportProfilesServiceRequest`, protobuf.
    OtlpProto,
    /// An OTLP `ExportProfilesServiceRequest`, OTLP JSON.
    OtlpJson,
}

impl Encoding {
    /// The name used in config and in the `proflow.encoding` header.
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Pprof => "pprof",
            Encoding::OtlpProto => "otlp_proto",
            Encoding::OtlpJson => "otlp_json",
        }
    }

    /// The encoding a header value names.
    pub fn from_name(name: &str) -> Option<Encoding> {
        match name {
            "pprof" => Some(Encoding::Pprof),
            "otlp_proto" => Some(Encoding::OtlpProto),
            "otlp_json" => Some(Encoding::OtlpJson),
            _ => None,
        }
    }
}

/// The encoding a record without an encoding header most likely has: gzip
/// magic is pprof, a JSON object is OTLP JSON, anything else OTLP protobuf.
pub fn sniff_encoding(value: &[u8]) -> Encoding {
    if value.starts_with(&[0x1f, 0x8b]) {
        return Encoding::Pprof;
    }
    match value.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Encoding::OtlpJson,
        _ => Encoding::OtlpProto,
    }
}

/// proflow's headers of one record (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordHeaders {
    pub encoding: Option<Encoding>,
    pub start_unix_nanos: Option<i64>,
    pub end_unix_nanos: Option<i64>,
    pub tenant: Option<String>,
    /// The series labels; empty when the record carried none.
    pub labels: Labels,
}

impl RecordHeaders {
    /// The header pairs to write, in order.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let mut pairs = Vec::with_capacity(self.labels.len() + 4);
        if let Some(e) = self.encoding {
            pairs.push((ENCODING_HEADER.to_owned(), e.as_str().to_owned()));
        }
        if let Some(s) = self.start_unix_nanos {
            pairs.push((START_HEADER.to_owned(), s.to_string()));
        }
        if let Some(e) = self.end_unix_nanos {
            pairs.push((END_HEADER.to_owned(), e.to_string()));
        }
        if let Some(t) = &self.tenant {
            pairs.push((TENANT_HEADER.to_owned(), t.clone()));
        }
        for l in self.labels.iter() {
            pairs.push((format!("{LABEL_HEADER_PREFIX}{}", l.name), l.value.clone()));
        }
        pairs
    }

    /// Reads proflow's headers from a record's; other headers are ignored.
    /// A proflow header with a value that is not what it should be is an
    /// error naming it (the record is refused, not guessed at).
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
    ) -> Result<RecordHeaders, String> {
        let mut h = RecordHeaders::default();
        let mut labels = Vec::new();
        for (name, value) in pairs {
            if !name.starts_with("proflow.") {
                continue;
            }
            let text = || {
                std::str::from_utf8(value.unwrap_or_default())
                    .map_err(|_| format!("header `{name}` is not UTF-8"))
            };
            let nanos = || {
                text()?
                    .parse::<i64>()
                    .map_err(|_| format!("header `{name}` is not a decimal unix nanosecond time"))
            };
            match name {
                ENCODING_HEADER => {
                    let t = text()?;
                    h.encoding = Some(Encoding::from_name(t).ok_or_else(|| {
                        format!(
                            "header `{name}` names an unknown encoding `{t}` (pprof, otlp_proto or otlp_json)"
                        )
                    })?);
                }
                START_HEADER => h.start_unix_nanos = Some(nanos()?),
                END_HEADER => h.end_unix_nanos = Some(nanos()?),
                TENANT_HEADER => h.tenant = Some(text()?.to_owned()).filter(|t| !t.is_empty()),
                _ => {
                    if let Some(label) = name.strip_prefix(LABEL_HEADER_PREFIX) {
                        if !is_valid_label_name(label) {
                            return Err(format!(
                                "header `{name}` names an invalid label (`[a-zA-Z_][a-zA-Z0-9_]*`)"
                            ));
                        }
                        labels.push((label.to_owned(), text()?.to_owned()));
                    }
                }
            }
        }
        h.labels = Labels::from_pairs(labels);
        Ok(h)
    }
}

/// The record key of a series: FNV-1a (64 bits) over each label's name and
/// value, each followed by a zero byte, in label order (sorted by name), as 16
/// lowercase hex digits. It never changes between versions or processes, so
/// a series always lands on the same partition.
pub fn series_key(labels: &Labels) -> [u8; 16] {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(PRIME);
        }
        // A zero byte ends each field (its xor changes nothing).
        h = h.wrapping_mul(PRIME);
    };
    for l in labels.iter() {
        eat(l.name.as_bytes());
        eat(l.value.as_bytes());
    }
    let mut out = [0u8; 16];
    for (i, slot) in out.iter_mut().enumerate() {
        let nibble = (h >> (60 - 4 * i)) & 0xf;
        *slot = b"0123456789abcdef"[nibble as usize];
    }
    out
}

/// What a topic placeholder is replaced by when the profile lacks the label.
pub const MISSING_LABEL_TOPIC_PART: &str = "unknown";
/// Kafka's longest topic name.
const MAX_TOPIC_LEN: usize = 249;

fn is_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// A topic name that may hold `{label}` placeholders, such as
/// `profiles.{service_name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    parts: Vec<TopicPart>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum TopicPart {
    Literal(String),
    Label(String),
}

impl TopicTemplate {
    /// Parses a template; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<TopicTemplate, String> {
        if text.is_empty() {
            return Err("must not be empty".to_owned());
        }
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            match rest.find('{') {
                Some(0) => {
                    let end = rest.find('}').ok_or_else(|| {
                        format!("`{text}` opens a placeholder with `{{` and never closes it")
                    })?;
                    let name = &rest[1..end];
                    if !is_valid_label_name(name) {
                        return Err(format!(
                            "`{{{name}}}` in `{text}` is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"
                        ));
                    }
                    parts.push(TopicPart::Label(name.to_owned()));
                    rest = &rest[end + 1..];
                }
                found => {
                    let end = found.unwrap_or(rest.len());
                    let literal = &rest[..end];
                    if let Some(c) = literal.chars().find(|c| !is_topic_char(*c)) {
                        return Err(format!(
                            "`{text}` has `{c}`, which Kafka topic names cannot hold (letters, digits, `.`, `_`, `-`)"
                        ));
                    }
                    parts.push(TopicPart::Literal(literal.to_owned()));
                    rest = &rest[end..];
                }
            }
        }
        let fixed: usize = parts
            .iter()
            .map(|p| match p {
                TopicPart::Literal(l) => l.len(),
                TopicPart::Label(_) => 1,
            })
            .sum();
        if fixed > MAX_TOPIC_LEN {
            return Err(format!(
                "`{text}` is longer than Kafka's {MAX_TOPIC_LEN} characters"
            ));
        }
        if text == "." || text == ".." {
            return Err("`.` and `..` are not valid Kafka topic names".to_owned());
        }
        Ok(TopicTemplate { parts })
    }

    /// True when the template has no placeholder.
    pub fn is_fixed(&self) -> bool {
        self.parts
            .iter()
            .all(|p| matches!(p, TopicPart::Literal(_)))
    }

    /// The topic of a profile with `labels`: each placeholder is replaced by
    /// the label's value, characters a topic cannot hold turned into `_`, a
    /// missing or empty label by [`MISSING_LABEL_TOPIC_PART`]; the name is
    /// cut at Kafka's 249 characters.
    pub fn render(&self, labels: &Labels) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                TopicPart::Literal(l) => out.push_str(l),
                TopicPart::Label(name) => match labels.get(name).filter(|v| !v.is_empty()) {
                    Some(v) => {
                        out.extend(v.chars().map(|c| if is_topic_char(c) { c } else { '_' }))
                    }
                    None => out.push_str(MISSING_LABEL_TOPIC_PART),
                },
            }
        }
        if out.len() > MAX_TOPIC_LEN {
            out.truncate(MAX_TOPIC_LEN);
        }
        if out == "." || out == ".." {
            out = out.replace('.', "_");
        }
        out
    }
}

// ------------------------------------------------------------ client settings

/// `sasl.mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// `sasl`: authentication with a user name and password.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SaslSettings {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: SaslMechanism,
    pub username: String,
    /// The password; or `password_file`.
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password (read at start; a final line break is
    /// ignored).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// SASL without `tls` sends the user name (and with `PLAIN` the
    /// password) over the network in clear; it is refused unless this says
    /// the network is trusted. Default `false`.
    #[serde(default)]
    pub allow_plaintext: bool,
}

/// librdkafka properties proflow sets from its own fields; `producer` and
/// `consumer` pass-through maps may not set them.
pub const RESERVED_PROPERTIES: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "client.id",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "enable.ssl.certificate.verification",
];

/// The connection settings the `kafka` exporter and receiver share.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSettings {
    /// Bootstrap brokers, `host:port`.
    pub brokers: Vec<String>,
    /// `client.id` the brokers see. Default `proflow`.
    #[serde(default = "default_client_id")]
    pub client_id: String,
    /// SASL authentication (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    #[serde(default)]
    pub sasl: Option<SaslSettings>,
    /// TLS; present (even `tls: {}`) means TLS is on (OpenSSL inside
    /// librdkafka). Unset `ca_file`: the system's CA certificates, found
    /// where the usual distributions keep them.
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
}

/// The default `client_id`: `proflow`.
pub fn default_client_id() -> String {
    "proflow".to_owned()
}

/// The default `brokers` of the exporter and receiver (as the Collector's).
pub fn default_brokers() -> Vec<String> {
    vec!["localhost:9092".to_owned()]
}

impl ClientSettings {
    /// Every problem with these settings.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.brokers.is_empty() {
            problems.push(FieldError::new(
                "brokers",
                "needs at least one broker, such as [\"localhost:9092\"]",
            ));
        }
        for (i, b) in self.brokers.iter().enumerate() {
            let ok = b
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !ok || b.contains("://") || b.contains(',') {
                problems.push(FieldError::new(
                    format!("brokers.{i}"),
                    format!("`{b}` is not `host:port` (one broker per item, no scheme)"),
                ));
            }
        }
        if self.client_id.is_empty() {
            problems.push(FieldError::new("client_id", "must not be empty"));
        }
        if let Some(s) = &self.sasl {
            if s.username.is_empty() {
                problems.push(FieldError::new("sasl.username", "must not be empty"));
            }
            if s.password.is_some() == s.password_file.is_some() {
                problems.push(FieldError::new(
                    "sasl",
                    "needs exactly one of `password` and `password_file`",
                ));
            }
            if self.tls.is_none() && !s.allow_plaintext {
                problems.push(FieldError::new(
                    "sasl",
                    format!(
                        "without `tls` the brokers get the credentials in clear ({}): add `tls: {{}}` (and `ca_file` for a private CA), or set `sasl.allow_plaintext: true` for a network you trust",
                        if s.mechanism == SaslMechanism::Plain {
                            "PLAIN sends the password itself"
                        } else {
                            "SCRAM sends the user name, and its exchange can be recorded"
                        }
                    ),
                ));
            }
        }
        if let Some(t) = &self.tls {
            problems.extend(t.problems("tls"));
        }
        problems
    }

    /// The librdkafka properties of these settings; reads `password_file`.
    pub fn properties(&self) -> Result<BTreeMap<String, String>, String> {
        let mut p = BTreeMap::new();
        p.insert("bootstrap.servers".to_owned(), self.brokers.join(","));
        p.insert("client.id".to_owned(), self.client_id.clone());
        let protocol = match (&self.sasl, &self.tls) {
            (None, None) => "plaintext",
            (None, Some(_)) => "ssl",
            (Some(_), None) => "sasl_plaintext",
            (Some(_), Some(_)) => "sasl_ssl",
        };
        p.insert("security.protocol".to_owned(), protocol.to_owned());
        if let Some(s) = &self.sasl {
            let password = match (&s.password, &s.password_file) {
                (Some(pw), _) => pw.clone(),
                (None, Some(f)) => std::fs::read_to_string(f)
                    .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
                    .map_err(|e| format!("sasl.password_file `{}`: {e}", f.display()))?,
                (None, None) => String::new(),
            };
            p.insert("sasl.mechanism".to_owned(), s.mechanism.as_str().to_owned());
            p.insert("sasl.username".to_owned(), s.username.clone());
            p.insert("sasl.password".to_owned(), password);
        }
        if let Some(t) = &self.tls {
            let path = |f: &PathBuf| f.to_string_lossy().into_owned();
            // OpenSSL is built into the binary, so its compiled-in CA
            // directory may not exist here: `probe` looks where the usual
            // distributions keep their CA bundle.
            let ca = t.ca_file.as_ref().map_or_else(|| "probe".to_owned(), path);
            p.insert("ssl.ca.location".to_owned(), ca);
            if let (Some(c), Some(k)) = (&t.cert_file, &t.key_file) {
                p.insert("ssl.certificate.location".to_owned(), path(c));
                p.insert("ssl.key.location".to_owned(), path(k));
            }
            if t.insecure_skip_verify {
                tracing::warn!(
                    "tls.insecure_skip_verify is on: the brokers' certificates are not checked, so anyone on the path can read and change the records; use it for tests only, and set tls.ca_file instead"
                );
                p.insert(
                    "enable.ssl.certificate.verification".to_owned(),
                    "false".to_owned(),
                );
            }
        }
        Ok(p)
    }
}

/// Problems with a pass-through map of librdkafka properties (`producer`,
/// `consumer`): reserved names, and names that are not property-shaped.
pub fn passthrough_problems(field: &str, map: &BTreeMap<String, String>) -> Vec<FieldError> {
    let mut problems = Vec::new();
    for name in map.keys() {
        let path = format!("{field}.{name}");
        if RESERVED_PROPERTIES.contains(&name.as_str()) {
            problems.push(FieldError::new(
                path,
                "is set from proflow's own fields (brokers, client_id, sasl, tls); use those",
            ));
        } else if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_')
        {
            problems.push(FieldError::new(
                path,
                "is not a librdkafka property name (lowercase, dotted, such as linger.ms)",
            ));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip() {
        let h = RecordHeaders {
            encoding: Some(Encoding::OtlpJson),
            start_unix_nanos: Some(1_700_000_000_000_000_000),
            end_unix_nanos: Some(1_700_000_010_000_000_000),
            tenant: Some("team-a".into()),
            labels: Labels::from_pairs([("__name__", "process_cpu"), ("service_name", "checkout")]),
        };
        let pairs = h.to_pairs();
        assert!(pairs.contains(&("proflow.label.__name__".into(), "process_cpu".into())));
        let read = RecordHeaders::from_pairs(
            pairs
                .iter()
                .map(|(k, v)| (k.as_str(), Some(v.as_bytes())))
                .chain([("traceparent", Some(&b"x"[..]))]),
        )
        .unwrap();
        assert_eq!(read, h);
    }

    #[test]
    fn bad_proflow_headers_are_named() {
        for (k, v, says) in [
            ("proflow.encoding", "avro", "unknown encoding `avro`"),
            (
                "proflow.start",
                "yesterday",
                "`proflow.start` is not a decimal",
            ),
            ("proflow.label.1bad", "x", "invalid label"),
        ] {
            let e = RecordHeaders::from_pairs([(k, Some(v.as_bytes()))]).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let e = RecordHeaders::from_pairs([("proflow.tenant", Some(&[0xff][..]))]).unwrap_err();
        assert!(e.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn series_key_is_stable_and_label_order_free() {
        let a = Labels::from_pairs([("service_name", "checkout"), ("__name__", "process_cpu")]);
        let b = Labels::from_pairs([("__name__", "process_cpu"), ("service_name", "checkout")]);
        assert_eq!(series_key(&a), series_key(&b));
        // Pinned: a change here moves every series to another partition.
        assert_eq!(&series_key(&a), b"30068cda001aeaa1");
        let c = Labels::from_pairs([("service_name", "checkou"), ("__name__", "tprocess_cpu")]);
        assert_ne!(series_key(&a), series_key(&c), "boundaries are hashed");
        assert!(series_key(&Labels::new()).iter().all(u8::is_ascii_hexdigit));
    }

    #[test]
    fn topic_templates() {
        let t = TopicTemplate::parse("profiles.{service_name}").unwrap();
        assert!(!t.is_fixed());
        let labels = Labels::from_pairs([("service_name", "shop/check out")]);
        assert_eq!(t.render(&labels), "profiles.shop_check_out");
        assert_eq!(t.render(&Labels::new()), "profiles.unknown");
        assert!(TopicTemplate::parse("otlp_profiles").unwrap().is_fixed());
        let long = TopicTemplate::parse("{a}").unwrap();
        let labels = Labels::from_pairs([("a", "x".repeat(400))]);
        assert_eq!(long.render(&labels).len(), 249);
        for (bad, says) in [
            ("", "empty"),
            ("p.{service_name", "never closes"),
            ("p.{1x}", "not a label name"),
            ("p/q", "cannot hold"),
            ("..", "not valid"),
        ] {
            let e = TopicTemplate::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn sniffing() {
        assert_eq!(sniff_encoding(&[0x1f, 0x8b, 8]), Encoding::Pprof);
        assert_eq!(
            sniff_encoding(b" \n{\"resourceProfiles\":[]}"),
            Encoding::OtlpJson
        );
        assert_eq!(sniff_encoding(&[0x0a, 0x02]), Encoding::OtlpProto);
    }

    #[test]
    fn client_settings_properties_and_problems() {
        let s = ClientSettings {
            brokers: vec!["127.0.0.1:9092".into(), "b2:9093".into()],
            client_id: "proflow".into(),
            sasl: Some(SaslSettings {
                mechanism: SaslMechanism::ScramSha512,
                username: "u".into(),
                password: Some("p".into()),
                password_file: None,
                allow_plaintext: false,
            }),
            tls: Some(ClientTlsSettings::default()),
        };
        assert!(s.problems().is_empty());
        let p = s.properties().unwrap();
        assert_eq!(p["bootstrap.servers"], "127.0.0.1:9092,b2:9093");
        assert_eq!(p["security.protocol"], "sasl_ssl");
        assert_eq!(p["sasl.mechanism"], "SCRAM-SHA-512");
        assert_eq!(p["ssl.ca.location"], "probe");

        let bad = ClientSettings {
            brokers: vec!["kafka://x:1".into(), "nohost".into()],
            client_id: String::new(),
            sasl: Some(SaslSettings {
                mechanism: SaslMechanism::Plain,
                username: String::new(),
                password: None,
                password_file: None,
                allow_plaintext: false,
            }),
            tls: Some(ClientTlsSettings {
                cert_file: Some("c.pem".into()),
                ..Default::default()
            }),
        };
        let paths: Vec<_> = bad.problems().into_iter().map(|p| p.path).collect();
        assert_eq!(
            paths,
            [
                "brokers.0",
                "brokers.1",
                "client_id",
                "sasl.username",
                "sasl",
                "tls.key_file"
            ]
        );
        // SASL without TLS: refused unless allowed.
        let mut clear = s.clone();
        clear.tls = None;
        let paths: Vec<_> = clear.problems().into_iter().map(|p| p.path).collect();
        assert_eq!(paths, ["sasl"]);
        if let Some(sasl) = &mut clear.sasl {
            sasl.allow_plaintext = true;
        }
        assert!(clear.problems().is_empty());
        assert_eq!(
            clear.properties().unwrap()["security.protocol"],
            "sasl_plaintext"
        );
        let map = BTreeMap::from([
            ("linger.ms".to_owned(), "5".to_owned()),
            ("bootstrap.servers".to_owned(), "x".to_owned()),
            ("Linger Ms".to_owned(), "5".to_owned()),
        ]);
        let paths: Vec<_> = passthrough_problems("producer", &map)
            .into_iter()
            .map(|p| p.path)
            .collect();
        assert_eq!(paths, ["producer.Linger Ms", "producer.bootstrap.servers"]);
    }
}
