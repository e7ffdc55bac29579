package repave

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// requestVersion drops a repave request whose desired configuration asks
// for Kubernetes version v.
func (r *rig) requestVersion(t *testing.T, gen int64, v string) {
	t.Helper()
	cfg := testConfig(t, "new")
	cfg.Kubernetes.Version = v
	r.requestConfig(t, gen, cfg)
}

// A version the skew policy forbids is refused in prepare, before anything
// is fetched or built; the node is left alone.
func TestVersionSkewRefusedBeforeAnything(t *testing.T) {
	t.Parallel()
	for v, rule := range map[string]string{"1.33.0": "4 minor versions older", "1.38.0": "newer than the API server"} {
		t.Run(v, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			r.requestVersion(t, 2, v)
			s, err := execute(t, r, Job{Kind: requests.Repave})
			if err == nil || errors.Is(err, ErrRolledBack) {
				t.Fatalf("error %v, want a refusal", err)
			}
			if s.Phase != requests.Failed || !strings.Contains(s.Message, rule) || !strings.Contains(s.Message, "skew policy") {
				t.Errorf("status %q: want Failed naming the rule (%s)", s.Message, rule)
			}
			if got := r.h.callList(); got != "" || r.h.pins != 0 {
				t.Errorf("calls %q, %d pins: nothing may be fetched or built", got, r.h.pins)
			}
			if a := r.active(t); a.Slot != "a" || !r.h.running["a"] {
				t.Errorf("active %s, running %v", a.Slot, r.h.running)
			}
		})
	}
}

// A slot whose kubelet binary is another release than asked for (a mirror
// serving the wrong file under a version's path) fails standby, on the warm
// machine, and is rolled back before the old node stopped: no downtime.
func TestWrongKubeletBinaryRolledBack(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.requestVersion(t, 2, "1.37.0")
	r.h.servedVersion = "1.37.2"
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if !errors.Is(err, ErrRolledBack) || s.Phase != requests.Failed || s.ActiveSlot != "a" || s.Downtime != 0 ||
		!strings.Contains(s.Message, "failed in standby: the kubelet binary in slot b reports 1.37.2, but kubernetes version 1.37.0 was asked for") {
		t.Fatalf("%v %+v, want rolled back from standby with no downtime", err, s)
	}
	if got := r.h.count("stop:a"); got != 0 {
		t.Errorf("the old node was stopped %d times", got)
	}
	if r.h.pins != 1 {
		t.Errorf("%d pins, want 1", r.h.pins)
	}
}

// The right binary passes both checks: the slot's and the Node's.
func TestVersionUpgradeVerified(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.requestVersion(t, 2, "1.36.3")
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("%v %+v", err, s)
	}
	if a := r.active(t); a.Slot != "b" || a.Config.Kubernetes.Version != "1.36.3" {
		t.Errorf("active %s %s", a.Slot, a.Config.Kubernetes.Version)
	}
}

// A sandbox image the Machine changed to and no registry serves is refused
// in prepare, before anything is built; an unchanged one is not asked for
// again (both slots share containerd's image store).
func TestChangedSandboxImageChecked(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	var asked []string
	r.d.SandboxImage = func(ctx context.Context, cfg *config.Config) error {
		asked = append(asked, cfg.Node.Sandbox())
		return errors.New(`node.sandbox_image "mirror.example/pause:9": no registry serves it`)
	}
	r.request(t, 2) // a label change: same sandbox image
	if s, err := execute(t, r, Job{Kind: requests.Repave}); err != nil || s.Phase != requests.Succeeded || len(asked) != 0 {
		t.Fatalf("unchanged image: %v %+v, asked %v", err, s, asked)
	}
	cfg := testConfig(t, "new2")
	cfg.Node.SandboxImage = "mirror.example/pause:9"
	r.requestConfig(t, 3, cfg)
	before := r.h.count("provision:a")
	s, err := execute(t, r, Job{Kind: requests.Repave})
	if err == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "spec.node.sandboxImage") || !strings.Contains(s.Message, "no registry serves it") {
		t.Errorf("changed image: %v, status %q", err, s.Message)
	}
	if r.h.count("provision:a") != before || len(asked) != 1 {
		t.Errorf("provisioned %d times, asked %v", r.h.count("provision:a")-before, asked)
	}
}
