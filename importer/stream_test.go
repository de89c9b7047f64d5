package importer

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// vmwareLayout rewrites a streamOptimized vmdk made by qemu-img (tables before the grains, no
// markers but the grains') into the layout VMware's tools write: header with the directory
// "at end", the grains, then each grain table and the directory behind a metadata marker, the
// footer and the end-of-stream marker. qemu-img compare, which reads that layout by its
// footer, checks that the result is a valid image of the same disk.
func vmwareLayout(t *testing.T, qemuVMDK, raw string) string {
	t.Helper()
	b, err := os.ReadFile(qemuVMDK)
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	h, err := parseVMDKHeader(b[:512])
	if err != nil {
		t.Fatal(err)
	}
	grainSectors := uint64(h.grain / 512)
	entries := (h.size + h.grain - 1) / h.grain
	gt := make([]byte, (entries+h.gtes-1)/h.gtes*h.gtes*4)
	sector := func(out []byte) uint64 { return uint64(len(out) / 512) }
	pad := func(out []byte) []byte { return append(out, make([]byte, (512-len(out)%512)%512)...) }
	marker := func(out []byte, sectors uint64, typ uint32) []byte {
		m := make([]byte, 512)
		le.PutUint64(m, sectors)
		le.PutUint32(m[12:], typ)
		return append(out, m...)
	}

	out := append([]byte(nil), b[:512]...)
	le.PutUint64(out[48:], 0)           // no redundant directory
	le.PutUint64(out[56:], vmdkGDAtEnd) // the directory is in the footer
	out = append(out, b[h.descOff:h.descOff+h.descLen]...)
	le.PutUint64(out[28:], 1) // the descriptor right after the header
	le.PutUint64(out[64:], sector(out))
	for pos := h.overhead; pos+12 <= int64(len(b)); {
		lba, size := le.Uint64(b[pos:]), int64(le.Uint32(b[pos+8:]))
		if size == 0 { // qemu-img pads the file with zeros: an end-of-stream marker
			break
		}
		le.PutUint32(gt[lba/grainSectors*4:], uint32(sector(out)))
		out = pad(append(out, b[pos:pos+12+size]...))
		pos += (12 + size + 511) / 512 * 512
	}
	gd := make([]byte, len(gt)/int(h.gtes*4)*4)
	for i := 0; i < len(gt); i += int(h.gtes * 4) {
		tableSectors := uint64(h.gtes * 4 / 512)
		out = marker(out, tableSectors, vmdkMarkerGT)
		le.PutUint32(gd[i/int(h.gtes):], uint32(sector(out)))
		out = pad(append(out, gt[i:i+int(h.gtes*4)]...))
	}
	out = marker(out, uint64(len(gd)+511)/512, vmdkMarkerGD)
	gdSector := sector(out)
	out = pad(append(out, gd...))
	out = marker(out, 1, vmdkMarkerFooter)
	footer := append([]byte(nil), out[:512]...)
	le.PutUint64(footer[56:], gdSector)
	out = append(out, footer...)
	out = append(out, make([]byte, 512)...) // end of stream
	p := filepath.Join(t.TempDir(), "vmware.vmdk")
	writeFile(t, p, out)
	if o, err := exec.Command("qemu-img", "compare", "-f", "vmdk", "-F", "raw", p, raw).CombinedOutput(); err != nil {
		t.Fatalf("the rewritten vmdk is not the disk: %v\n%s", err, o)
	}
	return p
}

