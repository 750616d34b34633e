{{/* The operator's name, labels and the namespaces it watches. */}}
{{- define "loom.operator" -}}
{{ .Release.Name }}-operator
{{- end -}}

{{- define "loom.labels" -}}
app.kubernetes.io/part-of: loom
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Must match RenderSettings.operator_labels: the NetworkPolicies admit these pods. */}}
{{- define "loom.operatorSelector" -}}
app.kubernetes.io/name: loom-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "loom.namespaces" -}}
{{- if .Values.watch.namespaces -}}
{{ toJson .Values.watch.namespaces }}
{{- else -}}
{{ toJson (list .Release.Namespace) }}
{{- end -}}
{{- end -}}

{{- define "loom.image" -}}
{{ .repository }}:{{ .tag }}
{{- end -}}
