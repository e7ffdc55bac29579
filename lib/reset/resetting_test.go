package reset

import (
	"context"
	"errors"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/units"
)

// The unit's ExecStart= and ExecStopPost= name the same files the Go code
// writes and removes: a rename on one side only would strand the unit.
func TestResettingUnitNamesWhatTheCodeUses(t *testing.T) {
	root, err := hostroot.New(t.TempDir(), "/srv/ks")
	if err != nil {
		t.Fatal(err)
	}
	data, err := units.RenderResetting(units.Vars{Base: root.Base()}, false)
	if err != nil {
		t.Fatal(err)
	}
	unit := string(data)
	copyPath := root.HostPath(hostroot.ResettingDir, resettingBinary)
	if !strings.Contains(unit, "\nExecStart="+copyPath+" --resume") {
		t.Errorf("ExecStart= does not run %s --resume:\n%s", copyPath, unit)
	}
	var post string
	for _, l := range strings.Split(unit, "\n") {
		if strings.HasPrefix(l, "ExecStopPost=") {
			post = l
		}
	}
	for _, p := range []string{"test -e " + copyPath, resettingLink(), path.Join(hostroot.UnitDir, units.Resetting), "rmdir " + root.Base()} {
		if !strings.Contains(post, p) {
			t.Errorf("ExecStopPost= does not name %q: %s", p, post)
		}
	}
	if !strings.Contains(resettingLink(), "/"+units.ResettingWantedBy+".wants/") || !strings.Contains(unit, "WantedBy="+units.ResettingWantedBy+"\n") {
		t.Errorf("enablement link %s does not match the unit's [Install]", resettingLink())
	}
	if !strings.Contains(unit, "Environment=KUBESLOT_REQUEST=\n") {
		t.Errorf("a reset by hand must resume without a request")
	}
	req, _ := units.RenderResetting(units.Vars{Base: root.Base()}, true)
	if !strings.Contains(string(req), "Environment=KUBESLOT_REQUEST=reset\n") {
		t.Errorf("a reset for a request must resume with it")
	}
}

// A reset by hand installs the resetting unit too (for the next boot), with
// no request: after a failure, the unit's run finishes the same reset.
func TestHandResetLeavesTheUnitForBoot(t *testing.T) {
	h := newHost(t)
	d := h.deps()
	injected := errors.New("power cut")
	d.Before = func(ctx context.Context, s string) error {
		if s == StepRemoveRootfs {
			return injected
		}
		return nil
	}
	if _, err := Run(t.Context(), d); !errors.Is(err, injected) {
		t.Fatalf("first run: %v", err)
	}
	if !strings.Contains(h.read("/etc/systemd/system/"+units.Resetting), "KUBESLOT_REQUEST=\n") ||
		!h.exists("/etc/systemd/system/multi-user.target.wants/"+units.Resetting) ||
		h.read("/opt/kubeslot/resetting/kubeslot-resetter") != h.readLocal(h.self) {
		t.Fatalf("the resetting unit is not installed for the next boot")
	}
	if slices.Contains(h.sd.Calls(), "start "+units.Resetting) {
		t.Errorf("a reset by hand started the resetting unit: it runs the steps itself")
	}
	// At boot: the unit's run.
	d2 := h.deps()
	d2.Resume = true
	res, err := Run(t.Context(), d2)
	if err != nil || res.Nothing || !res.Resumed {
		t.Fatalf("the resetting unit's run: %+v %v", res, err)
	}
	checkReset(t, h)
}

// What a run killed in its last step leaves, each state cleared by the next
// run of the resetting unit (or, with the copy gone, by any run), and a
// stale unit never resets a host bootstrapped again.
func TestResettingUnitLeftovers(t *testing.T) {
	unitFile := "/etc/systemd/system/" + units.Resetting
	link := "/etc/systemd/system/multi-user.target.wants/" + units.Resetting
	copyFile := "/opt/kubeslot/resetting/kubeslot-resetter"
	for _, c := range []struct {
		name     string
		resume   bool
		keepCopy bool
		record   bool
	}{
		{"record gone, copy left: restarted", true, true, false},
		{"record and copy gone: by hand", false, false, false},
		{"stale unit on a host bootstrapped again", true, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost(t)
			if _, err := Run(t.Context(), h.deps()); err != nil {
				t.Fatal(err)
			}
			data, _ := units.RenderResetting(units.Vars{}, true)
			h.write(unitFile, string(data))
			h.link(link, unitFile)
			if c.keepCopy {
				h.write(copyFile, "binary")
			}
			if c.record {
				rec, _ := ownership.New("m2", "fedcba", "test")
				rec.SetCheckpoint(ownership.CheckpointComplete)
				if err := ownership.Save(h.root, rec); err != nil {
					t.Fatal(err)
				}
			}
			h.sd.ForgetCalls()
			d := h.deps()
			d.Resume, d.Request = c.resume, c.resume
			res, err := Run(t.Context(), d)
			if err != nil || !res.Nothing {
				t.Fatalf("run: %+v %v", res, err)
			}
			for _, p := range []string{unitFile, link, copyFile} {
				if h.exists(p) {
					t.Errorf("%s left", p)
				}
			}
			if !slices.Contains(h.sd.Calls(), "reload") {
				t.Errorf("systemd not reloaded after the unit went")
			}
			rec, err := ownership.Load(h.root)
			if c.record && (err != nil || rec == nil || rec.Checkpoint != ownership.CheckpointComplete) {
				t.Errorf("the host bootstrapped again was touched: %+v %v", rec, err)
			}
			if !c.record && h.exists("/opt/kubeslot") {
				t.Errorf("empty host root left")
			}
		})
	}
}
