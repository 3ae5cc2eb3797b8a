//! A cache's list and watch in protobuf: kube-runtime's `watcher` state machine (kube 5), with the
//! requests asking for protobuf first and each response decoded by the type it came in (kube's
//! `watcher` drives kube's JSON-only `Api`, and its state machine is private).
//!
//! The events and errors are kube-runtime's ([`watcher::Event`], [`watcher::Error`]), so the cache
//! applies them, and retries after an error with the same back-off, as it does kube's own. Like kube's
//! `watcher`, a failed request is retried from the state it failed in (a failed page from the start of
//! the list), a watch that ends is resumed from its last resource version, a watch answered `410 Gone`
//! (its resource version has left the API server's window) lists again, and a watch that hears nothing
//! for its timeout and 5 s more is reconnected.

use std::{collections::VecDeque, time::Duration};

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt, stream::BoxStream};
use http_body_util::BodyExt;
use kube::{
    Client, Resource,
    api::{ListParams, ObjectList, WatchEvent, WatchParams},
    core::{Request, Status},
    runtime::watcher,
};
use serde::de::DeserializeOwned;

use super::{
    DecodeError, ProtobufObject, decode,
    envelope::{self, ListItems, WatchEventMessage},
    frames::{Frames, Framing},
};
use crate::informers::InitialList;

/// What every request accepts: protobuf first, JSON when the API server has no protobuf for the
/// resource (client-go's `AcceptContentTypes` for a protobuf client).
const PROTOBUF_FIRST: &str = "application/vnd.kubernetes.protobuf, application/json";

/// What the requests accept once an object could not be read in protobuf (see [`list_and_watch`]).
const JSON_ONLY: &str = "application/json";

/// Objects per list page (client-go's and kube's).
const PAGE_SIZE: u32 = 500;

/// How long the API server keeps a watch open before it ends it (kube's default).
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// How long past its timeout a silent watch is given before it is reconnected.
const WATCH_IDLE_MARGIN: Duration = Duration::from_secs(5);

/// The annotation on the bookmark that ends a streaming list's objects (KEP-3157).
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// One event of a watch, decoded.
#[derive(Debug)]
enum Received<K> {
    Applied(K),
    Deleted(K),
    Bookmark {
        resource_version: String,
        initial_events_end: bool,
    },
    Error(Box<Status>),
}

type Events<K> = BoxStream<'static, Result<Received<K>, kube::Error>>;

enum State<K> {
    Empty,
    InitPage {
        continue_token: Option<String>,
        objects: VecDeque<K>,
        resource_version: Option<String>,
    },
    InitialWatch {
        events: Events<K>,
    },
    InitListed {
        resource_version: String,
    },
    Watching {
        resource_version: String,
        events: Events<K>,
    },
}

/// The cache's events for every `K`, listed as `initial_list` says and then watched, in protobuf where
/// the API server offers it (see the module docs).
///
/// An object the API server sends in protobuf that cannot be read (a string that is not UTF-8, which
/// Go writes and prost refuses, say; JSON has it replaced by the API server) would fail every list
/// and every watch from the same resource version: the first such failure switches this cache to JSON
/// for good, with a warning, and the list or watch is retried after the usual back-off.
pub(crate) fn list_and_watch<K>(
    client: Client,
    initial_list: InitialList,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: ProtobufObject + Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + 'static,
{
    let request = Request::new(K::url_path(&(), None));
    futures::stream::unfold(
        (client, request, State::Empty, PROTOBUF_FIRST),
        move |(client, request, mut state, mut accept)| async move {
            loop {
                let (event, next) = step(&client, &request, accept, initial_list, state).await;
                state = next;
                if let Some(Err(err)) = &event
                    && accept != JSON_ONLY
                    && protobuf_unreadable(err)
                {
                    tracing::warn!(kind = K::KIND, error = %err, "an object could not be read in protobuf; this cache reads JSON from now on");
                    accept = JSON_ONLY;
                }
                if let Some(event) = event {
                    return Some((event, (client, request, state, accept)));
                }
            }
        },
    )
}

/// Whether the cache's request failed on an object it could not read in protobuf.
fn protobuf_unreadable(err: &watcher::Error) -> bool {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Service(source))
        | watcher::Error::WatchFailed(kube::Error::Service(source)) => source
            .downcast_ref::<DecodeError>()
            .is_some_and(DecodeError::is_protobuf),
        _ => false,
    }
}

