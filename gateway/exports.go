package gateway

import (
	"context"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// download is an export's download link.
type download struct {
	URL string `json:"url"`
	// ExpiresAt is when the link stops working (the export makes a new one before then).
	ExpiresAt string `json:"expiresAt,omitempty"`
}

// exportDownload answers the download link of c's export, read as the caller: the export,
// then the Secret its status names (a link to the store signed for that object alone, which
// only those who may read the namespace's Secrets get).
func (s *Server) exportDownload(ctx context.Context, c *call) (int, envelope, error) {
	o, k, err := s.find(ctx, c)
	if err != nil {
		return 0, envelope{}, err
	}
	name := c.r.PathValue("name")
	secret, _, _ := unstructured.NestedString(o.Object, "status", "downloadSecretName")
	if secret == "" {
		phase, _, _ := unstructured.NestedString(o.Object, "status", "phase")
		return 0, envelope{}, fail(http.StatusConflict, "Conflict", "the export %s/%s has no download link yet (phase %q): it has one once Ready, to the bundled store", c.namespace, name, phase)
	}
	sec := &corev1.Secret{}
	if err := c.cl.AsCaller.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: secret}, sec); err != nil {
		f := refusal(err, c.user.Username, "get", k, c.namespace)
		if f.status == http.StatusForbidden {
			f.deny = c.user.Username + " may not get secrets in namespace " + c.namespace
			f.message = "the export's download link is in the Secret " + secret + ", which " + f.deny
		}
		return 0, envelope{}, f
	}
	url := strings.TrimSpace(string(sec.Data["url"]))
	if url == "" {
		return 0, envelope{}, fail(http.StatusConflict, "Conflict", "the Secret %s/%s holds no url", c.namespace, secret)
	}
	at, _, _ := unstructured.NestedString(o.Object, "status", "downloadURLExpiresAt")
	return http.StatusOK, envelope{Data: download{URL: url, ExpiresAt: at}}, nil
}
