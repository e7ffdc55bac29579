package node

// The nspawn isolation backend (lib/isolation, lib/isolation/nspawn) for real: on an isolated host sharing the
// machine's network, with the package's control plane and the rig's mirror serving the node rootfs and the kubelet,
// the backend provisions slot a from the artifact cache, configures it, starts it, and the Node goes Ready with the
// configured labels and taints; then restart in place (same Node, new heartbeat), a repave onto slot b (same Node, no
// new CSR: the identity is kept in the host root), stop, and remove (nothing left).
//
// The backend runs INSIDE the host, as the stage binaries will: this test binary is bound into the host and run
// there (nsenter, through sdhost.Host.Run) as a small driver (runNspawnDriver), one process per step, with the
// production wiring: lib/hostroot at "/", systemd and machined over the host's own D-Bus, commands through os/exec.
// Running it in the test process instead would need a hostroot prefix of /proc/<pid>/root, which hostroot.New
// cannot take: it resolves the prefix with filepath.EvalSymlinks, and that magic link reads as "/" from outside
// the host's mount namespace, so every path would land on the machine itself.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubeslot/kubeslot/integration/nodeimage"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation"
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

func init() {
	// Before TestMain: the driver must not take the rig's machine lock or start a control plane.
	if len(os.Args) > 1 && os.Args[1] == rig.NspawnDriverArg {
		os.Exit(runNspawnDriver(os.Args[2:]))
	}
}

func TestNspawnBackendOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 18*time.Minute)
	defer cancel()
	figure := func(what string, d time.Duration) {
		t.Logf("timing: %s %.2fs", what, d.Seconds())
		rig.Figures.Add("nspawn backend: "+what, d)
	}
	r := rig.NewWith(t, ctx, "nsb", rig.Options{Bare: true, Driver: true, Figure: figure})
	cp, srv, h, node, admin, token, ports := r.CP, r.Srv, r.H, r.Node, r.Admin, r.Token, r.Ports
	rootfsSum, kubeletSum := r.Sums["rootfs"], r.Sums["kubelet"]
	toml := rig.NspawnRigConfig(node, cp.URL(), string(cp.CAPEM()), token, srv.URL("node-rootfs.tar.gz"), rootfsSum,
		srv.URL("kubelet"), kubeletSum)
	if _, err := config.Parse("rig config", []byte(toml)); err != nil {
		t.Fatalf("the test's own config is invalid: %v", err)
	}
	if err := h.WriteFile(rig.NspawnConfigPath, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	drive := func(steps ...string) ([]byte, error) {
		args := []string{rig.NspawnDriverPath, rig.NspawnDriverArg, "-config", rig.NspawnConfigPath,
			"-kubelet-port", fmt.Sprint(ports[0]), "-healthz-port", fmt.Sprint(ports[1]),
			// the rig's settings: loopback node IP, and the machine's network sysctls are not ours to open
			"-node-ip", "127.0.0.1", "-read-only-net-sysctl"}
		out, err := h.Run(ctx, append(args, steps...)...)
		t.Logf("driver %v:\n%s", steps, out)
		return out, err
	}
	mustDrive := func(what string, steps ...string) time.Duration {
		t.Helper()
		t1 := time.Now()
		if _, err := drive(steps...); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, rig.HostDiag(h))
		}
		d := time.Since(t1)
		figure(what, d)
		return d
	}
	defer func() {
		// Best effort: leave nothing running in the host and no Node in the cluster.
		if t.Failed() {
			_, _ = drive("stop=a", "stop=b", "remove=a", "remove=b")
		}
		_ = admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	}()

	// 1. Provision (download into the cache, unpack, install the kubelet), configure, start.
	mustDrive("provision slot a (fetch + unpack + kubelet)", "provision=a")
	mustDrive("provision slot a again (no-op)", "provision=a")
	mustDrive("configure slot a", "configure=a")
	checkHostSide(t, h)
	tStart := time.Now()
	mustDrive("start slot a (boot + containerd + kubelet)", "start=a")
	n := rig.WaitNodeHeartbeat(t, ctx, admin, node, time.Time{}, 3*time.Minute, h)
	figure("start to Node Ready", time.Since(tStart))
	rig.CheckNodeSettings(t, n)
	mustDrive("kubelet healthy", "healthy=a")
	if out, err := drive("exec=a", "--", "cat", "/etc/hostname"); err != nil || !strings.Contains(string(out), node+"\n") {
		t.Errorf("exec in the node: hostname: %v\n%s", err, out)
	}
	// The identity the kubelet bootstrapped lives in the host root, bound into the node.
	if out, err := h.Run(ctx, "ls", "/opt/kubeslot/identity"); err != nil || !strings.Contains(string(out), "kubelet-client-current.pem") {
		t.Errorf("node identity not in the host root: %v\n%s", err, out)
	}

	// 2. Restart in place: the same Node object, a heartbeat from the new kubelet.
	tRestart := time.Now()
	mustDrive("restart node in place", "restart=a")
	n2 := rig.WaitNodeHeartbeat(t, ctx, admin, node, tRestart, 3*time.Minute, h)
	figure("restart to Node Ready with a new heartbeat", time.Since(tRestart))
	if n2.UID != n.UID {
		t.Errorf("Node UID changed over a restart: %s -> %s", n.UID, n2.UID)
	}
	mustDrive("ensure hooks (unchanged: no reload)", "hooks")

	// 3. Repave onto slot b: the identity bound from the host root carries the Node over without a new CSR.
	csrs := nodeCSRs(t, ctx, admin, node, token)
	tRepave := time.Now()
	// The repaver's phases over the backend (lib/repave): prepare, switch, start; the wait below is its verify.
	mustDrive("repave a -> b (provision + configure b, stop a, start b)", "provision=b", "configure=b", "stop=a", "start=b")
	n3 := rig.WaitNodeHeartbeat(t, ctx, admin, node, tRepave, 3*time.Minute, h)
	figure("repave to Node Ready with a new heartbeat", time.Since(tRepave))
	if n3.UID != n.UID {
		t.Errorf("Node UID changed over a repave: %s -> %s", n.UID, n3.UID)
	}
	if after := nodeCSRs(t, ctx, admin, node, token); after != csrs {
		t.Errorf("the repaved node made a new client CSR (%d before, %d after): its identity was not kept", csrs, after)
	}
	if out, err := h.Run(ctx, "machinectl", "show", "a"); err == nil {
		t.Errorf("machine a still known after the repave onto b:\n%s", out)
	}

	// 4. Stop, remove: nothing of either slot left on the host, and removing again is fine.
	mustDrive("stop slot b", "stop=b")
	if out, err := h.Run(ctx, "machinectl", "show", "b"); err == nil {
		t.Errorf("machine b still known after stop:\n%s", out)
	}
	if _, err := drive("healthy=b"); err == nil {
		t.Errorf("kubelet of a stopped slot reported healthy")
	}
	mustDrive("remove slots a and b", "remove=a", "remove=b")
	mustDrive("remove slot a again (no-op)", "remove=a")
	for _, slot := range []string{"a", "b"} {
		for _, p := range []string{"/var/lib/machines/" + slot, "/var/lib/machines/." + slot + ".partial",
			"/etc/systemd/nspawn/" + slot + ".nspawn", "/etc/systemd/system/systemd-nspawn@" + slot + ".service.d"} {
			if out, err := h.Run(ctx, "stat", "-c", "%F", p); err == nil {
				t.Errorf("%s left after remove: %s", p, out)
			}
		}
	}
	if out, err := h.Run(ctx, "ls", "/opt/kubeslot/identity"); err != nil || !strings.Contains(string(out), "kubelet-client-current.pem") {
		t.Errorf("remove took the node identity with it: %v\n%s", err, out)
	}
	checkJournal(t, h)
}

// checkHostSide: the .nspawn settings and the drop-in as the rig needs them.
func checkHostSide(t *testing.T, h *sdhost.Host) {
	t.Helper()
	settings, err := h.ReadFile("/etc/systemd/nspawn/a.nspawn")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PrivateUsers=no", "Capability=all", "VirtualEthernet=no", "Private=no",
		"Bind=/opt/kubeslot/identity:/var/lib/kubelet/pki"} {
		if !strings.Contains(string(settings), want+"\n") {
			t.Errorf("a.nspawn lacks %q:\n%s", want, settings)
		}
	}
	dropIn, err := h.ReadFile("/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(dropIn), "TimeoutStopSec=30\n") {
		t.Errorf("drop-in lacks TimeoutStopSec=30 (timeouts.stop):\n%s", dropIn)
	}
	if strings.Contains(string(dropIn), "SYSTEMD_NSPAWN_API_VFS_WRITABLE") {
		t.Errorf("drop-in opens /proc/sys/net although the rig turned it off:\n%s", dropIn)
	}
}

