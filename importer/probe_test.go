package importer

import (
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestProbe tells each format's virtual size without writing anything.
func TestProbe(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	for _, c := range []struct {
		name, path string
		noRange    bool
		format     string
		size       int64
	}{
		{"raw", raw, false, "raw", fixtureSize},
		{"qcow2", convertTo(t, raw, "qcow2", "-c"), false, "qcow2", fixtureSize},
		{"qcow2 without Range", convertTo(t, raw, "qcow2"), true, "qcow2", fixtureSize},
		{"qcow2.xz", compress(t, convertTo(t, raw, "qcow2"), "xz"), false, "qcow2", fixtureSize},
		{"vmdk", convertTo(t, raw, "vmdk"), false, "vmdk", fixtureSize},
		{"vhdx", convertTo(t, raw, "vhdx"), false, "vhdx", fixtureSize},
		{"raw.zst", compress(t, raw, "zstd"), false, "raw", -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &fileServer{path: c.path, noRange: c.noRange}
			res, err := Probe(t.Context(), Options{Source: &HTTPSource{URL: serve(t, s)}, Retry: fastRetry})
			if err != nil {
				t.Fatal(err)
			}
			if res.Format != c.format || res.VirtualSize != c.size {
				t.Errorf("probe: %s of %d bytes, want %s of %d", res.Format, res.VirtualSize, c.format, c.size)
			}
			if sent := s.sent.Load(); sent > 16<<20 {
				t.Errorf("the probe read %d bytes", sent)
			}
		})
	}
	_, err := Probe(t.Context(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: "x", status: 404})}, Retry: fastRetry})
	if transfer.ReasonOf(err) != transfer.ReasonSourceNotFound {
		t.Errorf("404: %v", err)
	}
}

// TestProbeCommand: the probe command succeeds, with exit code 0 and the size in its result.
func TestProbeCommand(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	url := serve(t, &fileServer{path: convertTo(t, raw, "qcow2")})
	code, res, log := runMain(t, "--url", url, "--probe")
	if code != transfer.ExitSucceeded || !res.Succeeded || res.Format != "qcow2" || res.VirtualSize != fixtureSize {
		t.Fatalf("exit %d, result %+v\n%s", code, res, log)
	}
}
