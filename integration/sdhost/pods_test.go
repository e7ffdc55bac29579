package sdhost

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/leakcheck"
	"github.com/kubeslot/kubeslot/integration/nodeimage"
)

// The node-side settings a container needs in an nspawn node of a V1Controllers host (cgroup v1 hybrid machine,
// no CAP_SYS_RESOURCE). Each is necessary: without it the failure quoted beside it follows.
const (
	// podsNspawn is the node's .nspawn in the host.
	//   - Capability=all: without it runc's init fails ("error during container init: operation not permitted");
	//     DropCapability=CAP_MKNOD alone fails too ("unable to apply caps").
	//   - SystemCallFilter=@keyring: nspawn's default filter refuses the keyring calls, and runc joins a fresh
	//     session keyring per container ("unable to join session keyring: ... operation not permitted"). bpf, also
	//     in the recipe this test follows, is not needed here (v1 device cgroups are files, not BPF programs).
	podsNspawn = `[Exec]
Boot=yes
PrivateUsers=no
Capability=all
SystemCallFilter=@keyring

[Network]
VirtualEthernet=no
Private=no
`
	// podsDeviceDropIn widens systemd-nspawn@.service's closed device policy in the host so that runc can write
	// the OCI default spec's device rules into a container's device cgroup: on v1 a child can never allow what its
	// parent does not (failed to write "c *:* m", "b *:* m", "c 5:1 rwm": operation not permitted). char-/dev/console
	// is major 5 by its /proc/devices name: /dev/tty, /dev/console, /dev/ptmx. char-pts rw and /dev/net/tun rwm
	// come from the stock unit (tun needs the host's node: V1Controllers makes it; without it "c 10:200 rwm" fails).
	podsDeviceDropIn = `[Service]
DeviceAllow=char-* m
DeviceAllow=block-* m
DeviceAllow=char-/dev/console rwm
`
	// podsCgroupRW: nspawn 252 mounts the v1 controllers read-only in the node; runc must create the containers'
	// cgroups in them ("mkdir /sys/fs/cgroup/cpuset/k8s.io: read-only file system").
	podsCgroupRW = `[Unit]
Description=kubeslot rig: make the v1 cgroup controllers writable for containerd
DefaultDependencies=no
Before=containerd.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -euc 'for c in blkio cpu cpuacct cpuset devices freezer memory pids; do mount -o remount,bind,rw /sys/fs/cgroup/$c; done'
`
	podsContainerdDropIn = `[Unit]
Requires=rig-cgroup-rw.service
After=rig-cgroup-rw.service
`
	// podsContainerd: root on tmpfs (the node's / is on the host's overlay; the overlayfs snapshotter cannot stack
	// on it); restrict_oom_score_adj: without CAP_SYS_RESOURCE (the machine lacks it) a pod sandbox's oom_score_adj
	// of -998 cannot be set ("can't get final child's PID from pipe: EOF"). SystemdCgroup=false goes with the
	// kubelet's cgroupDriver: cgroupfs (containerd 1.6 cannot tell the kubelet); SystemdCgroup=true with
	// cgroupDriver: systemd worked here as well. ctr run uses neither CRI setting.
	podsContainerd = `version = 2
root = "/run/containerd-root"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
`
)

const (
	helloRef  = "rig.invalid/kubeslot/hello:1"
	helloLine = "rig-container: hello"
	// pauseRef is containerd 1.6's default sandbox image; the test's pause is the same binary, blocking.
	pauseRef = "registry.k8s.io/pause:3.6"
)

