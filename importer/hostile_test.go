package importer

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// TestHostileImages imports seeded mutations of real images of every format — bytes flipped
// in their headers and tables, files cut short — at random and as a stream. Each import must
// end, within its time limit, in success or a classified error: no panic, no hang, no
// unbounded allocation. (The fuzz targets explore further; this runs in every test pass.)
func TestHostileImages(t *testing.T) {
	dir := t.TempDir()
	raw := filepath.Join(dir, "seed.raw")
	seed := make([]byte, 2<<20)
	for i := range seed {
		seed[i] = byte(i * 7)
	}
	writeFile(t, raw, seed)
	var images [][]byte
	for _, args := range [][]string{
		{"-O", "qcow2"}, {"-O", "qcow2", "-c"}, {"-O", "qcow2", "-o", "compat=0.10,cluster_size=4096"},
		{"-O", "vmdk"}, {"-O", "vmdk", "-o", "subformat=streamOptimized"}, {"-O", "vpc"}, {"-O", "vdi"}, {"-O", "vhdx"},
	} {
		out := filepath.Join(dir, "seed.img")
		if b, err := qemuImgOutput(append(append([]string{"convert", "-f", "raw"}, args...), raw, out)...); err != nil {
			t.Fatalf("qemu-img: %v\n%s", err, b)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		images = append(images, b)
	}
	rng := rand.New(rand.NewPCG(11, 12))
	outcomes := map[transfer.Reason]int{}
	defer func() { t.Logf("outcomes of 600 imports: %v", outcomes) }()
	for i := 0; i < 300; i++ {
		img := images[i%len(images)]
		data := append([]byte(nil), img...)
		if i%5 == 4 {
			data = data[:rng.IntN(len(data))]
		} else {
			for range 1 + rng.IntN(8) {
				at := rng.IntN(min(len(data), 128<<10)) // headers and tables
				data[at] = byte(rng.Uint32())
			}
		}
		for _, sequential := range []bool{false, true} {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			start := time.Now()
			res, err := Import(ctx, Options{Source: &memSource{data: data, sequential: sequential},
				Target: filepath.Join(t.TempDir(), "disk.img"), Capacity: 8 << 20, Retry: fastRetry})
			cancel()
			if err == nil {
				outcomes["Succeeded"]++
			} else {
				outcomes[transfer.ReasonOf(err)]++
			}
			switch {
			case time.Since(start) > 10*time.Second:
				t.Errorf("mutation %d (sequential %v) took %v", i, sequential, time.Since(start))
			case err != nil && transfer.ReasonOf(err) == transfer.ReasonInternal:
				t.Errorf("mutation %d (sequential %v): unclassified error: %v", i, sequential, err)
			case err == nil && res.VirtualSize > 8<<20:
				t.Errorf("mutation %d: imported %d bytes into an 8 MiB volume", i, res.VirtualSize)
			}
		}
	}
}
