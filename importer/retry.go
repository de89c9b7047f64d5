package importer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

// RetryPolicy bounds the retries of one request after transient failures.
type RetryPolicy struct {
	// Attempts is how many times a request is tried in all, counted since its last progress.
	Attempts int
	// Initial is the first backoff; each next one doubles, up to Max.
	Initial, Max time.Duration
}

// DefaultRetryPolicy tries each request up to 6 times over about half a minute.
var DefaultRetryPolicy = RetryPolicy{Attempts: 6, Initial: time.Second, Max: 10 * time.Second}

// backoff returns the wait before attempt (1-based) a+1.
func (p RetryPolicy) backoff(a int) time.Duration {
	d := p.Initial
	for i := 1; i < a && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max)
}

// do calls fn until it succeeds, fails permanently, or runs out of attempts.
func (p RetryPolicy) do(ctx context.Context, log *slog.Logger, what string, fn func() error) error {
	for a := 1; ; a++ {
		err := fn()
		if err == nil || !transfer.IsTransient(err) || a >= p.Attempts {
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

// classifyHTTPStatus turns an unexpected HTTP status into a transfer error.
func classifyHTTPStatus(resp *http.Response, what string) error {
	msg := fmt.Sprintf("%s: HTTP %s", what, resp.Status)
	switch c := resp.StatusCode; {
	case c == http.StatusNotFound || c == http.StatusGone:
		return transfer.Permanent(transfer.ReasonSourceNotFound, "%s", msg)
	case c == http.StatusUnauthorized || c == http.StatusForbidden:
		return transfer.Permanent(transfer.ReasonSourceForbidden, "%s", msg)
	case c == http.StatusRequestTimeout || c == http.StatusTooManyRequests || c >= 500:
		return transfer.Transient(transfer.ReasonSourceUnavailable, "%s", msg)
	default:
		return transfer.Permanent(transfer.ReasonInvalidArgument, "%s", msg)
	}
}

// classifyNetError turns a transport error into a transfer error: certificate problems and
// unknown hosts are permanent, the rest (resets, refusals, timeouts, cut streams) transient.
func classifyNetError(err error, what string) error {
	var (
		te        *transfer.Error
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		recordHdr tls.RecordHeaderError
		dnsErr    *net.DNSError
	)
	switch {
	case errors.As(err, &te):
		return err
	case errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid),
		errors.As(err, &verify), errors.As(err, &recordHdr):
		return transfer.Permanent(transfer.ReasonTLSError, "%s: TLS: %w", what, err)
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return transfer.Permanent(transfer.ReasonSourceNotFound, "%s: %w", what, err)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE), errors.Is(err, context.DeadlineExceeded):
		return transfer.Transient(transfer.ReasonSourceUnavailable, "%s: %w", what, err)
	default:
		var ne net.Error
		if errors.As(err, &ne) {
			return transfer.Transient(transfer.ReasonSourceUnavailable, "%s: %w", what, err)
		}
		return transfer.Transient(transfer.ReasonSourceUnavailable, "%s: %w", what, err)
	}
}
