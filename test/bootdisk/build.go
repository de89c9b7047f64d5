package bootdisk

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// HotplugSerial is the SMBIOS serial (KubeVirt's spec.domain.firmware.serial) that keeps the
// guest up for hotplugWatchSeconds, printing a line for each disk that appears.
const (
	HotplugSerial       = "diskpipe-hotplug"
	hotplugWatchSeconds = "300"
)

// The recipe. Changing any of it changes the disk; make bootdisk rebuilds it when this file
// changes.
const (
	partitionStart = 2048 // sectors: the partition starts at 1 MiB
	// The init reads the marker at sector 64 (MarkerOffset).
	syslinuxConfig = `DEFAULT linux
PROMPT 0
TIMEOUT 0
SERIAL 0 115200
LABEL linux
  KERNEL /vmlinuz
  INITRD /initrd.gz
  APPEND console=ttyS0,115200 earlyprintk=serial,ttyS0,115200 panic=-1 rdinit=/init
`
	// The init loads the virtio modules, prints the boot line for the first disk that holds a
	// marker (the one it booted from; vda when none does) and a line for each disk, and
	// powers off. A machine whose SMBIOS serial is HotplugSerial stays up for hotplugWatchSeconds
	// instead, printing a line for each disk that appears (a hot-plugged one), then powers off.
	initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci virtio_blk; do
  insmod /lib/modules/$m.ko
done
i=0
while [ ! -e /sys/block/vda/size ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
sleep 0.3 # a VM's other virtio disks are probed beside vda
dmesg -n 1 # the kernel's own messages would cut into the line on the console
probe() { # sets size_<disk> and marker_<disk>
  size=$(( $(cat /sys/block/$1/size) * 512 ))
  marker=$(dd if=/dev/$1 bs=512 skip=64 count=1 2>/dev/null | tr -d '\000' | head -n 1 | tr -cd 'A-Za-z0-9._-')
  eval "size_$1=$size marker_$1=$marker"
}
say() { eval "echo \"DISKPIPE-$1 disk=$2 size=\$size_$2 marker=\$marker_$2\""; }
boot=vda
disks=
for d in /sys/block/vd*; do
  n=${d##*/}
  probe $n
  if [ -n "$marker" ] && [ -z "$found" ]; then boot=$n; found=1; fi
  disks="$disks $n"
done
say BOOT $boot
for n in $disks; do say DISK $n; done
if [ "$(cat /sys/class/dmi/id/product_serial 2>/dev/null)" = "` + HotplugSerial + `" ]; then
  i=0
  while [ $i -lt ` + hotplugWatchSeconds + ` ]; do
    for d in /sys/block/vd*; do
      n=${d##*/}
      case " $disks " in *" $n "*) continue;; esac
      [ "$(cat $d/size)" != 0 ] || continue
      probe $n
      say DISK $n
      disks="$disks $n"
    done
    sleep 1
    i=$((i+1))
  done
fi
poweroff -f
`
)

// modules are the kernel modules the init loads, in order, from the kernel package.
var modules = []string{
	"drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio.ko", "drivers/virtio/virtio_pci_modern_dev.ko",
	"drivers/virtio/virtio_pci_legacy_dev.ko", "drivers/virtio/virtio_pci.ko", "drivers/block/virtio_blk.ko",
}

// Build makes the bootable disk in dir (disk.raw, and disk.qcow2 and disk.vmdk by qemu-img)
// from Debian's linux-image-amd64 and busybox-static, fetched with apt-get download into
// dir/debs (never installed), syslinux and mtools. It needs no root and mounts nothing.
func Build(ctx context.Context, dir string) error {
	debs := filepath.Join(dir, "debs")
	root := filepath.Join(dir, "root")
	if err := os.MkdirAll(debs, 0o750); err != nil {
		return err
	}
	if err := fetch(ctx, debs); err != nil {
		return err
	}
	_ = os.RemoveAll(root)
	defer os.RemoveAll(root) // the packages' files: what the disk needs is read from them below
	entries, err := os.ReadDir(debs)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".deb") {
			if err := run(ctx, "dpkg-deb", "-x", filepath.Join(debs, e.Name()), root); err != nil {
				return err
			}
		}
	}
	kernels, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(kernels) != 1 {
		return fmt.Errorf("want one kernel in the linux-image package, found %d", len(kernels))
	}
	release := strings.TrimPrefix(filepath.Base(kernels[0]), "vmlinuz-")
	initrd, err := initramfs(filepath.Join(root, "bin", "busybox"), filepath.Join(root, "lib", "modules", release, "kernel"))
	if err != nil {
		return err
	}
	kernel, err := os.ReadFile(kernels[0])
	if err != nil {
		return err
	}
	ldlinux, err := os.ReadFile("/usr/lib/syslinux/modules/bios/ldlinux.c32")
	if err != nil {
		return err
	}
	files := []file{{"vmlinuz", kernel}, {"initrd.gz", initrd}, {"ldlinux.c32", ldlinux}, {"syslinux.cfg", []byte(syslinuxConfig)}}
	raw := filepath.Join(dir, "disk.raw")
	tmp := raw + ".new"
	if err := image(ctx, tmp, files); err != nil {
		return err
	}
	if err := os.Rename(tmp, raw); err != nil {
		return err
	}
	for format, opts := range map[string][]string{"qcow2": nil, "vmdk": {"-o", "subformat=streamOptimized"}} {
		out := filepath.Join(dir, "disk."+format)
		args := append(append([]string{"convert", "-f", "raw", "-O", format}, opts...), raw, out)
		if err := run(ctx, "qemu-img", args...); err != nil {
			return err
		}
	}
	return nil
}

// fetch downloads the kernel and busybox packages unless dir has them.
func fetch(ctx context.Context, dir string) error {
	if have, _ := filepath.Glob(filepath.Join(dir, "linux-image-*-amd64_*.deb")); len(have) > 0 {
		if bb, _ := filepath.Glob(filepath.Join(dir, "busybox-static_*.deb")); len(bb) > 0 {
			return nil
		}
	}
	kernel, err := kernelPackage(ctx)
	if err != nil {
		// apt's lists may be missing (a machine whose packages came installed): fetch them once.
		if uerr := run(ctx, "apt-get", "update", "-qq"); uerr != nil {
			return fmt.Errorf("%w; apt-get update: %w", err, uerr)
		}
		if kernel, err = kernelPackage(ctx); err != nil {
			return err
		}
	}
	cmd := exec.CommandContext(ctx, "apt-get", "download", kernel, "busybox-static")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s busybox-static (hack/setup.sh makes apt ready): %w: %s", kernel, err, out)
	}
	return nil
}

// kernelPackage is the kernel package linux-image-amd64, a meta package, depends on.
func kernelPackage(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-amd64").Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends linux-image-amd64: %w", err)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("linux-image-amd64 names no kernel package: %s", out)
}

// image writes the raw disk: MBR with syslinux's boot code and one active FAT16 partition,
// the marker in the gap before it, the files in it, and syslinux installed.
type file struct {
	name string
	data []byte
}

func image(ctx context.Context, path string, files []file) error {
	f, err := os.Create(path) //nolint:gosec // ours
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(Size); err != nil {
		return err
	}
	mbr, err := os.ReadFile("/usr/lib/syslinux/mbr/mbr.bin")
	if err != nil {
		return err
	}
	sector := make([]byte, 512)
	copy(sector, mbr[:min(len(mbr), 440)])
	entry := sector[446:462]
	entry[0] = 0x80 // active
	entry[4] = 0x0e // FAT16, LBA
	binary.LittleEndian.PutUint32(entry[8:], partitionStart)
	binary.LittleEndian.PutUint32(entry[12:], Size/512-partitionStart)
	copy(entry[1:4], []byte{0xfe, 0xff, 0xff}) // CHS: beyond reach, LBA is used
	copy(entry[5:8], []byte{0xfe, 0xff, 0xff})
	sector[510], sector[511] = 0x55, 0xaa
	if _, err := f.WriteAt(sector, 0); err != nil {
		return err
	}
	if _, err := f.WriteAt([]byte(Marker+"\n"), MarkerOffset); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	blocks := (Size - partitionStart*512) / 1024
	if err := run(ctx, "mkfs.vfat", "-F", "16", "-n", "DISKPIPE", "--offset", fmt.Sprint(partitionStart), path, fmt.Sprint(blocks)); err != nil {
		return err
	}
	img := fmt.Sprintf("%s@@%d", path, partitionStart*512)
	dir, err := os.MkdirTemp("", "bootdisk-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, f.data, 0o600); err != nil {
			return err
		}
		if err := run(ctx, "mcopy", "-i", img, p, "::"+f.name); err != nil {
			return err
		}
	}
	return run(ctx, "syslinux", "--install", "--offset", fmt.Sprint(partitionStart*512), path)
}

// initramfs is a gzipped newc cpio: busybox, the init, the modules, and /dev/console so that
// the init's output reaches the serial console before devtmpfs is mounted.
func initramfs(busybox, moduleDir string) ([]byte, error) {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	w := &cpio{w: gz}
	for _, d := range []string{"bin", "dev", "proc", "sys", "lib", "lib/modules"} {
		w.dir(d)
	}
	w.device("dev/console", 5, 1)
	bb, err := os.ReadFile(busybox) //nolint:gosec // the package's file
	if err != nil {
		return nil, err
	}
	w.file("bin/busybox", 0o755, bb)
	w.file("init", 0o755, []byte(initScript))
	for _, m := range modules {
		data, err := os.ReadFile(filepath.Join(moduleDir, m)) //nolint:gosec // the package's file
		if err != nil {
			return nil, err
		}
		w.file("lib/modules/"+filepath.Base(m), 0o644, data)
	}
	w.trailer()
	if w.err != nil {
		return nil, w.err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// KernelOffset is where the kernel (a bzImage: "HdrS" at 0x202 of its first sector) starts in
// a raw disk made by Build, for a test that corrupts it on purpose.
func KernelOffset(raw string) (int64, error) {
	f, err := os.Open(raw) //nolint:gosec // the test's disk
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sector := make([]byte, 1024) // the boot sector and the setup header after it
	for off := int64(partitionStart * 512); off+1024 <= Size; off += 512 {
		if _, err := f.ReadAt(sector, off); err != nil {
			return 0, err
		}
		if string(sector[0x202:0x206]) == "HdrS" && sector[0x1fe] == 0x55 && sector[0x1ff] == 0xaa {
			return off, nil
		}
	}
	return 0, fmt.Errorf("%s holds no kernel", raw)
}