// TestStreamOptimizedVMDK imports streamOptimized vmdks, in both layouts, from a server that
// ignores Range and out of gzip, xz and zstd wrappers, in one pass.
func TestStreamOptimizedVMDK(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	qemuLayout := convertTo(t, raw, "vmdk", "-o", "subformat=streamOptimized")
	vmware := vmwareLayout(t, qemuLayout, raw)
	cases := []struct{ name, path, compression string }{
		{"qemu-img layout", qemuLayout, ""},
		{"VMware layout", vmware, ""},
		{"qemu-img layout.gz", compress(t, qemuLayout, "gzip"), "gzip"},
		{"qemu-img layout.xz", compress(t, qemuLayout, "xz"), "xz"},
		{"VMware layout.zst", compress(t, vmware, "zstd"), "zstd"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want := sha256File(t, c.path)
			s := &fileServer{path: c.path, noRange: true}
			target, res := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, Checksum: want})
			sameDisk(t, raw, target)
			if res.Format != "vmdk" || res.Compression != c.compression || res.VirtualSize != fixtureSize || res.Digest != want {
				t.Errorf("result %+v", res)
			}
			if n := s.requests.Load(); n != 2 {
				t.Errorf("%d requests, want two: the source's opening and one pass", n)
			}
			p, err := Probe(t.Context(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: c.path, noRange: true})}, Retry: fastRetry})
			if err != nil || p.Format != "vmdk" || p.VirtualSize != fixtureSize {
				t.Errorf("probe: %+v, %v", p, err)
			}
		})
	}
}

// TestStreamedVMDKBadInput: what a stream cannot hold, and damaged streamOptimized images,
// each fail with their own reason and leave the disk empty.
func TestStreamedVMDKBadInput(t *testing.T) {
	dir := t.TempDir()
	raw := makeRaw(t, dir)
	qemuLayout := convertTo(t, raw, "vmdk", "-o", "subformat=streamOptimized")
	vmware := vmwareLayout(t, qemuLayout, raw)
	cut := func(path string, at float64) string {
		b, _ := os.ReadFile(path)
		p := filepath.Join(t.TempDir(), "cut.vmdk")
		writeFile(t, p, b[:int(float64(len(b))*at)/512*512])
		return p
	}
	// atGrain cuts the image where its middle grain starts: the tables still map grains.
	atGrain := func(path string) string {
		b, _ := os.ReadFile(path)
		h, _ := parseVMDKHeader(b[:512])
		var starts []int64
		for pos := h.overhead; pos+12 <= int64(len(b)); {
			size := int64(binary.LittleEndian.Uint32(b[pos+8:]))
			if size == 0 {
				break
			}
			starts = append(starts, pos)
			pos += (12 + size + 511) / 512 * 512
		}
		p := filepath.Join(t.TempDir(), "cut.vmdk")
		writeFile(t, p, b[:starts[len(starts)/2]])
		return p
	}
	corrupt := func(path string) string {
		b, _ := os.ReadFile(path)
		h, _ := parseVMDKHeader(b[:512])
		b[h.overhead+512+12+300] ^= 0xff // inside the second grain's compressed data
		p := filepath.Join(t.TempDir(), "corrupt.vmdk")
		writeFile(t, p, b)
		return p
	}
	for _, c := range []struct {
		name, path string
		reason     transfer.Reason
		msg        string
	}{
		{"monolithicSparse", convertTo(t, raw, "vmdk"), transfer.ReasonNeedsRandomAccess, "subformat=streamOptimized"},
		{"vhdx", convertTo(t, raw, "vhdx"), transfer.ReasonNeedsRandomAccess, "qemu-img convert -O qcow2"},
		{"vpc.gz", compress(t, convertTo(t, raw, "vpc"), "gzip"), transfer.ReasonNeedsRandomAccess, "wrapped in gzip"},
		{"vdi", convertTo(t, raw, "vdi"), transfer.ReasonNeedsRandomAccess, "the bundled object store does"},
		{"qemu-img layout cut in half", cut(qemuLayout, 0.5), transfer.ReasonTruncatedImage, "truncated vmdk image"},
		{"qemu-img layout cut between grains", atGrain(qemuLayout), transfer.ReasonTruncatedImage, "grains its tables map still to come"},
		{"qemu-img layout cut in its tables", cut(qemuLayout, 0.01), transfer.ReasonTruncatedImage, "the metadata before the first grain"},
		{"VMware layout cut before its end marker", cut(vmware, 0.999), transfer.ReasonTruncatedImage, ""},
		{"VMware layout cut in half", cut(vmware, 0.5), transfer.ReasonTruncatedImage, ""},
		{"a corrupt grain", corrupt(qemuLayout), transfer.ReasonMalformedImage, "malformed vmdk grain"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &fileServer{path: c.path, noRange: true}
			target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}})
			wantFailure(t, target, err, c.reason, false, c.msg)
			if c.reason == transfer.ReasonNeedsRandomAccess { // the probe knows too, before a volume is made
				_, err := Probe(t.Context(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: c.path, noRange: true})}, Retry: fastRetry})
				if transfer.ReasonOf(err) != c.reason || !strings.Contains(fmt.Sprint(err), c.msg) {
					t.Errorf("probe: %v, want %s naming %q", err, c.reason, c.msg)
				}
			}
		})
	}
	t.Run("a grain the tables put elsewhere", func(t *testing.T) {
		b, _ := os.ReadFile(qemuLayout)
		h, _ := parseVMDKHeader(b[:512])
		binary.LittleEndian.PutUint64(b[h.overhead:], binary.LittleEndian.Uint64(b[h.overhead:])+uint64(h.grain/512))
		p := filepath.Join(t.TempDir(), "moved.vmdk")
		writeFile(t, p, b)
		target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: p, noRange: true})}})
		wantFailure(t, target, err, transfer.ReasonMalformedImage, false, "not where the tables map")
	})
}

