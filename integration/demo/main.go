// Command demo runs kubeslot's whole life cycle on this one machine, with the real binaries and unit files, on the
// rig the whole-system tests use: a local control plane, an isolated systemd host sharing the machine's network, and
// a mirror serving the node rootfs, the kubelet and a newer agent bundle. It prints a timeline with durations and,
// after each step, what `kubectl get machines,machineoperations,nodes` shows; it cleans up on every exit path
// (Ctrl-C included), checks the machine is left as it was, and exits 1 if any step failed.
//
// Run it through `make demo` (which builds what it needs first); `make demo KEEP=1` stops before the reset and keeps
// the rig running for exploring. It needs root. It is a main package under integration/ so that it can use the rig's
// packages (integration/kube, sdhost, mirror, nodeimage, leakcheck); nothing imports it.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/leakcheck"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/mirror"
	"github.com/kubeslot/kubeslot/integration/netfwd"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/integration/workload"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/units"
)

// flags are the demo's inputs; make demo passes them.
type flags struct {
	bins       string // this release's binaries (bin/ of make build)
	kubeBin    string // etcd, kube-apiserver, kube-controller-manager, kubelet
	kubePrev   string // the kubelet of the earlier Kubernetes release the node starts on
	nodeRootfs string // the node rootfs tarball
	bundle     string // the release bundle of make bundle (optional; shown, not needed)
	kubectl    string
	keep       bool
	verbose    bool
	lockWait   time.Duration
}

// demo is the state the steps share.
type demo struct {
	flags flags
	out   io.Writer
	log   *slog.Logger
	work  string // temp dir: mirror, upgrade bundle, kubeconfig copy; removed at the end

	before       *leakcheck.Snapshot
	releaseShare func()
	leakSkip     string

	cp       *kube.ControlPlane
	admin    *kubernetes.Clientset
	mc       *machineapi.Client
	crds     bool // kubeslot's API is installed: kubectl can show Machines
	mirror   *mirror.Server
	sums     map[string]string
	host     *sdhost.Host
	hostName string
	node     string // node and Machine name
	env      []string
	version  string // the running agent release's version

	// the Kubernetes releases: the node starts on kubePrev and is upgraded to kubeCur through the Machine
	kubePrev, kubeCur string

	changedGen int64     // the Machine generation the configuration change made
	changedAt  time.Time // when it was made
	restartAt  time.Time // when the NodeRestart operation was created
	patchGen   int64     // the Machine generation of the patch release
	patchAt    time.Time // when it was asked for

	// the workload (workload.go): only where the machine can give the host what pods need
	pods     bool
	podsSkip string // why there are no pods
	reg      *workload.Registry
	forwards []*netfwd.Forwarder
	unroute  func()
	ns       string // the workload's namespace, once created
	probe    *workload.Prober
}

// step is one entry of the life cycle. run returns a detail line (what it measured) or an error; units are the
// host's units whose journals explain a failure.
type step struct {
	name  string
	run   func(context.Context) (string, error)
	units []string
}

func main() { os.Exit(run()) }

