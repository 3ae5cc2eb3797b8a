//! Multi-tenancy (docs/security.md, "Tenants"), on the test control plane's real kube-apiserver:
//! - the example admission policy `deploy/examples/tenant-annotations-policy.yaml` lets a tenant's
//!   Services name only the address pools and AWS resources its allowances list;
//! - each shipped workload meets the Pod Security Standard level docs/security.md gives it, for the
//!   reasons it gives (the API server's PodSecurity admission says which checks fail).

mod support;

use std::{process::Command, time::Duration};

use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use support::{admin, eventually};
use test_control_plane::{apply_manifest, control_plane, unique_name, workspace_root};

const POLICY: &str = "deploy/examples/tenant-annotations-policy.yaml";
const TENANT_LABEL: &str = "ccm.rs/tenant";
const POOL: &str = "local.ccm.rs/address-pool";
const SECURITY_GROUPS: &str = "service.beta.kubernetes.io/aws-load-balancer-security-groups";
/// The example's allowances for tenant `team-a`.
const TEAM_A_GROUP: &str = "sg-0a1a1a1a1a1a1a1a1";
const TEAM_A_CERT: &str =
    "arn:aws:acm:us-west-2:111122223333:certificate/0a1a1a1a-0a1a-0a1a-0a1a-0a1a1a1a1a1a";

async fn create_namespace(labels: Value) -> String {
    let name = unique_name("tenancy");
    let namespaces: Api<Namespace> = Api::all(admin().await);
    let namespace: Namespace =
        serde_json::from_value(json!({ "metadata": { "name": name, "labels": labels } })).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace created");
    name
}

fn service(name: &str, service_type: &str, annotations: &[(&str, &str)]) -> Service {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    serde_json::from_value(json!({
        "metadata": { "name": name, "annotations": annotations },
        "spec": {
            "type": service_type,
            "selector": { "app": name },
            "ports": [{ "port": 80, "targetPort": 8080, "protocol": "TCP" }],
        }
    }))
    .unwrap()
}

/// The API server's refusal of a Service (`None`: admitted), as a server-side dry run unless `real`.
async fn refusal(namespace: &str, service: &Service, real: bool) -> Option<String> {
    let api: Api<Service> = Api::namespaced(admin().await, namespace);
    let params = PostParams {
        dry_run: !real,
        ..Default::default()
    };
    match api.create(&params, service).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) if status.code == 403 => Some(status.message),
        Err(err) => panic!("creating a Service in {namespace}: {err}"),
    }
}

/// Waits until the API server refuses `service` with a message containing `expected` (the policy and
/// its parameters load a moment after they are written), and returns the message.
async fn refused_with(namespace: &str, service: &Service, expected: &str) -> String {
    eventually(
        &format!("a refusal saying {expected:?}"),
        Duration::from_secs(30),
        || async {
            refusal(namespace, service, false)
                .await
                .filter(|m| m.contains(expected))
        },
    )
    .await
}

fn kubectl_admin(args: &[&str]) {
    let kubeconfig = control_plane().admin_kubeconfig();
    let status = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(args)
        .env_remove("KUBECONFIG")
        .status()
        .expect("kubectl runs");
    assert!(status.success(), "kubectl {args:?}: {status}");
}

