#!/usr/bin/env python3
"""The kubevirt provider side by side with upstream's kubevirt-cloud-controller-manager: the same
scenarios, one manager at a time, on one tenant and one infra control plane (bench/kubevirt/run starts
them and builds both managers). For each scenario, what each manager leaves in the infra cluster (its
Services and EndpointSlices) and in the tenant cluster (the nodes' provider-owned fields, the Services'
status) is read, names made comparable, and compared.

Not a test and not in CI (CI cannot fetch upstream's source). Writes the report to --out (markdown)
and its data beside it (.json).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "aws"))
from bench import Kube, log, wait_for  # noqa: E402  (the aws bench's API client and helpers)

CLUSTER = "kubernetes"
NS = "default"
SHUTDOWN = "node.cloudprovider.kubernetes.io/shutdown"
UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized"
VMI = "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances"
MERGE = "application/merge-patch+json"
SETTLE = 8.0  # seconds a scenario's last step is given before its state is read


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Bed:
    """The two clusters, and what one run of one manager makes in them (all names carry `tag`)."""

    def __init__(self, tenant: Kube, infra: Kube, tag: str) -> None:
        self.tenant, self.infra, self.tag = tenant, infra, tag
        self.ns = f"kv-{tag}"
        infra.request("POST", "/api/v1/namespaces", {"metadata": {"name": self.ns}}, ok=(409,))
        self.nodes: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.give_addresses, daemon=True)
        self.thread.start()

    def name(self, short: str) -> str:
        return f"{self.tag}-{short}"

    def give_addresses(self) -> None:
        """The infra cluster's load-balancer implementation: every infra Service without an address
        gets 192.0.2.60."""
        while not self.stop.is_set():
            try:
                for s in self.infra.request("GET", f"/api/v1/namespaces/{self.ns}/services")["items"]:
                    if not ((s.get("status") or {}).get("loadBalancer") or {}).get("ingress"):
                        self.infra.request(
                            "PATCH", f"/api/v1/namespaces/{self.ns}/services/{s['metadata']['name']}/status",
                            {"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.60"}]}}},
                            content_type=MERGE, ok=(404, 409))
            except RuntimeError:
                pass
            time.sleep(0.2)

    def vmi(self, short: str, infra_node: str, ips: list[str], hostname: str | None = None) -> str:
        name = self.name(short)
        body = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "labels": {"cluster.x-k8s.io/cluster-name": CLUSTER,
                                                      "cluster.x-k8s.io/role": "worker"},
                             "annotations": {"kubevirt.io/instancetype-name": "u1.medium"}},
                "spec": {"domain": {"devices": {}}}}
        if hostname:
            body["spec"]["hostname"] = hostname
        self.infra.request("POST", VMI.format(ns=self.ns), body)
        self.vmi_status(name, {"phase": "Running", "nodeName": infra_node, "interfaces": [
            {"name": "default", "ipAddress": ips[0], "ipAddresses": ips}]})
        return name

    def vmi_status(self, name: str, status: dict) -> None:
        self.infra.request("PATCH", VMI.format(ns=self.ns) + f"/{name}/status", {"status": status},
                           content_type=MERGE)

    def delete_vmi(self, name: str) -> None:
        self.infra.request("DELETE", VMI.format(ns=self.ns) + f"/{name}", ok=(200, 202, 404))

    def node(self, name: str, labels: dict | None = None) -> None:
        self.nodes.append(name)
        self.tenant.request("POST", "/api/v1/nodes", {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
            "status": {"addresses": [{"type": "Hostname", "address": name}]}})
        self.ready(name, True)

    def ready(self, name: str, ready: bool) -> None:
        """The node's Ready condition, as a kubelet would post it (its addresses left alone)."""
        self.tenant.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "Bench",
                            "message": "set by the bench", "lastHeartbeatTime": now(),
                            "lastTransitionTime": now()}]}},
            content_type="application/strategic-merge-patch+json")

    def service(self, short: str, etp: str = "Cluster", ports=((80, 8080),)) -> str:
        name = self.name(short)
        self.tenant.request("POST", f"/api/v1/namespaces/{NS}/services", {
            "metadata": {"name": name, "annotations": {"example.com/owner": "team-a"}},
            "spec": {"type": "LoadBalancer", "externalTrafficPolicy": etp,
                     "ports": [{"name": f"p{p}", "port": p, "targetPort": t, "protocol": "TCP"} for p, t in ports]}})
        return name

    def slice(self, service: str, node: str) -> None:
        body = {"metadata": {"name": f"{service}-eps", "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": node,
                               "conditions": {"ready": True, "serving": True, "terminating": False}}],
                "ports": [{"name": "p80", "port": 8080, "protocol": "TCP"}]}
        path = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
        current = self.tenant.request("GET", f"{path}/{service}-eps", ok=(404,))
        if current:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            self.tenant.request("PUT", f"{path}/{service}-eps", body)
        else:
            self.tenant.request("POST", path, body)

    def state(self) -> dict:
        """What the manager owns, with this run's tag made neutral."""
        tenant_list = self.tenant.request("GET", f"/api/v1/namespaces/{NS}/services")["items"]
        tenant_services = {s["metadata"]["uid"]: s["metadata"]["name"] for s in tenant_list}
        # The tenant's node ports differ from run to run: each is named by its Service and port.
        node_ports = {p["nodePort"]: f"nodePort of {s['metadata']['name']}:{p['port']}"
                      for s in tenant_list for p in s["spec"].get("ports") or [] if p.get("nodePort")}
        out: dict = {"infra services": {}, "infra endpointslices": [], "nodes": {}, "tenant services": {}}
        for s in self.infra.request("GET", f"/api/v1/namespaces/{self.ns}/services")["items"]:
            spec = s["spec"]
            labels = dict(s["metadata"].get("labels") or {})
            out["infra services"][labels.get("cluster.x-k8s.io/tenant-service-name", s["metadata"]["name"])] = {
                "labels": labels, "annotations": s["metadata"].get("annotations") or {},
                "type": spec.get("type"), "selector": spec.get("selector"),
                "externalTrafficPolicy": spec.get("externalTrafficPolicy"),
                "ports": [{**{k: p.get(k) for k in ("name", "protocol", "port")},
                           "targetPort": node_ports.get(p.get("targetPort"), p.get("targetPort"))}
                          for p in spec.get("ports") or []],
                "healthCheckNodePort set": bool(spec.get("healthCheckNodePort")),
            }
        for e in self.infra.request("GET", f"/apis/discovery.k8s.io/v1/namespaces/{self.ns}/endpointslices")["items"]:
            if (e["metadata"].get("labels") or {}).get("endpointslice.kubernetes.io/managed-by") != "kubevirt-eps-controller":
                continue
            out["infra endpointslices"].append({
                "addressType": e["addressType"],
                "endpoints": sorted(json.dumps({k: v for k, v in x.items() if k != "zone"}, sort_keys=True)
                                    for x in e.get("endpoints") or []),
                "ports": [{**p, "port": node_ports.get(p.get("port"), p.get("port"))} for p in e.get("ports") or []]})
        out["infra endpointslices"].sort(key=lambda x: json.dumps(x, sort_keys=True))
        for name in self.nodes:
            n = self.tenant.request("GET", f"/api/v1/nodes/{name}", ok=(404,))
            if not n:
                out["nodes"][name] = "deleted"
                continue
            labels = n["metadata"].get("labels") or {}
            out["nodes"][name] = {
                "providerID": n["spec"].get("providerID"),
                "addresses": n.get("status", {}).get("addresses"),
                "labels": {k: v for k, v in sorted(labels.items()) if k.startswith(("topology.", "node.kubernetes.io/instance-type", "failure-domain", "beta.kubernetes.io/instance-type"))},
                "taints": sorted(t["key"] for t in n["spec"].get("taints") or []),
            }
        for uid, name in tenant_services.items():
            s = self.tenant.request("GET", f"/api/v1/namespaces/{NS}/services/{name}")
            out["tenant services"][name] = (s.get("status") or {}).get("loadBalancer")
        return json.loads(json.dumps(out).replace(self.tag, "TAG").replace(self.ns, "INFRA-NS"))

    def clean(self) -> None:
        self.stop.set()
        self.thread.join()
        for s in self.tenant.request("GET", f"/api/v1/namespaces/{NS}/services")["items"]:
            if s["spec"].get("type") == "LoadBalancer":
                name = s["metadata"]["name"]
                self.tenant.request("PATCH", f"/api/v1/namespaces/{NS}/services/{name}",
                                    {"metadata": {"finalizers": None}}, content_type=MERGE, ok=(404,))
                self.tenant.request("DELETE", f"/api/v1/namespaces/{NS}/services/{name}", ok=(200, 202, 404))
        for e in self.tenant.request("GET", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices")["items"]:
            if e["metadata"]["name"].startswith(self.tag):
                self.tenant.request("DELETE", f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/{e['metadata']['name']}",
                                    ok=(200, 202, 404))
        for name in self.nodes:
            self.tenant.request("DELETE", f"/api/v1/nodes/{name}", ok=(200, 202, 404))


def lb(bed: Bed, steps: str) -> None:
    a = bed.vmi("n1", "infra-a", ["10.89.20.1"])
    bed.node(a)
    svc = bed.service("web")
    time.sleep(SETTLE)
    if steps in ("ports", "delete"):
        bed.tenant.request("PATCH", f"/api/v1/namespaces/{NS}/services/{svc}", {"spec": {"ports": [
            {"name": "p80", "port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"name": "p443", "port": 443, "targetPort": 8443, "protocol": "TCP"}]}}, content_type=MERGE)
        time.sleep(SETTLE)
    if steps == "delete":
        bed.tenant.request("DELETE", f"/api/v1/namespaces/{NS}/services/{svc}", ok=(200, 202))


def etp_local(bed: Bed) -> None:
    a = bed.vmi("n1", "infra-a", ["10.89.21.1"])
    b = bed.vmi("n2", "infra-b", ["10.89.21.2"])
    bed.node(a)
    bed.node(b)
    svc = bed.service("local", etp="Local")
    bed.slice(svc, a)
    time.sleep(SETTLE)
    bed.slice(svc, b)


def lifecycle(bed: Bed, what: str) -> None:
    a = bed.vmi("n1", "infra-a", ["10.89.22.1"])
    bed.node(a)
    time.sleep(SETTLE)
    bed.ready(a, False)
    if what == "failed":
        bed.vmi_status(a, {"phase": "Failed"})
    elif what == "deleted":
        bed.delete_vmi(a)
    elif what == "unknown":
        bed.vmi_status(a, {"phase": "Unknown"})


def nodes(bed: Bed, what: str) -> None:
    if what == "dual-stack":
        bed.node(bed.vmi("n1", "infra-a", ["10.89.23.1", "fd00:89:23::1"]))
    elif what == "instance-id":
        vmi = bed.vmi("vm7", "infra-b", ["10.89.23.7"])
        bed.node(bed.name("labelled"), {"node.kubernetes.io/instance-id": vmi})
    elif what == "hostname":
        bed.vmi("vm8", "infra-a", ["10.89.23.8"], hostname=bed.name("host8"))
        bed.node(bed.name("host8"))
    elif what == "zones-off":
        bed.node(bed.vmi("n1", "infra-b", ["10.89.23.9"]))


def lb_off(bed: Bed) -> None:
    bed.node(bed.vmi("n1", "infra-a", ["10.89.24.1"]))
    bed.service("web")


SCENARIOS = [
    ("create", "", lambda b: lb(b, "create")),
    ("ports changed", "", lambda b: lb(b, "ports")),
    ("delete", "", lambda b: lb(b, "delete")),
    ("externalTrafficPolicy Local, endpoints move (EPS)",
     "loadBalancer:\n  enableEPSController: true\n", etp_local),
    ("VMI Failed: shutdown taint", "", lambda b: lifecycle(b, "failed")),
    ("VMI deleted: node deleted", "", lambda b: lifecycle(b, "deleted")),
    ("VMI phase Unknown", "", lambda b: lifecycle(b, "unknown")),
    ("dual-stack VMI", "", lambda b: nodes(b, "dual-stack")),
    ("instance-id label", "", lambda b: nodes(b, "instance-id")),
    ("hostname look-up", "", lambda b: nodes(b, "hostname")),
    ("zones and regions off", "instancesV2:\n  zoneAndRegionEnabled: false\n", lambda b: nodes(b, "zones-off")),
    ("load balancers off", "loadBalancer:\n  enabled: false\n", lb_off),
]


def run(kind: str, binary: str, index: int, scenario, args, tenant: Kube, infra: Kube, work: str) -> dict:
    title, extra, steps = scenario
    bed = Bed(tenant, infra, f"{kind}-{index}")
    config = os.path.join(work, f"{kind}-{index}.yaml")
    with open(config, "w") as f:
        f.write(f"kubeconfig: {os.path.join(args.infra, 'ccm.kubeconfig')}\nnamespace: {bed.ns}\n"
                f"loadBalancer:\n  creationPollInterval: 1\n" + extra.replace("loadBalancer:\n", ""))
    # Upstream's framework (v0.34) names its controllers apart, and lists its mirroring controller there.
    controllers = ("cloud-node-controller,cloud-node-lifecycle-controller,service-lb-controller,kubevirt_eps_controller"
                   if kind == "upstream" else "cloud-node,cloud-node-lifecycle,service")
    log_path = os.path.join(work, f"{kind}-{index}.log")
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([binary, "--cloud-provider=kubevirt", f"--cloud-config={config}",
                                 f"--kubeconfig={os.path.join(args.tenant, 'ccm.kubeconfig')}",
                                 f"--cluster-name={CLUSTER}", f"--controllers={controllers}",
                                 "--leader-elect=false", "--secure-port=0", "--node-monitor-period=1s",
                                 "--node-status-update-frequency=2s"],
                                stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            time.sleep(2)
            if proc.poll() is not None:
                raise RuntimeError(f"the {kind} manager exited: see {log_path}")
            started = now_precise()
            steps(bed)
            time.sleep(SETTLE)
            state = bed.state()
            state["manager at the end"] = "running" if proc.poll() is None else f"exited with {proc.returncode}"
            state["API writes"] = {"tenant": writes(args.tenant, started), "infra": writes(args.infra, started)}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
            bed.clean()
    return state


def now_precise() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def writes(cp_dir: str, since: str) -> dict[str, int]:
    """The manager's writes (the API server's audit log records every write of its user) since `since`,
    by verb and resource."""
    counts: dict[str, int] = {}
    with open(os.path.join(cp_dir, "logs", "audit.log")) as f:
        for line in f:
            event = json.loads(line)
            if event.get("stage") != "ResponseComplete" or event["requestReceivedTimestamp"] < since:
                continue
            if event["user"]["username"] != "system:cloud-controller-manager":
                continue
            ref = event.get("objectRef") or {}
            key = f"{event['verb']} {ref.get('resource', '?')}{'/' + ref['subresource'] if ref.get('subresource') else ''}"
            code = (event.get("responseStatus") or {}).get("code", 0)
            if not 200 <= code < 300:
                key += f" ({code})"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)
        return out
    return [] if a == b else [f"{path}: upstream {json.dumps(a)}, ours {json.dumps(b)}"]


def kubectl_apply(kube: Kube, path: str) -> None:
    subprocess.run(["kubectl", f"--kubeconfig={kube.kubeconfig}", "apply", "-f", path], check=True,
                   stdout=subprocess.DEVNULL)


def setup(tenant: Kube, infra: Kube, crds: str) -> None:
    """Both managers run as the user system:cloud-controller-manager (so the audit log counts their
    writes): in the tenant cluster with the shipped RBAC and the mirroring controller's; in the infra
    cluster as cluster-admin (the RBAC each needs there is not what is compared)."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    for path in ("deploy/rbac.yaml", "deploy/kubevirt/tenant-rbac.yaml"):
        kubectl_apply(tenant, os.path.join(root, path))
    # Ours writes events.k8s.io/v1 events (deploy/rbac.yaml); upstream's framework v0.34 core/v1 ones.
    tenant.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", {
        "metadata": {"name": "bench-core-events"},
        "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch", "update"]}]}, ok=(409,))
    tenant.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "bench-core-events"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bench-core-events"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "system:cloud-controller-manager"}]}, ok=(409,))
    infra.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", {
        "metadata": {"name": "bench-ccm-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                      "name": "system:cloud-controller-manager"}]}, ok=(409,))
    kubectl_apply(infra, crds)
    for node, zone in (("infra-a", "zone-a"), ("infra-b", "zone-b")):
        infra.request("POST", "/api/v1/nodes", {"metadata": {"name": node, "labels": {
            "topology.kubernetes.io/region": "region-1", "topology.kubernetes.io/zone": zone}}}, ok=(409,))
    def served() -> bool:
        try:
            return infra.request("GET", VMI.format(ns="default")) is not None
        except RuntimeError:  # 404 until the CRD is established, 429 while its storage starts
            return False
    wait_for("the VMI resource", served, 60, interval=0.5)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", required=True)
    p.add_argument("--upstream-commit", required=True)
    p.add_argument("--ours", required=True)
    p.add_argument("--tenant", required=True, help="the tenant control plane's directory")
    p.add_argument("--infra", required=True, help="the infra control plane's directory")
    p.add_argument("--crds", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    tenant, infra = Kube(args.tenant), Kube(args.infra)
    setup(tenant, infra, args.crds)
    work = tempfile.mkdtemp(prefix="kubevirt-differential-")
    results = []
    for i, scenario in enumerate(SCENARIOS):
        log(f"scenario {i + 1}/{len(SCENARIOS)}: {scenario[0]}")
        up = run("upstream", args.upstream, i, scenario, args, tenant, infra, work)
        ours = run("ours", args.ours, i, scenario, args, tenant, infra, work)
        diffs = differences({k: v for k, v in up.items() if k != "API writes"},
                            {k: v for k, v in ours.items() if k != "API writes"})
        results.append({"scenario": scenario[0], "identical": not diffs, "differences": diffs,
                        "upstream": up, "ours": ours})
    meta = {"upstream_commit": args.upstream_commit, "date": str(datetime.date.today()), "logs": work}
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, sort_keys=True)
    write_report(results, meta, args.out)


def write_report(results: list[dict], meta: dict, out: str) -> None:
    same = sum(r["identical"] for r in results)
    lines = [f"kubevirt differential: {same} of {len(results)} identical", "",
             f"Upstream kubevirt-cloud-controller-manager at commit {meta['upstream_commit']} against ours, "
             f"one after the other on one tenant and one infra control plane (bench/kubevirt/run, "
             f"{meta['date']}). Per scenario: the infra Services and mirrored EndpointSlices, the tenant "
             "nodes' provider-owned fields, the tenant Services' status and whether the manager still runs, "
             f"names made comparable. Logs: {meta['logs']}.", "",
             "| scenario | identical | differences |", "|---|---|---|"]
    for r in results:
        lines.append(f"| {r['scenario']} | {'yes' if r['identical'] else 'no'} | "
                     f"{'<br>'.join(d.replace('|', '/') for d in r['differences']) or '-'} |")

    def count(writes: dict[str, int], refused: bool) -> int:
        return sum(n for k, n in writes.items() if k.endswith(")") == refused)

    lines += ["", "API writes by the manager's user during each scenario, from the API servers' audit logs (reads "
              "are not audited): done, then refused in parentheses (409: a conflict, written again; 403: not "
              "allowed), upstream / ours; by verb and resource in the .json.", "",
              "| scenario | tenant | infra |", "|---|---|---|"]
    for r in results:
        cells = []
        for side in ("tenant", "infra"):
            up, ours = r["upstream"]["API writes"][side], r["ours"]["API writes"][side]
            cells.append(f"{count(up, False)} ({count(up, True)}) / {count(ours, False)} ({count(ours, True)})")
        lines.append(f"| {r['scenario']} | {cells[0]} | {cells[1]} |")
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def report_only() -> None:
    """`--report FILE.json`: writes FILE.md again from the data of an earlier run."""
    data = json.load(open(sys.argv[2]))
    write_report(data["results"], data["meta"], os.path.splitext(sys.argv[2])[0] + ".md")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--report":
        report_only()
    else:
        main()
