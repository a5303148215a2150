//! The `kafka` receiver's config: brokers and security (shared with the
//! exporter), topics, group, encoding and limits; their checks, and the build.

use proflow_config::{ByteSize, ClientTlsSettings, Duration};
use proflow_core::component::no_problems;
use proflow_core::component::{
    Admission, BuildContext, BuildError, FieldError, Receiver, ReceiverConfig, Validate,
};
use proflow_kafka::{self as kafka, ClientSettings, Encoding, SaslSettings};
use proflow_model::otlp::AttributeLabels;
use serde::Deserialize;
use std::collections::BTreeMap;

use super::KafkaReceiver;
use super::record::Reading;

/// `initial_offset`: where a group with no committed offset starts.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum InitialOffset {
    /// Only records produced from now on (default, as the Collector).
    #[default]
    Latest,
    /// Everything the topic still holds.
    Earliest,
}

/// `encoding` of records without proflow's `proflow.encoding` header.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReceiverEncoding {
    /// The header, else a sniff of the value (default).
    #[default]
    Auto,
    Pprof,
    OtlpProto,
    OtlpJson,
}

impl ReceiverEncoding {
    fn fixed(self) -> Option<Encoding> {
        match self {
            ReceiverEncoding::Auto => None,
            ReceiverEncoding::Pprof => Some(Encoding::Pprof),
            ReceiverEncoding::OtlpProto => Some(Encoding::OtlpProto),
            ReceiverEncoding::OtlpJson => Some(Encoding::OtlpJson),
        }
    }
}

/// Config of the `kafka` receiver. Names follow the OpenTelemetry
/// Collector's `kafka` receiver (`brokers`, `client_id`, `group_id`,
/// `initial_offset`, `encoding`, `tls`), with `topics` a list and
/// librdkafka's own properties passed through `consumer`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaReceiverConfig {
    /// Bootstrap brokers, `host:port`. Default `["localhost:9092"]`.
    #[serde(default = "kafka::default_brokers")]
    pub brokers: Vec<String>,
    /// `client.id` the brokers see. Default `proflow`.
    #[serde(default = "kafka::default_client_id")]
    pub client_id: String,
    /// Topics to read; a name starting with `^` is a regular expression.
    /// Default `["otlp_profiles"]` (the Collector's and proflow's exporter's).
    #[serde(default = "default_topics")]
    pub topics: Vec<String>,
    /// The consumer group. Default `proflow`.
    #[serde(default = "default_group_id")]
    pub group_id: String,
    /// `latest` (default) or `earliest`: where a group without a committed
    /// offset starts.
    #[serde(default)]
    pub initial_offset: InitialOffset,
    /// `auto` (default), `pprof`, `otlp_proto` or `otlp_json`; `auto` reads
    /// proflow's header, else sniffs the value.
    #[serde(default)]
    pub encoding: ReceiverEncoding,
    /// Most records in the pipeline and not yet acknowledged. Default 1000.
    #[serde(default = "default_max_unacknowledged")]
    pub max_unacknowledged: usize,
    /// How often acknowledged positions are committed. Default 1s.
    #[serde(default = "default_commit_interval")]
    pub commit_interval: Duration,
    /// Whether a record may be committed when a full `drop_newest` exporter
    /// queue dropped its copy (after the queue's `wait_when_full`), counted
    /// as dropped, so that one stalled exporter never stops the consumer.
    /// Default false: the consumer waits until every exporter it feeds has
    /// room, so nothing read from Kafka is dropped.
    #[serde(default)]
    pub commit_dropped: bool,
    /// Most bytes a gzip pprof value may inflate to (and an OTLP JSON value
    /// take once decoded). Default 64MiB.
    #[serde(default = "default_max_decompressed_size")]
    pub max_decompressed_size: ByteSize,
    /// Which resource and scope attributes of OTLP records without proflow's
    /// label headers become labels (as the `otlp` receiver's).
    #[serde(default)]
    pub resource_to_labels: AttributeLabels,
    /// Further librdkafka consumer properties, passed through as they are
    /// (`session.timeout.ms`, `fetch.max.bytes`, …).
    #[serde(default)]
    pub consumer: BTreeMap<String, String>,
    /// SASL authentication (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    #[serde(default)]
    pub sasl: Option<SaslSettings>,
    /// TLS; present (even `tls: {}`) means TLS is on.
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
}

