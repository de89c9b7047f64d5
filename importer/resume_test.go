package importer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The resume tests kill a real importer process (this test binary, re-run as the importer
// command) with SIGKILL, then run the next one, as a Kubernetes node would.

const (
	childEnv      = "DISKPIPE_IMPORTER_CHILD_ARGS"
	childEveryEnv = "DISKPIPE_IMPORTER_CHILD_CHECKPOINT_EVERY"
	// resumeEvery is the checkpoint interval of these tests: small, so that the bound on what
	// a resumed import reads again is tight.
	resumeEvery = 64 << 20
)

// TestImporterChild is the importer command when run as a resume test's child.
func TestImporterChild(t *testing.T) {
	args := os.Getenv(childEnv)
	if args == "" {
		t.Skip("the importer process of the resume tests")
	}
	if v, err := strconv.ParseInt(os.Getenv(childEveryEnv), 10, 64); err == nil {
		checkpointEvery, checkpointInterval = v, 0 // by size alone, so the bounds below are tight
	}
	code := Main(context.Background(), append(strings.Split(args, "\x1f"), "--allow-destination", loopback), os.Stderr)
	if status, err := os.ReadFile("/proc/self/status"); err == nil { // the peak RSS, for bounded_test.go
		for _, line := range strings.Split(string(status), "\n") {
			if strings.HasPrefix(line, "VmHWM:") {
				fmt.Fprintln(os.Stderr, line)
			}
		}
	}
	os.Exit(code)
}

// importer starts the importer command as a child process.
func startImporter(t *testing.T, url, target string, capacity int64) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	return startImporterArgs(t, "--url", url, "--target", target, "--capacity", strconv.FormatInt(capacity, 10))
}

