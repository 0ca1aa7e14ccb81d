use serde_json::Value;
use serde_json::json;

use super::pod::names;
use super::{Mutation, SidecarStatus, SkipReason, mutate_pod};
use crate::Error;
use crate::annotations::Defaults;

fn pod(labels: Value, annotations: Value) -> Value {
    json!({
        "metadata": {"name": "p", "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "app", "image": "app:1"}]}
    })
}

fn injected(pod: &Value) -> Value {
    match mutate_pod(pod, Some("ns"), &Defaults::default()) {
        Ok(Mutation::Injected(v)) => *v,
        other => panic!("expected an injection, got {other:?}"),
    }
}

#[test]
fn only_the_status_annotation_is_added() {
    let before = pod(
        json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}),
        json!({"marin3r.3scale.net/node-id": "n", "team": "a", "z-last": ""}),
    );
    let after = injected(&before);
    let mut annotations = after["metadata"]["annotations"].clone();
    let status = annotations
        .as_object_mut()
        .and_then(|m| m.remove(marin3r_wire::SIDECAR_STATUS_ANNOTATION))
        .and_then(|s| s.as_str().map(str::to_string));
    assert_eq!(annotations, before["metadata"]["annotations"]);
    let status: SidecarStatus = serde_json::from_str(&status.unwrap_or_default()).unwrap();
    assert_eq!(status.init_containers, ["envoy-init-mgr"]);
    assert_eq!(after["metadata"]["labels"], before["metadata"]["labels"]);
    // Injecting the injected Pod again gives the same Pod.
    assert_eq!(injected(&after), after);
}

