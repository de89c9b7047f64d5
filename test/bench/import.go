package main

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// benchImport imports a 4 GiB qcow2 (plain and with compressed clusters) served by Debian's
// nginx on 127.0.0.1 (sendfile, Range) into a raw file, beside curl fetching the same URL to
// /dev/null and qemu-img converting the same file locally. Each contender runs BENCH_RUNS
// times (default 3) from a cold page cache; the medians are compared.
//
// Each image is served from two places (BENCH_SOURCE=disk or memory runs one): from the
// project's bin/bench, on the disk the import writes, and from a copy in memory (/dev/shm), as
// a mirror holding a popular image hot serves it. This machine has one virtual disk with one
// queue: served from it, the mirror's reads and the import's writes take turns on it, which
// no import from a mirror on another machine pays, and curl and unflushed qemu-img, which
// write nothing to the disk while timed, do not pay either. The disk's own floor is measured
// beside them: reading the image and writing the import's bytes durably (dd conv=fdatasync)
// at once.
func benchImport(root, work string) error {
	raw, importer, err := fixture(root, work)
	if err != nil {
		return err
	}
	// The in-memory copies are served through a link in the directory nginx serves.
	mem, err := os.MkdirTemp("/dev/shm", "diskpipe-bench-")
	if err != nil {
		return fmt.Errorf("a directory in memory for the served images: %w", err)
	}
	defer os.RemoveAll(mem)
	memLink := filepath.Join(work, "memory")
	_ = os.Remove(memLink)
	if err := os.Symlink(mem, memLink); err != nil {
		return err
	}
	defer os.Remove(memLink)
	srv, err := startNginx(work)
	if err != nil {
		return err
	}
	defer srv.Stop()
	runs := benchRuns()

	fmt.Printf("bench-import: source %s: %.2f GiB virtual, %.2f GiB of data; served by nginx, median of %d cold runs\n", raw,
		float64(fileSize(raw))/(1<<30), float64(allocated(raw))/(1<<30), runs)
	for _, v := range []struct {
		name string
		args []string
	}{
		{"qcow2", []string{"-O", "qcow2"}},
		{"qcow2 compressed", []string{"-O", "qcow2", "-c"}},
	} {
		if !benchOnly(v.name) {
			continue
		}
		img := filepath.Join(work, "rootfs-"+map[bool]string{false: "plain", true: "compressed"}[len(v.args) == 3]+".qcow2")
		if err := convertOnce(raw, img, v.args...); err != nil {
			return err
		}
		// qemu-img's output is the disk every import is compared with: made once up front.
		ref := filepath.Join(work, "qemu-img.raw")
		if err := sh("qemu-img", "convert", "-O", "raw", img, ref); err != nil {
			return err
		}
		b := importBench{srv: srv, importer: importer, runs: runs, work: work, ref: ref,
			refBytes: allocated(ref), baseline: os.Getenv("BENCH_BASELINE")}
		name := filepath.Base(img)
		for _, source := range []struct {
			name, label, path, url string
			onDisk                 bool
		}{
			{"disk", "the disk the import writes (bin/bench)", img, srv.URL + name, true},
			{"memory", "memory (/dev/shm)", filepath.Join(mem, name), srv.URL + "memory/" + name, false},
		} {
			if only := os.Getenv("BENCH_SOURCE"); only != "" && only != source.name {
				continue
			}
			if !source.onDisk {
				if err := sh("cp", img, source.path); err != nil {
					return err
				}
			}
			fmt.Printf("\n%s: %s, %.2f GiB file (%d bytes), served from %s\n", v.name, name,
				float64(fileSize(img))/(1<<30), fileSize(img), source.label)
			err := b.rounds(source.path, source.url, source.onDisk)
			if !source.onDisk {
				_ = os.Remove(source.path)
			}
			if err != nil {
				return err
			}
		}
		_ = os.Remove(ref)
	}
	return benchCompressed(importBench{srv: srv, importer: importer, runs: runs, work: work}, raw, mem)
}

// importBench times the importer against its references for one served image.
type importBench struct {
	srv      *nginx
	importer string
	runs     int
	work     string
	ref      string // qemu-img's conversion: every import must equal it
	refBytes int64  // the bytes it holds
	// baseline names another build of the importer (BENCH_BASELINE, say of the commit
	// before a change), run in each round too.
	baseline string
}