#[tokio::test]
async fn a_tenant_may_name_only_its_own_pools_and_aws_resources() {
    let client = admin().await;
    let yaml = std::fs::read_to_string(workspace_root().join(POLICY)).unwrap();
    apply_manifest(&client, &yaml, false).await;
    let team_a = create_namespace(json!({ TENANT_LABEL: "team-a" })).await;
    let team_b = create_namespace(json!({ TENANT_LABEL: "team-b" })).await;
    let untenanted = create_namespace(json!({})).await;

    // Another tenant's pool is refused, naming the pool, the tenant and its own pools.
    let message = refused_with(
        &team_a,
        &service("web", "LoadBalancer", &[(POOL, "team-b")]),
        "address pool \"team-b\"",
    )
    .await;
    assert!(
        message.contains(&format!(
            "address pool \"team-b\" is not one tenant \"team-a\" may use (namespace {team_a}; its pools: team-a, shared-web)"
        )),
        "{message}"
    );
    // A security group the tenant was not given is refused, naming it and the annotation.
    let message = refused_with(
        &team_a,
        &service(
            "web",
            "LoadBalancer",
            &[(POOL, "team-a"), (SECURITY_GROUPS, "sg-0bad")],
        ),
        "sg-0bad",
    )
    .await;
    assert!(
        message.contains(&format!("may not name sg-0bad in {SECURITY_GROUPS}")),
        "{message}"
    );

    // The tenant's own pool is admitted: created for real, then deleted.
    assert_eq!(
        refusal(
            &team_a,
            &service("own-pool", "LoadBalancer", &[(POOL, "team-a")]),
            true
        )
        .await,
        None
    );
    let services: Api<Service> = Api::namespaced(client.clone(), &team_a);
    services
        .delete("own-pool", &DeleteParams::default())
        .await
        .expect("deleted");
    // So are its second pool, its security group and its certificate.
    let allowed = service(
        "web",
        "LoadBalancer",
        &[
            (POOL, " shared-web"),
            (SECURITY_GROUPS, TEAM_A_GROUP),
            (
                "service.beta.kubernetes.io/aws-load-balancer-ssl-cert",
                TEAM_A_CERT,
            ),
        ],
    );
    assert_eq!(refusal(&team_a, &allowed, false).await, None);
    // A ClusterIP Service needs no pool; a LoadBalancer Service must name one.
    assert_eq!(
        refusal(&team_a, &service("web", "ClusterIP", &[]), false).await,
        None
    );
    let message = refusal(&team_a, &service("web", "LoadBalancer", &[]), false)
        .await
        .expect("refused");
    assert!(
        message.contains("must name its address pool (annotation local.ccm.rs/address-pool: one of team-a, shared-web)"),
        "{message}"
    );

    // Every annotation that names a resource of the account is checked, value by value.
    for (annotation, value, refused) in [
        (
            "service.beta.kubernetes.io/aws-load-balancer-ssl-cert",
            "arn:aws:acm:us-west-2:111122223333:certificate/another-tenants",
            "arn:aws:acm:us-west-2:111122223333:certificate/another-tenants",
        ),
        (
            "service.beta.kubernetes.io/aws-load-balancer-eip-allocations",
            "eipalloc-0aaa,eipalloc-0bbb",
            "eipalloc-0aaa, eipalloc-0bbb",
        ),
        (
            SECURITY_GROUPS,
            "sg-0a1a1a1a1a1a1a1a1, sg-0other",
            "sg-0other",
        ),
        (
            "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups",
            "sg-0other",
            "sg-0other",
        ),
        (
            "service.beta.kubernetes.io/aws-load-balancer-subnets",
            "subnet-0a1a1a1a1a1a1a1a1,subnet-0other",
            "subnet-0other",
        ),
        (
            "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses",
            "10.0.1.10",
            "10.0.1.10",
        ),
        (
            "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name",
            "another-tenants-bucket",
            "another-tenants-bucket",
        ),
    ] {
        let message = refusal(
            &team_a,
            &service(
                "web",
                "LoadBalancer",
                &[(POOL, "team-a"), (annotation, value)],
            ),
            false,
        )
        .await
        .unwrap_or_else(|| panic!("{annotation}: {value} was admitted"));
        assert!(
            message.contains(&format!(
                "tenant \"team-a\" (namespace {team_a}) may not name {refused} in {annotation} "
            )),
            "{annotation}: {message}"
        );
    }

    // Allowances are per tenant: team-b has its pool and no AWS resource.
    assert_eq!(
        refusal(
            &team_b,
            &service("web", "LoadBalancer", &[(POOL, "team-b")]),
            false
        )
        .await,
        None
    );
    let message = refusal(
        &team_b,
        &service(
            "web",
            "LoadBalancer",
            &[(POOL, "team-b"), (SECURITY_GROUPS, TEAM_A_GROUP)],
        ),
        false,
    )
    .await
    .expect("refused");
    assert!(
        message.contains(&format!("may not name {TEAM_A_GROUP} in {SECURITY_GROUPS}")),
        "{message}"
    );
    // A namespace without the label is not a tenant's: nothing is checked.
    assert_eq!(
        refusal(
            &untenanted,
            &service(
                "web",
                "LoadBalancer",
                &[(POOL, "team-b"), (SECURITY_GROUPS, "sg-0bad")]
            ),
            false
        )
        .await,
        None
    );

    // A Service admitted before its namespace became a tenant's: the manager can still add and remove
    // its finalizer (the policy judges only what the Service asks for), but the tenant cannot change its
    // annotations without complying.
    let late = create_namespace(json!({})).await;
    assert_eq!(
        refusal(
            &late,
            &service("old", "LoadBalancer", &[(POOL, "team-b")]),
            true
        )
        .await,
        None
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(
            &late,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { TENANT_LABEL: "team-a" } } })),
        )
        .await
        .expect("namespace labelled");
    let services: Api<Service> = Api::namespaced(client.clone(), &late);
    // Whether the policy refused a patch of the Service for its pool `team-b` (`Some`), let it
    // through (`None`), or failed otherwise (a panic).
    let refused_for_its_pool = |result: Result<Service, kube::Error>, what: &str| match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) if status.code == 403 => {
            assert!(
                status.message.contains("address pool \"team-b\""),
                "{}",
                status.message
            );
            Some(())
        }
        Err(err) => panic!("{what}: {err}"),
    };
    let annotate = |value: serde_json::Value| {
        let services = services.clone();
        async move {
            services
                .patch(
                    "old",
                    &PatchParams::default(),
                    &Patch::Merge(json!({ "metadata": { "annotations": { "team": value } } })),
                )
                .await
        }
    };
    eventually(
        "the namespace's label in force",
        Duration::from_secs(30),
        || async {
            if let Some(()) =
                refused_for_its_pool(annotate(json!("a")).await, "patching the Service")
            {
                return Some(());
            }
            // Not yet in force: take the change back and try again. The label may come into force
            // between the two patches: then taking it back is refused the same way.
            refused_for_its_pool(annotate(json!(null)).await, "taking the annotation back")
        },
    )
    .await;
    for finalizers in [
        json!(["service.kubernetes.io/load-balancer-cleanup"]),
        json!(null),
    ] {
        services
            .patch(
                "old",
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "finalizers": finalizers } })),
            )
            .await
            .expect("the finalizer is the manager's to change");
    }
    services
        .delete("old", &DeleteParams::default())
        .await
        .expect("deleted");

    // The policies go; the namespaces stay (no namespace controller runs here).
    kubectl_admin(&[
        "delete",
        "--ignore-not-found",
        "-f",
        workspace_root().join(POLICY).to_str().unwrap(),
    ]);
}

