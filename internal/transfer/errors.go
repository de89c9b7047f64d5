package transfer

import (
	"context"
	"errors"
	"fmt"
)

// Reason is a stable, machine-readable cause of a failure. Controllers copy it into
// conditions and decide on retries from Error.Transient, never from the message.
type Reason string

// Reasons of failures.
const (
	ReasonInvalidArgument   Reason = "InvalidArgument"
	ReasonSourceNotFound    Reason = "SourceNotFound"
	ReasonSourceForbidden   Reason = "SourceForbidden"
	ReasonSourceUnavailable Reason = "SourceUnavailable"
	ReasonTLSError          Reason = "TLSError"
	ReasonChecksumMismatch  Reason = "ChecksumMismatch"
	ReasonUnsupportedFormat Reason = "UnsupportedFormat"
	ReasonBackingFile       Reason = "BackingFile"
	ReasonEncrypted         Reason = "Encrypted"
	ReasonMalformedImage    Reason = "MalformedImage"
	ReasonTruncatedImage    Reason = "TruncatedImage"
	ReasonTooLarge          Reason = "TooLarge"
	// ReasonBrokenChain: the layers of a backup chain do not fit together (a missing, repeated
	// or out-of-order layer, an index that disagrees with its objects).
	ReasonBrokenChain       Reason = "BrokenChain"
	ReasonNeedsRandomAccess Reason = "NeedsRandomAccess"
	// ReasonNoRevision: a scheduled image's source tells no revision (no ETag or
	// Last-Modified), so a change cannot be seen without downloading it.
	ReasonNoRevision Reason = "NoRevision"
	// A container disk required to be signed: no signature, none by the key, or one for
	// another digest.
	ReasonUnsigned             Reason = "Unsigned"
	ReasonSignatureInvalid     Reason = "SignatureInvalid"
	ReasonSignedDigestMismatch Reason = "SignedDigestMismatch"
	// ReasonForbiddenDestination: the source (its URL, a redirect or its DNS answer) points
	// where importers may not connect (Egress), or a redirect to a scheme other than http(s).
	ReasonForbiddenDestination Reason = "ForbiddenDestination"
	ReasonCredentialsNotFound  Reason = "CredentialsNotFound"
	ReasonTargetError          Reason = "TargetError"
	ReasonTargetNotFound       Reason = "TargetNotFound"
	ReasonTargetForbidden      Reason = "TargetForbidden"
	ReasonTargetUnavailable    Reason = "TargetUnavailable"
	ReasonCancelled            Reason = "Cancelled"
	// ReasonIdle: a clone source that nobody read for its idle timeout ended, giving its
	// slot up to other copies of its disk.
	ReasonIdle     Reason = "Idle"
	ReasonInternal Reason = "Internal"
)

// Error is a failure with its reason and whether trying again may help.
type Error struct {
	Reason    Reason
	Transient bool
	Err       error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Permanent returns a failure that trying again will not mend.
func Permanent(reason Reason, format string, args ...any) error {
	return &Error{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// Transient returns a failure that may pass: a dropped connection, a 503, a timeout.
func Transient(reason Reason, format string, args ...any) error {
	return &Error{Reason: reason, Transient: true, Err: fmt.Errorf(format, args...)}
}

// Within prefixes err's message with what it concerns ("layer 2 of 4 (cp2)"), keeping its
// reason and whether it is transient.
func Within(what string, err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return &Error{Reason: e.Reason, Transient: e.Transient, Err: fmt.Errorf("%s: %w", what, e.Err)}
	}
	return fmt.Errorf("%s: %w", what, err)
}

// IsTransient reports whether err is worth trying again.
func IsTransient(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Transient
}

// AsTarget renames the reasons of a failure met while writing to a remote store rather than
// reading from it: the store missing, refusing or away is the target's fault, not a source's.
func AsTarget(err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	r, ok := map[Reason]Reason{
		ReasonSourceNotFound: ReasonTargetNotFound, ReasonSourceForbidden: ReasonTargetForbidden,
		ReasonSourceUnavailable: ReasonTargetUnavailable,
	}[e.Reason]
	if !ok {
		return err
	}
	return &Error{Reason: r, Transient: e.Transient, Err: e.Err}
}

// ReasonOf returns err's reason: its own, Cancelled for a cancelled context, else Internal.
func ReasonOf(err error) Reason {
	var e *Error
	switch {
	case errors.As(err, &e):
		return e.Reason
	case errors.Is(err, context.Canceled):
		return ReasonCancelled
	default:
		return ReasonInternal
	}
}
