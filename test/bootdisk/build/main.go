// Command build is make bootdisk: it makes the tests' bootable disk in the directory it is
// given (bin/bootdisk) and boots it once under QEMU to check it.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/diskpipe/diskpipe/test/bootdisk"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: build DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	ctx := context.Background()
	start := time.Now()
	if err := bootdisk.Build(ctx, dir); err != nil {
		fmt.Fprintln(os.Stderr, "bootdisk:", err)
		os.Exit(1)
	}
	g, err := bootdisk.Check(ctx, filepath.Join(dir, "disk.qcow2"), "qcow2", bootdisk.Size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootdisk: the disk made does not boot:", err)
		os.Exit(1)
	}
	fmt.Printf("bootdisk: %s made in %.1f s; it boots under TCG in %.1f s and says: disk=%s size=%d marker=%s\n",
		dir, time.Since(start).Seconds()-g.Took.Seconds(), g.Took.Seconds(), g.Disk, g.Size, g.Marker)
}
