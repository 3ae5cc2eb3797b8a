#!/usr/bin/env python3
"""moto_server with one gap closed, for bench/aws (both managers run against it alike).

A Classic ELB that real AWS creates always has a health check (target `TCP:<first instance port>`,
interval 30 s, timeout 5 s, unhealthy 2, healthy 10), and DescribeLoadBalancers always returns it.
moto 5.2 returns none until ConfigureHealthCheck is called, and upstream cloud-provider-aws v1.37.0
dereferences it (`ensureLoadBalancerHealthCheck`: `loadBalancer.HealthCheck.Target`) and crashes with a
nil-pointer panic. This wrapper gives moto's new Classic ELBs AWS's default health check, then runs
moto's own server main with the same arguments (`-H`, `-p`).
"""

import sys

from moto.elb import models
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

if __name__ == "__main__":
    main(sys.argv[1:])
