package integration

// The rig for the bootstrap stage: an isolated host sharing the machine's network, this release's binaries laid
// down exactly as `kubeslot ignition` lays them down (<base>/releases/blue, the relative link current, the TOML
// config at /etc/kubeslot/config.toml 0600, kubeslot-bootstrap.service enabled), and a mirror serving the node
// rootfs and the kubelet. The only rig-specific piece is a drop-in of the first-boot unit with the sandbox
// environment lib/bootstrap documents: free kubelet ports, the loopback node IP, /proc/sys/net read-only in the
// node, and host preparation limited to packages (the host shares the machine's kernel: modules, sysctls and swap
// are the machine's, not the rig's).

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/mirror"
	"github.com/kubeslot/kubeslot/integration/netfwd"
	"github.com/kubeslot/kubeslot/integration/nodeimage"
	"github.com/kubeslot/kubeslot/integration/rigenv"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/machineclient"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/transition"
	"github.com/kubeslot/kubeslot/units"
)

const (
	bsBinsPath   = "/srv/kubeslot-bins"   // the freshly built binaries, bound read-only
	bsMirrorPath = "/srv/kubeslot-mirror" // the mirror's directory, bound read-only (to seed the cache)
	bsBinary     = "/opt/kubeslot/current/kubeslot-bootstrap"
	bsConfigPath = units.ConfigPath
)

// bsRig is one isolated host ready to bootstrap, and what it needs from the machine.
type bsRig struct {
	t     *testing.T
	cp    *kube.ControlPlane
	h     *sdhost.Host
	srv   *mirror.Server
	admin *kubernetes.Clientset
	mc    *machineclient.Client
	node  string
	env   []string // the sandbox environment, KEY=VALUE
	token string
	sums  map[string]string
	extra func(r *bsRig) string // TOML appended to the configuration
	// release is bsOptions.Release.
	release string
	// watcherEnv and nodeReady are bsOptions'.
	watcherEnv []string
	nodeReady  string
	// fwd and unroute are what connect forwarded and the removal of its egress route (a reboot's new namespace
	// needs both again: TestHooksOnRig).
	fwd     []string
	unroute func()
	// rootfs is the node rootfs tarball on the machine (served as bsOptions.RootfsName); ports are the two free
	// ports the sandbox environment gives the kubelet (its port, its healthz port).
	rootfs string
	ports  []int
}

// bsOptions shape a bootstrap rig's host.
type bsOptions struct {
	// Persistent keeps the host's disk across Kill and Boot.
	Persistent bool
	// Pods makes a host whose node can run pods (TestPodsOnRig): its own network namespace with a node IP, the
	// control plane, the mirror and registries reached through forwarders on the same loopback addresses, the
	// apiserver reaching the node IP through its cluster egress, writable cgroup v1 controllers of its own, and
	// only the sandbox settings such a host still needs.
	Pods bool
	// Forward lists more machine loopback addresses ("127.0.0.1:port") to forward into a Pods host.
	Forward []string
	// Mirror adds files to the rig's mirror (name → path on the machine); their sha256 are in bsRig.sums.
	Mirror map[string]string
	// Extra returns TOML appended to the configuration.
	Extra func(r *bsRig) string
	// Release, when set, is the Kubernetes version the host starts with, its kubelet found on the mirror's release
	// tree (bsReleaseDir, [kubernetes.release]) rather than named in [artifacts.kubelet].
	Release string
	// WatcherEnv adds KEY=VALUE settings to the watcher's drop-in only (e.g. its rollout lease and poll).
	WatcherEnv []string
	// NodeReady, when set, replaces the configuration's [timeouts] node_ready (a Go duration string).
	NodeReady string
	// DiskBase puts kubeslot's own tree (/opt/kubeslot: releases, identity, state) on a directory of the machine
	// (the test's temp dir) bound into the host, instead of the host's tmpfs disk: a real host's binaries are file
	// pages of a disk, which the kernel can drop, and the idle watcher's resident memory is measured on that path.
	DiskBase bool
	// Env edits the sandbox environment the rig made (TestHooksOnRig: no pinned node IP).
	Env func(env []string) []string
	// Bare stops at the pieces (control plane clients, mirror, host, token, ports): no release is laid down and the
	// cluster API is not installed, for tests that drive the node themselves.
	Bare bool
	// Driver binds this test binary into the host at nspawnDriverPath (the nspawn backend's driver, see init).
	Driver bool
	// CgroupMode is the host's cgroup layout (sdhost.Options.CgroupMode).
	CgroupMode string
	// RootfsName is the node rootfs's name on the mirror (default "node-rootfs.tar.gz").
	RootfsName string
	// Figure, when set, receives the host's boot and stop times ("host boot", "host stop") instead of the log.
	Figure func(what string, d time.Duration)
}

