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

{{- /* The operator's image, which relay pods run too unless relay.image is set: by digest when
one is given (the tag is then left out: the digest alone names the bytes). */}}
{{- define "hoplink.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- /* Whether the image's repository names its registry: a first path component with a dot or
a port, or localhost (the rule container runtimes apply before they default to Docker Hub). */}}
{{- define "hoplink.imageQualified" -}}
{{- $first := first (splitList "/" .Values.image.repository) -}}
{{- if and (gt (len (splitList "/" .Values.image.repository)) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}true{{- end -}}
{{- end -}}

{{- define "hoplink.webhookService" -}}
{{- printf "%s-webhook" (include "hoplink.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
