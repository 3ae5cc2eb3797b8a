#!/usr/bin/env python3
"""Hand-over from upstream cloud-provider-aws to ours, on one moto and one control plane (issue #29).

Run by `bench/aws/run --handover` (which builds both managers, starts the control plane and picks the moto
virtualenv's python, for boto3). What an operator migrating from upstream does, measured:

  1. moto: a VPC, a public subnet, the nodes' security group and --nodes instances; their Node objects.
  2. **Upstream v1.37.0** initializes the nodes and builds the load balancers of a set of Services (Classic
     ELBs and NLBs, hyphenated names, TLS listeners with a certificate, a UDP port, proxy protocol,
     connection settings, target-group attributes), with the nodes' security-group rules
     (`DisableSecurityGroupIngress` off). It stops. The cloud's state is recorded.
  3. **Upstream again** (a restart over its own resources): the AWS write calls its first sync makes are
     the baseline, "what upstream would also make".
  4. **Ours** starts over the same resources: its write calls on the first sync (until the cloud has been
     quiet for --quiet seconds) against the baseline; the cloud's state after it against the recorded one,
     field by field; the SyncLoadBalancerFailed events it raised (none wanted).
  5. A node joins (a new instance and its Node): the time until every load balancer has it.
  6. Every Service is deleted: the time until moto has no load balancer, target group or load-balancer
     security group left, and the nodes' group has only the rules it had before upstream started.

Writes are every call whose action does not start with Describe, Get or List. Nothing here asserts a
timing. The report (markdown) and the raw record (JSON) go where --out and --json say.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

import bench
from bench import NAMESPACE, Counter, Kube, Manager, Moto, diff, has_hostname, initialized, log, wait_for

CERT = "arn:aws:iam::123456789012:server-certificate/handover"
PREFIX = "service.beta.kubernetes.io/aws-load-balancer-"

# name -> (annotations without the prefix, ports as (name, protocol, port))
SERVICES: dict[str, tuple[dict[str, str], list[tuple[str, str, int]]]] = {
    "web-classic": ({}, [("http", "TCP", 80), ("https", "TCP", 443)]),
    "tls-classic": ({"ssl-cert": CERT, "ssl-ports": "443", "backend-protocol": "http"},
                    [("http", "TCP", 80), ("https", "TCP", 443)]),
    "proxy-classic": ({"proxy-protocol": "*"}, [("tcp", "TCP", 8080)]),
    "tuned-classic": ({"connection-draining-enabled": "true", "connection-draining-timeout": "120",
                       "connection-idle-timeout": "300", "cross-zone-load-balancing-enabled": "true"},
                      [("http", "TCP", 80)]),
    "web-nlb": ({"type": "nlb"}, [("http", "TCP", 80)]),
    "tls-nlb": ({"type": "nlb", "ssl-cert": CERT, "ssl-ports": "443"},
                [("http", "TCP", 80), ("https", "TCP", 443)]),
    "dns-nlb": ({"type": "nlb"}, [("dns", "UDP", 53)]),
    "attrs-nlb": ({"type": "nlb", "target-group-attributes": "preserve_client_ip.enabled=false"},
                  [("http", "TCP", 80)]),
}


def is_write(operation: str) -> bool:
    action = operation.split(":", 1)[-1]
    return not action.startswith(("Describe", "Get", "List"))


def writes(calls: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in calls.items() if is_write(k)}


# --- the cloud's state, for comparison ---------------------------------------------------------------


def cloud_state(moto: Moto, nodes_sg: str) -> dict:
    """Everything a load balancer consists of, in moto, as comparable plain data (ids replaced by names
    where an id is generated)."""
    state: dict = {"classic": {}, "nlb": {}, "target_groups": {}, "security_groups": {}}
    for page in moto.elb.get_paginator("describe_load_balancers").paginate():
        for lb in page["LoadBalancerDescriptions"]:
            name = lb["LoadBalancerName"]
            attrs = moto.elb.describe_load_balancer_attributes(LoadBalancerName=name)["LoadBalancerAttributes"]
            policies = moto.elb.describe_load_balancer_policies(LoadBalancerName=name)["PolicyDescriptions"]
            state["classic"][name] = {
                "scheme": lb.get("Scheme"),
                "listeners": sorted(
                    (d["Listener"]["LoadBalancerPort"], d["Listener"]["Protocol"].upper(),
                     d["Listener"]["InstancePort"], d["Listener"].get("InstanceProtocol", "").upper(),
                     d["Listener"].get("SSLCertificateId"), sorted(d.get("PolicyNames", [])))
                    for d in lb["ListenerDescriptions"]),
                "backend_policies": sorted((b["InstancePort"], sorted(b.get("PolicyNames", [])))
                                           for b in lb.get("BackendServerDescriptions", [])),
                "policies": sorted((p["PolicyName"], p["PolicyTypeName"],
                                    sorted((a["AttributeName"], a["AttributeValue"])
                                           for a in p.get("PolicyAttributeDescriptions", [])))
                                   for p in policies),
                "health_check": lb.get("HealthCheck"),
                "instances": sorted(i["InstanceId"] for i in lb.get("Instances", [])),
                "security_groups": sorted(group_name(moto, g) for g in lb.get("SecurityGroups", [])),
                "attributes": {
                    "cross_zone": attrs.get("CrossZoneLoadBalancing", {}).get("Enabled"),
                    "draining": attrs.get("ConnectionDraining"),
                    "idle_timeout": attrs.get("ConnectionSettings", {}).get("IdleTimeout"),
                    "access_log": attrs.get("AccessLog", {}).get("Enabled"),
                },
            }
    tg_names: dict[str, str] = {}
    for page in moto.elbv2.get_paginator("describe_target_groups").paginate():
        for tg in page["TargetGroups"]:
            tg_names[tg["TargetGroupArn"]] = tg["TargetGroupName"]
            attrs = moto.elbv2.describe_target_group_attributes(TargetGroupArn=tg["TargetGroupArn"])["Attributes"]
            targets = moto.elbv2.describe_target_health(TargetGroupArn=tg["TargetGroupArn"])["TargetHealthDescriptions"]
            state["target_groups"][tg["TargetGroupName"]] = {
                "protocol": tg.get("Protocol"), "port": tg.get("Port"), "target_type": tg.get("TargetType"),
                "health_check": (tg.get("HealthCheckProtocol"), tg.get("HealthCheckPort"),
                                 tg.get("HealthCheckPath"), tg.get("HealthCheckIntervalSeconds"),
                                 tg.get("HealthyThresholdCount"), tg.get("UnhealthyThresholdCount")),
                "attributes": sorted((a["Key"], a["Value"]) for a in attrs
                                     if a["Key"] in ("preserve_client_ip.enabled", "proxy_protocol_v2.enabled",
                                                     "deregistration_delay.timeout_seconds")),
                "targets": sorted((t["Target"]["Id"], t["Target"].get("Port")) for t in targets),
            }
    for page in moto.elbv2.get_paginator("describe_load_balancers").paginate():
        for lb in page["LoadBalancers"]:
            listeners = moto.elbv2.describe_listeners(LoadBalancerArn=lb["LoadBalancerArn"])["Listeners"]
            state["nlb"][lb["LoadBalancerName"]] = {
                "type": lb.get("Type"), "scheme": lb.get("Scheme"), "ip_address_type": lb.get("IpAddressType"),
                "security_groups": sorted(group_name(moto, g) for g in lb.get("SecurityGroups", [])),
                "listeners": sorted(
                    (l["Port"], l["Protocol"], sorted(c["CertificateArn"] for c in l.get("Certificates", [])),
                     l.get("SslPolicy"),
                     sorted(tg_names.get(a.get("TargetGroupArn"), a.get("TargetGroupArn") or "?")
                            for a in l.get("DefaultActions", [])))
                    for l in listeners),
            }
    for page in moto.ec2.get_paginator("describe_security_groups").paginate():
        for sg in page["SecurityGroups"]:
            if sg["GroupName"] == "default":
                continue
            state["security_groups"][sg["GroupName"]] = {
                "description": sg.get("Description"),
                "ingress": sorted(rules(moto, sg["IpPermissions"])),
            }
    return state


_group_names: dict[str, str] = {}


def group_name(moto: Moto, group_id: str) -> str:
    if group_id not in _group_names:
        groups = moto.ec2.describe_security_groups(GroupIds=[group_id])["SecurityGroups"]
        _group_names[group_id] = groups[0]["GroupName"] if groups else group_id
    return _group_names[group_id]


def rules(moto: Moto, permissions: list[dict]) -> list[tuple]:
    out = []
    for p in permissions:
        ports = (p.get("IpProtocol"), p.get("FromPort"), p.get("ToPort"))
        for r in p.get("IpRanges", []):
            out.append((*ports, r.get("CidrIp"), r.get("Description", "")))
        for r in p.get("Ipv6Ranges", []):
            out.append((*ports, r.get("CidrIpv6"), r.get("Description", "")))
        for r in p.get("UserIdGroupPairs", []):
            out.append((*ports, "sg:" + group_name(moto, r["GroupId"]), r.get("Description", "")))
    return out


def differences(before, after, path="") -> list[str]:
    """Every leaf that differs between two states, as `path: before -> after`."""
    if isinstance(before, dict) and isinstance(after, dict):
        out = []
        for key in sorted(set(before) | set(after), key=str):
            where = f"{path}.{key}" if path else str(key)
            if key not in after:
                out.append(f"{where}: gone (was {json.dumps(before[key], default=str)})")
            elif key not in before:
                out.append(f"{where}: new ({json.dumps(after[key], default=str)})")
            else:
                out += differences(before[key], after[key], where)
        return out
    if json.dumps(before, default=str) != json.dumps(after, default=str):
        return [f"{path}: {json.dumps(before, default=str)} -> {json.dumps(after, default=str)}"]
    return []


# --- the managers ------------------------------------------------------------------------------------


def wait_quiet(counter: Counter, quiet: float, at_least: float, timeout: float) -> float:
    """Waits until no AWS call was made for `quiet` seconds, and `at_least` seconds passed; returns when the
    last call was made (seconds from the start)."""
    start = time.monotonic()
    last, last_change = counter.snapshot(), time.monotonic()
    while True:
        time.sleep(0.5)
        now = counter.snapshot()
        if now != last:
            last, last_change = now, time.monotonic()
        if time.monotonic() - last_change >= quiet and time.monotonic() - start >= at_least:
            return last_change - start
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"the cloud never went quiet for {quiet:.0f} s within {timeout:.0f} s")


def failed_syncs(kube: Kube, since: datetime.datetime) -> list[str]:
    """SyncLoadBalancerFailed (and other Warning) events on the Services since `since`."""
    out = []
    for e in kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}/events")["items"]:
        when = e.get("lastTimestamp") or e.get("eventTime") or e["metadata"]["creationTimestamp"]
        when = datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
        if e.get("type") == "Warning" and e["involvedObject"].get("kind") == "Service" and when >= since.replace(microsecond=0):
            out.append(f"{e['involvedObject']['name']}: {e['reason']}: {e.get('message', '')[:300]}")
    return sorted(out)


def create_service(kube: Kube, name: str) -> None:
    annotations, ports = SERVICES[name]
    kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", {
        "metadata": {"name": name, "annotations": {PREFIX + k: v for k, v in annotations.items()}},
        "spec": {"type": "LoadBalancer", "selector": {"app": name},
                 "ports": [{"name": n, "protocol": proto, "port": port, "targetPort": port}
                           for n, proto, port in ports]}})


def hostnames(kube: Kube) -> dict[str, str]:
    out = {}
    for s in kube.services():
        if s["metadata"]["name"] in SERVICES and has_hostname(s):
            out[s["metadata"]["name"]] = s["status"]["loadBalancer"]["ingress"][0]["hostname"]
    return out


def every_backend(moto: Moto, instance: str) -> bool:
    for backends in moto.classic_backends().values():
        if instance not in backends:
            return False
    for page in moto.elbv2.get_paginator("describe_target_groups").paginate():
        for tg in page["TargetGroups"]:
            targets = moto.elbv2.describe_target_health(TargetGroupArn=tg["TargetGroupArn"])["TargetHealthDescriptions"]
            if instance not in {t["Target"]["Id"] for t in targets}:
                return False
    return True


def left_over(moto: Moto, nodes_sg: str, baseline_rules: list) -> list[str]:
    out = []
    if moto.load_balancer_count():
        out.append(f"{moto.load_balancer_count()} load balancers")
    tgs = sum(len(p["TargetGroups"]) for p in moto.elbv2.get_paginator("describe_target_groups").paginate())
    if tgs:
        out.append(f"{tgs} target groups")
    groups = [g["GroupName"] for p in moto.ec2.get_paginator("describe_security_groups").paginate()
              for g in p["SecurityGroups"] if g["GroupName"] not in ("default", "nodes")]
    if groups:
        out.append(f"security groups {groups}")
    sg = moto.ec2.describe_security_groups(GroupIds=[nodes_sg])["SecurityGroups"][0]
    extra = sorted(set(rules(moto, sg["IpPermissions"])) - set(baseline_rules))
    if extra:
        out.append(f"nodes' group rules {extra}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.common_arguments(p)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--quiet", type=float, default=15, help="seconds without AWS calls that end a first sync")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)

    e = bench.Environment(args.control_plane)
    counter, moto, proxy, trap_port, trap_seen, kube = e.counter, e.moto, e.proxy, e.trap_port, e.trap_seen, e.kube
    record: dict = {"services": {k: {"annotations": a, "ports": p} for k, (a, p) in SERVICES.items()}}
    running: Manager | None = None
    try:
        kube.clean()
        moto.reset()
        net = moto.network()
        nodes_sg = net["sg"]
        baseline_rules = rules(moto, moto.ec2.describe_security_groups(GroupIds=[nodes_sg])["SecurityGroups"][0]["IpPermissions"])
        instances = moto.run_instances(net, args.nodes)
        config = os.path.join(args.work_dir, "handover-cloud.conf")
        with open(config, "w") as f:
            f.write(bench.cloud_config(net, proxy).replace("DisableSecurityGroupIngress = true",
                                                           "DisableSecurityGroupIngress = false"))

        def start(kind: str, run: str) -> Manager:
            binary = {"rust": args.rust_bin, "upstream": args.go_bin}[kind]
            log(f"{run}: {kind} starts")
            return Manager(kind, binary, config, kube, proxy, trap_port, args.work_dir, f"handover-{run}")

        # 2. Upstream builds everything.
        running = start("upstream", "upstream-builds")
        for i in instances:
            kube.create_node(i["dns"])
        wait_for("upstream's node initialization",
                 lambda: {i["dns"] for i in instances} <= {n["metadata"]["name"] for n in kube.nodes() if initialized(n)},
                 args.timeout)
        for name in SERVICES:
            create_service(kube, name)
        wait_for("upstream's load balancers", lambda: set(hostnames(kube)) == set(SERVICES), args.timeout, 0.5)
        wait_quiet(counter, args.quiet, 0, args.timeout)
        running.stop()
        running = None
        record["upstream_hostnames"] = hostnames(kube)
        built = cloud_state(moto, nodes_sg)
        record["built_by_upstream"] = built
        record["upstream_build_warnings"] = failed_syncs(kube, datetime.datetime.min.replace(tzinfo=datetime.timezone.utc))

        # 3. Upstream restarted: its own first-sync writes are the baseline.
        before = counter.snapshot()
        running = start("upstream", "upstream-restarts")
        since = running.started
        record["upstream_restart_last_call_s"] = wait_quiet(counter, args.quiet, args.quiet, args.timeout)
        running.stop()
        running = None
        record["upstream_restart_calls"] = diff(counter.snapshot(), before)
        record["upstream_restart_writes"] = writes(record["upstream_restart_calls"])
        record["upstream_restart_warnings"] = failed_syncs(kube, since)
        record["upstream_restart_changes"] = differences(built, cloud_state(moto, nodes_sg))
        after_upstream = cloud_state(moto, nodes_sg)

        # 4. Ours takes over.
        before = counter.snapshot()
        running = start("rust", "ours-takes-over")
        since = running.started
        record["ours_last_call_s"] = wait_quiet(counter, args.quiet, args.quiet, args.timeout)
        record["ours_calls"] = diff(counter.snapshot(), before)
        record["ours_writes"] = writes(record["ours_calls"])
        record["ours_warnings"] = failed_syncs(kube, since)
        record["ours_changes"] = differences(after_upstream, cloud_state(moto, nodes_sg))
        record["hostnames_kept"] = hostnames(kube) == record["upstream_hostnames"]

        # 5. A node joins.
        joined = moto.run_instances(net, 1)[0]
        start_join = time.monotonic()
        kube.create_node(joined["dns"])
        record["join_s"] = wait_for("the new node behind every load balancer",
                                    lambda: every_backend(moto, joined["id"]), args.timeout, 0.5)
        record["join_total_s"] = time.monotonic() - start_join

        # 6. Every Service deleted.
        start_delete = time.monotonic()
        for name in SERVICES:
            kube.delete_service(name)
        try:
            wait_for("nothing left in the cloud", lambda: not left_over(moto, nodes_sg, baseline_rules),
                     args.timeout, 0.5)
            record["delete_s"] = time.monotonic() - start_delete
        except RuntimeError:
            record["delete_s"] = None
        record["left_over"] = left_over(moto, nodes_sg, baseline_rules)
        record["ours_final_warnings"] = failed_syncs(kube, since)
        running.stop()
        running = None
    finally:
        if running is not None:
            running.stop()
        moto.stop()
    meta = json.loads(args.meta)
    meta["metadata_connections"] = len(trap_seen)
    record["meta"] = meta
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True, default=str)
    with open(args.out, "w") as f:
        f.write(report(record))
    log(f"report in {args.out}, raw record in {args.json}")


def fmt(calls: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "none"


def report(r: dict) -> str:
    m = r["meta"]
    lines = [
        f"# aws: hand-over from upstream cloud-provider-aws {m.get('upstream_version', '?')} to ours, on moto ({m.get('date', '?')})",
        "",
        f"`bench/aws/run --handover` at `{m.get('commit', '?')}`, moto {m.get('moto_version', '?')}, "
        f"Kubernetes {m.get('k8s_version', '?')} API server; {m.get('machine', '')}. "
        "What the run does is in `bench/aws/handover.py`'s docstring; the raw record (every call, every state) "
        "is the JSON beside this file.",
        "",
        "## The Services (one of each thing upstream builds differently)",
        "",
        "| Service | annotations (`service.beta.kubernetes.io/aws-load-balancer-…`) | ports | upstream's hostname |",
        "| --- | --- | --- | --- |",
    ]
    for name, s in r["services"].items():
        ann = ", ".join(f"`{k}: {v}`" for k, v in s["annotations"].items()) or "none"
        ports = ", ".join(f"{proto} {port}" for _, proto, port in s["ports"])
        lines.append(f"| {name} | {ann} | {ports} | `{r['upstream_hostnames'].get(name, '(none)')}` |")
    ok = lambda b: "**yes**" if b else "**NO**"
    extra_writes = {k: v for k, v in r["ours_writes"].items() if v > r["upstream_restart_writes"].get(k, 0)}
    lines += [
        "",
        "## Results",
        "",
        "| check | upstream restarted over its own resources | ours taking over |",
        "| --- | --- | --- |",
        f"| AWS write calls on the first sync | {fmt(r['upstream_restart_writes'])} | {fmt(r['ours_writes'])} |",
        f"| all AWS calls on the first sync | {sum(r['upstream_restart_calls'].values())} | {sum(r['ours_calls'].values())} |",
        f"| changes to the cloud's state | {len(r['upstream_restart_changes'])} | {len(r['ours_changes'])} |",
        f"| Warning events on the Services | {len(r['upstream_restart_warnings'])} | {len(r['ours_warnings'])} |",
        "",
        f"- Writes ours made beyond upstream's own restart: {fmt(extra_writes)}.",
        f"- Every Service kept upstream's hostname: {ok(r['hostnames_kept'])}.",
        f"- A node that joined afterwards was behind every load balancer after {r['join_s']:.1f} s "
        "(its Node created to the last target registered, the cloud-node initialization included).",
        ("- Every Service deleted: nothing left in moto (load balancers, target groups, load-balancer "
         f"security groups, the rules added to the nodes' group, upstream's included) after {r['delete_s']:.1f} s."
         if r["delete_s"] is not None else f"- Every Service deleted: **left over**: {r['left_over']}."),
        f"- Instance-metadata connections: {m.get('metadata_connections', 0)}.",
    ]
    if r["ours_changes"]:
        lines += ["", "### What ours changed", ""] + [f"- `{c}`" for c in r["ours_changes"]]
    if r["upstream_restart_changes"]:
        lines += ["", "### What upstream's restart changed", ""] + [f"- `{c}`" for c in r["upstream_restart_changes"]]
    for key, title in (("ours_warnings", "Warnings on the Services after ours started"),
                       ("upstream_restart_warnings", "Warnings after upstream's restart"),
                       ("upstream_build_warnings", "Warnings while upstream built")):
        if r.get(key):
            lines += ["", f"### {title}", ""] + [f"- {w}" for w in r[key]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