// rounds runs every contender b.runs times, serving img (at path) at url, and prints the
// medians and each round's ratios. onDisk says the image is read from the disk the import
// writes.
func (b importBench) rounds(path, url string, onDisk bool) error {
	size := fileSize(path)
	out := filepath.Join(b.work, "imported.raw")
	ref := filepath.Join(b.work, "qemu-img-timed.raw")
	defer os.Remove(out)
	defer os.Remove(ref)
	// qemu-img convert leaves its output in the page cache (its default cache mode for the
	// target ignores flushes); the importer's disk is on stable storage when it ends, as
	// qemu-img's is with -t writeback (its fdatasync at the end), the way CDI runs it.
	var curl, qemu, qemuFlushed, floor, ours, base []measurement
	floorFile := filepath.Join(b.work, "floor.raw")
	var curlServed, oursServed int64
	var curlReqs, oursReqs int
	// importOnce runs an importer build into out from a cold page cache and checks its
	// disk against qemu-img's conversion; what nginx served it is read by the caller.
	importOnce := func(name, bin string) (measurement, error) {
		_ = os.Remove(out)
		dropCaches()
		b.srv.Read()
		args := importerArgs(url, out)
		if bin == b.importer || knowsFlag(bin, "allow-destination") {
			// nginx listens on loopback, which importers refuse unless told (builds before the
			// egress rule know no such flag, so such a baseline runs without it).
			args = append(args, "--allow-destination", "127.0.0.1")
		}
		m, err := timed(name, size, bin, args...)
		if err != nil {
			return m, err
		}
		if err := sh("qemu-img", "compare", "-f", "raw", "-F", "raw", b.ref, out); err != nil {
			return m, fmt.Errorf("%s: the import differs from qemu-img's conversion: %w", name, err)
		}
		return m, nil
	}
	// The contenders in the order they run in a round, each appending to its own list.
	// On this VM what one process leaves behind sets what the next one's page cache costs
	// (qemu-img's CPU for the same conversion was 0.6 s after qemu-img -t writeback, 2.7-3.0 s
	// after the importer, 3.8-4.7 s after curl or after itself), so the order turns by one
	// each round: no contender always follows the same one.
	type contender struct {
		into *[]measurement
		run  func() (measurement, error)
	}
	// convert times qemu-img converting the local file into ref, from a cold page cache.
	convert := func(name string, cache ...string) func() (measurement, error) {
		return func() (measurement, error) {
			_ = os.Remove(ref)
			dropCaches()
			return timed(name, size, "qemu-img", slices.Concat([]string{"convert"}, cache, []string{"-O", "raw", path, ref})...)
		}
	}
	// What the disk takes to hold the import's data on stable storage: dd writing as many
	// bytes as qemu-img's conversion holds, then fdatasync, and, when the image is on the same
	// disk, reading the image at the same time. A durable import cannot end sooner;
	// unflushed qemu-img and curl need not wait for it.
	floorName, floorCmd := "dd conv=fdatasync (the disk alone)", "exec dd if=/dev/zero of=\"$1\" bs=1M count=$2 conv=fdatasync status=none"
	if onDisk {
		floorName = "dd conv=fdatasync + cat (the disk)"
		floorCmd = "cat \"$3\" >/dev/null & dd if=/dev/zero of=\"$1\" bs=1M count=$2 conv=fdatasync status=none && wait $!"
	}
	contenders := []contender{
		{&curl, func() (measurement, error) {
			dropCaches()
			b.srv.Read()
			m, err := timed("curl -o /dev/null", size, "curl", "-sSf", "-o", "/dev/null", url)
			curlReqs, curlServed = b.srv.Read()
			return m, err
		}},
		{&qemu, convert("qemu-img convert -O raw (local)")},
		{&qemuFlushed, convert("qemu-img convert -t writeback", "-t", "writeback")},
		{&ours, func() (measurement, error) {
			m, err := importOnce("diskpipe importer (HTTP, Range)", b.importer)
			// The round nginx sent the most in: a byte read twice in any round shows.
			if reqs, served := b.srv.Read(); served > oursServed {
				oursReqs, oursServed = reqs, served
			}
			return m, err
		}},
		{&floor, func() (measurement, error) {
			_ = os.Remove(floorFile)
			dropCaches()
			m, err := timed(floorName, size, "sh", "-c", floorCmd, "floor", floorFile, strconv.FormatInt(b.refBytes>>20, 10), path)
			_ = os.Remove(floorFile)
			return m, err
		}},
	}
	if b.baseline != "" {
		contenders = append(contenders, contender{&base, func() (measurement, error) {
			return importOnce("baseline importer ($BENCH_BASELINE)", b.baseline)
		}})
	}
	for round := range b.runs {
		for i := range contenders {
			c := contenders[(round+i)%len(contenders)]
			m, err := c.run()
			if err != nil {
				return err
			}
			*c.into = append(*c.into, m)
		}
	}
	c, q, qf, o := median(curl), median(qemu), median(qemuFlushed), median(ours)
	for _, m := range []measurement{c, q, qf, median(floor), o} {
		fmt.Println("  " + m.String())
	}
	if len(base) > 0 {
		fmt.Println("  " + median(base).String())
	}
	refWall := max(c.wall, q.wall)
	fmt.Printf("  nginx served curl %d bytes in %d request(s), the importer at most %d bytes in %d request(s) in a round (%.3f× the file)\n",
		curlServed, curlReqs, oursServed, oursReqs, float64(oursServed)/float64(size))
	fmt.Printf("  our wall / max(curl, qemu-img) = %.2f (target <= 1.0); against max(curl, qemu-img flushed) = %.2f; "+
		"against the disk's floor %.2f; our CPU / qemu-img's = %.2f; peak RSS %.0f MiB (target <= 64); wrote %.2f GiB, identical by qemu-img compare\n",
		o.wall.Seconds()/refWall.Seconds(), o.wall.Seconds()/max(c.wall, qf.wall).Seconds(), o.wall.Seconds()/median(floor).wall.Seconds(),
		o.cpu.Seconds()/q.cpu.Seconds(), float64(o.peakRSS)/(1<<20), float64(allocated(out))/(1<<30))
	// A shared machine's pace drifts between rounds; the contenders of one round ran
	// minutes apart at most, so each round's own ratio is the steadier figure.
	fmt.Printf("  each round's ratio against max(curl, qemu-img): %s; against max(curl, qemu-img flushed): %s; against the disk's floor: %s\n",
		roundRatios(ours, curl, qemu), roundRatios(ours, curl, qemuFlushed), roundRatios(ours, floor))
	// The target's references leave their output unflushed (qemu-img) or write none (curl).
	// qemu-img -t writeback converting the local file, no network at all, against the same
	// references shows what a conversion that ends on stable storage reaches in each round;
	// the same qemu-img's CPU, round by round, how dear the page cache was.
	fmt.Printf("  each round against max(curl, qemu-img): qemu-img flushed (local, no network) %s; the disk's floor %s\n",
		roundRatios(qemuFlushed, curl, qemu), roundRatios(floor, curl, qemu))
	fmt.Printf("  each round's CPU: qemu-img %s; ours %s\n", cpuTimes(qemu), cpuTimes(ours))
	if len(base) > 0 {
		fmt.Printf("  each round's wall against the baseline importer's: %s\n", roundRatios(ours, base))
	}
	return nil
}

