{{/* Names and labels shared by the chart's objects. */}}
{{- define "hoplink.fullname" -}}
{{- if contains "hoplink" .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-hoplink" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "hoplink.operatorName" -}}
{{- printf "%s-operator" (include "hoplink.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hoplink.labels" -}}
app.kubernetes.io/name: hoplink
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "hoplink.operatorSelector" -}}
app.kubernetes.io/name: hoplink
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "hoplink.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "hoplink.webhookService" -}}
{{- printf "%s-webhook" (include "hoplink.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