/// A shipped workload and the Pod Security Standard level docs/security.md gives it.
struct Workload {
    /// The kustomize directory that renders it.
    dir: &'static str,
    kind: &'static str,
    name: &'static str,
    /// What PodSecurity "baseline" refuses in it as shipped, besides the host network, the probes' host
    /// (which every workload has) and the host ports of the containers' `ports:`.
    baseline_also: &'static [&'static str],
    /// The level it would meet without the host network and the probes' host.
    without_host_access: &'static str,
    /// What "restricted" (or, for a workload that stays privileged, "baseline") still refuses then.
    still_refused: &'static [&'static str],
}

const WORKLOADS: [Workload; 6] = [
    Workload {
        dir: "deploy/base",
        kind: "Deployment",
        name: "cloud-controller-manager",
        baseline_also: &[],
        without_host_access: "restricted",
        still_refused: &[],
    },
    Workload {
        dir: "deploy/overlays/aws",
        kind: "Deployment",
        name: "cloud-controller-manager",
        baseline_also: &[],
        without_host_access: "restricted",
        still_refused: &[],
    },
    Workload {
        dir: "deploy/overlays/local",
        kind: "Deployment",
        name: "cloud-controller-manager",
        baseline_also: &[],
        without_host_access: "baseline",
        still_refused: &["runAsNonRoot != true", "runAsUser=0"],
    },
    Workload {
        dir: "deploy/overlays/local-daemonset",
        kind: "DaemonSet",
        name: "cloud-controller-manager",
        baseline_also: &[],
        without_host_access: "baseline",
        still_refused: &["runAsNonRoot != true", "runAsUser=0"],
    },
    Workload {
        dir: "deploy/overlays/local-agents",
        kind: "Deployment",
        name: "cloud-controller-manager",
        baseline_also: &[],
        without_host_access: "restricted",
        still_refused: &[],
    },
    Workload {
        dir: "deploy/overlays/local-agents",
        kind: "DaemonSet",
        name: "local-agent",
        baseline_also: &[
            "non-default capabilities (container \"local-agent\" must not include \"NET_ADMIN\", \"NET_RAW\"",
            "hostPath volumes (volume \"handover\")",
        ],
        without_host_access: "privileged",
        still_refused: &[
            "non-default capabilities (container \"local-agent\" must not include \"NET_ADMIN\", \"NET_RAW\"",
        ],
    },
];

fn render(dir: &str) -> Vec<Value> {
    let path = workspace_root().join(dir);
    let output = Command::new("kubectl")
        .args(["kustomize", path.to_str().unwrap()])
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl kustomize {dir}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let yaml = String::from_utf8(output.stdout).unwrap();
    let documents: Vec<Option<Value>> =
        serde_saphyr::from_multiple(&yaml).unwrap_or_else(|err| panic!("{dir}: {err}"));
    documents.into_iter().flatten().collect()
}

