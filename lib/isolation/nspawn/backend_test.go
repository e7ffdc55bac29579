package nspawn

import (
	"context"
	"errors"
	"fmt"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

func TestProvisionConfigureJournalBeforeCreate(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/var/lib/machines/a/etc/os-release", "/var/lib/machines/a/" + stampPath,
		"/var/lib/machines/a/etc/kubernetes/kubelet-config.yaml", "/var/lib/machines/a/etc/machine-id",
		"/var/lib/machines/a/etc/systemd/system/kubelet.service", "/opt/kubeslot/identity"} {
		if !e.exists(p) {
			t.Errorf("%s missing", p)
		}
	}
	if got := e.read("/var/lib/machines/a/usr/local/bin/kubelet"); got != string(e.kubelet) {
		t.Errorf("kubelet binary: %q", got)
	}
	if e.exists("/var/lib/machines/.a.partial") {
		t.Error("staging tree left behind")
	}
	var got []string
	for _, c := range e.rec.Journal {
		got = append(got, string(c.Kind)+" "+c.Path)
		if c.Prior.State != ownership.PriorAbsent {
			t.Errorf("%s %s: prior %s, want absent", c.Kind, c.Path, c.Prior.State)
		}
	}
	want := []string{
		"dir /var/lib/machines", "machine-rootfs /var/lib/machines/.a.partial", "machine-rootfs /var/lib/machines/a",
		"dir /etc/systemd/nspawn", "dir /etc/systemd/system/systemd-nspawn@a.service.d",
		"nspawn-settings /etc/systemd/nspawn/a.nspawn", "unit /etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf",
	}
	if !slices.Equal(got, want) {
		t.Errorf("journal:\n got %q\nwant %q", got, want)
	}
	e.checkJournalledBeforeCreated()
	// The journal is on disk, not only in memory.
	if rec, err := ownership.Load(e.root); err != nil || len(rec.Journal) != len(want) {
		t.Errorf("saved record: %v, %d entries", err, len(rec.Journal))
	}
	if e.sd.Reloads != 1 {
		t.Errorf("%d reloads after the first configure, want 1", e.sd.Reloads)
	}

	// Idempotent: nothing rewritten, no reload, no new journal entries.
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if e.sd.Reloads != 1 || len(e.rec.Journal) != len(want) {
		t.Errorf("second run: %d reloads, %d journal entries", e.sd.Reloads, len(e.rec.Journal))
	}
}

