//! Every name docs/migrating.md lists as "same as upstream": what upstream MARIN3R
//! v0.13's users, scripts and QE suite match on. The upstream spellings are literals here
//! (copied from upstream's Go constants, kustomize bases and CRDs), checked against our
//! constants and generated objects, so a rename on our side fails this test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use marin3r_envoyconfig::envoyconfig::{CacheState, EnvoyApi};
use marin3r_wire as wire;

/// Webhook names, paths and the Pod webhook's timeout (upstream
/// `config/webhook/manifests.yaml`; QE matches `admission webhook "<name>" denied`).
#[test]
fn webhooks_are_named_and_routed_as_upstream() {
    use marin3r_webhook::server::{
        MUTATE_PATH, VALIDATE_ENVOYCONFIG_PATH, VALIDATE_ENVOYDEPLOYMENT_PATH,
    };
    use wire::webhook_names::*;
    assert_eq!(SIDECAR_INJECTOR, "sidecar-injector.marin3r.3scale.net");
    assert_eq!(ENVOYCONFIG, "envoyconfig.marin3r.3scale.net-v1alpha1");
    assert_eq!(
        ENVOYDEPLOYMENT,
        "envoydeployment.operator.marin3r.3scale.net"
    );
    assert_eq!(SIDECAR_INJECTOR_TIMEOUT_SECONDS, 5);
    assert_eq!(MUTATE_PATH, "/pod-v1-mutate");
    assert_eq!(
        VALIDATE_ENVOYCONFIG_PATH,
        "/validate-marin3r-3scale-net-v1alpha1-envoyconfig"
    );
    assert_eq!(
        VALIDATE_ENVOYDEPLOYMENT_PATH,
        "/validate-operator-marin3r-3scale-net-v1alpha1-envoydeployment"
    );
}

/// Groups, the injection label, the keys of EnvoyConfigRevisions (labels, finalizer)
/// and revision names (upstream `apis/*/groupversion_info.go`,
/// `pkg/reconcilers/marin3r/envoyconfig/filters`, `reconcile_revisions.go`).
#[test]
fn api_groups_labels_finalizer_and_revision_names_are_upstreams() {
    assert_eq!(wire::DOMAIN, "marin3r.3scale.net");
    assert_eq!(wire::OPERATOR_GROUP, "operator.marin3r.3scale.net");
    assert_eq!(wire::API_VERSION, "v1alpha1");
    assert_eq!(wire::INJECTION_LABEL, "marin3r.3scale.net/status");
    assert_eq!(wire::INJECTION_ENABLED, "enabled");
    assert_eq!(wire::NODE_ID_ANNOTATION, "marin3r.3scale.net/node-id");
    assert_eq!(
        wire::CONFIG_VERSION_LABEL,
        "marin3r.3scale.net/config-version"
    );
    assert_eq!(wire::ENVOY_API_LABEL, "marin3r.3scale.net/envoy-api");
    assert_eq!(wire::REVISION_FINALIZER, "finalizer.marin3r.3scale.net");
    assert_eq!(
        marin3r_wire::NODE_ID_ANNOTATION,
        "marin3r.3scale.net/node-id"
    );
    assert_eq!(
        marin3r_wire::REVISION_FINALIZER,
        "finalizer.marin3r.3scale.net"
    );
    assert_eq!(
        marin3r_control_plane::kubernetes::plan::revision_name("kuard", EnvoyApi::V3, "abc"),
        "kuard-v3-abc",
        "<nodeID>-<envoyAPI>-<version>"
    );
}

/// The Pod annotations upstream's injector reads (`marin3r.3scale.net/<key>`, upstream
/// `pkg/webhooks/podv1mutator`).
#[test]
fn sidecar_annotations_are_upstreams() {
    use marin3r_sidecar::annotations::keys::*;
    let ours = [
        NODE_ID,
        CLUSTER_ID,
        CONTAINER_NAME,
        ENVOY_IMAGE,
        ENVOY_API_VERSION,
        PORTS,
        HOST_PORT_MAPPINGS,
        ENVOY_EXTRA_ARGS,
        CONFIG_VOLUME,
        TLS_VOLUME,
        CLIENT_CERTIFICATE,
        DISCOVERY_SERVICE_NAME,
        ADMIN_PORT,
        ADMIN_BIND_ADDRESS,
        ADMIN_ACCESS_LOG_PATH,
        SHTDN_ENABLED,
        SHTDN_PORT,
        SHTDN_IMAGE,
        SHTDN_HOOKS,
        SHTDN_DRAIN_TIME,
        SHTDN_DRAIN_STRATEGY,
        REQUESTS_CPU,
        REQUESTS_MEMORY,
        LIMITS_CPU,
        LIMITS_MEMORY,
        INIT_MANAGER_IMAGE,
    ];
    let upstream = [
        "node-id",
        "cluster-id",
        "container-name",
        "envoy-image",
        "envoy-api-version",
        "ports",
        "host-port-mappings",
        "envoy-extra-args",
        "config-volume",
        "tls-volume",
        "client-certificate",
        "discovery-service.name",
        "admin.port",
        "admin.bind-address",
        "admin.access-log-path",
        "shutdown-manager.enabled",
        "shutdown-manager.port",
        "shutdown-manager.image",
        "shutdown-manager.extra-lifecycle-hooks",
        "shutdown-manager.drain-time",
        "shutdown-manager.drain-strategy",
        "resources.requests.cpu",
        "resources.requests.memory",
        "resources.limits.cpu",
        "resources.limits.memory",
        "init-manager.image",
    ];
    assert_eq!(ours, upstream);
    use marin3r_sidecar::generate::{INIT_MANAGER_NAME, SHUTDOWN_MANAGER_NAME};
    assert_eq!(INIT_MANAGER_NAME, "envoy-init-mgr");
    assert_eq!(SHUTDOWN_MANAGER_NAME, "envoy-shtdn-mgr");
}

