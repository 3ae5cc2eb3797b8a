//! The shadow report: per object the latest write the manager would have made, deduplicated (the
//! controllers requeue and resync), and its JSON form at `/dry-run`, classified against the current
//! state of the cluster and the cloud.

use parking_lot::Mutex;
use std::{
    collections::{BTreeMap, VecDeque},
    sync::Arc,
};

use cloud_provider::{CloudProvider, LoadBalancerPreview, Route};
use futures::{StreamExt, stream};
use k8s_openapi::{
    api::core::v1::{Node, Service},
    jiff::Timestamp,
};
use serde::Serialize;
use serde_json::{Value, json};

use super::metrics::DryRunMetrics;

/// How many of the latest would-be events the report keeps.
const EVENTS_KEPT: usize = 100;
/// How many objects the report classifies at once (one GET or cloud read each).
const CLASSIFY_AT_ONCE: usize = 16;

/// An API object (or one of its subresources) a write is about.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectKey {
    /// `v1`, or `group/version`.
    pub api_version: String,
    /// The resource (plural): `nodes`, `services`.
    pub resource: String,
    /// The namespace of a namespaced object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The object's name (for a create, the name in the body).
    pub name: String,
    /// `status`, for a write of the status subresource.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subresource: Option<String>,
}

impl ObjectKey {
    /// The object's own path (without subresource), to read it back.
    pub fn object_path(&self) -> String {
        let base = if self.api_version.contains('/') {
            format!("/apis/{}", self.api_version)
        } else {
            format!("/api/{}", self.api_version)
        };
        match &self.namespace {
            Some(ns) => format!("{base}/namespaces/{ns}/{}/{}", self.resource, self.name),
            None => format!("{base}/{}/{}", self.resource, self.name),
        }
    }

    fn describe(&self) -> String {
        let mut text = self.resource.clone();
        if let Some(ns) = &self.namespace {
            text = format!("{text} {ns}/{}", self.name);
        } else {
            text = format!("{text}/{}", self.name);
        }
        if let Some(sub) = &self.subresource {
            text = format!("{text} {sub}");
        }
        text
    }
}

/// A write the API server answered (as a dry run).
#[derive(Clone, Debug)]
pub struct ApiWrite {
    /// POST, PUT, PATCH, DELETE.
    pub verb: String,
    /// The request's path.
    pub path: String,
    /// The request body (JSON, or the text when not JSON).
    pub body: Value,
    /// The answer's HTTP status.
    pub status: u16,
    /// The answer (the object as the write would leave it, or a Status).
    pub answer: Value,
}

#[derive(Clone, Debug)]
struct Seen {
    count: u64,
    first: Timestamp,
    last: Timestamp,
}

impl Seen {
    fn now() -> Self {
        let now = Timestamp::now();
        Self {
            count: 1,
            first: now,
            last: now,
        }
    }
    fn again(&mut self) {
        self.count += 1;
        self.last = Timestamp::now();
    }
    fn json(&self) -> Value {
        json!({"count": self.count, "firstSeen": self.first.to_string(), "lastSeen": self.last.to_string()})
    }
}

/// A cloud object the shadow intercepted a write to.
#[derive(Clone, Debug)]
pub enum CloudObject {
    /// A Service's load balancer, with what the controller last asked for.
    LoadBalancer {
        /// The Service.
        service: Arc<Service>,
        /// The backends it asked for.
        nodes: Arc<Vec<Arc<Node>>>,
        /// Whether the last call was a delete.
        delete: bool,
    },
    /// A route to create or delete.
    Route {
        /// The route.
        route: Route,
        /// Create (else delete).
        create: bool,
    },
}

#[derive(Clone, Debug)]
struct CloudEntry {
    object: CloudObject,
    call: &'static str,
    preview: Value,
    seen: Seen,
}

#[derive(Default)]
struct Entries {
    api: BTreeMap<ObjectKey, (ApiWrite, Seen)>,
    events_total: u64,
    events: VecDeque<Value>,
    cloud: BTreeMap<String, CloudEntry>,
}

/// What shadow mode would have written. Cheap to clone; shared by the API clients' layers, the shadow
/// cloud and the endpoint.
#[derive(Clone)]
pub struct ShadowReport {
    entries: Arc<Mutex<Entries>>,
    metrics: DryRunMetrics,
}

