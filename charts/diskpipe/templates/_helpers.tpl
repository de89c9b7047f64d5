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
The Secret (tls.crt, tls.key) a component serves HTTPS with, from its values' tls: the user's
secretName, or the one diskpipe issues (the manager, or cert-manager) into
<fullname>-<component>-tls; empty serves plain HTTP. Called as (list . "uploadProxy"
"uploadproxy"): the root, the component's values key, its name.
*/}}
{{- define "diskpipe.tlsSecret" -}}
{{- $root := index . 0 -}}
{{- $key := index . 1 -}}
{{- $tls := (index $root.Values $key).tls -}}
{{- if $tls.secretName -}}
{{ $tls.secretName }}
{{- else if $tls.issued -}}
{{- if not $root.Values.webhook.enabled -}}
{{- fail (printf "%s.tls.issued needs webhook.enabled: the manager (or cert-manager) issues its certificate beside the webhooks'; set %s.tls.secretName, or %s.tls.issued=false for plain HTTP" $key $key $key) -}}
{{- end -}}
{{ include "diskpipe.fullname" $root }}-{{ index . 2 }}-tls
{{- end -}}
{{- end }}

{{- define "diskpipe.uploadProxy.tlsSecret" -}}
{{ include "diskpipe.tlsSecret" (list . "uploadProxy" "uploadproxy") }}
{{- end }}

{{- define "diskpipe.gateway.tlsSecret" -}}
{{ include "diskpipe.tlsSecret" (list . "gateway" "gateway") }}
{{- end }}

{{/* "true" where the manager issues the gateway's certificate (with its webhooks' CA). */}}
{{- define "diskpipe.gateway.managerIssued" -}}
{{- if and .Values.gateway.enabled .Values.gateway.tls.issued (not .Values.gateway.tls.secretName) (not .Values.webhook.certManager.enabled) -}}
true
{{- end -}}
{{- end }}

{{/* The volume of a component's serving certificate: its tls.crt and tls.key only (an issued
Secret's ca.crt is for clients). Called with the Secret's name. */}}
{{- define "diskpipe.tlsVolume" -}}
- name: tls
  secret:
    secretName: {{ . }}
    # the certificate and its key only (an issued Secret's ca.crt is for clients)
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}

{{/* A cert-manager Certificate for a component's Service, into <fullname>-<name>-tls.
Called as (list . "uploadproxy"). */}}
{{- define "diskpipe.servingCertificate" -}}
{{- $root := index . 0 -}}
{{- $fullname := include "diskpipe.fullname" $root -}}
{{- $name := index . 1 -}}
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ $fullname }}-{{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "diskpipe.labels" $root | nindent 4 }}
spec:
  secretName: {{ $fullname }}-{{ $name }}-tls
  dnsNames:
    - {{ $fullname }}-{{ $name }}.{{ $root.Release.Namespace }}.svc
    - {{ $fullname }}-{{ $name }}.{{ $root.Release.Namespace }}.svc.cluster.local
  issuerRef:
    {{- if $root.Values.webhook.certManager.issuerRef }}
    {{- toYaml $root.Values.webhook.certManager.issuerRef | nindent 4 }}
    {{- else }}
    kind: Issuer
    name: {{ $fullname }}-selfsigned
    {{- end }}
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

{{/* KubeSphere's token review, for the servers that take KubeSphere users' tokens (the
gateway, and the upload proxy its uploads go to): their flags, and the mount and volume of
ks-apiserver's CA. */}}
{{- define "diskpipe.kubesphere.reviews" -}}
{{- if and .Values.gateway.enabled .Values.gateway.kubesphere.enabled .Values.gateway.kubesphere.apiserverURL -}}
true
{{- end -}}
{{- end }}

{{- define "diskpipe.kubesphere.args" -}}
{{- $ks := .Values.gateway.kubesphere -}}
{{- if include "diskpipe.kubesphere.reviews" . }}
- --kubesphere-url={{ $ks.apiserverURL }}
{{- if hasPrefix "http://" $ks.apiserverURL }}
- --kubesphere-allow-http
{{- end }}
{{- if $ks.apiserverCASecret }}
- --kubesphere-ca-file=/var/run/diskpipe/kubesphere-ca/ca.crt
{{- end }}
{{- end }}
{{- end }}

{{- define "diskpipe.kubesphere.volumeMounts" -}}
{{- if and (include "diskpipe.kubesphere.reviews" .) .Values.gateway.kubesphere.apiserverCASecret }}
- name: kubesphere-ca
  mountPath: /var/run/diskpipe/kubesphere-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "diskpipe.kubesphere.volumes" -}}
{{- if and (include "diskpipe.kubesphere.reviews" .) .Values.gateway.kubesphere.apiserverCASecret }}
- name: kubesphere-ca
  secret:
    secretName: {{ .Values.gateway.kubesphere.apiserverCASecret }}
    items:
      - {key: ca.crt, path: ca.crt}
{{- end }}
{{- end }}
