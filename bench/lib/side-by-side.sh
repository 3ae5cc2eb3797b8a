# Sourced by bench/local-failover/run and bench/local-outage/run: one hack/cluster of 3 nodes with the
# `local` cloud's node agents (the image hack/image builds) and MetalLB v0.15.3 in layer 2 (memberlist
# on) side by side, each serving one Service in front of the same 3 echo pods (one per node), and a
# client in a network namespace of its own on the bridge. Everything it creates is removed on exit.
#
# The caller sets: NAME (for logs), CLIENT_NS, CLIENT_IP, AGENT_ARGS (extra flags of the agents, may be
# empty), MODE (`agents`, the default: the node agents serve; `leader`: the manager's Deployment serves
# from the leader's node, `hack/cluster manager` without --agents), and sources this from the
# repository's root. It defines: dir (the cluster's directory), log,
# now, elapsed, in_client, vip_of SERVICE, answers VIP, settled VIP, node_ready NODE, ours_vip and
# metallb_vip.
work=$(mktemp -d "${TMPDIR:-/tmp}/ccm-$NAME.XXXXXX")
dir=$work/cluster
log() { echo "bench/$NAME: $*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

hack/cluster build >/dev/null &
go_build=$!
hack/image >/dev/null
wait "$go_build"
finish() {
  local status=$?
  trap - EXIT
  # A caller's hook first (e.g. resuming an API server it froze).
  declare -F on_finish >/dev/null && on_finish
  ip netns del "$CLIENT_NS" 2>/dev/null || true
  ip link del "${CLIENT_NS:0:9}-c" 2>/dev/null || true
  hack/cluster down --dir "$dir" >/dev/null 2>&1 || status=1
  rm -rf "$work"
  exit "$status"
}
trap finish EXIT
hack/cluster up --dir "$dir" --nodes 3 >/dev/null
export KUBECONFIG=$dir/admin.kubeconfig
image=$(hack/cluster image --dir "$dir" target/image/cloud-controller-manager.tar)
case ${MODE:=agents} in
  agents) hack/cluster manager --dir "$dir" --agents --image "$image" >/dev/null ;;
  leader) hack/cluster manager --dir "$dir" --image "$image" >/dev/null ;;
  *) log "MODE must be agents or leader, not $MODE"; exit 2 ;;
esac
if [ -n "$AGENT_ARGS" ] && [ "$MODE" = agents ]; then
  for arg in $AGENT_ARGS; do
    kubectl -n kube-system patch daemonset local-agent --type=json \
      -p "[{\"op\": \"add\", \"path\": \"/spec/template/spec/containers/0/args/-\", \"value\": \"$arg\"}]" >/dev/null
  done
  kubectl -n kube-system rollout status daemonset/local-agent --timeout=120s >/dev/null
fi
hack/cluster metallb --dir "$dir" >/dev/null

# The client: another machine on the nodes' network.
ip netns add "$CLIENT_NS"
ip link add "${CLIENT_NS:0:9}-c" type veth peer name eth0 netns "$CLIENT_NS"
ip link set "${CLIENT_NS:0:9}-c" master ccm-br0 up
ip netns exec "$CLIENT_NS" ip address add "$CLIENT_IP/24" dev eth0
ip netns exec "$CLIENT_NS" ip link set eth0 up
in_client() { ip netns exec "$CLIENT_NS" "$@"; }

kubectl create namespace side-by-side >/dev/null
kubectl -n side-by-side apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 3
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: echo}}}]
      terminationGracePeriodSeconds: 1
      containers:
      - name: echo
        image: ccm-rs/echo:test
        imagePullPolicy: Never
        env: [{name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: ours}
spec:
  type: LoadBalancer
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: metallb}
spec:
  type: LoadBalancer
  loadBalancerClass: metallb
  selector: {app: echo}
  ports: [{port: 80, targetPort: 8080}]
YAML
kubectl -n side-by-side rollout status deployment/echo --timeout=120s >/dev/null

vip_of() { # service
  local ip i
  for i in $(seq 300); do
    ip=$(kubectl -n side-by-side get service "$1" -o jsonpath='{.status.loadBalancer.ingress[0].ip}')
    [ -n "$ip" ] && { echo "$ip"; return; }
    sleep 0.2
  done
  log "Service $1 got no VIP"; exit 1
}
answers() { in_client curl -s --max-time 0.5 -o /dev/null "http://$1/"; }
settled() { # vip: answers 10 times in a row
  local vip=$1 i ok=0
  for i in $(seq 600); do
    if answers "$vip"; then ok=$((ok + 1)); [ $ok -ge 10 ] && return 0; else ok=0; fi
    sleep 0.2
  done
  log "$vip does not answer"; return 1
}
node_ready() {
  local i
  for i in $(seq 600); do
    [ "$(kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ] && return 0
    sleep 0.2
  done
  log "$1 did not come back Ready"; return 1
}

ours_vip=$(vip_of ours)
metallb_vip=$(vip_of metallb)
log "VIPs: ours $ours_vip, metallb $metallb_vip"
settled "$ours_vip"
settled "$metallb_vip"
