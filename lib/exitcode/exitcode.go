// Package exitcode names the process exit codes every kubeslot binary uses.
//
// Units rely on these numbers: Deferred must appear in both
// SuccessExitStatus= and RestartPreventExitStatus= of every stage unit, and a
// test in units/ pins that to the constant here. Imported by cmd/ and by lib/
// packages that map their errors to an exit code.
package exitcode

import (
	"errors"
	"fmt"
)

const (
	// OK: the stage did its work, or found nothing to do.
	OK = 0
	// Failure: the stage tried and failed; systemd may retry it.
	Failure = 1
	// Usage: bad flags or arguments; retrying cannot help.
	Usage = 2
	// Deferred is EX_UNAVAILABLE from sysexits.h: the stage cannot run yet
	// (another stage owns the host, or the host is not ready). It is not a
	// failure; the stage is triggered again when its input is still there.
	Deferred = 69
	// HostUnfit is EX_CONFIG from sysexits.h: the host lacks something
	// kubeslot needs and will not provide itself (software missing on an
	// image-based host, a package it may not install), or holds what this
	// release cannot read (an installation in another layout version), so
	// the stage stopped before changing anything. Not Deferred: nothing triggers it again, and
	// nothing will change until an operator changes the host. Not Failure:
	// a retry cannot help, so units list it in RestartPreventExitStatus=.
	HostUnfit = 78
)

// Error carries an exit code through ordinary error returns so that main can
// end the process with the right status without deciding it itself.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// Defer wraps err as a deferral (exit 69).
func Defer(err error) error { return &Error{Code: Deferred, Err: err} }

// Unfit wraps err as a host that cannot proceed (exit 78).
func Unfit(err error) error { return &Error{Code: HostUnfit, Err: err} }

// UsageError wraps err as a usage error (exit 2).
func UsageError(err error) error { return &Error{Code: Usage, Err: err} }

// ErrReported means the command already told the person what went wrong
// (on stdout or stderr, in its own words); lib/cli.Exit only sets the exit
// code.
var ErrReported = errors.New("already reported")

// Reported is an error that sets the exit code without another log line:
// the stage already said what happened.
func Reported(code int) error { return &Error{Code: code, Err: ErrReported} }

// Of returns the exit code for err: OK for nil, the wrapped code for an
// *Error anywhere in the chain, Failure otherwise.
func Of(err error) int {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return Failure
}
