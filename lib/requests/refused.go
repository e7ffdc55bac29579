package requests

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kubeslot/kubeslot/lib/ownership"
)

// Refused is a request file moved aside because no worker could use it.
type Refused struct {
	Kind      Kind
	File      string // where it was, relative to the base (requests/repave.json)
	MovedTo   string // where it is now, relative to the base (state/rejected-…)
	RequestID string // the ID it names, if its JSON parsed
	Reason    string
}

// RefusedError is Claim's answer when the only requests of its kind were
// moved aside: it wraps ErrNoRequest, so a worker finds nothing to do, but
// says what was refused, so the worker does not log "nothing to claim" as if
// nobody had asked.
type RefusedError struct {
	Kind    Kind
	Refused []Refused
}

func (e *RefusedError) Error() string {
	parts := make([]string, 0, len(e.Refused))
	for _, r := range e.Refused {
		parts = append(parts, fmt.Sprintf("%s (moved aside to %s): %s", r.File, r.MovedTo, r.Reason))
	}
	return fmt.Sprintf("claim %s request: the request was refused: %s", e.Kind, strings.Join(parts, "; "))
}

func (e *RefusedError) Unwrap() error { return ErrNoRequest }

// AsRefused returns the refused files err reports (RefusedError), or nil.
func AsRefused(err error) []Refused {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Refused
	}
	return nil
}

// SweepRefused moves aside the pending and the claimed request of kind when
// no worker can use them (ErrInvalid), each with a Failed status when its
// content names a request ID of its own kind, so that one bad file never
// blocks a worker or the requests after it, and returns what it moved aside.
// It needs the installation lock.
func (d *Dir) SweepRefused(lock *ownership.Lock, kind Kind) ([]Refused, error) {
	if lock == nil {
		return nil, fmt.Errorf("sweep %s requests: the installation lock must be held", kind)
	}
	var out []Refused
	for _, path := range []func(Kind) (string, error){d.ClaimedPath, d.RequestPath} {
		p, err := path(kind)
		if err != nil {
			return out, err
		}
		r, err := readRequest(p, kind)
		if !errors.Is(err, ErrInvalid) {
			continue // good, absent, or unreadable for now: the caller sees it
		}
		ref, err := d.reject(kind, p, r, err)
		if err != nil {
			return out, err
		}
		out = append(out, ref)
	}
	return out, nil
}
