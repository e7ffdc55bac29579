package nspawn

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/systemdconn/sdtest"
)

// fakeNode is a node's systemd reached directly: it logs each call, and its
// halt ends the machine as the node's own would.
type fakeNode struct {
	mu     *sync.Mutex
	calls  *[]string
	leader int
	sd     *sdtest.Systemd
}

func (n fakeNode) log(c string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	*n.calls = append(*n.calls, c)
}

func (n fakeNode) StartUnits(_ context.Context, names ...string) error {
	n.log("start " + strings.Join(names, " "))
	return nil
}

func (n fakeNode) StopUnits(_ context.Context, names ...string) error {
	n.log("stop " + strings.Join(names, " "))
	return nil
}

func (n fakeNode) Halt(context.Context) error {
	n.log("halt")
	n.sd.HaltLeader(n.leader)
	return nil
}

func (n fakeNode) Close() { n.log("close") }

// TestStartStopThroughTheNodeSystemd: with Deps.Node, Start and Stop ask the
// node's systemd directly, dialled at the machine's leader, and run no
// systemctl in the node (each one a process inside the downtime); a node
// that cannot be reached that way gets systemctl, as before.
func TestStartStopThroughTheNodeSystemd(t *testing.T) {
	for _, reachable := range []bool{true, false} {
		e := newEnv(t)
		var (
			mu      sync.Mutex
			calls   []string
			leaders []int
		)
		d := e.deps(e.config(nil))
		d.Node = func(_ context.Context, leader int) (hostapi.NodeSystemd, error) {
			leaders = append(leaders, leader)
			if !reachable {
				return nil, errors.New("no such socket")
			}
			return fakeNode{mu: &mu, calls: &calls, leader: leader, sd: e.sd}, nil
		}
		b, err := New(d)
		if err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		serving(t, b, "a")
		if err := b.Stop(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(leaders, []int{4242, 4242}) {
			t.Errorf("reachable %v: dialled leaders %v, want slot a's twice (start, stop)", reachable, leaders)
		}
		var systemctl []string
		for _, c := range e.run.Inner() {
			if strings.HasPrefix(c, "systemctl start") || strings.HasPrefix(c, "systemctl stop") || strings.HasPrefix(c, "systemctl --force") {
				systemctl = append(systemctl, c)
			}
		}
		want, wantSystemctl := []string{"start containerd.service kubelet.service", "close",
			"stop kubelet.service containerd.service", "halt", "close"}, []string(nil)
		if !reachable {
			want, wantSystemctl = nil, []string{"systemctl start containerd.service kubelet.service",
				"systemctl stop kubelet.service containerd.service", "systemctl --force halt"}
		}
		if !slices.Equal(calls, want) {
			t.Errorf("reachable %v: node systemd calls %q, want %q", reachable, calls, want)
		}
		if !slices.Equal(systemctl, wantSystemctl) {
			t.Errorf("reachable %v: systemctl in the node %q, want %q", reachable, systemctl, wantSystemctl)
		}
		sdCalls := e.sd.Calls()
		if got, want := sdCalls[len(sdCalls)-2:], []string{"halt a", "stop systemd-nspawn@a.service"}; !slices.Equal(got, want) {
			t.Errorf("reachable %v: systemd calls %v, want them to end with %v", reachable, sdCalls, want)
		}
	}
}
