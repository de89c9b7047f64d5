// Package repo finds the diskpipe checkout the tests and the harness run in.
package repo

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"sync"
)

// Root is the root of the diskpipe checkout: the directory of diskpipe's go.mod at or above the
// working directory (a test runs in its package's directory, the Makefile's commands in the
// root). The Makefile builds with -trimpath, so a source file's own path is not at hand; a
// build without it, run elsewhere, falls back to that path.
func Root() string {
	once.Do(func() {
		if dir, err := os.Getwd(); err == nil {
			for d := dir; ; d = filepath.Dir(d) {
				if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(b, []byte(module+"\n")) {
					root = d
					return
				}
				if filepath.Dir(d) == d {
					break
				}
			}
		}
		_, file, _, _ := runtime.Caller(0)
		root = filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	})
	return root
}

const module = "module github.com/diskpipe/diskpipe"

var (
	once sync.Once
	root string
)
