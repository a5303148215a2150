{{- define "proflow.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "proflow.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* `.Component` (set for the Kafka consumers) or the mode. */}}
{{- define "proflow.component" -}}
{{- default .Values.mode .Component -}}
{{- end -}}

{{/* The release's full name, with `-consumer` for the Kafka consumers. */}}
{{- define "proflow.instance" -}}
{{- if .Component -}}
{{- printf "%s-%s" (include "proflow.fullname" .) .Component | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- include "proflow.fullname" . -}}
{{- end -}}
{{- end -}}

{{- define "proflow.selectorLabels" -}}
app.kubernetes.io/name: {{ include "proflow.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: {{ include "proflow.component" . }}
{{- end -}}

{{- define "proflow.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "proflow.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "proflow.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "proflow.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "proflow.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "proflow.checkMode" -}}
{{- if not (has .Values.mode (list "agent" "gateway" "scraper")) -}}
{{- fail (printf "mode must be agent, gateway or scraper, not %q" .Values.mode) -}}
{{- end -}}
{{- end -}}

{{/* The pod spec every mode shares. */}}
{{- define "proflow.podSpec" -}}
serviceAccountName: {{ include "proflow.serviceAccountName" . }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector: {{ toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity: {{ toYaml . | nindent 2 }}
{{- end }}
{{- $tolerations := .Values.tolerations }}
{{- if and (eq .Values.mode "agent") (not $tolerations) }}{{ $tolerations = .Values.agent.tolerations }}{{ end }}
{{- with $tolerations }}
tolerations: {{ toYaml . | nindent 2 }}
{{- end }}
{{- if eq .Values.mode "agent" }}
hostPID: true
{{- end }}
securityContext:
  {{- if eq .Values.mode "agent" }}
  runAsUser: 0
  runAsGroup: 0
  {{- else }}
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  {{- end }}
  {{- if eq .Values.mode "agent" }}
  seccompProfile: {{ toYaml .Values.agent.seccompProfile | nindent 4 }}
  {{- else }}
  seccompProfile: {type: RuntimeDefault}
  {{- end }}
containers:
  - name: proflow
    image: {{ include "proflow.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    args: [run, -c, /etc/proflow/config.yaml]
    env:
      - name: KUBE_NODE_NAME
        valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
      - name: POD_NAMESPACE
        valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
      # The pod an OpAMP server sees this proflow as (service.opamp).
      - name: POD_NAME
        valueFrom: {fieldRef: {fieldPath: metadata.name}}
    ports:
      - {name: telemetry, containerPort: {{ .Values.telemetryPort }}, protocol: TCP}
      {{- if and (eq .Values.mode "gateway") (not .Component) }}
      - {name: pprof, containerPort: {{ .Values.gateway.ports.pprof }}, protocol: TCP}
      - {name: otlp-grpc, containerPort: {{ .Values.gateway.ports.otlpGrpc }}, protocol: TCP}
      - {name: otlp-http, containerPort: {{ .Values.gateway.ports.otlpHttp }}, protocol: TCP}
      {{- end }}
    livenessProbe:
      httpGet: {path: /healthz, port: telemetry}
    readinessProbe:
      httpGet: {path: /readyz, port: telemetry}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
        {{- if eq .Values.mode "agent" }}
        add: [BPF, PERFMON, SYS_PTRACE]
        {{- end }}
    {{- with .Values.resources }}
    resources: {{ toYaml . | nindent 6 }}
    {{- end }}
    volumeMounts:
      - {name: config, mountPath: /etc/proflow, readOnly: true}
      - {name: data, mountPath: /var/lib/proflow}
      - {name: tmp, mountPath: /tmp}
volumes:
  - name: config
    configMap: {name: {{ include "proflow.instance" . }}}
  - name: data
    emptyDir: {}
  - name: tmp
    emptyDir: {}
{{- end -}}
