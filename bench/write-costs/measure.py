#!/usr/bin/env python3
"""What each write of a node's initialization costs the API server, by wire format (issue #31).

For each variant, WRITES nodes are created first (kubelet-sized, as bench/runner's `kubelet_node`), then
each gets one write of the variant, THREADS at a time over keep-alive HTTP/1.1 connections; the API
server's `process_cpu_seconds_total` (and etcd's CPU from /proc) over the writes, minus what the idle
control plane uses over the same span, divided by the writes, is the variant's cost. The client's own
CPU is not counted: only the server's.

With `--preload-nodes N` the store first gets N kubelet-sized nodes and one event per node (as a
node-initialization run leaves it), so each write's cost is measured against a full store as well as an
empty one; `--variants` picks variants by the start of their names, separated by `;` (the names hold
commas), e.g. `--variants "PUT node without;PATCH node status (merge), JSON"`.

The *protobuf in* variants send the body client-go sends (upstream's CCM writes Nodes and Events in
protobuf): `--protobuf-encoder` names the small Go encoder in bench/write-costs/protobuf-body, which
bench/write-costs/run builds and passes; the bodies are encoded before the timed writes.

Usage: measure.py KUBECONFIG [--writes N] [--threads T] [--rounds R] [--preload-nodes N] [--variants "A;B"]
[--protobuf-encoder BIN] [--json OUT]  (bench/write-costs/run brings up the control plane and calls it)
"""

import argparse
import base64
import http.client
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import threading
import time

UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized"
JSON = "application/json"
# Names of this run's nodes and events start with it, so runs against one control plane do not collide.
RUN = f"{int(time.time()) % 100000:05d}"
PROTOBUF = "application/vnd.kubernetes.protobuf"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def kubeconfig(path):
    text = open(path).read()
    server = re.search(r"server:\s*(\S+)", text).group(1)
    token = re.search(r"token:\s*(\S+)", text).group(1)
    ca = re.search(r"certificate-authority-data:\s*(\S+)", text).group(1)
    host, port = server.removeprefix("https://").split(":")
    context = ssl.create_default_context(cadata=base64.b64decode(ca).decode())
    context.check_hostname = False
    return host, int(port), token, context


class Api:
    def __init__(self, path):
        self.host, self.port, self.token, self.context = kubeconfig(path)
        self.local = threading.local()

    def request(self, method, path, body=None, content_type=JSON, accept=JSON):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.context)
            self.local.conn = conn
        headers = {"Authorization": f"Bearer {self.token}", "Accept": accept}
        data = None
        if isinstance(body, bytes):
            data = body
            headers["Content-Type"] = content_type
        elif body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        payload = response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
        return payload

    def cpu(self):
        text = self.request("GET", "/metrics", accept="text/plain").decode()
        return float(re.search(r"^process_cpu_seconds_total (\S+)$", text, re.M).group(1))


def etcd_cpu():
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.path.basename(open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0].decode()) != "etcd":
                continue
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return total


