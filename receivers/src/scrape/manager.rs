//! A job's target manager: runs the job's discoverers, turns their groups
//! into targets ([`targets::build`]) after every update, and keeps one
//! scrape loop per target: new targets start, vanished ones stop, unchanged
//! ones keep running (and keep their delta state). It also holds the job's
//! view for `/targets`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::discovery::{Discoverer, TargetGroup, Update};
use super::scrape_loop::{self, JobShared};
use super::status::{TargetStatus, dropped_json};
use super::targets::{self, Dropped};

/// Most dropped targets kept for `/targets` per job (the count is exact).
const MAX_DROPPED_SHOWN: usize = 10_000;
/// Updates arriving this close together are applied as one.
const SETTLE: Duration = Duration::from_millis(100);

/// What `/targets` shows of one job.
#[derive(Default)]
pub struct JobView {
    active: Vec<Arc<TargetStatus>>,
    dropped: Vec<Dropped>,
}

/// A job's view, shared with the `/targets` page.
pub type SharedView = Arc<Mutex<JobView>>;

/// `(active, dropped)` JSON of the views.
pub fn views_json(
    views: &[(String, SharedView)],
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let mut active = Vec::new();
    let mut dropped = Vec::new();
    for (job, view) in views {
        let view = view.lock().unwrap_or_else(PoisonError::into_inner);
        active.extend(view.active.iter().map(|t| t.to_json()));
        dropped.extend(view.dropped.iter().map(|d| dropped_json(job, d)));
    }
    (active, dropped)
}

struct Running {
    status: Arc<TargetStatus>,
    cancel: CancellationToken,
}

/// Runs the job until `shutdown`: discoverers, then a loop per target.
pub async fn run_job(
    shared: Arc<JobShared>,
    discoverers: Vec<Box<dyn Discoverer>>,
    view: SharedView,
    shutdown: CancellationToken,
) {
    let (tx, mut rx) = mpsc::channel::<Update>(16);
    let mut tasks = JoinSet::new();
    let mut sets: Vec<Vec<TargetGroup>> = vec![Vec::new(); discoverers.len()];
    for (i, mut d) in discoverers.into_iter().enumerate() {
        d.grant_from(&shared.memory);
        tasks.spawn(d.run(i, tx.clone(), shutdown.child_token()));
    }
    drop(tx);
    let mut running: HashMap<u64, Running> = HashMap::new();
    let job = shared.job.clone();
    loop {
        let update = tokio::select! {
            _ = shutdown.cancelled() => break,
            u = rx.recv() => u,
        };
        let Some(update) = update else {
            // Every discoverer ended (all static): keep the loops running.
            shutdown.cancelled().await;
            break;
        };
        apply(&mut sets, update);
        // A burst of updates (every file of a directory) is applied once.
        let settle = tokio::time::sleep(SETTLE);
        tokio::pin!(settle);
        loop {
            tokio::select! {
                _ = &mut settle => break,
                u = rx.recv() => match u {
                    Some(u) => apply(&mut sets, u),
                    None => break,
                },
            }
        }
        let (active, dropped) = targets::build(&job, sets.iter().flatten());
        let mut next: HashMap<u64, Running> = HashMap::with_capacity(active.len());
        let mut started = 0usize;
        for target in active {
            let key = target.key;
            if let Some(r) = running.remove(&key) {
                next.insert(key, r);
                continue;
            }
            let status = Arc::new(
                TargetStatus::new(target, &job.name, job.interval, job.timeout)
                    .counted_in(shared.scrape.health_gauge(&job.name)),
            );
            let cancel = shutdown.child_token();
            tasks.spawn(scrape_loop::run(
                shared.clone(),
                status.clone(),
                cancel.clone(),
            ));
            next.insert(key, Running { status, cancel });
            started += 1;
        }
        let stopped = running.len();
        for (_, r) in running.drain() {
            r.cancel.cancel();
        }
        running = next;
        if started > 0 || stopped > 0 {
            tracing::info!(
                job = %job.name,
                targets = running.len(),
                started,
                stopped,
                dropped = dropped.len(),
                "scrape targets changed"
            );
        }
        shared
            .scrape
            .targets(&job.name, running.len(), dropped.len());
        let mut shown: Vec<Arc<TargetStatus>> =
            running.values().map(|r| r.status.clone()).collect();
        shown.sort_by_cached_key(|a| a.target.url.to_string());
        let mut view = view.lock().unwrap_or_else(PoisonError::into_inner);
        view.active = shown;
        view.dropped = dropped.into_iter().take(MAX_DROPPED_SHOWN).collect();
        // Finished loops (stopped targets) are reaped as they end.
        while tasks.try_join_next().is_some() {}
    }
    for (_, r) in running.drain() {
        r.cancel.cancel();
    }
    while tasks.join_next().await.is_some() {}
}

fn apply(sets: &mut [Vec<TargetGroup>], update: Update) {
    if let Some(slot) = sets.get_mut(update.provider) {
        *slot = update.groups;
    }
}
