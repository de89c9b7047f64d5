// Command bench measures diskpipe's data plane against the reference tools in the same run,
// on images with real filesystem content: `go run ./test/bench import` (make bench-import).
//
// Each contender runs as its own process; wall time comes from the clock, peak RSS from the
// kernel's rusage of that process.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bench import|copy|export|upload|restore|controllers")
		os.Exit(64)
	}
	root, _ := filepath.Abs(".")
	work := filepath.Join(root, "bin", "bench")
	if err := os.MkdirAll(work, 0o755); err != nil {
		fail(err)
	}
	var err error
	switch os.Args[1] {
	case "import":
		err = benchImport(root, work)
	case "export":
		err = benchExport(root, work)
	case "copy":
		err = benchCopy(root, work)
	case "controllers":
		err = benchControllers(root)
	case "upload":
		err = benchUpload(root, work)
	case "restore":
		err = benchRestore(root, work)
	default:
		err = fmt.Errorf("unknown benchmark %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

// measurement is one contender's run.
type measurement struct {
	name    string
	wall    time.Duration
	peakRSS int64         // bytes
	bytes   int64         // bytes the contender processed, for MB/s
	written int64         // bytes the process itself wrote to block devices
	cpu     time.Duration // user + system time of the process
}

func (m measurement) String() string {
	mbs := float64(m.bytes) / 1e6 / m.wall.Seconds()
	return fmt.Sprintf("%-34s %8.2f s %9.0f MB/s %7.2f s CPU %8.1f MiB peak RSS", m.name, m.wall.Seconds(), mbs, m.cpu.Seconds(), float64(m.peakRSS)/(1<<20))
}