def kubelet_node(name):
    images = [
        {
            "names": [
                f"registry.example.com/team-{i % 7}/service-{i}@sha256:{i * 7919 + 13:064x}",
                f"registry.example.com/team-{i % 7}/service-{i}:v1.{i}.0",
            ],
            "sizeBytes": 20_000_000 + i * 3_000_000,
        }
        for i in range(30)
    ]

    def condition(type_, status, reason):
        return {"type": type_, "status": status, "reason": reason, "message": f"kubelet reports {type_}={status}",
                "lastHeartbeatTime": "2026-11-22T00:00:00Z", "lastTransitionTime": "2026-11-22T00:00:00Z"}

    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady"),
            ],
            "capacity": {"cpu": "8", "memory": "32858112Ki", "pods": "110", "ephemeral-storage": "101430960Ki",
                         "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": "7910m", "memory": "31610624Ki", "pods": "110",
                            "ephemeral-storage": "93478772582", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "addresses": [{"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": f"{len(name) * 7919:032x}", "systemUUID": f"ec2{len(name):029x}",
                         "bootID": "5f3b1c2e-8d4a-4b6e-9c1f-2a3b4c5d6e7f", "kernelVersion": "6.1.0-27-cloud-amd64",
                         "osImage": "Debian GNU/Linux 12 (bookworm)", "containerRuntimeVersion": "containerd://1.7.24",
                         "kubeletVersion": "v1.37.1", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": images,
        },
    }


def initialized(stored, with_status, images=False):
    """The node initialized: the stored node with the cloud's labels and provider ID, the uninitialized
    taint gone; with its status but without images (as our cache keeps it), with its whole status
    (IMAGES: as upstream PUTs the node it has just read), or without status (as our manager PUTs it: the
    API server keeps a Node's status on a PUT of the Node)."""
    node = json.loads(json.dumps(stored))
    node["metadata"].pop("managedFields", None)
    node["metadata"]["labels"].update({"topology.kubernetes.io/zone": "zone-a",
                                       "topology.kubernetes.io/region": "region-1",
                                       "node.kubernetes.io/instance-type": "standard"})
    node["spec"] = {"providerID": f"fake://{node['metadata']['name']}"}
    if with_status and not images:
        node["status"].pop("images", None)
    else:
        node.pop("status")
    return node


def status_patch(name):
    return {"status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                     {"type": "Hostname", "address": name}]}}


def events_v1(name, i):
    now = "2026-11-27T00:00:00.000000Z"
    return {"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": f"{name}.{i:016x}", "namespace": "default"},
            "eventTime": now, "reportingController": "cloud-node-controller", "reportingInstance": "bench",
            "action": "Synced", "reason": "Synced", "note": "Node synced successfully", "type": "Normal",
            "regarding": {"kind": "Node", "name": name, "apiVersion": "v1", "uid": ""}}


def core_event(name, i):
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{name}.{i:016x}", "namespace": "default"},
            "involvedObject": {"kind": "Node", "name": name, "apiVersion": "v1"},
            "reason": "Synced", "message": "Node synced successfully", "type": "Normal",
            "source": {"component": "cloud-node-controller"},
            "firstTimestamp": "2026-11-27T00:00:00Z", "lastTimestamp": "2026-11-27T00:00:00Z", "count": 1}


