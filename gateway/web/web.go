// Package web is the console's pages: a Preact application in src/, built by `make web`
// (esbuild, at the versions package-lock.json pins) into dist/, which the gateway's binary
// holds. Nothing is fetched when a page loads: every script, style and the hashing WASM are
// the gateway's own files.
package web

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed all:dist
var dist embed.FS

// policy is the pages' Content-Security-Policy: nothing but the gateway's own files run or
// are called ('wasm-unsafe-eval' lets the page compile its hashing WASM, nothing else).
const policy = "default-src 'none'; script-src 'self' 'wasm-unsafe-eval'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'self'"

// Built says whether the pages were built into this binary (make web), not only its placeholder.
func Built() bool {
	_, err := fs.Stat(dist, "dist/index.html")
	return err == nil
}

// Handler serves the pages; without them built, a page that says how to build them.
func Handler() http.Handler {
	sub, _ := fs.Sub(dist, "dist")
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", policy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		if !Built() {
			http.Error(w, "the console's pages were not built into this gateway: build it with `make web build`", http.StatusNotFound)
			return
		}
		if r.URL.Path == "/" || r.URL.Path == "/index.html" {
			h.Set("Cache-Control", "no-cache") // the page names its assets by their hash
		} else if strings.HasPrefix(r.URL.Path, "/assets/") {
			h.Set("Cache-Control", "public, max-age=31536000, immutable")
		}
		files.ServeHTTP(w, r)
	})
}
