package repave

// The upgrader on the rig: an isolated host with a complete (faked, as newWatcherRig does) installation whose
// release blue is a real unpacked bundle, the real watcher running under its unit against the rig's control plane,
// and the real kubeslot-upgrade.path. Upgrades are asked for as an admin would, with AgentUpgrade MachineOperations
// whose bundles (built here with stamped versions) the mirror serves. The subtests run in order on one host.

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"aead.dev/minisign"
	sddbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/mirror"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/bundle"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/release"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/units"
)

type upRig struct {
	t      *testing.T
	ctx    context.Context
	cp     *kube.ControlPlane
	h      *sdhost.Host
	sd     *sddbus.Conn
	admin  *machineapi.Client
	node   string
	root   *hostroot.Root
	dir    *requests.Dir
	mirror *mirror.Server
	ops    int
}

// watcherDropIn is the test's drop-in for the watcher unit: how long a new release stays on probation after its
// upgrade was reported Succeeded (last-good moves to it after that).
func watcherDropIn(probation time.Duration) []byte {
	return []byte(fmt.Sprintf("[Service]\nEnvironment=KUBESLOT_WATCHER_UPGRADE_PROBATION=%s\n", probation))
}

func newUpgradeRig(t *testing.T, ctx context.Context, base, blueVersion string) *upRig {
	t.Helper()
	cp := rig.NeedAPI(t)
	blueBins := rig.BuildRelease(t, blueVersion)
	r := &upRig{t: t, ctx: ctx, cp: cp, admin: rig.AdminAPI(t, cp), node: rig.HostName(base)}
	r.h = rig.StartHost(t, sdhost.Options{Name: r.node, SharedNetwork: true})
	r.sd = rig.Systemd(t, ctx, r.h)
	t.Cleanup(func() { _ = r.admin.DeleteMachine(context.Background(), r.node) })
	var err error
	if r.root, err = hostroot.New(r.h.Root(), ""); err != nil {
		t.Fatal(err)
	}
	r.dir = requests.New(r.root)
	if err := r.root.EnsureLayout(); err != nil {
		t.Fatal(err)
	}
	// Release blue: a real bundle, unpacked as the upgrader would.
	p, sum := rig.MakeUpgradeBundle(t, blueBins, blueVersion)
	blue, err := release.Dir(r.root, "blue")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bundle.Unpack(ctx, p, sum, buildinfo.Arch, blue, bundle.Limits{}); err != nil {
		t.Fatal(err)
	}
	if err := release.SetCurrent(r.root, "blue"); err != nil {
		t.Fatal(err)
	}
	if err := release.SetLastGood(r.root, "blue"); err != nil {
		t.Fatal(err)
	}
	// Applied configuration of slot a, committed; a complete ownership record; the node identity.
	cfg, err := config.Parse("example.toml", config.Example())
	if err != nil {
		t.Fatal(err)
	}
	cfg.Machine.Name, cfg.Machine.NodeName = r.node, r.node
	st := state.NewStore(r.root)
	if err := st.SaveApplied(&state.Applied{Slot: "a", Mode: "nspawn", Fingerprint: cfg.Fingerprint(), AgentVersion: blueVersion,
		AppliedAt: time.Now().UTC(), Config: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := st.SetActive("a"); err != nil {
		t.Fatal(err)
	}
	rec, err := ownership.New(r.node, cfg.Fingerprint(), blueVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ownership.InstallCheckpoints()[1:] {
		if err := rec.SetCheckpoint(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := ownership.Save(r.root, rec); err != nil {
		t.Fatal(err)
	}
	rig.EnrollNode(t, cp, r.node) // as an administrator does before the host joins
	cert, key, err := cp.NodeClientCert(r.node)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.h.WriteFile("/opt/kubeslot/identity/kubeconfig", cp.KubeconfigCert("system:node:"+r.node, cert, key), 0o600); err != nil {
		t.Fatal(err)
	}
	// Every unit of release blue, rendered; the pin target keeps an inactive unit's last result loaded.
	all, err := units.All(units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	all["kubeslot-pin.target"] = []byte("[Unit]\nAfter=" + units.Watcher + " " + units.Recovery + "\n")
	if err := r.h.WriteFile("/etc/systemd/system/"+units.Watcher+".d/zz-test.conf", watcherDropIn(3*time.Second), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.h.InstallUnits(ctx, all); err != nil {
		t.Fatal(err)
	}
	r.start("kubeslot-pin.target")
	if res := r.start(units.Watcher); res != "done" {
		t.Fatalf("start the watcher: %s\n%s", res, r.journal(units.Watcher))
	}
	if res := r.start(units.PathUnit("upgrade")); res != "done" {
		t.Fatalf("start the upgrade path unit: %s", res)
	}
	if r.mirror, err = mirror.Start(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.mirror.Close() })
	return r
}

func (r *upRig) start(unit string) string {
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

func (r *upRig) run(args ...string) string {
	r.t.Helper()
	out, err := r.h.Run(r.ctx, args...)
	if err != nil {
		r.t.Fatal(err)
	}
	return string(out)
}

func (r *upRig) journal(unit string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j, err := r.h.Journal(ctx, unit)
	if err != nil {
		return "journal: " + err.Error()
	}
	return j
}

func (r *upRig) current() string {
	r.t.Helper()
	c, err := release.Current(r.root)
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// watcherExe is the binary the watcher's MainPID runs (inside the host).
func (r *upRig) watcherExe() string {
	pid := rig.ServiceProperty(r.t, r.ctx, r.sd, units.Watcher, "MainPID").(uint32)
	if pid == 0 {
		return ""
	}
	out, err := r.h.Run(r.ctx, "readlink", fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// currentRuns checks that current names a release whose watcher answers --version.
func (r *upRig) currentRuns() {
	r.t.Helper()
	if out, err := r.h.Run(r.ctx, "/opt/kubeslot/current/kubeslot-watcher", "--version"); err != nil {
		r.t.Errorf("current does not run: %v", err)
	} else {
		r.t.Logf("current runs: %s", strings.TrimSpace(string(out)))
	}
}

// operation creates an AgentUpgrade for this host's Machine with the bundle at url.
func (r *upRig) operation(url, sum string) string {
	r.t.Helper()
	r.ops++
	name := fmt.Sprintf("%s-up-%d", r.node, r.ops)
	op := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationAgentUpgrade,
		MachineRef: &v1alpha1.MachineReference{Name: r.node},
		Parameters: &v1alpha1.OperationParameters{BundleURL: v1alpha1.URL(url), BundleSHA256: v1alpha1.SHA256(sum)}}}
	op.Name = name
	if _, err := r.admin.CreateOperation(r.ctx, op); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = r.admin.DeleteOperation(context.Background(), name) })
	return name
}

// result waits for the operation's entry for this Machine to finish and returns it.
func (r *upRig) result(name string, bound time.Duration) (*v1alpha1.MachineOperationTarget, time.Duration) {
	r.t.Helper()
	var got *v1alpha1.MachineOperationTarget
	d := rig.Eventually(r.t, bound, "operation "+name+" finished", func() (bool, string) {
		op, err := r.admin.GetOperation(r.ctx, name)
		if err != nil {
			return false, err.Error()
		}
		got = op.Status.Target(r.node, r.node)
		return got != nil && (got.Phase == v1alpha1.OperationSucceeded || got.Phase == v1alpha1.OperationFailed),
			fmt.Sprintf("%+v", op.Status)
	})
	return got, d
}

// finalStatus is the status file of the request of operation name.
func (r *upRig) finalStatus(name string) *requests.Status {
	st, _, err := r.dir.ListStatus()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, s := range st {
		if s.Operation == name {
			return s
		}
	}
	return nil
}

// phaseSpan is the time from the start of phase a to the end of phase b in s.
func phaseSpan(s *requests.Status, a, b string) time.Duration {
	var start, end time.Time
	for _, p := range s.Phases {
		if p.Name == a && start.IsZero() {
			start = p.StartedAt
		}
		if p.Name == b {
			end = p.StartedAt.Add(p.Duration)
		}
	}
	if start.IsZero() || end.IsZero() {
		return 0
	}
	return end.Sub(start)
}

var rolledBackRE = regexp.MustCompile(`switch to rolled back ([0-9.]+m?s)`)

func TestUpgradeOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	r := newUpgradeRig(t, ctx, "upg", "up-1")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("watcher journal:\n%s", r.journal(units.Watcher))
			t.Logf("upgrade journal:\n%s", r.journal("kubeslot-upgrade.service"))
			t.Logf("recovery journal:\n%s", r.journal(units.Recovery))
		}
	})
	rig.Eventually(t, 60*time.Second, "Machine registered by the watcher", func() (bool, string) {
		m, err := r.admin.GetMachine(ctx, r.node)
		if err != nil {
			return false, err.Error()
		}
		return m.Status.AgentVersion == "up-1", m.Status.AgentVersion
	})
	bins1, bins2, bins3 := rig.BuildRelease(t, "up-1"), rig.BuildRelease(t, "up-2"), rig.BuildRelease(t, "up-3")
	serve := func(name, p string) string {
		t.Helper()
		if _, err := r.mirror.Add(name, p); err != nil {
			t.Fatal(err)
		}
		return r.mirror.URL(name)
	}
	p1, sum1 := rig.MakeUpgradeBundle(t, bins1, "up-1")
	// Release up-2 has one unit more than up-1: upgrading to it installs and enables the unit, going back to up-1
	// removes it.
	const extraUnit = "kubeslot-extra.service"
	p2, sum2 := rig.MakeUpgradeBundleWith(t, bins2, "up-2", map[string]string{
		extraUnit: "[Unit]\nDescription=kubeslot test: a unit only up-2 has\n[Service]\nType=oneshot\nExecStart=/bin/true\n[Install]\nWantedBy=multi-user.target\n"})
	extraInstalled := func() (file, link bool) {
		_, err := r.h.Run(ctx, "test", "-f", "/etc/systemd/system/"+extraUnit)
		_, lerr := r.h.Run(ctx, "test", "-L", "/etc/systemd/system/multi-user.target.wants/"+extraUnit)
		return err == nil, lerr == nil
	}
	url1, url2 := serve("up-1.tar.gz", p1), serve("up-2.tar.gz", p2)

	// good checks an upgrade that ends Succeeded on release rel running version; it returns the time from t0 (the
	// operation's creation) to Succeeded.
	good := func(t *testing.T, name, rel, version string, t0 time.Time) time.Duration {
		t.Helper()
		res, d := r.result(name, 3*time.Minute)
		// Seen Succeeded: within one poll (eventually's interval) of the verdict.
		verdict := time.Since(t0)
		if res.Phase != v1alpha1.OperationSucceeded {
			t.Fatalf("operation %s: %+v, want Succeeded", name, res)
		}
		if c := r.current(); c != rel {
			t.Errorf("current %s, want %s", c, rel)
		}
		if exe := r.watcherExe(); exe != "/opt/kubeslot/releases/"+rel+"/kubeslot-watcher" {
			t.Errorf("watcher runs %q, want release %s's binary", exe, rel)
		}
		rig.Eventually(t, 30*time.Second, "Machine agent version "+version, func() (bool, string) {
			m, err := r.admin.GetMachine(ctx, r.node)
			if err != nil {
				return false, err.Error()
			}
			return m.Status.AgentVersion == version, m.Status.AgentVersion
		})
		if s := r.finalStatus(name); s != nil {
			if h := phaseSpan(s, "switch", "health"); h > 0 {
				rig.Figures.Add("upgrade: switch to healthy new watcher", h)
				t.Logf("figure upgrade switch to healthy %s", h.Round(time.Millisecond))
			}
			if h := phaseSpan(s, "smoke-test", "health"); h > 0 {
				rig.Figures.Add("upgrade: downloaded to healthy new watcher", h)
				t.Logf("figure upgrade downloaded to healthy %s", h.Round(time.Millisecond))
			}
		}
		t.Logf("figure operation %s Succeeded %s after creation (%s waiting)", name, verdict.Round(time.Millisecond), d.Round(time.Millisecond))
		r.currentRuns()
		return verdict
	}
	// verdictFigure is the figure make bench holds to its target: operation created -> Succeeded, for an undisturbed good upgrade.
	verdictFigure := func(d time.Duration) {
		rig.Figures.Add("upgrade: operation created to Succeeded (verdict; probation follows)", d)
	}

	t.Run("Good", func(t *testing.T) {
		// The watcher's unit file is the same in both releases, so the watcher re-executes the new binary in
		// place: same process, same unit invocation, no restart.
		pid := rig.ServiceProperty(t, ctx, r.sd, units.Watcher, "MainPID").(uint32)
		inv := fmt.Sprint(rig.ServiceProperty(t, ctx, r.sd, units.Watcher, "InvocationID"))
		t0 := time.Now()
		name := r.operation(url2, sum2)
		verdictFigure(good(t, name, "green", "up-2", t0))
		// The verdict came before the probation (3 s of watcher uptime here) ended, or with it; then last-good
		// moves to the new release.
		r.probationEnds("green")
		j := r.journal("kubeslot-upgrade.service")
		if !strings.Contains(j, "upgraded") {
			t.Error("the upgrader's journal does not say upgraded")
		}
		if !strings.Contains(j, "re-executed the new release in place") {
			t.Errorf("the upgrader did not see the watcher re-execute:\n%s", j)
		}
		if got := rig.ServiceProperty(t, ctx, r.sd, units.Watcher, "MainPID").(uint32); got != pid {
			t.Errorf("watcher MainPID %d -> %d: want the same process re-executed", pid, got)
		}
		if got := fmt.Sprint(rig.ServiceProperty(t, ctx, r.sd, units.Watcher, "InvocationID")); got != inv {
			t.Error("the watcher unit was started again: want an in-place re-exec")
		}
		if f, l := extraInstalled(); !f || !l {
			t.Errorf("up-2's extra unit: file %v, enable link %v; want both", f, l)
		}
	})

	t.Run("ChecksumMismatch", func(t *testing.T) {
		name := r.operation(url1, strings.Repeat("0", 64))
		res, _ := r.result(name, 2*time.Minute)
		if res.Phase != v1alpha1.OperationFailed || !strings.Contains(res.Message, "checksum") {
			t.Errorf("operation: %+v, want Failed naming the checksum", res)
		}
		if c := r.current(); c != "green" {
			t.Errorf("current %s, want green (unchanged)", c)
		}
		if exe := r.watcherExe(); exe != "/opt/kubeslot/releases/green/kubeslot-watcher" {
			t.Errorf("watcher runs %q", exe)
		}
		r.currentRuns()
	})

	// A host that names trusted keys ([upgrade] trusted_keys in its configuration) refuses a bundle that comes
	// without a signature, or with one by another key, before anything of it is unpacked: whoever could create the
	// operation. Its sha256 matches: only the key is missing.
	t.Run("Unsigned", func(t *testing.T) {
		pub, _, err := minisign.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		_, other, err := minisign.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		pubText, _ := pub.MarshalText() // the .pub file's two lines; the key is the last
		key := strings.TrimSpace(string(pubText))
		key = key[strings.LastIndexByte(key, '\n')+1:]
		// First a file that cannot be read: every bundle is refused, the request failed with why.
		if err := r.h.WriteFile(units.ConfigPath, []byte("[upgrade\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = r.h.Run(context.Background(), "rm", "-f", units.ConfigPath) })
		refused := func(name, want string) {
			t.Helper()
			res, _ := r.result(name, 2*time.Minute)
			if res.Phase != v1alpha1.OperationFailed || !strings.Contains(res.Message, "nothing unpacked") || !strings.Contains(res.Message, want) {
				t.Errorf("operation %s: %+v, want Failed, nothing unpacked, %q", name, res, want)
			}
			if c := r.current(); c != "green" {
				t.Errorf("current %s, want green (unchanged)", c)
			}
		}
		refused(r.operation(url1, sum1), "[upgrade] table")
		doc := strings.Replace(string(config.Example()), "# trusted_keys = [", "trusted_keys = [\""+key+"\"] # [", 1)
		if err := r.h.WriteFile(units.ConfigPath, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		refused(r.operation(url1, sum1), "up-1.tar.gz.minisig")
		f, err := os.Open(p1)
		if err != nil {
			t.Fatal(err)
		}
		mr := minisign.NewReader(f)
		_, err = io.Copy(io.Discard, mr)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		sigFile := filepath.Join(t.TempDir(), "up-1.tar.gz.minisig")
		if err := os.WriteFile(sigFile, mr.Sign(other), 0o644); err != nil {
			t.Fatal(err)
		}
		serve("up-1.tar.gz.minisig", sigFile)
		refused(r.operation(url1, sum1), "not signed by a trusted key")
		r.currentRuns()
	})

	t.Run("Kill9", func(t *testing.T) {
		dropIn := "/etc/systemd/system/kubeslot-upgrade.service.d/zz-pause.conf"
		next := []struct{ url, sum, rel, version string }{{url1, sum1, "blue", "up-1"}, {url2, sum2, "green", "up-2"}}
		// Paused before each phase, killed -9 there: after unpack (before smoke-test), after signal (before switch),
		// after switch (before units), after units (before restart), after restart (before health; a kill after the
		// health gate leaves the same files).
		for i, phase := range []string{"smoke-test", "switch", "units", "restart", "health"} {
			t.Run(phase, func(t *testing.T) {
				n := next[i%2]
				if err := r.h.WriteFile(dropIn, []byte("[Service]\nEnvironment=KUBESLOT_TEST_PAUSE_AT="+phase+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				if err := r.sd.ReloadContext(ctx); err != nil {
					t.Fatal(err)
				}
				t0 := time.Now()
				name := r.operation(n.url, n.sum)
				deadline := time.Now().Add(2 * time.Minute)
				for !strings.Contains(r.journal("kubeslot-upgrade.service"), "paused before "+phase) {
					if time.Now().After(deadline) {
						t.Fatalf("the upgrader did not pause at %s", phase)
					}
					time.Sleep(500 * time.Millisecond)
				}
				// The paused process keeps its environment: the pause goes before the kill, so that the resume runs
				// without it. kubeslot-upgrade.path watches the claimed request too, and starts the worker again
				// after the kill: nobody re-runs it by hand.
				r.run("rm", "-f", dropIn)
				if err := r.sd.ReloadContext(ctx); err != nil {
					t.Fatal(err)
				}
				_ = r.sd.KillUnitWithTarget(ctx, "kubeslot-upgrade.service", sddbus.All, int32(syscall.SIGKILL))
				t.Logf("killed at %s: current %s", phase, r.current())
				r.currentRuns()
				good(t, name, n.rel, n.version, t0)
				if f, l := extraInstalled(); (f || l) != (n.version == "up-2") {
					t.Errorf("on %s, up-2's extra unit: file %v, enable link %v", n.version, f, l)
				}
			})
		}
	})

	p3bad, sum3bad := rig.MakeUpgradeBundle(t, bins3, "up-3", "Environment=KUBESLOT_TEST_WATCHER_EXIT_AFTER=0s")
	url3bad := serve("up-3-exits.tar.gz", p3bad)

	t.Run("ExitsAtOnceRolledBack", func(t *testing.T) {
		from, fromExe := r.current(), r.watcherExe()
		t0 := time.Now()
		name := r.operation(url3bad, sum3bad)
		res, _ := r.result(name, 3*time.Minute)
		// The upgrader's health gate rolls back, or the recovery unit (started by the failed watcher's
		// ExecStopPost=) does first: Failed either way, naming the new watcher.
		if res.Phase != v1alpha1.OperationFailed || !strings.Contains(res.Message, "new watcher up-3") ||
			!(strings.Contains(res.Message, "rolled back") || strings.Contains(res.Message, "recovered to")) {
			t.Errorf("operation: %+v, want Failed: new watcher up-3 ... rolled back (or recovered to)", res)
		}
		if c := r.current(); c != from {
			t.Errorf("current %s, want %s", c, from)
		}
		rig.Eventually(t, 60*time.Second, "old watcher running", func() (bool, string) {
			exe := r.watcherExe()
			return exe == fromExe, exe
		})
		rig.Figures.Add("upgrade: bad watcher, operation created to Failed", time.Since(t0))
		if m := rolledBackRE.FindStringSubmatch(r.journal("kubeslot-upgrade.service")); m != nil {
			if d, err := time.ParseDuration(m[1]); err == nil {
				rig.Figures.Add("upgrade: switch to old watcher active again (rollback)", d)
			}
		}
		t.Logf("figure rollback by the upgrader: operation Failed %s after creation", time.Since(t0).Round(time.Millisecond))
		r.currentRuns()
	})

	p3late, sum3late := rig.MakeUpgradeBundle(t, bins3, "up-3", "Environment=KUBESLOT_TEST_WATCHER_EXIT_AFTER=20s", "StartLimitBurst=3")
	r.probationCases(t, probationBundles{late: [2]string{serve("up-3-late.tar.gz", p3late), sum3late},
		byRelease: map[string][3]string{"blue": {url1, sum1, "up-1"}, "green": {url2, sum2, "up-2"}}}, verdictFigure)
}
