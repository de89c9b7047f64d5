package transfer

import (
	"context"
	"log/slog"
	"time"

	"github.com/diskpipe/diskpipe/internal/contract"
)

// RetryPolicy bounds the retries of one request after transient failures.
type RetryPolicy struct {
	// Attempts is how many times a request is tried in all, counted since its last progress.
	Attempts int
	// Initial is the first backoff; each next one doubles, up to Max.
	Initial, Max time.Duration
}

// DefaultRetryPolicy tries each request up to 6 times over about half a minute.
var DefaultRetryPolicy = RetryPolicy{Attempts: contract.DefaultRetries, Initial: time.Second, Max: 10 * time.Second}

// backoff returns the wait before attempt (1-based) a+1.
func (p RetryPolicy) backoff(a int) time.Duration {
	d := p.Initial
	for i := 1; i < a && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max)
}

// Do calls fn until it succeeds, fails permanently, or runs out of attempts.
func (p RetryPolicy) Do(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	for a := 1; ; a++ {
		err := fn()
		if err == nil || !IsTransient(err) || a >= p.Attempts {
			return err
		}
		wait := p.backoff(a)
		log.Info("Retrying after a transient failure", "what", what, "attempt", a, "wait", wait, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}
