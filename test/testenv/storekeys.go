package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	upload "github.com/diskpipe/diskpipe/apis/upload/v1alpha1"
)

// StoreKeys gets namespace ns's keys of the bundled store as a user does: c (a user allowed
// to write Secrets in ns) creates an ObjectStoreKeysRequest and reads the Secret it writes.
func StoreKeys(ctx context.Context, c client.Client, ns string) (access, secret string, err error) {
	req := &upload.ObjectStoreKeysRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: "keys-", Namespace: ns}}
	// The API is away for a moment while the manager restarts (some specs restart it).
	for attempt := 0; ; attempt++ {
		err := c.Create(ctx, req)
		if err == nil {
			break
		}
		if attempt == 30 || !strings.Contains(err.Error(), "unable to handle the request") {
			return "", "", fmt.Errorf("asking for namespace %s's store keys: %w", ns, err)
		}
		time.Sleep(time.Second)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: req.Status.SecretName}, sec); err != nil {
		return "", "", fmt.Errorf("reading namespace %s's store keys: %w", ns, err)
	}
	return string(sec.Data["accessKeyId"]), string(sec.Data["secretAccessKey"]), nil
}

// TenantAWS runs Debian's awscli against the bundled store at endpoint as namespace ns (with
// the keys StoreKeys gets), as a user of that namespace uploads images.
func TenantAWS(ctx context.Context, c client.Client, endpoint, ns string, args ...string) (string, error) {
	access, secret, err := StoreKeys(ctx, c, ns)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/usr/bin/aws", append([]string{"--endpoint-url", endpoint, "--no-cli-pager"}, args...)...)
	cmd.Env = []string{"AWS_ACCESS_KEY_ID=" + access, "AWS_SECRET_ACCESS_KEY=" + secret, "AWS_DEFAULT_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null", "HOME=" + os.TempDir(), "PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// WaitAPIService waits until the apiserver reports the APIService name Available: until then
// requests for its group fail with 503 and discovery is incomplete.
func WaitAPIService(ctx context.Context, c client.Client, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	api := &unstructured.Unstructured{}
	api.SetGroupVersionKind(schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"})
	last := "not read yet"
	for {
		if err := c.Get(ctx, client.ObjectKey{Name: name}, api); err != nil {
			last = err.Error()
		} else {
			conds, _, _ := unstructured.NestedSlice(api.Object, "status", "conditions")
			for _, cond := range conds {
				m, _ := cond.(map[string]any)
				if m["type"] == "Available" {
					if m["status"] == "True" {
						return nil
					}
					last = fmt.Sprintf("%v: %v", m["reason"], m["message"])
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the APIService %s is not available: %s", name, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
