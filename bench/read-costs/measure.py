#!/usr/bin/env python3
"""What reading Nodes costs the API server, by wire format (issue #53 item 1).

The store first gets NODES kubelet-sized nodes (as bench/write-costs and bench/runner make them). Then each
variant reads all of them once per round, the variants interleaved over the rounds so that drift touches
each alike: a streaming list (a watch with `sendInitialEvents=true`, read until the bookmark that ends the
initial events, as kube-rs and client-go start their caches by default), a paged list (`limit=500` and its
continue tokens, as both do when the server refuses a streaming list) and one unpaged list. Each is asked
in JSON (what kube-rs speaks), in protobuf (what client-go speaks) and in CBOR (KEP-4222; served only when
the API server runs with `--feature-gates=CBORServingAndStorage=true`, which bench/read-costs/run does).

The API server's `process_cpu_seconds_total` over the read, minus what the idle control plane uses over
the same span, is the variant's cost; the client's own CPU is not counted. The bytes received are
reported too. One read at a time: what the server pays per read, not what it can do in parallel.

Usage: measure.py KUBECONFIG [--nodes N] [--rounds R] [--threads T] [--variants "A;B"] [--json OUT]
(bench/read-costs/run brings up the control plane and calls it)
"""

import argparse
import http.client
import importlib.util
import json
import os
import statistics
import sys
import time
import urllib.parse


def _write_costs():
    """bench/write-costs/measure.py, whose client, kubelet-sized node and thread pool this reuses."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "write-costs", "measure.py")
    spec = importlib.util.spec_from_file_location("write_costs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_shared = _write_costs()
Api, kubelet_node, parallel = _shared.Api, _shared.kubelet_node, _shared.parallel
chosen_variants = _shared.chosen_variants

JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf"
PROTOBUF_STREAM = "application/vnd.kubernetes.protobuf;stream=watch"
CBOR = "application/cbor"
# The annotation of the bookmark that ends a streaming list's initial events; every encoding carries the
# key as its plain bytes, so the reader finds the end without decoding the stream.
INITIAL_EVENTS_END = b"k8s.io/initial-events-end"
PAGE = 500
RUN = f"{int(time.time()) % 100000:05d}"

# (name, how the nodes are read, Accept)
VARIANTS = [
    ("streaming list, JSON (kube-rs)", "stream", JSON),
    ("streaming list, protobuf (client-go)", "stream", PROTOBUF_STREAM),
    ("streaming list, CBOR", "stream", CBOR),
    ("paged list (500), JSON (kube-rs)", "paged", JSON),
    ("paged list (500), protobuf (client-go)", "paged", PROTOBUF),
    ("paged list (500), CBOR", "paged", CBOR),
    ("one unpaged list, JSON", "whole", JSON),
    ("one unpaged list, protobuf", "whole", PROTOBUF),
    ("one unpaged list, CBOR", "whole", CBOR),
]


def varint(data, i):
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7


def protobuf_field(data, number):
    """The bytes of the first length-delimited field NUMBER of the protobuf message DATA, or None."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        wire = key & 7
        if wire == 0:
            _, i = varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            length, i = varint(data, i)
            if key >> 3 == number:
                return data[i:i + length]
            i += length
        else:
            raise ValueError(f"protobuf wire type {wire} unexpected")
    return None


def continue_token(body, accept):
    """The list's `metadata.continue`, or "" on its last page."""
    if accept == JSON:
        return json.loads(body)["metadata"].get("continue", "")
    if accept == PROTOBUF:
        # "k8s\0", then runtime.Unknown{typeMeta=1, raw=2}; raw is the NodeList{metadata=1, items=2};
        # ListMeta{selfLink=1, resourceVersion=2, continue=3}.
        list_meta = protobuf_field(protobuf_field(body[4:], 2), 1) or b""
        return (protobuf_field(list_meta, 3) or b"").decode()
    # CBOR: the API server writes map keys and strings as byte strings; the key "continue" is followed by
    # its value's header (a byte or text string). Only the list's metadata has that key.
    at = body.find(b"\x48continue")
    if at < 0:
        return ""
    i = at + 9
    major_and_length = body[i]
    length = major_and_length & 0x1F
    i += 1
    if length == 24:
        length, i = body[i], i + 1
    elif length == 25:
        length, i = int.from_bytes(body[i:i + 2], "big"), i + 2
    elif length == 26:
        length, i = int.from_bytes(body[i:i + 4], "big"), i + 4
    return body[i:i + length].decode()