func run() int {
	var f flags
	flag.StringVar(&f.bins, "bins", "bin", "directory of this release's kubeslot binaries (make build)")
	flag.StringVar(&f.kubeBin, "kube-bin", os.Getenv("KUBESLOT_KUBE_BIN"), "directory of etcd, kube-apiserver, kube-controller-manager and kubelet (scripts/kube-bins.sh prints it)")
	flag.StringVar(&f.kubePrev, "kube-prev-bin", os.Getenv("KUBESLOT_KUBE_BIN_PREV"), "directory of the kubelet of the earlier Kubernetes release the node starts on (scripts/kube-bins.sh --prev kubelet prints it)")
	flag.StringVar(&f.nodeRootfs, "node-rootfs", os.Getenv("KUBESLOT_NODE_ROOTFS"), "node rootfs tarball (scripts/node-rootfs.sh prints it)")
	flag.StringVar(&f.bundle, "bundle", "", "release bundle written by make bundle (optional)")
	flag.StringVar(&f.kubectl, "kubectl", "kubectl", "kubectl binary (make demo passes the one scripts/kube-bins.sh builds)")
	flag.BoolVar(&f.keep, "keep", os.Getenv("KEEP") == "1", "stop before the reset and keep the rig running until Enter (go on) or Ctrl-C (clean up)")
	flag.DurationVar(&f.lockWait, "lock-wait", 5*time.Minute, "how long to wait for the machine lock held by rig test runs before going on without a leak check")
	flag.BoolVar(&f.verbose, "v", false, "log the rig's progress (control plane, host boot)")
	flag.Parse()

	level := slog.LevelWarn
	if f.verbose {
		level = slog.LevelInfo
	}
	d := &demo{flags: f, out: os.Stdout, sums: map[string]string{},
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))}
	if err := d.checkInputs(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 2
	}

	// Ctrl-C or SIGTERM cancels the steps; clean-up then runs with contexts of its own. Later signals are only
	// acknowledged: dying half-way through clean-up is what would leave things behind.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		n := 0
		for s := range sigs {
			if n++; n == 1 {
				fmt.Fprintf(d.out, "\n*** %s: stopping the demo and cleaning up (this takes up to a minute)\n", s)
				cancel()
			} else {
				fmt.Fprintf(d.out, "\n*** %s: still cleaning up, please wait\n", s)
			}
		}
	}()

	var err error
	if d.work, err = os.MkdirTemp("", "kubeslot-demo-"); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 1
	}
	fmt.Fprintf(d.out, "kubeslot demo: the whole life cycle on this machine (release %s)\n", d.version)
	tl := newTimeline(d.out)
	n := 1
	tl.begin(n, "take the machine lock and the leak check's first snapshot")
	t0 := time.Now()
	d.takeSnapshot(ctx)
	var lockErr error
	if d.before == nil {
		lockErr = skip("%s", d.leakSkip)
	}
	tl.end(n, "take the machine lock and the leak check's first snapshot", time.Since(t0), "", lockErr)
	steps := []step{
		{"start the control plane (etcd, kube-apiserver, kube-controller-manager)", d.startControlPlane, nil},
		{"install kubeslot's CRDs and access control (kubeslot cluster install)", d.clusterInstall, nil},
		{"build a workload image from Go source, serve it from a registry on loopback", d.buildWorkload, nil},
		{"boot an isolated systemd host", d.bootHost, nil},
		{"enroll the node before it joins (kubeslot cluster enroll)", d.enroll, nil},
		{"lay down the release, config and first-boot unit (as kubeslot ignition does)", d.layDown, nil},
		{"first-boot bootstrap (kubeslot-bootstrap.service)", d.bootstrap, []string{units.Bootstrap}},
		{"Node Ready on slot a, Machine registered by the watcher", d.readyOnA, []string{units.Bootstrap, units.Watcher}},
		{"kubeslot verify: the installation is healthy", d.verifyClean, []string{units.Bootstrap, units.Watcher}},
		{"kubeslot verify names an edited unit file (exit 3), then ok again", d.verifyNamesEdit, nil},
		{"a workload on the node: Deployment web, pod Ready, answering on its hostPort", d.runWorkload, []string{units.Watcher}},
		{"upgrade Kubernetes to the next patch release through the Machine (spec.node.kubernetesVersion, updatePolicy Immediate)", d.patchMachine, []string{units.Watcher}},
		{"the kubelet replaced in place on slot a, Node Ready on the new version", d.patched, []string{units.Watcher, "kubeslot-restart.service"}},
		{"the workload kept running through the patch: its pod Ready, its downtime", d.workloadAfterPatch, []string{units.Watcher}},
		{"change the node's labels through the Machine (spec.node.labels)", d.changeMachine, []string{units.Watcher}},
		{"watcher repaves onto slot b, Node Ready with the new label", d.repaved, []string{units.Watcher, "kubeslot-repave@next.service", "kubeslot-repave@b.service"}},
		{"the workload runs again on slot b: its downtime across the repave", d.workloadAfterRepave, []string{units.Watcher}},
		{"AgentUpgrade to a newer bundle", d.agentUpgrade, []string{units.Watcher, "kubeslot-upgrade.service", "kubeslot-recovery.service"}},
		{"kubeslot verify after the agent upgrade", d.verifyClean, []string{units.Watcher, "kubeslot-upgrade.service"}},
		{"NodeRestart", d.nodeRestart, []string{units.Watcher, "kubeslot-restart.service"}},
		{"the workload stays up through the restart: its pod Ready, its downtime", d.workloadAfterRestart, []string{units.Watcher}},
	}
	if f.keep { // before the reset, so that there is a node to explore
		steps = append(steps, step{"keep the rig running (KEEP=1)", d.keepRunning, nil})
	}
	steps = append(steps, []step{
		{"AgentReset", d.agentReset, []string{units.Watcher, "kubeslot-reset.service", units.Resetting}},
		{"host clean: no /opt/kubeslot, no kubeslot units, no machines", d.hostClean, []string{units.Resetting}},
	}...)
	for _, s := range steps {
		n++
		tl.begin(n, s.name)
		t0 = time.Now()
		detail, err := s.run(ctx)
		if err == errStopHere { // Ctrl-C while kept running: ctx is cancelled, the loop ends below
			detail, err = "Ctrl-C: cleaning up without the reset", nil
		} else if err != nil && ctx.Err() != nil {
			err = fmt.Errorf("interrupted: %w", err)
		}
		r := tl.end(n, s.name, time.Since(t0), detail, err)
		if ctx.Err() != nil {
			break // interrupted: straight to clean-up, no journals
		}
		if r.result == resultFailed && len(s.units) > 0 {
			if j := d.journals(s.units); j != "" {
				fmt.Fprintf(d.out, "%s\n", indent(j, "    "))
			}
		}
		d.showCluster()
		if r.result == resultFailed {
			break
		}
	}

	n++
	tl.begin(n, "tear down (host, mirror, control plane, temp dirs)")
	t0 = time.Now()
	err = d.tearDown()
	tl.end(n, "tear down (host, mirror, control plane, temp dirs)", time.Since(t0), "", err)
	n++
	tl.begin(n, "leak check: the machine as before")
	t0 = time.Now()
	detail, err := d.checkLeaks()
	tl.end(n, "leak check: the machine as before", time.Since(t0), detail, err)

	tl.table()
	if tl.failed() {
		fmt.Fprintln(d.out, "\nkubeslot demo: FAILED (see the step marked FAILED and the journals above)")
		return 1
	}
	fmt.Fprintln(d.out, "\nkubeslot demo: passed")
	return 0
}

