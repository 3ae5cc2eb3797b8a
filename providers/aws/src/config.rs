//! cloud-provider-aws's cloud-config: an INI file in gcfg's syntax with a `[Global]` section and any
//! number of `[ServiceOverride "<name>"]` sections.
//!
//! Section and key names are case-insensitive (as gcfg's); values may be double-quoted (with `\"`, `\\`,
//! `\n` and `\t` escapes); `;` and `#` start comments; a key given twice keeps its last value, except
//! `NodeIPFamilies`, which collects one family per line. Every key upstream reads is known here; a key
//! upstream does not know, a malformed line or a malformed value is an error naming the key and line.

use std::collections::BTreeMap;

use crate::Error;

/// The whole cloud-config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// The `[Global]` section.
    pub global: Global,
    /// The `[ServiceOverride "<name>"]` sections, by name.
    pub service_overrides: BTreeMap<String, ServiceOverride>,
}

/// An IP family of node addresses (`NodeIPFamilies`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeIpFamily {
    /// `ipv4`: the instance's private (and public) IPv4 addresses.
    Ipv4,
    /// `ipv6`: the IPv6 addresses of the instance's network interfaces.
    Ipv6,
}

/// The `[Global]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Global {
    /// `Zone`: the zone the manager runs in; its region is used when `Region` is not set.
    pub zone: Option<String>,
    /// `Region`: the AWS region (else `Zone`'s region, else the SDK's region settings).
    pub region: Option<String>,
    /// `VPC`: the cluster's VPC (else the VPC of the cluster's instances).
    pub vpc: Option<String>,
    /// `SubnetID`: the subnet used to find the VPC and the route table.
    pub subnet_id: Option<String>,
    /// `RouteTableID`: the route table for pod routes (else the tables tagged with the cluster tag).
    pub route_table_id: Option<String>,
    /// `RoleARN`: a role to assume for every AWS call.
    pub role_arn: Option<String>,
    /// `SourceARN`: the source ARN passed when assuming `RoleARN`.
    pub source_arn: Option<String>,
    /// `KubernetesClusterTag`: the legacy cluster ID (tag `KubernetesCluster`).
    pub kubernetes_cluster_tag: Option<String>,
    /// `KubernetesClusterID`: the cluster ID (tag `kubernetes.io/cluster/<ID>`).
    pub kubernetes_cluster_id: Option<String>,
    /// `DisableSecurityGroupIngress`: do not create security groups for load balancers nor open the
    /// nodes' security group to them.
    pub disable_security_group_ingress: bool,
    /// `ElbSecurityGroup`: a security group every Classic ELB uses instead of one created per Service.
    pub elb_security_group: Option<String>,
    /// `NodeIPFamilies`: the families of node addresses, in order (default: `ipv4`).
    pub node_ip_families: Vec<NodeIpFamily>,
    /// `ClusterServiceLoadBalancerHealthProbeMode` with its port and path: how the load balancers of
    /// Services with `externalTrafficPolicy: Cluster` check the nodes.
    pub cluster_health_probe: ClusterHealthProbe,
    /// `SupportedTopologyInstanceTypePattern`: the instance types that must have a network topology
    /// (a regular expression, checked when the file is read; default: upstream's, see `topology`).
    pub supported_topology_instance_type_pattern: Option<String>,
    /// `NLBSecurityGroupMode`: whether a new NLB gets a security group of its own.
    pub nlb_security_group_mode: NlbSecurityGroupMode,
    /// `DriftCheckCallsPerSecond` (ours): the most AWS calls a second the drift check and shadow-mode
    /// previews make to each API (EC2, ELB, ELBv2); 0 for no limit. Default
    /// `DEFAULT_DRIFT_CHECK_CALLS_PER_SECOND` (2).
    pub drift_check_calls_per_second: u32,
}

/// The default of `DriftCheckCallsPerSecond`: a fifth of the rate at which ELB refills an account's
/// `Describe*` bucket in a region (10 a second, for each ELB API version), so the checks leave the rest
/// to syncs and to every other tool of the account.
pub const DEFAULT_DRIFT_CHECK_CALLS_PER_SECOND: u32 = 2;

/// Upstream's `NLBSecurityGroupMode`: whether a new NLB gets a security group of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NlbSecurityGroupMode {
    /// Unset (upstream's default): NLBs have no security group; client and health rules go into the
    /// nodes' groups, and `aws-load-balancer-security-groups` is refused on an NLB.
    #[default]
    Unmanaged,
    /// `Managed`: each new NLB gets `k8s-<namespace>-<name>-<hash>` with its listeners' ports open to
    /// the source ranges (or the groups of `aws-load-balancer-security-groups` instead, left as they
    /// are), deleted with it. An NLB made without security groups keeps none: AWS cannot add them.
    Managed,
}