/// (CRD name, short names, printer columns as (name, jsonPath)).
type CrdNames = (
    &'static str,
    Vec<&'static str>,
    Vec<(&'static str, &'static str)>,
);

fn crd_names(crd: &CustomResourceDefinition) -> (String, Vec<String>, Vec<(String, String)>) {
    let columns = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.json_path.clone()))
        .collect();
    (
        crd.metadata.name.clone().unwrap_or_default(),
        crd.spec.names.short_names.clone().unwrap_or_default(),
        columns,
    )
}

/// CRD names, versions, short names and printer columns of the marin3r group
/// (upstream `config/crd/bases`). The operator group's CRDs only share the names and
/// version (upstream has no short names or columns on DiscoveryService and
/// EnvoyDeployment; ours add columns, which scripts do not parse).
#[test]
fn crds_are_named_and_print_as_upstream() {
    let upstream: Vec<CrdNames> = vec![
        (
            "envoyconfigs.marin3r.3scale.net",
            vec!["ec"],
            vec![
                ("Node ID", ".spec.nodeID"),
                ("Envoy API", ".spec.envoyAPI"),
                ("Desired Version", ".status.desiredVersion"),
                ("Published Version", ".status.publishedVersion"),
                ("Cache State", ".status.cacheState"),
            ],
        ),
        (
            "envoyconfigrevisions.marin3r.3scale.net",
            vec!["ecr"],
            vec![
                ("Node ID", ".spec.nodeID"),
                ("Envoy API", ".spec.envoyAPI"),
                ("Version", ".spec.version"),
                ("Published", ".status.published"),
                ("Created At", ".metadata.creationTimestamp"),
                ("Last Published At", ".status.lastPublishedAt"),
                ("Tainted", ".status.tainted"),
            ],
        ),
    ];
    let ours: BTreeMap<String, _> = marin3r_manifests::crds()
        .iter()
        .map(crd_names)
        .map(|n| (n.0.clone(), n))
        .collect();
    for (name, short, columns) in upstream {
        let (_, our_short, our_columns) = ours.get(name).unwrap_or_else(|| panic!("{name}"));
        assert_eq!(our_short, &short, "{name} short names");
        let columns: Vec<(String, String)> = columns
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(our_columns, &columns, "{name} printer columns");
    }
    for crd in marin3r_manifests::crds()
        .iter()
        .chain(marin3r_manifests::operator_crds().iter())
    {
        let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(versions, ["v1alpha1"], "{:?}", crd.metadata.name);
    }
    let operator: Vec<String> = marin3r_manifests::operator_crds()
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    for name in [
        "discoveryservices.operator.marin3r.3scale.net",
        "discoveryservicecertificates.operator.marin3r.3scale.net",
        "envoydeployments.operator.marin3r.3scale.net",
    ] {
        assert!(operator.iter().any(|n| n == name), "{name}");
    }
}