// ovf is a minimal OVF descriptor for the disks, each {id, file, capacity in MiB, compression}.
func ovf(disks ...[4]string) string {
	var files, sect strings.Builder
	for i, d := range disks {
		comp := ""
		if d[3] != "" {
			comp = fmt.Sprintf(` ovf:compression="%s"`, d[3])
		}
		fmt.Fprintf(&files, `    <File ovf:id="file%d" ovf:href="%s"%s/>`+"\n", i, d[1], comp)
		fmt.Fprintf(&sect, `    <Disk ovf:diskId="%s" ovf:fileRef="file%d" ovf:capacity="%s" ovf:capacityAllocationUnits="byte * 2^20"
      ovf:format="http://www.vmware.com/interfaces/specifications/vmdk.html#streamOptimized"/>`+"\n", d[0], i, d[2])
	}
	return `<?xml version="1.0" encoding="UTF-8"?>
<Envelope xmlns="http://schemas.dmtf.org/ovf/envelope/1" xmlns:ovf="http://schemas.dmtf.org/ovf/envelope/1">
  <References>
` + files.String() + `  </References>
  <DiskSection>
    <Info>Virtual disks</Info>
` + sect.String() + `  </DiskSection>
  <VirtualSystem ovf:id="vm"><Info>A test appliance</Info></VirtualSystem>
</Envelope>
`
}

// makeOVA packs the descriptor and the files with tar, the descriptor first, as the OVF
// specification asks.
func makeOVA(t *testing.T, descriptor string, files ...string) string {
	t.Helper()
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "appliance.ovf"), []byte(descriptor))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(dir, filepath.Base(f)), b)
	}
	names := []string{"appliance.ovf"}
	for _, f := range files {
		names = append(names, filepath.Base(f))
	}
	out := filepath.Join(t.TempDir(), "appliance.ova")
	runTool(t, "tar", append([]string{"-cf", out, "-C", dir, "--format=ustar"}, names...)...)
	return out
}

