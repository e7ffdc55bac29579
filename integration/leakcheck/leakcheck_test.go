package leakcheck

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The tests are named *Host* so that the rig's usual `-run Host` selects them.

// TestHostLeakIsReported makes deliberate leaks (a tmpfs mount, a cgroup dir), sees Diff report exactly those, then
// cleans up and sees the difference go: the check can fail, and it passes again once the machine is restored.
func TestHostLeakIsReported(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a tmpfs and creates a cgroup dir")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	release, err := Exclusive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	t0 := time.Now()
	before, err := Take()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Take: %v; %d mounts, %d cgroup dirs, %d rig-looking processes", time.Since(t0).Round(time.Millisecond),
		len(before.Mounts), len(before.Cgroups), len(before.Procs))
	fmt.Printf("rig: leakcheck.Take %.2fs\n", time.Since(t0).Seconds())

	mnt := filepath.Join(t.TempDir(), "leaked")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("kubeslot-leaktest", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	mounted := true
	cgroupRoot := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(cgroupRoot); err != nil {
		cgroupRoot = "/sys/fs/cgroup" // pure cgroup2
	}
	cg := filepath.Join(cgroupRoot, fmt.Sprintf("kubeslot-leaktest-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	cgMade := true
	defer func() { // on an early failure
		if mounted {
			_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
		}
		if cgMade {
			_ = syscall.Rmdir(cg)
		}
	}()

	leaky, err := Take()
	if err != nil {
		t.Fatal(err)
	}
	d := Diff(before, leaky)
	t.Logf("diff with the leaks:\n%s", strings.Join(d, "\n"))
	for _, want := range []string{
		"mount added (1): " + mnt + " tmpfs kubeslot-leaktest",
		"cgroup dir added (1): " + cg,
	} {
		if !contains(d, want) {
			t.Errorf("Diff does not report %q", want)
		}
	}

	if err := syscall.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	mounted = false
	if err := syscall.Rmdir(cg); err != nil {
		t.Fatal(err)
	}
	cgMade = false
	cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
	defer ccancel()
	rest, err := Check(cctx, before)
	if err != nil {
		t.Fatal(err)
	}
	if len(rest) > 0 {
		t.Errorf("after cleaning up, the machine still differs:\n%s", strings.Join(rest, "\n"))
	}
}

func contains(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

// TestHostDiffReportsEachKind runs without root: Diff on hand-made snapshots.
func TestHostDiffReportsEachKind(t *testing.T) {
	before := &Snapshot{
		Mounts:  []string{"/ ext4 /dev/vda"},
		Cgroups: []string{"/sys/fs/cgroup/pids/a"},
		Rules:   map[string]string{"iptables-save": "*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"},
		Sysctls: map[string]string{"net.ipv4.ip_forward": "0"},
		Trees:   map[string][]string{"/var/lib/kubelet": {"/var/lib/kubelet absent"}},
		Links:   []string{"lo type=772 addr=00:00:00:00:00:00"},
		Procs:   []string{"systemd: /lib/systemd/systemd --system"},
	}
	after := &Snapshot{
		Mounts:  []string{"/ ext4 /dev/vda", "/x tmpfs t"},
		Cgroups: nil,
		Rules:   map[string]string{"iptables-save": "*filter\n:INPUT ACCEPT [0:0]\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n"},
		Sysctls: map[string]string{"net.ipv4.ip_forward": "1"},
		Trees:   map[string][]string{"/var/lib/kubelet": {"/var/lib/kubelet/ drwxr-xr-x"}},
		Links:   []string{"lo type=772 addr=00:00:00:00:00:00", "veth0 type=1 addr=aa"},
		Procs:   []string{"systemd: /lib/systemd/systemd --system", "systemd: /lib/systemd/systemd --system"},
	}
	got := strings.Join(Diff(before, after), "\n")
	for _, want := range []string{
		"mount added (1): /x tmpfs t",
		"cgroup dir removed (1): /sys/fs/cgroup/pids/a",
		"iptables-save line added (1): :KUBE-FIREWALL - [0:0]",
		`sysctl net.ipv4.ip_forward changed: "0" -> "1"`,
		"path removed (1): /var/lib/kubelet absent",
		"path added (1): /var/lib/kubelet/ drwxr-xr-x",
		"network link added (1): veth0 type=1 addr=aa",
		"process added (1): systemd: /lib/systemd/systemd --system", // a second one: multisets, not sets
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Diff lacks %q; got:\n%s", want, got)
		}
	}
	if d := Diff(before, before); len(d) != 0 {
		t.Errorf("Diff of a snapshot with itself: %v", d)
	}
}

// TestHostProcessFilter: rig-looking executables count, a compile of the Kubernetes sources does not.
func TestHostProcessFilter(t *testing.T) {
	ns := "pid:[1]"
	cases := []struct {
		p    procInfo
		want bool
	}{
		{procInfo{comm: "systemd", cmdline: "/lib/systemd/systemd --system", pidNS: ns}, true},
		{procInfo{comm: "kubelet", cmdline: "/opt/kubeslot/bin/kubelet --config x", pidNS: ns}, true},
		{procInfo{comm: "etcd", cmdline: "etcd --data-dir /tmp/x", pidNS: ns}, true},
		{procInfo{comm: "sleep", cmdline: "sleep infinity", pidNS: "pid:[2]"}, true},                      // inside a host
		{procInfo{comm: "sleep", cmdline: "sleep 1", pidNS: ns, cgroup: "0::/kubeslot-rig/h1/x\n"}, true}, // in a host's cgroup
		{procInfo{comm: "compile", cmdline: "/usr/local/go/pkg/tool/linux_amd64/compile -p k8s.io/kubernetes/cmd/kube-apiserver", pidNS: ns}, false},
		{procInfo{comm: "go", cmdline: "go build k8s.io/kubernetes/cmd/kubelet", pidNS: ns}, false},
		{procInfo{comm: "bash", cmdline: "bash scripts/kube-bins.sh etcd kubelet", pidNS: ns}, false},
	}
	for _, c := range cases {
		if got := interesting(c.p, ns); got != c.want {
			t.Errorf("interesting(%s: %s) = %v, want %v", c.p.comm, c.p.cmdline, got, c.want)
		}
	}
}

// TestHostMachineLockExcludesOtherProcesses: an exclusive holder in another process keeps Share waiting until
// the context ends. The other process is this test binary, re-run as a lock holder.
func TestHostMachineLockExcludesOtherProcesses(t *testing.T) {
	if os.Getenv("LEAKCHECK_HOLD_LOCK") == "1" {
		release, err := Exclusive(context.Background())
		if err != nil {
			os.Exit(3)
		}
		fmt.Println("held")
		time.Sleep(1500 * time.Millisecond)
		release()
		os.Exit(0)
	}
	lock := filepath.Join(t.TempDir(), "lock")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	holder := exec.Command(exe, "-test.run=^TestHostMachineLockExcludesOtherProcesses$")
	holder.Env = append(os.Environ(), "LEAKCHECK_HOLD_LOCK=1", "KUBESLOT_RIG_LOCK="+lock)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("lock holder said %q (%v)", line, err)
	}
	l := &procLock{path: lock} // this process's own lock state, on the test's lock file
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if release, err := l.take(ctx, &l.shared); err == nil {
		release()
		t.Fatal("Share was granted while another process held Exclusive")
	}
	if err := holder.Wait(); err != nil {
		t.Fatalf("lock holder: %v", err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	release, err := l.take(ctx2, &l.shared)
	if err != nil {
		t.Fatalf("Share after the holder exited: %v", err)
	}
	release()
}