/// How the load balancers of Services with `externalTrafficPolicy: Cluster` check the nodes (upstream's
/// `ClusterServiceLoadBalancerHealthProbeMode`). A Service with `externalTrafficPolicy: Local` is
/// always checked on its own health-check node port.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ClusterHealthProbe {
    /// `ServiceNodePort` (or unset): the Service's own traffic port (TCP; Classic: its first node port).
    #[default]
    ServiceNodePort,
    /// `Shared`: HTTP on kube-proxy's health port on every node, so that a node which cannot proxy, or
    /// is shutting down, fails the check before it stops routing. The Service's healthcheck annotations
    /// keep upstream's precedence: a Classic ELB's protocol, port and path annotations override this,
    /// an NLB's do not (its interval, timeout and thresholds still apply).
    Shared {
        /// `ClusterServiceSharedLoadBalancerHealthProbePort` (default 10256, kube-proxy's).
        port: u16,
        /// `ClusterServiceSharedLoadBalancerHealthProbePath` (default `/healthz`).
        path: String,
    },
}

/// kube-proxy's health port and path, the shared probe's defaults (upstream's
/// `defaultKubeProxyHealthCheckPort` and `…Path`).
pub const KUBE_PROXY_HEALTH_PORT: u16 = 10256;
/// See [`KUBE_PROXY_HEALTH_PORT`].
pub const KUBE_PROXY_HEALTH_PATH: &str = "/healthz";

impl Default for Global {
    fn default() -> Self {
        Self {
            zone: None,
            region: None,
            vpc: None,
            subnet_id: None,
            route_table_id: None,
            role_arn: None,
            source_arn: None,
            kubernetes_cluster_tag: None,
            kubernetes_cluster_id: None,
            disable_security_group_ingress: false,
            elb_security_group: None,
            node_ip_families: vec![NodeIpFamily::Ipv4],
            cluster_health_probe: ClusterHealthProbe::ServiceNodePort,
            supported_topology_instance_type_pattern: None,
            nlb_security_group_mode: NlbSecurityGroupMode::Unmanaged,
            drift_check_calls_per_second: DEFAULT_DRIFT_CHECK_CALLS_PER_SECOND,
        }
    }
}

/// The AWS service a `[ServiceOverride]` section redirects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OverriddenService {
    /// `ec2` (also spelled `EC2`, as aws-sdk-go-v2's service ID).
    Ec2,
    /// Classic ELB: `elasticloadbalancing` (aws-sdk-go-v2: `Elastic Load Balancing`).
    Elb,
    /// ELBv2: `elasticloadbalancingv2` (aws-sdk-go-v2: `Elastic Load Balancing v2`).
    ElbV2,
    /// STS (`sts`), used for `RoleARN`.
    Sts,
}

impl OverriddenService {
    /// Parses the `Service` value as upstream's service IDs (v1 and v2 SDK spellings), case-insensitively.
    fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "ec2" => Some(Self::Ec2),
            "elasticloadbalancing" | "elastic load balancing" | "elb" => Some(Self::Elb),
            "elasticloadbalancingv2" | "elastic load balancing v2" | "elbv2" => Some(Self::ElbV2),
            "sts" => Some(Self::Sts),
            _ => None,
        }
    }

    /// The service's SigV4 signing name.
    pub fn signing_name(self) -> &'static str {
        match self {
            Self::Ec2 => "ec2",
            Self::Elb | Self::ElbV2 => "elasticloadbalancing",
            Self::Sts => "sts",
        }
    }
}

/// A `[ServiceOverride "<name>"]` section: another endpoint for one service in one region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOverride {
    /// `Service`.
    pub service: OverriddenService,
    /// `Region`: the override applies when the provider runs in this region.
    pub region: String,
    /// `URL`: the endpoint.
    pub url: String,
    /// `SigningRegion`: the region requests are signed for.
    pub signing_region: String,
}

/// The keys a `[ServiceOverride]` section takes (lower-cased).
const OVERRIDE_KEYS: [&str; 6] = [
    "service",
    "region",
    "url",
    "signingregion",
    "signingmethod",
    "signingname",
];

/// One line of a cloud-config.
enum Line<'a> {
    /// Empty, or a comment.
    Blank,
    /// A section header.
    Header(Section),
    /// `key = value` (gcfg: a key alone is a boolean set to true).
    Key(&'a str, String),
}

/// What `raw` is; a malformed header, value or key name is said in words.
fn read_line(raw: &str) -> Result<Line<'_>, String> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
        return Ok(Line::Blank);
    }
    if let Some(rest) = line.strip_prefix('[') {
        let header = strip_comment(rest);
        let inner = header
            .strip_suffix(']')
            .ok_or_else(|| format!("section header {line:?} has no closing ']'"))?;
        return parse_section(inner.trim()).map(Line::Header);
    }
    let (key, value) = match line.split_once('=') {
        Some((key, value)) => (key.trim(), parse_value(value)?),
        None => (strip_comment(line).trim(), "true".to_owned()),
    };
    if key.is_empty()
        || !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(format!("{key:?} is not a valid key name"));
    }
    Ok(Line::Key(key, value))
}

