{{/* Names, labels and the pieces every diskpipe pod shares. */}}

{{- define "diskpipe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* fullname prefixes every namespaced object of the release. */}}
{{- define "diskpipe.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains (include "diskpipe.name" .) .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "diskpipe.name" .) | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "diskpipe.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "diskpipe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* selector: the labels that pick one component's pods; call with (list $ "component"). */}}
{{- define "diskpipe.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "diskpipe.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "diskpipe.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Restricted Pod Security: the pod's and the container's security contexts. */}}
{{- define "diskpipe.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "diskpipe.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* scheduling: nodeSelector, tolerations, affinity and priority of a component's values. */}}
{{- define "diskpipe.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{- define "diskpipe.serviceAccountName" -}}
{{- printf "%s-%s" (include "diskpipe.fullname" (index . 0)) (index . 1) -}}
{{- end -}}

{{/* objectStore.endpoint: the URL the manager and the upload proxy reach the store at. */}}
{{- define "diskpipe.objectStore.endpoint" -}}
{{- if .Values.objectStore.external.endpoint -}}
{{- .Values.objectStore.external.endpoint -}}
{{- else -}}
{{- printf "http://%s-objectstore.%s.svc:%d" (include "diskpipe.fullname" .) .Release.Namespace (int .Values.objectStore.bundled.port) -}}
{{- end -}}
{{- end -}}

{{/* objectStore.secret: the Secret with accessKeyId and secretAccessKey. */}}
{{- define "diskpipe.objectStore.secret" -}}
{{- if .Values.objectStore.external.endpoint -}}
{{- required "objectStore.external.credentialsSecret is required with objectStore.external.endpoint" .Values.objectStore.external.credentialsSecret -}}
{{- else -}}
{{- printf "%s-objectstore" (include "diskpipe.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* objectStore.args: the flags with which the manager and the upload proxy reach the store. */}}
{{- define "diskpipe.objectStore.args" -}}
- --objectstore-endpoint={{ include "diskpipe.objectStore.endpoint" . }}
- --objectstore-credentials-dir=/var/run/diskpipe/objectstore
{{- with .Values.objectStore.external }}
{{- if .endpoint }}
- --objectstore-region={{ .region }}
- --objectstore-bucket-lookup={{ .bucketLookup }}
{{- if .caConfigMap }}
- --objectstore-ca-file=/var/run/diskpipe/objectstore-ca/ca.crt
{{- end }}
{{- if .singleTenant }}
- --objectstore-single-tenant
{{- end }}
{{- else }}
- --objectstore-region={{ $.Values.objectStore.bundled.region }}
- --objectstore-bucket-lookup=Path
- --objectstore-scoped-credentials
{{- end }}
{{- end }}
{{- end -}}

{{/* objectStore.publicEndpoint: the bundled store's URL outside the cluster, or "". */}}
{{- define "diskpipe.objectStore.publicEndpoint" -}}
{{- with .Values.objectStore.bundled -}}
{{- if .publicEndpoint -}}
{{- .publicEndpoint -}}
{{- else if .ingress.enabled -}}
{{- printf "%s://%s" (ternary "https" "http" (not (empty .ingress.tlsSecretName))) .ingress.host -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "diskpipe.objectStore.volumeMounts" -}}
- name: objectstore-credentials
  mountPath: /var/run/diskpipe/objectstore
  readOnly: true
{{- if and .Values.objectStore.external.endpoint .Values.objectStore.external.caConfigMap }}
- name: objectstore-ca
  mountPath: /var/run/diskpipe/objectstore-ca
  readOnly: true
{{- end }}
{{- end -}}

{{- define "diskpipe.objectStore.volumes" -}}
- name: objectstore-credentials
  secret:
    secretName: {{ include "diskpipe.objectStore.secret" . }}
{{- if and .Values.objectStore.external.endpoint .Values.objectStore.external.caConfigMap }}
- name: objectstore-ca
  configMap:
    name: {{ .Values.objectStore.external.caConfigMap }}
{{- end }}
{{- end -}}

{{/* webhookName: the ValidatingWebhookConfiguration, cluster-scoped, one per release. */}}
{{- define "diskpipe.webhookName" -}}
{{- include "diskpipe.fullname" . -}}
{{- end -}}

{{/* The upload proxy's URL outside the cluster: uploadProxy.url, or its ingress's host. */}}
{{- define "diskpipe.uploadProxy.url" -}}
{{- $values := .Values.uploadProxy -}}
{{- if $values.url -}}
{{ $values.url }}
{{- else if and $values.ingress.enabled $values.ingress.host -}}
{{ ternary "https" "http" (not (empty $values.ingress.tlsSecretName)) }}://{{ $values.ingress.host }}
{{- end -}}
{{- end }}

{{/*
The Secret (tls.crt, tls.key) the upload proxy serves HTTPS with: the user's, or the one
diskpipe issues (the manager, or cert-manager); empty serves plain HTTP.
*/}}
{{- define "diskpipe.uploadProxy.tlsSecret" -}}
{{- $tls := .Values.uploadProxy.tls -}}
{{- if $tls.secretName -}}
{{ $tls.secretName }}
{{- else if $tls.issued -}}
{{- if not .Values.webhook.enabled -}}
{{- fail "uploadProxy.tls.issued needs webhook.enabled: the manager (or cert-manager) issues the proxy's certificate beside the webhooks'; set uploadProxy.tls.secretName, or uploadProxy.tls.issued=false for plain HTTP" -}}
{{- end -}}
{{ include "diskpipe.fullname" . }}-uploadproxy-tls
{{- end -}}
{{- end }}

{{/*
The Secret (tls.crt, tls.key) the console's gateway serves HTTPS with: the user's, or the one
diskpipe issues (the manager, or cert-manager); empty serves plain HTTP.
*/}}
{{- define "diskpipe.gateway.tlsSecret" -}}
{{- $tls := .Values.gateway.tls -}}
{{- if $tls.secretName -}}
{{ $tls.secretName }}
{{- else if $tls.issued -}}
{{- if not .Values.webhook.enabled -}}
{{- fail "gateway.tls.issued needs webhook.enabled: the manager (or cert-manager) issues the gateway's certificate beside the webhooks'; set gateway.tls.secretName, or gateway.tls.issued=false for plain HTTP" -}}
{{- end -}}
{{ include "diskpipe.fullname" . }}-gateway-tls
{{- end -}}
{{- end }}

{{/* The upload proxy's scheme: https or http. */}}
{{- define "diskpipe.uploadProxy.scheme" -}}
{{ ternary "https" "http" (not (empty (include "diskpipe.uploadProxy.tlsSecret" .))) }}
{{- end }}

{{/* Upload tokens are issued when the webhooks and the upload proxy both run. */}}
{{- define "diskpipe.uploadTokens" -}}
{{- if and .Values.webhook.enabled .Values.uploadProxy.enabled -}}true{{- end -}}
{{- end }}

{{/* The Secret holding the key upload tokens are signed with, as NAMESPACE/NAME. */}}
{{- define "diskpipe.uploadTokenSecret" -}}
{{ .Release.Namespace }}/{{ include "diskpipe.fullname" . }}-upload-token
{{- end }}

{{- /*
refuseBesideCDI fails the install when CDI's API is already served by someone else: a
DataVolume CRD that this release did not make is CDI's (its operator made it), and two
controllers answering one DataVolume would fight over its PVC. helm template (no cluster)
sees nothing and renders.
*/ -}}
{{- define "diskpipe.refuseBesideCDI" -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "datavolumes.cdi.kubevirt.io" -}}
{{- if $crd -}}
{{- $annotations := default (dict) $crd.metadata.annotations -}}
{{- $owner := get $annotations "meta.helm.sh/release-name" -}}
{{- if ne $owner .Release.Name -}}
{{- fail (printf "cdi.compatibility.enabled: the CRD datavolumes.cdi.kubevirt.io already exists and is not this release's (labels %v): CDI serves its API in this cluster, and diskpipe will not serve it beside a running CDI. Install with cdi.compatibility.enabled=false beside CDI (docs/cdi.md)." (default (dict) $crd.metadata.labels)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
