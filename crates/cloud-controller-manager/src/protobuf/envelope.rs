//! The API server's protobuf envelope and the few messages around an object that this crate reads
//! itself: the envelope (`runtime.Unknown` after the magic `k8s\0`), a list's items, a watch event and
//! an error's `Status`.
//!
//! The envelope, list and watch-event messages are declared here rather than taken from k8s-pb: these
//! hold the object's bytes as [`Bytes`] slices of the response (k8s-pb's copy each into a `Vec`), so a
//! page of 500 Nodes is decoded one Node at a time without a second copy of the page.

use bytes::Bytes;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use kube::core::Status;
use prost::Message;

use super::DecodeError;

/// The media type of the API server's protobuf encoding.
pub(crate) const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

/// What every protobuf body (and every object in a watch event) starts with.
const MAGIC: &[u8] = b"k8s\0";

/// `runtime.Unknown`: the object's type and its encoded bytes.
#[derive(Clone, PartialEq, Message)]
struct Envelope {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "bytes", optional, tag = "2")]
    raw: Option<Bytes>,
}

/// `runtime.TypeMeta`.
#[derive(Clone, PartialEq, Message)]
struct TypeMeta {
    #[prost(string, optional, tag = "1")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "2")]
    kind: Option<String>,
}

/// Any `<Kind>List`: its metadata, and each item's bytes.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ListItems {
    #[prost(message, optional, tag = "1")]
    pub(crate) metadata: Option<meta::ListMeta>,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub(crate) items: Vec<Bytes>,
}

/// `meta.v1.WatchEvent`: its type and its object (`runtime.RawExtension`, whose bytes are an envelope).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct WatchEventMessage {
    #[prost(string, optional, tag = "1")]
    pub(crate) r#type: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub(crate) object: Option<RawExtension>,
}

/// `runtime.RawExtension`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RawExtension {
    #[prost(bytes = "bytes", optional, tag = "1")]
    pub(crate) raw: Option<Bytes>,
}

/// An object's kind and bytes, out of its envelope.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Unwrapped {
    pub(crate) kind: String,
    pub(crate) raw: Bytes,
}

/// The object in the envelope `body` (a response's body, or a watch event's object).
pub(crate) fn unwrap(body: Bytes) -> Result<Unwrapped, DecodeError> {
    if !body.starts_with(MAGIC) {
        return Err(DecodeError::NoMagic {
            starts: body.iter().take(MAGIC.len()).copied().collect(),
        });
    }
    let envelope =
        Envelope::decode(body.slice(MAGIC.len()..)).map_err(|source| DecodeError::Protobuf {
            what: "the envelope",
            source,
        })?;
    Ok(Unwrapped {
        kind: envelope.type_meta.and_then(|t| t.kind).unwrap_or_default(),
        raw: envelope.raw.unwrap_or_default(),
    })
}

/// The envelope around `raw` as the API server writes it (for tests and benchmarks).
#[cfg(test)]
pub(crate) fn wrap(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
    let envelope = Envelope {
        type_meta: Some(TypeMeta {
            api_version: Some(api_version.to_owned()),
            kind: Some(kind.to_owned()),
        }),
        raw: Some(Bytes::copy_from_slice(raw)),
    };
    let mut body = MAGIC.to_vec();
    envelope.encode(&mut body).expect("a Vec grows");
    body
}

/// A `Status` object's bytes as kube's [`Status`] (what its JSON errors decode to).
pub(crate) fn status(raw: Bytes) -> Result<Status, DecodeError> {
    let status = meta::Status::decode(raw).map_err(|source| DecodeError::Protobuf {
        what: "a Status",
        source,
    })?;
    let code = status
        .code
        .and_then(|code| u16::try_from(code).ok())
        .unwrap_or_default();
    let mut kube_status = Status::failure(
        status.message.as_deref().unwrap_or_default(),
        status.reason.as_deref().unwrap_or_default(),
    )
    .with_code(code);
    if status.status.as_deref() == Some("Success") {
        kube_status.status = Some(kube::core::response::StatusSummary::Success);
    }
    Ok(kube_status)
}

/// Whether a response's `Content-Type` is the protobuf encoding (a watch's says `;stream=watch`).
pub(crate) fn is_protobuf(content_type: Option<&http::HeaderValue>) -> bool {
    content_type
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(PROTOBUF))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwrap_reads_what_wrap_writes_and_refuses_a_body_without_the_magic() {
        let body = wrap("v1", "Node", b"\x0a\x00");
        assert_eq!(
            unwrap(Bytes::from(body)).unwrap(),
            Unwrapped {
                kind: "Node".into(),
                raw: Bytes::from_static(b"\x0a\x00"),
            }
        );
        let err = unwrap(Bytes::from_static(b"{\"kind\":\"Node\"}")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the body does not start with the protobuf envelope's magic bytes k8s\\0 (it starts with b\"{\\\"ki\")"
        );
        let err = unwrap(Bytes::from_static(b"k8s\0\x12\x05ab")).unwrap_err();
        assert!(err.to_string().starts_with("the envelope: "), "{err}");
    }

    #[test]
    fn a_status_keeps_its_code_reason_and_message() {
        let raw = meta::Status {
            status: Some("Failure".into()),
            message: Some("too old resource version: 1 (2)".into()),
            reason: Some("Expired".into()),
            code: Some(410),
            ..Default::default()
        }
        .encode_to_vec();
        let status = status(Bytes::from(raw)).unwrap();
        assert_eq!(status.code, 410);
        assert_eq!(status.reason, "Expired");
        assert_eq!(status.message, "too old resource version: 1 (2)");
        assert!(status.is_failure());
    }

    #[test]
    fn the_content_type_is_protobuf_with_or_without_parameters() {
        let cases: &[(Option<&str>, bool)] = &[
            (Some("application/vnd.kubernetes.protobuf"), true),
            (
                Some("application/vnd.kubernetes.protobuf;stream=watch"),
                true,
            ),
            (Some("application/json"), false),
            (Some("application/json;stream=watch"), false),
            (None, false),
        ];
        for (value, protobuf) in cases {
            let header = value.map(|v| http::HeaderValue::from_str(v).unwrap());
            assert_eq!(is_protobuf(header.as_ref()), *protobuf, "{value:?}");
        }
    }
}