/// The `[ServiceOverride]` sections resolved, two for the same service and region refused.
fn resolve_overrides(
    overrides: BTreeMap<String, RawOverride>,
    err: &dyn Fn(usize, String) -> Error,
) -> Result<BTreeMap<String, ServiceOverride>, Error> {
    let mut resolved_all = BTreeMap::new();
    let mut seen = BTreeMap::new();
    for (name, raw) in overrides {
        let resolved = raw.resolve(&name, err)?;
        if let Some(other) = seen.insert((resolved.service, resolved.region.clone()), name.clone())
        {
            let service_text = raw.keys.get("service").map_or("", |(_, v)| v.trim());
            return Err(err(
                raw.line,
                format!(
                    "duplicate entry found for service override [{name}] ({service_text} in {}; also in [{other}])",
                    resolved.region
                ),
            ));
        }
        resolved_all.insert(name, resolved);
    }
    Ok(resolved_all)
}

/// Which section a line is in.
enum Section {
    None,
    Global,
    Override(String),
}

/// The `[Global]` section while it is read: the keys read so far, and those resolved together once the
/// file is read (the health-probe keys, as (line, key as written, value)).
#[derive(Default)]
struct GlobalReader {
    global: Global,
    families_given: bool,
    probe_mode: Option<(usize, String, String)>,
    probe_port: Option<(usize, String, String)>,
    probe_path: Option<(usize, String, String)>,
}

impl GlobalReader {
    /// Reads the line `line_no`: `key` as written (`lower`: lowercased) and its `value`; what is wrong
    /// with it, in words.
    fn read(
        &mut self,
        key: &str,
        lower: &str,
        value: String,
        line_no: usize,
    ) -> Result<(), String> {
        let g = &mut self.global;
        let opt = |v: String| (!v.is_empty()).then_some(v);
        match lower {
            "zone" => g.zone = opt(value),
            "region" => g.region = opt(value),
            "vpc" => g.vpc = opt(value),
            "subnetid" => g.subnet_id = opt(value),
            "routetableid" => g.route_table_id = opt(value),
            "rolearn" => g.role_arn = opt(value),
            "sourcearn" => g.source_arn = opt(value),
            "kubernetesclustertag" => g.kubernetes_cluster_tag = opt(value),
            "kubernetesclusterid" => g.kubernetes_cluster_id = opt(value),
            "elbsecuritygroup" => g.elb_security_group = opt(value),
            "disablesecuritygroupingress" => {
                g.disable_security_group_ingress = parse_bool(&value).ok_or_else(|| {
                    format!("[Global] {key}: {value:?} is not a boolean (true/false, yes/no, on/off, 1/0)")
                })?;
            }
            "nodeipfamilies" => self.add_node_ip_family(key, &value)?,
            "supportedtopologyinstancetypepattern" => {
                check_pattern(key, &value)?;
                g.supported_topology_instance_type_pattern = opt(value);
            }
            "clusterserviceloadbalancerhealthprobemode" => {
                self.probe_mode = Some((line_no, key.to_owned(), value));
            }
            "clusterservicesharedloadbalancerhealthprobeport" => {
                self.probe_port = Some((line_no, key.to_owned(), value));
            }
            "clusterservicesharedloadbalancerhealthprobepath" => {
                self.probe_path = Some((line_no, key.to_owned(), value));
            }
            "nlbsecuritygroupmode" => {
                g.nlb_security_group_mode = nlb_security_group_mode(key, &value)?;
            }
            "driftcheckcallspersecond" => {
                g.drift_check_calls_per_second = calls_per_second(key, &value)?;
            }
            _ => return Err(format!("unknown key {key:?} in [Global]")),
        }
        Ok(())
    }

    /// Adds the `NodeIPFamilies` line `value` (`key` as written) to the families: the first line
    /// replaces the default, a family listed twice is refused.
    fn add_node_ip_family(&mut self, key: &str, value: &str) -> Result<(), String> {
        let family = node_ip_family(key, value)?;
        let families = &mut self.global.node_ip_families;
        if !self.families_given {
            families.clear();
            self.families_given = true;
        }
        if families.contains(&family) {
            return Err(format!("[Global] {key}: {value:?} is listed twice"));
        }
        families.push(family);
        Ok(())
    }
}

/// A `NodeIPFamilies` value (`key` as written): `ipv4` or `ipv6`, in any case.
fn node_ip_family(key: &str, value: &str) -> Result<NodeIpFamily, String> {
    match value.to_ascii_lowercase().as_str() {
        "ipv4" => Ok(NodeIpFamily::Ipv4),
        "ipv6" => Ok(NodeIpFamily::Ipv6),
        _ => Err(format!(
            "[Global] {key}: {value:?} is not an IP family (ipv4 or ipv6)"
        )),
    }
}

/// Checks that the `SupportedTopologyInstanceTypePattern` value (`key` as written) is a regular
/// expression.
fn check_pattern(key: &str, value: &str) -> Result<(), String> {
    regex_lite::Regex::new(value)
        .map(drop)
        .map_err(|e| format!("[Global] {key}: {value:?} is not a regular expression: {e}"))
}

/// An `NLBSecurityGroupMode` value (`key` as written): `Managed`, or empty. Upstream compares the
/// value as written and fails every NLB sync on any other; here the file is refused where it says so.
fn nlb_security_group_mode(key: &str, value: &str) -> Result<NlbSecurityGroupMode, String> {
    match value {
        "" => Ok(NlbSecurityGroupMode::Unmanaged),
        "Managed" => Ok(NlbSecurityGroupMode::Managed),
        _ => Err(format!(
            "[Global] {key}: {value:?} is not an NLB security group mode (Managed, or unset)"
        )),
    }
}

