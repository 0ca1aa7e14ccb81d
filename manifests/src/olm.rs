//! The OLM packaging of marin3r-rs, generated from the kustomize install (one source):
//!
//! - the `registry+v1` bundle ([`bundle_files`], into `manifests/olm/bundle/`): the
//!   ClusterServiceVersion `marin3r-rs.v<version>` whose Deployments, permissions and
//!   `webhookdefinitions` are read from `manifests/operator` and `manifests/default`, the
//!   six CRDs of [`crate::crds`] and [`crate::operator_crds`], the webhook's
//!   PodDisruptionBudget, the discovery services' PriorityClass, and
//!   `metadata/annotations.yaml`;
//! - the file-based catalog ([`catalog_files`], into `manifests/olm/catalog/`): the
//!   package, its `stable` channel and the bundle with its `olm.package` and `olm.gvk`
//!   properties.
//!
//! What OLM does differently from the kustomize install, and therefore what the
//! generator changes (and nothing else):
//!
//! - OLM issues the webhook's serving certificate and mounts it into the webhook
//!   Deployment (`tls.crt`/`tls.key` under [`marin3r_wire::olm::WEBHOOK_CERT_DIR`]), creates the Service
//!   `<deployment>-service` and sets each webhook's `namespaceSelector` from the
//!   OperatorGroup: the webhook's own `tls` Secret volume and `--tls-dir` give way, the
//!   Service and the webhook configurations become `webhookdefinitions` (same names,
//!   paths, rules, selectors and timeouts);
//! - the operator watches the OperatorGroup's target namespaces: `WATCH_NAMESPACE` comes
//!   from the pod annotation `olm.targetNamespaces` (empty for AllNamespaces: every
//!   namespace; `a,b` for MultiNamespace: one set of controllers per namespace);
//! - the ClusterRole and the leader-election Role become the CSV's `permissions` (OLM
//!   grants them in the target namespaces, cluster-wide for AllNamespaces), rules on
//!   cluster-scoped resources its `clusterPermissions`.
//!
//! Regenerate the checked-in files after changing a manifest they are read from:
//! `UPDATE_OLM=1 cargo test -p marin3r-manifests --test olm`.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::Error;

/// The OLM package name (upstream MARIN3R's is `marin3r`; both own the same CRDs, so only
/// one of them can be installed).
pub const PACKAGE: &str = "marin3r-rs";
/// The one channel, and the default.
pub const CHANNEL: &str = "stable";
/// The version of the bundle: the workspace's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The suggested install namespace (the kustomize install's).
pub const SUGGESTED_NAMESPACE: &str = "marin3r-system";
/// The oldest Kubernetes the bundle installs on (docs/install.md).
pub const MIN_KUBE_VERSION: &str = "1.27.0";

/// Header of every generated file under `manifests/olm/`.
pub const OLM_GENERATED_HEADER: &str = "# Generated from manifests/{operator,default,crds,priority-class} by marin3r-manifests (src/olm.rs); do not edit.\n\
# Regenerate: UPDATE_OLM=1 cargo test -p marin3r-manifests --test olm\n";

/// The objects the bundle is made from, as `kubectl apply -k` reads them.
mod source {
    pub const OPERATOR_DEPLOYMENT: (&str, &str) = (
        "manifests/operator/deployment.yaml",
        include_str!("../operator/deployment.yaml"),
    );
    pub const OPERATOR_CLUSTER_ROLE: (&str, &str) = (
        "manifests/operator/clusterrole.yaml",
        include_str!("../operator/clusterrole.yaml"),
    );
    pub const OPERATOR_LEASE_ROLE: (&str, &str) = (
        "manifests/operator/leader-election-role.yaml",
        include_str!("../operator/leader-election-role.yaml"),
    );
    pub const WEBHOOK_DEPLOYMENT: (&str, &str) = (
        "manifests/default/deployment.yaml",
        include_str!("../default/deployment.yaml"),
    );
    pub const WEBHOOK_SERVICE: (&str, &str) = (
        "manifests/default/service.yaml",
        include_str!("../default/service.yaml"),
    );
    pub const WEBHOOK_CONFIGURATIONS: (&str, &str) = (
        "manifests/default/webhooks.yaml",
        include_str!("../default/webhooks.yaml"),
    );
    pub const WEBHOOK_PDB: (&str, &str) = (
        "manifests/default/poddisruptionbudget.yaml",
        include_str!("../default/poddisruptionbudget.yaml"),
    );
    pub const PRIORITY_CLASS: (&str, &str) = (
        "manifests/priority-class/priorityclass.yaml",
        include_str!("../priority-class/priorityclass.yaml"),
    );
    pub const ALM_EXAMPLES: (&str, &str) = (
        "manifests/olm/alm-examples.yaml",
        include_str!("../olm/alm-examples.yaml"),
    );
}