func TestHostSideSettings(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	settings := e.read("/etc/systemd/nspawn/a.nspawn")
	for _, w := range []string{"Boot=yes\n", "PrivateUsers=no\n", "Capability=all\n", "VirtualEthernet=no\n", "Private=no\n",
		"Bind=/opt/kubeslot/identity:/var/lib/kubelet/pki\n"} {
		if !strings.Contains(settings, w) {
			t.Errorf("a.nspawn lacks %q:\n%s", w, settings)
		}
	}
	// The temp host has neither /lib/modules nor /dev/kvm.
	if strings.Contains(settings, "/lib/modules") || strings.Contains(settings, "kvm") {
		t.Errorf("a.nspawn binds what the host lacks:\n%s", settings)
	}
	dropIn := e.read("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf")
	for _, w := range []string{"[Service]\n", "Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=network\n", "TimeoutStopSec=2\n"} {
		if !strings.Contains(dropIn, w) {
			t.Errorf("drop-in lacks %q:\n%s", w, dropIn)
		}
	}

	// With the host's modules and the rig's read-only network sysctls.
	if err := os.MkdirAll(filepath.Join(e.root.Prefix(), "lib/modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	d := e.deps(e.config(nil))
	d.Settings.ReadOnlyNetSysctl = true
	b2, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := b2.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if s := e.read("/etc/systemd/nspawn/a.nspawn"); !strings.Contains(s, "BindReadOnly=/lib/modules\n") {
		t.Errorf("a.nspawn does not bind /lib/modules:\n%s", s)
	}
	if s := e.read("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf"); strings.Contains(s, "SYSTEMD_NSPAWN_API_VFS_WRITABLE") {
		t.Errorf("ReadOnlyNetSysctl ignored:\n%s", s)
	}
	if e.sd.Reloads != 2 {
		t.Errorf("%d reloads, want 2 (the drop-in changed once)", e.sd.Reloads)
	}
}

func TestProvisionChecksumMismatchChangesNothing(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(func(s string) string {
		return strings.Replace(s, digest(e.kubelet), strings.Repeat("0", 64), 1)
	})
	err := e.backend(cfg).Provision(t.Context(), "a")
	if !errorsIs(err, artifact.ErrChecksum) || !strings.Contains(err.Error(), "kubelet") {
		t.Fatalf("want a kubelet checksum error, got %v", err)
	}
	for _, p := range []string{"/var/lib/machines", "/var/lib/machines/a", "/var/lib/machines/.a.partial"} {
		if e.exists(p) {
			t.Errorf("%s created despite the bad checksum", p)
		}
	}
	if len(e.rec.Journal) != 0 {
		t.Errorf("journal: %+v", e.rec.Journal)
	}
}

func TestProvisionRefusesForeignDirectory(t *testing.T) {
	e := newEnv(t)
	e.put("/var/lib/machines/a/important", []byte("someone else's"))
	err := e.backend(nil).Provision(t.Context(), "a")
	if err == nil || !strings.Contains(err.Error(), "not made by kubeslot") {
		t.Fatalf("got %v", err)
	}
	if e.read("/var/lib/machines/a/important") != "someone else's" {
		t.Error("foreign directory changed")
	}
	if err := e.backend(nil).Remove(t.Context(), "a"); err == nil || !e.exists("/var/lib/machines/a/important") {
		t.Errorf("Remove of a foreign directory: %v", err)
	}
}

func TestProvisionRebuildsForOtherArtifacts(t *testing.T) {
	e := newEnv(t)
	if err := e.backend(nil).Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	e.put("/var/lib/machines/a/var/tmp/leftover", []byte("x"))
	kubelet2 := []byte("#!/bin/sh\necho kubelet v2\n")
	e.put("/srv/kubelet2", kubelet2)
	cfg2 := e.config(func(s string) string {
		s = strings.Replace(s, `url = "/srv/kubelet"`, `url = "/srv/kubelet2"`, 1)
		return strings.Replace(s, digest(e.kubelet), digest(kubelet2), 1)
	})
	b2 := e.backend(cfg2)
	// Not while its node runs.
	e.sd.Units[unitName("a")] = "active"
	if err := b2.Provision(t.Context(), "a"); err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("rebuild of a running slot: %v", err)
	}
	e.sd.Units[unitName("a")] = "inactive"
	if err := b2.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if got := e.read("/var/lib/machines/a/usr/local/bin/kubelet"); got != string(kubelet2) {
		t.Errorf("kubelet after rebuild: %q", got)
	}
	if e.exists("/var/lib/machines/a/var/tmp/leftover") {
		t.Error("rebuild kept the old tree")
	}
}

func TestRemoveIdempotent(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	if err := b.Remove(ctx, "a"); err != nil {
		t.Fatalf("remove of a slot never made: %v", err)
	}
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.put("/var/lib/machines/.a.partial/crash-leftover", []byte("x"))
	if err := b.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Remove(ctx, "a"); err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("remove of a running slot: %v", err)
	}
	if err := b.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	reloads := e.sd.Reloads
	for i := range 2 {
		if err := b.Remove(ctx, "a"); err != nil {
			t.Fatalf("remove %d: %v", i+1, err)
		}
	}
	for _, p := range []string{"/var/lib/machines/a", "/var/lib/machines/.a.partial", "/etc/systemd/nspawn/a.nspawn",
		"/etc/systemd/system/systemd-nspawn@a.service.d"} {
		if e.exists(p) {
			t.Errorf("%s left after remove", p)
		}
	}
	if e.sd.Reloads != reloads {
		t.Errorf("%d reloads for two removes, want none (the next configure reloads)", e.sd.Reloads-reloads)
	}
	if !e.exists("/opt/kubeslot/identity") {
		t.Error("remove took the node identity")
	}
	// The slot built again: its drop-in is written afresh, and systemd reloads it.
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if e.sd.Reloads != reloads+1 {
		t.Errorf("%d reloads when the removed slot was configured again, want 1", e.sd.Reloads-reloads)
	}
}