/// A `DriftCheckCallsPerSecond` value (`key` as written): a whole number, 0 for no limit.
fn calls_per_second(key: &str, value: &str) -> Result<u32, String> {
    value.parse().map_err(|_| {
        format!(
            "[Global] {key}: {value:?} is not a whole number of calls a second (0 for no limit)"
        )
    })
}

/// One `[ServiceOverride]` section while it is read: each key with the line it came from.
#[derive(Default)]
struct RawOverride {
    line: usize,
    keys: BTreeMap<String, (usize, String)>,
}

impl RawOverride {
    /// The override the section `name` defines, every key checked; `err` names the file and line.
    fn resolve(
        &self,
        name: &str,
        err: &dyn Fn(usize, String) -> Error,
    ) -> Result<ServiceOverride, Error> {
        let get = |key: &str| {
            self.keys
                .get(key)
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_default()
        };
        let missing = |what: &str, key: &str| {
            err(
                self.line,
                format!("[ServiceOverride {name:?}]: {what} is missing [{key} is \"\"]"),
            )
        };
        let service_text = get("service");
        if service_text.is_empty() {
            return Err(missing("service name", "Service"));
        }
        let line_of = |key: &str| self.keys.get(key).map(|(l, _)| *l).unwrap_or(self.line);
        let service = OverriddenService::parse(&service_text).ok_or_else(|| {
            err(
                line_of("service"),
                format!("[ServiceOverride {name:?}] Service: {service_text:?} is not a service this provider calls (ec2, elasticloadbalancing, elasticloadbalancingv2, sts)"),
            )
        })?;
        let region = get("region");
        if region.is_empty() {
            return Err(missing("service region", "Region"));
        }
        let url = get("url");
        if url.is_empty() {
            return Err(missing("url", "URL"));
        }
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(err(
                line_of("url"),
                format!(
                    "[ServiceOverride {name:?}] URL: {url:?} is not an http:// or https:// URL"
                ),
            ));
        }
        let signing_region = get("signingregion");
        if signing_region.is_empty() {
            return Err(missing("signingRegion", "SigningRegion"));
        }
        let method = get("signingmethod");
        if !method.is_empty()
            && !method.eq_ignore_ascii_case("v4")
            && !method.eq_ignore_ascii_case("sigv4")
        {
            return Err(err(
                line_of("signingmethod"),
                format!(
                    "[ServiceOverride {name:?}] SigningMethod: {method:?} is not supported (only SigV4: \"v4\" or empty)"
                ),
            ));
        }
        let signing_name = get("signingname");
        if !signing_name.is_empty() && signing_name != service.signing_name() {
            return Err(err(
                line_of("signingname"),
                format!(
                    "[ServiceOverride {name:?}] SigningName: {signing_name:?} differs from the service's own ({:?}), which this provider cannot change",
                    service.signing_name()
                ),
            ));
        }
        Ok(ServiceOverride {
            service,
            region,
            url,
            signing_region,
        })
    }
}

impl Config {
    /// Parses a cloud-config. `source` names the file in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self, Error> {
        let err = |line: usize, message: String| Error::Config {
            source_name: source.to_owned(),
            line,
            message,
        };
        let mut globals = GlobalReader::default();
        let mut section = Section::None;
        let mut overrides: BTreeMap<String, RawOverride> = BTreeMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line_no = index + 1;
            let (key, value) = match read_line(raw).map_err(|m| err(line_no, m))? {
                Line::Blank => continue,
                Line::Header(header) => {
                    if let Section::Override(name) = &header {
                        overrides
                            .entry(name.clone())
                            .or_insert_with(|| RawOverride {
                                line: line_no,
                                keys: BTreeMap::new(),
                            });
                    }
                    section = header;
                    continue;
                }
                Line::Key(key, value) => (key, value),
            };
            let lower = key.to_ascii_lowercase();
            match &section {
                Section::None => {
                    return Err(err(
                        line_no,
                        format!(
                            "key {key:?} appears before any section ([Global] or [ServiceOverride \"<name>\"])"
                        ),
                    ));
                }
                Section::Global => {
                    globals
                        .read(key, &lower, value, line_no)
                        .map_err(|m| err(line_no, m))?;
                }
                Section::Override(name) => {
                    if !OVERRIDE_KEYS.contains(&lower.as_str()) {
                        return Err(err(
                            line_no,
                            format!("unknown key {key:?} in [ServiceOverride {name:?}]"),
                        ));
                    }
                    if let Some(raw) = overrides.get_mut(name) {
                        raw.keys.insert(lower, (line_no, value));
                    }
                }
            }
        }
        let mut config = Config {
            global: globals.global,
            ..Config::default()
        };
        if let (Some(legacy), Some(id)) = (
            &config.global.kubernetes_cluster_tag,
            &config.global.kubernetes_cluster_id,
        ) && legacy != id
        {
            return Err(Error::Config {
                source_name: source.to_owned(),
                line: 0,
                message: format!(
                    "[Global] KubernetesClusterTag {legacy:?} and KubernetesClusterID {id:?} differ (upstream: \"clusterID tags did not match\")"
                ),
            });
        }
        config.global.cluster_health_probe =
            cluster_health_probe(globals.probe_mode, globals.probe_port, globals.probe_path)
                .map_err(|(l, m)| err(l, m))?;
        config.service_overrides = resolve_overrides(overrides, &err)?;
        Ok(config)
    }

    /// The cluster ID: `KubernetesClusterID`, else the legacy `KubernetesClusterTag`.
    pub fn cluster_id(&self) -> Option<&str> {
        self.global
            .kubernetes_cluster_id
            .as_deref()
            .or(self.global.kubernetes_cluster_tag.as_deref())
    }

    /// The region given by the file: `Region`, else `Zone` without its last letter (`us-west-2a` →
    /// `us-west-2`, upstream's `azToRegion`).
    pub fn region(&self) -> Option<String> {
        if let Some(region) = &self.global.region {
            return Some(region.clone());
        }
        self.global.zone.as_deref().and_then(zone_to_region)
    }

    /// The override for `service` in `region`, if any.
    pub fn service_override(
        &self,
        service: OverriddenService,
        region: &str,
    ) -> Option<&ServiceOverride> {
        self.service_overrides
            .values()
            .find(|o| o.service == service && o.region == region)
    }
}

