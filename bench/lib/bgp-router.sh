# Sourced by the BGP benches (bench/bgp-failover/run, bench/bgp-ecmp/run): a router of FRR's (zebra,
# bfdd, bgpd; Debian's) in a network namespace on hack/cluster's bridge, taking every node as a
# neighbour, with a client behind it, and how to read its routes. The caller defines `routers` (a
# directory for the routers' files), `pids` (an array the daemons' process IDs are added to, for the
# caller to stop) and `log`.

# A router (FRR: zebra, bfdd, bgpd) in namespace $1 at $2 on the bridge, taking every node as a
# neighbour (AS 64513, dynamic), ECMP over up to 8 paths, BFD at 300 ms x 3 with the nodes that speak
# it; and a client in namespace $3 behind it, at 10.$4.0.2 (its traffic masqueraded to the bridge).
router() {
  local ns=$1 ip=$2 client=$3 net=$4 rdir=$routers/$1
  # The daemons run as the user frr: their directory is open to it (the cluster's is not).
  mkdir -p "$rdir"; chmod 777 "$routers" "$rdir"
  ip netns add "$ns"; ip netns add "$client"
  ip link add "$ns-h" type veth peer name eth0 netns "$ns"
  ip link set "$ns-h" master ccm-br0 up
  ip -n "$ns" link add client type veth peer name eth0 netns "$client"
  local c
  for c in "ip address add $ip/24 dev eth0" "ip address add 10.$net.0.1/30 dev client" "ip link set lo up" \
    "ip link set eth0 up" "ip link set client up" "sysctl -q -w net.ipv4.ip_forward=1" \
    "sysctl -q -w net.ipv4.fib_multipath_hash_policy=1"; do
    # shellcheck disable=SC2086
    ip netns exec "$ns" $c
  done
  printf 'table inet ccm_bench_nat {\n chain post {\n  type nat hook postrouting priority 100;\n  oifname "eth0" masquerade\n }\n}\n' |
    ip netns exec "$ns" nft -f -
  for c in "ip address add 10.$net.0.2/30 dev eth0" "ip link set lo up" "ip link set eth0 up" \
    "ip route add default via 10.$net.0.1"; do
    # shellcheck disable=SC2086
    ip netns exec "$client" $c
  done
  cat >"$rdir/bgpd.conf" <<CONF
frr defaults datacenter
hostname $ns
log stdout informational
log timestamp precision 3
router bgp 64512
 bgp router-id $ip
 no bgp ebgp-requires-policy
 neighbor nodes peer-group
 neighbor nodes remote-as 64513
 neighbor nodes bfd profile nodes
 bgp listen range 10.89.0.0/24 peer-group nodes
 address-family ipv4 unicast
  maximum-paths 8
 exit-address-family
CONF
  printf 'hostname %s\nbfd\n profile nodes\n  detect-multiplier 3\n  receive-interval 300\n  transmit-interval 300\n' "$ns" >"$rdir/bfdd.conf"
  printf 'hostname %s\n' "$ns" >"$rdir/zebra.conf"
  local d extra
  for d in zebra bfdd bgpd; do
    case $d in bfdd) extra="--bfdctl $rdir/bfdd.sock" ;; bgpd) extra="-S" ;; *) extra="" ;; esac
    # shellcheck disable=SC2086
    ip netns exec "$ns" /usr/lib/frr/$d -f "$rdir/$d.conf" -i "$rdir/$d.pid" -z "$rdir/zserv.api" \
      --vty_socket "$rdir" $extra >"$rdir/$d.log" 2>&1 &
    pids+=($!)
    sleep 0.5
  done
}
hops() { # router-namespace vip: the next hops of the VIP's route, one per line
  ip netns exec "$1" ip -4 -j route show "$2/32" | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    if r.get("gateway"): print(r["gateway"])
    for h in r.get("nexthops", []): print(h["gateway"])'
}
three_hops() { # router vip: waits until the route has three next hops (up to 3 minutes)
  local _
  for _ in $(seq 900); do
    [ "$(hops "$1" "$2" | wc -l)" -eq 3 ] && return 0
    sleep 0.2
  done
  log "$2 has not three next hops at $1: $(hops "$1" "$2" | tr '\n' ' ')"
  vtysh --vty_socket "$routers/$1" -d bgpd -c 'show bgp summary' >&2 || true
  tail -n 30 "$routers/$1"/*.log >&2 || true
  return 1
}
