package bootdisk

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/diskpipe/diskpipe/test/testenv"
)

// copyDisk copies bin/bootdisk/disk.raw (make bootdisk) into a temporary directory.
func copyDisk(t *testing.T) string {
	t.Helper()
	src, err := os.Open(testenv.Path("bin", "bootdisk", "disk.raw"))
	if err != nil {
		t.Fatalf("%v: make bootdisk makes it", err)
	}
	defer src.Close()
	p := filepath.Join(t.TempDir(), "disk.raw")
	dst, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestBootGrown boots the disk grown to 1 GiB, as a VM disk larger than its image is: the
// guest sees the new size and the marker.
func TestBootGrown(t *testing.T) {
	disk := copyDisk(t)
	if err := os.Truncate(disk, 1<<30); err != nil {
		t.Fatal(err)
	}
	g, err := Check(t.Context(), disk, "raw", 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("booted under TCG in %.1f s: disk=%s size=%d marker=%s", g.Took.Seconds(), g.Disk, g.Size, g.Marker)
}

// TestBootCorrupted checks that the check can fail: a disk with one 64 KiB cluster of its
// kernel overwritten does not boot, and one with another marker is told apart.
func TestBootCorrupted(t *testing.T) {
	disk := copyDisk(t)
	off, err := KernelOffset(disk)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(disk, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0x5a}, 64<<10), off+1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if g, err := Check(t.Context(), disk, "raw", Size); err == nil {
		t.Fatalf("a disk with a corrupted kernel booted: %+v", g)
	} else if !strings.Contains(err.Error(), "did not boot: the guest stopped (\"System halted\")") {
		t.Errorf("the error does not say the disk did not boot: %v", err)
	}

	other := copyDisk(t)
	f, err = os.OpenFile(other, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("another-disk\n"+strings.Repeat("\x00", 16)), MarkerOffset); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Check(t.Context(), other, "raw", Size); err == nil || !strings.Contains(err.Error(), `read the marker "another-disk"`) {
		t.Errorf("a disk with another marker: %v", err)
	}
}

// TestLine checks the reading of the boot line: whole lines only, and a console message that
// cuts in after the marker (as the kernel's did once) is not part of it.
func TestLine(t *testing.T) {
	for console, want := range map[string]string{
		"DISKPIPE-BOOT disk=vda size=67108864 marker=diskpipe-bootdisk-v1\r\n":                            "diskpipe-bootdisk-v1",
		"DISKPIPE-BOOT disk=vda size=67108864 marker=diskpipe-bootdisk-v1[    2.102582] tsc: Refined\r\n": "diskpipe-bootdisk-v1",
		"DISKPIPE-BOOT disk=vda size=67108864 marker=diskpipe-boo":                                        "",
	} {
		got := ""
		if m := line.FindStringSubmatch(console); m != nil {
			got = m[3]
		}
		if got != want {
			t.Errorf("%q: marker %q, want %q (empty: no whole line)", console, got, want)
		}
	}
}

// TestHotplug boots the disk with the SMBIOS serial HotplugSerial, as KubeVirt's
// firmware.serial sets it, adds a second disk (1 MiB, with a marker) to the running machine
// through QEMU's monitor, and reads the guest's line for it; a machine without the serial
// powers off after its lines (TestBootGrown), so this is the one that waits.
func TestHotplug(t *testing.T) {
	disk := copyDisk(t)
	dir := t.TempDir()
	extra := filepath.Join(dir, "extra.raw")
	b := make([]byte, 1<<20)
	copy(b[MarkerOffset:], "hot-plugged\n")
	if err := os.WriteFile(extra, b, 0o600); err != nil {
		t.Fatal(err)
	}
	serial, monitor := filepath.Join(dir, "serial.log"), filepath.Join(dir, "monitor.sock")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-machine", "pc,accel=tcg", "-m", "256", "-smp", "1",
		"-nodefaults", "-display", "none", "-no-reboot", "-snapshot", "-serial", "file:"+serial,
		"-smbios", "type=1,serial="+HotplugSerial, "-monitor", "unix:"+monitor+",server,nowait",
		"-drive", "file="+disk+",format=raw,if=virtio,cache=unsafe")
	cmd.Env = append(os.Environ(), "TMPDIR="+dir)
	if out, err := cmd.StdoutPipe(); err == nil {
		go func() { _, _ = io.Copy(io.Discard, out) }()
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	waitFor := func(want string) {
		t.Helper()
		for ctx.Err() == nil {
			if b, _ := os.ReadFile(serial); bytes.Contains(b, []byte(want)) {
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		b, _ := os.ReadFile(serial)
		t.Fatalf("no %q on the console; it printed:\n%s", want, b)
	}
	waitFor("DISKPIPE-DISK disk=vda size=67108864 marker=" + Marker)
	c, err := net.Dial("unix", monitor)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "drive_add 0 if=none,id=hp,file=%s,format=raw\ndevice_add virtio-blk-pci,drive=hp,id=hp\n", extra)
	waitFor("DISKPIPE-DISK disk=vdb size=1048576 marker=hot-plugged")
}
