use super::*;
use crate::objects::Pod;

fn pod(ns: &str, name: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.namespace = ns.to_owned();
    p.metadata.name = name.to_owned();
    p
}

#[test]
fn a_store_keeps_at_most_its_bound_and_counts_the_rest() {
    let store = Store::<Pod>::new(2);
    store.replace(vec![pod("a", "1"), pod("a", "2"), pod("a", "3")]);
    assert_eq!(store.len(), 2);
    assert_eq!(store.stats().refused.load(Ordering::Relaxed), 1);
    // An update of a kept object is applied; a new one is refused.
    let kept = store.list()[0].metadata.name.clone();
    let mut changed = pod("a", &kept);
    changed.status.pod_ip = "10.0.0.1".to_owned();
    store.apply(Change::Upsert(changed));
    assert_eq!(
        store.get("a", &kept).map(|p| p.status.pod_ip.clone()),
        Some("10.0.0.1".to_owned())
    );
    store.apply(Change::Upsert(pod("b", "9")));
    assert!(store.get("b", "9").is_none());
    store.apply(Change::Delete(pod("a", &kept)));
    assert_eq!(store.len(), 1);
    assert!(store.synced());
}

#[tokio::test]
async fn a_reader_subscribing_after_the_first_list_still_looks_once() {
    let store = Store::<Pod>::new(10);
    store.replace(vec![pod("a", "1")]);
    let notify = Arc::new(tokio::sync::Notify::new());
    let stop = CancellationToken::new();
    store.notify_on_change(&notify, &stop);
    tokio::time::timeout(Duration::from_secs(1), notify.notified())
        .await
        .expect("the reader is told to look at a store synced before it subscribed");
    // And each change after that.
    store.apply(Change::Upsert(pod("a", "2")));
    store.bump();
    tokio::time::timeout(Duration::from_secs(1), notify.notified())
        .await
        .expect("a change is told");
    stop.cancel();
}

#[test]
fn keys_leave_out_an_empty_namespace() {
    assert_eq!(key("", "node-1"), "node-1");
    assert_eq!(key("ns", "p"), "ns/p");
}