fn default_topics() -> Vec<String> {
    vec!["otlp_profiles".to_owned()]
}
fn default_group_id() -> String {
    "proflow".to_owned()
}
fn default_max_unacknowledged() -> usize {
    1000
}
fn default_commit_interval() -> Duration {
    Duration::from_secs(1)
}
fn default_max_decompressed_size() -> ByteSize {
    ByteSize::mib(64)
}

/// Consumer properties the receiver's delivery guarantee rests on.
const OWN_CONSUMER_PROPERTIES: &[&str] = &[
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "auto.offset.reset",
    "enable.partition.eof",
];

impl KafkaReceiverConfig {
    fn client(&self) -> ClientSettings {
        ClientSettings {
            brokers: self.brokers.clone(),
            client_id: self.client_id.clone(),
            sasl: self.sasl.clone(),
            tls: self.tls.clone(),
        }
    }

    /// Every librdkafka property of the consumer.
    pub(super) fn properties(&self) -> Result<BTreeMap<String, String>, String> {
        let mut p = self.client().properties()?;
        for (k, v) in &self.consumer {
            p.insert(k.clone(), v.clone());
        }
        let offset_reset = match self.initial_offset {
            InitialOffset::Latest => "latest",
            InitialOffset::Earliest => "earliest",
        };
        for (k, v) in [
            ("group.id", self.group_id.clone()),
            ("enable.auto.commit", "true".to_owned()),
            ("enable.auto.offset.store", "false".to_owned()),
            (
                "auto.commit.interval.ms",
                self.commit_interval.get().as_millis().max(1).to_string(),
            ),
            ("auto.offset.reset", offset_reset.to_owned()),
            ("enable.partition.eof", "false".to_owned()),
        ] {
            p.insert(k.to_owned(), v);
        }
        Ok(p)
    }
}

impl Validate for KafkaReceiverConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = self.client().problems();
        if self.topics.is_empty() {
            problems.push(FieldError::new(
                "topics",
                "needs at least one topic, such as [\"otlp_profiles\"]",
            ));
        }
        for (i, t) in self.topics.iter().enumerate() {
            let ok = !t.is_empty()
                && (t.starts_with('^')
                    || t.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
            if !ok {
                problems.push(FieldError::new(
                    format!("topics.{i}"),
                    format!(
                        "`{t}` is not a topic name (letters, digits, `.`, `_`, `-`) or a `^regex`"
                    ),
                ));
            }
        }
        if self.group_id.is_empty() {
            problems.push(FieldError::new("group_id", "must not be empty"));
        }
        if self.max_unacknowledged == 0 {
            problems.push(FieldError::new(
                "max_unacknowledged",
                "must be at least 1 (default 1000)",
            ));
        }
        if self.commit_interval.is_zero() {
            problems.push(FieldError::new(
                "commit_interval",
                "must be more than 0 (default 1s)",
            ));
        }
        if self.max_decompressed_size.bytes() == 0 {
            problems.push(FieldError::new(
                "max_decompressed_size",
                "must be more than 0 (default 64MiB)",
            ));
        }
        problems.extend(kafka::passthrough_problems("consumer", &self.consumer));
        for name in self.consumer.keys() {
            if OWN_CONSUMER_PROPERTIES.contains(&name.as_str()) {
                problems.push(FieldError::new(
                    format!("consumer.{name}"),
                    "is set by the receiver (group_id, initial_offset, commit_interval; offsets are stored only once delivered); use those fields",
                ));
            }
        }
        problems
    }
}

impl ReceiverConfig for KafkaReceiverConfig {
    fn max_request_memory(&self) -> usize {
        self.max_decompressed_size.as_usize()
    }

    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Receiver>, BuildError> {
        let fail = |m: String| BuildError::new(format!("receiver `{}`: {m}", ctx.id));
        no_problems(self.validate()).map_err(|e| fail(e.0))?;
        Ok(Box::new(KafkaReceiver {
            properties: self.properties().map_err(fail)?,
            topics: self.topics.clone(),
            reading: Reading {
                encoding: self.encoding.fixed(),
                max_decompressed: self.max_decompressed_size.as_usize(),
                mapping: self.resource_to_labels.clone(),
            },
            max_unacknowledged: self.max_unacknowledged,
            admission: if self.commit_dropped {
                Admission::Wait
            } else {
                Admission::WaitAll
            },
        }))
    }
}
