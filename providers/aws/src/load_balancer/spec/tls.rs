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
    let raw = |key: &str| raw_annotation(service, key);
    let cert = cert_of(raw(ANNOTATION_SSL_CERT));
    let backend_protocol = backend_protocol_of(raw(ANNOTATION_BACKEND_PROTOCOL), cert.as_deref())
        .map_err(|message| bad(ANNOTATION_BACKEND_PROTOCOL, message))?;
    // Without a certificate nothing terminates TLS: upstream ignores these two then; refused here.
    if cert.is_none() {
        refuse_tls_settings_without_cert(service, bad)?;
    }
    let selection = ssl_ports_selection(raw(ANNOTATION_SSL_PORTS))
        .map_err(|message| bad(ANNOTATION_SSL_PORTS, message))?;
    Ok(Tls {
        cert,
        ports: tls_ports(ports, kind, selection.as_deref()),
        policy: raw(ANNOTATION_SSL_POLICY).map(|p| p.trim().to_owned()),
        backend_protocol,
    })
}

/// The annotation `key` as written, blanks and all.
fn raw_annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The certificate ARN of `ssl-cert`, trimmed; none when unset or blank.
fn cert_of(value: Option<&str>) -> Option<String> {
    value
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
}

/// The `backend-protocol` value, trimmed; none when unset or blank. A value that is none of
/// [`BACKEND_PROTOCOLS`] is refused in words: upstream's message when there is a certificate `cert`,
/// ours otherwise.
fn backend_protocol_of(value: Option<&str>, cert: Option<&str>) -> Result<Option<String>, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(None),
        Some(value) if BACKEND_PROTOCOLS.iter().any(|(b, _)| *b == value) => {
            Ok(Some(value.to_owned()))
        }
        Some(value) => Err(match cert {
            Some(cert) => format!(
                "Invalid backend protocol {value} for {cert} in {ANNOTATION_BACKEND_PROTOCOL}"
            ),
            None => format!("{value:?} is not a backend protocol (http, https, ssl or tcp)"),
        }),
    }
}

/// Refuses `ssl-ports` and `ssl-negotiation-policy` (in that order) on a Service without `ssl-cert`,
/// where they would have no effect.
fn refuse_tls_settings_without_cert(
    service: &Service,
    bad: &dyn Fn(&str, String) -> Error,
) -> Result<(), Error> {
    for key in [ANNOTATION_SSL_PORTS, ANNOTATION_SSL_POLICY] {
        if raw_annotation(service, key).is_some() {
            return Err(bad(
                key,
                format!("has no effect without {ANNOTATION_SSL_CERT}: no listener terminates TLS"),
            ));
        }
    }
    Ok(())
}

/// The entries of `ssl-ports` (port numbers or names); none for every port (unset, empty or `*`). An
/// entry with blanks around it, or an empty one, is refused in words.
fn ssl_ports_selection(value: Option<&str>) -> Result<Option<Vec<&str>>, String> {
    match value {
        None | Some("") | Some("*") => Ok(None),
        Some(value) => {
            let items: Vec<&str> = value.split(',').collect();
            if let Some(item) = items.iter().find(|i| i.trim() != **i || i.is_empty()) {
                return Err(format!(
                    "{item:?} in {value:?}: write the ports without blanks or empty entries (\"443,8443\"); upstream matches such an entry against no port"
                ));
            }
            Ok(Some(items))
        }
    }
}

/// The Service port numbers of `ports` (number, name, protocol) that terminate TLS: the non-UDP ones
/// `selection` names, or all of them without one.
fn tls_ports(
    ports: &[(i32, String, String)],
    kind: Kind,
    selection: Option<&[&str]>,
) -> std::collections::BTreeSet<i32> {
    ports
        .iter()
        .filter(|(_, _, protocol)| protocol != "UDP")
        .filter(|(number, name, _)| {
            selection.is_none_or(|items| {
                items
                    .iter()
                    .any(|item| ssl_port_names(item, *number, name, kind))
            })
        })
        .map(|(number, _, _)| *number)
        .collect()
}

/// Whether the `ssl-ports` entry `item` names the port `number` called `name`: by number, else by
/// name (Classic ELBs match the port's name lower-cased, NLBs as written, as upstream).
fn ssl_port_names(item: &str, number: i32, name: &str, kind: Kind) -> bool {
    match item.parse::<i32>() {
        Ok(n) => n == number,
        Err(_) => match kind {
            Kind::Classic => item == name.to_ascii_lowercase(),
            Kind::Nlb => item == name,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certs_are_trimmed_and_blank_ones_are_none() {
        for (value, expected) in [
            (None, None),
            (Some(""), None),
            (Some("  "), None),
            (Some(" arn:c "), Some("arn:c")),
        ] {
            assert_eq!(cert_of(value).as_deref(), expected, "{value:?}");
        }
    }

    #[test]
    fn backend_protocols_are_upstreams_four() {
        for (value, cert, expected) in [
            (None, None, Ok(None)),
            (Some(" "), Some("arn:c"), Ok(None)),
            (Some(" ssl "), None, Ok(Some("ssl"))),
            (Some("http"), Some("arn:c"), Ok(Some("http"))),
            (
                Some("h2"),
                None,
                Err("\"h2\" is not a backend protocol (http, https, ssl or tcp)".to_owned()),
            ),
            (
                Some("h2"),
                Some("arn:c"),
                Err(format!(
                    "Invalid backend protocol h2 for arn:c in {ANNOTATION_BACKEND_PROTOCOL}"
                )),
            ),
        ] {
            assert_eq!(
                backend_protocol_of(value, cert),
                expected.map(|p| p.map(str::to_owned)),
                "{value:?} {cert:?}"
            );
        }
    }

    #[test]
    fn ssl_ports_select_all_unless_listed_without_blanks() {
        for (value, expected) in [
            (None, Ok(None)),
            (Some(""), Ok(None)),
            (Some("*"), Ok(None)),
            (Some("443,https"), Ok(Some(vec!["443", "https"]))),
            (Some("443, 80"), Err("\" 80\" in \"443, 80\"")),
            (Some("443,"), Err("\"\" in \"443,\"")),
        ] {
            match (ssl_ports_selection(value), expected) {
                (Ok(got), Ok(expected)) => assert_eq!(got, expected, "{value:?}"),
                (Err(got), Err(expected)) => assert!(got.starts_with(expected), "{got}"),
                (got, _) => panic!("{value:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn tls_ports_are_the_selected_non_udp_ports() {
        let ports = [
            (443, "HTTPS".to_owned(), "TCP".to_owned()),
            (8443, "alt".to_owned(), "TCP".to_owned()),
            (53, "dns".to_owned(), "UDP".to_owned()),
        ];
        for (kind, selection, expected) in [
            (Kind::Classic, None, vec![443, 8443]),
            (Kind::Nlb, Some(vec!["53", "8443"]), vec![8443]),
            (Kind::Classic, Some(vec!["https"]), vec![443]),
            (Kind::Nlb, Some(vec!["https"]), vec![]),
            (Kind::Nlb, Some(vec!["HTTPS"]), vec![443]),
        ] {
            let got: Vec<i32> = tls_ports(&ports, kind, selection.as_deref())
                .into_iter()
                .collect();
            assert_eq!(got, expected, "{kind:?} {selection:?}");
        }
    }
}
