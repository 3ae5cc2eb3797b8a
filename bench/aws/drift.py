#!/usr/bin/env python3
"""What the drift check costs the cloud (issue #28): ours alone (upstream has no drift check), on moto.

Run by `bench/aws/run --drift`. Our manager runs with `--load-balancer-drift-period` short (so a window of
a minute holds several rounds) and its secure port open for `/metrics`; then, for Classic ELBs and for
NLBs in turn:

  1. the Services are created and provisioned, and the run waits one drift period (every Service synced
     and in a round);
  2. over a window in which nothing changes, the AWS calls (by operation, through the counting proxy)
     and the drift checks made (`service_controller_load_balancer_drift_checks_total`) are counted: every
     call in the window is a drift check's;
  3. the Services are deleted.

The report gives the calls per check by kind, the calls a second to each AWS API in the window (which
the provider's budget, `[Global] DriftCheckCallsPerSecond`, caps: `--budget`, default the provider's
default), and what 1,000 Services at the default period (5 m) would ask without a budget. No drift is
expected (the drifts counter must stay 0).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import time
import urllib.request

import bench
from bench import Counter, Kube, Moto, diff, has_hostname, initialized, log, total, wait_for

CHECKS = "service_controller_load_balancer_drift_checks_total"
DRIFTS = "service_controller_load_balancer_drifts_total"
ERRORS = "service_controller_load_balancer_drift_check_errors_total"


def scrape(port: int) -> dict[str, float]:
    """The drift counters from our /metrics."""
    context = ssl._create_unverified_context()  # the manager's self-signed serving certificate
    text = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("service_controller_load_balancer_drift"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def phase(kind: str, nlb: bool, args, kube: Kube, counter: Counter, port: int) -> dict:
    names = [f"drift-{kind}-{i:03d}" for i in range(args.services)]
    log(f"{kind}: {len(names)} Services")
    for name in names:
        kube.create_service(name, nlb=nlb)
    wanted = set(names)
    wait_for("every Service's hostname", lambda: wanted <= {s["metadata"]["name"] for s in kube.services() if has_hostname(s)},
             args.timeout, interval=0.25)
    # One full period: every Service synced and taken into a round of checks.
    time.sleep(args.period + 2)
    log(f"{kind}: measuring {args.window} s")
    metrics_before, calls_before = scrape(port), counter.snapshot()
    time.sleep(args.window)
    metrics_after, calls_after = scrape(port), counter.snapshot()
    calls = diff(calls_after, calls_before)
    checks = metrics_after.get(CHECKS, 0) - metrics_before.get(CHECKS, 0)
    result = {
        "services": len(names), "window_seconds": args.window, "checks": checks, "calls": calls,
        "drifts": metrics_after.get(DRIFTS, 0) - metrics_before.get(DRIFTS, 0),
        "check_errors": metrics_after.get(ERRORS, 0) - metrics_before.get(ERRORS, 0),
        "calls_per_check": round(total(calls) / checks, 2) if checks else None,
        "calls_per_second_by_api": {
            api: round(sum(v for k, v in calls.items() if k.split(":", 1)[0] == api) / args.window, 2)
            for api in sorted({k.split(":", 1)[0] for k in calls})
        },
    }
    log(f"{kind}: {checks:.0f} checks, {total(calls)} calls")
    for name in names:
        kube.delete_service(name)
    wait_for("the Services gone", lambda: not [s for s in kube.services() if s["spec"].get("type") == "LoadBalancer"],
             args.timeout)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.common_arguments(p)
    p.add_argument("--services", type=int, default=20, help="Services per kind")
    p.add_argument("--period", type=float, default=15, help="our --load-balancer-drift-period, seconds")
    p.add_argument("--window", type=float, default=45, help="the measured window, seconds")
    p.add_argument("--budget", type=int, default=None,
                   help="[Global] DriftCheckCallsPerSecond (default: unset, the provider's default, 2)")
    p.add_argument("--timeout", type=float, default=180)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)
    e = bench.Environment(args.control_plane)
    kube, moto, counter = e.kube, e.moto, e.counter
    record: dict = {"meta": json.loads(args.meta), "period_seconds": args.period, "budget": args.budget,
                    "phases": {}}
    try:
        kube.clean()
        moto.reset()
        net = moto.network()
        instances = moto.run_instances(net, 2)
        config = os.path.join(args.work_dir, "drift-cloud.conf")
        with open(config, "w") as f:
            text = bench.cloud_config(net, e.proxy)
            if args.budget is not None:
                text = text.replace("[Global]\n", f"[Global]\nDriftCheckCallsPerSecond = {args.budget}\n", 1)
            f.write(text)
        port = bench.free_port()
        manager = bench.Manager("rust", args.rust_bin, config, kube, e.proxy, e.trap_port, args.work_dir, "drift",
                                extra_flags=[f"--secure-port={port}", "--bind-address=127.0.0.1",
                                             "--authorization-always-allow-paths=/healthz,/metrics",
                                             f"--load-balancer-drift-period={args.period:g}s"])
        try:
            def serving() -> bool:
                try:
                    scrape(port)
                    return True
                except OSError:
                    return False

            wait_for("our /metrics", serving, 30, interval=0.5)
            for i in instances:
                kube.create_node(i["dns"])
            wait_for("the nodes' initialization",
                     lambda: {i["dns"] for i in instances} <= {n["metadata"]["name"] for n in kube.nodes() if initialized(n)},
                     args.timeout)
            for kind, nlb in (("classic", False), ("nlb", True)):
                record["phases"][kind] = phase(kind, nlb, args, kube, counter, port)
        finally:
            manager.stop()
        for n in kube.nodes():
            kube.delete_node(n["metadata"]["name"])
    finally:
        moto.stop()
    with open(args.json, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
    with open(args.out, "w") as f:
        f.write(report(record))
    log(f"report in {args.out}, raw record in {args.json}")


def round_at_default_budget(ph: dict) -> str:
    """How long a round of 1,000 checks takes when each API gives the checks 2 calls a second (the
    provider's default `DriftCheckCallsPerSecond`): the busiest API's calls per check x 1,000 / 2."""
    if not ph["checks"]:
        return "?"
    per_api: dict[str, float] = {}
    for op, n in ph["calls"].items():
        api = op.split(":", 1)[0]
        per_api[api] = per_api.get(api, 0) + n / ph["checks"]
    api, per = max(per_api.items(), key=lambda kv: kv[1])
    return f"{per * 1000 / 2 / 60:.0f} min ({api}, {per:.2f} calls per check)"


def report(r: dict) -> str:
    m = r["meta"]
    lines = [
        f"# aws: what the drift check costs ({m.get('date', '?')})",
        "",
        f"`bench/aws/run --drift` at `{m.get('commit', '?')}`, moto {m.get('moto_version', '?')}, Kubernetes "
        f"{m.get('k8s_version', '?')} API server; {m.get('machine', '')}. Ours alone (upstream has no drift "
        f"check), `--load-balancer-drift-period={r['period_seconds']:g}s`, `DriftCheckCallsPerSecond` "
        f"{r.get('budget') if r.get('budget') is not None else 'unset (the default, 2)'}; for each kind, the "
        "Services are provisioned, then every AWS call in a window where nothing changes is a drift check's "
        "(`bench/aws/drift.py`).",
        "",
        "| load balancers | Services | checks in the window | AWS calls | calls per check | calls a second in the window, by API | calls per minute for 1,000 Services at the default 5 m without a budget (200 checks a minute) | a round of 1,000 Services at the default budget (2 calls a second to each API) | drifts found |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, ph in r["phases"].items():
        per = ph["calls_per_check"]
        budget = f"{per * 200:.0f}" if per is not None else "?"
        by_api = ", ".join(f"{api} {v}" for api, v in (ph.get("calls_per_second_by_api") or {}).items())
        lines.append(f"| {kind} | {ph['services']} | {ph['checks']:.0f} | {total(ph['calls'])} | {per} | {by_api} | "
                     f"{budget} | {round_at_default_budget(ph)} | {ph['drifts']:.0f} |")
    lines += ["", "Calls by operation in each window:", ""]
    for kind, ph in r["phases"].items():
        ops = ", ".join(f"{k} {v}" for k, v in sorted(ph["calls"].items()))
        lines.append(f"- {kind}: {ops}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