// TestOVA imports an appliance's disks, made by qemu-img and packed by tar, with and without
// Range, wrapped and not: the first disk by default, another by id or name, gzip-compressed
// members, the descriptor's larger capacity.
func TestOVA(t *testing.T) {
	raw := makeRaw(t, t.TempDir())
	first := filepath.Join(t.TempDir(), "system.vmdk")
	runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", raw, first)
	// The second disk: the same bytes shifted by a MiB, so taking the wrong one shows.
	shifted := filepath.Join(t.TempDir(), "data.raw")
	b, _ := os.ReadFile(raw)
	writeFile(t, shifted, append(make([]byte, 1<<20), b[:len(b)-1<<20]...))
	second := filepath.Join(t.TempDir(), "data.vmdk")
	runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", shifted, second)
	qcow := convertTo(t, shifted, "qcow2")
	gz := compress(t, second, "gzip")

	two := makeOVA(t, ovf([4]string{"vmdisk1", "system.vmdk", "64", ""}, [4]string{"vmdisk2", "data.vmdk", "64", ""}), first, second)
	for _, c := range []struct {
		name, path, disk, want string
		noRange                bool
		vsize                  int64
	}{
		{"the first disk", two, "", raw, true, fixtureSize},
		{"with Range", two, "", raw, false, fixtureSize},
		{"a disk by id", two, "vmdisk2", shifted, true, fixtureSize},
		{"a disk by file name", two, "data.vmdk", shifted, true, fixtureSize},
		{"ova.xz", compress(t, two, "xz"), "vmdisk2", shifted, true, fixtureSize},
		{"a gzip member", makeOVA(t, ovf([4]string{"d", filepath.Base(gz), "64", "gzip"}), gz), "", shifted, true, fixtureSize},
		{"a qcow2 member", makeOVA(t, ovf([4]string{"d", filepath.Base(qcow), "64", ""}), qcow), "", shifted, true, fixtureSize},
		{"a raw member", makeOVA(t, ovf([4]string{"d", "data.raw", "64", ""}), shifted), "", shifted, true, fixtureSize},
		{"the descriptor's larger capacity", makeOVA(t, ovf([4]string{"d", "system.vmdk", "96", ""}), first), "", raw, true, 96 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := sha256File(t, c.path)
			s := &fileServer{path: c.path, noRange: c.noRange}
			o := Options{Source: &HTTPSource{URL: serve(t, s)}, Checksum: want, OVADisk: c.disk}
			target, res := mustImport(t, t.TempDir(), o)
			sameDisk(t, c.want, target)
			if res.Format != "ova" || res.VirtualSize != c.vsize || res.Digest != want {
				t.Errorf("result %+v", res)
			}
			if st, _ := os.Stat(target); st.Size() != c.vsize {
				t.Errorf("disk of %d bytes, want %d", st.Size(), c.vsize)
			}
			o.Source = &HTTPSource{URL: serve(t, &fileServer{path: c.path, noRange: c.noRange})}
			p, err := Probe(t.Context(), o)
			if err != nil || p.Format != "ova" || p.VirtualSize != c.vsize {
				t.Errorf("probe: %+v, %v", p, err)
			}
		})
	}

	t.Run("connections cut twice, without Range", func(t *testing.T) {
		s := &fileServer{path: two, noRange: true, dropAt: []float64{0.2, 0.7}}
		target, _ := mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, Checksum: sha256File(t, two)})
		sameDisk(t, raw, target)
		if n := s.requests.Load(); n < 3 {
			t.Errorf("%d requests: the cuts did not happen", n)
		}
	})

	vhdx := convertTo(t, raw, "vhdx")
	tarOnly := filepath.Join(t.TempDir(), "disk.tar")
	runTool(t, "tar", "-cf", tarOnly, "-C", filepath.Dir(raw), filepath.Base(raw))
	for _, c := range []struct {
		name, path, disk string
		capacity         int64
		reason           transfer.Reason
		msg              string
	}{
		{"no such disk", two, "vmdisk3", 0, transfer.ReasonInvalidArgument, "its disks are vmdisk1 (system.vmdk), vmdisk2 (data.vmdk)"},
		{"a vhdx member", makeOVA(t, ovf([4]string{"d", filepath.Base(vhdx), "64", ""}), vhdx), "", 0, transfer.ReasonNeedsRandomAccess, "cannot be read from inside an archive"},
		{"a disk larger than its capacity", makeOVA(t, ovf([4]string{"d", "system.vmdk", "32", ""}), first), "", 0, transfer.ReasonMalformedImage, "more than the 32.0 MiB"},
		{"a disk the descriptor names but the archive lacks", makeOVA(t, ovf([4]string{"d", "gone.vmdk", "64", ""})), "", 0, transfer.ReasonTruncatedImage, "ends before its disk gone.vmdk"},
		{"a tar that is not an OVA", tarOnly, "", 0, transfer.ReasonUnsupportedFormat, "not an OVF descriptor"},
		{"a descriptor that is not XML", makeOVA(t, "not xml <", first), "", 0, transfer.ReasonMalformedImage, "descriptor"},
		{"larger than the volume", two, "", 48 << 20, transfer.ReasonTooLarge, ""},
		{"a disk chosen from an image", qcow, "vmdisk1", 0, transfer.ReasonInvalidArgument, "the source is a qcow2 image, not an OVA"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &fileServer{path: c.path, noRange: true}
			target, res, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, s)}, OVADisk: c.disk, Capacity: c.capacity})
			wantFailure(t, target, err, c.reason, false, c.msg)
			if c.capacity > 0 && res.BytesRead > 4<<20 {
				t.Errorf("read %d bytes before refusing a disk too large for its volume", res.BytesRead)
			}
		})
	}
	t.Run("a disk chosen from an image served with Range", func(t *testing.T) {
		target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: qcow})}, OVADisk: "vmdisk1"})
		wantFailure(t, target, err, transfer.ReasonInvalidArgument, false, "not an OVA")
	})
}

