//! TLS termination read from the Service (`ssl-cert`, `ssl-ports`, `ssl-negotiation-policy`,
//! `backend-protocol`): which ports terminate TLS, and the listeners and protocols that follow for each
//! kind.

use super::*;

/// TLS termination, as the `ssl-*` and `backend-protocol` annotations ask.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// The certificate ARN (`ssl-cert`), when set.
    pub cert: Option<String>,
    /// The ports (Service port numbers) whose listeners terminate TLS with it (non-UDP ports that
    /// `ssl-ports` names; all of them without it).
    pub ports: std::collections::BTreeSet<i32>,
    /// `ssl-negotiation-policy`, when the annotation is there (an empty value too, as upstream).
    pub policy: Option<String>,
    /// `backend-protocol`, when set: `http`, `https`, `ssl` or `tcp`.
    pub backend_protocol: Option<String>,
}

/// One Classic ELB listener: protocols as AWS spells them, and the certificate of a TLS one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassicListener {
    /// `TCP`, `HTTP`, `SSL` or `HTTPS`.
    pub protocol: String,
    /// `TCP`, `HTTP`, `SSL` or `HTTPS`.
    pub instance_protocol: String,
    /// The certificate ARN of an `SSL` or `HTTPS` listener.
    pub cert: Option<String>,
}

impl Tls {
    /// Whether the listener on `port` terminates TLS.
    pub fn on(&self, port: &Port) -> bool {
        self.cert.is_some() && self.ports.contains(&port.port)
    }

    /// The Classic ELB listener for `port`, as upstream's `buildListener`: a TLS port gets `SSL` to
    /// `TCP` (or, with `backend-protocol`, `HTTPS` to `HTTP`/`HTTPS`, `SSL` to `SSL`/`TCP`); a plain
    /// port gets `HTTP` to `HTTP` with `backend-protocol: http`, else `TCP` to `TCP`.
    pub fn classic_listener(&self, port: &Port) -> ClassicListener {
        let backend = self.backend_protocol.as_deref();
        if self.on(port) {
            let (protocol, instance) = match backend {
                None => ("ssl", "tcp"),
                Some(backend) => BACKEND_PROTOCOLS
                    .iter()
                    .find(|(b, _)| *b == backend)
                    .map(|(b, listener)| (*listener, *b))
                    // Checked when the annotations were read.
                    .unwrap_or(("ssl", "tcp")),
            };
            ClassicListener {
                protocol: protocol.to_ascii_uppercase(),
                instance_protocol: instance.to_ascii_uppercase(),
                cert: self.cert.clone(),
            }
        } else if backend == Some("http") {
            ClassicListener {
                protocol: "HTTP".into(),
                instance_protocol: "HTTP".into(),
                cert: None,
            }
        } else {
            ClassicListener {
                protocol: "TCP".into(),
                instance_protocol: "TCP".into(),
                cert: None,
            }
        }
    }

    /// The NLB listener protocol for `port`: `TLS` on a TLS port, else the port's (`TCP`, `UDP`).
    pub fn nlb_listener_protocol<'a>(&self, port: &'a Port) -> &'a str {
        if self.on(port) { "TLS" } else { &port.protocol }
    }

    /// The NLB target-group protocol for `port`: `TLS` on a TLS port with `backend-protocol: ssl`, else
    /// the port's (upstream ignores the other values on an NLB: they are plain TCP to the nodes).
    pub fn nlb_target_protocol<'a>(&self, port: &'a Port) -> &'a str {
        if self.on(port) && self.backend_protocol.as_deref() == Some("ssl") {
            "TLS"
        } else {
            &port.protocol
        }
    }
}

/// The TLS annotations, read as upstream reads them, with what upstream lets through in silence
/// refused: a `backend-protocol` value that is none of `http`, `https`, `ssl`, `tcp` (upstream: an
/// error on a TLS port, plain TCP elsewhere), and an `ssl-ports` entry with blanks around it (upstream
/// matches `" 8443"` against no port and leaves 8443 plain TCP).
pub(super) fn tls(
    service: &Service,
    kind: Kind,
    ports: &[(i32, String, String)],
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<Tls, Error> {
    let raw = |key: &str| {
        service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let cert = raw(ANNOTATION_SSL_CERT)
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned);
    let backend_protocol = match raw(ANNOTATION_BACKEND_PROTOCOL).map(str::trim) {
        None | Some("") => None,
        Some(value) if BACKEND_PROTOCOLS.iter().any(|(b, _)| *b == value) => Some(value.to_owned()),
        Some(value) => {
            return Err(bad(
                ANNOTATION_BACKEND_PROTOCOL,
                match &cert {
                    Some(cert) => format!(
                        "Invalid backend protocol {value} for {cert} in {ANNOTATION_BACKEND_PROTOCOL}"
                    ),
                    None => {
                        format!("{value:?} is not a backend protocol (http, https, ssl or tcp)")
                    }
                },
            ));
        }
    };
    // Without a certificate nothing terminates TLS: upstream ignores these two then; refused here.
    if cert.is_none() {
        for key in [ANNOTATION_SSL_PORTS, ANNOTATION_SSL_POLICY] {
            if raw(key).is_some() {
                return Err(bad(
                    key,
                    format!(
                        "has no effect without {ANNOTATION_SSL_CERT}: no listener terminates TLS"
                    ),
                ));
            }
        }
    }
    let selection = match raw(ANNOTATION_SSL_PORTS) {
        None | Some("") | Some("*") => None,
        Some(value) => {
            let items: Vec<&str> = value.split(',').collect();
            if let Some(item) = items.iter().find(|i| i.trim() != **i || i.is_empty()) {
                return Err(bad(
                    ANNOTATION_SSL_PORTS,
                    format!(
                        "{item:?} in {value:?}: write the ports without blanks or empty entries (\"443,8443\"); upstream matches such an entry against no port"
                    ),
                ));
            }
            Some(items)
        }
    };
    let tls_ports = ports
        .iter()
        .filter(|(_, _, protocol)| protocol != "UDP")
        .filter(|(number, name, _)| match &selection {
            None => true,
            Some(items) => items.iter().any(|item| {
                match item.parse::<i32>() {
                    Ok(n) => n == *number,
                    // Classic ELBs match the port's name lower-cased, NLBs as written (upstream).
                    Err(_) => match kind {
                        Kind::Classic => *item == name.to_ascii_lowercase(),
                        Kind::Nlb => item == name,
                    },
                }
            }),
        })
        .map(|(number, _, _)| *number)
        .collect();
    Ok(Tls {
        cert,
        ports: tls_ports,
        policy: raw(ANNOTATION_SSL_POLICY).map(|p| p.trim().to_owned()),
        backend_protocol,
    })
}
