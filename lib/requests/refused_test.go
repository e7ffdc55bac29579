package requests

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// Claim with only an unusable request says what it moved aside (still
// ErrNoRequest for callers that only need "nothing to run").
func TestClaimReportsRefused(t *testing.T) {
	d, root := newDir(t)
	l := lock(t, root)
	p, err := d.RequestPath(Repave)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(`{"kind":"restart","id":"restart-2-op"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = d.Claim(l, Repave)
	if !errors.Is(err, ErrNoRequest) {
		t.Fatalf("claim: %v, want ErrNoRequest", err)
	}
	ref := AsRefused(err)
	if len(ref) != 1 || ref[0].File != "requests/repave.json" || !strings.HasPrefix(ref[0].MovedTo, "state/rejected-repave-request-") ||
		!strings.Contains(ref[0].Reason, "holds a restart request") || ref[0].RequestID != "restart-2-op" {
		t.Fatalf("refused %+v", ref)
	}
	if !strings.Contains(err.Error(), "requests/repave.json") || !strings.Contains(err.Error(), "refused") {
		t.Errorf("error %q does not name the file", err)
	}
	// Nothing left: a plain ErrNoRequest.
	if _, err := d.Claim(l, Repave); !errors.Is(err, ErrNoRequest) || AsRefused(err) != nil {
		t.Errorf("second claim: %v", err)
	}
}