// checkJournal: the slot's host changes were journalled (before they were made: the unit tests check the order).
func checkJournal(t *testing.T, h *sdhost.Host) {
	t.Helper()
	data, err := h.ReadFile("/opt/kubeslot/ownership.json")
	if err != nil {
		t.Fatal(err)
	}
	var rec ownership.Record
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	for _, want := range []ownership.Change{
		{Kind: ownership.KindMachineRootfs, Path: "/var/lib/machines/a"},
		{Kind: ownership.KindNspawnSettings, Path: "/etc/systemd/nspawn/a.nspawn"},
		{Kind: ownership.KindUnit, Path: "/etc/systemd/system/systemd-nspawn@a.service.d/kubeslot.conf"},
	} {
		c, ok := rec.Lookup(want.Kind, want.Path)
		if !ok {
			t.Errorf("journal has no %s %s; journal: %+v", want.Kind, want.Path, rec.Journal)
		} else if c.Prior.State != ownership.PriorAbsent {
			t.Errorf("journal %s %s: prior %q, want absent", want.Kind, want.Path, c.Prior.State)
		}
	}
}

// nodeCSRs counts the kubelet client CSRs of node: made with the bootstrap token or with the node's own identity.
func nodeCSRs(t *testing.T, ctx context.Context, cs *kubernetes.Clientset, node, token string) int {
	t.Helper()
	list, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range list.Items {
		if c.Spec.Username == "system:node:"+node || c.Spec.Username == "system:bootstrap:"+token[:6] {
			n++
		}
	}
	return n
}

// runNspawnDriver runs backend steps inside a rig host, as a stage binary would: "op=slot" arguments (provision,
// configure, start, healthy, restart, stop, remove), "hooks", or "exec=slot -- command...". It prints what each step
// took and returns 1 at the first failure.
func runNspawnDriver(args []string) int {
	fs := flag.NewFlagSet(rig.NspawnDriverArg, flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file")
	var set hostapi.Settings
	fs.IntVar(&set.KubeletPort, "kubelet-port", 0, "")
	fs.IntVar(&set.HealthzPort, "healthz-port", 0, "")
	fs.StringVar(&set.NodeIP, "node-ip", "", "")
	fs.BoolVar(&set.ReadOnlyNetSysctl, "read-only-net-sysctl", false, "")
	// The rig's node compromises (the node shares the machine's network namespace; the host's disk is overlayfs).
	fs.BoolVar(&set.LoopbackCNI, "loopback-cni", true, "")
	fs.StringVar(&set.Snapshotter, "snapshotter", "native", "")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "driver: FAIL: %v\n", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return fail(err)
	}
	root, err := hostroot.New("/", "")
	if err != nil {
		return fail(err)
	}
	if err := root.EnsureLayout(); err != nil {
		return fail(err)
	}
	lock, err := ownership.Acquire(ctx, root, ownership.Holder{Stage: "nspawn-rig-driver"}, log)
	if err != nil {
		return fail(err)
	}
	defer lock.Release()
	rec, err := ownership.Load(root)
	if err == nil && rec == nil {
		if rec, err = ownership.New(cfg.Machine.Name, cfg.Fingerprint(), "rig"); err == nil {
			err = ownership.Save(root, rec)
		}
	}
	if err != nil {
		return fail(err)
	}
	// This machine's own systemd, connected on first use.
	sd := &systemdconn.Client{Ctx: ctx}
	defer sd.Close()
	b, o, err := isolation.ForConfig(isolation.Deps{Root: root, Config: cfg, Systemd: sd, Exec: hostapi.ExecRunner{},
		Node: systemdconn.DialNode, Log: log, Record: rec, Settings: set})
	if err != nil {
		return fail(err)
	}
	steps := fs.Args()
	for i := 0; i < len(steps); i++ {
		step := steps[i]
		op, slot, _ := strings.Cut(step, "=")
		t0 := time.Now()
		var err error
		switch op {
		case "provision":
			err = b.Provision(ctx, slot)
		case "configure":
			err = b.Configure(ctx, slot)
		case "start":
			err = b.Start(ctx, slot)
		case "healthy":
			err = b.KubeletHealthy(ctx, slot)
		case "restart":
			_, err = o.RestartNode(ctx, slot)
		case "stop":
			err = b.Stop(ctx, slot)
		case "remove":
			err = b.Remove(ctx, slot)
		case "hooks":
			err = o.EnsureHooks(ctx)
		case "exec": // exec=SLOT -- command...
			cmd := steps[i+1:]
			if len(cmd) > 0 && cmd[0] == "--" {
				cmd = cmd[1:]
			}
			i = len(steps)
			var out []byte
			out, err = b.Exec(ctx, slot, cmd...)
			os.Stdout.Write(out)
		default:
			err = fmt.Errorf("unknown step %q", step)
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %w", step, err))
		}
		fmt.Fprintf(os.Stderr, "driver: %s ok in %.2fs\n", step, time.Since(t0).Seconds())
	}
	return 0
}

