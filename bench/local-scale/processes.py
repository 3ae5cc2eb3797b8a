#!/usr/bin/env python3
"""The resident memory (MiB) and CPU time (s) of the load balancers' processes on this machine, one
line each: `name node pid rss_mib cpu_s`. A process's node is the hack/cluster node whose cgroup holds it.
Names: our manager (cloud-controlle, the kernel's 15 characters of cloud-controller-manager), our node
agents (local-agent), MetalLB's controller and speakers (controller, speaker).

  processes.py
"""
import os
import re

NAMES = {"cloud-controlle": "manager", "local-agent": "agent", "controller": "metallb-controller",
         "speaker": "metallb-speaker"}
TICKS = os.sysconf("SC_CLK_TCK")

for pid in sorted((p for p in os.listdir("/proc") if p.isdigit()), key=int):
    try:
        comm = open(f"/proc/{pid}/comm").read().strip()
        if comm not in NAMES:
            continue
        node = re.search(r"ccm-node-\d+", open(f"/proc/{pid}/cgroup").read())
        if not node:
            continue
        rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
        # utime and stime: the 14th and 15th fields, counted after the command's closing parenthesis.
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, StopIteration):
        continue
    print(NAMES[comm], node.group(0), pid, f"{rss / 1024:.1f}", f"{cpu:.2f}")
