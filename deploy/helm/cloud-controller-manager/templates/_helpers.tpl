{{/*
The chart's logic. The objects are those of the kustomize overlays (deploy/overlays/local-agents with the
default values; deploy/overlays/local for loadBalancerMode leader with privilegedPorts, and
deploy/overlays/local-daemonset with kind DaemonSet as well), field for field, with no Helm labels or
annotations; crates/cloud-controller-manager-bin/tests/helm_chart.rs checks they are equal.
*/}}

{{/* The labels of every object the chart writes (as deploy/base/deployment.yaml). */}}
{{- define "ccm.labels" -}}
k8s-app: cloud-controller-manager
{{- end }}

{{/* The image of the manager and of the agents (one image holds both binaries). */}}
{{- define "ccm.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end }}

{{/* The cloud-config: .Values.cloudConfig, or else the overlay's file for the load-balancer mode. */}}
{{- define "ccm.cloudConfig" -}}
{{- $config := .Values.cloudConfig -}}
{{- if not $config -}}
{{- $file := ternary "files/cloud-config-agents.yaml" "files/cloud-config.yaml" (eq .Values.loadBalancerMode "agents") -}}
{{- $config = .Files.Get $file -}}
{{- if not $config }}{{ fail (printf "%s is missing or empty: in the repository it is a symbolic link to the overlay's cloud-config.yaml; set cloudConfig, or use a chart with the file (helm package follows the links)" $file) }}{{ end -}}
{{- end -}}
{{- $config -}}
{{- end }}

{{/* A file of files/ (a symbolic link into deploy/), refusing an empty one. */}}
{{- define "ccm.file" -}}
{{- $content := .root.Files.Get .name -}}
{{- if not $content }}{{ fail (printf "%s is missing or empty: in the repository it is a symbolic link into deploy/; use a chart with the file (helm package follows the links, cp -r without -L does not)" .name) }}{{ end -}}
{{- $content -}}
{{- end }}

{{/* The PodDisruptionBudget's condition: "true" for a Deployment of two replicas or more. */}}
{{- define "ccm.podDisruptionBudget" -}}
{{- if eq .Values.kind "Deployment" -}}
{{- $replicas := 2 -}}
{{- if not (kindIs "invalid" .Values.replicas) }}{{ $replicas = int .Values.replicas }}{{ end -}}
{{- if ge $replicas 2 }}true{{ end -}}
{{- end -}}
{{- end }}

{{/*
The value of a flag in a list of arguments (`--flag=value`, or `--flag value` as two items), "" without
it. Called with (dict "args" LIST "flag" "--flag").
*/}}
{{- define "ccm.flagValue" -}}
{{- $flag := .flag -}}
{{- $value := "" -}}
{{- $next := false -}}
{{- range .args -}}
{{- $arg := toString . -}}
{{- if $next }}{{ $value = $arg }}{{ $next = false }}
{{- else if eq $arg $flag }}{{ $next = true }}
{{- else if hasPrefix (printf "%s=" $flag) $arg }}{{ $value = trimPrefix (printf "%s=" $flag) $arg }}
{{- end -}}
{{- end -}}
{{- $value -}}
{{- end }}

{{/* "true" when the kind's --use-service-account-credentials is on (null: on for a DaemonSet only). */}}
{{- define "ccm.useServiceAccountCredentials" -}}
{{- $v := .Values.useServiceAccountCredentials -}}
{{- if kindIs "invalid" $v }}{{ $v = eq .Values.kind "DaemonSet" }}{{ end -}}
{{- if $v }}true{{ end -}}
{{- end }}

{{/* "true" when --allocate-node-cidrs is on (null: on for a DaemonSet only). */}}
{{- define "ccm.allocateNodeCIDRs" -}}
{{- $v := .Values.allocateNodeCIDRs -}}
{{- if kindIs "invalid" $v }}{{ $v = eq .Values.kind "DaemonSet" }}{{ end -}}
{{- if $v }}true{{ end -}}
{{- end }}

{{/*
Refuses what the chart would otherwise have to ignore or get wrong: an unknown kind or mode, a value that
does not apply to the kind or the mode, a cloud-config whose mode is not the chart's, a capability no
workload needs, and arguments that set a flag a value or the chart owns. values.schema.json refuses unknown
keys and wrong types before this runs (and this repeats its kind, mode and capability checks for
--skip-schema-validation).
*/}}
{{- define "ccm.validate" -}}
{{- $kind := .Values.kind -}}
{{- if not (has $kind (list "Deployment" "DaemonSet")) -}}
{{- fail (printf "kind must be Deployment or DaemonSet, not %v" $kind) -}}
{{- end -}}
{{- $mode := .Values.loadBalancerMode -}}
{{- if not (has $mode (list "agents" "leader")) -}}
{{- fail (printf "loadBalancerMode must be agents (the node agents announce and serve the VIPs) or leader (the leading manager does), not %v" $mode) -}}
{{- end -}}
{{- /* The cloud-config's loadBalancer.mode (the provider's default: leader) is what the manager and the agents run. */ -}}
{{- $config := fromYaml (include "ccm.cloudConfig" .) -}}
{{- if hasKey $config "Error" -}}
{{- fail (printf "cloudConfig is not a YAML map, as the local provider's cloud-config is: %v" (get $config "Error")) -}}
{{- end -}}
{{- $configMode := "leader" -}}
{{- $loadBalancer := get $config "loadBalancer" -}}
{{- if kindIs "map" $loadBalancer }}{{ $configMode = get $loadBalancer "mode" | default "leader" | toString }}{{ end -}}
{{- if ne $configMode $mode -}}
{{- fail (printf "loadBalancerMode is %s but the cloud-config's loadBalancer.mode is %s%s: the manager and the agents run the cloud-config's mode, so the chart's must be the same; set loadBalancerMode=%s, or put `loadBalancer: {mode: %s}` in cloudConfig" $mode $configMode (ternary " (its default: the file sets no mode)" "" (not (and (kindIs "map" $loadBalancer) (hasKey $loadBalancer "mode")))) $configMode $mode) -}}
{{- end -}}
{{- if and (eq $mode "agents") (kindIs "map" $loadBalancer) (hasKey $loadBalancer "agentNamespace") (ne (toString (get $loadBalancer "agentNamespace")) "kube-system") -}}
{{- fail (printf "the cloud-config's loadBalancer.agentNamespace is %v, but the chart runs the agents in kube-system (their heartbeat Leases, the manager's Role to read them and the admission policy local-agent-own-heartbeat are there): remove agentNamespace, or set it to kube-system" (get $loadBalancer "agentNamespace")) -}}
{{- end -}}
{{- if .Values.monitoring.serviceMonitor.agents -}}
{{- if not .Values.monitoring.serviceMonitor.enabled -}}
{{- fail "monitoring.serviceMonitor.agents needs monitoring.serviceMonitor.enabled" -}}
{{- end -}}
{{- if ne $mode "agents" -}}
{{- fail "monitoring.serviceMonitor.agents applies to loadBalancerMode agents only: in leader mode the data plane's metrics are the manager's" -}}
{{- end -}}
{{- $bind := .Values.agents.metricsBindAddress | default "" -}}
{{- if or (eq $bind "") (hasPrefix "127." $bind) (hasPrefix "[::1]" $bind) (hasPrefix "localhost" $bind) -}}
{{- fail (printf "monitoring.serviceMonitor.agents: the agents serve /metrics on %s, which Prometheus cannot reach; set agents.metricsBindAddress (e.g. 0.0.0.0:10264: plain HTTP, readable by anyone who reaches the nodes)" (ternary "their node's loopback (127.0.0.1:10264)" $bind (eq $bind ""))) -}}
{{- end -}}
{{- end -}}
{{- if and (eq $kind "DaemonSet") (not (kindIs "invalid" .Values.replicas)) -}}
{{- fail (printf "replicas (%v) applies to kind Deployment only: a DaemonSet runs one pod on each node its nodeSelector and tolerations admit; unset replicas or set kind=Deployment" .Values.replicas) -}}
{{- end -}}
{{- $add := .Values.capabilities.add | default list -}}
{{- range $add -}}
{{- if not (has . (list "NET_ADMIN" "NET_RAW" "NET_BIND_SERVICE")) -}}
{{- fail (printf "capabilities.add: %v is not one the manager needs: NET_BIND_SERVICE binds ports below 1024 (privilegedPorts), NET_ADMIN and NET_RAW put VIPs on an interface and announce them; nothing else is accepted" .) -}}
{{- end -}}
{{- end -}}
{{- if eq $mode "agents" -}}
{{- if .Values.privilegedPorts -}}
{{- fail "privilegedPorts applies to loadBalancerMode=leader only: in agents mode the node agents bind the Services' ports (with NET_BIND_SERVICE) and the manager binds none, so it runs as the non-root user 65532 with no capability; unset privilegedPorts, or set loadBalancerMode=leader" -}}
{{- end -}}
{{- if $add -}}
{{- fail (printf "capabilities.add (%s) applies to loadBalancerMode=leader only: in agents mode the node agents put the VIPs on their interface and announce them (they have NET_ADMIN and NET_RAW) and the manager needs no capability; unset capabilities.add, or set loadBalancerMode=leader" (join ", " $add)) -}}
{{- end -}}
{{- else -}}
{{- if .Values.agents.args -}}
{{- fail (printf "agents.args (%s) applies to loadBalancerMode=agents only: in leader mode no node agent runs; unset agents.args, or set loadBalancerMode=agents" (join ", " .Values.agents.args)) -}}
{{- end -}}
{{- if .Values.agents.metricsBindAddress -}}
{{- fail (printf "agents.metricsBindAddress (%s) applies to loadBalancerMode=agents only: in leader mode no node agent runs, and the data plane's metrics are the manager's; unset agents.metricsBindAddress, or set loadBalancerMode=agents" .Values.agents.metricsBindAddress) -}}
{{- end -}}
{{- if and $add (not .Values.privilegedPorts) -}}
{{- fail (printf "capabilities.add (%s) needs privilegedPorts=true: with privilegedPorts=false the manager runs as the non-root user 65532, whose added capabilities the kernel clears at execve (deploy/overlays/local/privileged-ports.yaml explains why)" (join ", " $add)) -}}
{{- end -}}
{{- end -}}
{{- if and (include "ccm.allocateNodeCIDRs" .) (not .Values.clusterCIDR) -}}
{{- fail "allocateNodeCIDRs needs clusterCIDR: the nodes' pod CIDRs are allocated from it (set clusterCIDR, or allocateNodeCIDRs=false)" -}}
{{- end -}}
{{- $owned := dict "--cloud-provider" "this chart runs the `local` provider only (for another, use a kustomize overlay: docs/deploy.md)" "--cloud-config" "set the value cloudConfig (the file's content) instead" "--cluster-cidr" "set the value clusterCIDR instead" "--use-service-account-credentials" "set the value useServiceAccountCredentials instead" "--allocate-node-cidrs" "set the value allocateNodeCIDRs instead" -}}
{{- range .Values.args -}}
{{- $flag := regexReplaceAll "=.*" (toString .) "" -}}
{{- if hasKey $owned $flag -}}
{{- fail (printf "args: %s sets a flag the chart owns: %s" . (get $owned $flag)) -}}
{{- end -}}
{{- end -}}
{{- $agentOwned := dict "--cloud-config" "the agents read the manager's cloud-config (set the value cloudConfig)" "--membership-key-file" "the agents read the Secret kube-system/local-agent-membership, which the DaemonSet mounts there" "--handover-socket" "a rolling update hands over through the socket in the hostPath directory /run/local-agent, which the DaemonSet mounts there" "--node-name" "each agent takes its node's name from NODE_NAME, which the DaemonSet sets from spec.nodeName; one name for all would make every agent claim the same node" "--namespace" "the agents' heartbeat Leases are in kube-system, where the chart puts them (POD_NAMESPACE), the manager reads them and the admission policy local-agent-own-heartbeat expects them" -}}
{{- if .Values.agents.metricsBindAddress -}}
{{- $_ := set $agentOwned "--metrics-bind-address" "the value agents.metricsBindAddress sets it" -}}
{{- end -}}
{{- range .Values.agents.args -}}
{{- $flag := regexReplaceAll "=.*" (toString .) "" -}}
{{- if hasKey $agentOwned $flag -}}
{{- fail (printf "agents.args: %s sets a flag the chart owns: %s" . (get $agentOwned $flag)) -}}
{{- end -}}
{{- end -}}
{{- if eq $mode "agents" -}}
{{- $managerClass := include "ccm.flagValue" (dict "args" .Values.args "flag" "--load-balancer-class") -}}
{{- $agentClass := include "ccm.flagValue" (dict "args" .Values.agents.args "flag" "--load-balancer-class") -}}
{{- if ne $managerClass $agentClass -}}
{{- fail (printf "the manager's --load-balancer-class (%s, in args) and the agents' (%s, in agents.args) differ: the agents would serve other Services than those the manager gives VIPs; give both the same class" ($managerClass | default "none") ($agentClass | default "none")) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The container's arguments, in the overlays' order, then .Values.args. */}}
{{- define "ccm.args" -}}
{{- $args := list "--cloud-provider=local" "--leader-elect=true" "--secure-port=10258" -}}
{{- with .Values.clusterCIDR }}{{ $args = append $args (printf "--cluster-cidr=%s" .) }}{{ end -}}
{{- if include "ccm.useServiceAccountCredentials" . }}{{ $args = append $args "--use-service-account-credentials=true" }}{{ end -}}
{{- if include "ccm.allocateNodeCIDRs" . }}{{ $args = append $args "--allocate-node-cidrs=true" }}{{ end -}}
{{- $args = append $args "--cloud-config=/etc/cloud/cloud-config" -}}
{{- range .Values.args }}{{ $args = append $args (toString .) }}{{ end -}}
{{- toYaml $args -}}
{{- end }}

{{/*
The pod template of both kinds (deploy/base/deployment.yaml with deploy/components/cloud-config and the
local overlay's privileged-ports.yaml; deploy/components/daemonset/daemonset.yaml is the same pod). The
kinds differ only where the overlays do: the Deployment's pod anti-affinity (a DaemonSet places one pod
per node by itself), and the defaults of useServiceAccountCredentials and allocateNodeCIDRs.
*/}}
{{- define "ccm.podTemplate" -}}
metadata:
  labels:
    {{- include "ccm.labels" . | nindent 4 }}
spec:
  serviceAccountName: cloud-controller-manager
  {{- with .Values.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  # A leader that stops in leader mode with VIPs on an interface (the `local` cloud) serves them until
  # the next leader claims them (up to 10 s), then lets the connections open through it finish
  # within loadBalancer.drainTimeout (30 s by default): keep this above the sum.
  terminationGracePeriodSeconds: 45
  hostNetwork: true
  dnsPolicy: ClusterFirstWithHostNet
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if eq .Values.kind "Deployment" }}
  affinity:
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        - topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "ccm.labels" . | nindent 14 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  containers:
    - name: cloud-controller-manager
      image: {{ include "ccm.image" . | quote }}
      {{- with .Values.image.pullPolicy }}
      imagePullPolicy: {{ . }}
      {{- end }}
      args:
        {{- include "ccm.args" . | nindent 8 }}
      ports:
        - name: https
          containerPort: 10258
      livenessProbe:
        httpGet:
          scheme: HTTPS
          host: 127.0.0.1
          path: /healthz
          port: 10258
        initialDelaySeconds: 15
        timeoutSeconds: 15
      # Probed every 2 s (a local HTTPS GET of a static answer): the kubelet's first probe often
      # comes before the server listens, and on a loaded machine a start can miss several: each miss
      # delays the rollout by a whole period (10 s before).
      readinessProbe:
        httpGet:
          scheme: HTTPS
          host: 127.0.0.1
          path: /readyz
          port: 10258
        periodSeconds: 2
        timeoutSeconds: 5
      {{- with .Values.resources }}
      resources:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- if .Values.privilegedPorts }}
        # UID 0 with NET_BIND_SERVICE alone (deploy/overlays/local/privileged-ports.yaml).
        runAsUser: 0
        runAsNonRoot: false
        {{- else }}
        runAsNonRoot: true
        {{- end }}
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          {{- $add := .Values.capabilities.add -}}
          {{- if .Values.privilegedPorts }}{{ $add = prepend $add "NET_BIND_SERVICE" | uniq }}{{ end }}
          {{- with $add }}
          add:
            {{- toYaml . | nindent 12 }}
          {{- end }}
          drop: [ALL]
      volumeMounts:
        # The whole volume, not a subPath: the kubelet updates only whole-volume mounts.
        - name: cloud-config
          mountPath: /etc/cloud
          readOnly: true
  volumes:
    - name: cloud-config
      configMap:
        name: cloud-config
{{- end }}

