package watcher

// Set-up for the watcher tests: an isolated host sharing the machine's network (so it reaches the rig's apiserver on
// 127.0.0.1) with the freshly built binaries bound in as release "blue", a host root laid down directly through the
// host's root (ownership record, applied config, active slot, node identity) and the real watcher unit.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
	"github.com/kubeslot/kubeslot/units"
)

type watcherRig struct {
	t       *testing.T
	ctx     context.Context
	cp      *kube.ControlPlane
	h       *sdhost.Host
	sd      *sddbus.Conn
	admin   *machineapi.Client
	node    string // node and machine name
	root    *hostroot.Root
	dir     *requests.Dir
	record  *ownership.Record
	applied *config.Config
}

func newWatcherRig(t *testing.T, ctx context.Context, base string) *watcherRig {
	t.Helper()
	cp := rig.NeedAPI(t)
	bins := rig.NeedBins(t)
	r := &watcherRig{t: t, ctx: ctx, cp: cp, admin: rig.AdminAPI(t, cp), node: rig.HostName(base)}
	r.h = rig.StartHost(t, sdhost.Options{Name: r.node, SharedNetwork: true, Binds: []sdhost.Bind{
		{Source: bins, Target: "/opt/kubeslot/releases/blue", ReadOnly: true},
	}})
	r.sd = rig.Systemd(t, ctx, r.h)
	t.Cleanup(func() {
		_ = r.admin.DeleteMachine(context.Background(), r.node)
	})
	var err error
	if r.root, err = hostroot.New(r.h.Root(), ""); err != nil {
		t.Fatal(err)
	}
	r.dir = requests.New(r.root)
	if err := r.root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	r.run("ln", "-sfn", "releases/blue", "/opt/kubeslot/current")

	// Applied configuration of slot a, committed.
	cfg := testhost.Example(t)
	cfg.Machine.Name, cfg.Machine.NodeName = r.node, r.node
	r.applied = cfg
	st := state.NewStore(r.root)
	if err := st.SaveApplied(&state.Applied{Slot: "a", Mode: "nspawn", Fingerprint: cfg.Fingerprint(), AgentVersion: "devel",
		AppliedAt: time.Now().UTC(), Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetActive("a"); err != nil {
		t.Fatal(err)
	}
	// Ownership record, left at the first checkpoint until a test completes it.
	if r.record, err = ownership.New(r.node, cfg.Fingerprint(), "devel"); err != nil {
		t.Fatal(err)
	}
	if err := ownership.Save(r.root, r.record); err != nil {
		t.Fatal(err)
	}
	// Node identity.
	rig.EnrollNode(t, cp, r.node) // as an administrator does before the host joins
	cert, key, err := cp.NodeClientCert(r.node)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.h.WriteFile("/opt/kubeslot/identity/kubeconfig", cp.KubeconfigCert("system:node:"+r.node, cert, key), 0o600); err != nil {
		t.Fatal(err)
	}
	w, err := units.Render(units.Watcher, units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := units.Render(units.Recovery, units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	// Short restart delay only; the rest is the unit as shipped. The pin target keeps an inactive unit's last
	// result loaded.
	if err := r.h.WriteFile("/etc/systemd/system/"+units.Watcher+".d/zz-test.conf", []byte("[Service]\nRestartSec=300ms\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.h.InstallUnits(ctx, map[string][]byte{units.Watcher: w, units.Recovery: rec,
		"kubeslot-pin.target": []byte("[Unit]\nAfter=" + units.Watcher + "\n")}); err != nil {
		t.Fatal(err)
	}
	r.start("kubeslot-pin.target")
	return r
}

func (r *watcherRig) run(args ...string) string {
	r.t.Helper()
	out, err := r.h.Run(r.ctx, args...)
	if err != nil {
		r.t.Fatal(err)
	}
	return string(out)
}

func (r *watcherRig) start(unit string) string {
	r.t.Helper()
	ch := make(chan string, 1)
	if _, err := r.sd.StartUnitContext(r.ctx, unit, "replace", ch); err != nil {
		r.t.Fatalf("start %s: %v", unit, err)
	}
	select {
	case res := <-ch:
		return res
	case <-r.ctx.Done():
		r.t.Fatalf("start %s: %v", unit, r.ctx.Err())
	}
	return ""
}

func (r *watcherRig) complete() {
	r.t.Helper()
	for _, cp := range ownership.InstallCheckpoints()[1:] {
		if err := r.record.SetCheckpoint(cp); err != nil {
			r.t.Fatal(err)
		}
	}
	if err := ownership.Save(r.root, r.record); err != nil {
		r.t.Fatal(err)
	}
}

func (r *watcherRig) journal() string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j, err := r.h.Journal(ctx, units.Watcher)
	if err != nil {
		return "journal: " + err.Error()
	}
	return j
}

// updateSpec changes the Machine as an admin would, again on a conflict with the watcher's status writes, and
// returns the new generation.
func (r *watcherRig) updateSpec(t *testing.T, change func(*v1alpha1.Machine)) int64 {
	t.Helper()
	for attempt := 1; ; attempt++ {
		m, err := r.admin.GetMachine(r.ctx, r.node)
		if err != nil {
			t.Fatal(err)
		}
		change(m)
		out, err := r.admin.UpdateMachine(r.ctx, m)
		if err == nil {
			return out.Generation
		}
		if !apierrors.IsConflict(errors.Unwrap(err)) && !apierrors.IsConflict(err) || attempt == 10 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *watcherRig) svc(name string) any {
	return rig.ServiceProperty(r.t, r.ctx, r.sd, units.Watcher, name)
}

// requestFile reads requests/<kind>.json, or "" when absent.
func (r *watcherRig) pendingID(kind requests.Kind) string {
	p, err := r.dir.Pending(kind)
	if err != nil {
		r.t.Fatal(err)
	}
	if p == nil {
		return ""
	}
	return p.ID
}

// claim does what a worker does: rename the request into state/.
func (r *watcherRig) claim(kind requests.Kind) *requests.Request {
	r.t.Helper()
	src, _ := r.dir.RequestPath(kind)
	dst, _ := r.dir.ClaimedPath(kind)
	b, err := os.ReadFile(src)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := os.Rename(src, dst); err != nil {
		r.t.Fatal(err)
	}
	var req requests.Request
	if err := json.Unmarshal(b, &req); err != nil {
		r.t.Fatal(err)
	}
	return &req
}

// rss is the watcher's resident set from /proc/PID/status.
func (r *watcherRig) rss() string {
	pid := r.svc("MainPID").(uint32)
	// MainPID is a PID of the host's namespace: read it through the host's own /proc.
	b, err := os.ReadFile(fmt.Sprintf("%s/proc/%d/status", r.h.Root(), pid))
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(l, "VmRSS:"))
		}
	}
	return "?"
}
