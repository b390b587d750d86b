{{/*
Names, labels and the derived settings that several templates share.
*/}}

{{- define "meatspace.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The object name prefix. Truncated so that "<fullname>-postgresql-hl" and the
other suffixed names stay within the 63 characters of a DNS label.
*/}}
{{- define "meatspace.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "meatspace.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "meatspace.labels" -}}
helm.sh/chart: {{ include "meatspace.chart" . }}
app.kubernetes.io/name: {{ include "meatspace.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: meatspace
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
Selector labels of one component. Call with (dict "ctx" $ "component" "api-server").
*/}}
{{- define "meatspace.selectorLabels" -}}
app.kubernetes.io/name: {{ include "meatspace.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Labels of one component's objects: the common labels plus the component. */}}
{{- define "meatspace.componentLabels" -}}
{{ include "meatspace.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "meatspace.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "meatspace.apiServer.fullname" -}}
{{- printf "%s-api-server" (include "meatspace.fullname" .) }}
{{- end }}

{{- define "meatspace.controller.fullname" -}}
{{- printf "%s-controller" (include "meatspace.fullname" .) }}
{{- end }}

{{- define "meatspace.postgresql.fullname" -}}
{{- printf "%s-postgresql" (include "meatspace.fullname" .) }}
{{- end }}

{{- define "meatspace.apiServer.serviceAccountName" -}}
{{- if .Values.apiServer.serviceAccount.create }}
{{- default (include "meatspace.apiServer.fullname" .) .Values.apiServer.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.apiServer.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "meatspace.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create }}
{{- default (include "meatspace.controller.fullname" .) .Values.controller.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.controller.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding DATABASE_URL and MEATSPACE_DEV_KEY. */}}
{{- define "meatspace.secretName" -}}
{{- default (include "meatspace.fullname" .) .Values.secret.existingSecret }}
{{- end }}

{{/*
The Secret holding the first operator API key (MEATSPACE_BOOTSTRAP_OPERATOR_KEY),
or "" when the chart neither creates nor is given one.
*/}}
{{- define "meatspace.operatorKeySecretName" -}}
{{- if .Values.auth.operatorKey.existingSecret }}
{{- .Values.auth.operatorKey.existingSecret }}
{{- else if .Values.auth.operatorKey.create }}
{{- printf "%s-operator-key" (include "meatspace.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
The API server's identity settings: whether the development key is accepted,
and the first operator key, which the server stores (as a digest) at start-up
when no key with its id exists.
*/}}
{{- define "meatspace.authEnv" -}}
- name: MEATSPACE_DEV_KEY_ENABLED
  value: {{ .Values.auth.devKey.enabled | toString | quote }}
{{- with include "meatspace.operatorKeySecretName" . }}
- name: MEATSPACE_BOOTSTRAP_OPERATOR_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.auth.operatorKey.secretKey }}
{{- end }}
{{- end }}

{{/*
The API server's public URL (MEATSPACE_PUBLIC_URL): apiServer.publicUrl, else
the first Ingress host (https when a TLS entry lists it), else the in-cluster
Service. Never taken from a client's Host header.
*/}}
{{- define "meatspace.publicUrl" -}}
{{- if .Values.apiServer.publicUrl -}}
{{- .Values.apiServer.publicUrl -}}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts -}}
{{- $host := (first .Values.ingress.hosts).host -}}
{{- $scheme := "http" -}}
{{- range .Values.ingress.tls -}}
{{- if has $host (.hosts | default list) -}}
{{- $scheme = "https" -}}
{{- end -}}
{{- end -}}
{{- printf "%s://%s" $scheme $host -}}
{{- else -}}
{{- $port := int .Values.apiServer.service.port -}}
{{- printf "http://%s.%s.svc%s" (include "meatspace.apiServer.fullname" .) .Release.Namespace (ternary "" (printf ":%d" $port) (eq $port 80)) -}}
{{- end -}}
{{- end }}

{{/*
Namespace of the MeatspaceTask resources the controller mirrors into. With
requested tasks the controller may create, get and delete the Secrets there
(RBAC cannot narrow that to its own), so the mirror then defaults to a
namespace of its own, <release namespace>-tasks, and is refused in the
release namespace, which holds the credentials Secret.
*/}}
{{- define "meatspace.mirrorNamespace" -}}
{{- $requests := dig "requests" "enabled" false .Values.controller.mirror -}}
{{- $own := printf "%s-tasks" .Release.Namespace -}}
{{- $ns := .Values.controller.mirror.namespace | default (ternary $own .Release.Namespace $requests) -}}
{{- if and $requests (eq $ns .Release.Namespace) -}}
{{- fail (printf "meatspace: controller.mirror.requests.enabled lets the controller create, get and delete the Secrets of the mirror namespace; give the mirror a namespace of its own (controller.mirror.namespace, default %s), not the release namespace that holds the credentials Secret" $own) -}}
{{- end -}}
{{- $ns -}}
{{- end }}

{{/*
Whether the controller elects a leader: only the mirror needs one, so with
the mirror off the controller needs no Kubernetes API access at all.
Renders "true" or "false".
*/}}
{{- define "meatspace.leaderElection" -}}
{{- and .Values.controller.mirror.enabled .Values.controller.leaderElection.enabled | toString }}
{{- end }}

{{- define "meatspace.leaseName" -}}
{{- default (include "meatspace.controller.fullname" .) .Values.controller.leaderElection.leaseName }}
{{- end }}

{{/*
Environment variables of the task policy, shared by both binaries.
*/}}
{{- define "meatspace.policyEnv" -}}
{{- $names := dict
  "defaultLifetimeSeconds" "MEATSPACE_DEFAULT_LIFETIME_SECONDS"
  "minLifetimeSeconds" "MEATSPACE_MIN_LIFETIME_SECONDS"
  "maxLifetimeSeconds" "MEATSPACE_MAX_LIFETIME_SECONDS"
  "startTimeoutSeconds" "MEATSPACE_START_TIMEOUT_SECONDS"
  "activeTimeLimitSeconds" "MEATSPACE_ACTIVE_TIME_LIMIT_SECONDS" }}
{{- range $key, $env := $names }}
{{- $value := index $.Values.policy $key }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ $env }}
  value: {{ $value | int64 | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* DATABASE_URL from the Secret. */}}
{{- define "meatspace.databaseUrlEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "meatspace.secretName" . }}
      key: {{ .Values.secret.databaseUrlKey }}
{{- end }}

{{/*
The server secret key: seals Idempotency-Key replays (API server) and
derives the webhook signing secrets (both), so both binaries get it.
*/}}
{{- define "meatspace.secretKeyEnv" -}}
- name: MEATSPACE_SECRET_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "meatspace.secretName" . }}
      key: {{ .Values.secret.secretKeyKey }}
{{- end }}

{{/*
A checksum of what the Secret is made from, so that pods restart when the
credentials they read at start change. Generated values are kept across
upgrades, so only user-given ones need to count.
*/}}
{{- define "meatspace.secretChecksum" -}}
{{- $inputs := dict "secret" .Values.secret "postgresql" (dict "enabled" .Values.postgresql.enabled "auth" .Values.postgresql.auth) }}
{{- toJson $inputs | sha256sum }}
{{- end }}

{{/* imagePullSecrets of a pod spec, when any are set. */}}
{{- define "meatspace.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Fails the render on settings that the schema cannot express.
*/}}
{{- define "meatspace.validate" -}}
{{- if and (not .Values.postgresql.enabled) (not .Values.secret.existingSecret) (not .Values.secret.databaseUrl) }}
{{- fail "meatspace: no database. Set secret.databaseUrl (postgres://…), or secret.existingSecret, or postgresql.enabled=true for the bundled staging PostgreSQL." }}
{{- end }}
{{- end }}