// checkInputs makes the paths absolute and checks what the demo needs exists, before anything starts.
func (d *demo) checkInputs() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("needs root: it boots an isolated systemd host (run: sudo make demo)")
	}
	if err := sdhost.Available(); err != nil {
		return fmt.Errorf("isolated systemd hosts cannot run here: %w", err)
	}
	f := &d.flags
	for _, p := range []*string{&f.bins, &f.kubeBin, &f.kubePrev, &f.nodeRootfs, &f.bundle} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return err
		}
		*p = abs
	}
	if f.kubeBin == "" || f.kubePrev == "" || f.nodeRootfs == "" {
		return fmt.Errorf("-kube-bin, -kube-prev-bin and -node-rootfs are required (make demo passes them: scripts/kube-bins.sh [--prev kubelet], scripts/node-rootfs.sh)")
	}
	for _, name := range kube.Components {
		if _, err := os.Stat(filepath.Join(f.kubeBin, name)); err != nil {
			return fmt.Errorf("-kube-bin %s: %w (run make deps)", f.kubeBin, err)
		}
	}
	kubectl, err := exec.LookPath(f.kubectl)
	if err != nil {
		return fmt.Errorf("-kubectl %s: %w (make demo builds one with scripts/kube-bins.sh kubectl)", f.kubectl, err)
	}
	f.kubectl = kubectl
	for _, p := range []string{f.nodeRootfs, filepath.Join(f.bins, "kubeslot"), filepath.Join(f.bins, "kubeslot-bootstrap")} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w (run make deps build)", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := version(ctx, filepath.Join(f.bins, "kubeslot"))
	if err != nil {
		return err
	}
	d.version = v
	if d.kubeCur, err = kubeletRelease(ctx, filepath.Join(f.kubeBin, "kubelet")); err != nil {
		return err
	}
	if d.kubePrev, err = kubeletRelease(ctx, filepath.Join(f.kubePrev, "kubelet")); err != nil {
		return err
	}
	if d.kubePrev == d.kubeCur {
		return fmt.Errorf("-kube-prev-bin %s holds kubelet %s, the same release as -kube-bin's: nothing to upgrade", f.kubePrev, d.kubePrev)
	}
	return nil
}