// startImporterArgs starts the importer command with args, quiet, as a child process.
func startImporterArgs(t *testing.T, args ...string) (*exec.Cmd, *strings.Builder) {
	t.Helper()
	args = append(args, "--metrics-addr", "", "--termination-message-path", "", "--progress-interval", "1h", "--retries", "3")
	cmd := exec.Command(os.Args[0], "-test.run=^TestImporterChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+strings.Join(args, "\x1f"), childEveryEnv+"="+strconv.Itoa(resumeEvery))
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// killAt runs an importer and SIGKILLs it once the server has sent frac of the file.
func killAt(t *testing.T, srv *fileServer, url, target string, capacity int64, frac float64) int64 {
	t.Helper()
	size := fileSizeOf(t, srv.path)
	srv.sent.Store(0)
	cmd, out := startImporter(t, url, target, capacity)
	deadline := time.Now().Add(2 * time.Minute)
	for srv.sent.Load() < int64(frac*float64(size)) {
		if time.Now().After(deadline) {
			t.Fatalf("the importer did not reach %.0f %%:\n%s", frac*100, out)
		}
		time.Sleep(time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	return srv.sent.Load()
}

// finish runs an importer to the end and returns the bytes the server sent it and its log.
func finish(t *testing.T, srv *fileServer, url, target string, capacity int64) (int64, string) {
	t.Helper()
	srv.sent.Store(0)
	cmd, out := startImporter(t, url, target, capacity)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the resumed importer failed: %v\n%s", err, out)
	}
	return srv.sent.Load(), out.String()
}

func fileSizeOf(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// makeBigRaw writes a 2 GiB sparse raw disk with 512 MiB of random data: 32 MiB every 128 MiB.
// That is eight checkpoints' worth (resumeEvery), so that an importer that started over would
// read more than the bounds below allow, and small enough that CI's two cores are not spent
// moving zeros.
func makeBigRaw(t *testing.T, dir string, seed uint64) string {
	t.Helper()
	p := filepath.Join(dir, fmt.Sprintf("big-%d.raw", seed))
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(2 << 30); err != nil {
		t.Fatal(err)
	}
	rng := rand.NewChaCha8([32]byte{byte(seed)})
	buf := make([]byte, 32<<20)
	for off := int64(0); off < 2<<30; off += 128 << 20 {
		_, _ = rng.Read(buf)
		if _, err := f.WriteAt(buf, off+4096); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// servedQcow2 makes a big raw disk and its qcow2, served by a fileServer with Range.
func servedQcow2(t *testing.T, seed uint64) (raw, img string, srv *fileServer, url string) {
	t.Helper()
	raw = makeBigRaw(t, t.TempDir(), seed)
	img = convertTo(t, raw, "qcow2")
	srv = &fileServer{path: img}
	return raw, img, srv, serve(t, srv)
}

// TestResumeAfterKill: a 2 GiB qcow2 import killed at 30, 60 and 90 % goes on in the next
// process from its last checkpoint: the next one reads at most the rest of the file plus one
// checkpoint's worth, and the disk is the image's.
func TestResumeAfterKill(t *testing.T) {
	raw, img, srv, url := servedQcow2(t, 1)
	size := fileSizeOf(t, img)
	slack := int64(resumeEvery + 32<<20) // one checkpoint, plus read-ahead and socket buffers
	for _, frac := range []float64{0.3, 0.6, 0.9} {
		t.Run(fmt.Sprintf("%.0f%%", frac*100), func(t *testing.T) {
			target := filepath.Join(t.TempDir(), "disk.img")
			first := killAt(t, srv, url, target, 5<<30, frac)
			if _, err := os.Stat(target + ".checkpoint"); err != nil {
				t.Fatalf("no checkpoint after %d of %d bytes: %v", first, size, err)
			}
			second, log := finish(t, srv, url, target, 5<<30)
			t.Logf("killed after %d bytes of %d; the next importer read %d (at most %d allowed)", first, size, second, size-first+slack)
			if second > size-first+slack {
				t.Errorf("the next importer read %d bytes; the rest was %d", second, size-first)
			}
			if !strings.Contains(log, "Resuming the import") {
				t.Errorf("the next importer did not resume:\n%s", log)
			}
			sameDisk(t, raw, target)
			if _, err := os.Stat(target + ".checkpoint"); !os.IsNotExist(err) {
				t.Errorf("the checkpoint outlived the import: %v", err)
			}
		})
	}
}

// TestResumeRefused: a checkpoint is trusted only for the same source, unchanged, and intact;
// otherwise the next importer starts over and still makes the right disk.
func TestResumeRefused(t *testing.T) {
	raw, img, srv, url := servedQcow2(t, 2)
	size := fileSizeOf(t, img)
	startsOver := func(t *testing.T, url, target, want string) {
		t.Helper()
		second, log := finish(t, srv, url, target, 5<<30)
		if strings.Contains(log, "Resuming the import") || second < size {
			t.Errorf("the importer trusted the checkpoint (read %d of %d bytes):\n%s", second, size, log)
		}
		sameDisk(t, want, target)
	}

	t.Run("changed source", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "disk.img")
		killAt(t, srv, url, target, 5<<30, 0.5)
		other := makeBigRaw(t, t.TempDir(), 3)
		runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", other, img) // the same URL, a new image
		t.Cleanup(func() { runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, img) })
		size = fileSizeOf(t, img)
		startsOver(t, url, target, other)
	})
	runTool(t, "qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, img)
	size = fileSizeOf(t, img)

	t.Run("corrupt checkpoint", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "disk.img")
		killAt(t, srv, url, target, 5<<30, 0.5)
		b, err := os.ReadFile(target + ".checkpoint")
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)/3] ^= 0x01
		if err := os.WriteFile(target+".checkpoint", b, 0o600); err != nil {
			t.Fatal(err)
		}
		startsOver(t, url, target, raw)
	})

	t.Run("another source's checkpoint", func(t *testing.T) {
		target := filepath.Join(t.TempDir(), "disk.img")
		killAt(t, srv, url, target, 5<<30, 0.5)
		// The same bytes under another name: another source. (The query is not part of a
		// source's name: a presigned URL gets new credentials in each attempt's.)
		startsOver(t, strings.Replace(url, filepath.Base(img), "mirror-copy.img", 1), target, raw)
	})
}