/// The documents of one source file (comments and empty documents dropped).
fn documents((path, text): (&str, &str)) -> Result<Vec<Value>, Error> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| Error::Invalid {
        path: path.to_string(),
        message: e.to_string(),
    })?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

fn invalid(path: &str, message: impl Into<String>) -> Error {
    Error::Invalid {
        path: path.to_string(),
        message: message.into(),
    }
}

/// The one document of `kind` in a source file.
fn one(source: (&str, &str), kind: &str) -> Result<Value, Error> {
    let mut found = documents(source)?
        .into_iter()
        .filter(|d| d["kind"] == kind)
        .collect::<Vec<_>>();
    match (found.pop(), found.is_empty()) {
        (Some(doc), true) => Ok(doc),
        _ => Err(invalid(source.0, format!("expected exactly one {kind}"))),
    }
}

/// `name` of an object.
fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// The bundle's CSV name: `marin3r-rs.v<version>`.
pub fn csv_name() -> String {
    format!("{PACKAGE}.v{VERSION}")
}

/// The bundle image reference of this version (`scripts/olm-images` builds it from
/// `manifests/olm/bundle/`).
pub fn bundle_image() -> String {
    marin3r_wire::images::OLM_BUNDLE.to_string()
}

/// The catalog image reference of this version (its `configs/` is
/// `manifests/olm/catalog/`).
pub fn catalog_image() -> String {
    marin3r_wire::images::OLM_CATALOG.to_string()
}

/// The CRDs the bundle owns: marin3r's and the operator's.
fn owned_crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    let mut crds = crate::crds();
    crds.extend(crate::operator_crds());
    crds
}

/// The kinds OLM shows as internal (created by marin3r, not by users).
const INTERNAL_KINDS: [&str; 3] = [
    "EnvoyConfigRevision",
    "DiscoveryServiceCertificate",
    "DiscoveryServiceReplica",
];

/// `(group, version, kind)` of each owned API (the served versions).
pub fn owned_gvks() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for crd in owned_crds() {
        for v in &crd.spec.versions {
            out.push((
                crd.spec.group.clone(),
                v.name.clone(),
                crd.spec.names.kind.clone(),
            ));
        }
    }
    out
}

/// The CSV's `spec.customresourcedefinitions.owned`.
fn owned_entries() -> Vec<Value> {
    owned_crds()
        .iter()
        .flat_map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let kind = crd.spec.names.kind.clone();
            crd.spec.versions.iter().map(move |v| {
                let description = v
                    .schema
                    .as_ref()
                    .and_then(|s| s.open_api_v3_schema.as_ref())
                    .and_then(|s| s.description.clone())
                    .unwrap_or_default();
                json!({
                    "name": name,
                    "version": v.name,
                    "kind": kind,
                    "displayName": kind,
                    "description": first_sentence(&description),
                })
            })
        })
        .collect()
}

/// The first sentence (or line) of a description, for the console's one-line summaries.
fn first_sentence(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.find(". ") {
        Some(i) => text[..=i].to_string(),
        None => text,
    }
}

/// A Deployment of the kustomize install as a CSV `deployments[]` entry.
fn deployment_entry(deployment: &Value) -> Value {
    json!({
        "name": name_of(deployment),
        "label": deployment["metadata"]["labels"],
        "spec": deployment["spec"],
    })
}

