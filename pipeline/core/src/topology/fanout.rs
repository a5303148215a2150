//! The consumer a receiver gets: its pipelines' processors in order, the
//! conversions the exporters want, then admission to every exporter queue
//! at once (all or nothing across `block` queues).

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;

use crate::component::{Admission, ConsumeError, Consumer, Processor};
use crate::queue::{ExporterQueue, Refusal, Reservation, StoreWait, WhenFull};
use crate::telemetry::{ProcessorTelemetry, Telemetry};
use proflow_model::delivery::{Ack, Outcome};
use proflow_model::model::{Batch, Envelope, Format, Payload, batch_bytes};
use proflow_model::otlp::Lost;
use proflow_model::spans::{Span, SpanConsumer};

use super::RETRY_AFTER;
use proflow_model::model::{ANONYMOUS_TENANT, BatchMeta, ConvertCache, TENANT_LABEL};

pub(super) struct PipelineRuntime {
    pub(super) processors: Vec<(Arc<dyn Processor>, ProcessorTelemetry)>,
    pub(super) exporters: Vec<Arc<ExporterQueue>>,
    /// The payload forms this pipeline's exporters want.
    pub(super) forms: Vec<Format>,
}

/// The consumer a receiver gets: runs each of its pipelines, then admits the
/// results to every exporter queue at once.
pub(super) struct Fanout {
    pub(super) pipelines: Vec<Arc<PipelineRuntime>>,
    pub(super) telemetry: Arc<Telemetry>,
    /// Whether what it takes counts toward each tenant's volume: true for
    /// a receiver's fan-out, false for what a holding processor releases
    /// (counted as it came in).
    pub(super) counts_tenants: bool,
}

/// What a batch's payloads may account for and still be converted on the
/// async worker: a typical request's few profiles take microseconds, which
/// a hand-off to the blocking pool would cost more than. A larger batch
/// (an OTLP request of many profiles, or a large dictionary) is converted
/// on the blocking pool, so no request stalls the other connections.
const CONVERT_INLINE_MAX: usize = 64 << 10;

/// Payloads converted in this consume call, by (payload identity, form).
type Converted = HashMap<(usize, Format), Payload>;

impl Fanout {
    /// [`Fanout::prepare`], on the blocking pool when the batch needs a
    /// conversion and is larger than [`CONVERT_INLINE_MAX`].
    pub(super) async fn prepare_batch(
        &self,
        forms: &[Format],
        mut envelopes: Vec<Envelope>,
        mut done: Converted,
    ) -> Result<(Vec<Envelope>, Converted), ConsumeError> {
        let needed = forms
            .iter()
            .any(|f| envelopes.iter().any(|e| !e.payload.has(*f)));
        if !needed {
            return Ok((envelopes, done));
        }
        if batch_bytes(&envelopes) <= CONVERT_INLINE_MAX {
            Fanout::prepare(&self.telemetry, forms, &mut envelopes, &mut done);
            return Ok((envelopes, done));
        }
        let telemetry = self.telemetry.clone();
        let forms = forms.to_vec();
        let work = tokio::task::spawn_blocking(move || {
            Fanout::prepare(&telemetry, &forms, &mut envelopes, &mut done);
            (envelopes, done)
        });
        match work.await {
            Ok(prepared) => Ok(prepared),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // A blocking task is cancelled only when the runtime stops.
            Err(_) => Err(ConsumeError::ShuttingDown),
        }
    }

    /// Gives every profile the forms the pipeline's exporters want, before
    /// any queue counts it: each payload is converted once per consume call
    /// (`done` holds what other pipelines already converted) and shared by
    /// every exporter; the payloads of one OTLP request decode their shared
    /// dictionary once in all ([`ConvertCache`]). A profile that cannot be
    /// converted keeps its form; the exporter that needs the other one
    /// reports it as failed.
    fn prepare(
        telemetry: &Telemetry,
        forms: &[Format],
        envelopes: &mut [Envelope],
        done: &mut Converted,
    ) {
        let mut cache = ConvertCache::default();
        for form in forms {
            for e in envelopes.iter_mut() {
                if e.payload.has(*form) {
                    continue;
                }
                let key = (e.payload.identity(), *form);
                if let Some(p) = done.get(&key) {
                    e.payload = p.clone();
                    continue;
                }
                let mut lost = Lost::default();
                match e.payload.with_form_cached(*form, &mut lost, &mut cache) {
                    Ok(p) => {
                        telemetry.converted(*form, &lost);
                        done.insert(key, p.clone());
                        e.payload = p;
                    }
                    Err(err) => {
                        telemetry.conversion_failed(*form);
                        tracing::debug!(error = %err, series = %e.labels.to_selector_string(), "profile not converted to {form}");
                    }
                }
            }
        }
    }
}

