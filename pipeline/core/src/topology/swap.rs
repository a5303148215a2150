//! Hot-swap handles: what a receiver holds while a reload replaces the
//! pipelines behind it.

use std::sync::Arc;

use async_trait::async_trait;

use crate::component::{Admission, ConsumeError, Consumer};
use proflow_model::model::Batch;
use proflow_model::spans::{Span, SpanConsumer};

/// The consumer a receiver holds: the pipelines behind it are replaced by a
/// reload while the receiver keeps serving.
pub(super) struct SwapConsumer(pub(super) std::sync::RwLock<Arc<dyn Consumer>>);

impl SwapConsumer {
    pub(super) fn new(c: Arc<dyn Consumer>) -> Self {
        SwapConsumer(std::sync::RwLock::new(c))
    }

    pub(super) fn current(&self) -> Arc<dyn Consumer> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts `c` in place and returns what was there.
    pub(super) fn swap(&self, c: Arc<dyn Consumer>) -> Arc<dyn Consumer> {
        std::mem::replace(
            &mut *self
                .0
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            c,
        )
    }
}

#[async_trait]
impl Consumer for SwapConsumer {
    async fn consume(&self, batch: Batch, admission: Admission) -> Result<(), ConsumeError> {
        // The Arc held for the call is how a reload sees calls in flight.
        let current = self.current();
        current.consume(batch, admission).await
    }

    fn reads_profiles(&self) -> bool {
        self.current().reads_profiles()
    }
}

/// The span side of [`SwapConsumer`].
pub(super) struct SwapSpans(pub(super) std::sync::RwLock<Arc<dyn SpanConsumer>>);

impl SpanConsumer for SwapSpans {
    fn consume_spans(&self, spans: &[Span]) {
        let current = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        current.consume_spans(spans);
    }
}
