{{- define "registry.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "registry.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "registry.labels" -}}
app.kubernetes.io/name: {{ include "registry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "registry.selector" -}}
app.kubernetes.io/name: {{ include "registry.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* the Secret holding the token (key: token) */}}
{{- define "registry.tokenSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-token" (include "registry.fullname" .)) -}}
{{- end -}}

{{/* the Secret whose keys are the store's environment (AWS_*) and REGISTRY_DB */}}
{{- define "registry.storeSecret" -}}
{{- .Values.store.existingSecret | default (printf "%s-store" (include "registry.fullname" .)) -}}
{{- end -}}

{{- define "registry.trustConfigMap" -}}
{{- .Values.trust.existingConfigMap | default (printf "%s-trust" (include "registry.fullname" .)) -}}
{{- end -}}

{{- define "registry.hasTrust" -}}
{{- if or .Values.trust.keys .Values.trust.existingConfigMap -}}true{{- end -}}
{{- end -}}
