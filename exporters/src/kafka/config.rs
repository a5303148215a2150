//! The `kafka` exporter's config: brokers and security (shared with the
//! receiver), topic, encoding, compression and limits; their checks, and the
//! build.

use proflow_config::SendingSettings;
use proflow_config::{ClientTlsSettings, Duration};
use proflow_core::component::no_problems;
use proflow_core::component::{
    BuildContext, BuildError, Exporter, ExporterConfig, FieldError, Validate,
};
use proflow_kafka::{self as kafka, ClientSettings, Encoding, SaslSettings, TopicTemplate};
use proflow_model::model::Format;
use rdkafka::ClientConfig;
use rdkafka::producer::FutureProducer;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use super::KafkaExporter;

/// `compression` of record batches (librdkafka's `compression.type`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// No compression (default, as the Collector's `kafka` exporter): gzip
    /// pprof values gain nothing from another pass.
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

/// Config of the `kafka` exporter. Names follow the OpenTelemetry
/// Collector's `kafka` exporter (`brokers`, `client_id`, `topic`,
/// `encoding`, `timeout`, `tls`), with librdkafka's own properties passed
/// through `producer`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaExporterConfig {
    /// Bootstrap brokers, `host:port`. Default `["localhost:9092"]`.
    #[serde(default = "kafka::default_brokers")]
    pub brokers: Vec<String>,
    /// `client.id` the brokers see. Default `proflow`.
    #[serde(default = "kafka::default_client_id")]
    pub client_id: String,
    /// The topic; may hold `{label}` placeholders, such as
    /// `profiles.{service_name}` (a missing label becomes `unknown`,
    /// characters a topic cannot hold become `_`). Default `otlp_profiles`
    /// (the Collector's).
    #[serde(default = "default_topic")]
    pub topic: String,
    /// `pprof`, `otlp_proto` (default, as the Collector) or `otlp_json`.
    #[serde(default = "default_encoding")]
    pub encoding: Encoding,
    /// `none` (default), `gzip`, `snappy`, `lz4` or `zstd`.
    #[serde(default)]
    pub compression: Compression,
    /// Largest record (value, key and headers) sent; larger ones are refused,
    /// counted and logged. Default 1000000 (librdkafka's and the broker's
    /// default).
    #[serde(default = "default_max_message_bytes")]
    pub max_message_bytes: usize,
    /// Longest wait for one record's delivery report (librdkafka's
    /// `message.timeout.ms`); then the queue's retry takes over. Default 30s.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// Further librdkafka producer properties, passed through as they are
    /// (`linger.ms`, `batch.size`, …). proflow sets `enable.idempotence=true`
    /// and `acks=all` unless this map says otherwise.
    #[serde(default)]
    pub producer: BTreeMap<String, String>,
    /// SASL authentication (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    #[serde(default)]
    pub sasl: Option<SaslSettings>,
    /// TLS; present (even `tls: {}`) means TLS is on.
    #[serde(default)]
    pub tls: Option<ClientTlsSettings>,
    /// `sending_queue` and `retry_on_failure`, written beside this
    /// exporter's own keys (see [`SendingSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub sending: SendingSettings,
}

fn default_topic() -> String {
    "otlp_profiles".to_owned()
}
fn default_encoding() -> Encoding {
    Encoding::OtlpProto
}
fn default_max_message_bytes() -> usize {
    1_000_000
}
fn default_timeout() -> Duration {
    Duration::from_secs(30)
}

/// Properties the exporter sets and `producer` may not.
const OWN_PRODUCER_PROPERTIES: &[&str] = &["message.max.bytes", "message.timeout.ms"];

impl KafkaExporterConfig {
    fn client(&self) -> ClientSettings {
        ClientSettings {
            brokers: self.brokers.clone(),
            client_id: self.client_id.clone(),
            sasl: self.sasl.clone(),
            tls: self.tls.clone(),
        }
    }

    /// Every librdkafka property of the producer.
    pub(super) fn properties(&self) -> Result<BTreeMap<String, String>, String> {
        let mut p = self.client().properties()?;
        p.insert("enable.idempotence".into(), "true".into());
        p.insert("acks".into(), "all".into());
        p.insert("compression.type".into(), self.compression.as_str().into());
        // Leave room for the record overhead: librdkafka checks the whole
        // message set, proflow's check below the record.
        p.insert(
            "message.max.bytes".into(),
            self.max_message_bytes.saturating_add(4096).to_string(),
        );
        p.insert(
            "message.timeout.ms".into(),
            self.timeout.get().as_millis().max(1).to_string(),
        );
        // Everything else is passed through, winning over the defaults above.
        for (k, v) in &self.producer {
            p.insert(k.clone(), v.clone());
        }
        Ok(p)
    }
}

impl Validate for KafkaExporterConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = self.client().problems();
        if let Err(e) = TopicTemplate::parse(&self.topic) {
            problems.push(FieldError::new("topic", e));
        }
        if self.max_message_bytes < 1024 {
            problems.push(FieldError::new(
                "max_message_bytes",
                "must be at least 1024 (default 1000000)",
            ));
        }
        if self.timeout.is_zero() {
            problems.push(FieldError::new(
                "timeout",
                "must be more than 0: every record needs a delivery deadline (default 30s)",
            ));
        }
        problems.extend(kafka::passthrough_problems("producer", &self.producer));
        for name in self.producer.keys() {
            if OWN_PRODUCER_PROPERTIES.contains(&name.as_str()) {
                problems.push(FieldError::new(
                    format!("producer.{name}"),
                    "is set from `max_message_bytes`/`timeout`; use those",
                ));
            }
            if name == "compression.type" || name == "compression.codec" {
                problems.push(FieldError::new(
                    format!("producer.{name}"),
                    "is set from `compression`; use that",
                ));
            }
        }
        problems
    }
}

impl ExporterConfig for KafkaExporterConfig {
    fn sending(&self) -> &SendingSettings {
        &self.sending
    }

    fn wants(&self) -> Option<Format> {
        Some(match self.encoding {
            Encoding::Pprof => Format::Pprof,
            Encoding::OtlpProto | Encoding::OtlpJson => Format::Otlp,
        })
    }

    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError> {
        Ok(Arc::new(self.build_kafka(ctx)?))
    }
}

impl KafkaExporterConfig {
    /// The exporter as its concrete type.
    pub fn build_kafka(&self, ctx: &BuildContext) -> Result<KafkaExporter, BuildError> {
        let fail = |m: String| BuildError::new(format!("exporter `{}`: {m}", ctx.id));
        no_problems(self.validate()).map_err(|e| fail(e.0))?;
        let topic = TopicTemplate::parse(&self.topic).map_err(fail)?;
        let mut config = ClientConfig::new();
        for (k, v) in self.properties().map_err(fail)? {
            config.set(k, v);
        }
        let producer: FutureProducer = config
            .create()
            .map_err(|e| fail(format!("librdkafka refused the producer settings: {e}")))?;
        Ok(KafkaExporter {
            id: ctx.id.clone(),
            producer,
            topic,
            encoding: self.encoding,
            max_message_bytes: self.max_message_bytes,
            timeout: self.timeout.get(),
            retry: self.sending.retry_on_failure.clone(),
            logged: Mutex::new(HashSet::new()),
        })
    }
}