/// PodSecurity's refusal of a pod with `spec` in `namespace` (`None`: admitted), by a server-side dry run.
async fn pod_refusal(namespace: &str, spec: &Value) -> Option<String> {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": "pod-security-probe" },
        "spec": spec,
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin().await, namespace);
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match pods.create(&params, &pod).await {
        Ok(_) => None,
        Err(kube::Error::Api(status)) if status.code == 403 => Some(status.message),
        Err(err) => panic!("a dry run of a pod in {namespace}: {err}"),
    }
}

#[tokio::test]
async fn every_workload_meets_the_pod_security_level_docs_security_md_gives() {
    let mut enforcing = std::collections::BTreeMap::new();
    for level in ["restricted", "baseline", "privileged"] {
        let namespace =
            create_namespace(json!({ "pod-security.kubernetes.io/enforce": level })).await;
        enforcing.insert(level, namespace);
    }
    let docs = std::fs::read_to_string(workspace_root().join("docs/security.md")).unwrap();
    for w in &WORKLOADS {
        let what = format!("{} {} {}", w.dir, w.kind, w.name);
        let object = render(w.dir)
            .into_iter()
            .find(|o| o["kind"] == w.kind && o["metadata"]["name"] == w.name)
            .unwrap_or_else(|| panic!("{what}: not rendered"));
        let mut spec = object["spec"]["template"]["spec"].clone();
        let container = w.name;

        // As shipped: privileged, because of the host network (which also makes every containerPort a
        // hostPort: the agent lists none, so that two of its pods fit on a node during a roll) and the
        // probes' host 127.0.0.1.
        assert_eq!(
            pod_refusal(&enforcing["privileged"], &spec).await,
            None,
            "{what}"
        );
        let refused = pod_refusal(&enforcing["baseline"], &spec)
            .await
            .unwrap_or_else(|| panic!("{what}: admitted by baseline"));
        let lists_ports = spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c.get("ports").is_some());
        let mut host_access = vec![
            "host namespaces (hostNetwork=true)".to_owned(),
            format!(
                "probe or lifecycle host (container \"{container}\" uses probe or lifecycle host \"127.0.0.1\")"
            ),
        ];
        if lists_ports {
            host_access.push(format!("hostPort (container \"{container}\" uses hostPort"));
        } else {
            assert!(
                !refused.contains("hostPort"),
                "{what}: no ports listed, yet {refused}"
            );
        }
        for reason in host_access
            .iter()
            .map(String::as_str)
            .chain(w.baseline_also.iter().copied())
        {
            assert!(
                refused.contains(reason),
                "{what}: {reason:?} not in {refused}"
            );
        }

        // Without the host access, the level the pod's own settings meet.
        spec.as_object_mut().unwrap().remove("hostNetwork");
        let host_paths: Vec<String> = spec["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v.get("hostPath").is_some())
            .map(|v| v["name"].as_str().unwrap().to_owned())
            .collect();
        if let Some(volumes) = spec["volumes"].as_array_mut() {
            volumes.retain(|v| v.get("hostPath").is_none());
        }
        for c in spec["containers"].as_array_mut().unwrap() {
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                let get = c
                    .get_mut(probe)
                    .and_then(|p| p.get_mut("httpGet"))
                    .and_then(Value::as_object_mut);
                if let Some(get) = get {
                    get.remove("host");
                }
            }
            if let Some(mounts) = c["volumeMounts"].as_array_mut() {
                mounts.retain(|m| !host_paths.iter().any(|h| m["name"] == h.as_str()));
            }
        }
        let stricter = match w.without_host_access {
            "restricted" => None,
            "baseline" => Some("restricted"),
            _ => Some("baseline"),
        };
        if w.without_host_access != "privileged" {
            assert_eq!(
                pod_refusal(&enforcing[w.without_host_access], &spec).await,
                None,
                "{what}: without host access, refused by {}",
                w.without_host_access
            );
        }
        if let Some(stricter) = stricter {
            let refused = pod_refusal(&enforcing[stricter], &spec)
                .await
                .unwrap_or_else(|| panic!("{what}: without host access, admitted by {stricter}"));
            for reason in w.still_refused {
                assert!(
                    refused.contains(reason),
                    "{what}: {reason:?} not in {refused}"
                );
            }
        }

        // docs/security.md says so.
        let row = format!(
            "| `{}` {} `{}` | privileged | {} |",
            w.dir, w.kind, w.name, w.without_host_access
        );
        assert!(
            docs.contains(&row),
            "docs/security.md has no row starting {row}"
        );
    }
}