def read_stream(api, accept):
    """Reads a streaming list of the nodes until its initial events end; returns the bytes received."""
    conn = http.client.HTTPSConnection(api.host, api.port, context=api.context)
    query = "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    conn.request("GET", f"/api/v1/nodes?{query}",
                 headers={"Authorization": f"Bearer {api.token}", "Accept": accept})
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"streaming list in {accept}: {response.status} {response.read()[:300]!r}")
    received = 0
    tail = b""
    while True:
        chunk = response.read1(1 << 20)
        if not chunk:
            raise RuntimeError(f"streaming list in {accept}: the stream ended before its initial events did")
        received += len(chunk)
        window = tail + chunk
        if INITIAL_EVENTS_END in window:
            break
        tail = window[-len(INITIAL_EVENTS_END):]
    conn.close()
    return received


def read_paged(api, accept, limit):
    received = 0
    token = ""
    while True:
        query = f"limit={limit}" + (f"&continue={urllib.parse.quote(token)}" if token else "")
        body = api.request("GET", f"/api/v1/nodes?{query}", accept=accept)
        received += len(body)
        token = continue_token(body, accept)
        if not token:
            return received


def read(api, how, accept):
    if how == "stream":
        return read_stream(api, accept)
    if how == "paged":
        return read_paged(api, accept, PAGE)
    return len(api.request("GET", "/api/v1/nodes", accept=accept))


def measure(api, variant, idle_rate):
    _, how, accept = variant
    time.sleep(1)
    cpu0, t0 = api.cpu(), time.monotonic()
    received = read(api, how, accept)
    cpu1, t1 = api.cpu(), time.monotonic()
    span = t1 - t0
    return {"api_s": cpu1 - cpu0 - idle_rate * span, "seconds": span, "bytes": received}


def served(api, accept):
    try:
        api.request("GET", "/api/v1/nodes?limit=1", accept=accept.split(";")[0])
        return True
    except RuntimeError as e:
        if " 406 " in str(e):
            return False
        raise


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("kubeconfig")
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=16, help="node creations in flight")
    parser.add_argument("--variants", help="starts of variant names, separated by ';' (default: all)")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.nodes < 1 or args.rounds < 1 or args.threads < 1:
        parser.error("--nodes, --rounds and --threads must each be at least 1")
    variants = chosen_variants(parser, VARIANTS, args.variants)
    api = Api(args.kubeconfig)
    if not served(api, CBOR):
        refused = [v[0] for v in variants if v[2] == CBOR]
        if refused:
            parser.error("the API server does not serve CBOR (start it with "
                         "--feature-gates=CBORServingAndStorage=true, as bench/read-costs/run does), "
                         "so it cannot measure: " + "; ".join(refused))
    names = [f"rc{RUN}-{i}" for i in range(args.nodes)]
    started = time.monotonic()
    parallel(names, args.threads, lambda n: api.request("POST", "/api/v1/nodes", kubelet_node(n)))
    print(f"created {args.nodes} nodes in {time.monotonic() - started:.0f} s", file=sys.stderr)
    time.sleep(5)
    cpu0 = api.cpu()
    time.sleep(10)
    idle_rate = (api.cpu() - cpu0) / 10
    print(f"idle: API server {idle_rate:.3f} CPU-s/s", file=sys.stderr)
    results = {v[0]: [] for v in variants}
    for round_ in range(args.rounds):
        for variant in variants:
            row = measure(api, variant, idle_rate)
            results[variant[0]].append(row)
            print(f"round {round_ + 1}: {variant[0]}: API server {row['api_s']:.3f} CPU-s, "
                  f"{row['seconds']:.2f} s, {row['bytes'] / 1e6:.1f} MB", file=sys.stderr)
    print(f"| read of {args.nodes} nodes | API server CPU (median of {args.rounds}) | spread | "
          "against JSON's | bytes per node | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    medians = {title: statistics.median(r["api_s"] for r in rows) for title, rows in results.items()}
    for title, rows in results.items():
        how = title.split(",")[0]
        json_title = next((t for t in results if t.startswith(how) and "JSON" in t), None)
        ratio = f"{medians[title] / medians[json_title]:.2f}x" if json_title and medians[json_title] > 0 else "-"
        cpu = [r["api_s"] for r in rows]
        print(f"| {title} | {medians[title]:.2f} s | {min(cpu):.2f}–{max(cpu):.2f} | {ratio} | "
              f"{statistics.median(r['bytes'] for r in rows) / args.nodes:.0f} | "
              f"{statistics.median(r['seconds'] for r in rows):.2f} |")
    if args.json:
        json.dump({"nodes": args.nodes, "rounds": args.rounds, "idle": idle_rate, "results": results},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
