{{- define "ddp-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Cluster-scoped objects carry the namespace too, so releases in two namespaces do not collide.
Not cut to 63 characters: RBAC names may be longer, and cutting could make two names equal.
*/}}
{{- define "ddp-operator.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "ddp-operator.fullname" .) -}}
{{- end -}}

{{- define "ddp-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ddp-operator.labels" -}}
{{ include "ddp-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}