/// The operator Deployment under OLM: `WATCH_NAMESPACE` from `olm.targetNamespaces`.
fn operator_deployment() -> Result<Value, Error> {
    let path = source::OPERATOR_DEPLOYMENT.0;
    let mut deployment = one(source::OPERATOR_DEPLOYMENT, "Deployment")?;
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .ok_or_else(|| invalid(path, "no containers"))?;
    if containers.len() != 1 {
        return Err(invalid(path, "expected one container (the operator)"));
    }
    let env = containers[0]["env"]
        .as_array_mut()
        .ok_or_else(|| invalid(path, "the operator container has no env"))?;
    if env.iter().any(|e| e["name"] == "WATCH_NAMESPACE") {
        return Err(invalid(
            path,
            "WATCH_NAMESPACE is set: under OLM it comes from olm.targetNamespaces",
        ));
    }
    env.insert(
        0,
        json!({
            "name": "WATCH_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['olm.targetNamespaces']"}},
        }),
    );
    Ok(deployment)
}

/// The webhook Deployment under OLM: the serving certificate OLM mounts, not the `tls`
/// Secret volume of the kustomize install (whose Secret cert-manager issues).
fn webhook_deployment() -> Result<Value, Error> {
    let path = source::WEBHOOK_DEPLOYMENT.0;
    let mut deployment = one(source::WEBHOOK_DEPLOYMENT, "Deployment")?;
    if let Some(meta) = deployment["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    let pod = &mut deployment["spec"]["template"]["spec"];
    // The volume --tls-dir names is replaced by OLM's.
    let containers = pod["containers"]
        .as_array_mut()
        .ok_or_else(|| invalid(path, "no containers"))?;
    let mut tls_volume = None;
    for c in containers.iter_mut() {
        let Some(args) = c["args"].as_array_mut() else {
            continue;
        };
        let mut dir = None;
        for arg in args.iter_mut() {
            let Some(s) = arg.as_str() else { continue };
            if let Some(d) = s.strip_prefix("--tls-dir=") {
                dir = Some(d.to_string());
                *arg = json!(format!("--tls-dir={}", marin3r_wire::olm::WEBHOOK_CERT_DIR));
            } else if s.starts_with("--tls-cert-name=") {
                *arg = json!(format!(
                    "--tls-cert-name={}",
                    marin3r_wire::secret_keys::TLS_CRT
                ));
            } else if s.starts_with("--tls-key-name=") {
                *arg = json!(format!(
                    "--tls-key-name={}",
                    marin3r_wire::secret_keys::TLS_KEY
                ));
            }
        }
        let Some(dir) = dir else { continue };
        if let Some(mounts) = c["volumeMounts"].as_array_mut() {
            if let Some(i) = mounts.iter().position(|m| m["mountPath"] == dir.as_str()) {
                tls_volume = mounts[i]["name"].as_str().map(str::to_string);
                mounts.remove(i);
            }
            if mounts.is_empty()
                && let Some(c) = c.as_object_mut()
            {
                c.remove("volumeMounts");
            }
        }
    }
    let tls_volume = tls_volume
        .ok_or_else(|| invalid(path, "no container mounts its --tls-dir from a volume"))?;
    if let Some(volumes) = pod["volumes"].as_array_mut() {
        volumes.retain(|v| v["name"] != tls_volume.as_str());
        if volumes.is_empty()
            && let Some(pod) = pod.as_object_mut()
        {
            pod.remove("volumes");
        }
    }
    Ok(deployment)
}

/// Whether `resource` of `group` is cluster-scoped (the ones marin3r's tables can name).
fn cluster_scoped(group: &str, resource: &str) -> bool {
    let base = resource.split('/').next().unwrap_or(resource);
    matches!(
        (group, base),
        ("", "namespaces" | "nodes" | "persistentvolumes")
            | ("apiextensions.k8s.io", "customresourcedefinitions")
            | ("scheduling.k8s.io", "priorityclasses")
            | (
                "rbac.authorization.k8s.io",
                "clusterroles" | "clusterrolebindings"
            )
            | ("authentication.k8s.io", "tokenreviews")
            | ("authorization.k8s.io", "subjectaccessreviews")
            | ("admissionregistration.k8s.io", _)
            | ("security.openshift.io", "securitycontextconstraints")
    )
}

/// RBAC rules split into those on namespaced resources (the CSV's `permissions`, granted
/// in the target namespaces) and those naming a cluster-scoped resource
/// (`clusterPermissions`).
fn split_by_scope<'a>(rules: impl Iterator<Item = &'a Value>) -> (Vec<Value>, Vec<Value>) {
    let mut namespaced = Vec::new();
    let mut cluster = Vec::new();
    for rule in rules {
        let groups: Vec<&str> = rule["apiGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let scoped = rule["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|r| groups.iter().any(|g| cluster_scoped(g, r)));
        if scoped {
            cluster.push(rule.clone());
        } else {
            namespaced.push(rule.clone());
        }
    }
    (namespaced, cluster)
}