/// Condition types and cache states (upstream `apis/marin3r/v1alpha1/*_types.go`) and
/// the revision conditions' reasons upstream writes.
#[test]
fn conditions_and_states_are_upstreams() {
    use marin3r_control_plane::kubernetes::plan::{Outcome, plan_revision_status};
    use marin3r_control_plane::status::{CACHE_OUT_OF_SYNC, ROLLBACK_FAILED};
    use marin3r_envoyconfig::envoyconfigrevision::{
        RESOURCES_IN_SYNC, REVISION_PUBLISHED, REVISION_TAINTED,
    };
    assert_eq!(CACHE_OUT_OF_SYNC, "CacheOutOfSync");
    assert_eq!(ROLLBACK_FAILED, "RollbackFailed");
    assert_eq!(REVISION_PUBLISHED, "RevisionPublished");
    assert_eq!(REVISION_TAINTED, "RevisionTainted");
    assert_eq!(RESOURCES_IN_SYNC, "ResourcesInSync");
    for (state, upstream) in [
        (CacheState::InSync, "InSync"),
        (CacheState::Rollback, "Rollback"),
        (CacheState::RollbackFailed, "RollbackFailed"),
    ] {
        assert_eq!(serde_json::to_value(state).unwrap(), upstream);
    }
    let published = plan_revision_status(
        &Default::default(),
        Some(1),
        &Outcome::Published {
            versions: BTreeMap::new(),
        },
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    );
    let reason = |t: &str| published.condition(t).map(|c| c.reason.as_str());
    assert_eq!(reason(REVISION_PUBLISHED), Some("VersionPublished"));
    assert_eq!(reason(RESOURCES_IN_SYNC), Some("ResourcesSynced"));
}

/// What the operator generates (upstream `pkg/reconcilers/operator/*/generators`,
/// `controllers/operator.marin3r`, `cmd/operator.go`).
#[test]
fn operator_objects_are_named_and_labelled_as_upstream() {
    use marin3r_operator::objects::{
        DISCOVERY_SERVICE_COMPONENT, ENVOY_DEPLOYMENT_COMPONENT, labels,
    };
    use marin3r_operator_api::discoveryservice::{
        CA_CERTIFICATE_PREFIX, CA_COMMON_NAME_PREFIX, SERVER_CERTIFICATE_PREFIX,
        SERVER_COMMON_NAME_PREFIX,
    };
    for (component, upstream) in [
        (DISCOVERY_SERVICE_COMPONENT, "discovery-service"),
        (ENVOY_DEPLOYMENT_COMPONENT, "envoy-deployment"),
    ] {
        let expected = BTreeMap::from([
            ("app.kubernetes.io/name".to_string(), "marin3r".to_string()),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "marin3r-operator".to_string(),
            ),
            (
                "app.kubernetes.io/component".to_string(),
                upstream.to_string(),
            ),
            ("app.kubernetes.io/instance".to_string(), "test".to_string()),
        ]);
        let ours = labels(component, "test");
        for (k, v) in &expected {
            assert_eq!(ours.get(k), Some(v), "{component}: {k}");
        }
    }
    assert_eq!(
        wire::object_names::discovery_service("test"),
        "marin3r-test"
    );
    assert_eq!(
        wire::object_names::SIDECAR_CLIENT_CERTIFICATE,
        "envoy-sidecar-client-cert"
    );
    assert_eq!(CA_CERTIFICATE_PREFIX, "marin3r-ca-cert");
    assert_eq!(CA_COMMON_NAME_PREFIX, "marin3r-ca");
    assert_eq!(SERVER_CERTIFICATE_PREFIX, "marin3r-server-cert");
    assert_eq!(SERVER_COMMON_NAME_PREFIX, "marin3r-server");
    assert_eq!(
        marin3r_operator::leader::LEASE_NAME,
        "2cfbe7d6.operator.marin3r.3scale.net"
    );
}

/// The discovery service's per-pod counters (upstream
/// `pkg/discoveryservice/xdss/stats/metrics_collector.go`): names and label names.
#[test]
fn discovery_metrics_are_upstreams() {
    use marin3r_envoyconfig::resource::ResourceType;
    use marin3r_xds::stats::{StreamEvent, XdsMetrics};
    let mut registry = prometheus_client::registry::Registry::default();
    let xds = XdsMetrics::register(&mut registry);
    let (node_id, pod_name) = ("n".to_string(), "p".to_string());
    xds.record(&StreamEvent::Request {
        node_id: node_id.clone(),
        pod_name: pod_name.clone(),
        resource_type: Some(ResourceType::Cluster),
    });
    xds.record(&StreamEvent::Ack {
        node_id: node_id.clone(),
        pod_name: pod_name.clone(),
        resource_type: ResourceType::Cluster,
        version: "1".into(),
    });
    xds.record(&StreamEvent::Nack {
        node_id,
        pod_name,
        resource_type: ResourceType::Cluster,
        version: "2".into(),
        message: "no".into(),
    });
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for name in [
        "marin3r_xdss_discovery_requests_total",
        "marin3r_xdss_discovery_ack_total",
        "marin3r_xdss_discovery_nack_total",
    ] {
        let sample = text
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .unwrap_or_else(|| panic!("{name} not exported:\n{text}"));
        for label in ["node_id=", "resource_type=", "pod_name="] {
            assert!(sample.contains(label), "{name} has no {label}: {sample}");
        }
    }
}