// TestOVFCapacity reads the capacities OVF writes.
func TestOVFCapacity(t *testing.T) {
	for _, c := range []struct {
		capacity, units string
		want            int64
		bad             bool
	}{
		{"10737418240", "", 10 << 30, false},
		{"10", "byte * 2^30", 10 << 30, false},
		{"10", "byte*2^20", 10 << 20, false},
		{"4", "byte * 1024 * 1024", 4 << 20, false},
		{"", "", 0, false},
		{"ten", "byte", 0, true},
		{"1", "bit * 2^30", 0, true},
		{"1", "byte * 2^70", 0, true},
		{"9000000000", "byte * 2^40", 0, true},
	} {
		got, err := ovfBytes(c.capacity, c.units)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("ovfBytes(%q, %q) = %d, %v; want %d (error: %v)", c.capacity, c.units, got, err, c.want, c.bad)
		}
	}
}

// tableAfterData rewrites a qcow2 image made by qemu-img of a disk under 512 MiB (one L2
// table) so that its L2 table comes after the data it maps: the table moves to the end of the
// file and its old cluster is zeroed. qemu-img compare checks that the result is still an
// image of the same disk.
func tableAfterData(t *testing.T, img, raw string) string {
	t.Helper()
	b, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	be := binary.BigEndian
	cs := int64(1) << be.Uint32(b[20:])
	l1 := be.Uint64(b[40:])
	l2 := int64(be.Uint64(b[l1:]) & 0x00fffffffffffe00)
	end := (int64(len(b)) + cs - 1) / cs * cs
	out := make([]byte, end, end+cs)
	copy(out, b)
	out = append(out, b[l2:l2+cs]...)
	clear(out[l2 : l2+cs])
	be.PutUint64(out[l1:], uint64(end)|1<<63)
	p := filepath.Join(t.TempDir(), "table-last.qcow2")
	writeFile(t, p, out)
	runTool(t, "qemu-img", "compare", "-f", "raw", "-F", "qcow2", raw, p)
	return p
}

// TestTablesAfterTheirData streams qcow2 images whose data comes before the table that maps
// it: what passed is held up to maxUnclaimed and written when the table arrives; beyond it the
// import stops with NeedsRandomAccess and says why, while the same image served with Range
// imports.
func TestTablesAfterTheirData(t *testing.T) {
	for _, c := range []struct {
		name string
		size int64
		fits bool
	}{
		{"held until its table comes", maxUnclaimed / 2, true},
		{"more than is held", maxUnclaimed * 3 / 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw := randomRaw(t, c.size)
			img := tableAfterData(t, convertTo(t, raw, "qcow2"), raw)
			target, _, err := importTo(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: img, noRange: true})}})
			if c.fits {
				if err != nil {
					t.Fatal(err)
				}
				sameDisk(t, raw, target)
				return
			}
			wantFailure(t, target, err, transfer.ReasonNeedsRandomAccess, false,
				fmt.Sprintf("places data more than %d MiB before the tables that map it", maxUnclaimed>>20))
			target, _ = mustImport(t, t.TempDir(), Options{Source: &HTTPSource{URL: serve(t, &fileServer{path: img})}})
			sameDisk(t, raw, target)
		})
	}
}