// bsReleaseDir is the release tree in the rig's mirror: <dir>/v<version>/bin/linux/<arch>/kubelet.
const bsReleaseDir = "release"

// newBootstrapRig boots a host named after base and lays down the release, the config and the first-boot unit.
func newBootstrapRig(t *testing.T, ctx context.Context, base string, persistent bool) *bsRig {
	t.Helper()
	return newBootstrapRigWith(t, ctx, base, bsOptions{Persistent: persistent})
}

// newBootstrapRigWith is newBootstrapRig with the host shaped by o.
func newBootstrapRigWith(t *testing.T, ctx context.Context, base string, o bsOptions) *bsRig {
	t.Helper()
	persistent := o.Persistent
	var cp *kube.ControlPlane
	if o.Bare {
		cp = needCluster(t)
	} else {
		cp = needAPI(t)
	}
	// Without KUBESLOT_REQUIRE_RIG an unbuilt rootfs skips (building it takes minutes); with it, it is built.
	tarball, err := nodeimage.Tarball(ctx, rigRequired)
	if err != nil {
		if rigRequired {
			t.Fatalf("node rootfs: %v", err)
		}
		t.Skipf("node rootfs not built (run scripts/node-rootfs.sh): %v", err)
	}
	rootfsName := cmp.Or(o.RootfsName, "node-rootfs.tar.gz")
	var bins string
	if !o.Bare {
		bins = needBins(t)
	}
	r := &bsRig{t: t, cp: cp, node: fmt.Sprintf("%s-%d", base, os.Getpid()%100000), sums: map[string]string{}, extra: o.Extra, release: o.Release,
		watcherEnv: o.WatcherEnv, nodeReady: o.NodeReady, rootfs: tarball}
	if r.admin, err = kubernetes.NewForConfig(cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	if r.mc, err = machineclient.New(cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	mirrorDir := filepath.Join(t.TempDir(), "mirror")
	if r.srv, err = mirror.Start(mirrorDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.srv.Close() })
	if r.sums["rootfs"], err = r.srv.Add(rootfsName, tarball); err != nil {
		t.Fatal(err)
	}
	if r.sums["kubelet"], err = r.srv.Add("kubelet", filepath.Join(kubeBinDir, "kubelet")); err != nil {
		t.Fatal(err)
	}
	for name, p := range o.Mirror {
		if r.sums[name], err = r.srv.Add(name, p); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	t0 := time.Now()
	hostOpts := sdhost.Options{Name: r.node + "-h", SharedNetwork: true, Persistent: persistent, Log: log, CgroupMode: o.CgroupMode,
		Binds: []sdhost.Bind{{Source: mirrorDir, Target: bsMirrorPath, ReadOnly: true}}}
	if !o.Bare {
		hostOpts.Binds = append(hostOpts.Binds, sdhost.Bind{Source: bins, Target: bsBinsPath, ReadOnly: true})
	}
	if o.Driver {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		hostOpts.Binds = append(hostOpts.Binds, sdhost.Bind{Source: exe, Target: nspawnDriverPath, ReadOnly: true})
	}
	figure := o.Figure
	if figure == nil {
		figure = func(what string, d time.Duration) { rigTiming(t, "bootstrap rig: "+what, d) }
	}
	if o.DiskBase {
		base := filepath.Join(t.TempDir(), "base")
		if err := os.Mkdir(base, 0o755); err != nil {
			t.Fatal(err)
		}
		hostOpts.Binds = append(hostOpts.Binds, sdhost.Bind{Source: base, Target: hostroot.DefaultBase})
	}
	if o.Pods {
		hostOpts.SharedNetwork, hostOpts.NodeNetwork = false, true
		hostOpts.CgroupMode, hostOpts.V1Controllers = "hybrid", true
	}
	r.h, err = sdhost.Start(ctx, hostOpts)
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	if o.Pods {
		r.connect(append([]string{strings.TrimPrefix(cp.URL(), "https://"), r.srv.Addr(), r.srv.TLSAddr()}, o.Forward...))
	}
	figure("host boot", time.Since(t0))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if r.h.Running() {
			// The node first, so that its kubelet stops heartbeating before the host goes.
			_, _ = r.h.Run(sctx, "systemctl", "stop", "systemd-nspawn@a.service")
		}
		t1 := time.Now()
		if err := r.h.Stop(sctx); err != nil {
			t.Errorf("stop host: %v", err)
		}
		if o.Figure != nil {
			figure("host stop", time.Since(t1))
		}
		_ = r.admin.CoreV1().Nodes().Delete(sctx, r.node, metav1.DeleteOptions{})
		_ = r.mc.DeleteMachine(sctx, r.node)
	})
	if r.token, err = cp.CreateBootstrapToken(ctx, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	ports, err := kube.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	r.ports = ports
	r.env = rigenv.Loopback(ports[0], ports[1])
	if o.Pods {
		r.env = rigenv.Pods(r.h.NodeIP())
	}
	if o.Env != nil {
		r.env = o.Env(r.env)
	}
	if !o.Bare {
		r.layDown(ctx)
	}
	return r
}

// config is the rig's bootstrap configuration for machine (the rig's node name unless overridden), with the
// rootfs digest given (the mirror's unless overridden).
func (r *bsRig) config(machine, rootfsSum string) string {
	if machine == "" {
		machine = r.node
	}
	if rootfsSum == "" {
		rootfsSum = r.sums["rootfs"]
	}
	c := nspawnRigConfig(machine, r.cp.URL(), string(r.cp.CAPEM()), r.token, r.srv.URL("node-rootfs.tar.gz"), rootfsSum,
		r.srv.URL("kubelet"), r.sums["kubelet"])
	if r.release != "" {
		// The version picks the kubelet from the release mirror.
		i := strings.Index(c, "[artifacts.kubelet]")
		j := strings.Index(c, "[timeouts]")
		c = c[:i] + c[j:]
		c = strings.Replace(c, `version = "1.37.2"`, fmt.Sprintf("version = %q", r.release), 1)
		// Over the mirror's https listener, trusting its own CA: an http release mirror is refused.
		c += fmt.Sprintf("\n[kubernetes.release]\nmirror = %q\nca_pem = %q\n", r.srv.TLSURL(bsReleaseDir), r.srv.CAPEM())
	}
	if r.nodeReady != "" {
		c = strings.Replace(c, `node_ready = "3m"`, fmt.Sprintf("node_ready = %q", r.nodeReady), 1)
	}
	return c + r.extraConfig()
}

func (r *bsRig) extraConfig() string {
	if r.extra == nil {
		return ""
	}
	return r.extra(r)
}

// connect forwards each machine loopback address into the host's network namespace (same address there), and
// routes the apiserver's traffic for the node to it.
func (r *bsRig) connect(addrs []string) {
	t := r.t
	t.Helper()
	ns, err := r.h.NetNS()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		f, err := netfwd.Forward(ns, a, "", a)
		if err != nil {
			t.Fatalf("forward %s into the host: %v", a, err)
		}
		t.Cleanup(func() { f.Close() })
	}
	remove, err := r.cp.RouteEgress(r.h.NodeIP(), r.h.NetNS, r.node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	r.fwd, r.unroute = addrs, remove
}

// layDown writes what `kubeslot ignition` lays down, and the rig's drop-in.
func (r *bsRig) layDown(ctx context.Context) {
	t := r.t
	t.Helper()
	if _, err := config.Parse("rig", []byte(r.config("", ""))); err != nil {
		t.Fatalf("the test's own config is invalid: %v", err)
	}
	if err := r.h.WriteFile(bsConfigPath, []byte(r.config("", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := r.h.Run(ctx, "sh", "-c", "mkdir -p /opt/kubeslot/releases/blue && cp "+bsBinsPath+"/kubeslot* /opt/kubeslot/releases/blue/ && ln -sfn releases/blue /opt/kubeslot/current"); err != nil {
		t.Fatalf("lay down the release: %v\n%s", err, out)
	}
	unit, err := units.Render(units.Bootstrap, units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	dropIn := "[Service]\n"
	for _, e := range r.env {
		dropIn += "Environment=" + e + "\n"
	}
	if err := r.h.WriteFile("/etc/systemd/system/"+units.Bootstrap+".d/rig.conf", []byte(dropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	// The watcher ensures the active slot's hooks at start, rendered with these settings too. A runtime drop-in
	// (the host's /run), so that /etc holds only what the reset test expects; it does not survive a power cut.
	watcherDropIn := dropIn
	for _, e := range r.watcherEnv {
		watcherDropIn += "Environment=" + e + "\n"
	}
	if out, err := r.h.Run(ctx, "sh", "-c", `mkdir -p /run/systemd/system/`+units.Watcher+`.d && printf '%s' "$1" >/run/systemd/system/`+units.Watcher+`.d/rig.conf`, "sh", watcherDropIn); err != nil {
		t.Fatalf("watcher drop-in: %v\n%s", err, out)
	}
	if err := r.h.InstallUnit(ctx, units.Bootstrap, unit); err != nil {
		t.Fatal(err)
	}
	// Enabled, as Ignition's "enabled": true does.
	if out, err := r.h.Run(ctx, "systemctl", "enable", units.Bootstrap); err != nil {
		t.Fatalf("enable %s: %v\n%s", units.Bootstrap, err, out)
	}
}

// run runs the bootstrap binary by hand inside the host with the sandbox environment; it returns the exit code.
func (r *bsRig) run(ctx context.Context, args ...string) (int, string) {
	r.t.Helper()
	out, err := r.h.Run(ctx, append(append([]string{"env"}, r.env...), append([]string{bsBinary}, args...)...)...)
	code := 0
	if err != nil {
		code = -1
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		}
	}
	return code, string(out)
}

// startUnit starts the first-boot unit and waits (bounded by ctx) for the oneshot to finish.
func (r *bsRig) startUnit(ctx context.Context) error {
	out, err := r.h.Run(ctx, "systemctl", "start", units.Bootstrap)
	if err != nil {
		j, _ := r.h.Journal(ctx, units.Bootstrap)
		return fmt.Errorf("%v\n%s\njournal:\n%s\n%s", err, out, tailLines(j, 60), hostDiag(r.h))
	}
	return nil
}

// record reads the ownership record of the host.
func (r *bsRig) record() (*ownership.Record, error) {
	data, err := r.h.ReadFile("/opt/kubeslot/ownership.json")
	if err != nil {
		return nil, err
	}
	var rec ownership.Record
	return &rec, json.Unmarshal(data, &rec)
}

// tree lists the paths kubeslot may touch, with type, size and mode, for "host untouched" comparisons.
func (r *bsRig) tree(ctx context.Context) string {
	r.t.Helper()
	out, err := r.h.Run(ctx, "sh", "-c", "find /opt/kubeslot /run/kubeslot /etc/systemd/system /etc/systemd/nspawn /var/lib/machines "+
		"-maxdepth 3 -not -name install.lock -printf '%p %y %s %m %l\\n' 2>/dev/null | sort; true")
	if err != nil {
		r.t.Fatal(err)
	}
	return string(out)
}

// pauseAt starts the bootstrap as a transient unit with the test hook set to cp, and waits until it paused there.
func (r *bsRig) pauseAt(ctx context.Context, unit string, cp ownership.Checkpoint) {
	r.t.Helper()
	args := []string{"systemd-run", "--unit=" + unit, "--collect", "--no-block"}
	for _, e := range append(append([]string(nil), r.env...), transition.EnvPauseAt+"="+string(cp)) {
		args = append(args, "--setenv="+e)
	}
	args = append(args, bsBinary, "--config="+bsConfigPath)
	if out, err := r.h.Run(ctx, args...); err != nil {
		r.t.Fatalf("start %s: %v\n%s", unit, err, out)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		j, _ := r.h.Journal(wctx, unit)
		if strings.Contains(j, "paused before "+string(cp)) {
			return
		}
		if strings.Contains(j, "failed") && !strings.Contains(j, "paused") {
			if active, _ := r.h.Run(wctx, "systemctl", "is-active", unit); strings.TrimSpace(string(active)) != "active" {
				r.t.Fatalf("%s ended before pausing at %s:\n%s", unit, cp, tailLines(j, 40))
			}
		}
		select {
		case <-wctx.Done():
			r.t.Fatalf("%s did not pause at %s: %v\n%s", unit, cp, wctx.Err(), tailLines(j, 40))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// seedCache puts the mirror's rootfs and kubelet into the host's artifact cache, as a host that downloaded them
// before would have them: the benchmark "bootstrap to Node Ready with artifacts cached".
func (r *bsRig) seedCache(ctx context.Context) {
	r.t.Helper()
	script := "mkdir -p /opt/kubeslot/cache/sha256 && " +
		"cp " + bsMirrorPath + "/node-rootfs.tar.gz /opt/kubeslot/cache/sha256/" + r.sums["rootfs"] + " && " +
		"cp " + bsMirrorPath + "/kubelet /opt/kubeslot/cache/sha256/" + r.sums["kubelet"]
	if out, err := r.h.Run(ctx, "sh", "-c", script); err != nil {
		r.t.Fatalf("seed the artifact cache: %v\n%s", err, out)
	}
}
