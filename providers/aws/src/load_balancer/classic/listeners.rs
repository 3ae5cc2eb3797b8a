//! A Classic ELB's listeners (TCP, or SSL/HTTPS terminating TLS with `ssl-cert`) to the node ports, and
//! its health check.

use super::*;

/// The Classic ELB's listeners: each Service port to its node port, TLS as the Service asks.
pub(super) fn classic_listeners(spec: &LbSpec) -> Result<Vec<Listener>> {
    spec.ports
        .iter()
        .map(|p| {
            let wanted = spec.tls.classic_listener(p);
            Listener::builder()
                .protocol(wanted.protocol)
                .load_balancer_port(p.port)
                .instance_protocol(wanted.instance_protocol)
                .instance_port(p.node_port)
                .set_ssl_certificate_id(wanted.cert)
                .build()
        })
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Setup(format!("listener: {e}")))
}

pub(super) fn health_target(spec: &LbSpec) -> String {
    let hc = &spec.health_check;
    if hc.protocol.starts_with("HTTP") {
        format!("{}:{}{}", hc.protocol, hc.port, hc.path)
    } else {
        format!("{}:{}", hc.protocol, hc.port)
    }
}

/// Upstream's `elbListenersAreEqual`: ports, both protocols and the certificate (ARNs compared without
/// case).
fn same_listener(a: &Listener, b: &Listener) -> bool {
    a.load_balancer_port() == b.load_balancer_port()
        && a.instance_port() == b.instance_port()
        && a.protocol().eq_ignore_ascii_case(b.protocol())
        && a.instance_protocol()
            .unwrap_or(a.protocol())
            .eq_ignore_ascii_case(b.instance_protocol().unwrap_or(b.protocol()))
        && match (
            a.ssl_certificate_id().filter(|c| !c.is_empty()),
            b.ssl_certificate_id().filter(|c| !c.is_empty()),
        ) {
            (None, None) => true,
            (Some(x), Some(y)) => x.eq_ignore_ascii_case(y),
            _ => false,
        }
}

/// The listeners to delete (by port) and to create that make `current` `wanted`: a listener that
/// differs is deleted and created again, as upstream does.
fn listener_changes(current: &[Listener], wanted: &[Listener]) -> (Vec<i32>, Vec<Listener>) {
    let remove = current
        .iter()
        .filter(|c| !wanted.iter().any(|w| same_listener(c, w)))
        .map(Listener::load_balancer_port)
        .collect();
    let add = wanted
        .iter()
        .filter(|w| !current.iter().any(|c| same_listener(c, w)))
        .cloned()
        .collect();
    (remove, add)
}

/// `listeners` in words, for a preview: `SSL 443->HTTP 30443, ...`.
fn in_words(listeners: &[Listener]) -> String {
    listeners
        .iter()
        .map(|l| {
            format!(
                "{} {}->{} {}",
                l.protocol(),
                l.load_balancer_port(),
                l.instance_protocol().unwrap_or_default(),
                l.instance_port()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl LoadBalancers {
    /// Makes the listeners `wanted` ([`listener_changes`]); `true` when it changed any (outside a
    /// preview).
    pub(super) async fn sync_classic_listeners(
        &self,
        lb: &LoadBalancerDescription,
        wanted: &[Listener],
    ) -> Result<bool> {
        let elb = &self.calls.clients.elb;
        let name = lb.load_balancer_name().unwrap_or_default();
        let current: Vec<Listener> = lb
            .listener_descriptions()
            .iter()
            .filter_map(|d| d.listener().cloned())
            .collect();
        let (remove, add) = listener_changes(&current, wanted);
        let mut changed = false;
        if !remove.is_empty()
            && !self.previewed(|| format!("listeners on ports {remove:?} would be deleted"))
        {
            changed = true;
            self.calls
                .call("DeleteLoadBalancerListeners", || {
                    elb.delete_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_load_balancer_ports(Some(remove.clone()))
                        .send()
                })
                .await?;
        }
        if !add.is_empty()
            && !self.previewed(|| format!("listeners {} would be created", in_words(&add)))
        {
            changed = true;
            self.calls
                .call("CreateLoadBalancerListeners", || {
                    elb.create_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_listeners(Some(add.clone()))
                        .send()
                })
                .await?;
        }
        Ok(changed)
    }

    pub(super) async fn sync_classic_health_check(
        &self,
        lb: &LoadBalancerDescription,
        spec: &LbSpec,
    ) -> Result<()> {
        let hc = &spec.health_check;
        let target = health_target(spec);
        let current = lb.health_check();
        let same = current.is_some_and(|c| {
            c.target() == target
                && c.interval() == hc.interval
                && c.timeout() == hc.timeout
                && c.healthy_threshold() == hc.healthy_threshold
                && c.unhealthy_threshold() == hc.unhealthy_threshold
        });
        if same {
            return Ok(());
        }
        if self.previewed(|| {
            format!(
                "health check would change from {:?} to {target} (interval {}s, timeout {}s, thresholds {}/{})",
                current.map(|c| c.target()).unwrap_or("none"),
                hc.interval,
                hc.timeout,
                hc.healthy_threshold,
                hc.unhealthy_threshold
            )
        }) {
            return Ok(());
        }
        let check = ElbHealthCheck::builder()
            .target(&target)
            .interval(hc.interval)
            .timeout(hc.timeout)
            .healthy_threshold(hc.healthy_threshold)
            .unhealthy_threshold(hc.unhealthy_threshold)
            .build()
            .map_err(|e| Error::Setup(format!("health check: {e}")))?;
        let elb = &self.calls.clients.elb;
        self.calls
            .call("ConfigureHealthCheck", || {
                elb.configure_health_check()
                    .load_balancer_name(&spec.name)
                    .health_check(check.clone())
                    .send()
            })
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listener(
        protocol: &str,
        port: i32,
        instance: &str,
        node_port: i32,
        cert: Option<&str>,
    ) -> Listener {
        Listener::builder()
            .protocol(protocol)
            .load_balancer_port(port)
            .instance_protocol(instance)
            .instance_port(node_port)
            .set_ssl_certificate_id(cert.map(str::to_owned))
            .build()
            .unwrap()
    }

    #[test]
    fn a_listener_that_differs_is_deleted_and_made_again() {
        let tcp = listener("TCP", 80, "TCP", 30080, None);
        let cert = "arn:aws:acm:us-west-2:1:certificate/abc";
        let tls = listener("SSL", 443, "TCP", 30443, Some(cert));
        for (name, current, wanted, remove, add) in [
            (
                "as wanted",
                vec![tcp.clone()],
                vec![tcp.clone()],
                vec![],
                "",
            ),
            (
                "protocols without case, the certificate ARN without case",
                vec![
                    listener("tcp", 80, "tcp", 30080, None),
                    listener("SSL", 443, "TCP", 30443, Some(&cert.to_uppercase())),
                ],
                vec![tcp.clone(), tls.clone()],
                vec![],
                "",
            ),
            (
                "a new node port",
                vec![tcp.clone()],
                vec![listener("TCP", 80, "TCP", 31080, None)],
                vec![80],
                "TCP 80->TCP 31080",
            ),
            (
                "TLS added, a port gone",
                vec![listener("TCP", 81, "TCP", 30081, None)],
                vec![tls.clone()],
                vec![81],
                "SSL 443->TCP 30443",
            ),
        ] {
            let (r, a) = listener_changes(&current, &wanted);
            assert_eq!((r, in_words(&a)), (remove, add.to_owned()), "{name}");
        }
    }
}