/// `permissions` and `clusterPermissions` of the install strategy: the operator's
/// ClusterRole and leader-election Role (split by scope), and the webhook's
/// ServiceAccount with no rules (OLM creates the ServiceAccounts it names).
fn permissions(operator: &Value, webhook: &Value) -> Result<(Vec<Value>, Vec<Value>), Error> {
    let operator_sa = operator["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .ok_or_else(|| invalid(source::OPERATOR_DEPLOYMENT.0, "no serviceAccountName"))?;
    let webhook_sa = webhook["spec"]["template"]["spec"]["serviceAccountName"]
        .as_str()
        .ok_or_else(|| invalid(source::WEBHOOK_DEPLOYMENT.0, "no serviceAccountName"))?;
    let cluster_role = one(source::OPERATOR_CLUSTER_ROLE, "ClusterRole")?;
    let lease_role = one(source::OPERATOR_LEASE_ROLE, "Role")?;
    let (namespaced, cluster) = split_by_scope(
        cluster_role["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(lease_role["rules"].as_array().into_iter().flatten()),
    );
    let mut permissions = vec![json!({"serviceAccountName": operator_sa, "rules": namespaced})];
    if webhook_sa != operator_sa {
        permissions.push(json!({"serviceAccountName": webhook_sa, "rules": []}));
    }
    let cluster_permissions = if cluster.is_empty() {
        Vec::new()
    } else {
        vec![json!({"serviceAccountName": operator_sa, "rules": cluster})]
    };
    Ok((permissions, cluster_permissions))
}

/// The webhook configurations of the kustomize install as `webhookdefinitions`, served
/// by the Deployment the Service selects, on the container port it targets.
fn webhook_definitions(webhook: &Value) -> Result<Vec<Value>, Error> {
    let (path, _) = source::WEBHOOK_CONFIGURATIONS;
    let services = documents(source::WEBHOOK_SERVICE)?;
    let pod_labels = &webhook["spec"]["template"]["metadata"]["labels"];
    let containers = webhook["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut out = Vec::new();
    for config in documents(source::WEBHOOK_CONFIGURATIONS)? {
        let kind = match config["kind"].as_str() {
            Some("MutatingWebhookConfiguration") => "MutatingAdmissionWebhook",
            Some("ValidatingWebhookConfiguration") => "ValidatingAdmissionWebhook",
            other => return Err(invalid(path, format!("unexpected kind {other:?}"))),
        };
        for hook in config["webhooks"].as_array().into_iter().flatten() {
            let hook_name = hook["name"].as_str().unwrap_or_default();
            let svc_ref = &hook["clientConfig"]["service"];
            let service = services
                .iter()
                .find(|s| s["metadata"]["name"] == svc_ref["name"])
                .ok_or_else(|| {
                    invalid(path, format!("{hook_name}: no Service {}", svc_ref["name"]))
                })?;
            let selected = service["spec"]["selector"]
                .as_object()
                .is_some_and(|sel| sel.iter().all(|(k, v)| pod_labels[k] == *v));
            if !selected {
                return Err(invalid(
                    path,
                    format!("{hook_name}: its Service does not select the webhook Deployment"),
                ));
            }
            let port = service["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["port"] == svc_ref["port"])
                .ok_or_else(|| {
                    invalid(
                        path,
                        format!("{hook_name}: no Service port {}", svc_ref["port"]),
                    )
                })?;
            let target = match &port["targetPort"] {
                Value::String(named) => containers
                    .iter()
                    .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
                    .find(|p| p["name"] == named.as_str())
                    .map(|p| p["containerPort"].clone())
                    .ok_or_else(|| {
                        invalid(path, format!("{hook_name}: no container port {named}"))
                    })?,
                n => n.clone(),
            };
            if hook.get("namespaceSelector").is_some() {
                return Err(invalid(
                    path,
                    format!("{hook_name}: namespaceSelector is OLM's (from the OperatorGroup)"),
                ));
            }
            let mut def = Map::new();
            def.insert("type".into(), json!(kind));
            def.insert("generateName".into(), json!(hook_name));
            def.insert("deploymentName".into(), json!(name_of(webhook)));
            def.insert("containerPort".into(), svc_ref["port"].clone());
            def.insert("targetPort".into(), target);
            def.insert("webhookPath".into(), svc_ref["path"].clone());
            for field in [
                "admissionReviewVersions",
                "sideEffects",
                "failurePolicy",
                "matchPolicy",
                "objectSelector",
                "reinvocationPolicy",
                "rules",
                "timeoutSeconds",
            ] {
                if let Some(v) = hook.get(field) {
                    def.insert(field.into(), v.clone());
                }
            }
            out.push(Value::Object(def));
        }
    }
    Ok(out)
}

/// The `alm-examples` documents.
pub fn alm_examples() -> Result<Vec<Value>, Error> {
    documents(source::ALM_EXAMPLES)
}

/// The ClusterServiceVersion.
pub fn csv() -> Result<Value, Error> {
    let operator = operator_deployment()?;
    let webhook = webhook_deployment()?;
    let (permissions, cluster_permissions) = permissions(&operator, &webhook)?;
    let webhooks = webhook_definitions(&webhook)?;
    let marin3r_image = operator["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .ok_or_else(|| invalid(source::OPERATOR_DEPLOYMENT.0, "no image"))?
        .to_string();
    let examples = serde_json::to_string_pretty(&alm_examples()?)
        .map_err(|e| invalid(source::ALM_EXAMPLES.0, e.to_string()))?;
    let internal: Vec<String> = owned_crds()
        .iter()
        .filter(|c| INTERNAL_KINDS.contains(&c.spec.names.kind.as_str()))
        .filter_map(|c| c.metadata.name.clone())
        .collect();
    let internal =
        serde_json::to_string(&internal).map_err(|e| invalid("internal-objects", e.to_string()))?;
    let mut install = Map::new();
    if !cluster_permissions.is_empty() {
        install.insert("clusterPermissions".into(), json!(cluster_permissions));
    }
    install.insert(
        "deployments".into(),
        json!([deployment_entry(&operator), deployment_entry(&webhook)]),
    );
    install.insert("permissions".into(), json!(permissions));
    let annotations: BTreeMap<&str, String> = BTreeMap::from([
        ("alm-examples", examples),
        ("capabilities", "Seamless Upgrades".into()),
        ("categories", "Networking".into()),
        ("containerImage", marin3r_image.clone()),
        (
            "description",
            "CRD-driven Envoy control plane: sidecar injection, xDS discovery service, operator"
                .into(),
        ),
        ("operators.operatorframework.io/internal-objects", internal),
        (
            "operatorframework.io/suggested-namespace",
            SUGGESTED_NAMESPACE.into(),
        ),
        ("repository", env!("CARGO_PKG_REPOSITORY").into()),
        ("support", "marin3r-rs".into()),
        // OpenShift's infrastructure features (docs/olm.md "OpenShift features").
        (
            "features.operators.openshift.io/disconnected",
            "false".into(),
        ),
        (
            "features.operators.openshift.io/fips-compliant",
            "false".into(),
        ),
        (
            "features.operators.openshift.io/proxy-aware",
            "false".into(),
        ),
        (
            "features.operators.openshift.io/tls-profiles",
            "false".into(),
        ),
        (
            "features.operators.openshift.io/token-auth-aws",
            "false".into(),
        ),
        (
            "features.operators.openshift.io/token-auth-azure",
            "false".into(),
        ),
        (
            "features.operators.openshift.io/token-auth-gcp",
            "false".into(),
        ),
        ("features.operators.openshift.io/cnf", "false".into()),
        ("features.operators.openshift.io/cni", "false".into()),
        ("features.operators.openshift.io/csi", "false".into()),
    ]);
    Ok(json!({
        "apiVersion": "operators.coreos.com/v1alpha1",
        "kind": "ClusterServiceVersion",
        "metadata": {
            "name": csv_name(),
            "annotations": annotations,
            "labels": {
                "operatorframework.io/arch.amd64": "supported",
                "operatorframework.io/os.linux": "supported",
            },
        },
        "spec": {
            "displayName": "MARIN3R (marin3r-rs)",
            "description": DESCRIPTION,
            "version": VERSION,
            "minKubeVersion": MIN_KUBE_VERSION,
            "maturity": "alpha",
            "provider": {"name": "marin3r-rs"},
            "maintainers": [{"name": "marin3r-rs", "email": "marin3r-rs@example.invalid"}],
            "links": [{"name": "Source", "url": env!("CARGO_PKG_REPOSITORY")}],
            "keywords": ["envoy", "xds", "control plane", "sidecar", "proxy", "discovery service"],
            "installModes": [
                {"type": "OwnNamespace", "supported": true},
                {"type": "SingleNamespace", "supported": true},
                {"type": "MultiNamespace", "supported": false},
                {"type": "AllNamespaces", "supported": true},
            ],
            "install": {"strategy": "deployment", "spec": install},
            "customresourcedefinitions": {"owned": owned_entries()},
            "webhookdefinitions": webhooks,
            "relatedImages": [
                {"name": "marin3r", "image": marin3r_image},
                {"name": "envoy", "image": marin3r_wire::images::ENVOY},
            ],
        },
    }))
}

/// The CSV's `spec.description` (Markdown, shown by the console).
const DESCRIPTION: &str = "marin3r-rs is a Rust implementation of MARIN3R, the CRD-driven \
Envoy control plane for Kubernetes.\n\n\
* **EnvoyConfig**: the Envoy resources (listeners, routes, clusters, secrets, ...) of one \
node id, validated on admission and served over xDS by a discovery service.\n\
* **Sidecar injection**: Pods labelled `marin3r.3scale.net/status=enabled` get an Envoy \
sidecar configured from their annotations.\n\
* **DiscoveryService**: the operator runs a discovery service in a namespace, with its \
certificates.\n\
* **EnvoyDeployment**: the operator runs Envoy Deployments of an EnvoyConfig.\n\n\
Upstream MARIN3R (package `marin3r`) owns the same CRDs: remove its Subscription and \
ClusterServiceVersion before installing this package.";

/// `metadata/annotations.yaml`: what the bundle image's labels also say.
pub fn bundle_annotations() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1".to_string(),
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/".to_string(),
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/".to_string(),
        ),
        (
            "operators.operatorframework.io.bundle.package.v1",
            PACKAGE.to_string(),
        ),
        (
            "operators.operatorframework.io.bundle.channels.v1",
            CHANNEL.to_string(),
        ),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            CHANNEL.to_string(),
        ),
    ])
}