/// Adds the profiles of `b` to the volume of the tenant each is written
/// under (a profile two pipelines take counts in each).
fn count_tenants(tenants: &mut TenantVolumes, meta: &BatchMeta, b: &[Envelope]) {
    for e in b {
        let tenant = meta.tenant_written(&e.labels);
        let bytes = e.size_bytes() as u64;
        match tenants.iter_mut().find(|(t, _, _)| t.as_deref() == tenant) {
            Some((_, n, size)) => {
                *n += 1;
                *size += bytes;
            }
            None => tenants.push((tenant.map(str::to_owned), 1, bytes)),
        }
    }
}

/// The span consumer of a receiver in several `traces` pipelines (or one
/// with several span-taking processors): every one gets every span.
pub(super) struct SpanFanout(pub(super) Vec<Arc<dyn SpanConsumer>>);

impl SpanConsumer for SpanFanout {
    fn consume_spans(&self, spans: &[Span]) {
        for c in &self.0 {
            c.consume_spans(spans);
        }
    }
}

/// One exporter queue's part of a fan-out.
pub(super) struct Target {
    pub(super) queue: Arc<ExporterQueue>,
    pub(super) envelopes: Vec<Envelope>,
    pub(super) bytes: usize,
    /// The tenant the copy counts for in the queue (its first profile's).
    pub(super) tenant: Arc<str>,
}

impl Target {
    /// Why the batch is refused when this target's queue would not take
    /// its copy: the tenant over its share, or the queue full.
    fn refusal(&self, over_share: bool) -> ConsumeError {
        let exporter = self.queue.id().to_owned();
        if over_share {
            ConsumeError::OverShare {
                exporter,
                tenant: self.tenant.to_string(),
                retry_after: RETRY_AFTER,
            }
        } else {
            ConsumeError::Backpressure {
                exporter,
                retry_after: RETRY_AFTER,
            }
        }
    }
}

impl Fanout {
    /// Reserves room for every target's copy, holding the batch back while
    /// a queue is full (see [`Admission`]): each full queue is waited for up
    /// to its `wait_when_full` (at once when it is stalled), then its
    /// `when_full` applies. Returns one reservation per target, `None` for a
    /// `drop_newest` copy given up on (the caller drops it), or the refusal.
    /// Nothing stays reserved while waiting or when refused.
    pub(super) async fn reserve_all(
        targets: &[Target],
        admission: Admission,
    ) -> Result<Vec<Option<Reservation>>, ConsumeError> {
        // Made only once a queue is full: the usual call allocates none.
        let (mut given_up, mut waited) = (Vec::new(), Vec::new());
        // When each full queue was first waited for: its wait runs from then.
        let mut first_wait: Vec<Option<tokio::time::Instant>> = Vec::new();
        // Only senders that retry are held to their tenant's share.
        let share = admission == Admission::Refuse;
        loop {
            let mut reserved: Vec<Option<Reservation>> = Vec::with_capacity(targets.len());
            let mut full = None;
            let mut closed = false;
            let mut over_share = false;
            for (i, t) in targets.iter().enumerate() {
                if given_up.get(i) == Some(&true) {
                    reserved.push(None);
                    continue;
                }
                match t
                    .queue
                    .reserve(t.envelopes.len(), t.bytes, Some(t.tenant.clone()), share)
                {
                    Ok(r) => reserved.push(Some(r)),
                    Err(refusal) => {
                        closed |= refusal == Refusal::Closed;
                        if full.is_none() {
                            full = Some(i);
                            over_share = refusal == Refusal::OverShare;
                        }
                        reserved.push(None);
                    }
                }
            }
            let Some(i) = full else {
                for (t, w) in targets.iter().zip(&waited) {
                    if *w {
                        t.queue.telemetry().held("room");
                    }
                }
                return Ok(reserved);
            };
            // Hold nothing while waiting, nor when refusing.
            for (t, r) in targets.iter().zip(reserved) {
                if let Some(r) = r {
                    t.queue.release(r);
                }
            }
            if closed {
                return Err(ConsumeError::ShuttingDown);
            }
            if given_up.is_empty() {
                given_up = vec![false; targets.len()];
                waited = vec![false; targets.len()];
                first_wait = vec![None; targets.len()];
            }
            let t = &targets[i];
            let policy = t.queue.when_full();
            let unbounded = match admission {
                Admission::WaitAll => true,
                Admission::Wait => policy == WhenFull::Block,
                Admission::Refuse => false,
            };
            waited[i] = true;
            if unbounded {
                t.queue.wait_for_space(t.envelopes.len(), t.bytes).await;
                continue;
            }
            let room = if over_share {
                // Its share frees only as its own profiles are sent: refused
                // at once, while other tenants still get in.
                t.queue.telemetry().held("tenant_share");
                false
            } else if t.queue.is_stalled() {
                t.queue.telemetry().held("stalled");
                false
            } else {
                let started = *first_wait[i].get_or_insert_with(tokio::time::Instant::now);
                let deadline = started + t.queue.wait_when_full();
                let room = t
                    .queue
                    .wait_for_space_until(t.envelopes.len(), t.bytes, deadline)
                    .await;
                if !room {
                    t.queue.telemetry().held("timeout");
                }
                room
            };
            if room {
                continue;
            }
            if policy == WhenFull::Block {
                return Err(t.refusal(over_share));
            }
            given_up[i] = true;
            waited[i] = false;
            if admission == Admission::Refuse && given_up.iter().all(|g| *g) {
                // No exporter could take any copy: a 200 would be a lie.
                return Err(t.refusal(over_share));
            }
        }
    }
}

