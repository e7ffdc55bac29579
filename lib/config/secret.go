package config

import (
	"encoding/json"
	"fmt"
	"log/slog"
)

// redacted is what a non-empty Secret prints as.
const redacted = "[redacted]"

// Secret is a string that does not print itself: fmt (every verb, %#v
// included), String, GoString and slog (LogValue) all show "[redacted]", or
// "" when the secret is empty, so a debug print of a Config is safe.
//
// JSON and text marshalling DO keep the real value: the applied configuration
// is persisted as JSON (mode 0600) and must hand the token to the join step
// later. Never json-encode a Config into a log line; log the Config (or its
// Cluster) itself, which are slog.LogValuers that leave secrets out.
type Secret string

// Reveal returns the secret value, for the one place that needs it.
func (s Secret) Reveal() string { return string(s) }

// String redacts.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString redacts (%#v).
func (s Secret) GoString() string { return fmt.Sprintf("config.Secret(%q)", s.String()) }

// Format redacts for every verb, so %x or %q cannot bypass String.
func (s Secret) Format(f fmt.State, verb rune) {
	switch {
	case verb == 'v' && f.Flag('#'):
		fmt.Fprint(f, s.GoString())
	case verb == 'q':
		fmt.Fprintf(f, "%q", s.String())
	default:
		fmt.Fprint(f, s.String())
	}
}

// LogValue redacts in slog records.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// MarshalJSON keeps the real value (see the type comment).
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(string(s)) }

// MarshalText keeps the real value (see the type comment).
func (s Secret) MarshalText() ([]byte, error) { return []byte(s), nil }