func TestStartStopOrder(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	if err := b.Start(ctx, "a"); err == nil {
		t.Fatal("start of an unconfigured slot succeeded")
	}
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	var polls atomic.Int32
	e.run.answer = func(cmd string) ([]byte, error) {
		if strings.HasSuffix(cmd, "is-system-running") && polls.Add(1) < 3 {
			return []byte("starting\n"), errors.New("exit status 1")
		}
		return []byte("running\n"), nil
	}
	// Warm first (a repave's standby): booted, not serving, nothing started inside.
	serving := "/var/lib/machines/a" + nodeconfig.ServingFile
	if err := b.Boot(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if e.exists(serving) {
		t.Error("a warm boot marked the slot as serving")
	}
	for _, c := range e.run.Inner() {
		if strings.HasPrefix(c, "systemctl start") || strings.HasPrefix(c, "systemctl enable") {
			t.Errorf("a warm boot ran %q in the node", c)
		}
	}
	booted := polls.Load()
	if err := b.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if !e.exists(serving) {
		t.Error("start did not mark the slot as serving")
	}
	if got := polls.Load(); got != booted { // inside a repave's downtime: the warm boot was waited for already
		t.Errorf("start on the warm machine asked its systemd again (%d polls after %d)", got, booted)
	}
	if polls.Load() < 3 {
		t.Errorf("start did not wait for the node to boot (%d polls)", polls.Load())
	}
	if !slices.Contains(e.sd.Calls(), "start systemd-nspawn@a.service") {
		t.Errorf("systemd calls: %v", e.sd.Calls())
	}
	inner := e.run.Inner()
	if last := inner[len(inner)-1]; last != "systemctl start containerd.service kubelet.service" {
		t.Errorf("last command in the node: %q", last)
	}
	for _, c := range e.run.cmds {
		if strings.HasPrefix(c, "nsenter ") && !strings.HasPrefix(c, "nsenter -t 4242 -a env -i PATH=") {
			t.Errorf("node command not run in the machine's leader namespaces: %q", c)
		}
	}

	if err := b.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// The kubelet and containerd stopped, then the node halted from inside
	// (no unit-by-unit shutdown), then its unit stopped for certain.
	inner = e.run.Inner()
	if got, want := inner[len(inner)-2:], []string{"systemctl stop kubelet.service containerd.service", "systemctl --force halt"}; !slices.Equal(got, want) {
		t.Errorf("stop: last commands in the node %q, want %q", got, want)
	}
	calls := e.sd.Calls()
	if got, want := calls[len(calls)-2:], []string{"halt a", "stop systemd-nspawn@a.service"}; !slices.Equal(got, want) {
		t.Errorf("stop: systemd calls %v, want them to end with %v", calls, want)
	}
	n := len(e.run.cmds)
	if err := b.Stop(ctx, "a"); err != nil {
		t.Fatalf("stop of a stopped node: %v", err)
	}
	if len(e.run.cmds) != n {
		t.Error("stop of a stopped node ran commands")
	}
}

// TestStopWhenTheHaltFails: a node whose systemd refuses the halt is
// stopped through its unit, as one whose kubelet and containerd did not
// stop cleanly is, with no halt asked.
func TestStopWhenTheHaltFails(t *testing.T) {
	for _, c := range []struct {
		name, failing string
		halts         int // halts asked
	}{
		{"halt refused", "systemctl --force halt", 1},
		{"kubelet and containerd not stopped", "systemctl stop kubelet.service containerd.service", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			b := e.backend(nil)
			ctx := t.Context()
			serving(t, b, "a")
			e.run.halt = nil // the node's systemd does not halt
			e.run.answer = func(cmd string) ([]byte, error) {
				if strings.HasSuffix(cmd, c.failing) {
					return []byte("Failed to connect to bus\n"), errors.New("exit status 1")
				}
				return []byte("running\n"), nil
			}
			if err := b.Stop(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			if calls := e.sd.Calls(); calls[len(calls)-1] != "stop systemd-nspawn@a.service" {
				t.Errorf("systemd calls %v, want the unit stopped last", calls)
			}
			if _, err := e.sd.Machine(ctx, "a"); err == nil {
				t.Error("the machine still runs after the stop")
			}
			halts := 0
			for _, cmd := range e.run.Inner() {
				if cmd == "systemctl --force halt" {
					halts++
				}
			}
			if halts != c.halts {
				t.Errorf("%d halts asked, want %d", halts, c.halts)
			}
		})
	}
}

func TestStopFallsBackToTerminate(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	serving(t, b, "a")
	e.run.halt = nil // the node does not take the halt; the stop through the unit fails
	e.run.answer = func(cmd string) ([]byte, error) {
		if strings.HasSuffix(cmd, "systemctl --force halt") {
			return nil, errors.New("exit status 1")
		}
		return []byte("running\n"), nil
	}
	e.sd.StopErr = errors.New("job timeout")
	if err := b.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(e.sd.Calls(), "terminate a") {
		t.Errorf("no terminate after a failed stop: %v", e.sd.Calls())
	}
}

// TestHaltedNodeThatStaysIsTerminated: a node that took the halt but is
// not gone within timeouts.stop (a process that ignores SIGTERM; its
// systemd waits) is terminated, as its unit's stop would do after that
// long, not stopped gracefully a second time.
func TestHaltedNodeThatStaysIsTerminated(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	serving(t, b, "a")
	e.run.halt = nil // systemctl says yes; the machine stays
	e.sd.ForgetCalls()
	t0 := time.Now()
	if err := b.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if took, stop := time.Since(t0), b.cfg.Timeouts.Stop.Duration; took < stop {
		t.Errorf("terminated after %s, before timeouts.stop (%s)", took, stop)
	}
	if got, want := e.sd.Calls(), []string{"terminate a", "stop systemd-nspawn@a.service"}; !slices.Equal(got, want) {
		t.Errorf("systemd calls %v, want %v", got, want)
	}
}

func TestStartFailsFastWhenTheUnitFails(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	ctx := t.Context()
	if err := b.Provision(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	e.sd.NoBoot = true
	err := b.Start(ctx, "a")
	if err == nil || !strings.Contains(err.Error(), "did not come up") {
		t.Fatalf("got %v", err)
	}
}

func TestKubeletHealthy(t *testing.T) {
	e := newEnv(t)
	healthy := atomic.Bool{}
	port := healthzServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" || !healthy.Load() {
			http.Error(w, "[-]syncloop failed", http.StatusInternalServerError)
			return
		}
		w.Write([]byte("ok"))
	})
	d := e.deps(e.config(nil))
	d.Settings.HealthzPort = port
	b, err := New(d)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := b.KubeletHealthy(ctx, "a"); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("slot not running: %v", err)
	}
	e.sd.Machines["a"] = machineRunning("a")
	if err := b.KubeletHealthy(ctx, "a"); err == nil || !strings.Contains(err.Error(), "500") {
		t.Errorf("unhealthy kubelet: %v", err)
	}
	healthy.Store(true)
	if err := b.KubeletHealthy(ctx, "a"); err != nil {
		t.Errorf("healthy kubelet: %v", err)
	}
	if err := b.KubeletHealthy(ctx, "c"); err == nil || !strings.Contains(err.Error(), "not one of the configured slots") {
		t.Errorf("unknown slot: %v", err)
	}
}