#[async_trait]
impl Consumer for Fanout {
    /// Processors may read the bytes; exporters that want OTLP make the
    /// pipeline convert pprof payloads (a pipeline of pprof exporters alone
    /// passes the bytes through unread).
    fn reads_profiles(&self) -> bool {
        self.pipelines
            .iter()
            .any(|p| !p.processors.is_empty() || p.forms.contains(&Format::Otlp))
    }

    /// Runs the batch through every pipeline, reserves room for every
    /// exporter queue's copy at once, then hands each queue its copy and
    /// waits until the persistent ones hold it.
    async fn consume(&self, batch: Batch, admission: Admission) -> Result<(), ConsumeError> {
        let Batch {
            envelopes,
            meta,
            ack,
        } = batch;
        let mut run = PipelineRun {
            targets: Vec::new(),
            tenants: Vec::new(),
            filtered: 0,
        };
        self.run_pipelines(envelopes, &meta, &mut run).await?;
        let PipelineRun {
            mut targets,
            tenants,
            filtered,
        } = run;
        for t in &mut targets {
            t.bytes = batch_bytes(&t.envelopes);
        }
        // `block` queues first: one that refuses is found before any wait
        // on a `drop_newest` one.
        targets.sort_by_key(|t| t.queue.when_full() == WhenFull::DropNewest);
        let reserved = match Fanout::reserve_all(&targets, admission).await {
            Ok(r) => r,
            Err(e) => {
                if let ConsumeError::OverShare { tenant, .. } = &e {
                    self.telemetry
                        .receiver(&meta.receiver)
                        .tenant_refused(Some(tenant), "tenant_share");
                }
                return Err(e);
            }
        };
        // Accepted: each tenant's profiles count toward its volume.
        for (tenant, profiles, bytes) in tenants {
            self.telemetry
                .tenant_accepted(tenant.as_deref(), profiles, bytes);
        }
        // Counted only now that the batch is accepted: a refused batch dropped nothing.
        let mut filtered_share = ack.share(filtered);
        filtered_share.report(Outcome::Filtered, filtered);
        let stores = push_all(targets, reserved, &ack, &meta);
        ack.retire();
        wait_stored(stores).await
    }
}

/// (tenant, profiles, bytes) of a batch, per tenant.
type TenantVolumes = Vec<(Option<String>, u64, u64)>;

/// What running one batch through the pipelines gathers for admission.
struct PipelineRun {
    /// Each exporter queue's copy.
    targets: Vec<Target>,
    /// The batch's volume per tenant.
    tenants: TenantVolumes,
    /// Profiles the processors filtered out.
    filtered: usize,
}

