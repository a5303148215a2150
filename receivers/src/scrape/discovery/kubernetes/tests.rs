use proflow_kube::Store;
use proflow_kube::objects::{EndpointSlice, Node, Pod, Service};

use super::roles::{self, Caches};

fn store<K: proflow_kube::Resource>(json: &[&str]) -> Store<K> {
    Store::from_json(json).expect("objects parse")
}

#[test]
fn names_are_sanitized_character_by_character() {
    assert_eq!(
        roles::sanitize("app.kubernetes.io/name"),
        "app_kubernetes_io_name"
    );
    assert_eq!(roles::sanitize("a..b-ñ"), "a__b__");
}

#[test]
fn a_pod_without_an_ip_has_no_targets_and_ipv6_addresses_are_bracketed() {
    let caches = Caches {
        pods: vec![store::<Pod>(&[
            r#"{"metadata":{"name":"pending","namespace":"n"},"spec":{"containers":[{"name":"c","ports":[{"containerPort":1}]}]}}"#,
            r#"{"metadata":{"name":"v6","namespace":"n"},"spec":{"containers":[{"name":"c","ports":[{"containerPort":6060,"protocol":"TCP"}]}],
               "initContainers":[{"name":"init"}]},"status":{"podIP":"fd00::5"}}"#,
        ])],
        ..Caches::default()
    };
    let groups = roles::pod_groups(&caches);
    let addresses: Vec<&str> = groups.iter().map(|g| g.targets[0].as_str()).collect();
    assert_eq!(addresses, ["[fd00::5]:6060", "fd00::5"]);
    assert_eq!(
        groups[1].labels["__meta_kubernetes_pod_container_init"],
        "true"
    );
    assert_eq!(groups[0].labels["__meta_kubernetes_pod_ready"], "unknown");
    assert!(
        !groups[0]
            .labels
            .contains_key("__meta_kubernetes_pod_controller_kind")
    );
}

#[test]
fn with_node_metadata_a_pod_on_an_unknown_node_has_no_targets() {
    let caches = Caches {
        pods: vec![store::<Pod>(&[
            r#"{"metadata":{"name":"a","namespace":"n"},"spec":{"nodeName":"known","containers":[{"name":"c"}]},"status":{"podIP":"10.0.0.1"}}"#,
            r#"{"metadata":{"name":"b","namespace":"n"},"spec":{"nodeName":"gone","containers":[{"name":"c"}]},"status":{"podIP":"10.0.0.2"}}"#,
        ])],
        nodes: Some(store::<Node>(&[
            r#"{"metadata":{"name":"known","labels":{"k":"v"}}}"#,
        ])),
        attach_node: true,
        ..Caches::default()
    };
    let groups = roles::pod_groups(&caches);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].labels["__meta_kubernetes_node_label_k"], "v");
}

#[test]
fn a_dual_stack_services_second_family_slice_gives_no_targets() {
    let service = r#"{"metadata":{"name":"s","namespace":"n"},"spec":{"ipFamilyPolicy":"PreferDualStack","ipFamilies":["IPv4","IPv6"]}}"#;
    let slice = |name: &str, family: &str, addr: &str| {
        format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"n","labels":{{"kubernetes.io/service-name":"s"}}}},"addressType":"{family}",
               "endpoints":[{{"addresses":["{addr}"]}}],"ports":[{{"port":80}}]}}"#
        )
    };
    let (v4, v6) = (
        slice("s-4", "IPv4", "10.0.0.1"),
        slice("s-6", "IPv6", "fd00::1"),
    );
    let caches = Caches {
        slices: vec![store::<EndpointSlice>(&[&v4, &v6])],
        services: vec![store::<Service>(&[service])],
        ..Caches::default()
    };
    let groups = roles::endpointslice_groups(&caches);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].targets, ["10.0.0.1:80"]);
    // Fields the slice leaves out are absent, not empty.
    assert!(
        !groups[0]
            .labels
            .contains_key("__meta_kubernetes_endpointslice_port_name")
    );
    assert!(
        !groups[0]
            .labels
            .contains_key("__meta_kubernetes_endpointslice_endpoint_conditions_ready")
    );
}

#[test]
fn service_labels_depend_on_the_type() {
    let caches = Caches {
        services: vec![store::<Service>(&[
            r#"{"metadata":{"name":"ext","namespace":"n"},"spec":{"type":"ExternalName","externalName":"db.example.com","ports":[{"port":5432,"protocol":"TCP"}]}}"#,
            r#"{"metadata":{"name":"lb","namespace":"n"},"spec":{"type":"LoadBalancer","clusterIP":"10.96.0.9","ports":[{"port":443,"protocol":"TCP"}]},
               "status":{"loadBalancer":{"ingress":[{"ip":"1.2.3.4"},{"hostname":"x"},{"ip":"5.6.7.8"}]}}}"#,
        ])],
        ..Caches::default()
    };
    let groups = roles::service_groups(&caches);
    let ext = &groups[0].labels;
    assert_eq!(groups[0].targets, ["ext.n.svc:5432"]);
    assert_eq!(
        ext["__meta_kubernetes_service_external_name"],
        "db.example.com"
    );
    assert!(!ext.contains_key("__meta_kubernetes_service_cluster_ip"));
    let lb = &groups[1].labels;
    assert_eq!(
        lb["__meta_kubernetes_service_loadbalancer_ip"],
        "1.2.3.4,5.6.7.8"
    );
    assert_eq!(lb["__meta_kubernetes_service_cluster_ip"], "10.96.0.9");
}

#[test]
fn a_node_prefers_its_internal_ip_and_one_without_addresses_is_no_target() {
    let caches = Caches {
        nodes: Some(store::<Node>(&[
            r#"{"metadata":{"name":"a"},"status":{"addresses":[{"type":"ExternalIP","address":"8.8.8.8"},{"type":"InternalDNS","address":"a.internal"}]}}"#,
            r#"{"metadata":{"name":"b"}}"#,
        ])),
        ..Caches::default()
    };
    let groups = roles::node_groups(&caches);
    assert_eq!(groups.len(), 1);
    // No kubelet port reported: 0, as Prometheus writes it.
    assert_eq!(groups[0].targets, ["a.internal:0"]);
    assert_eq!(
        groups[0].labels["__meta_kubernetes_node_address_ExternalIP"],
        "8.8.8.8"
    );
}