// kubeletRelease is the release a kubelet binary reports.
func kubeletRelease(ctx context.Context, bin string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	return kuberelease.ParseKubeletVersion(out)
}

// keepRunning prints how to reach the rig and waits for Enter (go on with the reset) or Ctrl-C (clean up now).
func (d *demo) keepRunning(ctx context.Context) (string, error) {
	kc := filepath.Join(d.work, "admin.kubeconfig")
	data, err := os.ReadFile(d.cp.AdminKubeconfig())
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(kc, data, 0o600); err != nil {
		return "", err
	}
	pointer := filepath.Join(os.TempDir(), "kubeslot-demo.kubeconfig-path")
	if err := os.WriteFile(pointer, []byte(kc+"\n"), 0o644); err != nil {
		return "", err
	}
	defer os.Remove(pointer)
	pid := d.host.PID()
	podsHint := ""
	if d.ns != "" {
		podsHint = fmt.Sprintf("\n      %s get pods -n %s -o wide        # the workload\n      nsenter -t %d -n curl -s %s   # its hostPort, from the host's network",
			d.flags.kubectl, d.ns, d.host.PID(), d.edgeURL())
	}
	fmt.Fprintf(d.out, `
    The rig is running. From another shell:
      export KUBECONFIG=%s      # also written to %s
      export KUBECACHEDIR=%s    # keeps kubectl's cache out of ~/.kube
      %s get machines,machineoperations,nodes -o wide%s
      nsenter -t %d -a bash                      # a shell in the host (its own systemd, /opt/kubeslot)
      nsenter -t %d -a machinectl list           # the node machine of the active slot
      nsenter -t %d -a journalctl -u 'kubeslot-*' --no-pager
      nsenter -t %d -a machinectl shell %s       # a shell in the node (kubelet, containerd)
      nsenter -t %d -a /opt/kubeslot/current/kubeslot status
    Press Enter to go on with the AgentReset, or Ctrl-C to clean up now.
`, kc, pointer, d.kubectlCache(), d.flags.kubectl, podsHint, pid, pid, pid, pid, d.activeSlot(), pid)
	enter := make(chan struct{})
	go func() {
		// EOF (no terminal) is not a key press: then only a signal ends the wait.
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err == nil {
			close(enter)
		}
	}()
	select {
	case <-enter:
		return "explored; going on", nil
	case <-ctx.Done():
		return "", errStopHere
	}
}

// errStopHere ends the life cycle early without a failure: Ctrl-C while the rig is kept running.
var errStopHere = errors.New("stopped while kept running")
