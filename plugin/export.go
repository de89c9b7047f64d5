package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ExportBucket is the bundled store's bucket the plugin's exports of namespace ns are written
// to: one per namespace, since a bucket belongs to the namespace that made it.
func ExportBucket(ns string) string {
	const prefix = "kubectl-diskpipe-"
	if len(prefix)+len(ns) <= 63 {
		return prefix + ns
	}
	sum := sha256.Sum256([]byte(ns))
	return prefix + ns[:63-len(prefix)-9] + "-" + hex.EncodeToString(sum[:4])
}

// export makes a VirtualMachineVolumeExport of pvc, waits for it, downloads its object and,
// unless --keep, deletes the export and with it the object.
func (o *options) export(ctx context.Context, c *client, pvc string) error {
	if o.format != "qcow2" && o.format != "raw" {
		return usageError("--format %s: qcow2 or raw", o.format)
	}
	retain := "Delete"
	if o.keep {
		retain = "Retain"
	}
	spec := map[string]any{
		"pvcName":      pvc,
		"format":       o.format,
		"retainPolicy": retain,
		"objectStore": map[string]any{
			"bucketName": ExportBucket(c.namespace),
			"objectName": fmt.Sprintf("%s/%s-%s.%s", c.namespace, pvc, time.Now().UTC().Format("20060102-150405"), o.format),
		},
	}
	if o.compression != "" {
		spec["compression"] = o.compression
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": exports.GroupVersion().String(),
		"kind":       "VirtualMachineVolumeExport",
		"metadata":   map[string]any{"generateName": pvc + "-export-"},
		"spec":       spec,
	}}
	made, err := c.dyn.Resource(exports).Namespace(c.namespace).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("making the export of %s: %w", pvc, err)
	}
	r := exportRef(made.GetName())
	fmt.Fprintf(o.streams.ErrOut, "%s made: exporting PVC %s as %s\n", r, pvc, o.format)
	if !o.keep {
		defer func() {
			// Deleting the export deletes its object too (retainPolicy Delete), whatever came of it.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := c.dyn.Resource(exports).Namespace(c.namespace).Delete(ctx, r.name, metav1.DeleteOptions{}); err != nil {
				fmt.Fprintf(o.streams.ErrOut, "deleting %s: %v\n", r, err)
			}
		}()
	}
	s, err := o.wait(ctx, c, r)
	if err != nil {
		return err
	}
	return o.fetchExport(ctx, c, r, s)
}
