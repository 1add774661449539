{{/* Names: the release's prefix, capped for DNS labels. */}}
{{- define "warmstart.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "warmstart.name" -}}
{{- printf "%s-%s" (include "warmstart.fullname" .root) .role -}}
{{- end -}}

{{- define "warmstart.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Labels of one role; its selector is the instance and the component. */}}
{{- define "warmstart.roleLabels" -}}
{{ include "warmstart.labels" .root }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "warmstart.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .role }}
{{- end -}}

{{- define "warmstart.image" -}}
{{- if .Values.image.ref -}}
{{- .Values.image.ref -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The username of a role's ServiceAccount, as the API server sees it. */}}
{{- define "warmstart.saUser" -}}
{{- printf "system:serviceaccount:%s:%s" .root.Release.Namespace (include "warmstart.name" .) -}}
{{- end -}}

{{/* Env every role gets: its namespace is the system namespace, and the operator's extras. */}}
{{- define "warmstart.env" -}}
- name: WARMSTART_NAMESPACE
  valueFrom: { fieldRef: { fieldPath: metadata.namespace } }
- name: WARMSTART_LOG_FORMAT
  value: json
- name: LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
A container that runs as a non-root user on a read-only root file system, with no capability.
*/}}
{{- define "warmstart.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities: { drop: [ALL] }
seccompProfile: { type: RuntimeDefault }
{{- end -}}

{{/* Pod-level settings shared by the Deployments. */}}
{{- define "warmstart.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile: { type: RuntimeDefault }
{{- end -}}

{{/* The control plane's URL for the cluster agent. */}}
{{- define "warmstart.controlPlaneUrl" -}}
{{- if .Values.clusterAgent.controlPlaneUrl -}}
{{- .Values.clusterAgent.controlPlaneUrl -}}
{{- else if .Values.controlPlane.enabled -}}
{{- printf "http://%s.%s.svc:%v" (include "warmstart.name" (dict "root" . "role" "control-plane")) .Release.Namespace .Values.controlPlane.port -}}
{{- else -}}
{{- fail "clusterAgent.enabled needs clusterAgent.controlPlaneUrl (or controlPlane.enabled)" -}}
{{- end -}}
{{- end -}}

{{/* A Secret value kept across upgrades: the live object's, else a fresh random one. */}}
{{- define "warmstart.keptRandom" -}}
{{- $s := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if and $s (index ($s.data | default dict) .key) -}}
{{- index $s.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum 40 -}}
{{- end -}}
{{- end -}}

{{/* A duration (90s, 5m, 1h) in seconds. */}}
{{- define "warmstart.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "h" $d -}}{{ mul (trimSuffix "h" $d | int) 3600 }}
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | int) 60 }}
{{- else -}}{{ trimSuffix "s" $d | int }}
{{- end -}}
{{- end -}}

{{/* A binding of the role of the same name to its ServiceAccount (kind: Role or ClusterRole). */}}
{{- define "warmstart.bind" -}}
{{- $name := include "warmstart.name" (dict "root" .root "role" .role) }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}Binding
metadata:
  name: {{ $name }}
  {{- if eq .kind "Role" }}
  namespace: {{ .namespace }}
  {{- end }}
  labels: {{- include "warmstart.roleLabels" . | nindent 4 }}
roleRef: { apiGroup: rbac.authorization.k8s.io, kind: {{ .kind }}, name: {{ $name }} }
subjects:
  - kind: ServiceAccount
    name: {{ $name }}
    namespace: {{ .root.Release.Namespace }}
{{- end }}
