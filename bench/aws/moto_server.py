#!/usr/bin/env python3
"""moto_server with two gaps closed, for bench/aws (both managers run against it alike) and the `aws`
provider's tests.

A Classic ELB that real AWS creates always has a health check (target `TCP:<first instance port>`,
interval 30 s, timeout 5 s, unhealthy 2, healthy 10), and DescribeLoadBalancers always returns it.
moto 5.2 returns none until ConfigureHealthCheck is called, and upstream cloud-provider-aws v1.37.0
dereferences it (`ensureLoadBalancerHealthCheck`: `loadBalancer.HealthCheck.Target`) and crashes with a
nil-pointer panic. This wrapper gives moto's new Classic ELBs AWS's default health check, then runs
moto's own server main with the same arguments (`-H`, `-p`).

moto 5.2's Classic ELB listeners have no instance protocol of their own (it reports the listener's
protocol): an HTTPS listener to HTTP nodes reads back as HTTPS to HTTPS. The wrapper keeps the
InstanceProtocol each listener was created with.

DeleteLoadBalancerListeners in moto 5.2 deletes nothing when given more than one port (each port keeps
the listeners of the others); the wrapper deletes exactly the listeners on the ports given.

ModifyListener in moto 5.2 refuses every protocol but HTTP, HTTPS and TCP, where ELBv2 changes an NLB
listener to TLS (with its certificate and policy) or UDP as well, and drops a listener's certificates
and policy when it becomes TCP or UDP. The wrapper does both, checking a TLS certificate as moto checks
an HTTPS one. A target group a listener is changed to forward to is counted as the load balancer's
(moto counts it only for CreateListener), and one no listener forwards to any more is not.

Two differences from AWS that mislead upstream cloud-provider-aws v1.37.0 in particular (found by
bench/aws/handover.py): moto names an NLB `<name>-1.<region>.elb.amazonaws.com`, which ends as a Classic
ELB's name does, where AWS names it `<name>-<16 hex>.elb.<region>.amazonaws.com`; upstream tells the
two kinds apart by that suffix and refuses every sync of its own NLBs after a restart ("cannot update
Load Balancer Type annotation ... after creation for NLB"). And moto's target groups do not report
`preserve_client_ip.enabled` and `proxy_protocol_v2.enabled`, which AWS reports for every NLB target
group (`true` for instance targets, `false`); upstream only sets an attribute AWS reports, so its
`target-group-attributes` annotation does nothing on moto. The wrapper names NLBs and reports the two
attributes as AWS does. And moto gives every new listener a TLS policy (`ELBSecurityPolicy-2016-08`),
plain TCP and UDP ones too, where AWS gives one only to HTTPS and TLS listeners; upstream then sends a
ModifyListener to clear it on every NLB listener after a restart. The wrapper leaves it off.

moto 5.2 drops the addresses of CreateLoadBalancer's SubnetMappings (`AllocationId`,
`PrivateIPv4Address`): the NLB's availability zones come back without `LoadBalancerAddresses`, where
AWS reports the Elastic IP or private address each subnet was given. The wrapper keeps and reports them.

moto 5.2 has no DescribeInstanceTopology (it answers 500). The wrapper answers as AWS does: an empty
list for instance types without a network topology, and for the types that have one (P-series, Trainium,
HPC: upstream's default pattern) three network nodes per instance, layer 1 shared by the region, layer 2
by the zone, layer 3 the instance's own.

Two defaults as AWS reports them (found by bench/aws/differential.py): a new Classic ELB's connection
draining is off with a 300 s timeout (moto reports no timeout until one is written), and an NLB created
without a scheme is `internet-facing` (moto reports none).
"""

import hashlib
import re
import sys

from moto.elb import models
from moto.elbv2 import models as elbv2_models
from moto.elbv2.exceptions import ELBClientError as RESTError
from moto.core.responses import ActionResult
from moto.ec2.responses import EC2Response
from moto.server import main


def _with_default_health_check(create):
    def create_load_balancer(self, name, zones, ports, *args, **kwargs):
        balancer = create(self, name, zones, ports, *args, **kwargs)
        if balancer.health_check is None and balancer.listeners:
            balancer.health_check = models.FakeHealthCheck(
                timeout="5", healthy_threshold="10", unhealthy_threshold="2", interval="30",
                target=f"TCP:{balancer.listeners[0].instance_port}")
        return balancer

    return create_load_balancer


