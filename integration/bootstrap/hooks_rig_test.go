package bootstrap

// The node's lifecycle hooks on the rig: a host whose address changed across a reboot comes back
// with a correct node. The host has its own network namespace with a node address (sdhost NodeNetwork) and, unlike
// the other pods-capable rigs, no node IP pinned in the sandbox record: the pre-start hook picks the host's address,
// as on a real host. Between two boots the rig gives the host another address (inside its own namespace only).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/netfwd"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/integration/workload"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/bootstrap"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

func TestHooksOnRig(t *testing.T) {
	if err := sdhost.V1ControllersAvailable(); err != nil {
		if rig.Required {
			t.Fatalf("hosts with writable cgroup v1 controllers: %v", err)
		}
		t.Skipf("hosts with writable cgroup v1 controllers: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	r := rig.NewWith(t, ctx, "hooks", rig.Options{Persistent: true, Pods: true, Env: func(env []string) []string {
		// The production path: no node IP in the sandbox record. No pod network either (loopback CNI, no sandbox
		// image check): what this test asks of the node is its address and its serving certificate.
		env = slices.DeleteFunc(env, func(e string) bool { return strings.HasPrefix(e, bootstrap.EnvNodeIP+"=") })
		return append(env, bootstrap.EnvLoopbackCNI+"=1", bootstrap.EnvSkipSandboxImageCheck+"=1")
	}})
	first := r.H.NodeIP()
	t0 := time.Now()
	if err := r.StartUnit(ctx); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	rig.Timing(t, "hooks: bootstrap to Node Ready", time.Since(t0))
	checkNodeIP(t, ctx, r, first, time.Time{})
	servingCertFor(t, ctx, r, first)

	// Power off, another address, power on: the node starts at boot (machines.target) and its pre-start hook finds
	// the new address.
	if err := r.H.PowerOff(ctx); err != nil {
		t.Fatal(err)
	}
	second := netip.AddrFrom4([4]byte{10, 213, 231, 2})
	if first == second {
		second = netip.AddrFrom4([4]byte{10, 213, 232, 2})
	}
	if err := r.H.SetNodeIP(second); err != nil {
		t.Fatal(err)
	}
	// The new boot is a new namespace: the forwarders into it as soon as it has its network (the node and the
	// first-boot unit's run at boot reach the apiserver through them), the apiserver's route to the new address.
	r.H.OnNetwork(func(ns string) {
		for _, a := range r.Fwd {
			f, err := netfwd.Forward(ns, a, "", a)
			if err != nil {
				t.Errorf("forward %s into the host: %v", a, err)
				continue
			}
			t.Cleanup(func() { f.Close() })
		}
	})
	r.Unroute()
	remove, err := r.CP.RouteEgress(second, r.H.NetNS, r.Node)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(remove)
	t1 := time.Now()
	if err := r.H.Boot(ctx); err != nil {
		t.Fatalf("boot with the new address: %v", err)
	}
	rig.Timing(t, "hooks: boot with a new address", time.Since(t1))
	checkNodeIP(t, ctx, r, second, t1)
	rig.Timing(t, "hooks: boot with a new address to Node Ready with it", time.Since(t1))
	servingCertFor(t, ctx, r, second)
	rig.Timing(t, "hooks: boot with a new address to a serving certificate for it", time.Since(t1))

	// The watcher's post-start check: the Machine is not Degraded (a NodeAddressMismatch while the Node still showed
	// the old address clears once the kubelet posted the new one).
	rig.Eventually(t, 2*time.Minute, "the Machine's Degraded condition False", func() (bool, string) {
		m, err := r.MC.GetMachine(ctx, r.Node)
		if err != nil {
			return false, err.Error()
		}
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionDegraded)
		return c != nil && c.Status == metav1.ConditionFalse, fmt.Sprintf("%+v", c)
	})
	// apiserver → kubelet over TLS at the new address (the path of kubectl logs/exec): the node proxy.
	body, err := r.Admin.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", r.Node, "proxy", "healthz").DoRaw(ctx)
	if err != nil || strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("the kubelet's healthz through the apiserver: %q, %v", body, err)
	}
	// What the hook did, in the journal (its records carry KUBESLOT_HOOK=pre-start), at both boots.
	out, err := r.H.Run(ctx, "journalctl", "-q", "--no-pager", "-o", "cat", "KUBESLOT_HOOK=pre-start")
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []netip.Addr{first, second} {
		if !strings.Contains(string(out), "pre-start hook done") || !strings.Contains(string(out), `node_ip="`+ip.String()+`"`) {
			t.Errorf("the journal has no pre-start hook line with node_ip=%s:\n%s", ip, out)
		}
	}
	t.Logf("the pre-start hook's journal:\n%s", out)
	dropIn, err := r.H.ReadFile("/var/lib/machines/a" + nodeconfig.NodeIPDropIn)
	if err != nil || !strings.Contains(string(dropIn), "--node-ip="+second.String()+"\n") {
		t.Errorf("the kubelet's node IP drop-in: %v\n%s", err, dropIn)
	}
}

// checkNodeIP waits (bounded) until the Node is Ready after since with ip as its only InternalIP.
func checkNodeIP(t *testing.T, ctx context.Context, r *rig.Rig, ip netip.Addr, since time.Time) {
	t.Helper()
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, since, 3*time.Minute, r.H)
	rig.Eventually(t, time.Minute, "the Node's InternalIP is "+ip.String(), func() (bool, string) {
		n, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var internal []string
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				internal = append(internal, a.Address)
			}
		}
		return slices.Equal(internal, []string{ip.String()}), fmt.Sprint(n.Status.Addresses)
	})
}

// servingCertFor approves the kubelet's serving certificate request with the CLI an operator runs, until the
// kubelet serves a certificate of the cluster CA valid for ip (checked from inside the host's namespace).
func servingCertFor(t *testing.T, ctx context.Context, r *rig.Rig, ip netip.Addr) {
	t.Helper()
	bins := rig.NeedBins(t)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(r.CP.CAPEM()) {
		t.Fatal("cluster CA")
	}
	var approved string
	rig.Eventually(t, 2*time.Minute, "a kubelet serving certificate valid for "+ip.String(), func() (bool, string) {
		out, err := exec.CommandContext(ctx, filepath.Join(bins, "kubeslot"), "cluster", "approve-serving",
			"--kubeconfig", r.CP.AdminKubeconfig(), "--node", r.Node, "--node-cidrs", sdhost.NodeIPPrefix.String()).CombinedOutput()
		if err == nil && strings.Contains(string(out), "approved ") {
			approved = strings.TrimSpace(string(out))
		}
		ns, err := r.H.NetNS()
		if err != nil {
			return false, err.Error()
		}
		c := workload.HostClient(ns, 5*time.Second, &tls.Config{RootCAs: pool, ServerName: ip.String()})
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+net.JoinHostPort(ip.String(), "10250")+"/healthz", nil)
		resp, err := c.Do(req)
		if err != nil {
			return false, fmt.Sprintf("%v (approve-serving: %s)", err, out)
		}
		resp.Body.Close()
		return true, ""
	})
	t.Logf("serving certificate for %s: %s", ip, approved)
}
