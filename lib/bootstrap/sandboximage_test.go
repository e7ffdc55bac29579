package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/oci"
)

// fakeRegistry answers like oci.Resolve: served, not found or unreachable, and records what it was asked.
type fakeRegistry struct {
	serves map[string]bool // image references some endpoint serves
	down   bool
	asked  []string // "ref via mirrors"
}

func (r *fakeRegistry) resolve(_ context.Context, ref string, mirrors []string) (*oci.Resolved, error) {
	r.asked = append(r.asked, fmt.Sprintf("%s via %v", ref, mirrors))
	switch {
	case r.down:
		return nil, fmt.Errorf("%w (https://registry.example: dial tcp: i/o timeout)", oci.ErrUnreachable)
	case r.serves[ref]:
		return &oci.Resolved{Endpoint: "https://mirror.example", Digest: "sha256:" + strings.Repeat("a", 64)}, nil
	}
	return nil, fmt.Errorf("%w (https://registry.example: not found)", oci.ErrNotFound)
}

// A fresh installation whose sandbox image no registry serves stops before the host is touched, naming the setting;
// preflight reports it BLOCKED.
func TestUnknownSandboxImageChangesNothing(t *testing.T) {
	f := newFakes(t)
	cfg := testConfig(t, "worker-1")
	cfg.Node.SandboxImage = "registry.example/nothing:v1"
	reg := &fakeRegistry{}
	d := f.deps()
	d.ResolveImage = reg.resolve

	var out strings.Builder
	err := Preflight(t.Context(), d, cfg, &out)
	if err == nil || !strings.Contains(out.String(), `sandbox image: BLOCKED: node.sandbox_image "registry.example/nothing:v1"`) {
		t.Errorf("preflight: %v\n%s", err, out.String())
	}
	f.reset()
	_, err = Run(t.Context(), d, cfg)
	if err == nil || !errors.Is(err, oci.ErrNotFound) || !strings.Contains(err.Error(), `node.sandbox_image "registry.example/nothing:v1"`) {
		t.Fatalf("run: %v, want the sandbox image refused", err)
	}
	if got := f.Calls(); len(got) != 0 {
		t.Errorf("refused run called %v", got)
	}
	if ents, _ := os.ReadDir(f.root.Prefix()); len(ents) != 0 {
		t.Errorf("refused run created %v", ents)
	}

	// Served: the same run installs.
	reg.serves = map[string]bool{cfg.Node.SandboxImage: true}
	f.reset()
	if _, err := Run(t.Context(), d, cfg); err != nil {
		t.Fatal(err)
	}
	// A complete host does not ask again (its node runs; a registry outage must not fail the on-boot run).
	reg.asked, reg.serves = nil, nil
	if _, err := Run(t.Context(), d, cfg); err != nil {
		t.Fatal(err)
	}
	if len(reg.asked) != 0 {
		t.Errorf("the run on a complete host asked %v", reg.asked)
	}
}
