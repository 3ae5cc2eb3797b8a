#!/usr/bin/env python3
"""How long a node the cluster autoscaler is removing stays behind AWS load balancers (issue #51 item 3):
ours beside upstream cloud-provider-aws, on moto.

Run by `bench/aws/run --drain`. For each manager in turn, on a fresh moto: three instances and their
nodes, two Classic ELB and two NLB Services, every instance registered with every load balancer. Then,
for each round, one node is tainted `ToBeDeletedByClusterAutoscaler` (as the cluster autoscaler does when
it picks a node for removal) and timed until its instance is registered with no load balancer (a Classic
ELB's instances, an NLB's targets). A node still registered `--grace` seconds after the taint (as long
as the autoscaler might take to drain it) is deleted, as the autoscaler does next, and timed again.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import bench
from bench import Kube, Moto, has_hostname, initialized, log, wait_for

TAINT = "ToBeDeletedByClusterAutoscaler"


def registered(moto: Moto) -> list[set[str]]:
    """The instances behind each load balancer: a Classic ELB's, an NLB's targets (all its groups)."""
    out = list(moto.classic_backends().values())
    for page in moto.elbv2.get_paginator("describe_load_balancers").paginate():
        for lb in page["LoadBalancers"]:
            ids: set[str] = set()
            groups = moto.elbv2.describe_target_groups(LoadBalancerArn=lb["LoadBalancerArn"])["TargetGroups"]
            for g in groups:
                health = moto.elbv2.describe_target_health(TargetGroupArn=g["TargetGroupArn"])
                ids |= {d["Target"]["Id"] for d in health["TargetHealthDescriptions"]}
            out.append(ids)
    return out


def taint(kube: Kube, name: str) -> None:
    value = str(int(time.time()))
    kube.request("PATCH", f"/api/v1/nodes/{name}",
                 {"spec": {"taints": [{"key": TAINT, "value": value, "effect": "NoSchedule"}]}},
                 content_type="application/merge-patch+json")


def run(kind: str, binary: str, args, e: bench.Environment, rounds: int) -> list[dict]:
    kube, moto = e.kube, e.moto
    kube.clean()
    moto.reset()
    net = moto.network()
    instances = moto.run_instances(net, rounds + 1)
    config = os.path.join(args.work_dir, f"drain-{kind}-cloud.conf")
    with open(config, "w") as f:
        f.write(bench.cloud_config(net, e.proxy))
    manager = bench.Manager(kind, binary, config, kube, e.proxy, e.trap_port, args.work_dir, f"drain-{kind}")
    results = []
    try:
        for i in instances:
            kube.create_node(i["dns"])
        wait_for("the nodes' initialization",
                 lambda: {i["dns"] for i in instances} <= {n["metadata"]["name"] for n in kube.nodes() if initialized(n)},
                 args.timeout)
        names = []
        for n in range(2):
            for nlb in (False, True):
                name = f"drain-{'nlb' if nlb else 'elb'}-{n}"
                kube.create_service(name, nlb=nlb)
                names.append(name)
        wait_for("every Service's hostname",
                 lambda: set(names) <= {s["metadata"]["name"] for s in kube.services() if has_hostname(s)}, args.timeout)
        every = {i["id"] for i in instances}
        wait_for("every instance behind every load balancer",
                 lambda: (lambda r: len(r) == len(names) and all(ids == every for ids in r))(registered(moto)),
                 args.timeout, interval=0.5)
        for n in range(rounds):
            node, instance = instances[n]["dns"], instances[n]["id"]
            log(f"{kind}: round {n + 1}: tainting {node}")
            start = time.monotonic()
            taint(kube, node)
            after_taint = after_deletion = None
            while time.monotonic() - start < args.grace:
                if not any(instance in ids for ids in registered(moto)):
                    after_taint = time.monotonic() - start
                    break
                time.sleep(0.1)
            if after_taint is None:
                log(f"{kind}: round {n + 1}: still registered {args.grace:.0f} s after the taint; deleting the node")
                kube.delete_node(node)
                after_deletion = wait_for("the deleted node's instance deregistered",
                                          lambda: not any(instance in ids for ids in registered(moto)),
                                          args.timeout)
            else:
                kube.delete_node(node)
            results.append({"after_taint": after_taint, "after_deletion": after_deletion})
            log(f"{kind}: round {n + 1}: {results[-1]}")
        for name in names:
            kube.delete_service(name)
        wait_for("the Services gone", lambda: not [s for s in kube.services() if s["spec"].get("type") == "LoadBalancer"],
                 args.timeout)
    finally:
        manager.stop()
    for n in kube.nodes():
        kube.delete_node(n["metadata"]["name"])
    return results


def cell(r: dict, grace: float) -> str:
    if r["after_taint"] is not None:
        return f"{r['after_taint']:.2f} s after the taint"
    return f"registered {grace:.0f} s after the taint; out {r['after_deletion']:.2f} s after the node's deletion"


def summary(rounds: list[dict], grace: float) -> str:
    never = [r for r in rounds if r["after_taint"] is None]
    if not never:
        return f"{statistics.median(r['after_taint'] for r in rounds):.2f} s (median of {len(rounds)})"
    if len(never) == len(rounds):
        return (f"still registered {grace:.0f} s after the taint in all {len(rounds)} rounds, out "
                f"{statistics.median(r['after_deletion'] for r in rounds):.2f} s after the node's deletion (median)")
    return f"still registered {grace:.0f} s after the taint in {len(never)} of {len(rounds)} rounds"


def report(record: dict) -> str:
    m, grace = record["meta"], record["grace_seconds"]
    ours, upstream = record["managers"]["rust"], record["managers"]["go"]
    lines = [
        f"aws autoscaler drain: ours {summary(ours, grace)}, upstream {summary(upstream, grace)}",
        "",
        f"# aws: a node being scaled down leaves the load balancers ({m.get('date', datetime.date.today())})",
        "",
        f"`bench/aws/run --drain` at `{m.get('commit', '?')}`, moto {m.get('moto_version', '?')}, Kubernetes "
        f"{m.get('k8s_version', '?')} API server; {m.get('machine', '')}. Upstream: cloud-provider-aws "
        f"{m.get('upstream_version', '?')}, built from its Go module. Each manager on a fresh moto: "
        "three instances and their nodes, two Classic ELB and two NLB Services; each round taints one node "
        f"`{TAINT}` and times until its instance is registered with no load balancer (Classic instances, "
        f"NLB targets); a node still registered {grace:.0f} s after its taint is deleted, as the autoscaler "
        "does next, and timed again (`bench/aws/drain.py`).",
        "",
        "| manager | " + " | ".join(f"round {n + 1}" for n in range(len(ours))) + " |",
        "| --- | " + " | ".join("---" for _ in ours) + " |",
        "| ours | " + " | ".join(cell(r, grace) for r in ours) + " |",
        "| upstream | " + " | ".join(cell(r, grace) for r in upstream) + " |",
        "",
        "Upstream's service controller (k8s.io/cloud-provider, which cloud-provider-aws runs) leaves the taint",
        "out of the backends it computes but does not sync on it (`shouldSyncUpdatedNode`), so the instance",
        "stays registered until a node event that qualifies, here the node's deletion. Ours syncs on the",
        "taint; AWS then drains the NLB targets for the target group's deregistration delay (moto deregisters",
        "at once).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.common_arguments(p)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--grace", type=float, default=120, help="seconds a tainted node may stay before its deletion")
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    e = bench.Environment(args.control_plane)
    record: dict = {"meta": json.loads(args.meta), "grace_seconds": args.grace, "managers": {}}
    try:
        for kind, binary in (("rust", args.rust_bin), ("go", args.go_bin)):
            record["managers"][kind] = run(kind, binary, args, e, args.rounds)
    finally:
        e.moto.stop()
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    with open(args.out, "w") as f:
        f.write(report(record))
    log(f"report in {args.out}, raw record in {args.json}")


if __name__ == "__main__":
    main()
