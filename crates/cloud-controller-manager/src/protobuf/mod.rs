//! Reading from the API server in protobuf (`application/vnd.kubernetes.protobuf`), the encoding
//! client-go asks for and upstream's manager uses by default (`--kube-api-content-type`).
//!
//! Why: for the API server, producing JSON is the dearest part of a read. A paged list of 10,000
//! kubelet-sized Nodes costs it 2.1x in JSON what it costs in protobuf, and each streamed object or
//! watch event 3.7x (`bench/results/read-costs-2026-12-01.md`); the Node cache is most of what this
//! manager reads. So the Node and Service caches list and watch in protobuf ([`list_watch`]);
//! everything else (single reads, every write) stays JSON through kube's client: the write costs
//! measured no difference by encoding (`bench/results/write-costs-2026-11-27.md`), and a protobuf
//! write would erase the fields the protobuf types lack.
//!
//! kube (5) has no protobuf support, so this module sends kube's own requests with another `Accept`
//! and decodes the answers itself: the envelope ([`envelope`]), the watch framing ([`frames`]), the
//! Node ([`node`]) and the Service ([`service`]): k8s-pb's messages turned into the k8s-openapi types
//! the caches hold. Every request
//! also accepts JSON, and every answer is decoded by the type it came in: an API server (or a proxy)
//! that has no protobuf for a resource is read in JSON without a word.

mod envelope;
mod frames;
mod list_watch;
mod meta;
mod node;
#[cfg(test)]
mod on_the_api_server;
mod service;

use bytes::Bytes;

pub(crate) use list_watch::list_and_watch;

/// `--kube-api-content-type`: how the manager's caches read from the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KubeApiContentType {
    /// Protobuf where the API server offers it (upstream's default).
    #[default]
    #[value(name = "application/vnd.kubernetes.protobuf")]
    Protobuf,
    /// JSON only.
    #[value(name = "application/json")]
    Json,
}

/// An object that can be decoded from the API server's protobuf encoding.
pub(crate) trait ProtobufObject: Sized {
    /// The kind, for logs.
    const KIND: &'static str;

    /// The object in `raw` (the bytes inside the envelope).
    fn from_protobuf(raw: Bytes) -> Result<Self, DecodeError>;
}

/// A protobuf or JSON answer that could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DecodeError {
    #[error(
        "the body does not start with the protobuf envelope's magic bytes k8s\\0 (it starts with {})",
        bytes_text(starts)
    )]
    NoMagic { starts: Vec<u8> },
    #[error("{what}: {source}")]
    Protobuf {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{what}: {source}")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "a watch event of {length} bytes is larger than the {} bytes accepted",
        frames::MAX_FRAME
    )]
    FrameTooLarge { length: usize },
    #[error("a watch event of type {0} (known: ADDED, MODIFIED, DELETED, BOOKMARK, ERROR)")]
    UnknownEventType(String),
    #[error("item {index} of a list page: {source}")]
    ListItem {
        index: usize,
        #[source]
        source: Box<DecodeError>,
    },
}

impl DecodeError {
    /// Whether reading protobuf failed (not JSON): reading the same in JSON may succeed.
    fn is_protobuf(&self) -> bool {
        match self {
            Self::Json { .. } => false,
            Self::ListItem { source, .. } => source.is_protobuf(),
            Self::NoMagic { .. }
            | Self::Protobuf { .. }
            | Self::FrameTooLarge { .. }
            | Self::UnknownEventType(_) => true,
        }
    }
}

fn bytes_text(bytes: &[u8]) -> String {
    format!("b\"{}\"", bytes.escape_ascii())
}

/// The message `M` in `bytes`; `what` names it in the error.
fn decode<M: prost::Message + Default>(what: &'static str, bytes: Bytes) -> Result<M, DecodeError> {
    M::decode(bytes).map_err(|source| DecodeError::Protobuf { what, source })
}
