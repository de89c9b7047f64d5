// Package bootdisk makes a tiny disk that boots, from Debian packages only, and boots disks
// under QEMU (TCG, no KVM) to check them: the tests' oracle for "KubeVirt would boot this".
//
// The disk (Build, make bootdisk) is a raw 64 MiB disk: an MBR with syslinux's boot code and
// one FAT16 partition from 1 MiB holding syslinux, Debian's kernel (linux-image-amd64) and an
// initramfs of busybox (busybox-static) and the virtio modules. A marker line sits in the gap
// before the partition, at 32 KiB. The init prints a line to the serial console for the disk
// it booted from (the first that holds a marker),
//
//	DISKPIPE-BOOT disk=vda size=<bytes the guest sees> marker=<the marker>
//
// then one for each of the VM's virtio disks (DISKPIPE-DISK disk=vdb size=... marker=...), and
// powers off; a machine whose SMBIOS serial is HotplugSerial first watches for hot-plugged
// disks and prints a line for each. Boot runs qemu-system-x86_64 with the disk on a virtio
// bus (as KubeVirt's disks are), -snapshot (the disk is never written) and the serial console
// to a file, and parses that line.
package bootdisk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// Size is the bootable disk's size; MarkerOffset is where its marker line is.
const (
	Size         = 64 << 20
	MarkerOffset = 32 << 10
	// Marker is the marker Build writes.
	Marker = "diskpipe-bootdisk-v1"
)

// Guest is what a booted disk said on its serial console.
type Guest struct {
	// Disk is the guest's name of the disk (vda), Size its size in bytes as the guest sees it.
	Disk string
	Size int64
	// Marker is the marker line read from the disk.
	Marker string
	// Took is the time from QEMU's start to the line.
	Took time.Duration
	// Serial is everything the console printed.
	Serial string
}

var (
	// The marker's characters are few, so that a console message that still cuts in after it
	// cannot be read as part of it; the character after it says the line is whole, not half
	// written when the console file is read.
	line = regexp.MustCompile(`DISKPIPE-BOOT disk=([a-z]+) size=(\d+) marker=([A-Za-z0-9._-]*)[^A-Za-z0-9._-]`)
	// stopped is what a guest that will never say the line prints: the BIOS finding nothing
	// to boot, syslinux or the kernel's decompressor failing, a panic.
	stopped = regexp.MustCompile(`System halted|Kernel panic[^\n]*|No bootable device|Boot failed[^\n]*|Could not find kernel image[^\n]*|Missing operating system|Operating system load error`)
)

// Boot boots disk (format raw or qcow2, or any format qemu reads) under TCG and returns what
// the guest said, or an error that holds the serial console's last lines when it said nothing
// within timeout.
func Boot(ctx context.Context, disk, format string, timeout time.Duration) (*Guest, error) {
	if _, err := os.Stat(disk); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "diskpipe-boot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	serial := filepath.Join(dir, "serial.log")
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", //nolint:gosec // the test's own arguments
		"-machine", "pc,accel=tcg", "-m", "256", "-smp", "1", "-nodefaults", "-display", "none",
		"-no-reboot", "-snapshot", "-serial", "file:"+serial,
		"-drive", fmt.Sprintf("file=%s,format=%s,if=virtio,cache=unsafe", disk, format))
	cmd.Env = append(os.Environ(), "TMPDIR="+dir) // -snapshot's overlay
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	var qemuErr error
	exited := make(chan struct{})
	go func() { qemuErr = cmd.Wait(); close(exited) }()
	// Watch the console: the line ends the wait, and so does a guest that stopped for good
	// (a kernel that cannot unpack itself halts rather than powering off).
	var console []byte
	var m [][]byte
	failed := ""
watch:
	for {
		select {
		case <-exited:
			console, _ = os.ReadFile(serial) //nolint:gosec // ours
			m = line.FindSubmatch(console)
			break watch
		case <-time.After(100 * time.Millisecond):
		}
		console, _ = os.ReadFile(serial) //nolint:gosec // ours
		if m = line.FindSubmatch(console); m != nil {
			select { // let it power off; it has said what it had to
			case <-exited:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			break watch
		}
		if f := stopped.Find(console); f != nil {
			failed = string(f)
			_ = cmd.Process.Kill()
			<-exited
			break watch
		}
	}
	g := &Guest{Serial: string(console), Took: time.Since(start)}
	if m == nil {
		why := "it said nothing of itself"
		switch {
		case failed != "":
			why = fmt.Sprintf("the guest stopped (%q)", failed)
		case ctx.Err() != nil:
			why = fmt.Sprintf("no boot line within %s", timeout)
		case qemuErr != nil:
			why = fmt.Sprintf("qemu: %v: %s", qemuErr, bytes.TrimSpace(out.Bytes()))
		}
		return g, fmt.Errorf("%s did not boot: %s; the console's end:\n%s", disk, why, tail(console, 15))
	}
	g.Disk, g.Marker = string(m[1]), string(m[3])
	g.Size, _ = strconv.ParseInt(string(m[2]), 10, 64)
	return g, nil
}

// Check boots disk and checks the guest saw a disk of size bytes with the marker.
func Check(ctx context.Context, disk, format string, size int64) (*Guest, error) {
	g, err := Boot(ctx, disk, format, 2*time.Minute)
	if err != nil {
		return g, err
	}
	var errs []error
	if g.Size != size {
		errs = append(errs, fmt.Errorf("the guest saw a disk of %d bytes, want %d", g.Size, size))
	}
	if g.Marker != Marker {
		errs = append(errs, fmt.Errorf("the guest read the marker %q, want %q", g.Marker, Marker))
	}
	return g, errors.Join(errs...)
}

func tail(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
