#!/usr/bin/env python3
"""The aws provider side by side with upstream cloud-provider-aws, on one moto and one control plane.

Run by bench/aws/run (which builds both managers, starts the control plane and picks the moto virtualenv's
python, for boto3). Each manager in turn, on a moto reset in between:

  1. a VPC, a subnet (tagged for the cluster and kubernetes.io/role/elb) and --nodes t3.medium instances;
  2. the manager starts (the same cloud-config, flags and environment for both);
  3. node initialization: --nodes Node objects as kubelets register them (uninitialized taint, Ready);
     time until none has the taint, AWS calls made meanwhile;
  4. one Classic ELB Service, then one NLB Service: AWS calls until each has its ingress hostname;
  5. --services Classic ELB Services at once: time until all have their hostname, calls;
  6. node churn: --churn new instances and nodes, --churn old nodes deleted (their instances
     terminated): time until every load balancer's instances are exactly the new node set, calls;
  7. every Service deleted: time until moto has no load balancer left, calls.

AWS calls are counted by a proxy in front of moto that every manager reaches through [ServiceOverride]
endpoints (and AWS_ENDPOINT_URL, so that any call the overrides miss is counted too, never sent out).
The instance metadata endpoint is pointed at a local listener (and disabled with
AWS_EC2_METADATA_DISABLED=true): the report says how many connections it saw. Nothing here asserts a
timing; it is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import base64
import collections
import datetime
import http.client
import http.server
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import boto3

REGION = "us-west-2"
ZONE = "us-west-2a"
CLUSTER_ID = "ccm-bench"
# Both managers' `--cluster-name` (their default too), which managed NLB security group names hash.
CLUSTER_NAME = "kubernetes"
AMI = "ami-12c6146b"  # an AMI moto knows
UNINITIALIZED = "node.cloudprovider.kubernetes.io/uninitialized"
NAMESPACE = "default"


def log(message: str) -> None:
    print(f"[{datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the counting proxy ------------------------------------------------------------------------------


class Counter:
    """AWS calls per operation (`ec2:DescribeInstances`, `elb:CreateLoadBalancer`, `elbv2:...`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()

    def add(self, operation: str, status: int) -> None:
        with self.lock:
            self.calls[operation] += 1
            if status >= 400:
                self.errors[f"{operation} {status}"] += 1

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.calls)

    def error_snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.errors)


def operation_of(headers, body: bytes, path: str) -> str:
    """The API operation of a query-protocol request (EC2, ELB, ELBv2), named by service."""
    fields = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
    fields.update(urllib.parse.parse_qs(urllib.parse.urlsplit(path).query))
    action = (fields.get("Action") or [""])[0]
    version = (fields.get("Version") or [""])[0]
    target = headers.get("X-Amz-Target", "")
    if not action and target:
        return "json:" + target
    service = {"2012-06-01": "elb", "2015-12-01": "elbv2"}.get(version)
    if service is None:
        scope = re.search(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/", headers.get("Authorization", ""))
        service = scope.group(1) if scope else "unknown"
    return f"{service}:{action or '?'}"


def start_proxy(moto_port: int, counter: Counter) -> int:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def do_POST(self) -> None:
            self.forward()

        def do_GET(self) -> None:
            self.forward()

        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            upstream = http.client.HTTPConnection("127.0.0.1", moto_port, timeout=120)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            counter.add(operation_of(self.headers, body, self.path), response.status)
            self.send_response(response.status)
            for key, value in response.getheaders():
                if key.lower() not in ("connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            upstream.close()

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request, client_address) -> None:
            # A manager closing an idle keep-alive connection is no error; anything else is reported.
            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


def start_metadata_trap() -> tuple[int, list[str]]:
    """A listener where the instance metadata endpoint is pointed; it records every connection."""
    seen: list[str] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def serve() -> None:
        while True:
            conn, _ = listener.accept()
            conn.settimeout(2)
            try:
                seen.append(conn.recv(200).decode("latin-1").split("\r\n", 1)[0])
            except OSError:
                seen.append("(connection, no request)")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], seen


# --- moto --------------------------------------------------------------------------------------------