models.ELBBackend.create_load_balancer = _with_default_health_check(models.ELBBackend.create_load_balancer)


def _keeping_instance_protocols(create):
    def create_with_listeners(self, name, *args, **kwargs):
        result = create(self, name, *args, **kwargs)
        ports = kwargs.get("ports")
        if ports is None:
            ports = next((a for a in args if isinstance(a, list) and a and isinstance(a[0], dict)), [])
        balancer = self.load_balancers.get(name)
        for port in ports or []:
            wanted = port.get("InstanceProtocol") or port.get("instance_protocol")
            lb_port = port.get("LoadBalancerPort") or port.get("load_balancer_port")
            for listener in balancer.listeners if balancer else []:
                if wanted and str(listener.load_balancer_port) == str(lb_port):
                    listener.kept_instance_protocol = wanted.upper()
        return result

    return create_with_listeners


def _delete_load_balancer_listeners(self, name, ports):
    balancer = self.get_load_balancer(name)
    if balancer:
        gone = {int(port) for port in ports}
        balancer.listeners = [l for l in balancer.listeners if int(l.load_balancer_port) not in gone]
    return balancer


models.ELBBackend.delete_load_balancer_listeners = _delete_load_balancer_listeners
models.FakeListener.instance_protocol = property(
    lambda self: getattr(self, "kept_instance_protocol", None) or self.protocol)
models.ELBBackend.create_load_balancer = _keeping_instance_protocols(models.ELBBackend.create_load_balancer)
models.ELBBackend.create_load_balancer_listeners = _keeping_instance_protocols(
    models.ELBBackend.create_load_balancer_listeners)


def _recount_target_groups(backend, load_balancer_arn):
    balancer = backend.load_balancers.get(load_balancer_arn)
    used = set()
    for listener in balancer.listeners.values() if balancer else []:
        for action in listener.default_actions:
            if action.type == "forward":
                used.update(backend._get_target_group_arns_from(action_data=action.data))
    for arn, group in backend.target_groups.items():
        if arn in used and load_balancer_arn not in group.load_balancer_arns:
            group.load_balancer_arns.append(load_balancer_arn)
        elif arn not in used and load_balancer_arn in group.load_balancer_arns:
            group.load_balancer_arns.remove(load_balancer_arn)


def _with_network_protocols(modify):
    def modify_listener(self, arn, port=None, protocol=None, ssl_policy=None, certificates=None, actions=None):
        listener = _modify_listener(self, arn, port, protocol, ssl_policy, certificates, actions)
        _recount_target_groups(self, listener.load_balancer_arn)
        return listener

    def _modify_listener(self, arn, port, protocol, ssl_policy, certificates, actions):
        if protocol not in ("TLS", "UDP", "TCP_UDP", "TCP"):
            return modify(self, arn, port, protocol, ssl_policy, certificates, actions)
        listener = modify(self, arn, port, None, None, None, actions)
        listener.protocol = protocol
        if protocol == "TLS":
            if certificates:
                arn_certificate = certificates[0]["CertificateArn"]
                # As moto's CreateListener: IAM server certificates are taken as they are.
                if ":iam:" not in arn_certificate and not self._certificate_exists(certificate_arn=arn_certificate):
                    raise RESTError("CertificateNotFound", f"Certificate {arn_certificate} not found")
                listener.certificate = arn_certificate
                listener.certificates = [c["CertificateArn"] for c in certificates]
            elif not listener.certificates:
                raise RESTError(
                    "InvalidConfigurationRequest",
                    "You must provide a list containing exactly one certificate if the listener protocol is TLS.",
                )
            if ssl_policy is not None:
                listener.ssl_policy = ssl_policy
            elif not listener.ssl_policy:
                listener.ssl_policy = "ELBSecurityPolicy-2016-08"
        else:
            listener.certificate = None
            listener.certificates = []
            listener.ssl_policy = None
        return listener

    return modify_listener


elbv2_models.ELBv2Backend.modify_listener = _with_network_protocols(elbv2_models.ELBv2Backend.modify_listener)