def protobuf_bodies(encoder, objects):
    """The protobuf bodies of OBJECTS (JSON-able core/v1 objects), in order, from the Go encoder."""
    lines = "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in objects)
    out = subprocess.run([encoder], input=lines.encode(), capture_output=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{encoder}: {out.stderr.decode().strip()}")
    bodies = [base64.b64decode(line) for line in out.stdout.split()]
    if len(bodies) != len(objects):
        raise RuntimeError(f"{encoder}: {len(bodies)} bodies for {len(objects)} objects")
    return bodies


# (name, what is written, how); `body` PROTOBUF sends the body in protobuf, as client-go does.
VARIANTS = [
    ("PUT node with its status, JSON in, JSON out", "put", dict(with_status=True, accept=JSON)),
    ("PUT node without status, JSON in, JSON out (ours)", "put", dict(with_status=False, accept=JSON)),
    ("PUT node with its status, JSON in, metadata out", "put", dict(with_status=True, accept=METADATA)),
    ("PUT node with its status, JSON in, protobuf out", "put", dict(with_status=True, accept=PROTOBUF)),
    ("PUT node with its whole status, JSON in, JSON out", "put",
     dict(with_status=True, images=True, accept=JSON)),
    ("PUT node with its whole status, protobuf in, protobuf out (upstream's)", "put",
     dict(with_status=True, images=True, accept=PROTOBUF, body=PROTOBUF)),
    ("PUT node without status, protobuf in, protobuf out", "put",
     dict(with_status=False, accept=PROTOBUF, body=PROTOBUF)),
    ("PUT node without status, protobuf in, JSON out", "put", dict(with_status=False, accept=JSON, body=PROTOBUF)),
    ("PUT node without status, JSON in, protobuf out", "put", dict(with_status=False, accept=PROTOBUF)),
    ("PUT node without status, JSON in, JSON out, fieldValidation=Ignore", "put",
     dict(with_status=False, accept=JSON, query="?fieldValidation=Ignore")),
    ("PATCH node status (merge), JSON out (ours)", "status", dict(accept=JSON)),
    ("PATCH node status (merge), metadata out", "status", dict(accept=METADATA)),
    ("PATCH node status (merge), protobuf out", "status", dict(accept=PROTOBUF)),
    ("PATCH node status (merge), JSON out, fieldValidation=Ignore", "status",
     dict(accept=JSON, query="?fieldValidation=Ignore")),
    ("POST events.k8s.io/v1 Event, JSON out (ours)", "event_v1", dict(accept=JSON)),
    ("POST events.k8s.io/v1 Event, JSON out, fieldValidation=Ignore", "event_v1",
     dict(accept=JSON, query="?fieldValidation=Ignore")),
    ("POST core/v1 Event, JSON out", "event_core", dict(accept=JSON)),
    ("POST core/v1 Event, protobuf out", "event_core", dict(accept=PROTOBUF)),
    ("POST core/v1 Event, protobuf in, protobuf out (upstream's)", "event_core",
     dict(accept=PROTOBUF, body=PROTOBUF)),
]


def parallel(items, threads, work):
    items = list(items)
    errors = []
    lock = threading.Lock()
    index = [0]

    def run():
        while True:
            with lock:
                if index[0] >= len(items) or errors:
                    return
                item = items[index[0]]
                index[0] += 1
            try:
                work(item)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(e)

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        raise errors[0]


def measure(api, variant, round_, writes, threads, idle_rate, encoder):
    title, kind, how = variant
    prefix = f"wc{RUN}-{round_}-{VARIANTS.index(variant)}-"
    names = [f"{prefix}{i}" for i in range(writes)]
    stored = {}

    def create(name):
        stored[name] = json.loads(api.request("POST", "/api/v1/nodes", kubelet_node(name)))

    parallel(names, threads, create)
    index = {name: i for i, name in enumerate(names)}
    bodies = {}
    if kind == "put":
        bodies = {name: initialized(stored[name], how["with_status"], how.get("images", False))
                  for name in names}
    elif kind == "event_core":
        bodies = {name: core_event(name, index[name]) for name in names}
    content_type = JSON
    if how.get("body") == PROTOBUF:
        bodies = dict(zip(names, protobuf_bodies(encoder, [bodies[name] for name in names])))
        content_type = PROTOBUF
    time.sleep(2)

    def write(name):
        i = index[name]
        if kind == "put":
            api.request("PUT", f"/api/v1/nodes/{name}{how.get('query', '')}", bodies[name],
                        content_type=content_type, accept=how["accept"])
        elif kind == "status":
            api.request("PATCH", f"/api/v1/nodes/{name}/status{how.get('query', '')}", status_patch(name),
                        content_type="application/merge-patch+json", accept=how["accept"])
        elif kind == "event_v1":
            api.request("POST", f"/apis/events.k8s.io/v1/namespaces/default/events{how.get('query', '')}",
                        events_v1(name, i), accept=how["accept"])
        else:
            api.request("POST", "/api/v1/namespaces/default/events", bodies[name], content_type=content_type,
                        accept=how["accept"])

    cpu0, etcd0, t0 = api.cpu(), etcd_cpu(), time.monotonic()
    parallel(names, threads, write)
    cpu1, etcd1, t1 = api.cpu(), etcd_cpu(), time.monotonic()
    span = t1 - t0
    api_ms = (cpu1 - cpu0 - idle_rate[0] * span) / writes * 1000
    etcd_ms = (etcd1 - etcd0 - idle_rate[1] * span) / writes * 1000
    # Clean up so the next variant meets the same store size.
    parallel(names, threads, lambda n: api.request("DELETE", f"/api/v1/nodes/{n}"))
    return api_ms, etcd_ms, writes / span


def preload(api, count, threads):
    """COUNT nodes and one events.k8s.io/v1 Event per node, left in the store for the whole run."""
    names = [f"preload{RUN}-{i}" for i in range(count)]
    started = time.monotonic()
    parallel(names, threads, lambda n: api.request("POST", "/api/v1/nodes", kubelet_node(n)))
    parallel(list(enumerate(names)), threads,
             lambda item: api.request("POST", "/apis/events.k8s.io/v1/namespaces/default/events",
                                      events_v1(item[1], item[0])))
    print(f"preloaded {count} nodes and {count} events in {time.monotonic() - started:.0f} s", file=sys.stderr)


def chosen_variants(parser, variants, spec):
    """The VARIANTS (tuples whose first item is the name) that SPEC picks by the start of their names,
    separated by ';' (the names hold commas); all of them without SPEC. A SPEC that picks none is a usage
    error that lists the names."""
    if not spec:
        return variants
    starts = [v.strip() for v in spec.split(";") if v.strip()]
    chosen = [v for v in variants if any(v[0].startswith(start) for start in starts)]
    if not chosen:
        parser.error(f"--variants {spec!r} matches none of: " + "; ".join(v[0] for v in variants))
    return chosen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kubeconfig")
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--preload-nodes", type=int, default=0)
    parser.add_argument("--variants", help="starts of variant names, separated by ';' (default: all)")
    parser.add_argument("--protobuf-encoder", help="the Go encoder of protobuf bodies (bench/write-costs/run builds it)")
    parser.add_argument("--json")
    args = parser.parse_args()
    variants = chosen_variants(parser, VARIANTS, args.variants)
    needs_encoder = [v[0] for v in variants if v[2].get("body") == PROTOBUF]
    if needs_encoder and not args.protobuf_encoder:
        parser.error("--protobuf-encoder is needed for " + "; ".join(needs_encoder)
                     + " (bench/write-costs/run builds and passes it; or leave them out with --variants)")
    api = Api(args.kubeconfig)
    if args.preload_nodes:
        preload(api, args.preload_nodes, args.threads)
    # The idle control plane's own CPU (its lease renewals, its controllers), subtracted.
    cpu0, etcd0 = api.cpu(), etcd_cpu()
    time.sleep(10)
    idle_rate = ((api.cpu() - cpu0) / 10, (etcd_cpu() - etcd0) / 10)
    print(f"idle: API server {idle_rate[0]:.3f} CPU-s/s, etcd {idle_rate[1]:.3f}", file=sys.stderr)
    results = {v[0]: [] for v in variants}
    for round_ in range(args.rounds):
        # Rounds interleave the variants, so drift over the run (the API server's heap, etcd's size)
        # touches each alike.
        for variant in variants:
            api_ms, etcd_ms, rate = measure(api, variant, round_, args.writes, args.threads, idle_rate,
                                            args.protobuf_encoder)
            results[variant[0]].append({"api_ms": api_ms, "etcd_ms": etcd_ms, "writes_per_s": rate})
            print(f"round {round_ + 1}: {variant[0]}: API server {api_ms:.3f} ms, etcd {etcd_ms:.3f} ms "
                  f"per write, {rate:.0f} writes/s", file=sys.stderr)
    print("| write | API server CPU per write (median of rounds) | spread | etcd CPU per write | writes/s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for title, rows in results.items():
        api = [r["api_ms"] for r in rows]
        print(f"| {title} | {statistics.median(api):.2f} ms | {min(api):.2f}–{max(api):.2f} | "
              f"{statistics.median(r['etcd_ms'] for r in rows):.2f} ms | "
              f"{statistics.median(r['writes_per_s'] for r in rows):.0f} |")
    if args.json:
        json.dump({"writes": args.writes, "threads": args.threads, "preload_nodes": args.preload_nodes,
                   "idle": idle_rate, "results": results},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