/// One step of the state machine: the event it yields, if any, and the next state.
async fn step<K>(
    client: &Client,
    request: &Request,
    accept: &'static str,
    initial_list: InitialList,
    state: State<K>,
) -> (Option<Result<watcher::Event<K>, watcher::Error>>, State<K>)
where
    K: ProtobufObject + Resource<DynamicType = ()> + DeserializeOwned + Clone + Send + 'static,
{
    match state {
        State::Empty => match initial_list {
            InitialList::ListThenWatch => (
                Some(Ok(watcher::Event::Init)),
                State::InitPage {
                    continue_token: None,
                    objects: VecDeque::new(),
                    resource_version: None,
                },
            ),
            InitialList::Streaming => match watch(client, request, accept, true, "0").await {
                Ok((events, _)) => (
                    Some(Ok(watcher::Event::Init)),
                    State::InitialWatch { events },
                ),
                Err(err) => (
                    Some(Err(watcher::Error::WatchStartFailed(err))),
                    State::Empty,
                ),
            },
        },
        State::InitPage {
            continue_token,
            mut objects,
            resource_version,
        } => {
            if let Some(object) = objects.pop_front() {
                return (
                    Some(Ok(watcher::Event::InitApply(object))),
                    State::InitPage {
                        continue_token,
                        objects,
                        resource_version,
                    },
                );
            }
            if continue_token.is_none()
                && let Some(resource_version) = resource_version
            {
                return (
                    Some(Ok(watcher::Event::InitDone)),
                    State::InitListed { resource_version },
                );
            }
            match list::<K>(client, request, accept, continue_token).await {
                Ok(page) => {
                    tracing::debug!(
                        kind = K::KIND,
                        objects = page.items.len(),
                        protobuf = page.protobuf,
                        "listed a page"
                    );
                    let resource_version = page.resource_version.filter(|v| !v.is_empty());
                    let continue_token = page.continue_token.filter(|c| !c.is_empty());
                    if resource_version.is_none() && continue_token.is_none() {
                        return (Some(Err(watcher::Error::NoResourceVersion)), State::Empty);
                    }
                    (
                        None,
                        State::InitPage {
                            continue_token,
                            objects: page.items.into(),
                            resource_version,
                        },
                    )
                }
                Err(err) => (
                    Some(Err(watcher::Error::InitialListFailed(err))),
                    State::Empty,
                ),
            }
        }
        State::InitialWatch { mut events } => match next(&mut events).await {
            Some(Ok(Received::Applied(object))) => (
                Some(Ok(watcher::Event::InitApply(object))),
                State::InitialWatch { events },
            ),
            Some(Ok(Received::Deleted(_))) => {
                tracing::error!(
                    kind = K::KIND,
                    "a deletion during a streaming list's objects (the API server sends none)"
                );
                (None, State::InitialWatch { events })
            }
            Some(Ok(Received::Bookmark {
                resource_version,
                initial_events_end,
            })) => {
                if initial_events_end {
                    (
                        Some(Ok(watcher::Event::InitDone)),
                        State::Watching {
                            resource_version,
                            events,
                        },
                    )
                } else {
                    (None, State::InitialWatch { events })
                }
            }
            Some(Ok(Received::Error(status))) => {
                let next = if status.code == 410 {
                    State::Empty
                } else {
                    State::InitialWatch { events }
                };
                (Some(Err(watcher::Error::WatchError(status))), next)
            }
            Some(Err(err)) => (
                Some(Err(watcher::Error::WatchFailed(err))),
                State::InitialWatch { events },
            ),
            None => (None, State::Empty),
        },
        State::InitListed { resource_version } => {
            match watch(client, request, accept, false, &resource_version).await {
                Ok((events, _)) => (
                    None,
                    State::Watching {
                        resource_version,
                        events,
                    },
                ),
                Err(err) => (
                    Some(Err(watcher::Error::WatchStartFailed(err))),
                    State::InitListed { resource_version },
                ),
            }
        }
        State::Watching {
            resource_version,
            mut events,
        } => match next(&mut events).await {
            Some(Ok(Received::Applied(object))) => watched(object, watcher::Event::Apply, events),
            Some(Ok(Received::Deleted(object))) => watched(object, watcher::Event::Delete, events),
            Some(Ok(Received::Bookmark {
                resource_version, ..
            })) => (
                None,
                State::Watching {
                    resource_version,
                    events,
                },
            ),
            Some(Ok(Received::Error(status))) => {
                let next = if status.code == 410 {
                    State::Empty
                } else {
                    State::Watching {
                        resource_version,
                        events,
                    }
                };
                (Some(Err(watcher::Error::WatchError(status))), next)
            }
            Some(Err(err)) => (
                Some(Err(watcher::Error::WatchFailed(err))),
                State::Watching {
                    resource_version,
                    events,
                },
            ),
            None => (None, State::InitListed { resource_version }),
        },
    }
}