impl Fanout {
    /// Runs `envelopes` through each pipeline's processors and conversions,
    /// gathering each exporter queue's copy, the tenants' volume and the
    /// filtered count into `run`.
    async fn run_pipelines(
        &self,
        envelopes: Vec<Envelope>,
        meta: &Arc<BatchMeta>,
        run: &mut PipelineRun,
    ) -> Result<(), ConsumeError> {
        let last = self.pipelines.len().saturating_sub(1);
        let mut envelopes = Some(envelopes);
        let mut converted = HashMap::new();
        for (i, p) in self.pipelines.iter().enumerate() {
            // Clone for all pipelines but the last: envelopes share payloads, so
            // a clone copies only labels and a few integers.
            let b = if i == last {
                envelopes.take().unwrap_or_default()
            } else {
                envelopes.clone().unwrap_or_default()
            };
            let before = b.len();
            let (mut b, counted) = self.run_processors(p, b, meta, &mut run.tenants).await;
            run.filtered += before.saturating_sub(b.len());
            if b.is_empty() {
                continue;
            }
            if meta.tenant_bound {
                // A token's tenant is final: what the processors put in
                // the tenant label does not change it.
                for e in &mut b {
                    e.labels.remove(TENANT_LABEL);
                }
            }
            if !counted {
                count_tenants(&mut run.tenants, meta, &b);
            }
            (b, converted) = self.prepare_batch(&p.forms, b, converted).await?;
            // The plain bytes a receiver handed along served the processors
            // and the conversions: no queue keeps them.
            for e in &mut b {
                e.payload.drop_plain();
            }
            add_targets(&mut run.targets, p, b, meta);
        }
        Ok(())
    }

    /// Runs `b` through the processors of `p`, counting it toward the
    /// tenants' volume before a holding processor takes it; returns what is
    /// left and whether it has been counted (or need not be).
    async fn run_processors(
        &self,
        p: &PipelineRuntime,
        mut b: Vec<Envelope>,
        meta: &Arc<BatchMeta>,
        tenants: &mut TenantVolumes,
    ) -> (Vec<Envelope>, bool) {
        let mut counted = !self.counts_tenants;
        for (proc, telemetry) in &p.processors {
            if b.is_empty() {
                break;
            }
            telemetry.received(b.len() as u64);
            if !counted && proc.holds().is_some() {
                // What it holds is counted as it comes in.
                count_tenants(tenants, meta, &b);
                counted = true;
            }
            b = proc.process(b, meta).await;
        }
        (b, counted)
    }
}

/// Gives each exporter queue of `p` a copy of `b` (the last one takes `b`
/// itself), merged into the queue's target when an earlier pipeline feeds
/// it too.
fn add_targets(
    targets: &mut Vec<Target>,
    p: &PipelineRuntime,
    mut b: Vec<Envelope>,
    meta: &BatchMeta,
) {
    let tenant: Arc<str> = b
        .first()
        .and_then(|e| meta.tenant_written(&e.labels))
        .unwrap_or(ANONYMOUS_TENANT)
        .into();
    let n = p.exporters.len();
    for (j, q) in p.exporters.iter().enumerate() {
        let copy = if j + 1 == n {
            std::mem::take(&mut b)
        } else {
            b.clone()
        };
        // One reservation per queue: an exporter fed by two of these
        // pipelines gets both copies as one batch (two reservations
        // would count the first against the second and could refuse
        // an idle queue forever).
        match targets.iter_mut().find(|t| Arc::ptr_eq(&t.queue, q)) {
            Some(t) => t.envelopes.extend(copy),
            None => targets.push(Target {
                queue: q.clone(),
                envelopes: copy,
                bytes: 0,
                tenant: tenant.clone(),
            }),
        }
    }
}

/// Pushes each target's copy into its queue with its share of `ack` (or
/// drops a copy given up on); returns the waits of persistent queues'
/// stores, by exporter id.
fn push_all(
    targets: Vec<Target>,
    reserved: Vec<Option<Reservation>>,
    ack: &Ack,
    meta: &Arc<BatchMeta>,
) -> Vec<(String, StoreWait)> {
    let mut stores = Vec::new();
    for (t, r) in targets.into_iter().zip(reserved) {
        let share = ack.share(t.envelopes.len());
        match r {
            Some(r) => {
                if let Some(wait) = t.queue.push(r, t.envelopes, meta.clone(), share) {
                    stores.push((t.queue.id().to_owned(), wait));
                }
            }
            None => {
                t.queue.dropped_full(t.envelopes.len());
                share.resolve(Outcome::Dropped);
            }
        }
    }
    stores
}

/// Waits until every persistent queue holds its copy durably; the first
/// that failed to store it is the error.
async fn wait_stored(stores: Vec<(String, StoreWait)>) -> Result<(), ConsumeError> {
    // Accepted only once every persistent queue holds it durably.
    let results = futures_util::future::join_all(
        stores
            .into_iter()
            .map(|(id, w)| async move { w.wait().await.map_err(|e| (id, e)) }),
    )
    .await;
    if let Some((exporter, error)) = results.into_iter().find_map(Result::err) {
        return Err(ConsumeError::NotStored { exporter, error });
    }
    Ok(())
}