fn yaml<T: serde::Serialize>(path: &str, value: &T) -> Result<String, Error> {
    let text = serde_saphyr::to_string(value).map_err(|source| Error::Yaml {
        name: path.to_string(),
        source,
    })?;
    Ok(format!("{OLM_GENERATED_HEADER}{text}"))
}

/// Every file of the bundle: (path under `manifests/olm/bundle/`, content).
pub fn bundle_files() -> Result<Vec<(String, String)>, Error> {
    let mut files = Vec::new();
    let csv_path = format!("manifests/{PACKAGE}.clusterserviceversion.yaml");
    files.push((csv_path.clone(), yaml(&csv_path, &csv()?)?));
    for crd in owned_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let (plural, group) = name.split_once('.').unwrap_or((&name, ""));
        let path = format!("manifests/{group}_{plural}.yaml");
        files.push((path.clone(), yaml(&path, &crd)?));
    }
    let mut pdb = one(source::WEBHOOK_PDB, "PodDisruptionBudget")?;
    if let Some(meta) = pdb["metadata"].as_object_mut() {
        meta.remove("namespace");
    }
    let path = format!(
        "manifests/{}_policy_v1_poddisruptionbudget.yaml",
        name_of(&pdb)
    );
    files.push((path.clone(), yaml(&path, &pdb)?));
    let pc = one(source::PRIORITY_CLASS, "PriorityClass")?;
    let path = format!(
        "manifests/{}_scheduling.k8s.io_v1_priorityclass.yaml",
        name_of(&pc)
    );
    files.push((path.clone(), yaml(&path, &pc)?));
    let path = "metadata/annotations.yaml".to_string();
    files.push((
        path.clone(),
        yaml(&path, &json!({"annotations": bundle_annotations()}))?,
    ));
    files.sort();
    Ok(files)
}