/// A change heard while watching, as `event`; the watch goes on from the object's resource version
/// (kube's watcher lists again when it has none).
fn watched<K: Resource>(
    object: K,
    event: fn(K) -> watcher::Event<K>,
    events: Events<K>,
) -> (Option<Result<watcher::Event<K>, watcher::Error>>, State<K>) {
    match object_version(&object) {
        Some(resource_version) => (
            Some(Ok(event(object))),
            State::Watching {
                resource_version,
                events,
            },
        ),
        None => (Some(Err(watcher::Error::NoResourceVersion)), State::Empty),
    }
}

fn object_version<K: Resource>(object: &K) -> Option<String> {
    object
        .meta()
        .resource_version
        .clone()
        .filter(|v| !v.is_empty())
}

/// The watch's next event; `None` when it ended, or heard nothing for longer than its timeout.
async fn next<K>(events: &mut Events<K>) -> Option<Result<Received<K>, kube::Error>> {
    let idle = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECONDS)) + WATCH_IDLE_MARGIN;
    tokio::time::timeout(idle, events.next())
        .await
        .ok()
        .flatten()
}

/// One page of a list.
struct Page<K> {
    items: Vec<K>,
    resource_version: Option<String>,
    continue_token: Option<String>,
    /// Whether the API server answered in protobuf (else JSON).
    protobuf: bool,
}

/// Sends `request` asking for protobuf; the response when it succeeded, else the API server's
/// `Status` as kube's error (decoded from protobuf, JSON or text, as it came).
async fn send(
    client: &Client,
    accept: &'static str,
    mut request: http::Request<Vec<u8>>,
) -> Result<http::Response<kube::client::Body>, kube::Error> {
    request
        .headers_mut()
        .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let code = response.status();
    if code.is_success() {
        return Ok(response);
    }
    let protobuf = envelope::is_protobuf(response.headers().get(http::header::CONTENT_TYPE));
    let body = response.into_body().collect().await?.to_bytes();
    let status = if protobuf {
        envelope::unwrap(body)
            .and_then(|object| envelope::status(object.raw))
            .unwrap_or_else(|err| Status::failure(&err.to_string(), "Failed to parse error data"))
    } else {
        serde_json::from_slice::<Status>(&body).unwrap_or_else(|_| {
            Status::failure(
                String::from_utf8_lossy(&body).trim(),
                "Failed to parse error data",
            )
        })
    };
    Err(kube::Error::Api(status.with_code(code.as_u16()).boxed()))
}

/// A decoding failure as kube's error (what the watch's errors are made of).
fn decode_failed(err: DecodeError) -> kube::Error {
    kube::Error::Service(Box::new(err))
}

async fn list<K>(
    client: &Client,
    request: &Request,
    accept: &'static str,
    continue_token: Option<String>,
) -> Result<Page<K>, kube::Error>
where
    K: ProtobufObject + DeserializeOwned + Clone,
{
    let params = ListParams {
        limit: Some(PAGE_SIZE),
        continue_token,
        ..ListParams::default()
    };
    let response = send(
        client,
        accept,
        request.list(&params).map_err(kube::Error::BuildRequest)?,
    )
    .await?;
    let protobuf = envelope::is_protobuf(response.headers().get(http::header::CONTENT_TYPE));
    let body = response.into_body().collect().await?.to_bytes();
    if protobuf {
        decode_page(body).map_err(decode_failed)
    } else {
        let list: ObjectList<K> = serde_json::from_slice(&body).map_err(kube::Error::SerdeError)?;
        Ok(Page {
            items: list.items,
            resource_version: list.metadata.resource_version,
            continue_token: list.metadata.continue_,
            protobuf: false,
        })
    }
}

