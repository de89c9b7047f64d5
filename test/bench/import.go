package main

import (
	"cmp"
	"fmt"
	"os"
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
func benchImport(root, work string) error {
	raw, err := fsImage(work)
	if err != nil {
		return err
	}
	importer := filepath.Join(root, "bin", "importer")
	if _, err := os.Stat(importer); err != nil {
		return fmt.Errorf("%s: run 'make build' first: %w", importer, err)
	}
	srv, err := startNginx(work)
	if err != nil {
		return err
	}
	defer srv.Stop()
	// BENCH_BASELINE names another build of the importer (say, of the commit before a
	// change), run right before ours in each round.
	baseline := os.Getenv("BENCH_BASELINE")
	runs := 3
	if v, err := strconv.Atoi(os.Getenv("BENCH_RUNS")); err == nil && v > 0 {
		runs = v
	}

	fmt.Printf("bench-import: source %s: %.2f GiB virtual, %.2f GiB of data; served by nginx, median of %d cold runs\n", raw,
		float64(fileSize(raw))/(1<<30), float64(allocated(raw))/(1<<30), runs)
	for _, v := range []struct {
		name string
		args []string
	}{
		{"qcow2", []string{"-O", "qcow2"}},
		{"qcow2 compressed", []string{"-O", "qcow2", "-c"}},
	} {
		if only := os.Getenv("BENCH_ONLY"); only != "" && only != v.name {
			continue
		}
		img := filepath.Join(work, "rootfs-"+map[bool]string{false: "plain", true: "compressed"}[len(v.args) == 3]+".qcow2")
		if err := convertOnce(raw, img, v.args...); err != nil {
			return err
		}
		url := srv.URL + filepath.Base(img)
		out := filepath.Join(work, "imported.raw")
		ref := filepath.Join(work, "qemu-img.raw")
		size := fileSize(img)

		fmt.Printf("\n%s: %s, %.2f GiB file (%d bytes)\n", v.name, filepath.Base(img), float64(size)/(1<<30), size)
		// qemu-img convert leaves its output in the page cache (its default cache mode for the
		// target ignores flushes); the importer's disk is on stable storage when it ends, as
		// qemu-img's is with -t writeback (its fdatasync at the end), the way CDI runs it.
		var curl, qemu, qemuFlushed, floor, ours, base []measurement
		floorFile := filepath.Join(work, "floor.raw")
		var curlServed, oursServed int64
		var curlReqs, oursReqs int
		// importOnce runs an importer build into out from a cold page cache and checks its
		// disk against qemu-img's conversion; what nginx served it is read by the caller.
		importOnce := func(name, bin string) (measurement, error) {
			_ = os.Remove(out)
			dropCaches()
			srv.Read()
			m, err := timed(name, size, bin, importerArgs(url, out)...)
			if err != nil {
				return m, err
			}
			if err := sh("qemu-img", "compare", "-f", "raw", "-F", "raw", ref, out); err != nil {
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
				return timed(name, size, "qemu-img", slices.Concat([]string{"convert"}, cache, []string{"-O", "raw", img, ref})...)
			}
		}
		contenders := []contender{
			{&curl, func() (measurement, error) {
				dropCaches()
				srv.Read()
				m, err := timed("curl -o /dev/null", size, "curl", "-sSf", "-o", "/dev/null", url)
				curlReqs, curlServed = srv.Read()
				return m, err
			}},
			{&qemu, convert("qemu-img convert -O raw (local)")},
			{&qemuFlushed, convert("qemu-img convert -t writeback", "-t", "writeback")},
			{&ours, func() (measurement, error) {
				m, err := importOnce("diskpipe importer (HTTP, Range)", importer)
				// The round nginx sent the most in: a byte read twice in any round shows.
				if reqs, served := srv.Read(); served > oursServed {
					oursReqs, oursServed = reqs, served
				}
				return m, err
			}},
		}
		// What the disk takes to hold the import's data on stable storage, with nothing else to
		// do: dd writing as many bytes as qemu-img's conversion holds, then fdatasync. A durable
		// import cannot end sooner; unflushed qemu-img and curl need not wait for it.
		contenders = append(contenders, contender{&floor, func() (measurement, error) {
			_ = os.Remove(floorFile)
			dropCaches()
			m, err := timed("dd conv=fdatasync (the disk alone)", size, "dd", "if=/dev/zero", "of="+floorFile, "bs=1M",
				fmt.Sprintf("count=%d", allocated(ref)>>20), "conv=fdatasync", "status=none")
			_ = os.Remove(floorFile)
			return m, err
		}})
		if baseline != "" { // another build of the importer, measured in the same run
			contenders = append(contenders, contender{&base, func() (measurement, error) {
				return importOnce("baseline importer ($BENCH_BASELINE)", baseline)
			}})
		}
		// qemu-img's output is the disk every import is compared with: made once up front.
		if err := sh("qemu-img", "convert", "-O", "raw", img, ref); err != nil {
			return err
		}
		for round := range runs {
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
			"our CPU / qemu-img's = %.2f; peak RSS %.0f MiB (target <= 160); wrote %.2f GiB, identical by qemu-img compare\n",
			o.wall.Seconds()/refWall.Seconds(), o.wall.Seconds()/max(c.wall, qf.wall).Seconds(),
			o.cpu.Seconds()/q.cpu.Seconds(), float64(o.peakRSS)/(1<<20), float64(allocated(out))/(1<<30))
		// A shared machine's pace drifts between rounds; the contenders of one round ran
		// minutes apart at most, so each round's own ratio is the steadier figure.
		fmt.Printf("  each round's ratio against max(curl, qemu-img): %s; against max(curl, qemu-img flushed): %s\n",
			roundRatios(ours, curl, qemu), roundRatios(ours, curl, qemuFlushed))
		// The target's references leave their output unflushed (qemu-img) or write none (curl).
		// qemu-img -t writeback converting the local file, no network at all, against the same
		// references shows what a conversion that ends on stable storage reaches in each round;
		// the same qemu-img's CPU, round by round, how dear the page cache was.
		fmt.Printf("  each round against max(curl, qemu-img): qemu-img flushed (local, no network) %s; the disk alone %s\n",
			roundRatios(qemuFlushed, curl, qemu), roundRatios(floor, curl, qemu))
		fmt.Printf("  each round's CPU: qemu-img %s; ours %s\n", cpuTimes(qemu), cpuTimes(ours))
		if len(base) > 0 {
			fmt.Printf("  each round's wall against the baseline importer's: %s\n", roundRatios(ours, base))
		}
		_ = os.Remove(out)
		_ = os.Remove(ref)
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
