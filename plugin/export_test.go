package plugin_test

import (
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/objectstore"
	"github.com/diskpipe/diskpipe/plugin"
)

// TestExportBucket: each namespace gets a bucket of its own with a valid S3 name, also for the
// longest namespace names.
func TestExportBucket(t *testing.T) {
	long := strings.Repeat("a", 63)
	seen := map[string]string{}
	for _, ns := range []string{"vms", "e2e-123", long, long[:62] + "b"} {
		b := plugin.ExportBucket(ns)
		if err := objectstore.CheckBucketName(b); err != nil {
			t.Errorf("namespace %s: %v", ns, err)
		}
		if other, ok := seen[b]; ok {
			t.Errorf("namespaces %s and %s share the bucket %s", ns, other, b)
		}
		seen[b] = ns
		if plugin.ExportBucket(ns) != b {
			t.Errorf("namespace %s: the bucket changes", ns)
		}
	}
	if got := plugin.ExportBucket("vms"); got != "kubectl-diskpipe-vms" {
		t.Errorf("ExportBucket(vms) = %s", got)
	}
}
