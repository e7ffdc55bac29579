package isolation

import (
	"context"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/isolation/nspawn"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/testkit"
	"github.com/kubeslot/kubeslot/lib/testkit/testhost"
)

// Compile-time: the nspawn types are the interfaces.
var (
	_ Backend        = (*nspawn.Backend)(nil)
	_ CRIEndpoint    = (*nspawn.Backend)(nil)
	_ KubeletPatcher = (*nspawn.Backend)(nil)
	_ Operator       = (*nspawn.Operator)(nil)
)

func TestTableMapsEveryConfigMode(t *testing.T) {
	// Every mode the configuration accepts can be operated, and the table
	// has no mode the configuration would refuse.
	want := slices.Clone(config.Modes)
	sort.Strings(want)
	if got := Modes(); !slices.Equal(got, want) {
		t.Errorf("composition table modes %v, config.Modes %v", got, want)
	}
	for m, e := range table {
		if e.NewBackend == nil || e.NewOperator == nil {
			t.Errorf("mode %s: incomplete entry", m)
		}
	}
	if string(DefaultMode) != config.DefaultMode {
		t.Errorf("DefaultMode %q, config.DefaultMode %q", DefaultMode, config.DefaultMode)
	}
}

func TestModeNormalisation(t *testing.T) {
	if m := Mode(""); !m.Valid() || m.String() != "nspawn" || m.Normal() != ModeNspawn {
		t.Errorf("empty mode: valid %v, %q", m.Valid(), m)
	}
	if m, err := ParseMode(""); err != nil || m != ModeNspawn {
		t.Errorf("ParseMode(\"\") = %q, %v", m, err)
	}
	_, err := ParseMode("kvm")
	if err == nil || !strings.Contains(err.Error(), `"kvm"`) || !strings.Contains(err.Error(), "nspawn") {
		t.Errorf("unknown mode: %v", err)
	}
	if Mode("kvm").Valid() {
		t.Error("kvm valid")
	}
}

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	return testhost.Config(t, testhost.Doc{Server: "https://203.0.113.10:6443"})
}

// nopSystemd and nopRunner satisfy the interfaces; For only builds.
type nopSystemd struct{ SystemdConn }
type nopRunner struct{}

func (nopRunner) Run(context.Context, string, ...string) ([]byte, error) { return nil, nil }

func TestForBuildsTheModesBackendAndOperator(t *testing.T) {
	root := testkit.Root(t)
	deps := Deps{Root: root, Config: testConfig(t), Systemd: nopSystemd{}, Exec: nopRunner{}}
	b, o, err := For("", deps)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := b.(*nspawn.Backend); !ok {
		t.Errorf("default mode backend is %T", b)
	}
	if _, ok := o.(*nspawn.Operator); !ok {
		t.Errorf("default mode operator is %T", o)
	}
	if _, _, err := ForConfig(deps); err != nil {
		t.Errorf("ForConfig: %v", err)
	}

	if _, _, err := For("kvm", deps); err == nil || !strings.Contains(err.Error(), `"kvm"`) {
		t.Errorf("unknown mode: %v", err)
	}
	// A configuration of another mode (not one config accepts today, so
	// set it by hand) must not be bound to this mode's backend.
	other := *deps.Config
	other.Isolation.Mode = "vm"
	d2 := deps
	d2.Config = &other
	if _, _, err := For(ModeNspawn, d2); err == nil || !strings.Contains(err.Error(), `"vm"`) {
		t.Errorf("mismatched configuration: %v", err)
	}
	d3 := deps
	d3.Exec = nil
	if _, _, err := For(ModeNspawn, d3); err == nil || !strings.Contains(err.Error(), "Exec") {
		t.Errorf("missing Exec: %v", err)
	}
}

func TestAppliedRecordsTheMode(t *testing.T) {
	root := testkit.LaidOut(t)
	cfg := testConfig(t)
	a, err := NewApplied("b", cfg, "v0.1.0", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if a.Mode != "nspawn" || a.Fingerprint != cfg.Fingerprint() || a.Slot != "b" {
		t.Errorf("applied: %+v", a)
	}
	st := state.NewStore(root)
	if err := st.SaveApplied(a); err != nil {
		t.Fatal(err)
	}
	back, err := st.LoadApplied("b")
	if err != nil {
		t.Fatal(err)
	}
	if m, err := AppliedMode(back); err != nil || m != ModeNspawn {
		t.Errorf("AppliedMode = %q, %v", m, err)
	}
	back.Mode = ""
	if m, err := AppliedMode(back); err != nil || m != ModeNspawn {
		t.Errorf("AppliedMode of an empty mode = %q, %v", m, err)
	}
	back.Mode = "kvm"
	if _, err := AppliedMode(back); err == nil || !strings.Contains(err.Error(), `"kvm"`) || !strings.Contains(err.Error(), "slot b") {
		t.Errorf("AppliedMode of an unknown mode: %v", err)
	}
	if _, err := NewApplied("c", cfg, "v0.1.0", time.Now()); err == nil {
		t.Error("applied configuration for an unconfigured slot")
	}
}

// TestModeNamesItsHostUnits: the stages get the nspawn machine unit and its
// boot links from the mode, with the names systemd and `machinectl enable`
// use; the empty mode is the default's.
func TestModeNamesItsHostUnits(t *testing.T) {
	for _, m := range []Mode{"", ModeNspawn} {
		if got := m.MachineUnit("a"); got != "systemd-nspawn@a.service" {
			t.Errorf("%q: MachineUnit(a) = %q", m, got)
		}
		if got, want := m.BootLink("b"), (Link{Path: "/etc/systemd/system/machines.target.wants/systemd-nspawn@b.service", Unit: "systemd-nspawn@.service"}); got != want {
			t.Errorf("%q: BootLink(b) = %+v, want %+v", m, got, want)
		}
		if got, want := m.BootTargetLink(), (Link{Path: "/etc/systemd/system/multi-user.target.wants/machines.target", Unit: "machines.target"}); got != want {
			t.Errorf("%q: BootTargetLink = %+v, want %+v", m, got, want)
		}
	}
	for p, want := range map[string]bool{
		"/etc/systemd/system/systemd-nspawn@a.service.d":                     true,
		"/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf":       true,
		"/etc/systemd/system/machines.target.wants/systemd-nspawn@a.service": true,
		"/etc/systemd/system/multi-user.target.wants/machines.target":        true,
		"/etc/systemd/system/machines.target":                                false, // a unit file, not a link to it
		"/etc/systemd/system/kubeslot-watcher.service":                       false,
	} {
		if got := OwnsMachineUnit(p); got != want {
			t.Errorf("OwnsMachineUnit(%s) = %v, want %v", p, got, want)
		}
	}
}