// podsKubeletConfig: a standalone kubelet (no apiserver) running static pods, with QoS cgroups and node allocatable
// enforcement on: the v1 controllers are writable in the node. failCgroupV1: false because kubelet 1.37 refuses v1
// otherwise; cgroupDriver must match containerd's SystemdCgroup=false. The rest leaves the shared kernel alone and
// turns off evictions and image GC (see nodeimage.WriteFiles).
const podsKubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
staticPodPath: /etc/kubernetes/manifests
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: true
enforceNodeAllocatable: ["pods"]
failSwapOn: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
evictionHard: {}
imageGCHighThresholdPercent: 100
`

const podsStaticPod = `apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  hostNetwork: true
  containers:
  - name: hello
    image: ` + helloRef + `
    imagePullPolicy: Never
    args: ["stay"]
`

// TestHostV1ControllersRunAContainer boots a host with V1Controllers, an nspawn node of the rig's node rootfs in it,
// and runs a container with the node's own containerd and runc (`ctr run`). On a cgroup v1 hybrid machine this is
// what a kubelet node needs to start any pod. It also checks that the host leaves no cgroup behind in any hierarchy.
func TestHostV1ControllersRunAContainer(t *testing.T) {
	required := os.Getenv("KUBESLOT_REQUIRE_RIG") == "1"
	if err := Available(); err != nil {
		if required {
			t.Fatalf("KUBESLOT_REQUIRE_RIG=1 but isolated hosts cannot run here: %v", err)
		}
		t.Skipf("isolated systemd host not available here: %v", err)
	}
	if err := V1ControllersAvailable(); err != nil {
		t.Skipf("not a cgroup v1 machine: %v", err) // nothing to prove on a unified machine
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	tarballPath, err := nodeimage.Tarball(ctx, required)
	if err != nil {
		if required {
			t.Fatalf("node rootfs: %v", err)
		}
		t.Skipf("node rootfs not built (run scripts/node-rootfs.sh): %v", err)
	}
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	timing := func(what string, t0 time.Time) { t.Logf("timing: %s %.2fs", what, time.Since(t0).Seconds()) }

	// The machine lock: exclusive for the first snapshot, shared while the host runs, exclusive again for the final
	// comparison. Other test binaries hold it shared for a whole suite: when it cannot be had exclusively within a
	// short wait, the machine-wide comparison is left out (the checks of the host's own cgroup dirs still run).
	var before *leakcheck.Snapshot
	lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
	releaseEx, err := leakcheck.Exclusive(lctx)
	lcancel()
	if err != nil {
		t.Logf("machine-wide leak check left out: %v", err)
	} else {
		before, err = leakcheck.Take()
		if err != nil {
			releaseEx()
			t.Fatal(err)
		}
	}
	releaseShare, err := leakcheck.Share(ctx)
	if releaseEx != nil {
		releaseEx()
	}
	if err != nil {
		t.Fatal(err)
	}
	defer releaseShare()

	t0 := time.Now()
	image := filepath.Join(t.TempDir(), "hello.tar")
	buildHelloImage(t, ctx, image)
	timing("build the image (go build + tarball)", t0)

	name := fmt.Sprintf("v1pods-%d", os.Getpid()%100000)
	node := "pn"
	t0 = time.Now()
	h, err := Start(ctx, Options{Name: name, CgroupMode: "hybrid", V1Controllers: true, Log: log})
	if err != nil {
		t.Fatalf("host: %v", err)
	}
	timing("host boot", t0)
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		t1 := time.Now()
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := h.Stop(sctx); err != nil {
			t.Errorf("stop host: %v", err)
		}
		timing("host stop", t1)
	}
	defer stop()
	cgroups := append([]string(nil), h.cgroups...)

	checkHostSide(t, ctx, h)

	// The node: the rig's Debian rootfs (containerd, runc, systemd) as a plain dir on the host's disk.
	t0 = time.Now()
	rootfs := filepath.Join(h.Root(), "var/lib/machines", node)
	st, err := nodeimage.Unpack(ctx, tarballPath, rootfs)
	if err != nil {
		t.Fatal(err)
	}
	timing(fmt.Sprintf("unpack node rootfs (%d files, %d MB)", st.Files, st.Bytes>>20), t0)
	img, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	// The kubelet's unit, sysctl binds and the rest come from nodeimage (with placeholder credentials: this
	// kubelet runs standalone); its config and command line are replaced below.
	err = nodeimage.WriteFiles(rootfs, nodeimage.Node{Name: node, CAPEM: []byte("unused"),
		BootstrapKubeconfig: []byte("unused"), KubeletPort: 10250, HealthzPort: 10248})
	if err != nil {
		t.Fatal(err)
	}
	kubelet, kubeletErr := kube.CachedBinDir()
	if kubeletErr == nil {
		kubelet = filepath.Join(kubelet, "kubelet")
		t1 := time.Now()
		if err := copyFile(kubelet, filepath.Join(rootfs, nodeimage.KubeletBinary)); err != nil {
			t.Fatal(err)
		}
		timing("copy kubelet into the node", t1)
	}
	id := make([]byte, 16)
	_, _ = rand.Read(id)
	writeNodeFiles(t, rootfs, map[string]string{
		"/etc/hostname":                        node + "\n",
		"/etc/machine-id":                      hex.EncodeToString(id) + "\n",
		"/etc/kubernetes/kubelet-config.yaml":  podsKubeletConfig,
		"/etc/kubernetes/manifests/hello.yaml": podsStaticPod,
		"/etc/systemd/system/kubelet.service.d/standalone.conf": "[Service]\nExecStart=\nExecStart=" + nodeimage.KubeletBinary +
			" --config=/etc/kubernetes/kubelet-config.yaml --root-dir=/var/lib/kubelet --hostname-override=" + node + "\n",
		"/etc/containerd/config.toml":                              podsContainerd,
		"/etc/systemd/system/rig-cgroup-rw.service":                podsCgroupRW,
		"/etc/systemd/system/containerd.service.d/rig-cgroup.conf": podsContainerdDropIn,
		"/var/tmp/hello.tar":                                       string(img),
	})
	if err := h.WriteFile("/etc/systemd/nspawn/"+node+".nspawn", []byte(podsNspawn), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.WriteFile("/etc/systemd/system/systemd-nspawn@"+node+".service.d/rig-devices.conf", []byte(podsDeviceDropIn), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Run(ctx, "systemctl", "daemon-reload"); err != nil {
		t.Fatal(err)
	}

	t0 = time.Now()
	if _, err := h.Run(ctx, "machinectl", "start", node); err != nil {
		t.Fatalf("machinectl start: %v\n%s", err, podsJournal(h, "", "systemd-nspawn@"+node+".service"))
	}
	nodeUp := true
	powerOff := func() {
		if !nodeUp {
			return
		}
		nodeUp = false
		t1 := time.Now()
		if err := podsPowerOff(h, node); err != nil {
			t.Errorf("node poweroff: %v", err)
		}
		timing("node poweroff", t1)
	}
	defer powerOff()
	state := ""
	for ctx.Err() == nil {
		out, _ := h.Run(ctx, "systemctl", "-M", node, "is-system-running")
		if state = strings.TrimSpace(string(out)); state == "running" || state == "degraded" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	timing("node boot to "+state, t0)
	if state != "running" {
		failed, _ := h.Run(ctx, "systemctl", "-M", node, "list-units", "--failed", "--no-legend", "--plain")
		t.Errorf("node is %q, want running; failed units:\n%s", state, failed)
	}
	if out, err := h.Run(ctx, "systemctl", "-M", node, "is-active", "containerd.service"); err != nil {
		t.Fatalf("containerd in the node: %s\n%s", out, podsJournal(h, node, "containerd.service", "rig-cgroup-rw.service"))
	}

	inNode := func(args ...string) (string, error) {
		out, err := h.Run(ctx, append([]string{"systemd-run", "-M", node, "--wait", "--pipe", "--quiet", "--"}, args...)...)
		return string(out), err
	}
	t0 = time.Now()
	if out, err := inNode("ctr", "-n", "k8s.io", "images", "import", "/var/tmp/hello.tar"); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	timing("ctr images import", t0)
	t0 = time.Now()
	out, err := inNode("ctr", "-n", "k8s.io", "run", "--rm", helloRef, "hello")
	timing("ctr run (container start to exit)", t0)
	if err != nil {
		t.Fatalf("ctr run: %v\n%s", err, podsJournal(h, node, "containerd.service"))
	}
	if !strings.Contains(out, helloLine) {
		t.Fatalf("the container did not print %q; ctr run printed:\n%s", helloLine, out)
	}
	t.Logf("the container printed:\n%s", strings.TrimSpace(out))

	// A kubelet: the static pod's sandbox and container must run and the container's line reach its log.
	if kubelet == "" {
		t.Logf("no kubelet binary cached (%v): the pod part is left out", kubeletErr)
	} else {
		t0 = time.Now()
		if out, err := h.Run(ctx, "systemctl", "-M", node, "start", nodeimage.KubeletUnit); err != nil {
			t.Fatalf("start kubelet: %v\n%s", err, out)
		}
		var logs string
		for ctx.Err() == nil && time.Since(t0) < 90*time.Second {
			logs, _ = inNode("/bin/sh", "-c", "cat /var/log/pods/default_hello-*/hello/*.log 2>/dev/null")
			if strings.Contains(logs, helloLine) {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		timing("kubelet start to the static pod's log line", t0)
		if !strings.Contains(logs, helloLine) {
			t.Fatalf("the static pod's container logged no %q (log: %q)\n%s", helloLine, logs,
				podsJournal(h, node, nodeimage.KubeletUnit, "containerd.service"))
		}
		t.Logf("the static pod logged:\n%s", strings.TrimSpace(logs))
		if out, err := inNode("/bin/sh", "-c", "ls -d /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/memory/kubepods/besteffort"); err != nil {
			t.Errorf("kubelet's QoS cgroups: %v", err)
		} else {
			t.Logf("kubelet's QoS cgroups:\n%s", strings.TrimSpace(out))
		}
	}

	// Leaks: every cgroup dir of the host gone, in every hierarchy (the memory one sits below the supervisor's
	// per-command cgroup, which the machine-wide snapshot does not look into), and the machine unchanged.
	powerOff()
	stop()
	for _, d := range cgroups {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup dir %s still there after Stop", d)
		}
	}
	if stray := strayV1Dirs(name, nil); len(stray) > 0 {
		t.Errorf("v1 cgroup dirs of the host left after Stop: %v", stray)
	}
	if before == nil {
		return
	}
	lctx, lcancel = context.WithTimeout(ctx, 30*time.Second)
	defer lcancel()
	releaseEx, err = leakcheck.Exclusive(lctx)
	if err != nil {
		t.Logf("machine-wide leak check left out: %v", err)
		return
	}
	defer releaseEx()
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	leaks, err := leakcheck.Check(cctx, before)
	if err != nil {
		t.Fatal(err)
	}
	if len(leaks) > 0 {
		t.Errorf("the machine changed (%d differences):\n  %s", len(leaks), strings.Join(leaks, "\n  "))
	}
}

// TestHostHybridWithoutV1Controllers: without the option a hybrid host is what it always was: no v1 controller
// mounted, no CAP_MKNOD, no /dev/net/tun, and no dir of it in the machine's controller hierarchies.
func TestHostHybridWithoutV1Controllers(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("KUBESLOT_REQUIRE_RIG") == "1" {
			t.Fatalf("KUBESLOT_REQUIRE_RIG=1 but isolated hosts cannot run here: %v", err)
		}
		t.Skipf("isolated systemd host not available here: %v", err)
	}
	if err := V1ControllersAvailable(); err != nil {
		t.Skipf("not a cgroup v1 machine: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("v1off-%d", os.Getpid()%100000)
	h, err := Start(ctx, Options{Name: name, CgroupMode: "hybrid"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := h.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	if stray := strayV1Dirs(name, nil); len(stray) > 0 {
		t.Errorf("the host has v1 controller dirs: %v", stray)
	}
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", h.PID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.Contains(l, " - cgroup ") && !strings.HasSuffix(f[4], "/systemd") {
			t.Errorf("v1 mount other than name=systemd: %s", l)
		}
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.PID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			if bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err != nil || bnd&(1<<27) != 0 {
				t.Errorf("host bounding set %s has CAP_MKNOD", strings.TrimSpace(v))
			}
		}
	}
	if out, err := h.Run(ctx, "test", "-e", "/dev/net/tun"); err == nil {
		t.Errorf("host has /dev/net/tun %s", out)
	}
}

// TestHostV1ReclaimsStrayDirs: dirs of a host of the same name that a crashed run left in a v1 hierarchy below some
// other cgroup (the CI supervisor runs each command in its own memory cgroup) are removed by the next Start, and the
// host's own dirs are gone after Stop.
func TestHostV1ReclaimsStrayDirs(t *testing.T) {
	if err := Available(); err != nil {
		if os.Getenv("KUBESLOT_REQUIRE_RIG") == "1" {
			t.Fatalf("KUBESLOT_REQUIRE_RIG=1 but isolated hosts cannot run here: %v", err)
		}
		t.Skipf("isolated systemd host not available here: %v", err)
	}
	if err := V1ControllersAvailable(); err != nil {
		t.Skipf("not a cgroup v1 machine: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	name := fmt.Sprintf("v1stray-%d", os.Getpid()%100000)
	other := filepath.Join("/sys/fs/cgroup/pids", name+"-elsewhere")
	stray := filepath.Join(other, rigDir, name)
	if err := os.MkdirAll(filepath.Join(stray, "system.slice"), 0o755); err != nil {
		t.Fatal(err)
	}
	defer removeIfEmpty(other)
	h, err := Start(ctx, Options{Name: name, CgroupMode: "hybrid", V1Controllers: true})
	if err != nil {
		_ = removeCgroupTree(filepath.Dir(stray), true)
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(stray)); err == nil {
		t.Errorf("Start left the stray %s", filepath.Dir(stray))
	}
	dirs := append([]string(nil), h.cgroups...)
	if err := h.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("cgroup dir %s still there after Stop", d)
		}
	}
}

// checkHostSide asserts what V1Controllers gives the host itself: its own writable v1 controllers, CAP_MKNOD and
// /dev/net/tun.
func checkHostSide(t *testing.T, ctx context.Context, h *Host) {
	t.Helper()
	mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", h.PID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range h.v1 {
		// mountinfo's root field is the mount's root in the reader's cgroup namespace (ours: the machine's), so
		// the host's own dir shows as its path below the machine's mount.
		want := strings.TrimPrefix(d.dir, d.mount) + " /sys/fs/cgroup/" + d.controller + " rw,"
		found := false
		for _, l := range strings.Split(string(mi), "\n") {
			if strings.Contains(l, want) && strings.Contains(l, " - cgroup ") {
				found = true
			}
		}
		if !found {
			t.Errorf("host: no read-write mount of its own %s dir at /sys/fs/cgroup/%s (want %q in its mountinfo)", d.controller, d.controller, want)
		}
	}
	// systemd in the host uses them: it runs its units in cgroups below its root in the memory and pids hierarchies.
	if out, err := h.Run(ctx, "cat", "/proc/1/cgroup"); err != nil || !strings.Contains(string(out), ":memory:/") {
		t.Errorf("host PID 1's cgroups: %v\n%s", err, out)
	} else {
		t.Logf("host PID 1's cgroups:\n%s", strings.TrimSpace(string(out)))
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", h.PID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "CapBnd:"); ok {
			bnd, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil || bnd&(1<<27) == 0 { // CAP_MKNOD
				t.Errorf("host bounding set %s lacks CAP_MKNOD", strings.TrimSpace(v))
			}
		}
	}
	if out, err := h.Run(ctx, "stat", "-c", "%F %t:%T", "/dev/net/tun"); err != nil || strings.TrimSpace(string(out)) != "character special file a:c8" {
		t.Errorf("host /dev/net/tun: %v %q", err, out)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeNodeFiles writes files into the node rootfs, resolving every path inside it.
func writeNodeFiles(t *testing.T, rootfs string, files map[string]string) {
	t.Helper()
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for p, data := range files {
		rel := strings.TrimPrefix(p, "/")
		if err := root.MkdirAll(filepath.Dir(rel), 0o755); err != nil {
			t.Fatal(err)
		}
		_ = root.Remove(rel)
		if err := root.WriteFile(rel, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// buildHelloImage writes a docker-archive tarball of helloRef and pauseRef: one layer holding one static Go binary,
// which prints helloLine and its cgroups, then with "stay" waits for SIGTERM; with "pause" it only waits.
func buildHelloImage(t *testing.T, ctx context.Context, dst string) {
	t.Helper()
	dir := t.TempDir()
	src := `package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	if mode != "pause" {
		cg, _ := os.ReadFile("/proc/self/cgroup")
		fmt.Printf("` + helloLine + ` from pid %d\n%s", os.Getpid(), cg)
	}
	if mode == "pause" || mode == "stay" {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
		<-ch
	}
}
`
	for f, data := range map[string]string{"go.mod": "module hello\n\ngo 1.22\n", "main.go": src} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		//lint:ignore SA1019 the fallback for a PATH without go (a test binary run by root); the tests run on the machine that built them, where GOROOT is meaningful
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.CommandContext(ctx, goTool, "build", "-trimpath", "-ldflags=-s -w", "-o", "hello", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local", "GOFLAGS=-buildvcs=false", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build of the container's binary: %v\n%s", err, out)
	}
	bin, err := os.ReadFile(filepath.Join(dir, "hello"))
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	if err := tw.WriteHeader(&tar.Header{Name: "hello", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg,
		ModTime: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(bin); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layer.Bytes())), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	images := map[name.Reference]v1.Image{}
	for ref, entrypoint := range map[string][]string{helloRef: {"/hello"}, pauseRef: {"/hello", "pause"}} {
		cf := cf.DeepCopy()
		cf.OS, cf.Architecture = "linux", runtime.GOARCH
		cf.Config.Entrypoint = entrypoint
		withConfig, err := mutate.ConfigFile(img, cf)
		if err != nil {
			t.Fatal(err)
		}
		tag, err := name.NewTag(ref)
		if err != nil {
			t.Fatal(err)
		}
		images[tag] = withConfig
	}
	if err := tarball.MultiRefWriteToFile(dst, images); err != nil {
		t.Fatal(err)
	}
}

// podsJournal is the tail of units' logs: of the host when node is "", else of the node.
func podsJournal(h *Host, node string, units ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	args := []string{"journalctl", "--no-pager", "-q", "-n", "80"}
	if node != "" {
		args = append(args, "-M", node)
	}
	for _, u := range units {
		args = append(args, "-u", u)
	}
	out, err := h.Run(ctx, args...)
	if err != nil {
		return fmt.Sprintf("(journal: %v)", err)
	}
	return string(out)
}

// podsPowerOff shuts the node down and waits until the host's machined has forgotten it.
func podsPowerOff(h *Host, node string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if _, err := h.Run(ctx, "machinectl", "poweroff", node); err != nil {
		return err
	}
	for ctx.Err() == nil {
		if _, err := h.Run(ctx, "machinectl", "show", node); err != nil {
			return nil // "No machine ... known"
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, _ = h.Run(context.Background(), "machinectl", "terminate", node)
	return fmt.Errorf("node %s still running after 45s; terminated it", node)
}