// TestResumeRawAndBlock: a raw image streamed from a server with Range resumes too, and so
// does an import into a block device, whose checkpoint area is zeroed at the end.
func TestResumeRawAndBlock(t *testing.T) {
	dir := t.TempDir()
	raw := makeBigRaw(t, dir, 4)
	size := fileSizeOf(t, raw)
	img := convertTo(t, raw, "qcow2")
	// What the next importer reads again: the bytes since the last checkpoint, and what was
	// read ahead of it by the ranged requests in flight, which under load (CI, beside the real
	// node's suite) was 102 MiB past the checkpoint.
	slack := int64(2*resumeEvery + 32<<20)

	t.Run("raw", func(t *testing.T) {
		srv := &fileServer{path: raw}
		url := serve(t, srv)
		target := filepath.Join(t.TempDir(), "disk.img")
		first := killAt(t, srv, url, target, 5<<30, 0.5)
		second, log := finish(t, srv, url, target, 5<<30)
		if second > size-first+slack || !strings.Contains(log, "Resuming the import") {
			t.Errorf("killed after %d of %d bytes, the next importer read %d:\n%s", first, size, second, log)
		}
		sameDisk(t, raw, target)
	})

	t.Run("block", func(t *testing.T) {
		dev := loopDevice(t, 2<<30+16<<20)
		srv := &fileServer{path: img}
		url := serve(t, srv)
		first := killAt(t, srv, url, dev, 0, 0.6)
		second, log := finish(t, srv, url, dev, 0)
		if isize := fileSizeOf(t, img); second > isize-first+slack || !strings.Contains(log, "Resuming the import") {
			t.Errorf("killed after %d of %d bytes, the next importer read %d:\n%s", first, isize, second, log)
		}
		sameDisk(t, raw, dev) // the 16 MiB past the image, checkpoint area included, must be zeros
	})
}

// TestCheckpointInBackground: a checkpoint is recorded while the import goes on, and whatever
// ends the import waits for it, so that no record outlives a finished or emptied disk and a
// kept disk keeps its record.
func TestCheckpointInBackground(t *testing.T) {
	cp := checkpoint{Source: "http://example.com/disk.qcow2", Identity: "etag \"1\"", Format: "qcow2", VirtualSize: 8 << 20, Done: 4 << 20}
	for _, c := range []struct {
		name string
		end  func(*Target) error
		// kept: the record is there afterwards.
		kept bool
	}{
		{"finished", func(t *Target) error { return t.Finish(8 << 20) }, false},
		{"wiped", (*Target).Wipe, false},
		{"kept", (*Target).Keep, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "disk.img")
			tg, err := OpenTarget(path, 64<<20, DefaultOverhead)
			if err != nil {
				t.Fatal(err)
			}
			if err := tg.Prepare(8 << 20); err != nil {
				t.Fatal(err)
			}
			if _, err := tg.WriteAt([]byte("data"), 0); err != nil {
				t.Fatal(err)
			}
			if err := tg.saveCheckpoint(cp); err != nil {
				t.Fatal(err)
			}
			if err := c.end(tg); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond) // a record still being written would land by now
			_, err = os.Stat(path + ".checkpoint")
			if c.kept {
				reopened, oerr := OpenTarget(path, 64<<20, DefaultOverhead)
				if oerr != nil {
					t.Fatal(oerr)
				}
				defer func() {
					if err := reopened.Keep(); err != nil {
						t.Error(err)
					}
				}()
				if got := reopened.loadCheckpoint(8 << 20); !got.matches(cp.Source, cp.Identity, Format(cp.Format), cp.VirtualSize, -1) || got.Done != cp.Done {
					t.Errorf("the kept disk's checkpoint is %+v, want %+v", got, cp)
				}
				return
			}
			if !os.IsNotExist(err) {
				t.Errorf("a checkpoint is left beside the %s disk (stat: %v)", c.name, err)
			}
		})
	}
}

// TestCheckpointAfter: a checkpoint every 256 MiB, or every 10 s of work at the pace so far
// when that is more; by size alone when the interval is 0.
func TestCheckpointAfter(t *testing.T) {
	for _, c := range []struct {
		name     string
		done     int64
		elapsed  time.Duration
		interval time.Duration
		want     int64
	}{
		{"first", 0, 0, 10 * time.Second, 256 << 20},
		{"slow: 10 MiB/s", 100 << 20, 10 * time.Second, 10 * time.Second, 256 << 20},
		{"fast: 1 GiB/s", 1 << 30, time.Second, 10 * time.Second, 10 << 30},
		{"30 MiB/s, rounded up to 4 MiB", 30 << 20, time.Second, 10 * time.Second, 300 << 20},
		{"30.1 MiB/s", 30<<20 + 100<<10, time.Second, 10 * time.Second, 304 << 20},
		{"by size alone", 1 << 30, time.Second, 0, 256 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func(i time.Duration) { checkpointInterval = i }(checkpointInterval)
			checkpointInterval = c.interval
			if got := checkpointAfter(c.done, c.elapsed); got != c.want {
				t.Errorf("checkpointAfter(%d, %s) = %d MiB, want %d MiB", c.done, c.elapsed, got>>20, c.want>>20)
			}
		})
	}
}