class Moto:
    def __init__(self) -> None:
        self.port = free_port()
        # moto with AWS's default health check on new Classic ELBs (see moto_server.py), in this python.
        wrapper = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moto_server.py")
        self.proc = subprocess.Popen([sys.executable, wrapper, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit(f"moto_server did not listen on {self.port} within 30 s")
                time.sleep(0.05)
        self.endpoint = f"http://127.0.0.1:{self.port}"
        session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing",
                                        region_name=REGION)
        self.ec2 = session.client("ec2", endpoint_url=self.endpoint)
        self.elb = session.client("elb", endpoint_url=self.endpoint)
        self.elbv2 = session.client("elbv2", endpoint_url=self.endpoint)

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(self.endpoint + "/moto-api/reset", method="POST")).read()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)

    def network(self) -> dict[str, str]:
        tag = {"Key": f"kubernetes.io/cluster/{CLUSTER_ID}", "Value": "owned"}

        def spec(kind: str, extra=()) -> list[dict]:
            return [{"ResourceType": kind, "Tags": [tag, *extra]}]

        vpc = self.ec2.create_vpc(CidrBlock="10.0.0.0/16", TagSpecifications=spec("vpc"))["Vpc"]["VpcId"]
        subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/18", AvailabilityZone=ZONE,
                                        TagSpecifications=spec("subnet", [{"Key": "kubernetes.io/role/elb", "Value": "1"}]))
        sg = self.ec2.create_security_group(GroupName="nodes", Description="the cluster's nodes", VpcId=vpc,
                                            TagSpecifications=spec("security-group"))
        # A public subnet: upstream puts internet-facing ELBs only in subnets whose route table has a
        # route to an internet gateway.
        igw = self.ec2.create_internet_gateway(TagSpecifications=spec("internet-gateway"))["InternetGateway"]["InternetGatewayId"]
        self.ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
        tables = self.ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"]
        main = next(t for t in tables if any(a.get("Main") for a in t.get("Associations", [])))
        self.ec2.create_route(RouteTableId=main["RouteTableId"], DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
        return {"vpc": vpc, "subnet": subnet["Subnet"]["SubnetId"], "sg": sg["GroupId"]}

    def run_instances(self, net: dict[str, str], count: int) -> list[dict]:
        tag = {"Key": f"kubernetes.io/cluster/{CLUSTER_ID}", "Value": "owned"}
        out = self.ec2.run_instances(ImageId=AMI, InstanceType="t3.medium", MinCount=count, MaxCount=count,
                                     SubnetId=net["subnet"], SecurityGroupIds=[net["sg"]],
                                     TagSpecifications=[{"ResourceType": "instance", "Tags": [tag]}])
        return [{"id": i["InstanceId"], "dns": i["PrivateDnsName"]} for i in out["Instances"]]

    def terminate(self, ids: list[str]) -> None:
        if ids:
            self.ec2.terminate_instances(InstanceIds=ids)

    def classic_backends(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for page in self.elb.get_paginator("describe_load_balancers").paginate():
            for lb in page["LoadBalancerDescriptions"]:
                out[lb["LoadBalancerName"]] = {i["InstanceId"] for i in lb.get("Instances", [])}
        return out

    def load_balancer_count(self) -> int:
        classic = sum(len(p["LoadBalancerDescriptions"]) for p in self.elb.get_paginator("describe_load_balancers").paginate())
        v2 = sum(len(p["LoadBalancers"]) for p in self.elbv2.get_paginator("describe_load_balancers").paginate())
        return classic + v2


# --- the API server ----------------------------------------------------------------------------------


class Kube:
    def __init__(self, cp_dir: str) -> None:
        text = open(os.path.join(cp_dir, "admin.kubeconfig")).read()
        self.server = re.search(r"server: (\S+)", text).group(1)
        self.token = re.search(r"token: (\S+)", text).group(1)
        ca = base64.b64decode(re.search(r"certificate-authority-data: (\S+)", text).group(1)).decode()
        self.ssl = ssl.create_default_context(cadata=ca)
        self.kubeconfig = os.path.join(cp_dir, "admin.kubeconfig")

    def request(self, method: str, path: str, body=None, content_type="application/json", ok=(200, 201)):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ssl, timeout=60) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            if err.code in ok:
                return None
            raise RuntimeError(f"{method} {path}: {err.code} {err.read()[:300]!r}") from None

    def create_node(self, name: str) -> None:
        self.request("POST", "/api/v1/nodes", {
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                                  "kubernetes.io/arch": "amd64"}},
            "spec": {"taints": [{"key": UNINITIALIZED, "value": "true", "effect": "NoSchedule"}]},
        })
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "Hostname", "address": name}]}},
            content_type="application/strategic-merge-patch+json")

    def nodes(self) -> list[dict]:
        return self.request("GET", "/api/v1/nodes")["items"]

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{name}", ok=(200, 202, 404))

    def create_service(self, name: str, nlb: bool = False) -> None:
        annotations = {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"} if nlb else {}
        self.request("POST", f"/api/v1/namespaces/{NAMESPACE}/services", {
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"type": "LoadBalancer", "selector": {"app": name},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})

    def services(self) -> list[dict]:
        return self.request("GET", f"/api/v1/namespaces/{NAMESPACE}/services")["items"]

    def delete_service(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/{name}", ok=(200, 202, 404))


    def clean(self) -> None:
        """Removes what an earlier run left: LoadBalancer Services (their finalizers too) and nodes."""
        for s in self.services():
            if s["spec"].get("type") == "LoadBalancer":
                name = s["metadata"]["name"]
                self.request("PATCH", f"/api/v1/namespaces/{NAMESPACE}/services/{name}",
                             {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json")
                self.delete_service(name)
        for n in self.nodes():
            self.delete_node(n["metadata"]["name"])
        wait_for("a clean control plane", lambda: not self.nodes() and not [
            s for s in self.services() if s["spec"].get("type") == "LoadBalancer"], 60)


def has_hostname(service: dict) -> bool:
    ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or []
    return any(i.get("hostname") for i in ingress)


def initialized(node: dict) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return not any(t["key"] == UNINITIALIZED for t in taints)


def wait_for(what: str, check, timeout: float, interval: float = 0.1) -> float:
    """Polls `check` until true; returns the time it took. Gives up (an error naming `what`) at `timeout`."""
    start = time.monotonic()
    while True:
        if check():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in sorted(after.items()) if v - before.get(k, 0)}


# --- one manager -------------------------------------------------------------------------------------


def cloud_config(net: dict[str, str], proxy: int) -> str:
    """One cloud-config for both managers: upstream's [ServiceOverride] service IDs are aws-sdk-go-v2's
    (`EC2`, `Elastic Load Balancing`, `Elastic Load Balancing v2`; v1.37 ignores the old `ec2`)."""
    lines = ["[Global]", f"Zone = {ZONE}", f"VPC = {net['vpc']}", f"SubnetID = {net['subnet']}",
             f"KubernetesClusterID = {CLUSTER_ID}",
             # Every Classic ELB would add a rule to the nodes' group; 100 of them exceed the rules-per-group
             # quota (moto enforces 60), for both managers alike.
             "DisableSecurityGroupIngress = true", ""]
    for n, service in enumerate(["EC2", "Elastic Load Balancing", "Elastic Load Balancing v2"], 1):
        lines += [f'[ServiceOverride "{n}"]', f"Service = {service}", f"Region = {REGION}",
                  f"URL = http://127.0.0.1:{proxy}", f"SigningRegion = {REGION}", ""]
    return "\n".join(lines)


def manager_flags(config_path: str, kubeconfig: str) -> list[str]:
    """The flags every run gives both managers (a run may add its own after them)."""
    return [
        "--cloud-provider=aws", f"--cloud-config={config_path}", f"--kubeconfig={kubeconfig}",
        f"--cluster-name={CLUSTER_NAME}",
        "--controllers=cloud-node,cloud-node-lifecycle,service", "--leader-elect=false", "--secure-port=0",
        "--kube-api-qps=200", "--kube-api-burst=400",
    ]


def manager_env(proxy: int, trap_port: int, rust_log: str) -> dict[str, str]:
    """The environment of both managers: static credentials, an explicit region, instance metadata off
    (and pointed at the trap), every endpoint at the counting proxy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update({
        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{trap_port}/",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy}", "RUST_LOG": rust_log,
    })
    return env


class Environment:
    """What every run stands on: moto, the counting proxy in front of it, the metadata trap, the API
    server."""

    def __init__(self, control_plane: str) -> None:
        self.counter = Counter()
        self.moto = Moto()
        self.proxy = start_proxy(self.moto.port, self.counter)
        self.trap_port, self.trap_seen = start_metadata_trap()
        self.kube = Kube(control_plane)


class Manager:
    """One manager process over the shared cloud-config, flags and environment (`manager_flags`,
    `manager_env`), with `extra_flags` after them (a flag given again replaces the shared one), logging to
    `<work>/<run>.log`."""

    def __init__(self, kind: str, binary: str, config: str, kube: Kube, proxy: int, trap_port: int,
                 work: str, run: str, extra_flags: list[str] = ()) -> None:
        names = {f.split("=", 1)[0] for f in extra_flags}
        flags = [f for f in manager_flags(config, kube.kubeconfig) if f.split("=", 1)[0] not in names]
        flags += list(extra_flags)
        env = manager_env(proxy, trap_port, "info")
        self.kind = kind
        self.log_path = os.path.join(work, f"{run}.log")
        self.log_file = open(self.log_path, "w")
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.proc = subprocess.Popen([binary, *flags], stdout=self.log_file, stderr=subprocess.STDOUT, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        time.sleep(2)
        if self.proc.poll() is not None:
            raise RuntimeError(f"the {kind} manager exited with {self.proc.returncode}: see {self.log_path}")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log_file.close()


def common_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments bench/aws/run gives every script."""
    p.add_argument("--rust-bin", required=True)
    p.add_argument("--go-bin", required=True)
    p.add_argument("--control-plane", required=True, help="the directory of a running test control plane")
    p.add_argument("--work-dir", required=True)
    p.add_argument("--json", required=True, help="where the raw record goes")
    p.add_argument("--meta", default="{}", help="JSON: what the report says about the run")


def run_manager(kind: str, binary: str, args, moto: Moto, kube: Kube, counter: Counter, proxy: int,
                trap_port: int, work: str) -> dict:
    log(f"{kind}: preparing moto")
    kube.clean()
    moto.reset()
    net = moto.network()
    instances = moto.run_instances(net, args.nodes)
    config_path = os.path.join(work, f"{kind}-cloud.conf")
    with open(config_path, "w") as f:
        f.write(cloud_config(net, proxy))
    flags = manager_flags(config_path, kube.kubeconfig) + [
        f"--concurrent-node-syncs={args.workers}", f"--concurrent-service-syncs={args.workers}"]
    if kind == "rust":
        # Our drift checks (reads spread over 5 m) would fall into the measured phases, which upstream
        # has no counterpart for: off here, measured on their own by `bench/aws/run --drift`.
        flags.append("--load-balancer-drift-period=0s")
    env = manager_env(proxy, trap_port, "warn")
    log_path = os.path.join(work, f"{kind}-manager.log")
    result: dict = {"manager": kind, "nodes": args.nodes, "services": args.services, "churn": args.churn}
    at_start = counter.snapshot()
    errors_at_start = counter.error_snapshot()
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen([binary, *flags], stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            time.sleep(3)
            if proc.poll() is not None:
                raise RuntimeError(f"the {kind} manager exited with {proc.returncode}: see {log_path}")
            result["startup_calls"] = diff(counter.snapshot(), at_start)
            measure(kind, args, moto, kube, counter, net, instances, result)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    result["errors"] = diff(counter.error_snapshot(), errors_at_start)
    return result


def measure(kind: str, args, moto: Moto, kube: Kube, counter: Counter, net, instances, result: dict) -> None:
    names = [i["dns"] for i in instances]

    # Node initialization.
    log(f"{kind}: {len(names)} nodes register")
    before = counter.snapshot()
    start = time.monotonic()
    for name in names:
        kube.create_node(name)
    wanted = set(names)
    wait_for("the nodes' initialization", lambda: wanted <= {n["metadata"]["name"] for n in kube.nodes() if initialized(n)},
             args.timeout)
    result["node_init_seconds"] = time.monotonic() - start
    result["node_init_calls"] = diff(counter.snapshot(), before)
    labels = {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in kube.nodes()}
    result["node_labels"] = sorted(k for k in labels[names[0]] if k not in ("kubernetes.io/hostname", "kubernetes.io/os", "kubernetes.io/arch"))
    result["zone_id_label"] = labels[names[0]].get("topology.k8s.aws/zone-id")

    # Idle: nothing changes for a while.
    before = counter.snapshot()
    time.sleep(args.idle)
    result["idle_seconds"] = args.idle
    result["idle_calls"] = diff(counter.snapshot(), before)

    # One Classic ELB, then one NLB.
    for label, nlb in (("one_elb", False), ("one_nlb", True)):
        name = f"bench-{label.replace('_', '-')}"
        before = counter.snapshot()
        kube.create_service(name, nlb=nlb)
        result[f"{label}_seconds"] = wait_for(f"{name}'s hostname",
                                              lambda: any(s["metadata"]["name"] == name and has_hostname(s) for s in kube.services()),
                                              args.timeout)
        time.sleep(2)  # let a sync that follows the status write finish (counted too)
        result[f"{label}_calls"] = diff(counter.snapshot(), before)

    # Many Classic ELBs at once.
    log(f"{kind}: {args.services} LoadBalancer Services")
    before = counter.snapshot()
    start = time.monotonic()
    many = [f"bench-lb-{i:03d}" for i in range(args.services)]
    for name in many:
        kube.create_service(name)
    wanted_services = set(many)
    wait_for("every Service's hostname", lambda: wanted_services <= {s["metadata"]["name"] for s in kube.services() if has_hostname(s)},
             args.timeout, interval=0.25)
    result["provision_seconds"] = time.monotonic() - start
    time.sleep(2)
    result["provision_calls"] = diff(counter.snapshot(), before)

    # Node churn: new nodes come, old ones go.
    log(f"{kind}: node churn ({args.churn} in, {args.churn} out)")
    ids_by_name = {i["dns"]: i["id"] for i in instances}
    before = counter.snapshot()
    start = time.monotonic()
    fresh = moto.run_instances(net, args.churn)
    for i in fresh:
        kube.create_node(i["dns"])
        ids_by_name[i["dns"]] = i["id"]
    gone = names[: args.churn]
    moto.terminate([ids_by_name[n] for n in gone])
    for name in gone:
        kube.delete_node(name)
    expected = {ids_by_name[n] for n in names[args.churn:]} | {i["id"] for i in fresh}

    def followed() -> bool:
        backends = moto.classic_backends()
        return len(backends) == args.services + 1 and all(ids == expected for ids in backends.values())

    result["churn_seconds"] = wait_for("the load balancers to follow the churn", followed, args.timeout, interval=0.5)
    time.sleep(2)
    result["churn_calls"] = diff(counter.snapshot(), before)

    # Everything goes.
    log(f"{kind}: deleting every Service")
    before = counter.snapshot()
    start = time.monotonic()
    for s in kube.services():
        if s["spec"].get("type") == "LoadBalancer":
            kube.delete_service(s["metadata"]["name"])
    wait_for("every load balancer deleted", lambda: moto.load_balancer_count() == 0, args.timeout, interval=0.5)
    result["delete_seconds"] = time.monotonic() - start
    wait_for("the Services gone", lambda: not [s for s in kube.services() if s["spec"].get("type") == "LoadBalancer"],
             args.timeout)
    result["delete_calls"] = diff(counter.snapshot(), before)
    for n in kube.nodes():
        kube.delete_node(n["metadata"]["name"])


# --- the report --------------------------------------------------------------------------------------


def total(calls: dict[str, int]) -> int:
    return sum(calls.values())


def fmt_calls(calls: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(calls.items())) or "none"


def report(results: list[dict], meta: dict) -> str:
    rust = next(r for r in results if r["manager"] == "rust")
    go = next(r for r in results if r["manager"] == "upstream")
    n, s, c = rust["nodes"], rust["services"], rust["churn"]

    def ratio(a: float, b: float) -> str:
        return f"{b / a:.2f}x" if a else "n/a"

    def without_topology(calls: dict[str, int]) -> int:
        return total(calls) - calls.get("ec2:DescribeInstanceTopology", 0)

    rows = [
        ("AWS calls per node initialization", total(rust["node_init_calls"]) / n, total(go["node_init_calls"]) / n),
        ("… without DescribeInstanceTopology (see below)",
         without_topology(rust["node_init_calls"]) / n, without_topology(go["node_init_calls"]) / n),
        ("AWS calls per Classic ELB creation (one Service)", total(rust["one_elb_calls"]), total(go["one_elb_calls"])),
        ("AWS calls per NLB creation (one Service)", total(rust["one_nlb_calls"]), total(go["one_nlb_calls"])),
        (f"AWS calls per Classic ELB creation ({s} at once)", total(rust["provision_calls"]) / s, total(go["provision_calls"]) / s),
        (f"AWS calls per load-balancer update in the churn ({s + 1} ELBs; the new nodes' initialization included)", total(rust["churn_calls"]) / (s + 1), total(go["churn_calls"]) / (s + 1)),
        (f"AWS calls per load-balancer deletion ({s + 2})", total(rust["delete_calls"]) / (s + 2), total(go["delete_calls"]) / (s + 2)),
        (f"AWS calls while idle ({rust['idle_seconds']} s, {n} nodes)", total(rust["idle_calls"]), total(go["idle_calls"])),
        (f"time to initialize {n} nodes (s)", rust["node_init_seconds"], go["node_init_seconds"]),
        (f"time to provision {s} Classic ELBs (s)", rust["provision_seconds"], go["provision_seconds"]),
        (f"time to follow node churn, {c} in + {c} out, {s + 1} ELBs (s)", rust["churn_seconds"], go["churn_seconds"]),
        (f"time to delete {s + 2} load balancers (s)", rust["delete_seconds"], go["delete_seconds"]),
    ]
    out = [f"# aws provider vs upstream cloud-provider-aws {meta['upstream_version']}: {meta['date']}", "",
           f"One run of `bench/aws/run {meta['argv']}` at commit `{meta['commit']}`, on {meta['machine']}.",
           "Both managers ran one after the other against the same moto "
           f"{meta['moto_version']} (reset in between) and the same test control plane (kube-apiserver "
           f"{meta['k8s_version']}), with the same cloud-config, the same flags (`{' '.join(meta['flags'])}`) and "
           "the same environment. AWS calls are every request that reached moto, counted by the bench's proxy "
           "(retries included). Ratios are upstream / ours: above 1 means upstream needs more.", "",
           "| measure | ours (Rust) | upstream (Go) | upstream / ours |", "| --- | ---: | ---: | ---: |"]
    for label, a, b in rows:
        out.append(f"| {label} | {a:.2f} | {b:.2f} | {ratio(a, b)} |")
    out += ["", f"Instance metadata connections seen: {meta['metadata_connections']} "
            "(the endpoint pointed at a local listener; AWS_EC2_METADATA_DISABLED=true).", "",
            "## The calls, per phase", ""]
    phases = [("startup_calls", "at start (3 s)"), ("node_init_calls", f"{n} nodes initialized"),
              ("idle_calls", f"idle {rust['idle_seconds']} s"), ("one_elb_calls", "one Classic ELB Service"),
              ("one_nlb_calls", "one NLB Service"), ("provision_calls", f"{s} Classic ELB Services"),
              ("churn_calls", f"churn, {c} nodes in and {c} out"), ("delete_calls", "every Service deleted")]
    out += ["| phase | ours | upstream |", "| --- | --- | --- |"]
    for key, label in phases:
        out.append(f"| {label} | {total(rust[key])}: {fmt_calls(rust[key])} | {total(go[key])}: {fmt_calls(go[key])} |")
    out += ["", "Failed requests (status >= 400), whole run:", "",
            f"- ours: {fmt_calls(rust['errors'])}", f"- upstream: {fmt_calls(go['errors'])}", "",
            "`DescribeInstanceTopology` (the network-topology labels): moto itself has no such call; "
            "`bench/aws/moto_server.py` answers it as AWS does, with an empty list for t3.medium, after which both "
            "managers remember the type for 24 h and stop asking. Ours asks once per type even for a burst of new "
            "nodes (one look-up per type at a time); upstream asks for every node initialized before its first "
            "answer is remembered.", "",
            "Node labels set besides the kubelet's: ", "",
            f"- ours: {', '.join(rust['node_labels'])}", f"- upstream: {', '.join(go['node_labels'])}", ""]
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_arguments(p)
    p.add_argument("--nodes", type=int, default=20)
    p.add_argument("--services", type=int, default=100)
    p.add_argument("--churn", type=int, default=5)
    p.add_argument("--workers", type=int, default=16, help="--concurrent-node-syncs and --concurrent-service-syncs")
    p.add_argument("--idle", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--managers", default="rust,upstream")
    p.add_argument("--out", help="the report (markdown); needs both managers")
    args = p.parse_args()
    os.makedirs(args.work_dir, exist_ok=True)

    e = Environment(args.control_plane)
    counter, moto, proxy, trap_port, trap_seen, kube = e.counter, e.moto, e.proxy, e.trap_port, e.trap_seen, e.kube
    results = []
    try:
        for kind in args.managers.split(","):
            binary = {"rust": args.rust_bin, "upstream": args.go_bin}[kind]
            results.append(run_manager(kind, binary, args, moto, kube, counter, proxy, trap_port, args.work_dir))
            log(f"{kind}: done")
    finally:
        moto.stop()
    meta = json.loads(args.meta)
    meta["metadata_connections"] = len(trap_seen)
    meta["metadata_requests"] = trap_seen
    meta["flags"] = ["--kube-api-qps=200", "--kube-api-burst=400", f"--concurrent-node-syncs={args.workers}",
                     f"--concurrent-service-syncs={args.workers}"]
    with open(args.json, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1, sort_keys=True)
    if args.out and len(results) == 2:
        with open(args.out, "w") as f:
            f.write(report(results, meta))
    log(f"raw numbers in {args.json}" + (f", report in {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