/// A protobuf list page: its items decoded one at a time from the page's bytes.
fn decode_page<K: ProtobufObject>(body: Bytes) -> Result<Page<K>, DecodeError> {
    let list = envelope::unwrap(body)?;
    let list: ListItems = decode("a list", list.raw)?;
    let metadata = list.metadata.unwrap_or_default();
    Ok(Page {
        items: list
            .items
            .into_iter()
            .enumerate()
            .map(|(index, item)| {
                K::from_protobuf(item).map_err(|source| DecodeError::ListItem {
                    index,
                    source: Box::new(source),
                })
            })
            .collect::<Result<_, _>>()?,
        resource_version: metadata.resource_version,
        continue_token: metadata.r#continue,
        protobuf: true,
    })
}

async fn watch<K>(
    client: &Client,
    request: &Request,
    accept: &'static str,
    send_initial_events: bool,
    resource_version: &str,
) -> Result<(Events<K>, Framing), kube::Error>
where
    K: ProtobufObject + Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
{
    let params = WatchParams {
        timeout: Some(WATCH_TIMEOUT_SECONDS),
        bookmarks: true,
        send_initial_events,
        ..WatchParams::default()
    };
    let response = send(
        client,
        accept,
        request
            .watch(&params, resource_version)
            .map_err(kube::Error::BuildRequest)?,
    )
    .await?;
    let framing = if envelope::is_protobuf(response.headers().get(http::header::CONTENT_TYPE)) {
        Framing::LengthPrefixed
    } else {
        Framing::Lines
    };
    let body = response.into_body().into_data_stream().map_err(|err| {
        // As kube's watch: a connection the API server or a proxy cut (after 300 s and more of
        // watching, often) ends the watch, to be resumed; it is no error.
        let kind = if ends_the_connection(&err) {
            std::io::ErrorKind::UnexpectedEof
        } else {
            std::io::ErrorKind::Other
        };
        kube::Error::ReadEvents(std::io::Error::new(kind, err))
    });
    tracing::debug!(kind = K::KIND, ?framing, send_initial_events, "watching");
    Ok((events(body, framing).boxed(), framing))
}

/// The events of a watch's `body`, cut by `framing` and decoded.
fn events<K>(
    body: impl Stream<Item = Result<Bytes, kube::Error>> + Send + 'static,
    framing: Framing,
) -> impl Stream<Item = Result<Received<K>, kube::Error>> + Send + 'static
where
    K: ProtobufObject + Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
{
    let state = (Box::pin(body), Frames::new(framing), false);
    futures::stream::unfold(
        state,
        move |(mut body, mut frames, mut failed)| async move {
            if failed {
                return None;
            }
            loop {
                match frames.next_frame() {
                    Ok(Some(frame)) => {
                        let event = decode_event(frame, framing).map_err(decode_failed);
                        // A protobuf event that cannot be read ends the watch: the cache turns to
                        // JSON and watches again from its last resource version, which replays the
                        // event readably. A JSON line that cannot be read is passed over, as kube's
                        // watch does (watched again, it would fail again).
                        failed = event.is_err() && framing == Framing::LengthPrefixed;
                        return Some((event, (body, frames, failed)));
                    }
                    Ok(None) => {}
                    Err(err) => return Some((Err(decode_failed(err)), (body, frames, true))),
                }
                match body.next().await {
                    Some(Ok(chunk)) => frames.push(&chunk),
                    Some(Err(kube::Error::ReadEvents(err)))
                        if err.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        tracing::debug!(kind = K::KIND, error = %err, "the watch's connection ended; resuming");
                        return None;
                    }
                    Some(Err(err)) => return Some((Err(err), (body, frames, true))),
                    None => {
                        if frames.rest() > 0 {
                            tracing::debug!(
                                kind = K::KIND,
                                bytes = frames.rest(),
                                "the watch ended inside an event"
                            );
                        }
                        return None;
                    }
                }
            }
        },
    )
}