// median is the run with the median wall time.
func median(ms []measurement) measurement {
	s := slices.Clone(ms)
	slices.SortFunc(s, func(a, b measurement) int { return cmp.Compare(a.wall, b.wall) })
	return s[len(s)/2]
}

// importerArgs imports url into the raw file out, as the benchmark's importer runs.
func importerArgs(url, out string) []string {
	return []string{"--url", url, "--target", out, "--capacity", "5368709120",
		"--metrics-addr", "", "--termination-message-path", "", "--progress-interval", "1h"}
}

// roundRatios lists, for each round, ours' wall time over the largest of the references'.
func roundRatios(ours []measurement, refs ...[]measurement) string {
	var out []string
	for i := range ours {
		var ref time.Duration
		for _, r := range refs {
			ref = max(ref, r[i].wall)
		}
		out = append(out, fmt.Sprintf("%.2f", ours[i].wall.Seconds()/ref.Seconds()))
	}
	return strings.Join(out, " ")
}

// cpuTimes lists each run's CPU time, in seconds.
func cpuTimes(ms []measurement) string {
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%.2f", m.cpu.Seconds()))
	}
	return strings.Join(out, " ")
}

// knowsFlag says whether an importer build lists --name in its usage.
func knowsFlag(bin, name string) bool {
	out, _ := exec.Command(bin, "--help").CombinedOutput() //nolint:gosec // a build named by the user
	return strings.Contains(string(out), "-"+name)
}

// fixture is the benchmarks' disk (fsImage) and the importer binary that make build made.
func fixture(root, work string) (raw, importer string, err error) {
	if raw, err = fsImage(work); err != nil {
		return "", "", err
	}
	importer = filepath.Join(root, "bin", "importer")
	if _, err := os.Stat(importer); err != nil {
		return "", "", fmt.Errorf("%s: run 'make build' first: %w", importer, err)
	}
	return raw, importer, nil
}

// benchOnly says whether the row name runs: BENCH_ONLY, if set, lists the rows to run, with
// commas.
func benchOnly(name string) bool {
	only := os.Getenv("BENCH_ONLY")
	return only == "" || slices.Contains(strings.Split(only, ","), name)
}

// benchRuns is the rounds of each benchmark: BENCH_RUNS, else 3.
func benchRuns() int {
	if v, err := strconv.Atoi(os.Getenv("BENCH_RUNS")); err == nil && v > 0 {
		return v
	}
	return 3
}
