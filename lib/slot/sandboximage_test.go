package slot

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/oci"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
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
			cfg := testhost.Config(t, testhost.Doc{Machine: "worker-1", CA: testkit.SharedCA()})
			cfg.Node = tc.node
			reg := tc.reg
			line, err := CheckSandboxImage(t.Context(), cfg, reg.resolve, tc.skip)
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
