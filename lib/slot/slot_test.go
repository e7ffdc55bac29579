package slot

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// versions is a Cluster whose API server answers after failing times.
type versions struct {
	server  string
	failing int
	asked   int
}

func (v *versions) ServerVersion(context.Context, *config.Config) (string, error) {
	v.asked++
	if v.asked <= v.failing {
		return "", errors.New("connection refused")
	}
	return v.server, nil
}
func (v *versions) WaitReady(context.Context, *config.Config, time.Time) error { return nil }
func (v *versions) KubeletVersion(context.Context, *config.Config) (string, error) {
	return "", errors.New("not asked here")
}

// TestSkew: asked once, an API server that does not answer is unknown at
// once; with a wait it is asked again until it answers; a version the
// policy forbids is refused.
func TestSkew(t *testing.T) {
	t.Parallel()
	cfg := testhost.Config(t, testhost.Doc{Machine: "worker-1", CA: testkit.SharedCA()})
	cfg.Kubernetes.Version = "1.37.2"
	tasks := func(v *versions) *Tasks {
		return &Tasks{Log: slog.New(slog.DiscardHandler), Cluster: v, Poll: time.Millisecond}
	}

	v := &versions{server: "v1.37.0", failing: 1}
	if server, known, err := tasks(v).Skew(t.Context(), cfg, 0); err != nil || known || server != "connection refused" || v.asked != 1 {
		t.Errorf("once, unreachable: %q %v %v after %d asks, want unknown with the reason after 1", server, known, err, v.asked)
	}
	v = &versions{server: "v1.37.0", failing: 3}
	if server, known, err := tasks(v).Skew(t.Context(), cfg, time.Minute); err != nil || !known || server != "v1.37.0" || v.asked != 4 {
		t.Errorf("waiting: %q %v %v after %d asks, want v1.37.0 known after 4", server, known, err, v.asked)
	}
	v = &versions{server: "v1.36.0"}
	if _, known, err := tasks(v).Skew(t.Context(), cfg, 0); !known || err == nil || !strings.HasPrefix(err.Error(), "refused: ") || !strings.Contains(err.Error(), "skew policy") {
		t.Errorf("newer than the API server: %v %v, want refused naming the skew policy", known, err)
	}
}
