{{/*
The chart's logic. The objects are those of the kustomize overlays (deploy/overlays/local for
kind: Deployment, deploy/overlays/local-daemonset for kind: DaemonSet), field for field, with no Helm
labels or annotations; crates/cloud-controller-manager-bin/tests/helm_chart.rs checks they are equal.
*/}}

{{/* The labels of every object the chart writes (as deploy/base/deployment.yaml). */}}
{{- define "ccm.labels" -}}
k8s-app: cloud-controller-manager
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
Refuses what the chart would otherwise have to ignore or get wrong: an unknown kind, a value that does
not apply to the kind, and arguments that set a flag a value owns. values.schema.json refuses unknown keys
and wrong types before this runs (and this repeats its kind check for --skip-schema-validation).
*/}}
{{- define "ccm.validate" -}}
{{- $kind := .Values.kind -}}
{{- if not (has $kind (list "Deployment" "DaemonSet")) -}}
{{- fail (printf "kind must be Deployment or DaemonSet, not %v" $kind) -}}
{{- end -}}
{{- if and (eq $kind "DaemonSet") (not (kindIs "invalid" .Values.replicas)) -}}
{{- fail (printf "replicas (%v) applies to kind Deployment only: a DaemonSet runs one pod on each node its nodeSelector and tolerations admit; unset replicas or set kind=Deployment" .Values.replicas) -}}
{{- end -}}
{{- if and .Values.capabilities.add (not .Values.privilegedPorts) -}}
{{- fail (printf "capabilities.add (%v) needs privilegedPorts=true: with privilegedPorts=false the manager runs as the non-root user 65532, whose added capabilities the kernel clears at execve (deploy/overlays/local/privileged-ports.yaml explains why)" (join ", " .Values.capabilities.add)) -}}
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
      image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
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
      readinessProbe:
        httpGet:
          scheme: HTTPS
          host: 127.0.0.1
          path: /readyz
          port: 10258
        periodSeconds: 10
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
