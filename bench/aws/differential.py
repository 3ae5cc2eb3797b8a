#!/usr/bin/env python3
"""The same Service, one annotation set at a time, through upstream cloud-provider-aws and through ours;
the load balancers they build compared field by field (issue #29's differential suite).

Run by `bench/aws/run --differential` (which builds both managers, starts the control plane and picks
the moto virtualenv's python). For each case and each manager, on fresh state:

  1. moto reset: a VPC, a public subnet, the nodes' security group, two instances (and an Elastic IP for
     the case that names one); the control plane's Services and Nodes removed;
  2. the manager starts (the cloud-config, flags and environment of handover.py, security-group ingress
     managed), the two Nodes register and are initialized;
  3. the case's Service is created (fixed node ports, so target-group names, which hash them, are
     comparable), and the run waits for its ingress hostname and then for the cloud to go quiet;
  4. the cloud's state is recorded (handover.py's `cloud_state`), with what differs between runs by
     construction replaced by placeholders: the load balancer's name (from the Service's UID), instance,
     VPC, subnet and allocation IDs; and the Warning events on the Service.

The two states of each case are compared; every difference is listed in the report. Nothing here asserts
anything: differences are explained in docs/aws-provider.md ("Differences from upstream").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import time

import bench
from bench import NAMESPACE, Counter, Kube, Manager, Moto, has_hostname, initialized, log, wait_for
from handover import CERT, PREFIX, cloud_state, differences, failed_syncs, wait_quiet

WEB = [("http", "TCP", 80, 30080), ("https", "TCP", 443, 30443)]
ONE = [("http", "TCP", 80, 30080)]

# name -> (annotations without the prefix, ports (name, protocol, port, node port), spec extras)
CASES: dict[str, tuple[dict[str, str], list[tuple[str, str, int, int]], dict]] = {
    "classic": ({}, WEB, {}),
    "classic-internal": ({"internal": "true"}, ONE, {}),
    "classic-tls": ({"ssl-cert": CERT, "ssl-ports": "443", "backend-protocol": "http"}, WEB, {}),
    "classic-ssl-policy": ({"ssl-cert": CERT, "ssl-ports": "https",
                            "ssl-negotiation-policy": "ELBSecurityPolicy-TLS-1-2-2017-01"}, WEB, {}),
    "classic-proxy": ({"proxy-protocol": "*"}, ONE, {}),
    "classic-attributes": ({"connection-draining-enabled": "true", "connection-draining-timeout": "120",
                            "connection-idle-timeout": "300", "cross-zone-load-balancing-enabled": "true"}, ONE, {}),
    "classic-health-check": ({"healthcheck-protocol": "HTTP", "healthcheck-path": "/ready",
                              "healthcheck-interval": "15", "healthcheck-timeout": "4",
                              "healthcheck-healthy-threshold": "3", "healthcheck-unhealthy-threshold": "5"}, ONE, {}),
    "classic-source-ranges": ({}, ONE, {"loadBalancerSourceRanges": ["203.0.113.0/24"]}),
    "classic-tags": ({"additional-resource-tags": "team=web,cost=42"}, ONE, {}),
    "classic-local": ({}, ONE, {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000}),
    "nlb": ({"type": "nlb"}, WEB, {}),
    "nlb-internal": ({"type": "nlb", "internal": "true"}, ONE, {}),
    "nlb-tls": ({"type": "nlb", "ssl-cert": CERT, "ssl-ports": "443"}, WEB, {}),
    "nlb-tls-policy": ({"type": "nlb", "ssl-cert": CERT, "ssl-ports": "443",
                       "ssl-negotiation-policy": "ELBSecurityPolicy-TLS13-1-2-2021-06"}, WEB, {}),
    "nlb-udp": ({"type": "nlb"}, [("dns", "UDP", 53, 30053)], {}),
    "nlb-target-group-attributes": ({"type": "nlb", "target-group-attributes":
                                     "preserve_client_ip.enabled=false,proxy_protocol_v2.enabled=true"}, ONE, {}),
    "nlb-health-check": ({"type": "nlb", "healthcheck-protocol": "http", "healthcheck-path": "/healthz",
                          "healthcheck-port": "30080", "healthcheck-interval": "10"}, ONE, {}),
    "nlb-cross-zone": ({"type": "nlb", "cross-zone-load-balancing-enabled": "true"}, ONE, {}),
    "nlb-source-ranges": ({"type": "nlb"}, ONE, {"loadBalancerSourceRanges": ["203.0.113.0/24"]}),
    "nlb-local": ({"type": "nlb"}, ONE, {"externalTrafficPolicy": "Local", "healthCheckNodePort": 32000}),
    "nlb-eip": ({"type": "nlb", "eip-allocations": "{eip}"}, ONE, {}),
    "nlb-private-address": ({"type": "nlb", "internal": "true", "private-ipv4-addresses": "10.0.0.50"}, ONE, {}),
    "nlb-own-sg": ({"type": "nlb"}, WEB, {}),
    "nlb-own-sg-udp": ({"type": "nlb"}, [("dns", "UDP", 53, 30053)], {}),
    "nlb-own-sg-tls": ({"type": "nlb", "ssl-cert": CERT, "ssl-ports": "443"}, WEB, {}),
    "nlb-own-sg-source-ranges": ({"type": "nlb"}, ONE, {"loadBalancerSourceRanges": ["203.0.113.0/24"]}),
    "nlb-own-sg-byo": ({"type": "nlb", "security-groups": "{byo}"}, ONE, {}),
}

# Cases run with more [Global] settings: NLBSecurityGroupMode = Managed for the `nlb-own-sg` ones.
GLOBAL_EXTRA = {case: "NLBSecurityGroupMode = Managed\n" for case in CASES if case.startswith("nlb-own-sg")}


def own_group_name(namespace: str, name: str, uid: str) -> str:
    """Upstream's name of an NLB's own security group (`GetSecurityGroupNameForNLB`), with the
    `--cluster-name` both managers get (bench.manager_flags)."""
    digest = hashlib.sha256((bench.CLUSTER_NAME + name + namespace + uid).encode()).hexdigest()
    clean = lambda s: re.sub("[^A-Za-z0-9]", "", s)[:8]
    return f"k8s-{clean(namespace)}-{clean(name)}-{digest[:10]}"


def create_service(kube: Kube, case: str, eip: str, byo: str) -> None:
    annotations, ports, extra = CASES[case]
    kube.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", {
        "metadata": {"name": case, "annotations": {PREFIX + k: v.replace("{eip}", eip).replace("{byo}", byo)
                                                   for k, v in annotations.items()}},
        "spec": {"type": "LoadBalancer", "selector": {"app": case}, **extra,
                 "ports": [{"name": n, "protocol": proto, "port": port, "targetPort": port, "nodePort": node_port}
                           for n, proto, port, node_port in ports]}})


def normalized(state: dict, replacements: dict[str, str]) -> dict:
    """`state` with `replacements` made in every string, and every list sorted again afterwards (the
    lists are sets sorted by real IDs, which the placeholders reorder)."""
    text = json.dumps(state, sort_keys=True, default=str)
    for old, new in sorted(replacements.items(), key=lambda kv: -len(kv[0])):
        if old:
            text = text.replace(old, new)

    def resort(value):
        if isinstance(value, dict):
            return {k: resort(v) for k, v in value.items()}
        if isinstance(value, list):
            items = [resort(v) for v in value]
            # A set (of rows, or of names) is sorted; a row (a tuple of mixed fields) keeps its order.
            if all(isinstance(v, (list, dict)) for v in items) or all(isinstance(v, str) for v in items):
                return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
            return items
        return value

    return resort(json.loads(text))


def run_case(kind: str, binary: str, case: str, args, moto: Moto, kube: Kube, counter: Counter,
             proxy: int, trap_port: int) -> dict:
    kube.clean()
    moto.reset()
    net = moto.network()
    instances = moto.run_instances(net, 2)
    eip = moto.ec2.allocate_address(Domain="vpc")["AllocationId"] if "eip" in case else ""
    byo = moto.ec2.create_security_group(GroupName="byo", Description="the operator's",
                                         VpcId=net["vpc"])["GroupId"] if "byo" in case else ""
    config = os.path.join(args.work_dir, f"differential-{kind}.conf")
    with open(config, "w") as f:
        f.write(bench.cloud_config(net, proxy).replace("DisableSecurityGroupIngress = true",
                                                       "DisableSecurityGroupIngress = false")
                .replace("[Global]\n", "[Global]\n" + GLOBAL_EXTRA.get(case, ""), 1))
    manager = Manager(kind, binary, config, kube, proxy, trap_port, args.work_dir, f"differential-{case}-{kind}")
    result: dict = {"manager": kind}
    try:
        for i in instances:
            kube.create_node(i["dns"])
        wait_for("the nodes' initialization",
                 lambda: {i["dns"] for i in instances} <= {n["metadata"]["name"] for n in kube.nodes() if initialized(n)},
                 args.timeout)
        create_service(kube, case, eip, byo)
        try:
            wait_for(f"{case}'s ingress hostname",
                     lambda: any(s["metadata"]["name"] == case and has_hostname(s) for s in kube.services()),
                     args.timeout, 0.5)
            result["hostname"] = True
        except RuntimeError:
            result["hostname"] = False
        wait_quiet(counter, args.quiet, 0, args.timeout)
        uid = next(s["metadata"]["uid"] for s in kube.services() if s["metadata"]["name"] == case)
        lb_name = ("a" + uid.replace("-", ""))[:32]
        replacements = {lb_name: "<lb>", net["vpc"]: "<vpc>", net["subnet"]: "<subnet>", net["sg"]: "<nodes-sg>",
                        eip: "<eip>", byo: "<byo-sg>", own_group_name(NAMESPACE, case, uid): "<own-sg>"}
        replacements = {k: v for k, v in replacements.items() if k}
        replacements.update({i["id"]: f"<instance-{n}>" for n, i in enumerate(instances, 1)})
        result["state"] = normalized(cloud_state(moto, net["sg"]), replacements)
        result["warnings"] = [w.replace(lb_name, "<lb>") for w in failed_syncs(kube, manager.started)]
    finally:
        manager.stop()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.common_arguments(p)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    p.add_argument("--quiet", type=float, default=5, help="seconds without AWS calls that end a sync")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    e = bench.Environment(args.control_plane)
    counter, moto, proxy, trap_port, trap_seen, kube = e.counter, e.moto, e.proxy, e.trap_port, e.trap_seen, e.kube
    cases: dict = {}
    try:
        for case in args.cases.split(","):
            cases[case] = {}
            for kind, binary in (("upstream", args.go_bin), ("rust", args.rust_bin)):
                log(f"{case}: {kind}")
                started = time.monotonic()
                cases[case][kind] = run_case(kind, binary, case, args, moto, kube, counter, proxy, trap_port)
                cases[case][kind]["seconds"] = round(time.monotonic() - started, 1)
            cases[case]["differences"] = differences(cases[case]["upstream"]["state"], cases[case]["rust"]["state"])
        kube.clean()
    finally:
        moto.stop()
    meta = json.loads(args.meta)
    meta["metadata_connections"] = len(trap_seen)
    record = {"meta": meta, "cases": {k: {"annotations": CASES[k][0], "spec": CASES[k][2],
                                          "global": GLOBAL_EXTRA.get(k, "").strip(), **v}
                                      for k, v in cases.items()}}
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True, default=str)
    with open(args.out, "w") as f:
        f.write(report(record))
    log(f"report in {args.out}, raw record in {args.json}")


def report(r: dict) -> str:
    m = r["meta"]
    same = [k for k, c in r["cases"].items() if not c["differences"]]
    lines = [
        f"# aws: upstream cloud-provider-aws {m.get('upstream_version', '?')} and ours, one Service at a time ({m.get('date', '?')})",
        "",
        f"`bench/aws/run --differential` at `{m.get('commit', '?')}`, moto {m.get('moto_version', '?')}, Kubernetes "
        f"{m.get('k8s_version', '?')} API server; {m.get('machine', '')}. Each case: fresh moto, the manager, two "
        "nodes, one Service; the cloud's load balancer, listeners, policies, attributes, target groups, targets and "
        "security-group rules recorded and compared field by field (`bench/aws/differential.py`). The raw states are "
        "in the JSON beside this file.",
        "",
        f"**{len(same)} of {len(r['cases'])} cases identical.**",
        "",
        "| case | annotations (`service.beta.kubernetes.io/aws-load-balancer-…`) and spec | hostname (upstream / ours) | Warning events (upstream / ours) | differences |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, c in r["cases"].items():
        ann = ", ".join(f"`{k}: {v}`" for k, v in c["annotations"].items())
        spec = ", ".join(f"`{k}: {json.dumps(v)}`" for k, v in c["spec"].items())
        config = f"cloud-config `{c['global']}`" if c.get("global") else ""
        what = "; ".join(x for x in (ann, spec, config) if x) or "none"
        host = f"{'yes' if c['upstream']['hostname'] else 'no'} / {'yes' if c['rust']['hostname'] else 'no'}"
        warn = f"{len(c['upstream']['warnings'])} / {len(c['rust']['warnings'])}"
        diff = "identical" if not c["differences"] else f"{len(c['differences'])} (below)"
        lines.append(f"| {name} | {what} | {host} | {warn} | {diff} |")
    for name, c in r["cases"].items():
        if not (c["differences"] or c["upstream"]["warnings"] or c["rust"]["warnings"]):
            continue
        lines += ["", f"## {name}", ""]
        lines += [f"- `{d}`" for d in c["differences"]]
        lines += [f"- upstream's Warning: {w}" for w in c["upstream"]["warnings"]]
        lines += [f"- our Warning: {w}" for w in c["rust"]["warnings"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
