package rig

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
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/mirror"
	"github.com/kubeslot/kubeslot/integration/netfwd"
	"github.com/kubeslot/kubeslot/integration/nodeimage"
	"github.com/kubeslot/kubeslot/integration/rigenv"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/transition"
	"github.com/kubeslot/kubeslot/units"
)

const (
	BinsPath     = "/srv/kubeslot-bins"   // the freshly built binaries, bound read-only
	bsMirrorPath = "/srv/kubeslot-mirror" // the mirror's directory, bound read-only (to seed the cache)
	bsBinary     = "/opt/kubeslot/current/kubeslot-bootstrap"
	ConfigPath   = units.ConfigPath
)

// Rig is one isolated host ready to bootstrap, and what it needs from the machine.
type Rig struct {
	t     *testing.T
	CP    *kube.ControlPlane
	H     *sdhost.Host
	Srv   *mirror.Server
	Admin *kubernetes.Clientset
	MC    *machineapi.Client
	Node  string
	Env   []string // the sandbox environment, KEY=VALUE
	Token string
	Sums  map[string]string
	extra func(r *Rig) string // TOML appended to the configuration
	// release is Options.Release.
	release string
	// watcherEnv and nodeReady are Options'.
	watcherEnv []string
	nodeReady  string
	// Fwd and unroute are what connect forwarded and the removal of its egress route (a reboot's new namespace
	// needs both again: TestHooksOnRig).
	Fwd     []string
	Unroute func()
	// Rootfs is the node rootfs tarball on the machine (served as Options.RootfsName); ports are the two free
	// ports the sandbox environment gives the kubelet (its port, its healthz port).
	Rootfs string
	Ports  []int
}

// Options shape a bootstrap rig's host.
type Options struct {
	// Persistent keeps the host's disk across Kill and Boot.
	Persistent bool
	// Pods makes a host whose node can run pods (TestPodsOnRig): its own network namespace with a node IP, the
	// control plane, the mirror and registries reached through forwarders on the same loopback addresses, the
	// apiserver reaching the node IP through its cluster egress, writable cgroup v1 controllers of its own, and
	// only the sandbox settings such a host still needs.
	Pods bool
	// Forward lists more machine loopback addresses ("127.0.0.1:port") to forward into a Pods host.
	Forward []string
	// Mirror adds files to the rig's mirror (name → path on the machine); their sha256 are in Rig.sums.
	Mirror map[string]string
	// Extra returns TOML appended to the configuration.
	Extra func(r *Rig) string
	// Release, when set, is the Kubernetes version the host starts with, its kubelet found on the mirror's release
	// tree (ReleaseDir, [kubernetes.release]) rather than named in [artifacts.kubelet].
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
	// NoLayDown leaves the host as a fresh one, the binaries bound at BinsPath: the test installs it the way an
	// operator would (TestPlainInstallOnRig).
	NoLayDown bool
	// Driver binds this test binary into the host at NspawnDriverPath (the nspawn backend's driver: integration/node's init).
	Driver bool
	// CgroupMode is the host's cgroup layout (sdhost.Options.CgroupMode).
	CgroupMode string
	// RootfsName is the node rootfs's name on the mirror (default "node-rootfs.tar.gz").
	RootfsName string
	// Figure, when set, receives the host's boot and stop times ("host boot", "host stop") instead of the log.
	Figure func(what string, d time.Duration)
}

// ReleaseDir is the release tree in the rig's mirror: <dir>/v<version>/bin/linux/<arch>/kubelet.
const ReleaseDir = "release"

// New boots a host named after base and lays down the release, the config and the first-boot unit.
func New(t *testing.T, ctx context.Context, base string, persistent bool) *Rig {
	t.Helper()
	return NewWith(t, ctx, base, Options{Persistent: persistent})
}

