// Package browser starts Debian's Chromium headless for the tests and benchmarks that drive
// the console's pages, as the end-to-end specs and make bench-upload do.
package browser

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/chromedp/chromedp"
)

// Path is Debian's Chromium, which hack/setup.sh installs.
const Path = "/usr/bin/chromium"

// New starts a headless Chromium with a profile of its own in dir (a second one is another
// person): no sandbox (the tests run as root), and none of the background traffic this
// machine's closed network refuses.
func New(dir string) (context.Context, context.CancelFunc, error) {
	if _, err := os.Stat(Path); err != nil {
		return nil, nil, fmt.Errorf("%s is missing: hack/setup.sh installs Debian's chromium (make setup)", Path)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(Path), chromedp.NoSandbox,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-quic", true), chromedp.WindowSize(1440, 900),
		chromedp.UserDataDir(dir))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	return ctx, func() { cancel(); cancelAlloc() }, nil
}

// SignIn opens the console at url and signs in with token, in namespace ns.
func SignIn(url, token, ns string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.SendKeys(chromedp.CSS("#namespace"), ns),
		chromedp.Click(chromedp.CSS("#sign-in")), chromedp.WaitVisible(chromedp.CSS("header .who")))
}

// Upload starts, from the images page, the upload of file to a new image name; the upload is
// done when the page marks it so (Done).
func Upload(name, file string) chromedp.Action[chromedp.Void] {
	selectName := chromedp.Func(func(ctx context.Context, t *chromedp.Target) error { // typed over the last upload's name
		_, err := chromedp.Evaluate[bool](`(document.querySelector('#upload-form input[name=name]').select(), true)`)(ctx, t)
		return err
	})
	return chromedp.Steps(selectName,
		chromedp.SendKeys(chromedp.CSS(`#upload-form input[name=name]`), name),
		chromedp.SetUploadFiles(chromedp.CSS(`#upload-form input[name=file]`), []string{file}),
		chromedp.Click(chromedp.CSS(`#upload-form button[type=submit]`)))
}

// Done waits until the page says the upload of name is done, or fails with what the page
// says went wrong (the upload form's refusal, or the upload's own failure).
func Done(name string) chromedp.Action[chromedp.Void] {
	js := `(() => {
  const form = document.querySelector('#upload-form .error');
  if (form) return 'error: ' + form.textContent;
  const li = document.querySelector('#uploads-running li[data-name="` + name + `"]');
  if (!li) return '';
  const p = li.dataset.phase;
  return p === 'failed' || p === 'cancelled' ? 'error: ' + li.textContent : p;
})()`
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		for {
			state, err := chromedp.Evaluate[string](js)(ctx, t)
			switch {
			case err != nil:
				return err
			case state == "done":
				return nil
			case strings.HasPrefix(state, "error: "):
				return fmt.Errorf("the upload of %s failed: %s", name, strings.TrimPrefix(state, "error: "))
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("the upload of %s is not done (the page says %q): %w", name, state, ctx.Err())
			case <-time.After(500 * time.Millisecond):
			}
		}
	})
}