def _aws_default_attributes(defaults):
    def get_default_attributes(cls):
        attributes = defaults.__func__(cls)
        attributes["connection_draining"] = {"enabled": False, "timeout": 300}
        return attributes

    return classmethod(get_default_attributes)


models.LoadBalancer.get_default_attributes = _aws_default_attributes(models.LoadBalancer.get_default_attributes)


def _with_aws_nlb_dns_names(create):
    def create_load_balancer(self, *args, **kwargs):
        balancer = create(self, *args, **kwargs)
        if not balancer.scheme:
            balancer.scheme = "internet-facing"
        if balancer.type == "network":
            lb_id = balancer.arn.rsplit("/", 1)[-1]
            balancer.dns_name = f"{balancer.name}-{lb_id}.elb.{self.region_name}.amazonaws.com"
        return balancer

    return create_load_balancer


elbv2_models.ELBv2Backend.create_load_balancer = _with_aws_nlb_dns_names(
    elbv2_models.ELBv2Backend.create_load_balancer)


def _without_policy_on_plain_listeners(create):
    def create_listener(self, load_balancer_arn, protocol, *args, **kwargs):
        listener = create(self, load_balancer_arn, protocol, *args, **kwargs)
        if protocol not in ("HTTPS", "TLS"):
            listener.ssl_policy = None
        return listener

    return create_listener


elbv2_models.ELBv2Backend.create_listener = _without_policy_on_plain_listeners(
    elbv2_models.ELBv2Backend.create_listener)


def _with_subnet_addresses(create):
    def create_load_balancer(self, *args, **kwargs):
        balancer = create(self, *args, **kwargs)
        balancer._subnet_addresses = {}
        for mapping in kwargs.get("subnet_mappings") or []:
            address = {key: mapping[key] for key in ("AllocationId", "PrivateIPv4Address") if mapping.get(key)}
            if address:
                balancer._subnet_addresses[mapping["SubnetId"]] = address
        return balancer

    return create_load_balancer


def _availability_zones_with_addresses(self):
    zones = []
    for subnet in self.subnets:
        zone = elbv2_models.AvailabilityZone(subnet)
        address = getattr(self, "_subnet_addresses", {}).get(subnet.id)
        if address:
            zone.load_balancer_addresses = [address]
        zones.append(zone)
    return zones


elbv2_models.ELBv2Backend.create_load_balancer = _with_subnet_addresses(elbv2_models.ELBv2Backend.create_load_balancer)
elbv2_models.FakeLoadBalancer.availability_zones = property(_availability_zones_with_addresses)


_TOPOLOGY_TYPES = re.compile(r"^(hpc|trn|p)[0-9]+[a-z]*(-[a-z0-9]+)?(\.[0-9a-z]*)$")


def _network_node(*parts):
    return "nn-" + hashlib.sha1("/".join(parts).encode()).hexdigest()[:17]


def describe_instance_topology(self):
    ids = self._get_param("InstanceIds", [])
    reservations = (self.ec2_backend.get_reservations_by_instance_ids(ids) if ids
                    else self.ec2_backend.describe_instances())
    found = []
    for reservation in reservations:
        for instance in reservation.instances:
            if not _TOPOLOGY_TYPES.match(instance.instance_type) or instance.state == "terminated":
                continue
            zone = instance.placement.zone or ""
            found.append({
                "InstanceId": instance.id,
                "InstanceType": instance.instance_type,
                "NetworkNodes": [_network_node(self.region), _network_node(self.region, zone),
                                 _network_node(instance.id)],
                "AvailabilityZone": zone,
            })
    return ActionResult({"Instances": found})


EC2Response.describe_instance_topology = describe_instance_topology


def _with_network_target_group_attributes(init):
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.protocol in ("TCP", "UDP", "TCP_UDP", "TLS"):
            self.attributes.setdefault("preserve_client_ip.enabled", "true")
            self.attributes.setdefault("proxy_protocol_v2.enabled", "false")

    return __init__


elbv2_models.FakeTargetGroup.__init__ = _with_network_target_group_attributes(elbv2_models.FakeTargetGroup.__init__)

if __name__ == "__main__":
    main(sys.argv[1:])
