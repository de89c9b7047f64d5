package image

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	common "github.com/diskpipe/diskpipe/apis/common/v1alpha1"
)

// readProgress reads a running importer's progress metrics from its pod.
func (r *Reconciler) readProgress(ctx context.Context, pod *corev1.Pod) (*common.Transfer, error) {
	if pod.Status.PodIP == "" {
		return nil, fmt.Errorf("pod %s has no IP yet", pod.Name)
	}
	url := "http://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(r.Pods.MetricsPort))) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := r.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	now := metav1.Now()
	t := &common.Transfer{UpdateTime: &now}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch name {
		case "diskpipe_transfer_bytes_done":
			t.BytesDone = int64(v)
		case "diskpipe_transfer_bytes_total":
			t.BytesTotal = int64(v)
		case "diskpipe_transfer_bytes_per_second":
			t.BytesPerSecond = int64(v)
		}
	}
	return t, sc.Err()
}
