//! Annotations as providers read them.

use k8s_openapi::api::core::v1::Service;

/// The value of the Service's annotation `key`, without the blanks around it; `None` when the
/// annotation is not set.
pub fn service_annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(|v| v.trim())
}
