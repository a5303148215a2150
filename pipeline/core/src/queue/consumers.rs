//! The consumers of an exporter queue: each gathers a send from the queue
//! (`batch`), loads what a persistent queue kept only on disk, exports it
//! with retry, and resolves every share of the acknowledgement with the
//! outcome.

use super::*;

impl ExporterQueue {
    /// Gathers the next send: waits for a first item, then takes following
    /// items while they fit `batch.max_profiles` / `batch.max_bytes`, waiting
    /// up to `batch.flush_timeout` for more. `None` once the queue is closed,
    /// drained and no reservation is outstanding.
    pub(super) async fn next_batch(&self) -> Option<Taken> {
        let items = self.gather().await?;
        Some(self.load(items).await)
    }

    /// Takes the items of the next send (see [`ExporterQueue::next_batch`]).
    pub(super) async fn gather(&self) -> Option<Vec<Item>> {
        let _gathering = self.gathering.lock().await;
        let batch = &self.settings.batch;
        let mut taken: Vec<Item> = Vec::new();
        let (mut profiles, mut bytes) = (0, 0);
        let mut deadline = None;
        loop {
            let notified = self.available.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                while let Some(front) = s.items.front() {
                    let full = profiles + front.profiles > batch.max_profiles
                        || bytes + front.bytes > batch.max_bytes.as_usize();
                    if full && !taken.is_empty() {
                        return Some(taken);
                    }
                    let Some(item) = s.items.pop_front() else {
                        break;
                    };
                    if item.record.is_some() && item.body.is_some() {
                        s.resident.0 -= item.profiles;
                        s.resident.1 -= item.bytes;
                    }
                    profiles += item.profiles;
                    bytes += item.bytes;
                    taken.push(item);
                }
                if !taken.is_empty() {
                    let full =
                        profiles >= batch.max_profiles || bytes >= batch.max_bytes.as_usize();
                    if full || s.closed || batch.flush_timeout.is_zero() {
                        return Some(taken);
                    }
                } else if s.closed && s.reservations == 0 {
                    // Let the next consumer see the end too.
                    drop(s);
                    self.available.notify_one();
                    return None;
                }
            }
            if taken.is_empty() {
                notified.await;
                continue;
            }
            let until = *deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + batch.flush_timeout.get());
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => return Some(taken),
            }
        }
    }

    /// The send of the gathered items: batches kept in memory as they are,
    /// the others read back from disk. A record that cannot be read is
    /// counted as failed and finished (it would fail again).
    pub(super) async fn load(&self, items: Vec<Item>) -> Taken {
        let mut taken = Taken::new();
        let unread: Vec<RecordId> = items
            .iter()
            .filter(|i| i.body.is_none())
            .filter_map(|i| i.record)
            .collect();
        let count = unread.len();
        let mut read = match (&self.store, unread.is_empty()) {
            (Some(store), false) => {
                let store = store.clone();
                tokio::task::spawn_blocking(move || {
                    unread
                        .into_iter()
                        .map(|id| {
                            let bytes = store.read(id)?;
                            storage::record::decode(&bytes::Bytes::from(bytes)).map_err(|e| {
                                storage::ReadError {
                                    transient: false,
                                    message: e,
                                }
                            })
                        })
                        .collect::<Vec<_>>()
                })
                .await
                // A panic while reading: nothing is known, so try again later.
                .unwrap_or_else(|e| {
                    vec![
                        Err(storage::ReadError {
                            transient: true,
                            message: format!("reading the queue failed: {e}"),
                        });
                        count
                    ]
                })
                .into_iter()
            }
            _ => Vec::new().into_iter(),
        };
        let mut again = Vec::new();
        for mut item in items {
            let body = match item.body.take() {
                Some(body) => Ok(body),
                None => read.next().unwrap_or_else(|| {
                    Err(storage::ReadError {
                        transient: true,
                        message: "the record was not read".to_owned(),
                    })
                }),
            };
            if let Err(e) = &body
                && e.transient
            {
                if again.is_empty() {
                    tracing::warn!(exporter = %self.id, error = %e, "cannot read the persistent queue now; trying again in a second");
                }
                again.push(item);
                continue;
            }
            taken.profiles += item.profiles;
            taken.bytes += item.bytes;
            taken
                .tenants
                .push((item.tenant.clone(), item.profiles, item.bytes));
            if item.record.is_some() {
                taken.stored += item.profiles;
            }
            match body {
                Ok((envelopes, meta)) => {
                    taken.parts.push(Part {
                        len: envelopes.len(),
                        ack: item.ack,
                        record: item.record,
                    });
                    taken.batch.push(envelopes, meta);
                }
                Err(e) => {
                    tracing::error!(exporter = %self.id, error = %e, profiles = item.profiles, "a record of the persistent queue no longer matches its checksum or cannot be decoded; its profiles are lost (counted as failed, reason queue_read)");
                    self.telemetry.failed("queue_read", item.profiles as u64);
                    if let (Some(store), Some(id)) = (&self.store, item.record) {
                        store.ack(id);
                    }
                    item.ack.resolve(Outcome::Failed);
                }
            }
        }
        if !again.is_empty() {
            // Back at the front, in order, still counted; after a pause.
            {
                let mut s = self.lock();
                for item in again.into_iter().rev() {
                    s.items.push_front(item);
                }
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            self.available.notify_one();
        }
        taken
    }

    /// Counts a finished send, resolves its acks, finishes its records and
    /// frees its capacity.
    pub(super) fn finish(&self, taken: Taken, sent: Sent) {
        let Taken {
            batch,
            parts,
            profiles: taken_profiles,
            bytes,
            stored,
            tenants,
        } = taken;
        let profiles = batch.len();
        let mut acks: Vec<(usize, Ack)> = Vec::with_capacity(parts.len());
        let mut records = Vec::new();
        for p in parts {
            acks.push((p.len, p.ack));
            records.extend(p.record);
        }
        if !matches!(sent, Sent::Abandoned)
            && let Some(store) = &self.store
        {
            for id in records {
                store.ack(id);
            }
        }
        match sent {
            // Not finished: it stays counted for the shutdown report, and
            // dropping `acks` reports it abandoned.
            Sent::Abandoned => return,
            Sent::All => {
                if profiles > 0 {
                    self.telemetry.sent(profiles as u64, bytes as u64);
                }
                for (_, ack) in acks {
                    ack.resolve(Outcome::Delivered);
                }
            }
            Sent::Failed(reason) => {
                self.telemetry.failed(&reason, profiles as u64);
                for (_, ack) in acks {
                    ack.resolve(Outcome::Failed);
                }
            }
            Sent::Partial(mut refused, reason) => {
                refused.sort_unstable();
                refused.dedup();
                refused.retain(|&i| i < profiles);
                let delivered_bytes: usize = batch
                    .envelopes()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| refused.binary_search(i).is_err())
                    .map(|(_, e)| e.size_bytes())
                    .sum();
                self.telemetry.failed(&reason, refused.len() as u64);
                self.telemetry
                    .sent((profiles - refused.len()) as u64, delivered_bytes as u64);
                let mut start = 0;
                for (len, ack) in &mut acks {
                    let end = start + *len;
                    let failed = refused.iter().filter(|&&i| i >= start && i < end).count();
                    ack.report(Outcome::Failed, failed);
                    ack.report(Outcome::Delivered, *len - failed);
                    start = end;
                }
            }
        }
        {
            let mut s = self.lock();
            s.profiles -= taken_profiles;
            s.bytes -= bytes;
            s.stored -= stored;
            for (tenant, profiles, bytes) in &tenants {
                s.tenants.sub(tenant.as_ref(), *profiles, *bytes);
            }
            self.telemetry.queue_level(s.profiles, s.bytes);
        }
        self.space.notify_waiters();
    }

    /// Starts `num_consumers` tasks that export until the queue is closed and
    /// drained, or `abort` is cancelled (then retries stop, an attempt in
    /// progress gets [`ABORT_GRACE`], and what was not sent is reported
    /// abandoned).
    pub fn spawn_consumers(
        self: &Arc<Self>,
        exporter: Arc<dyn Exporter>,
        abort: CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..self.settings.num_consumers.max(1))
            .map(|_| {
                let q = self.clone();
                let exporter = exporter.clone();
                let abort = abort.clone();
                tokio::spawn(async move {
                    loop {
                        let taken = tokio::select! {
                            taken = q.next_batch() => taken,
                            _ = abort.cancelled() => None,
                        };
                        let Some(taken) = taken else { break };
                        if taken.batch.is_empty() {
                            // Every record of it failed to read (counted).
                            q.finish(taken, Sent::All);
                            continue;
                        }
                        // A panicking exporter must not kill the consumer without
                        // finishing the batch: its queue would stay full forever.
                        let send = std::panic::AssertUnwindSafe(q.send_with_retry(
                            exporter.as_ref(),
                            &taken.batch,
                            &abort,
                        ))
                        .catch_unwind();
                        let sent = send.await.unwrap_or_else(|_| {
                            tracing::error!(exporter = %q.id, profiles = taken.batch.len(), "the exporter panicked; dropping the batch");
                            Sent::Failed("panic".to_owned())
                        });
                        if matches!(sent, Sent::Abandoned) {
                            // Leave the counters as they are: the shutdown report
                            // counts this batch as not delivered, and dropping
                            // `taken` reports its acks abandoned.
                            break;
                        }
                        q.finish(taken, sent);
                    }
                })
            })
            .collect()
    }
}
