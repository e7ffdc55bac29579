package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
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

func TestSandboxImageCheck(t *testing.T) {
	const img = "registry.example/pause:3.10"
	for _, tc := range []struct {
		name   string
		node   config.Node
		reg    fakeRegistry
		skip   string
		want   string // in the line, or in the error
		fail   bool
		asks   string // what the registry was asked ("" = nothing)
		noCall bool
	}{
		{name: "served through the mirror", node: config.Node{SandboxImage: img, RegistryMirrors: map[string][]string{"registry.example": {"https://mirror.example"}}},
			reg: fakeRegistry{serves: map[string]bool{img: true}}, want: "served by https://mirror.example", asks: img + " via [https://mirror.example]"},
		{name: "unknown image", node: config.Node{SandboxImage: img}, reg: fakeRegistry{}, fail: true,
			want: `node.sandbox_image "registry.example/pause:3.10": no registry has this image (https://registry.example: not found)`},
		{name: "unreachable registry", node: config.Node{SandboxImage: img}, reg: fakeRegistry{down: true}, fail: true,
			want: `node.sandbox_image "registry.example/pause:3.10": no registry could be reached (https://registry.example: dial tcp: i/o timeout) within 20s`},
		{name: "default image, unknown", node: config.Node{}, reg: fakeRegistry{}, fail: true,
			want: `node.sandbox_image (default "` + config.DefaultSandboxImage + `")`},
		{name: "preloaded from an oci:// image", node: config.Node{SandboxImage: img,
			PreloadImages: []config.PreloadImage{{Source: "oci://registry.example/other:v1", SHA256: strings.Repeat("b", 64)}, {Source: "oci://" + img, SHA256: strings.Repeat("c", 64)}}},
			reg: fakeRegistry{}, want: "preloaded (node.preload_images[1])", noCall: true},
		{name: "maybe in an archive", node: config.Node{SandboxImage: img,
			PreloadImages: []config.PreloadImage{{Source: "https://files.example/images.tar", SHA256: strings.Repeat("d", 64)}}},
			reg: fakeRegistry{}, want: "it must be in the image archives node.preload_images[0]"},
		{name: "skipped by the sandbox setting", node: config.Node{SandboxImage: img}, reg: fakeRegistry{}, skip: "sandbox setting X",
			want: "not checked (sandbox setting X)", noCall: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "worker-1")
			cfg.Node = tc.node
			reg := tc.reg
			line, err := checkSandboxImage(t.Context(), cfg, reg.resolve, tc.skip)
			got := line
			if err != nil {
				got = err.Error()
			}
			if (err != nil) != tc.fail || !strings.Contains(got, tc.want) {
				t.Errorf("got %q (error %v), want it to contain %q (fail %v)", got, err != nil, tc.want, tc.fail)
			}
			if tc.fail && !strings.Contains(got, "node.registry_mirrors") {
				t.Errorf("the error does not say what to change: %s", got)
			}
			if tc.noCall && len(reg.asked) > 0 {
				t.Errorf("asked a registry: %v", reg.asked)
			}
			if tc.asks != "" && (len(reg.asked) != 1 || reg.asked[0] != tc.asks) {
				t.Errorf("asked %v, want [%s]", reg.asked, tc.asks)
			}
		})
	}
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