#[test]
fn non_string_metadata_maps_name_the_entry() {
    let cases = [
        (
            pod(
                json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED, "n": 1}),
                json!({}),
            ),
            "metadata.labels[\"n\"]",
        ),
        (pod(json!(["x"]), json!({})), "metadata.labels"),
        (
            pod(
                json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}),
                json!({"marin3r.3scale.net/node-id": true}),
            ),
            "metadata.annotations[\"marin3r.3scale.net/node-id\"]",
        ),
        (
            pod(
                json!({marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}),
                json!("x"),
            ),
            "metadata.annotations",
        ),
    ];
    for (pod, field) in cases {
        match mutate_pod(&pod, None, &Defaults::default()) {
            Err(Error::InvalidPod { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: expected InvalidPod, got {other:?}"),
        }
    }
}

#[test]
fn unlabelled_pods_are_skipped_whatever_their_annotations() {
    let p = pod(
        json!({"app": "x"}),
        json!({"marin3r.3scale.net/node-id": "n"}),
    );
    assert_eq!(
        mutate_pod(&p, None, &Defaults::default()).ok(),
        Some(Mutation::Skipped(SkipReason::NotLabelled))
    );
}

fn labelled(annotations: Value, spec: Value) -> Value {
    json!({
        "metadata": {"name": "p", "labels": {marin3r_wire::INJECTION_LABEL: marin3r_wire::INJECTION_ENABLED}, "annotations": annotations},
        "spec": spec
    })
}

fn container_names(pod: &Value, key: &str) -> Vec<String> {
    names(
        pod["spec"][key]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default(),
    )
    .map(str::to_string)
    .collect()
}

#[test]
fn forged_status_does_not_remove_user_containers_or_volumes() {
    let forged = json!({
        "marin3r.3scale.net/node-id": "n",
        marin3r_wire::SIDECAR_STATUS_ANNOTATION: r#"{"containers":["app"],"initContainers":["setup"],"volumes":["data","certs"]}"#,
    });
    let before = labelled(
        forged,
        json!({
            "containers": [{"name": "app", "image": "app:1",
                "volumeMounts": [{"name": "data", "mountPath": "/etc/envoy/bootstrap"}]}],
            "initContainers": [{"name": "setup", "image": "setup:1"}],
            "volumes": [{"name": "data", "emptyDir": {}},
                        {"name": "certs", "secret": {"secretName": "c"}}]
        }),
    );
    let after = injected(&before);
    assert_eq!(
        container_names(&after, "containers"),
        ["app", "envoy-sidecar"]
    );
    assert_eq!(
        container_names(&after, "initContainers"),
        ["setup", "envoy-init-mgr"]
    );
    assert_eq!(
        container_names(&after, "volumes"),
        [
            "data",
            "certs",
            "envoy-sidecar-tls",
            "envoy-sidecar-bootstrap"
        ]
    );
    assert_eq!(
        after["spec"]["containers"][0],
        before["spec"]["containers"][0]
    );
    assert_eq!(injected(&after), after);
}

#[test]
fn forged_status_listing_a_user_container_named_like_the_sidecar_is_denied() {
    let before = labelled(
        json!({
            "marin3r.3scale.net/node-id": "n",
            marin3r_wire::SIDECAR_STATUS_ANNOTATION: r#"{"containers":["envoy-sidecar"],"volumes":["envoy-sidecar-tls"]}"#,
        }),
        json!({
            "containers": [{"name": "app", "image": "app:1"},
                           {"name": "envoy-sidecar", "image": "envoy:mine"}],
            "volumes": [{"name": "envoy-sidecar-tls", "secret": {"secretName": "mine"}}]
        }),
    );
    match mutate_pod(&before, Some("ns"), &Defaults::default()) {
        Err(Error::Annotations(e)) => {
            let fields: Vec<&str> = e.0.iter().map(|e| e.annotation.as_str()).collect();
            assert_eq!(fields, ["container-name", "tls-volume"], "{e}");
        }
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn denied_fields(pod: &Value) -> Vec<(String, String)> {
    match mutate_pod(pod, Some("ns"), &Defaults::default()) {
        Err(Error::Annotations(e)) => e.0.into_iter().map(|e| (e.annotation, e.message)).collect(),
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn with_extra_volumes(secrets: Option<&str>) -> Value {
    let mut annotations = json!({"marin3r.3scale.net/node-id": "n"});
    if let Some(s) = secrets {
        annotations["marin3r.3scale.net/envoy-extra-secret-volumes"] = json!(s);
    }
    labelled(
        annotations,
        json!({
            "containers": [{"name": "app", "image": "app:1",
                "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}],
            "volumes": [{"name": "creds", "secret": {"secretName": "creds"}},
                        {"name": "settings", "configMap": {"name": "settings"}}]
        }),
    )
}

#[test]
fn reinjection_replaces_the_extra_volumes_exactly() {
    let plain = injected(&with_extra_volumes(None));
    let two = injected(&with_extra_volumes(Some("a:/etc/envoy/a,b:/etc/envoy/b")));
    assert_eq!(
        container_names(&two, "volumes"),
        [
            "creds",
            "settings",
            "envoy-sidecar-tls",
            "envoy-sidecar-bootstrap",
            "envoy-extra-secret-0",
            "envoy-extra-secret-1"
        ]
    );
    assert_eq!(injected(&two), two);
    // One entry dropped: the other is renumbered, nothing is left behind.
    let mut one = two.clone();
    one["metadata"]["annotations"]["marin3r.3scale.net/envoy-extra-secret-volumes"] =
        json!("b:/etc/envoy/b");
    let one = injected(&one);
    assert_eq!(one, injected(&with_extra_volumes(Some("b:/etc/envoy/b"))),);
    // The annotation removed: back to the Pod injected without it.
    let mut none = one.clone();
    if let Some(a) = none["metadata"]["annotations"].as_object_mut() {
        a.remove("marin3r.3scale.net/envoy-extra-secret-volumes");
    }
    assert_eq!(injected(&none), plain);
}

#[test]
fn forged_extra_volume_status_does_not_remove_user_volumes() {
    // The status names the user's Secret and ConfigMap volumes as extra volumes: one
    // is mounted by the app at the recorded path, the other by no container.
    let mut before = with_extra_volumes(Some("a:/etc/envoy/a"));
    before["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION] = json!(
        r#"{"containers":["app"],"extraVolumes":[{"name":"creds","mountPath":"/creds"},{"name":"settings","mountPath":"/settings"}]}"#
    );
    let after = injected(&before);
    assert_eq!(
        container_names(&after, "volumes"),
        [
            "creds",
            "settings",
            "envoy-sidecar-tls",
            "envoy-sidecar-bootstrap",
            "envoy-extra-secret-0"
        ]
    );
    assert_eq!(
        after["spec"]["containers"][0],
        before["spec"]["containers"][0]
    );
    assert_eq!(injected(&after), after);
    // A user volume named like a generated one is denied, naming the annotation.
    let mut clash = with_extra_volumes(Some("a:/etc/envoy/a"));
    clash["spec"]["volumes"][1]["name"] = json!("envoy-extra-secret-0");
    assert_eq!(
        denied_fields(&clash),
        [(
            "envoy-extra-secret-volumes".to_string(),
            "the pod already has a volume named \"envoy-extra-secret-0\"".to_string()
        )]
    );
}

#[test]
fn an_empty_namespace_is_no_namespace() {
    // The request's namespace, else the Pod's, else `default`; an empty one (a Pod of
    // a controller, a manifest with `namespace: ""`) counts as none, as everywhere.
    let xdss_host = |namespace: Option<&str>, pod_namespace: &str| {
        let mut p = labelled(
            json!({"marin3r.3scale.net/node-id": "n"}),
            json!({"containers": [{"name": "app", "image": "a"}]}),
        );
        p["metadata"]["namespace"] = json!(pod_namespace);
        let Ok(Mutation::Injected(pod)) = mutate_pod(&p, namespace, &Defaults::default()) else {
            panic!("not injected");
        };
        let args: Vec<String> =
            serde_json::from_value(pod["spec"]["initContainers"][0]["args"].clone()).unwrap();
        let at = args.iter().position(|a| a == "--xdss-host").unwrap();
        args[at + 1].clone()
    };
    let host = |ns: &str| format!("marin3r-discoveryservice.{ns}.svc");
    assert_eq!(xdss_host(Some("req"), "pod"), host("req"));
    assert_eq!(xdss_host(Some(""), "pod"), host("pod"));
    assert_eq!(xdss_host(None, "pod"), host("pod"));
    assert_eq!(xdss_host(Some(""), ""), host("default"));
    assert_eq!(xdss_host(None, ""), host("default"));
}

#[test]
fn ephemeral_container_named_like_an_injected_container_is_denied() {
    for (annotations, name) in [
        (json!({"marin3r.3scale.net/node-id": "n"}), "envoy-sidecar"),
        (
            json!({"marin3r.3scale.net/node-id": "n", "marin3r.3scale.net/container-name": "proxy"}),
            "proxy",
        ),
    ] {
        let p = labelled(
            annotations,
            json!({"containers": [{"name": "app", "image": "a"}],
                   "ephemeralContainers": [{"name": name, "image": "debug"}]}),
        );
        let denied = denied_fields(&p);
        assert_eq!(denied.len(), 1, "{denied:?}");
        assert_eq!(denied[0].0, "container-name");
        assert!(
            denied[0].1.contains("spec.ephemeralContainers"),
            "{denied:?}"
        );
    }
}

fn mapped(mappings: &str) -> Value {
    json!({"marin3r.3scale.net/node-id": "n",
           "marin3r.3scale.net/ports": "http:8080,dns:8053:UDP",
           "marin3r.3scale.net/host-port-mappings": mappings})
}

#[test]
fn a_host_port_an_app_container_already_uses_is_denied_naming_both() {
    // An app container, an init container and a native-sidecar-style init container
    // (restartPolicy: Always) each already take a host port; protocol TCP by default.
    let spec = json!({
        "containers": [{"name": "app", "image": "a",
                        "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 30000}]}],
        "initContainers": [
            {"name": "setup", "image": "s",
             "ports": [{"containerPort": 53, "hostPort": 30001, "protocol": "UDP"}]},
            {"name": "agent", "image": "g", "restartPolicy": "Always",
             "ports": [{"containerPort": 90, "hostPort": 30002, "hostIP": "10.0.0.1"}]}
        ]
    });
    let denied = denied_fields(&labelled(mapped("http:30000"), spec.clone()));
    assert_eq!(
        denied,
        [(
            "host-port-mappings".to_string(),
            "hostPort 30000/TCP is used by both container \"app\" (spec.containers[0].ports[1]) \
             and the sidecar's port \"http\" (marin3r.3scale.net/host-port-mappings)"
                .to_string()
        )]
    );
    let denied = denied_fields(&labelled(mapped("dns:30001"), spec.clone()));
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert!(
        denied[0].1.starts_with(
            "hostPort 30001/UDP is used by both container \"setup\" (spec.initContainers[0].ports[0])"
        ),
        "{denied:?}"
    );
    // The sidecar binds every host address: an app port on one hostIP clashes too.
    let denied = denied_fields(&labelled(mapped("http:30002"), spec.clone()));
    assert!(
        denied[0]
            .1
            .contains("container \"agent\" (spec.initContainers[1].ports[0])"),
        "{denied:?}"
    );
    // Every clash is listed, in one error.
    let denied = denied_fields(&labelled(mapped("http:30000,dns:30001"), spec.clone()));
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(
        denied[0].1.matches("is used by both").count(),
        2,
        "{denied:?}"
    );
    // The same number with another protocol, or a free port, is fine.
    injected(&labelled(mapped("dns:30000"), spec.clone()));
    injected(&labelled(mapped("http:30001,dns:30003"), spec));
}

#[test]
fn with_host_network_every_sidecar_port_is_a_host_port() {
    // With hostNetwork a containerPort is a host port: the sidecar's unmapped ports and
    // its admin port clash with the app's.
    let spec = |app_port: u16, protocol: &str| {
        json!({"hostNetwork": true, "containers": [{"name": "app", "image": "a",
            "ports": [{"containerPort": app_port, "protocol": protocol}]}]})
    };
    let annotations = json!({"marin3r.3scale.net/node-id": "n",
                             "marin3r.3scale.net/ports": "http:8080"});
    let denied = denied_fields(&labelled(annotations.clone(), spec(8080, "TCP")));
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0].0, "ports");
    assert!(denied[0].1.contains("hostPort 8080/TCP"), "{denied:?}");
    let denied = denied_fields(&labelled(annotations.clone(), spec(9901, "TCP")));
    assert_eq!(denied[0].0, "admin.port", "{denied:?}");
    // Another protocol does not clash, and without hostNetwork a containerPort is not
    // a host port at all.
    injected(&labelled(annotations.clone(), spec(8080, "UDP")));
    let mut own = spec(8080, "TCP");
    own["hostNetwork"] = json!(false);
    injected(&labelled(annotations, own));
}

#[test]
fn reinjection_does_not_clash_with_the_host_ports_of_the_sidecar_it_replaces() {
    let spec = json!({"containers": [{"name": "app", "image": "a",
                      "ports": [{"containerPort": 80, "hostPort": 30001}]}]});
    let once = injected(&labelled(mapped("http:30000"), spec));
    assert_eq!(injected(&once), once);
    // Re-injected with the app now taking the sidecar's old host port: denied.
    let mut taken = once.clone();
    taken["spec"]["containers"][0]["ports"][0]["hostPort"] = json!(30000);
    assert_eq!(denied_fields(&taken)[0].0, "host-port-mappings");
}

#[test]
fn host_network_requires_host_port_equal_to_container_port() {
    let annotations = |mappings: &str| {
        json!({"marin3r.3scale.net/node-id": "n",
               "marin3r.3scale.net/ports": "http:8080",
               "marin3r.3scale.net/host-port-mappings": mappings})
    };
    let spec = json!({"hostNetwork": true, "containers": [{"name": "app", "image": "a"}]});
    let denied = denied_fields(&labelled(annotations("http:30000"), spec.clone()));
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert_eq!(denied[0].0, "host-port-mappings");
    assert!(denied[0].1.contains("spec.hostNetwork"), "{denied:?}");
    // Equal ports are what Kubernetes requires, and are accepted.
    injected(&labelled(annotations("http:8080"), spec));
}

fn shutdown_manager_pod(enabled: &str, status: Option<&str>) -> Value {
    let mut annotations = json!({
        "marin3r.3scale.net/node-id": "n",
        "marin3r.3scale.net/shutdown-manager.enabled": enabled,
        "marin3r.3scale.net/shutdown-manager.extra-lifecycle-hooks": "app,worker",
    });
    if let Some(s) = status {
        annotations[marin3r_wire::SIDECAR_STATUS_ANNOTATION] = json!(s);
    }
    labelled(
        annotations,
        json!({"containers": [
            {"name": "app", "image": "a",
             "lifecycle": {"postStart": {"exec": {"command": ["warm"]}},
                           "preStop": {"exec": {"command": ["sleep", "5"]}}}},
            {"name": "worker", "image": "w"}
        ]}),
    )
}

#[test]
fn reinjection_without_shutdown_manager_undoes_hooks_and_grace_period() {
    let original = shutdown_manager_pod("false", None);
    let plain = injected(&original);
    let mut with_sm = shutdown_manager_pod("true", None);
    with_sm = injected(&with_sm);
    assert_eq!(with_sm["spec"]["terminationGracePeriodSeconds"], 300);
    assert_eq!(
        with_sm["spec"]["containers"][1]["lifecycle"]["preStop"]["httpGet"]["path"],
        "/drain"
    );
    // The user turns the shutdown manager off and the Pod goes through again.
    let mut turned_off = with_sm.clone();
    turned_off["metadata"]["annotations"]["marin3r.3scale.net/shutdown-manager.enabled"] =
        json!("false");
    let again = injected(&turned_off);
    assert_eq!(again["spec"], plain["spec"]);
    assert_eq!(
        again["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION],
        plain["metadata"]["annotations"][marin3r_wire::SIDECAR_STATUS_ANNOTATION]
    );
    assert_eq!(injected(&again), again);
}

#[test]
fn old_status_annotations_without_recorded_changes_are_still_read() {
    let old = r#"{"containers":["envoy-sidecar"],"initContainers":["envoy-init-mgr"],"volumes":["envoy-sidecar-tls","envoy-sidecar-bootstrap"]}"#;
    let status: SidecarStatus = serde_json::from_str(old).unwrap();
    assert_eq!(status.termination_grace_period, None);
    assert!(status.pre_stop_hooks.is_empty());
    assert_eq!(serde_json::to_string(&status).unwrap(), old);
}

#[test]
fn recorded_changes_are_not_undone_when_the_user_changed_them_since() {
    let mut with_sm = injected(&shutdown_manager_pod("true", None));
    with_sm["spec"]["terminationGracePeriodSeconds"] = json!(600);
    with_sm["spec"]["containers"][1]["lifecycle"] =
        json!({"preStop": {"exec": {"command": ["mine"]}}});
    with_sm["metadata"]["annotations"]["marin3r.3scale.net/shutdown-manager.enabled"] =
        json!("false");
    let again = injected(&with_sm);
    assert_eq!(again["spec"]["terminationGracePeriodSeconds"], 600);
    assert_eq!(
        again["spec"]["containers"][1]["lifecycle"],
        json!({"preStop": {"exec": {"command": ["mine"]}}})
    );
}