impl ShadowReport {
    /// An empty report counting into `metrics`.
    pub fn new(metrics: DryRunMetrics) -> Self {
        Self {
            entries: Arc::default(),
            metrics,
        }
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Entries> {
        self.entries.lock()
    }

    /// Records a would-be API write to `key`; logs it at info when it is new or differs from the last one
    /// recorded for the object (repeats at debug).
    pub fn record_write(&self, key: ObjectKey, write: ApiWrite) {
        self.metrics.write(&key.resource, &write.verb);
        let mut entries = self.lock();
        let repeat = match entries.api.get_mut(&key) {
            Some((last, seen)) => {
                let same = last.verb == write.verb && last.body == write.body;
                seen.again();
                *last = write.clone();
                same
            }
            None => {
                entries
                    .api
                    .insert(key.clone(), (write.clone(), Seen::now()));
                false
            }
        };
        let objects = entries.api.len();
        drop(entries);
        self.metrics.objects("api", objects);
        let what = key.describe();
        if repeat {
            tracing::debug!(object = %what, verb = %write.verb, "dry run: would {} {what} again", write.verb);
        } else {
            tracing::info!(object = %what, verb = %write.verb, status = write.status, "dry run: would {} {what}: {}", write.verb, shorten(&write.body.to_string()));
        }
    }

    /// Records a would-be event (request body of an event create or patch).
    pub fn record_event(&self, namespace: Option<&str>, body: &Value) {
        let reason = body
            .get("reason")
            .and_then(Value::as_str)
            .unwrap_or_default();
        self.metrics.event(reason);
        let regarding = body
            .get("regarding")
            .or_else(|| body.get("involvedObject"))
            .map(|r| {
                format!(
                    "{}/{}",
                    r.get("kind").and_then(Value::as_str).unwrap_or_default(),
                    r.get("name").and_then(Value::as_str).unwrap_or_default()
                )
            })
            .unwrap_or_default();
        let note = body
            .get("note")
            .or_else(|| body.get("message"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        tracing::debug!(%regarding, reason, "dry run: would record an event: {note}");
        let mut entries = self.lock();
        entries.events_total += 1;
        if entries.events.len() == EVENTS_KEPT {
            entries.events.pop_front();
        }
        entries.events.push_back(json!({
            "namespace": namespace,
            "regarding": regarding,
            "reason": reason,
            "type": body.get("type"),
            "note": note,
            "at": Timestamp::now().to_string(),
        }));
    }

    /// Records a cloud call the shadow did not make, under `key` (one entry per cloud object), with
    /// what the preview said.
    pub fn record_cloud(
        &self,
        key: String,
        call: &'static str,
        object: CloudObject,
        preview: Value,
    ) {
        let kind = preview_kind(&preview);
        self.metrics.cloud_write(call, &kind);
        let mut entries = self.lock();
        let changed = match entries.cloud.get_mut(&key) {
            Some(entry) => {
                let changed = entry.call != call || entry.preview != preview;
                entry.seen.again();
                entry.object = object;
                entry.call = call;
                entry.preview = preview.clone();
                changed
            }
            None => {
                entries.cloud.insert(
                    key.clone(),
                    CloudEntry {
                        object,
                        call,
                        preview: preview.clone(),
                        seen: Seen::now(),
                    },
                );
                true
            }
        };
        let objects = entries.cloud.len();
        drop(entries);
        self.metrics.objects("cloud", objects);
        if kind == "upToDate" {
            tracing::debug!(object = %key, call, "dry run: {call} would change nothing");
        } else if changed {
            tracing::info!(object = %key, call, "dry run: would {call} {key}: {preview}");
        } else {
            tracing::debug!(object = %key, call, "dry run: would {call} {key} again");
        }
    }
}

/// The `kind` of a serialized [`LoadBalancerPreview`] (or of a route change).
fn preview_kind(preview: &Value) -> String {
    preview
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned()
}

/// A load-balancer preview as JSON.
pub(crate) fn preview_json(preview: &LoadBalancerPreview) -> Value {
    serde_json::to_value(preview).unwrap_or_else(|_| json!({"kind": "unknown"}))
}

fn shorten(text: &str) -> String {
    const LONGEST: usize = 2000;
    if text.len() <= LONGEST {
        return text.to_owned();
    }
    let mut end = LONGEST;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &text[..end], text.len())
}

/// The report with what it is classified against: the API server (read through `client`) and the
/// cloud (read through `cloud`, not the shadow).
pub struct ShadowView {
    /// The report.
    pub report: ShadowReport,
    /// A client to read objects back.
    pub client: kube::Client,
    /// The cloud as it is (not the shadow).
    pub cloud: Arc<dyn CloudProvider>,
    /// `--cluster-name`.
    pub cluster_name: String,
}

/// How a recorded write compares with the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Classification {
    /// It would change the object: the managers differ.
    Differing,
    /// Its dry-run answer equals the object as it is: it would change nothing.
    NoOp,
    /// The object changed (or went) since; the controller re-evaluated it then.
    Superseded,
    /// The API server refused the dry run (a conflict, say); the controller retries.
    Refused,
    /// The cloud cannot tell (its provider has no preview).
    Unknown,
    /// The cloud object matches.
    UpToDate,
}

impl ShadowView {
    /// The report as JSON, every entry classified against the state as it is now.
    pub async fn render(&self) -> Value {
        let (api, events_total, events, cloud) = {
            let entries = self.report.lock();
            (
                entries.api.clone(),
                entries.events_total,
                entries.events.iter().cloned().collect::<Vec<_>>(),
                entries.cloud.clone(),
            )
        };
        let api: Vec<Value> = stream::iter(api)
            .map(|(key, (write, seen))| async move {
                let class = self.classify_write(&key, &write).await;
                let mut entry = json!({
                    "classification": class,
                    "verb": write.verb,
                    "path": write.path,
                    "body": write.body,
                    "status": write.status,
                });
                merge(&mut entry, serde_json::to_value(&key).unwrap_or_default());
                merge(&mut entry, seen.json());
                entry
            })
            .buffered(CLASSIFY_AT_ONCE)
            .collect()
            .await;
        let routes = if cloud
            .values()
            .any(|e| matches!(e.object, CloudObject::Route { .. }))
        {
            match self.cloud.routes() {
                Some(routes) => routes.list_routes(&self.cluster_name).await.ok(),
                None => None,
            }
        } else {
            None
        };
        let routes = routes.as_deref();
        let cloud: Vec<Value> = stream::iter(cloud)
            .map(|(key, entry)| async move {
                let (class, now) = self.classify_cloud(&entry, routes).await;
                let mut out = json!({
                    "object": key,
                    "classification": class,
                    "call": entry.call,
                    "change": now,
                    "recorded": entry.preview,
                });
                merge(&mut out, entry.seen.json());
                out
            })
            .buffered(CLASSIFY_AT_ONCE)
            .collect()
            .await;
        let count = |entries: &[Value], class: &str| {
            entries
                .iter()
                .filter(|e| e["classification"] == class)
                .count()
        };
        json!({
            "dryRun": true,
            "differing": count(&api, "differing") + count(&cloud, "differing"),
            "differingApiWrites": count(&api, "differing"),
            "differingCloudWrites": count(&cloud, "differing"),
            "unknown": count(&cloud, "unknown"),
            "apiWrites": api,
            "cloudWrites": cloud,
            "events": {"total": events_total, "latest": events},
        })
    }

