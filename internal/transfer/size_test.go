package transfer

import "testing"

// TestCopyCapacity: a volume sized for a copy takes the copy, by the rule the importer checks
// it with (Usable): a block volume's whole device into a filesystem volume with any overhead,
// the odd sizes included; other copies are as large as their source.
func TestCopyCapacity(t *testing.T) {
	for _, claim := range []int64{2 << 30, 2310012928, 10<<30 + 4096, 1<<40 + 1} {
		for _, o := range []float64{0, 0.055, 0.06, 0.07, 0.5} {
			c := CopyCapacity(claim, true, false, 0.06, o)
			if Usable(c, o) < claim {
				t.Errorf("a block volume of %d bytes into a filesystem volume with %g overhead: %d bytes, of which %d usable", claim, o, c, Usable(c, o))
			}
			if c < claim || c%(1<<20) != 0 && c != claim {
				t.Errorf("a block volume of %d bytes, overhead %g: %d bytes", claim, o, c)
			}
			for _, modes := range [][2]bool{{false, false}, {true, true}, {false, true}} {
				if got := CopyCapacity(claim, modes[0], modes[1], o, o); got != claim {
					t.Errorf("from block %v to block %v: %d bytes for a source of %d", modes[0], modes[1], got, claim)
				}
			}
		}
	}
	// The case KubeVirt's "create a VM from a bootable volume" meets: a 2 GiB block volume into
	// the 7 % filesystem volume a DataVolume of storage: 2Gi makes.
	// A filesystem volume's disk file into a class that keeps more: that share besides.
	for _, c := range [][2]float64{{0, 0.06}, {0.06, 0.2}, {0.2, 0.06}} {
		got := CopyCapacity(10<<30, false, false, c[0], c[1])
		if Usable(got, c[1]) < Usable(10<<30, c[0]) || got < 10<<30 {
			t.Errorf("a filesystem volume of 10 GiB at %g into one at %g: %d bytes, of which %d usable", c[0], c[1], got, Usable(got, c[1]))
		}
	}
	if got := CopyCapacity(2<<30, true, false, 0, 0.07); got != 2310012928 {
		t.Errorf("2 GiB at 7 %%: %d, want 2310012928 (CDI's size for storage: 2Gi)", got)
	}
}
