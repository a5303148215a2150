//! What the Kubernetes API server sends (watch event lines and list pages
//! of pods, services, endpoints, endpoint slices, nodes): decoded as each
//! kind, the objects that decode go into caches, and every discovery role
//! and the `k8s_attributes` index are built from them. The first byte picks
//! the kind and whether the rest is one event line or a list page. Nothing
//! may panic; every target address is non-empty and every label name one
//! Prometheus takes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_kube::objects::{EndpointSlice, Endpoints, Node, Pod, Resource, Service};
use proflow_kube::{Event, Store, decode_event, decode_list};
use proflow_model::model::is_valid_label_name;
use proflow_processors::k8s_attributes::config::Extract;
use proflow_processors::k8s_attributes::index::{Caches as PodCaches, Extractor};
use proflow_receivers::scrape::discovery::kubernetes::roles::{self, Caches};

fn objects<K: Resource>(data: &[u8], list: bool) -> Vec<K> {
    if list {
        return decode_list::<K>(data)
            .map(|(items, _, _)| items)
            .unwrap_or_default();
    }
    data.split(|&b| b == b'\n')
        .filter_map(|line| match decode_event::<K>(line) {
            Ok(Event::Upsert(o) | Event::Deleted(o)) => Some(o),
            _ => None,
        })
        .collect()
}

fn store<K: Resource>(items: Vec<K>) -> Store<K> {
    let store = Store::new(1000);
    store.replace(items);
    store
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let list = flags & 1 == 1;
    let mut caches = Caches {
        attach_node: flags & 2 == 2,
        ..Caches::default()
    };
    match (flags >> 2) % 5 {
        0 => caches.pods = vec![store(objects::<Pod>(body, list))],
        1 => caches.services = vec![store(objects::<Service>(body, list))],
        2 => caches.endpoints = vec![store(objects::<Endpoints>(body, list))],
        3 => caches.slices = vec![store(objects::<EndpointSlice>(body, list))],
        _ => caches.nodes = Some(store(objects::<Node>(body, list))),
    }
    for groups in [
        roles::pod_groups(&caches),
        roles::endpoints_groups(&caches),
        roles::endpointslice_groups(&caches),
        roles::service_groups(&caches),
        roles::node_groups(&caches),
    ] {
        for g in groups {
            assert!(
                g.targets.iter().all(|t| !t.is_empty()),
                "an empty address: {g:?}"
            );
            assert!(
                g.labels.keys().all(|k| is_valid_label_name(k)),
                "a label name Prometheus refuses: {g:?}"
            );
        }
    }
    if let Some(pods) = caches.pods.first() {
        let extract: Extract = serde_saphyr::from_str(
            "metadata: [k8s.namespace.name, k8s.pod.name, k8s.container.name, container.id, container.image.name, container.image.tag, k8s.cronjob.name]\nlabels: [{key_regex: '(.*)'}]\nannotations: [{key_regex: 'a(.*)', tag_name: 'x.$1'}]\n",
        )
        .expect("extract");
        let index = Extractor::new(&extract)
            .expect("extractor")
            .index(&PodCaches {
                pods: pods.clone(),
                namespaces: None,
                nodes: None,
                replicasets: None,
                indexed: Default::default(),
            });
        for pod in index.by_name.values() {
            assert!(
                pod.labels.iter().all(|(k, _)| is_valid_label_name(k)),
                "a label name Prometheus refuses: {:?}",
                pod.labels
            );
        }
    }
});
