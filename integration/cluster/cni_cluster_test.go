package cluster

// TestClusterCNIOnRig: [node.cni] mode "cluster", the default, joins a host to a cluster whose pod
// network is a CNI DaemonSet's. The node comes up NotReady (no network configuration), with the CNI plugins of its
// rootfs seeded into the host-kept /opt/cni/bin; a DaemonSet's hostNetwork pod (the test workload in its "install"
// mode) writes a bridge + host-local + portmap conflist for the Node's podCIDR into /etc/cni/net.d through a
// hostPath, the Node turns Ready and the bootstrap completes, and a normal pod gets an address on that network.
// Then the DaemonSet is gone and the node repaves onto slot b: the configuration lives on the host
// (<base>/node/cni/), so the pod network works again with nothing rewriting it. Reset removes kubeslot's tree with
// those files. (The links the cluster's CNI made are the cluster CNI's, not kubeslot's: reset leaves them, as on any
// node; the host's network namespace goes with the rig host.)

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/integration/workload"
	"github.com/kubeslot/kubeslot/lib/requests"
)

func TestClusterCNIOnRig(t *testing.T) {
	if err := sdhost.V1ControllersAvailable(); err != nil {
		if rig.Required {
			t.Fatalf("hosts with writable cgroup v1 controllers: %v", err)
		}
		t.Skipf("hosts with writable cgroup v1 controllers: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()

	app := workload.Build(t)
	reg := workload.NewRegistry(t)
	reg.Push(t, "workload", "v1", app.Image(t))
	pauseTar := filepath.Join(t.TempDir(), "pause.tar")
	workload.WriteArchive(t, pauseTar, map[string]v1.Image{rig.PodsSandbox: app.PauseImage(t)})

	r := &rig.RepaveRig{Rig: rig.NewWith(t, ctx, "cnic", rig.Options{
		Pods: true, Forward: []string{reg.Host}, Mirror: map[string]string{"pause.tar": pauseTar},
		Extra: func(r *rig.Rig) string {
			// no [node.cni]: mode "cluster" is the default
			return fmt.Sprintf(`
[node]
sandbox_image = %q
preload_images = [{source = %q, sha256 = %q}]

[node.registry_mirrors]
%q = [%q]
`, rig.PodsSandbox, r.Srv.URL("pause.tar"), r.Sums["pause.tar"], rig.PodsRegistry, reg.MirrorURL())
		},
	})}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if r.H.Running() {
			_, _ = r.H.Run(sctx, "systemctl", "stop", "systemd-nspawn@b.service")
		}
	})
	r.SeedCache(ctx)
	p := &rig.PodsRig{RepaveRig: r, Reg: reg}

	// The bootstrap waits for Node Ready, which needs the DaemonSet: start it and go on.
	t0 := time.Now()
	if out, err := r.H.Run(ctx, "systemctl", "start", "--no-block", "kubeslot-bootstrap.service"); err != nil {
		t.Fatalf("start the bootstrap: %v\n%s", err, out)
	}
	var notReady string
	rig.Eventually(t, 3*time.Minute, "Node "+r.Node+" registered, NotReady for want of a network", func() (bool, string) {
		n, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				notReady = c.Message
				return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "network"), string(c.Status) + ": " + c.Message
			}
		}
		return false, "no Ready condition"
	})
	rig.Timing(t, "cluster CNI: bootstrap start -> Node registered, NotReady", time.Since(t0))
	t.Logf("Node NotReady: %s", notReady)
	// The plugins of the rootfs are seeded into the host-kept plugin dir; no network configuration yet.
	out, err := r.H.Run(ctx, "sh", "-c", "ls /opt/kubeslot/node/cni/bin; echo ---; ls -A /opt/kubeslot/node/cni/net.d")
	if err != nil {
		t.Fatalf("node CNI dirs on the host: %v\n%s", err, out)
	}
	bins, confs, _ := strings.Cut(string(out), "---")
	for _, plugin := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if !strings.Contains(bins, plugin+"\n") {
			t.Errorf("plugin %s not seeded into /opt/kubeslot/node/cni/bin:\n%s", plugin, bins)
		}
	}
	if strings.TrimSpace(confs) != "" {
		t.Errorf("network configuration before the DaemonSet ran: %s", confs)
	}
	if rec, err := r.Record(); err != nil || rec.Checkpoint != "starting-node" {
		t.Errorf("the bootstrap should wait in starting-node: %+v %v", rec, err)
	}

	// The cluster's CNI DaemonSet (its pods bound by the test: the rig runs no scheduler).
	node, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
	if err != nil || node.Spec.PodCIDR == "" {
		t.Fatalf("Node %s podCIDR %q: %v (the controller manager allocates node CIDRs)", r.Node, node.Spec.PodCIDR, err)
	}
	ns := p.Namespace(ctx)
	t1 := time.Now()
	p.CNIDaemonSet(ctx, ns, node.Spec.PodCIDR)
	if err := r.StartUnit(ctx); err != nil { // waits for the running start job: the bootstrap completes
		t.Fatalf("bootstrap: %v", err)
	}
	rig.WaitNodeHeartbeat(t, ctx, r.Admin, r.Node, time.Time{}, 2*time.Minute, r.H)
	rig.Timing(t, "cluster CNI: DaemonSet created -> Node Ready, bootstrap complete", time.Since(t1))
	if rec, err := r.Record(); err != nil || rec.Checkpoint != "complete" {
		t.Fatalf("bootstrap record %+v %v", rec, err)
	}
	if out, err := r.H.Run(ctx, "cat", "/opt/kubeslot/node/cni/net.d/"+rig.CNIFile); err != nil || !strings.Contains(string(out), node.Spec.PodCIDR) {
		t.Errorf("the DaemonSet's configuration is not on the host under /opt/kubeslot/node/cni/net.d: %v\n%s", err, out)
	}
	r.WorkerDropIns(ctx)

	// A normal pod gets an address on that network and answers the host.
	web := p.WebPod(ctx, ns, time.Time{}, node.Spec.PodCIDR)
	t.Logf("pod %s on the DaemonSet's network: %s", web.Name, web.Status.PodIP)

	// No CNI DaemonSet any more; then a repave onto slot b.
	p.RemoveDaemonSet(ctx, ns)
	_, applied := r.Active()
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/round"] = "cni-cluster"
	repave := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 2, ""), MachineGeneration: 2,
		Reason: "rig: the cluster CNI's files survive a repave", Desired: desired, Disruption: rig.NoDrain}
	t2 := time.Now()
	r.Drop(ctx, repave)
	s := r.WaitStatus(ctx, repave.ID, 6*time.Minute)
	r.LogStatus("cluster CNI: repave a -> b", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("repave: %+v", s)
	}
	web = p.WebPod(ctx, ns, t2, node.Spec.PodCIDR)
	rig.Timing(t, "cluster CNI: repave request -> pod Ready again on slot b, no DaemonSet", time.Since(t2))
	t.Logf("after the repave: pod %s at %s", web.Name, web.Status.PodIP)

	// Reset removes kubeslot's tree, with the CNI files it kept.
	if code, out := r.ResetByHand(ctx, r.Env...); code != 0 {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	for _, path := range []string{"/opt/kubeslot", "/etc/systemd/nspawn/a.nspawn", "/etc/systemd/nspawn/b.nspawn", "/var/lib/machines/a", "/var/lib/machines/b"} {
		if out, err := r.H.Run(ctx, "test", "-e", path); err == nil {
			t.Errorf("%s still there after the reset %s", path, out)
		}
	}
	if out, _ := r.H.Run(ctx, "sh", "-c", "ip -o link show "+rig.CNIBridge+" 2>/dev/null; true"); strings.TrimSpace(string(out)) != "" {
		t.Logf("the cluster CNI's bridge stays after the reset (not kubeslot's): %s", strings.TrimSpace(string(out)))
	}
}