/// The file-based catalog's documents: package, channel, bundle.
pub fn catalog() -> Result<Vec<Value>, Error> {
    let csv = csv()?;
    let mut properties = vec![json!({
        "type": "olm.package",
        "value": {"packageName": PACKAGE, "version": VERSION},
    })];
    for (group, version, kind) in owned_gvks() {
        properties.push(json!({
            "type": "olm.gvk",
            "value": {"group": group, "version": version, "kind": kind},
        }));
    }
    let mut related = vec![json!({"name": "", "image": bundle_image()})];
    related.extend(
        csv["spec"]["relatedImages"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
    );
    Ok(vec![
        json!({
            "schema": "olm.package",
            "name": PACKAGE,
            "defaultChannel": CHANNEL,
            "description": csv["metadata"]["annotations"]["description"],
        }),
        json!({
            "schema": "olm.channel",
            "package": PACKAGE,
            "name": CHANNEL,
            "entries": [{"name": csv_name()}],
        }),
        json!({
            "schema": "olm.bundle",
            "package": PACKAGE,
            "name": csv_name(),
            "image": bundle_image(),
            "properties": properties,
            "relatedImages": related,
        }),
    ])
}

/// Every file of the catalog: (path under `manifests/olm/catalog/`, content).
pub fn catalog_files() -> Result<Vec<(String, String)>, Error> {
    let path = format!("{PACKAGE}/catalog.yaml");
    let mut text = OLM_GENERATED_HEADER.to_string();
    for doc in catalog()? {
        let body = serde_saphyr::to_string(&doc).map_err(|source| Error::Yaml {
            name: path.clone(),
            source,
        })?;
        text.push_str("---\n");
        text.push_str(&body);
    }
    Ok(vec![(path, text)])
}

/// The namespace of the one-file installs.
const INSTALL_NAMESPACE: &str = SUGGESTED_NAMESPACE;
/// The OLM v1 installer ServiceAccount (and its ClusterRole and binding).
const INSTALLER: &str = "marin3r-rs-installer";

/// `manifests/olm/olm-install.yaml`: OLM v0 (OpenShift 4, or `operator-sdk olm install`):
/// the namespace, the catalog in it (so that the file works on any cluster, whatever the
/// global catalog namespace is), an OperatorGroup for every namespace (AllNamespaces) and
/// the Subscription to the `stable` channel.
pub fn install_v0() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": INSTALL_NAMESPACE,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
            },
        }),
        json!({
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "CatalogSource",
            "metadata": {"name": PACKAGE, "namespace": INSTALL_NAMESPACE},
            "spec": {
                "sourceType": "grpc",
                "image": catalog_image(),
                "displayName": "marin3r-rs",
                "publisher": "marin3r-rs",
                "grpcPodConfig": {"securityContextConfig": "restricted"},
                "updateStrategy": {"registryPoll": {"interval": "60m"}},
            },
        }),
        json!({
            "apiVersion": "operators.coreos.com/v1",
            "kind": "OperatorGroup",
            "metadata": {"name": PACKAGE, "namespace": INSTALL_NAMESPACE},
            "spec": {},
        }),
        json!({
            "apiVersion": "operators.coreos.com/v1alpha1",
            "kind": "Subscription",
            "metadata": {"name": PACKAGE, "namespace": INSTALL_NAMESPACE},
            "spec": {
                "channel": CHANNEL,
                "name": PACKAGE,
                "source": PACKAGE,
                "sourceNamespace": INSTALL_NAMESPACE,
                "installPlanApproval": "Automatic",
            },
        }),
    ]
}