    async fn classify_write(&self, key: &ObjectKey, write: &ApiWrite) -> Classification {
        if write.status >= 400 {
            return Classification::Refused;
        }
        let current = self.get(&key.object_path()).await;
        match (write.verb.as_str(), current) {
            (_, Err(_)) => Classification::Differing,
            ("POST", Ok(None)) => Classification::Differing,
            ("POST", Ok(Some(_))) => Classification::Superseded,
            (_, Ok(None)) => Classification::Superseded,
            ("DELETE", Ok(Some(_))) => Classification::Differing,
            (_, Ok(Some(current))) => {
                if comparable(&current) == comparable(&write.answer) {
                    Classification::NoOp
                } else if resource_version(&current) != resource_version(&write.answer) {
                    Classification::Superseded
                } else {
                    Classification::Differing
                }
            }
        }
    }

    /// The object at `path`: `Ok(None)` when it does not exist, `Err` when it cannot be read.
    async fn get(&self, path: &str) -> Result<Option<Value>, kube::Error> {
        let request = http::Request::get(path)
            .body(Vec::new())
            .map_err(kube::Error::HttpError)?;
        match self.client.request::<Value>(request).await {
            Ok(object) => Ok(Some(object)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(err) => Err(err),
        }
    }

    async fn classify_cloud(
        &self,
        entry: &CloudEntry,
        routes: Option<&[Route]>,
    ) -> (Classification, Value) {
        match &entry.object {
            CloudObject::LoadBalancer {
                service,
                nodes,
                delete,
            } => {
                let Some(lb) = self.cloud.load_balancer() else {
                    return (Classification::Unknown, json!({"kind": "unknown"}));
                };
                if *delete {
                    return match lb.get_load_balancer(&self.cluster_name, service).await {
                        Ok(Some(_)) => (Classification::Differing, json!({"kind": "delete"})),
                        Ok(None) => (Classification::Superseded, json!({"kind": "deleted"})),
                        Err(err) => (
                            Classification::Unknown,
                            json!({"kind": "unknown", "error": err.to_string()}),
                        ),
                    };
                }
                match lb
                    .preview_load_balancer(&self.cluster_name, service, nodes)
                    .await
                {
                    Ok(preview) => {
                        let class = match preview {
                            LoadBalancerPreview::UpToDate => Classification::UpToDate,
                            LoadBalancerPreview::Create { .. }
                            | LoadBalancerPreview::Change { .. } => Classification::Differing,
                            _ => Classification::Unknown,
                        };
                        (class, preview_json(&preview))
                    }
                    Err(err) => (
                        Classification::Unknown,
                        json!({"kind": "unknown", "error": err.to_string()}),
                    ),
                }
            }
            CloudObject::Route { route, create } => {
                let Some(routes) = routes else {
                    return (Classification::Unknown, entry.preview.clone());
                };
                let present = routes.iter().any(|r| {
                    r.destination_cidr == route.destination_cidr
                        && (r.target_node == route.target_node || !create)
                });
                let class = if present == *create {
                    Classification::Superseded
                } else {
                    Classification::Differing
                };
                (class, entry.preview.clone())
            }
        }
    }
}

/// An object without what every write changes or the server fills in (resource version, managed
/// fields, generation), to tell a no-op write.
fn comparable(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["resourceVersion", "managedFields", "generation"] {
            metadata.remove(field);
        }
    }
    object
}

fn resource_version(object: &Value) -> Option<&str> {
    object.get("metadata")?.get("resourceVersion")?.as_str()
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(into), Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    fn report() -> ShadowReport {
        ShadowReport::new(DryRunMetrics::register(&mut Registry::default()))
    }

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            api_version: "v1".into(),
            resource: "nodes".into(),
            namespace: None,
            name: name.into(),
            subresource: Some("status".into()),
        }
    }

    fn patch(body: Value) -> ApiWrite {
        ApiWrite {
            verb: "PATCH".into(),
            path: "/api/v1/nodes/a/status".into(),
            body,
            status: 200,
            answer: json!({}),
        }
    }

    #[test]
    fn repeats_of_a_write_are_one_entry_with_a_count_and_the_latest_body() {
        let report = report();
        report.record_write(key("a"), patch(json!({"x": 1})));
        report.record_write(key("a"), patch(json!({"x": 1})));
        report.record_write(key("a"), patch(json!({"x": 2})));
        report.record_write(key("b"), patch(json!({"x": 1})));
        let entries = report.lock();
        assert_eq!(entries.api.len(), 2);
        let (write, seen) = &entries.api[&key("a")];
        assert_eq!(seen.count, 3);
        assert_eq!(write.body, json!({"x": 2}));
    }

    #[test]
    fn object_paths_and_no_op_comparison() {
        let mut k = key("a");
        assert_eq!(k.object_path(), "/api/v1/nodes/a");
        k.api_version = "events.k8s.io/v1".into();
        k.namespace = Some("ns".into());
        assert_eq!(
            k.object_path(),
            "/apis/events.k8s.io/v1/namespaces/ns/nodes/a"
        );
        let a = json!({"metadata": {"name": "a", "resourceVersion": "1", "managedFields": []}, "spec": {}});
        let b = json!({"metadata": {"name": "a", "resourceVersion": "2"}, "spec": {}});
        assert_eq!(comparable(&a), comparable(&b));
        assert_eq!(resource_version(&a), Some("1"));
    }

    #[test]
    fn events_are_kept_apart_and_bounded() {
        let report = report();
        for i in 0..(EVENTS_KEPT + 5) {
            report.record_event(
                Some("default"),
                &json!({"reason": "EnsuringLoadBalancer", "note": format!("n{i}"), "regarding": {"kind": "Service", "name": "web"}}),
            );
        }
        let entries = report.lock();
        assert!(entries.api.is_empty());
        assert_eq!(entries.events_total, (EVENTS_KEPT + 5) as u64);
        assert_eq!(entries.events.len(), EVENTS_KEPT);
        assert_eq!(entries.events[0]["note"], "n5");
        assert_eq!(entries.events[0]["regarding"], "Service/web");
    }
}