/// The region of an availability zone: the zone without its trailing letter; `None` when it has none.
pub fn zone_to_region(zone: &str) -> Option<String> {
    let last = zone.chars().last()?;
    (last.is_ascii_lowercase() && zone.len() > 1).then(|| zone[..zone.len() - 1].to_owned())
}

fn parse_section(inner: &str) -> Result<Section, String> {
    let (name, sub) = match inner.split_once(char::is_whitespace) {
        Some((name, rest)) => (name, Some(rest.trim())),
        None => (inner, None),
    };
    match (name.to_ascii_lowercase().as_str(), sub) {
        ("global", None) => Ok(Section::Global),
        ("serviceoverride", Some(sub)) => {
            let quoted = sub
                .strip_prefix('"')
                .and_then(|s| s.strip_suffix('"'))
                .ok_or_else(|| format!("section [{inner}]: the name must be double-quoted, as [ServiceOverride \"1\"]"))?;
            if quoted.is_empty() {
                return Err(format!("section [{inner}] has an empty name"));
            }
            Ok(Section::Override(quoted.to_owned()))
        }
        ("serviceoverride", None) => Err(format!(
            "section [{inner}] needs a name, as [ServiceOverride \"1\"]"
        )),
        ("global", Some(_)) => Err(format!("section [{inner}]: [Global] takes no name")),
        _ => Err(format!(
            "unknown section [{inner}] (known: [Global], [ServiceOverride \"<name>\"])"
        )),
    }
}

/// Cuts a trailing `;`/`#` comment off an unquoted text.
fn strip_comment(text: &str) -> &str {
    match text.find([';', '#']) {
        Some(at) => &text[..at],
        None => text,
    }
}

/// A value as gcfg reads it: trimmed, quoted parts unquoted with escapes, a comment cut.
fn parse_value(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let mut out = String::new();
    let mut chars = raw.chars();
    let mut quoted = false;
    let mut pending_space = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                out.push_str(&pending_space);
                pending_space.clear();
            }
            '\\' => {
                let escaped = match chars.next() {
                    Some('"') => '"',
                    Some('\\') => '\\',
                    Some('n') => '\n',
                    Some('t') => '\t',
                    Some(other) => return Err(format!("value {raw:?}: unknown escape \\{other}")),
                    None => return Err(format!("value {raw:?} ends with a lone backslash")),
                };
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(escaped);
            }
            ';' | '#' if !quoted => break,
            c if c.is_whitespace() && !quoted => pending_space.push(c),
            c => {
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(c);
            }
        }
    }
    if quoted {
        return Err(format!("value {raw:?} has an unclosed double quote"));
    }
    Ok(out)
}

/// The health-probe mode from its three keys, each as (line, key as written, value): upstream's values
/// (`Shared`, `ServiceNodePort`, or empty), a port (0 or unset: 10256) and a path (unset: `/healthz`).
/// What upstream would ignore is refused: a port or path without `Shared`, a path AWS would reject.
fn cluster_health_probe(
    mode: Option<(usize, String, String)>,
    port: Option<(usize, String, String)>,
    path: Option<(usize, String, String)>,
) -> Result<ClusterHealthProbe, (usize, String)> {
    let shared = match &mode {
        Some((_, _, value)) if value == "Shared" => true,
        None => false,
        Some((_, _, value)) if value.is_empty() || value == "ServiceNodePort" => false,
        Some((line, key, value)) => {
            return Err((
                *line,
                format!(
                    "[Global] {key}: {value:?} is not a health-probe mode (Shared or ServiceNodePort; upstream: \"Unsupported ClusterServiceLoadBalancerHealthProbeMode\")"
                ),
            ));
        }
    };
    if !shared {
        if let Some((line, key, _)) = port.as_ref().or(path.as_ref()) {
            return Err((
                *line,
                format!(
                    "[Global] {key} only applies with ClusterServiceLoadBalancerHealthProbeMode = Shared (upstream ignores it otherwise); set the mode or remove it"
                ),
            ));
        }
        return Ok(ClusterHealthProbe::ServiceNodePort);
    }
    let port = match port {
        None => KUBE_PROXY_HEALTH_PORT,
        Some((line, key, value)) => match value.trim().parse::<u16>() {
            Ok(0) => KUBE_PROXY_HEALTH_PORT,
            Ok(n) => n,
            Err(_) => {
                return Err((
                    line,
                    format!("[Global] {key}: {value:?} is not a port number (1-65535)"),
                ));
            }
        },
    };
    let path = match path {
        None => KUBE_PROXY_HEALTH_PATH.to_owned(),
        Some((_, _, value)) if value.is_empty() => KUBE_PROXY_HEALTH_PATH.to_owned(),
        Some((line, key, value))
            if !value.starts_with('/') || value.contains(char::is_whitespace) =>
        {
            return Err((
                line,
                format!(
                    "[Global] {key}: {value:?} is not an HTTP path (it must start with / and hold no blanks)"
                ),
            ));
        }
        Some((_, _, value)) => value,
    };
    Ok(ClusterHealthProbe::Shared { port, path })
}

fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" | "" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, Error> {
        Config::parse(text, "cloud.conf")
    }

    fn error(text: &str) -> String {
        parse(text).expect_err("the config is rejected").to_string()
    }

    #[test]
    fn reads_every_global_key_case_insensitively() {
        let config = parse(
            r#"
; upstream's own example, plus comments
[global]
Zone = us-west-2a
vpc = vpc-123  # trailing comment
SubnetID = "subnet-1"
RouteTableID=rtb-9
KubernetesClusterID = prod
KubernetesClusterTag = prod
RoleARN = arn:aws:iam::123456789012:role/ccm
DisableSecurityGroupIngress = yes
ElbSecurityGroup = sg-1
NodeIPFamilies = ipv6
NodeIPFamilies = ipv4
"#,
        )
        .unwrap();
        let g = &config.global;
        assert_eq!(g.zone.as_deref(), Some("us-west-2a"));
        assert_eq!(g.vpc.as_deref(), Some("vpc-123"));
        assert_eq!(g.subnet_id.as_deref(), Some("subnet-1"));
        assert_eq!(g.route_table_id.as_deref(), Some("rtb-9"));
        assert_eq!(config.cluster_id(), Some("prod"));
        assert_eq!(
            g.role_arn.as_deref(),
            Some("arn:aws:iam::123456789012:role/ccm")
        );
        assert!(g.disable_security_group_ingress);
        assert_eq!(g.elb_security_group.as_deref(), Some("sg-1"));
        assert_eq!(
            g.node_ip_families,
            vec![NodeIpFamily::Ipv6, NodeIpFamily::Ipv4]
        );
        assert_eq!(config.region().as_deref(), Some("us-west-2"));
    }

    #[test]
    fn defaults_without_a_file_body() {
        let config = parse("").unwrap();
        assert_eq!(config.global.node_ip_families, vec![NodeIpFamily::Ipv4]);
        assert_eq!(config.cluster_id(), None);
        assert_eq!(config.region(), None);
        assert!(!config.global.disable_security_group_ingress);
    }

    #[test]
    fn legacy_cluster_tag_is_the_cluster_id_and_must_agree() {
        let config = parse("[Global]\nKubernetesClusterTag = old\n").unwrap();
        assert_eq!(config.cluster_id(), Some("old"));
        let message = error("[Global]\nKubernetesClusterTag = a\nKubernetesClusterID = b\n");
        assert!(
            message.contains("KubernetesClusterTag \"a\" and KubernetesClusterID \"b\" differ"),
            "{message}"
        );
    }

    #[test]
    fn region_wins_over_zone() {
        let config = parse("[Global]\nZone = eu-west-1b\nRegion = us-east-2\n").unwrap();
        assert_eq!(config.region().as_deref(), Some("us-east-2"));
    }

    #[test]
    fn service_overrides_as_upstream_writes_them() {
        let config = parse(
            r#"
[Global]
Region = us-west-2
[ServiceOverride "1"]
Service = ec2
Region = us-west-2
URL = http://127.0.0.1:5000
SigningRegion = us-west-2
[ServiceOverride "2"]
Service = Elastic Load Balancing v2
Region = us-west-2
URL = http://127.0.0.1:5001
SigningRegion = us-west-2
SigningName = elasticloadbalancing
SigningMethod = v4
"#,
        )
        .unwrap();
        let ec2 = config
            .service_override(OverriddenService::Ec2, "us-west-2")
            .unwrap();
        assert_eq!(ec2.url, "http://127.0.0.1:5000");
        let elbv2 = config
            .service_override(OverriddenService::ElbV2, "us-west-2")
            .unwrap();
        assert_eq!(elbv2.url, "http://127.0.0.1:5001");
        assert!(
            config
                .service_override(OverriddenService::Elb, "us-west-2")
                .is_none()
        );
        assert!(
            config
                .service_override(OverriddenService::Ec2, "eu-west-1")
                .is_none()
        );
    }

    #[test]
    fn the_nlb_security_group_mode_is_managed_or_unset() {
        let mode = |text: &str| {
            Config::parse(text, "cloud.conf")
                .unwrap()
                .global
                .nlb_security_group_mode
        };
        assert_eq!(mode("[Global]\n"), NlbSecurityGroupMode::Unmanaged);
        assert_eq!(
            mode("[Global]\nNLBSecurityGroupMode = \"\"\n"),
            NlbSecurityGroupMode::Unmanaged
        );
        assert_eq!(
            mode("[Global]\nnlbsecuritygroupmode = Managed\n"),
            NlbSecurityGroupMode::Managed
        );
    }

    #[test]
    fn the_drift_check_budget_is_a_whole_number_of_calls_a_second() {
        let budget = |text: &str| {
            Config::parse(text, "cloud.conf")
                .map(|c| c.global.drift_check_calls_per_second)
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            budget("[Global]\n"),
            Ok(DEFAULT_DRIFT_CHECK_CALLS_PER_SECOND)
        );
        assert_eq!(budget("[Global]\nDriftCheckCallsPerSecond = 8\n"), Ok(8));
        assert_eq!(budget("[Global]\ndriftcheckcallspersecond = 0\n"), Ok(0));
        for bad in ["-1", "2.5", "fast", ""] {
            let refused =
                budget(&format!("[Global]\nDriftCheckCallsPerSecond = {bad}\n")).unwrap_err();
            assert!(
                refused.contains("line 2")
                    && refused.contains("DriftCheckCallsPerSecond")
                    && refused.contains("whole number"),
                "{bad:?}: {refused}"
            );
        }
    }

    #[test]
    fn the_shared_health_probe_takes_upstreams_keys_and_defaults() {
        let probe = |text: &str| {
            Config::parse(text, "cloud.conf")
                .unwrap()
                .global
                .cluster_health_probe
        };
        assert_eq!(probe("[Global]\n"), ClusterHealthProbe::ServiceNodePort);
        assert_eq!(
            probe("[Global]\nClusterServiceLoadBalancerHealthProbeMode = ServiceNodePort\n"),
            ClusterHealthProbe::ServiceNodePort
        );
        assert_eq!(
            probe("[Global]\nClusterServiceLoadBalancerHealthProbeMode = Shared\n"),
            ClusterHealthProbe::Shared {
                port: 10256,
                path: "/healthz".into()
            }
        );
        assert_eq!(
            probe(
                "[Global]\nclusterservicesharedloadbalancerhealthprobepath = /livez\nClusterServiceLoadBalancerHealthProbeMode = Shared\nClusterServiceSharedLoadBalancerHealthProbePort = 10257\n"
            ),
            ClusterHealthProbe::Shared {
                port: 10257,
                path: "/livez".into()
            }
        );
        // Port 0 is upstream's "unset".
        assert_eq!(
            probe(
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = Shared\nClusterServiceSharedLoadBalancerHealthProbePort = 0\n"
            ),
            ClusterHealthProbe::Shared {
                port: 10256,
                path: "/healthz".into()
            }
        );
    }

    #[test]
    fn unknown_keys_name_the_key_and_line() {
        let message = error("[Global]\nZone = a\nZoen = us-west-2a\n");
        assert_eq!(
            message,
            "cloud-config cloud.conf, line 3: unknown key \"Zoen\" in [Global]"
        );
        let message = error("[ServiceOverride \"x\"]\nService = ec2\nEndpoint = http://h\n");
        assert!(
            message.contains("line 3") && message.contains("unknown key \"Endpoint\""),
            "{message}"
        );
    }

    #[test]
    fn malformed_lines_and_values_are_named() {
        for (text, expected) in [
            (
                "[Global\nZone = a\n",
                "line 1: section header \"[Global\" has no closing ']'",
            ),
            ("[Globl]\n", "line 1: unknown section [Globl]"),
            (
                "[ServiceOverride]\n",
                "line 1: section [ServiceOverride] needs a name",
            ),
            ("[ServiceOverride 1]\n", "must be double-quoted"),
            (
                "Zone = a\n",
                "line 1: key \"Zone\" appears before any section",
            ),
            (
                "[Global]\nDisableSecurityGroupIngress = maybe\n",
                "line 2: [Global] DisableSecurityGroupIngress: \"maybe\" is not a boolean",
            ),
            (
                "[Global]\nNodeIPFamilies = ipv5\n",
                "line 2: [Global] NodeIPFamilies: \"ipv5\" is not an IP family",
            ),
            (
                "[Global]\nNodeIPFamilies = ipv4\nNodeIPFamilies = IPv4\n",
                "line 3: [Global] NodeIPFamilies: \"IPv4\" is listed twice",
            ),
            (
                "[Global]\nZone = \"us-west-2a\n",
                "line 2: value \"\\\"us-west-2a\" has an unclosed double quote",
            ),
            (
                "[Global]\nZone = a\\qb\n",
                "line 2: value \"a\\\\qb\": unknown escape \\q",
            ),
            (
                "[Global]\nzo ne = a\n",
                "line 2: \"zo ne\" is not a valid key name",
            ),
            (
                "[Global]\nNLBSecurityGroupMode = managed\n",
                "line 2: [Global] NLBSecurityGroupMode: \"managed\" is not an NLB security group mode (Managed, or unset)",
            ),
            (
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = shared\n",
                "line 2: [Global] ClusterServiceLoadBalancerHealthProbeMode: \"shared\" is not a health-probe mode",
            ),
            (
                "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 10256\n",
                "line 2: [Global] ClusterServiceSharedLoadBalancerHealthProbePort only applies with ClusterServiceLoadBalancerHealthProbeMode = Shared",
            ),
            (
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = ServiceNodePort\nClusterServiceSharedLoadBalancerHealthProbePath = /ready\n",
                "line 3: [Global] ClusterServiceSharedLoadBalancerHealthProbePath only applies with",
            ),
            (
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = Shared\nClusterServiceSharedLoadBalancerHealthProbePort = 70000\n",
                "line 3: [Global] ClusterServiceSharedLoadBalancerHealthProbePort: \"70000\" is not a port number",
            ),
            (
                "[Global]\nClusterServiceSharedLoadBalancerHealthProbePath = healthz\nClusterServiceLoadBalancerHealthProbeMode = Shared\n",
                "line 2: [Global] ClusterServiceSharedLoadBalancerHealthProbePath: \"healthz\" is not an HTTP path",
            ),
        ] {
            let message = error(text);
            assert!(
                message.contains(expected),
                "{text:?}: {message:?} lacks {expected:?}"
            );
            assert!(
                message.starts_with("cloud-config cloud.conf, line "),
                "{message}"
            );
        }
    }

    #[test]
    fn incomplete_or_duplicate_overrides_are_rejected() {
        let base = "[ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = http://127.0.0.1:1\nSigningRegion = r\n";
        parse(base).unwrap();
        for (drop, expected) in [
            (
                "\nService = ec2\n",
                "service name is missing [Service is \"\"]",
            ),
            (
                "\nRegion = r\n",
                "service region is missing [Region is \"\"]",
            ),
            (
                "\nURL = http://127.0.0.1:1\n",
                "url is missing [URL is \"\"]",
            ),
            (
                "\nSigningRegion = r\n",
                "signingRegion is missing [SigningRegion is \"\"]",
            ),
        ] {
            let message = error(&base.replace(drop, "\n"));
            assert!(message.contains(expected), "{message}");
            assert!(message.contains("[ServiceOverride \"1\"]"), "{message}");
        }
        let twice = format!("{base}{}", base.replace("\"1\"", "\"2\""));
        let message = error(&twice);
        assert!(
            message
                .contains("duplicate entry found for service override [2] (ec2 in r; also in [1])"),
            "{message}"
        );
        let message = error(&base.replace("Service = ec2", "Service = s3"));
        assert!(
            message.contains("line 2") && message.contains("\"s3\" is not a service"),
            "{message}"
        );
        let message = error(&base.replace("http://127.0.0.1:1", "127.0.0.1:1"));
        assert!(
            message.contains("line 4") && message.contains("is not an http:// or https:// URL"),
            "{message}"
        );
        let message = error(&format!("{base}SigningName = s3\n"));
        assert!(
            message.contains("line 6") && message.contains("SigningName: \"s3\""),
            "{message}"
        );
    }

    #[test]
    fn zone_to_region_strips_the_zone_letter() {
        assert_eq!(zone_to_region("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(zone_to_region("us-east-1"), None);
        assert_eq!(zone_to_region(""), None);
    }

    #[test]
    fn global_values_are_read_or_refused_in_words() {
        for (value, expected) in [
            ("IPv4", Ok(NodeIpFamily::Ipv4)),
            ("ipv6", Ok(NodeIpFamily::Ipv6)),
            (
                "ipv5",
                Err("[Global] NodeIPFamilies: \"ipv5\" is not an IP family (ipv4 or ipv6)"),
            ),
        ] {
            let expected = expected.map_err(str::to_owned);
            assert_eq!(
                node_ip_family("NodeIPFamilies", value),
                expected,
                "{value:?}"
            );
        }
        for (value, expected) in [
            ("", Ok(NlbSecurityGroupMode::Unmanaged)),
            ("Managed", Ok(NlbSecurityGroupMode::Managed)),
            (
                "managed",
                Err(
                    "[Global] Mode: \"managed\" is not an NLB security group mode (Managed, or unset)",
                ),
            ),
        ] {
            let expected = expected.map_err(str::to_owned);
            assert_eq!(
                nlb_security_group_mode("Mode", value),
                expected,
                "{value:?}"
            );
        }
        for (value, expected) in [
            ("0", Ok(0)),
            ("5", Ok(5)),
            (
                "1.5",
                Err(
                    "[Global] Calls: \"1.5\" is not a whole number of calls a second (0 for no limit)",
                ),
            ),
        ] {
            let expected = expected.map_err(str::to_owned);
            assert_eq!(calls_per_second("Calls", value), expected, "{value:?}");
        }
        for (value, valid) in [("^m5\\.", true), ("(", false)] {
            let got = check_pattern("Pattern", value);
            assert_eq!(got.is_ok(), valid, "{value:?}: {got:?}");
            if let Err(message) = got {
                assert!(
                    message.starts_with("[Global] Pattern: \"(\" is not a regular expression: "),
                    "{message}"
                );
            }
        }
    }
}