/// `manifests/olm/olmv1-install.yaml`: OLM v1 (operator-controller): the ClusterCatalog,
/// the namespace, the installer ServiceAccount with the permissions to manage what the
/// bundle holds, and the ClusterExtension (AllNamespaces: OLM v1 installs registry+v1
/// bundles watching every namespace).
pub fn install_v1() -> Vec<Value> {
    let verbs = json!([
        "create", "delete", "get", "list", "patch", "update", "watch"
    ]);
    let rule = |group: &str, resources: Value| json!({"apiGroups": [group], "resources": resources, "verbs": verbs});
    let mut rbac_rule = rule(
        "rbac.authorization.k8s.io",
        json!([
            "clusterroles",
            "clusterrolebindings",
            "roles",
            "rolebindings"
        ]),
    );
    // Granting the operator's permissions without holding them all.
    if let Some(v) = rbac_rule["verbs"].as_array_mut() {
        v.extend([json!("bind"), json!("escalate")]);
    }
    vec![
        json!({
            "apiVersion": "olm.operatorframework.io/v1",
            "kind": "ClusterCatalog",
            "metadata": {"name": PACKAGE},
            "spec": {
                "source": {
                    "type": "Image",
                    "image": {"ref": catalog_image(), "pollIntervalMinutes": 60},
                },
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": INSTALL_NAMESPACE,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
            },
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": INSTALLER, "namespace": INSTALL_NAMESPACE},
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": INSTALLER},
            "rules": [
                {
                    "apiGroups": ["olm.operatorframework.io"],
                    "resources": ["clusterextensions/finalizers"],
                    "verbs": ["update"],
                    "resourceNames": [PACKAGE],
                },
                rule("apiextensions.k8s.io", json!(["customresourcedefinitions"])),
                rbac_rule,
                rule("apps", json!(["deployments"])),
                rule("", json!(["serviceaccounts", "services"])),
                rule("policy", json!(["poddisruptionbudgets"])),
                rule("scheduling.k8s.io", json!(["priorityclasses"])),
                rule(
                    "admissionregistration.k8s.io",
                    json!(["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]),
                ),
                // The webhook's serving certificate (OLM v1's cert-manager provider).
                rule("cert-manager.io", json!(["certificates", "issuers"])),
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": INSTALLER},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": INSTALLER,
            },
            "subjects": [{
                "kind": "ServiceAccount",
                "name": INSTALLER,
                "namespace": INSTALL_NAMESPACE,
            }],
        }),
        json!({
            "apiVersion": "olm.operatorframework.io/v1",
            "kind": "ClusterExtension",
            "metadata": {"name": PACKAGE},
            "spec": {
                "namespace": INSTALL_NAMESPACE,
                "serviceAccount": {"name": INSTALLER},
                "source": {
                    "sourceType": "Catalog",
                    "catalog": {
                        "packageName": PACKAGE,
                        "channels": [CHANNEL],
                        "selector": {"matchLabels": {"olm.operatorframework.io/metadata.name": PACKAGE}},
                    },
                },
            },
        }),
    ]
}

/// A YAML stream of `docs` with `comment` (`# `-prefixed lines) after the header.
fn stream_file(path: &str, comment: &str, docs: &[Value]) -> Result<String, Error> {
    let mut text = OLM_GENERATED_HEADER.to_string();
    for line in comment.lines() {
        text.push_str(format!("# {line}").trim_end());
        text.push('\n');
    }
    for doc in docs {
        let body = serde_saphyr::to_string(doc).map_err(|source| Error::Yaml {
            name: path.to_string(),
            source,
        })?;
        text.push_str("---\n");
        text.push_str(&body);
    }
    Ok(text)
}

/// The one-file installs: (path under `manifests/olm/`, content).
pub fn install_files() -> Result<Vec<(String, String)>, Error> {
    Ok(vec![
        (
            "olm-install.yaml".to_string(),
            stream_file(
                "olm-install.yaml",
                "marin3r-rs through OLM v0 (OpenShift 4, or a cluster with `operator-sdk olm install`),\n\
                 watching every namespace (docs/olm.md):\n\n  kubectl apply -f manifests/olm/olm-install.yaml\n\n\
                 Remove upstream MARIN3R's Subscription and ClusterServiceVersion first: both own the same CRDs.",
                &install_v0(),
            )?,
        ),
        (
            "olmv1-install.yaml".to_string(),
            stream_file(
                "olmv1-install.yaml",
                "marin3r-rs through OLM v1 (operator-controller), watching every namespace (docs/olm.md).\n\
                 The webhooks need operator-controller's webhook support (a certificate provider:\n\
                 cert-manager, or OpenShift's service CA).\n\n  kubectl apply -f manifests/olm/olmv1-install.yaml",
                &install_v1(),
            )?,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_on_cluster_scoped_resources_are_cluster_permissions() {
        let rules = [
            json!({"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}),
            json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}),
            json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get"]}),
            json!({"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get"]}),
        ];
        let (namespaced, cluster) = split_by_scope(rules.iter());
        assert_eq!(namespaced, vec![rules[0].clone(), rules[2].clone()]);
        assert_eq!(cluster, vec![rules[1].clone(), rules[3].clone()]);
    }
}