{{/*
The agents' DaemonSet: the component's (deploy/components/local-agents/agents.yaml, parsed), with the
image and its pull policy from image.*, agents.args after its own arguments, and agents.resources.
Called with (dict "root" $ "daemonSet" OBJECT).
*/}}
{{- define "ccm.agentDaemonSet" -}}
{{- $root := .root -}}
{{- $daemonSet := .daemonSet -}}
{{- $containers := $daemonSet.spec.template.spec.containers -}}
{{- $container := index $containers 0 -}}
{{- if or (ne (len $containers) 1) (ne $container.name "local-agent") -}}
{{- fail "files/local-agents.yaml: the DaemonSet must have one container, local-agent (the chart sets its image, arguments and resources)" -}}
{{- end -}}
{{- $_ := set $container "image" (include "ccm.image" $root) -}}
{{- with $root.Values.image.pullPolicy }}{{ $_ := set $container "imagePullPolicy" . }}{{ end -}}
{{- $args := $container.args | default list -}}
{{- with $root.Values.agents.metricsBindAddress }}{{ $args = append $args (printf "--metrics-bind-address=%s" .) }}{{ end -}}
{{- range $root.Values.agents.args }}{{ $args = append $args (toString .) }}{{ end -}}
{{- $_ := set $container "args" $args -}}
{{- if $root.Values.agents.resources }}{{ $_ := set $container "resources" $root.Values.agents.resources }}{{ else }}{{ $_ := unset $container "resources" }}{{ end -}}
{{- toYaml $daemonSet -}}
{{- end }}
