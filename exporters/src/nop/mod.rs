//! The `nop` exporter: accepts every profile and discards it, counting what it
//! saw. For benchmarks of the pipeline without a real target and for tests.
//! It never touches the payload, so it never decodes or compresses anything.

mod config;

pub use config::NopExporterConfig;

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use proflow_core::component::{ExportError, Exporter};
use proflow_model::model::{Envelope, ExportBatch};

/// What a [`NopExporter`] has seen so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NopSeen {
    /// Calls to `export`.
    pub batches: u64,
    pub profiles: u64,
    /// Payload bytes as the queue accounts them (`Envelope::size_bytes`).
    pub bytes: u64,
}

/// The running `nop` exporter.
#[derive(Debug, Default)]
pub struct NopExporter {
    batches: AtomicU64,
    profiles: AtomicU64,
    bytes: AtomicU64,
}

impl NopExporter {
    pub fn new() -> Self {
        NopExporter::default()
    }

    /// The counts so far. Each counter is exact; read while exports run, the
    /// three may be from slightly different moments.
    pub fn seen(&self) -> NopSeen {
        NopSeen {
            batches: self.batches.load(Ordering::Relaxed),
            profiles: self.profiles.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
        }
    }
}

#[async_trait]
impl Exporter for NopExporter {
    async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError> {
        let bytes: usize = batch.envelopes().iter().map(Envelope::size_bytes).sum();
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.profiles
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_config::{Node, RetrySettings};
    use proflow_core::component::BuildContext;
    use proflow_core::component::ExporterConfig;
    use proflow_core::queue::WhenFull;
    use proflow_core::registry::{AnyConfig, Factory};
    use proflow_core::telemetry::Telemetry;
    use proflow_model::model::{Labels, Payload, ValueType};
    use proflow_model::pprof::{self, ProfileBuilder};
    use std::sync::Arc;

    fn factory() -> Factory {
        crate::factories()
            .into_iter()
            .find(|f| f.type_name == "nop")
            .expect("nop factory is registered")
    }

    fn parse(yaml: &str) -> Result<Arc<dyn ExporterConfig>, Vec<proflow_config::Error>> {
        let node = Node::parse(yaml).expect("test YAML parses");
        match factory().parse(&node, "exporters.nop")? {
            AnyConfig::Exporter(c) => Ok(c),
            other => panic!("nop parsed as {other:?}"),
        }
    }

    fn envelope() -> Envelope {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds");
        b.sample_root_first(["main", "hot"], vec![7]);
        let gz = pprof::gzip(&pprof::encode(&b.build()));
        Envelope {
            labels: Labels::from_pairs([("service_name", "svc")]),
            start_unix_nanos: 1,
            end_unix_nanos: 2,
            sample_types: vec![ValueType::new("cpu", "nanoseconds")],
            period_type: None,
            period: 0,
            payload: Payload::from_bytes(gz, 1 << 20),
        }
    }

    #[tokio::test]
    async fn parses_queue_settings_and_discards() {
        let config = parse(
            "sending_queue:\n  queue_size: 10\n  when_full: drop_newest\n  num_consumers: 2\n",
        )
        .expect("valid config");
        assert_eq!(config.sending().sending_queue.queue_size, 10);
        assert_eq!(
            config.sending().sending_queue.when_full,
            WhenFull::DropNewest
        );
        assert_eq!(config.sending().retry_on_failure, RetrySettings::default());
        assert!(config.resources().is_empty());
        let ctx = BuildContext {
            id: "nop".into(),
            telemetry: Arc::new(Telemetry::new()),
            memory: proflow_model::memory::MemoryBudget::new(1 << 30),
        };
        let exporter = config.build(&ctx).expect("nop builds");
        let batch = ExportBatch::from(vec![envelope(), envelope()]);
        exporter.export(&batch).await.expect("nop never fails");
        assert!(!batch.envelopes()[0].payload.is_decoded());
    }

    #[tokio::test]
    async fn counts_what_it_saw() {
        let nop = NopExporterConfig::default().build_nop();
        let batch = vec![envelope(), envelope(), envelope()];
        let size = batch[0].size_bytes() as u64;
        nop.export(&ExportBatch::from(batch.clone()))
            .await
            .expect("nop never fails");
        nop.export(&ExportBatch::from(batch[..1].to_vec()))
            .await
            .expect("nop never fails");
        assert_eq!(
            nop.seen(),
            NopSeen {
                batches: 2,
                profiles: 4,
                bytes: 4 * size
            }
        );
    }

    #[test]
    fn rejects_unknown_fields_and_reports_every_problem() {
        let e = parse("endpoint: x\n").expect_err("unknown field");
        assert!(e[0].message.contains("endpoint"), "{e:?}");
        let e = parse(
            "sending_queue:\n  num_consumers: 0\n  queue_size: 0\nretry_on_failure:\n  multiplier: 0.5\n",
        )
        .expect_err("invalid values");
        let paths: Vec<&str> = e.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "exporters.nop.sending_queue.queue_size",
                "exporters.nop.sending_queue.num_consumers",
                "exporters.nop.retry_on_failure.multiplier",
            ]
        );
        assert!(e.iter().all(|e| e.line > 0), "{e:?}");
    }
}