/// Whether a watch body's error is its connection ending mid-stream (kube's `watch` classifies them
/// the same way): an `UnexpectedEof` anywhere in the error's sources, or hyper's chunk decoder's.
fn ends_the_connection(err: &(dyn std::error::Error + 'static)) -> bool {
    if err.to_string().contains("unexpected EOF during chunk") {
        return true;
    }
    // Bounded, in case an error's `source` loops.
    let mut next = Some(err);
    for _ in 0..16 {
        let Some(err) = next else {
            return false;
        };
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::TimedOut
            )
        {
            return true;
        }
        next = err.source();
    }
    false
}

/// One watch event's bytes, decoded.
fn decode_event<K>(frame: Bytes, framing: Framing) -> Result<Received<K>, DecodeError>
where
    K: ProtobufObject + Resource<DynamicType = ()> + DeserializeOwned,
{
    match framing {
        Framing::Lines => {
            let event: WatchEvent<K> =
                serde_json::from_slice(&frame).map_err(|source| DecodeError::Json {
                    what: "a watch event",
                    source,
                })?;
            Ok(match event {
                WatchEvent::Added(object) | WatchEvent::Modified(object) => {
                    Received::Applied(object)
                }
                WatchEvent::Deleted(object) => Received::Deleted(object),
                WatchEvent::Bookmark(bookmark) => Received::Bookmark {
                    initial_events_end: bookmark
                        .metadata
                        .annotations
                        .contains_key(INITIAL_EVENTS_END),
                    resource_version: bookmark.metadata.resource_version,
                },
                WatchEvent::Error(status) => Received::Error(status),
            })
        }
        Framing::LengthPrefixed => {
            let event: WatchEventMessage = decode("a watch event", frame)?;
            let raw = event.object.and_then(|o| o.raw).unwrap_or_default();
            let object = envelope::unwrap(raw)?;
            match event.r#type.as_deref().unwrap_or_default() {
                "ADDED" | "MODIFIED" => Ok(Received::Applied(K::from_protobuf(object.raw)?)),
                "DELETED" => Ok(Received::Deleted(K::from_protobuf(object.raw)?)),
                "BOOKMARK" => {
                    let bookmark = K::from_protobuf(object.raw)?;
                    let meta = bookmark.meta();
                    Ok(Received::Bookmark {
                        resource_version: meta.resource_version.clone().unwrap_or_default(),
                        initial_events_end: meta
                            .annotations
                            .as_ref()
                            .is_some_and(|a| a.contains_key(INITIAL_EVENTS_END)),
                    })
                }
                "ERROR" => Ok(Received::Error(Box::new(envelope::status(object.raw)?))),
                other => Err(DecodeError::UnknownEventType(other.to_owned())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_pb::{api::core::v1 as pb, apimachinery::pkg::apis::meta::v1 as pb_meta};
    use prost::Message;

    use std::sync::Arc;

    use super::*;
    use crate::{cached_node::CachedNode, protobuf::envelope::RawExtension};

    fn node_bytes(name: &str, resource_version: &str, annotations: &[(&str, &str)]) -> Vec<u8> {
        pb::Node {
            metadata: Some(pb_meta::ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(resource_version.into()),
                annotations: annotations
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn frame(kind: &str, event_type: &str, raw: &[u8]) -> Vec<u8> {
        let event = WatchEventMessage {
            r#type: Some(event_type.into()),
            object: Some(RawExtension {
                raw: Some(Bytes::from(envelope::wrap("v1", kind, raw))),
            }),
        }
        .encode_to_vec();
        let mut framed = u32::try_from(event.len()).unwrap().to_be_bytes().to_vec();
        framed.extend(event);
        framed
    }

    fn names(received: &[Received<CachedNode>]) -> Vec<String> {
        received
            .iter()
            .map(|r| match r {
                Received::Applied(n) => format!("applied {}", n.metadata.name.as_deref().unwrap()),
                Received::Deleted(n) => format!("deleted {}", n.metadata.name.as_deref().unwrap()),
                Received::Bookmark {
                    resource_version,
                    initial_events_end,
                } => format!("bookmark {resource_version} {initial_events_end}"),
                Received::Error(status) => format!("error {}", status.code),
            })
            .collect()
    }

    /// A protobuf watch body, in chunks that split its events anywhere, gives each event once, and
    /// the JSON body of the same events gives the same.
    #[tokio::test]
    async fn protobuf_and_json_watch_bodies_give_the_same_events() {
        let status = pb_meta::Status {
            code: Some(410),
            reason: Some("Expired".into()),
            ..Default::default()
        }
        .encode_to_vec();
        let mut protobuf = Vec::new();
        protobuf.extend(frame("Node", "ADDED", &node_bytes("a", "5", &[])));
        protobuf.extend(frame("Node", "MODIFIED", &node_bytes("a", "6", &[])));
        protobuf.extend(frame("Node", "DELETED", &node_bytes("a", "7", &[])));
        protobuf.extend(frame(
            "Node",
            "BOOKMARK",
            &node_bytes("", "8", &[(INITIAL_EVENTS_END, "true")]),
        ));
        protobuf.extend(frame("Status", "ERROR", &status));
        let json = [
            r#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}"#,
            r#"{"type":"MODIFIED","object":{"metadata":{"name":"a","resourceVersion":"6"}}}"#,
            r#"{"type":"DELETED","object":{"metadata":{"name":"a","resourceVersion":"7"}}}"#,
            r#"{"type":"BOOKMARK","object":{"kind":"Node","apiVersion":"v1","metadata":{"resourceVersion":"8","annotations":{"k8s.io/initial-events-end":"true"}}}}"#,
            r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","code":410,"reason":"Expired"}}"#,
        ]
        .join("\n")
            + "\n";
        let expected = [
            "applied a",
            "applied a",
            "deleted a",
            "bookmark 8 true",
            "error 410",
        ];
        for (body, framing) in [
            (protobuf, Framing::LengthPrefixed),
            (json.into_bytes(), Framing::Lines),
        ] {
            let chunks: Vec<Result<Bytes, kube::Error>> = body
                .chunks(13)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let received: Vec<_> = events::<CachedNode>(futures::stream::iter(chunks), framing)
                .try_collect()
                .await
                .unwrap();
            assert_eq!(names(&received), expected, "{framing:?}");
        }
    }

    /// An event that cannot be decoded ends the watch with an error that says what it was (the cache
    /// then resumes from the last resource version it had).
    #[tokio::test]
    async fn an_undecodable_event_ends_the_watch_saying_why() {
        let mut body = frame("Node", "ADDED", &node_bytes("a", "5", &[]));
        body.extend(frame("Node", "SURPRISE", &node_bytes("b", "6", &[])));
        body.extend(frame("Node", "ADDED", &node_bytes("c", "7", &[])));
        let received: Vec<_> = events::<CachedNode>(
            futures::stream::iter([Ok(Bytes::from(body))]),
            Framing::LengthPrefixed,
        )
        .collect()
        .await;
        assert_eq!(received.len(), 2);
        assert!(matches!(&received[0], Ok(Received::Applied(_))));
        let err = received[1].as_ref().unwrap_err().to_string();
        assert!(err.contains("a watch event of type SURPRISE"), "{err}");

        let lines = [
            r#"{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}"#,
            r#"{"type":"ADDED","object":{"metadata":{"name":7}}}"#,
            r#"{"type":"ADDED","object":{"metadata":{"name":"c","resourceVersion":"7"}}}"#,
        ]
        .join("\n")
            + "\n";
        let received: Vec<_> = events::<CachedNode>(
            futures::stream::iter([Ok(Bytes::from(lines))]),
            Framing::Lines,
        )
        .collect()
        .await;
        assert_eq!(
            received.len(),
            3,
            "the JSON watch goes on past the bad line"
        );
        assert!(received[1].is_err());
        assert!(
            matches!(&received[2], Ok(Received::Applied(n)) if n.metadata.name.as_deref() == Some("c"))
        );
    }

    /// An API server whose list answers, in protobuf, a Node that cannot be read (a name that is not
    /// UTF-8: Go writes it, prost refuses it), and in JSON the same Node as Go's JSON has it; watches
    /// answer 500 (so the cache backs off). The Accept header of each request is kept.
    fn api_server_with_an_unreadable_node() -> (Client, Arc<parking_lot::Mutex<Vec<String>>>) {
        let accepts = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = accepts.clone();
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let accept = request
                .headers()
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let watch = request
                .uri()
                .query()
                .is_some_and(|q| q.contains("watch=true"));
            seen.lock().push(accept.clone());
            async move {
                let (status, content_type, body) = if watch {
                    (
                        500,
                        "application/json",
                        br#"{"kind":"Status","code":500}"#.to_vec(),
                    )
                } else if accept.starts_with(envelope::PROTOBUF) {
                    let mut name = Vec::new();
                    prost::encoding::bytes::encode(1, &b"bad\xffname".to_vec(), &mut name);
                    let mut node = Vec::new();
                    prost::encoding::bytes::encode(1, &name, &mut node);
                    let list = ListItems {
                        metadata: Some(pb_meta::ListMeta {
                            resource_version: Some("3".into()),
                            ..Default::default()
                        }),
                        items: vec![Bytes::from(node)],
                    }
                    .encode_to_vec();
                    (
                        200,
                        envelope::PROTOBUF,
                        envelope::wrap("v1", "NodeList", &list),
                    )
                } else {
                    let list = serde_json::json!({
                        "kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": "3"},
                        "items": [{"metadata": {"name": "bad\u{fffd}name", "resourceVersion": "3"}}],
                    });
                    (200, "application/json", serde_json::to_vec(&list).unwrap())
                };
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(status)
                        .header(http::header::CONTENT_TYPE, content_type)
                        .body(kube::client::Body::from(body))
                        .unwrap(),
                )
            }
        });
        (Client::new(service, "default"), accepts)
    }

    /// An object that cannot be read in protobuf fails the list once, with the item and why; the
    /// cache then reads JSON, where the API server has the object readable.
    #[tokio::test]
    async fn an_object_unreadable_in_protobuf_switches_the_cache_to_json() {
        let (client, accepts) = api_server_with_an_unreadable_node();
        let mut events = Box::pin(list_and_watch::<CachedNode>(
            client,
            InitialList::ListThenWatch,
        ));
        assert!(matches!(
            events.next().await,
            Some(Ok(watcher::Event::Init))
        ));
        let err = events.next().await.unwrap().unwrap_err().to_string();
        assert!(err.contains("item 0 of a list page"), "{err}");
        assert!(matches!(
            events.next().await,
            Some(Ok(watcher::Event::Init))
        ));
        match events.next().await {
            Some(Ok(watcher::Event::InitApply(node))) => {
                assert_eq!(node.metadata.name.as_deref(), Some("bad\u{fffd}name"));
            }
            other => panic!("expected the node from JSON, got {other:?}"),
        }
        assert!(matches!(
            events.next().await,
            Some(Ok(watcher::Event::InitDone))
        ));
        let accepts = accepts.lock().clone();
        assert_eq!(accepts[0], PROTOBUF_FIRST);
        assert!(accepts[1..].iter().all(|a| a == JSON_ONLY), "{accepts:?}");
    }

    #[test]
    fn a_protobuf_page_gives_its_items_and_tokens() {
        let list = ListItems {
            metadata: Some(pb_meta::ListMeta {
                resource_version: Some("12".into()),
                r#continue: Some("next".into()),
                ..Default::default()
            }),
            items: vec![
                Bytes::from(node_bytes("a", "10", &[])),
                Bytes::from(node_bytes("b", "11", &[])),
            ],
        }
        .encode_to_vec();
        let page: Page<CachedNode> =
            decode_page(Bytes::from(envelope::wrap("v1", "NodeList", &list))).unwrap();
        let names: Vec<_> = page
            .items
            .iter()
            .map(|n| n.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(page.resource_version.as_deref(), Some("12"));
        assert_eq!(page.continue_token.as_deref(), Some("next"));
    }
}

/// Reach into the requests for the tests against the API server.
#[cfg(test)]
pub(super) mod tests_support {
    use super::*;

    /// Whether the first page of a list came in protobuf.
    pub(crate) async fn list_page<K>(
        client: &Client,
        request: &Request,
    ) -> Result<bool, kube::Error>
    where
        K: ProtobufObject + DeserializeOwned + Clone,
    {
        Ok(list::<K>(client, request, PROTOBUF_FIRST, None)
            .await?
            .protobuf)
    }

    /// How a watch's events came framed.
    pub(crate) async fn watch_framing<K>(
        client: &Client,
        request: &Request,
    ) -> Result<Framing, kube::Error>
    where
        K: ProtobufObject + Resource<DynamicType = ()> + DeserializeOwned + Send + 'static,
    {
        Ok(watch::<K>(client, request, PROTOBUF_FIRST, false, "0")
            .await?
            .1)
    }
}
