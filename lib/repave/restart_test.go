package repave

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/transition"
)

// TestRestartPhases: a restart in place runs its two phases through the
// stage runner: both timed into the status when it succeeds, the failed one
// named and timed when it fails, and the test hook stops it before the
// restart with no status written.
func TestRestartPhases(t *testing.T) {
	names := func(s *requests.Status) []string {
		var out []string
		for _, p := range s.Phases {
			out = append(out, p.Name)
		}
		return out
	}
	t.Run("succeeded", func(t *testing.T) {
		r := newRig(t)
		s, err := execute(t, r, Job{Kind: requests.Restart})
		if err != nil || s.Phase != requests.Succeeded || !slices.Equal(names(s), []string{"drain", "restart-node", "verify"}) || s.Downtime <= 0 {
			t.Fatalf("restart: %+v %v", s, err)
		}
	})
	t.Run("failed", func(t *testing.T) {
		r := newRig(t)
		r.h.fail["start:a"] = errors.New("machine a did not boot")
		s, err := execute(t, r, Job{Kind: requests.Restart})
		if err == nil || s == nil || s.Phase != requests.Failed || !slices.Equal(names(s), []string{"drain", "restart-node"}) ||
			!strings.Contains(s.Message, "machine a did not boot") {
			t.Fatalf("restart: %+v %v", s, err)
		}
	})
	t.Run("paused", func(t *testing.T) {
		r := newRig(t)
		ctx, cancel := context.WithCancel(t.Context())
		var paused []string
		r.d.Pause = transition.PauseHook(string(RestartNode), func(n string) { paused = append(paused, n); cancel() })
		l := lock(t, r)
		defer l.Release()
		s, err := Execute(ctx, r.d, l, Job{Kind: requests.Restart})
		if s != nil || err == nil || !slices.Equal(paused, []string{"restart-node"}) {
			t.Fatalf("paused restart: %+v %v, paused %v", s, err, paused)
		}
		if calls := r.h.callList(); strings.Contains(calls, "stop:a") {
			t.Errorf("the node was restarted before the pause: %s", calls)
		}
	})
}