func TestNewRefusesWhatTheKubeletWould(t *testing.T) {
	e := newEnv(t)
	// lib/config refuses this label already; the backend checks again for
	// configurations that did not come through config.Parse.
	cfg := e.config(nil)
	cfg.Kubernetes.Labels["node-role.kubernetes.io/worker"] = ""
	if _, err := New(e.deps(cfg)); err == nil || !strings.Contains(err.Error(), "node-role.kubernetes.io/worker") {
		t.Errorf("forbidden label: %v", err)
	}
	d := e.deps(e.config(nil))
	d.Identity = "/srv/with:colon"
	if _, err := New(d); err == nil {
		t.Error("identity path with ':' accepted")
	}
	d = e.deps(e.config(nil))
	d.Systemd = nil
	if _, err := New(d); err == nil {
		t.Error("missing Systemd accepted")
	}
}

func TestOperatorHooksAndTheRepaversSteps(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	o, err := NewOperator(e.deps(e.config(nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := o.EnsureHooks(ctx); err != nil || e.exists("/etc/systemd/nspawn/a.nspawn") || e.sd.Reloads != 0 {
		t.Fatalf("hooks with no provisioned slot: %v, reloads %d", err, e.sd.Reloads)
	}
	b := o.Backend()
	serving(t, b, "a")
	reloads, calls := e.sd.Reloads, len(e.sd.Calls())
	if err := o.EnsureHooks(ctx); err != nil || e.sd.Reloads != reloads {
		t.Errorf("hooks unchanged: %v, reloads %d -> %d", err, reloads, e.sd.Reloads)
	}
	e.put("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf", []byte("[Service]\n"))
	if err := o.EnsureHooks(ctx); err != nil || e.sd.Reloads != reloads+1 {
		t.Errorf("hooks repaired: %v, reloads %d -> %d", err, reloads, e.sd.Reloads)
	}
	for _, c := range e.sd.Calls()[calls:] {
		if c != "reload" {
			t.Errorf("EnsureHooks touched a running service: %q", c)
		}
	}

	// A repave is the repaver's phases over the Backend (lib/repave):
	// prepare (provision, configure the target), switch (stop the old
	// node), start (the target). One backend serves both slots.
	for _, s := range []struct {
		f    func(context.Context, string) error
		slot string
	}{{b.Provision, "b"}, {b.Configure, "b"}, {b.Stop, "a"}, {b.Start, "b"}} {
		if err := s.f(ctx, s.slot); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.sd.Machine(ctx, "a"); err == nil {
		t.Error("slot a still runs after the repave")
	}
	if _, err := e.sd.Machine(ctx, "b"); err != nil {
		t.Errorf("slot b does not run after the repave: %v", err)
	}
	if !e.exists("/var/lib/machines/b/etc/kubernetes/kubelet-config.yaml") || !e.exists("/var/lib/machines/a") {
		t.Error("repave: target not configured, or source removed (the repaver keeps it until commit)")
	}
}

func TestExecRefusesBadCommands(t *testing.T) {
	e := newEnv(t)
	b := e.backend(nil)
	e.sd.Machines["a"] = machineRunning("a")
	for _, args := range [][]string{nil, {""}, {"A=B", "sh"}} {
		if _, err := b.Exec(context.Background(), "a", args...); err == nil {
			t.Errorf("Exec(%q) accepted", args)
		}
	}
	if _, err := b.Exec(context.Background(), "b", "true"); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("exec in a stopped slot: %v", err)
	}
}

func TestProvisionInstallsOptionalArtifacts(t *testing.T) {
	e := newEnv(t)
	ctd := tarball(t, map[string]string{"bin/": "", "bin/containerd": "ctd", "bin/containerd-shim-runc-v2": "shim"})
	cni := tarball(t, map[string]string{"./loopback": "lo", "./bridge": "br"})
	runc := []byte("runc binary")
	e.put("/srv/containerd.tar", ctd)
	e.put("/srv/cni.tar", cni)
	e.put("/srv/runc", runc)
	cfg := e.config(func(s string) string {
		return s + fmt.Sprintf(`
[artifacts.containerd]
url = "/srv/containerd.tar"
sha256 = %q

[artifacts.runc]
url = "/srv/runc"
sha256 = %q

[artifacts.cni_plugins]
url = "/srv/cni.tar"
sha256 = %q
`, digest(ctd), digest(runc), digest(cni))
	})
	b := e.backend(cfg)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{
		"/var/lib/machines/a/usr/local/bin/containerd":              "ctd",
		"/var/lib/machines/a/usr/local/bin/containerd-shim-runc-v2": "shim",
		"/var/lib/machines/a/usr/local/sbin/runc":                   "runc binary",
		"/var/lib/machines/a/usr/lib/cni/loopback":                  "lo",
		"/var/lib/machines/a/usr/local/bin/kubelet":                 string(e.kubelet),
	} {
		if got := e.read(p); got != want {
			t.Errorf("%s: %q, want %q", p, got, want)
		}
	}
	if u := e.read("/var/lib/machines/a/etc/systemd/system/containerd.service"); !strings.Contains(u, "ExecStart=/usr/local/bin/containerd ") {
		t.Errorf("containerd unit for the artifact:\n%s", u)
	}
	if ok, err := b.Provisioned("a"); err != nil || !ok {
		t.Errorf("Provisioned: %v %v", ok, err)
	}
	// The stamp names every artifact: the same slot under a configuration
	// without them is not provisioned for it.
	if ok, _ := e.backend(nil).Provisioned("a"); ok {
		t.Error("slot with extra artifacts counts as provisioned for a configuration without them")
	}
}

// TestConfigurePreloadsImages: [node] preload_images are verified into the
// cache, the cache is bound read-only into the node, and the node imports
// the listed archives before its kubelet; a wrong sha256 fails configure
// naming the setting, with nothing written into the node.
func TestConfigurePreloadsImages(t *testing.T) {
	e := newEnv(t)
	archive := []byte("an image archive")
	e.put("/srv/images/web.tar", archive)
	preload := func(sum string) *config.Config {
		return e.config(func(s string) string {
			return strings.Replace(s, "[artifacts.kubelet]", fmt.Sprintf("[node]\npreload_images = [{source = \"/srv/images/web.tar\", sha256 = %q}]\n\n[artifacts.kubelet]", sum), 1)
		})
	}
	bad := e.backend(preload(strings.Repeat("0", 64)))
	if err := bad.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := bad.Configure(t.Context(), "a"); err == nil || !strings.Contains(err.Error(), "node.preload_images[0]") ||
		!errors.Is(err, artifact.ErrChecksum) || !strings.Contains(err.Error(), strings.Repeat("0", 64)) {
		t.Fatalf("wrong sha256: %v; want a checksum error naming node.preload_images[0] and the configured sha256", err)
	}
	if e.exists("/opt/kubeslot/cache/sha256/" + strings.Repeat("0", 64)) {
		t.Error("an archive that failed verification is in the cache")
	}
	if e.exists("/var/lib/machines/a/etc/kubernetes/kubelet-config.yaml") {
		t.Error("node files written although a preload failed verification")
	}
	b := e.backend(preload(digest(archive)))
	if err := b.Configure(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	list := e.read("/var/lib/machines/a" + nodeconfig.PreloadList)
	if list != nodeconfig.CacheMount+"/sha256/"+digest(archive)+"\n" {
		t.Errorf("preload list %q", list)
	}
	if u := e.read("/var/lib/machines/a" + nodeconfig.PreloadUnitPath); !strings.Contains(u, "ExecStart=/bin/sh "+nodeconfig.PreloadScript+" "+nodeconfig.PreloadList+" ") {
		t.Errorf("preload unit:\n%s", u)
	}
	if sh := e.read("/var/lib/machines/a" + nodeconfig.PreloadScript); !strings.Contains(sh, "ctr --namespace k8s.io images import") {
		t.Errorf("preload script:\n%s", sh)
	}
	if u := e.read("/var/lib/machines/a" + nodeconfig.KubeletUnitPath); !strings.Contains(u, "Wants="+nodeconfig.PreloadUnit) {
		t.Errorf("the kubelet does not want the preload:\n%s", u)
	}
	if s := e.read("/etc/systemd/nspawn/a.nspawn"); !strings.Contains(s, "BindReadOnly=/opt/kubeslot/cache:"+nodeconfig.CacheMount+"\n") {
		t.Errorf("cache not bound into the node:\n%s", s)
	}
}

// TestBridgeModeJournalsThePodNetwork: the bridge and its firewall chains
// appear when the node starts pods; configure journals them first, once.
func TestBridgeModeJournalsThePodNetwork(t *testing.T) {
	e := newEnv(t)
	cfg := e.config(func(s string) string { return s + "\n[node.cni]\nmode = \"bridge\"\n" })
	b := e.backend(cfg)
	if err := b.Provision(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := b.Configure(t.Context(), "a"); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for _, c := range e.rec.Changes() {
		if c.Kind == ownership.KindPodNetwork {
			n++
			if c.Name != nodeconfig.CNIBridgeName || c.Prior.State != ownership.PriorAbsent {
				t.Errorf("pod network entry %+v", c)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d pod network entries, want 1", n)
	}
	// The network containerd renders from the template is kept on the host,
	// so the next slot's containerd has it at start.
	settings, err := os.ReadFile(filepath.Join(e.root.Prefix(), "etc/systemd/nspawn/a.nspawn"))
	if want := "Bind=/opt/kubeslot/node/cni/net.d:" + nodeconfig.CNIConfDir + "\n"; err != nil || !strings.Contains(string(settings), want) {
		t.Errorf("settings lack %q (%v):\n%s", want, err, settings)
	}
	if !e.exists("/opt/kubeslot/node/cni/net.d") {
		t.Error("the kept net.d was not created")
	}
}

// serving provisions, configures and starts slot.
func serving(t *testing.T, b *Backend, slot string) {
	t.Helper()
	ctx := t.Context()
	if err := b.Provision(ctx, slot); err != nil {
		t.Fatal(err)
	}
	if err := b.Configure(ctx, slot); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx, slot); err != nil {
		t.Fatal(err)
	}
}