// NewWith is New with the host shaped by o.
func NewWith(t *testing.T, ctx context.Context, base string, o Options) *Rig {
	t.Helper()
	persistent := o.Persistent
	var cp *kube.ControlPlane
	if o.Bare {
		cp = NeedCluster(t)
	} else {
		cp = NeedAPI(t)
	}
	// Without KUBESLOT_REQUIRE_RIG an unbuilt rootfs skips (building it takes minutes); with it, it is built.
	tarball, err := nodeimage.Tarball(ctx, Required)
	if err != nil {
		if Required {
			t.Fatalf("node rootfs: %v", err)
		}
		t.Skipf("node rootfs not built (run scripts/node-rootfs.sh): %v", err)
	}
	rootfsName := cmp.Or(o.RootfsName, "node-rootfs.tar.gz")
	var bins string
	if !o.Bare {
		bins = NeedBins(t)
	}
	r := &Rig{t: t, CP: cp, Node: fmt.Sprintf("%s-%d", base, os.Getpid()%100000), Sums: map[string]string{}, extra: o.Extra, release: o.Release,
		watcherEnv: o.WatcherEnv, nodeReady: o.NodeReady, Rootfs: tarball}
	if r.Admin, err = kubernetes.NewForConfig(cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	if r.MC, err = machineapi.New(cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	mirrorDir := filepath.Join(t.TempDir(), "mirror")
	if r.Srv, err = mirror.Start(mirrorDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Srv.Close() })
	if r.Sums["rootfs"], err = r.Srv.Add(rootfsName, tarball); err != nil {
		t.Fatal(err)
	}
	if r.Sums["kubelet"], err = r.Srv.Add("kubelet", filepath.Join(KubeBinDir, "kubelet")); err != nil {
		t.Fatal(err)
	}
	for name, p := range o.Mirror {
		if r.Sums[name], err = r.Srv.Add(name, p); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	t0 := time.Now()
	hostOpts := sdhost.Options{Name: r.Node + "-h", SharedNetwork: true, Persistent: persistent, Log: log, CgroupMode: o.CgroupMode,
		Binds: []sdhost.Bind{{Source: mirrorDir, Target: bsMirrorPath, ReadOnly: true}}}
	if !o.Bare {
		hostOpts.Binds = append(hostOpts.Binds, sdhost.Bind{Source: bins, Target: BinsPath, ReadOnly: true})
	}
	if o.Driver {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		hostOpts.Binds = append(hostOpts.Binds, sdhost.Bind{Source: exe, Target: NspawnDriverPath, ReadOnly: true})
	}
	figure := o.Figure
	if figure == nil {
		figure = func(what string, d time.Duration) { Timing(t, "bootstrap rig: "+what, d) }
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
	r.H, err = sdhost.Start(ctx, hostOpts)
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	if o.Pods {
		r.connect(append([]string{strings.TrimPrefix(cp.URL(), "https://"), r.Srv.Addr(), r.Srv.TLSAddr()}, o.Forward...))
	}
	figure("host boot", time.Since(t0))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if r.H.Running() {
			// The node first, so that its kubelet stops heartbeating before the host goes.
			_, _ = r.H.Run(sctx, "systemctl", "stop", "systemd-nspawn@a.service")
		}
		t1 := time.Now()
		if err := r.H.Stop(sctx); err != nil {
			t.Errorf("stop host: %v", err)
		}
		if o.Figure != nil {
			figure("host stop", time.Since(t1))
		}
		_ = r.Admin.CoreV1().Nodes().Delete(sctx, r.Node, metav1.DeleteOptions{})
		_ = r.MC.DeleteMachine(sctx, r.Node)
	})
	if r.Token, err = cp.CreateBootstrapToken(ctx, 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	if !o.Bare {
		// As an administrator enrolls a host before it joins: its agent registers its Machine. (A bare rig has no
		// cluster API, hence no role to bind.)
		EnrollNode(t, cp, r.Node)
	}
	ports, err := kube.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	r.Ports = ports
	r.Env = rigenv.Loopback(ports[0], ports[1])
	if o.Pods {
		r.Env = rigenv.Pods(r.H.NodeIP())
	}
	if o.Env != nil {
		r.Env = o.Env(r.Env)
	}
	if !o.Bare && !o.NoLayDown {
		r.LayDown(ctx)
	}
	return r
}

// Config is the rig's bootstrap configuration for machine (the rig's node name unless overridden), with the
// rootfs digest given (the mirror's unless overridden).
func (r *Rig) Config(machine, rootfsSum string) string {
	if machine == "" {
		machine = r.Node
	}
	if rootfsSum == "" {
		rootfsSum = r.Sums["rootfs"]
	}
	c := NspawnRigConfig(machine, r.CP.URL(), string(r.CP.CAPEM()), r.Token, r.Srv.URL("node-rootfs.tar.gz"), rootfsSum,
		r.Srv.URL("kubelet"), r.Sums["kubelet"])
	if r.release != "" {
		// The version picks the kubelet from the release mirror.
		i := strings.Index(c, "[artifacts.kubelet]")
		j := strings.Index(c, "[timeouts]")
		c = c[:i] + c[j:]
		c = strings.Replace(c, `version = "1.37.2"`, fmt.Sprintf("version = %q", r.release), 1)
		// Over the mirror's https listener, trusting its own CA: an http release mirror is refused.
		c += fmt.Sprintf("\n[kubernetes.release]\nmirror = %q\nca_pem = %q\n", r.Srv.TLSURL(ReleaseDir), r.Srv.CAPEM())
	}
	if r.nodeReady != "" {
		c = strings.Replace(c, `node_ready = "3m"`, fmt.Sprintf("node_ready = %q", r.nodeReady), 1)
	}
	return c + r.extraConfig()
}

func (r *Rig) extraConfig() string {
	if r.extra == nil {
		return ""
	}
	return r.extra(r)
}

// connect forwards each machine loopback address into the host's network namespace (same address there), and
// routes the apiserver's traffic for the node to it.
func (r *Rig) connect(addrs []string) {
	t := r.t
	t.Helper()
	ns, err := r.H.NetNS()
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
	remove, err := r.CP.RouteEgress(r.H.NodeIP(), r.H.NetNS, r.Node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	r.Fwd, r.Unroute = addrs, remove
}

// LayDown writes what `kubeslot ignition` lays down, and the rig's drop-in.
func (r *Rig) LayDown(ctx context.Context) {
	t := r.t
	t.Helper()
	if _, err := config.Parse("rig", []byte(r.Config("", ""))); err != nil {
		t.Fatalf("the test's own config is invalid: %v", err)
	}
	if err := r.H.WriteFile(ConfigPath, []byte(r.Config("", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := r.H.Run(ctx, "sh", "-c", "mkdir -p /opt/kubeslot/releases/blue && cp "+BinsPath+"/kubeslot* /opt/kubeslot/releases/blue/ && ln -sfn releases/blue /opt/kubeslot/current"); err != nil {
		t.Fatalf("lay down the release: %v\n%s", err, out)
	}
	unit, err := units.Render(units.Bootstrap, units.Vars{})
	if err != nil {
		t.Fatal(err)
	}
	dropIn := "[Service]\n"
	for _, e := range r.Env {
		dropIn += "Environment=" + e + "\n"
	}
	if err := r.H.WriteFile("/etc/systemd/system/"+units.Bootstrap+".d/rig.conf", []byte(dropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	// The watcher ensures the active slot's hooks at start, rendered with these settings too. A runtime drop-in
	// (the host's /run), so that /etc holds only what the reset test expects; it does not survive a power cut.
	watcherDropIn := dropIn
	for _, e := range r.watcherEnv {
		watcherDropIn += "Environment=" + e + "\n"
	}
	if out, err := r.H.Run(ctx, "sh", "-c", `mkdir -p /run/systemd/system/`+units.Watcher+`.d && printf '%s' "$1" >/run/systemd/system/`+units.Watcher+`.d/rig.conf`, "sh", watcherDropIn); err != nil {
		t.Fatalf("watcher drop-in: %v\n%s", err, out)
	}
	if err := r.H.InstallUnit(ctx, units.Bootstrap, unit); err != nil {
		t.Fatal(err)
	}
	// Enabled, as Ignition's "enabled": true does.
	if out, err := r.H.Run(ctx, "systemctl", "enable", units.Bootstrap); err != nil {
		t.Fatalf("enable %s: %v\n%s", units.Bootstrap, err, out)
	}
}

// Run runs the bootstrap binary by hand inside the host with the sandbox environment; it returns the exit code.
func (r *Rig) Run(ctx context.Context, args ...string) (int, string) {
	r.t.Helper()
	out, err := r.H.Run(ctx, append(append([]string{"env"}, r.Env...), append([]string{bsBinary}, args...)...)...)
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

// StartUnit starts the first-boot unit and waits (bounded by ctx) for the oneshot to finish.
func (r *Rig) StartUnit(ctx context.Context) error {
	out, err := r.H.Run(ctx, "systemctl", "start", units.Bootstrap)
	if err != nil {
		j, _ := r.H.Journal(ctx, units.Bootstrap)
		return fmt.Errorf("%v\n%s\njournal:\n%s\n%s", err, out, TailLines(j, 60), HostDiag(r.H))
	}
	return nil
}

// Record reads the ownership record of the host.
func (r *Rig) Record() (*ownership.Record, error) {
	data, err := r.H.ReadFile("/opt/kubeslot/ownership.json")
	if err != nil {
		return nil, err
	}
	var rec ownership.Record
	return &rec, json.Unmarshal(data, &rec)
}

// Tree lists the paths kubeslot may touch, with type, size and mode, for "host untouched" comparisons.
func (r *Rig) Tree(ctx context.Context) string {
	r.t.Helper()
	out, err := r.H.Run(ctx, "sh", "-c", "find /opt/kubeslot /run/kubeslot /etc/systemd/system /etc/systemd/nspawn /var/lib/machines "+
		"-maxdepth 3 -not -name install.lock -printf '%p %y %s %m %l\\n' 2>/dev/null | sort; true")
	if err != nil {
		r.t.Fatal(err)
	}
	return string(out)
}

// PauseAt starts the bootstrap as a transient unit with the test hook set to cp, and waits until it paused there.
func (r *Rig) PauseAt(ctx context.Context, unit string, cp ownership.Checkpoint) {
	r.t.Helper()
	args := []string{"systemd-run", "--unit=" + unit, "--collect", "--no-block"}
	for _, e := range append(append([]string(nil), r.Env...), transition.EnvPauseAt+"="+string(cp)) {
		args = append(args, "--setenv="+e)
	}
	args = append(args, bsBinary, "--config="+ConfigPath)
	if out, err := r.H.Run(ctx, args...); err != nil {
		r.t.Fatalf("start %s: %v\n%s", unit, err, out)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		j, _ := r.H.Journal(wctx, unit)
		if strings.Contains(j, "paused before "+string(cp)) {
			return
		}
		if strings.Contains(j, "failed") && !strings.Contains(j, "paused") {
			if active, _ := r.H.Run(wctx, "systemctl", "is-active", unit); strings.TrimSpace(string(active)) != "active" {
				r.t.Fatalf("%s ended before pausing at %s:\n%s", unit, cp, TailLines(j, 40))
			}
		}
		select {
		case <-wctx.Done():
			r.t.Fatalf("%s did not pause at %s: %v\n%s", unit, cp, wctx.Err(), TailLines(j, 40))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// SeedCache puts the mirror's rootfs and kubelet into the host's artifact cache, as a host that downloaded them
// before would have them: the benchmark "bootstrap to Node Ready with artifacts cached".
func (r *Rig) SeedCache(ctx context.Context) {
	r.t.Helper()
	script := "mkdir -p /opt/kubeslot/cache/sha256 && " +
		"cp " + bsMirrorPath + "/node-rootfs.tar.gz /opt/kubeslot/cache/sha256/" + r.Sums["rootfs"] + " && " +
		"cp " + bsMirrorPath + "/kubelet /opt/kubeslot/cache/sha256/" + r.Sums["kubelet"]
	if out, err := r.H.Run(ctx, "sh", "-c", script); err != nil {
		r.t.Fatalf("seed the artifact cache: %v\n%s", err, out)
	}
}
