package importer

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"

	"github.com/diskpipe/diskpipe/internal/transfer"
)

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
	redactURL(err)
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
	default: // resets, refusals, timeouts, cut streams
		return transfer.Transient(transfer.ReasonSourceUnavailable, "%s: %w", what, err)
	}
}

// redactURL takes the query and user info out of the URL a *url.Error in err names: a
// presigned URL's query is a credential, and errors end in logs and in objects' status.
func redactURL(err error) {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return
	}
	if u, perr := url.Parse(ue.URL); perr == nil && (u.RawQuery != "" || u.User != nil) {
		u.RawQuery, u.User = "", nil
		ue.URL = u.String()
	}
}