// TestNspawnNodeFilesMatchRig keeps lib/nodeconfig consistent with the settings the rig verified
// (nodeimage.WriteFiles): every setting of the rig's node files must be in what the backend renders. It needs no rig.
func TestNspawnNodeFilesMatchRig(t *testing.T) {
	ca := testkit.CA(t)
	sum := strings.Repeat("ab", 32)
	cfg, err := config.Parse("rig", []byte(rig.NspawnRigConfig("n1", "https://127.0.0.1:6443", ca, "abcdef.0123456789abcdef",
		"http://127.0.0.1/rootfs.tar.gz", sum, "http://127.0.0.1/kubelet", sum)))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := nodeconfig.LoadCredentials(nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The rig's node: the cgroup fallback of its hosts and the sandbox record's compromises.
	rendered, err := nodeconfig.Render(cfg, creds, nodeconfig.Options{NodeIP: "127.0.0.1", Cgroups: nodeconfig.CgroupsNoControllers,
		LoopbackCNI: true, Snapshotter: "native"})
	if err != nil {
		t.Fatal(err)
	}
	ours := map[string]string{}
	for _, f := range rendered {
		ours[f.Path] = string(f.Data)
	}
	dir := t.TempDir()
	err = nodeimage.WriteFiles(dir, nodeimage.Node{Name: "n1", CAPEM: []byte(ca), BootstrapKubeconfig: creds.BootstrapKubeconfig,
		KubeletPort: nodeconfig.DefaultKubeletPort, HealthzPort: nodeconfig.DefaultHealthzPort})
	if err != nil {
		t.Fatal(err)
	}
	rigFiles := map[string]string{}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rigFiles["/"+filepath.ToSlash(strings.TrimPrefix(p, dir+"/"))] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	settings := func(s string) []string { // non-comment, non-empty lines
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				out = append(out, l)
			}
		}
		return out
	}
	for p, rigData := range rigFiles {
		got, ok := ours[p]
		switch {
		case p == "/etc/machine-id": // nodeconfig.EnsureMachineID
			continue
		case !ok:
			t.Errorf("the rig writes %s, the backend does not", p)
			continue
		case p == nodeconfig.CNIConfig: // same plugins, another network name
			if !strings.Contains(got, `"plugins": [{"type": "loopback"}]`) {
				t.Errorf("%s: %s", p, got)
			}
			continue
		case p == nodeconfig.KubeletConfig: // YAML written another way: compared key by key, decoded
			var rigKC, ourKC map[string]any
			if err := yaml.Unmarshal([]byte(rigData), &rigKC); err != nil {
				t.Fatalf("%s of the rig: %v", p, err)
			}
			if err := yaml.Unmarshal([]byte(got), &ourKC); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			for k, v := range rigKC {
				if !settingsWithin(v, ourKC[k]) {
					t.Errorf("%s: the rig's %s = %v, ours %v", p, k, v, ourKC[k])
				}
			}
			continue
		}
		for _, l := range settings(rigData) {
			if p == nodeconfig.KubeletUnitPath {
				l = strings.TrimSuffix(l, " \\")
				if strings.HasPrefix(l, "ExecStart=") {
					for _, arg := range strings.Fields(strings.TrimPrefix(l, "ExecStart=")) {
						if !strings.Contains(got, arg) {
							t.Errorf("kubelet unit: the rig's %q is missing", arg)
						}
					}
					continue
				}
				if l == "Restart=no" || strings.HasPrefix(l, "Description=") {
					continue // production restarts the kubelet; names differ
				}
				if l == "Requires="+nodeconfig.ContainerdUnit {
					// Production only wants containerd: a restart in place restarts containerd
					// while the kubelet serves (nspawn.Backend.restartServices).
					l = "Wants=" + nodeconfig.ContainerdUnit
				}
			}
			if !slices.Contains(settings(got), l) {
				t.Errorf("%s: the rig's setting %q is missing:\n%s", p, l, got)
			}
		}
	}
}
