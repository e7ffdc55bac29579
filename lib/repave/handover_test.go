package repave

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// handoverBackend is the fake backend with the runtime handover
// (isolation.RuntimeHandover); warm is the fake's booted map.
type handoverBackend struct{ *fakeBackend }

func (b handoverBackend) Warm(_ context.Context, slot string) bool {
	b.h.mu.Lock()
	defer b.h.mu.Unlock()
	return b.h.booted[slot]
}

func (b handoverBackend) StopRuntime(_ context.Context, slot string) error {
	return b.h.do("stop-runtime", slot)
}

func (b handoverBackend) StartRuntime(_ context.Context, slot string) error {
	return b.h.do("start-runtime", slot)
}

// TestRuntimeHandedOverBeforeTheSwitch: a repave onto a warm target stops
// the old runtime and starts the target's before the old node stops and the
// downtime starts; a failed handover is only a warning, and a resume after a
// power cut (the target no longer runs) skips it and starts the target cold.
func TestRuntimeHandedOverBeforeTheSwitch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		prep func(r *rig)
		want string // the calls from the standby's boot (then the drain) to the target's start
	}{
		{"warm target", nil, "warm:b cordon:node1 evict:web stop-runtime:a start-runtime:b stop:a stop:a start:b"},
		{"the target fails to take it", func(r *rig) { r.h.fail["start-runtime:b"] = errors.New("no containerd") },
			"warm:b cordon:node1 evict:web stop-runtime:a start-runtime:b stop:a stop:a start:b"},
		{"the old runtime does not stop", func(r *rig) { r.h.fail["stop-runtime:a"] = errors.New("timeout") },
			"warm:b cordon:node1 evict:web stop-runtime:a stop:a stop:a start:b"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			orig := r.d.Isolation
			r.d.Isolation = func(m isolation.Mode, cfg *config.Config) (isolation.Backend, isolation.Operator, error) {
				b, o, err := orig(m, cfg)
				if fb, ok := b.(*fakeBackend); ok {
					return handoverBackend{fb}, o, err
				}
				return b, o, err
			}
			if c.prep != nil {
				c.prep(r)
			}
			r.request(t, 3)
			s, err := execute(t, r, Job{Kind: requests.Repave, Slot: NextSlot})
			if err != nil || s.Phase != requests.Succeeded {
				t.Fatalf("repave: %+v, %v", s, err)
			}
			calls := r.h.callList()
			i, j := strings.Index(calls, "warm:b"), strings.Index(calls, "start:b")
			if i < 0 || j < i {
				t.Fatalf("calls %q", calls)
			}
			if got := calls[i : j+len("start:b")]; got != c.want {
				t.Errorf("calls %q, want %q", got, c.want)
			}
		})
	}
}
