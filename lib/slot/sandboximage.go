package slot

// The sandbox ("pause") image: containerd runs it for every pod, so a node
// whose sandbox image no registry serves starts no pod at all, and says so
// only in containerd's log. The bootstrap asks before the host is touched
// (a fresh installation) and at --preflight; the repaver before it builds a
// slot whose sandbox image changed.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/oci"
	"github.com/kubeslot/kubeslot/lib/oci/ociref"
	"github.com/kubeslot/kubeslot/lib/sandbox"
	"github.com/kubeslot/kubeslot/lib/state"
)

// ImageCheckSkip is why sb does not let the sandbox image be checked ("":
// it does), for CheckSandboxImage's skip.
func ImageCheckSkip(sb state.Sandbox) string {
	if sb.SkipSandboxImageCheck {
		return "sandbox setting " + sandbox.EnvSkipSandboxImageCheck
	}
	return ""
}

// SandboxImageTimeout bounds the check of the sandbox image, every
// endpoint together.
const SandboxImageTimeout = 20 * time.Second

// ImageResolver asks the mirrors in order, then the image's registry,
// whether they serve an image (oci.Resolve).
type ImageResolver func(ctx context.Context, ref string, mirrors []string) (*oci.Resolved, error)

// ResolveImage is the real ImageResolver.
func ResolveImage(ctx context.Context, ref string, mirrors []string) (*oci.Resolved, error) {
	return oci.Resolve(ctx, ref, mirrors, nil)
}

// CheckSandboxImage says where the node will get its sandbox image: a
// preload (an oci:// preload of that very image, or image archives, whose
// contents are known only once downloaded) or a registry reached through
// node.registry_mirrors. It returns a line for --preflight, and an error
// naming node.sandbox_image and its value when the image is not preloaded
// and no registry serves it. resolve nil (unit tests of other logic) or
// skip (the test machine, which must not reach public registries) checks
// nothing.
func CheckSandboxImage(ctx context.Context, cfg *config.Config, resolve ImageResolver, skip string) (string, error) {
	img := cfg.Node.Sandbox()
	setting := fmt.Sprintf("node.sandbox_image %q", img)
	if cfg.Node.SandboxImage == "" {
		setting = fmt.Sprintf("node.sandbox_image (default %q)", img)
	}
	want, err := name.ParseReference(img, name.StrictValidation)
	if err != nil {
		return "", fmt.Errorf("%s: %w", setting, err) // config validation refuses this first
	}
	var archives []string
	for i, p := range cfg.Node.PreloadImages {
		key := fmt.Sprintf("node.preload_images[%d]", i)
		if !ociref.Is(p.Source) {
			archives = append(archives, key)
			continue
		}
		raw, _, _ := strings.Cut(strings.TrimPrefix(p.Source, ociref.Scheme), "@")
		if r, err := name.ParseReference(raw); err == nil && r.Name() == want.Name() {
			return fmt.Sprintf("%s: preloaded (%s)", setting, key), nil
		}
	}
	switch {
	case skip != "":
		return fmt.Sprintf("%s: not checked (%s)", setting, skip), nil
	case resolve == nil:
		return fmt.Sprintf("%s: not checked", setting), nil
	}
	host := want.Context().RegistryStr()
	mirrors := cfg.Node.RegistryMirrors[host]
	if host == name.DefaultRegistry && len(mirrors) == 0 {
		mirrors = cfg.Node.RegistryMirrors["docker.io"]
	}
	rctx, cancel := context.WithTimeout(ctx, SandboxImageTimeout)
	defer cancel()
	res, err := resolve(rctx, img, mirrors)
	if err == nil {
		return fmt.Sprintf("%s: served by %s (%s)", setting, res.Endpoint, res.Digest), nil
	}
	if len(archives) > 0 {
		// It may be in an archive: the node imports them before the kubelet starts.
		return fmt.Sprintf("%s: no registry serves it (%v); it must be in the image archives %s", setting, err, strings.Join(archives, ", ")), nil
	}
	bound := ""
	if errors.Is(err, oci.ErrUnreachable) {
		bound = fmt.Sprintf(" within %s", SandboxImageTimeout)
	}
	return "", fmt.Errorf("%s: %w%s; without it the node starts no pod: set node.sandbox_image to an image a registry serves, give its registry a mirror in node.registry_mirrors[%q], or preload it (node.preload_images)",
		setting, err, bound, host)
}
