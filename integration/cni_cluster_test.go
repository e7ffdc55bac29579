package integration

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
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/integration/workload"
	"github.com/kubeslot/kubeslot/lib/requests"
)

const (
	rigCNIBridge = "rigcni0"             // the test CNI's bridge: not kubeslot's cni0
	rigCNIFile   = "10-rig-cni.conflist" // what the DaemonSet writes
)

func TestClusterCNIOnRig(t *testing.T) {
	if err := sdhost.V1ControllersAvailable(); err != nil {
		if rigRequired {
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
	workload.WriteArchive(t, pauseTar, map[string]v1.Image{podsSandbox: app.PauseImage(t)})

	r := &rpRig{newBootstrapRigWith(t, ctx, "cnic", bsOptions{
		Pods: true, Forward: []string{reg.Host}, Mirror: map[string]string{"pause.tar": pauseTar},
		Extra: func(r *bsRig) string {
			// no [node.cni]: mode "cluster" is the default
			return fmt.Sprintf(`
[node]
sandbox_image = %q
preload_images = [{source = %q, sha256 = %q}]

[node.registry_mirrors]
%q = [%q]
`, podsSandbox, r.srv.URL("pause.tar"), r.sums["pause.tar"], podsRegistry, reg.MirrorURL())
		},
	})}
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if r.h.Running() {
			_, _ = r.h.Run(sctx, "systemctl", "stop", "systemd-nspawn@b.service")
		}
	})
	r.seedCache(ctx)
	p := &podsRig{rpRig: r, reg: reg}

	// The bootstrap waits for Node Ready, which needs the DaemonSet: start it and go on.
	t0 := time.Now()
	if out, err := r.h.Run(ctx, "systemctl", "start", "--no-block", "kubeslot-bootstrap.service"); err != nil {
		t.Fatalf("start the bootstrap: %v\n%s", err, out)
	}
	var notReady string
	eventually(t, 3*time.Minute, "Node "+r.node+" registered, NotReady for want of a network", func() (bool, string) {
		n, err := r.admin.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
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
	rigTiming(t, "cluster CNI: bootstrap start -> Node registered, NotReady", time.Since(t0))
	t.Logf("Node NotReady: %s", notReady)
	// The plugins of the rootfs are seeded into the host-kept plugin dir; no network configuration yet.
	out, err := r.h.Run(ctx, "sh", "-c", "ls /opt/kubeslot/node/cni/bin; echo ---; ls -A /opt/kubeslot/node/cni/net.d")
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
	if rec, err := r.record(); err != nil || rec.Checkpoint != "starting-node" {
		t.Errorf("the bootstrap should wait in starting-node: %+v %v", rec, err)
	}

	// The cluster's CNI DaemonSet (its pods bound by the test: the rig runs no scheduler).
	node, err := r.admin.CoreV1().Nodes().Get(ctx, r.node, metav1.GetOptions{})
	if err != nil || node.Spec.PodCIDR == "" {
		t.Fatalf("Node %s podCIDR %q: %v (the controller manager allocates node CIDRs)", r.node, node.Spec.PodCIDR, err)
	}
	ns := p.namespace(ctx)
	t1 := time.Now()
	p.cniDaemonSet(ctx, ns, node.Spec.PodCIDR)
	if err := r.startUnit(ctx); err != nil { // waits for the running start job: the bootstrap completes
		t.Fatalf("bootstrap: %v", err)
	}
	waitNodeHeartbeat(t, ctx, r.admin, r.node, time.Time{}, 2*time.Minute, r.h)
	rigTiming(t, "cluster CNI: DaemonSet created -> Node Ready, bootstrap complete", time.Since(t1))
	if rec, err := r.record(); err != nil || rec.Checkpoint != "complete" {
		t.Fatalf("bootstrap record %+v %v", rec, err)
	}
	if out, err := r.h.Run(ctx, "cat", "/opt/kubeslot/node/cni/net.d/"+rigCNIFile); err != nil || !strings.Contains(string(out), node.Spec.PodCIDR) {
		t.Errorf("the DaemonSet's configuration is not on the host under /opt/kubeslot/node/cni/net.d: %v\n%s", err, out)
	}
	r.workerDropIns(ctx)

	// A normal pod gets an address on that network and answers the host.
	web := p.webPod(ctx, ns, time.Time{}, node.Spec.PodCIDR)
	t.Logf("pod %s on the DaemonSet's network: %s", web.Name, web.Status.PodIP)

	// No CNI DaemonSet any more; then a repave onto slot b.
	p.removeDaemonSet(ctx, ns)
	_, applied := r.active()
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/round"] = "cni-cluster"
	repave := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 2, ""), MachineGeneration: 2,
		Reason: "rig: the cluster CNI's files survive a repave", Desired: desired, Disruption: noDrain}
	t2 := time.Now()
	r.drop(ctx, repave)
	s := r.waitStatus(ctx, repave.ID, 6*time.Minute)
	r.logStatus("cluster CNI: repave a -> b", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("repave: %+v", s)
	}
	web = p.webPod(ctx, ns, t2, node.Spec.PodCIDR)
	rigTiming(t, "cluster CNI: repave request -> pod Ready again on slot b, no DaemonSet", time.Since(t2))
	t.Logf("after the repave: pod %s at %s", web.Name, web.Status.PodIP)

	// Reset removes kubeslot's tree, with the CNI files it kept.
	if code, out := r.resetByHand(ctx, r.env...); code != 0 {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	for _, path := range []string{"/opt/kubeslot", "/etc/systemd/nspawn/a.nspawn", "/etc/systemd/nspawn/b.nspawn", "/var/lib/machines/a", "/var/lib/machines/b"} {
		if out, err := r.h.Run(ctx, "test", "-e", path); err == nil {
			t.Errorf("%s still there after the reset %s", path, out)
		}
	}
	if out, _ := r.h.Run(ctx, "sh", "-c", "ip -o link show "+rigCNIBridge+" 2>/dev/null; true"); strings.TrimSpace(string(out)) != "" {
		t.Logf("the cluster CNI's bridge stays after the reset (not kubeslot's): %s", strings.TrimSpace(string(out)))
	}
}

// rigConflist is the test CNI's network: a bridge with host-local addresses from the Node's podCIDR and portmap,
// what a simple cluster CNI (flannel's, say) writes.
func rigConflist(podCIDR string) string {
	return fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "rig-cni",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
`, rigCNIBridge, podCIDR)
}

// cniDaemonSet creates the DaemonSet and binds its pod to the node, as the scheduler would.
func (p *podsRig) cniDaemonSet(ctx context.Context, ns, podCIDR string) {
	t := p.t
	t.Helper()
	labels := map[string]string{"app": "rig-cni"}
	no, dir := false, corev1.HostPathDirectoryOrCreate
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "rig-cni", Namespace: ns},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					HostNetwork:                   true,
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, // not-ready, the rig's, any
					AutomountServiceAccountToken:  &no,
					EnableServiceLinks:            &no,
					TerminationGracePeriodSeconds: func() *int64 { v := int64(2); return &v }(),
					Containers: []corev1.Container{{
						Name: "install", Image: podsImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Args:         []string{"install", "/host/cni/net.d/" + rigCNIFile, rigConflist(podCIDR)},
						VolumeMounts: []corev1.VolumeMount{{Name: "net-d", MountPath: "/host/cni/net.d"}},
					}},
					Volumes: []corev1.Volume{{Name: "net-d", VolumeSource: corev1.VolumeSource{
						HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d", Type: &dir}}}},
				},
			},
		},
	}
	if _, err := p.admin.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the DaemonSet's pod created and bound to "+p.node, func() (bool, string) {
		list, err := p.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=rig-cni"})
		if err != nil {
			return false, err.Error()
		}
		for _, pod := range list.Items {
			if pod.Spec.NodeName != "" {
				return pod.Spec.NodeName == p.node, "bound to " + pod.Spec.NodeName
			}
			b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns},
				Target: corev1.ObjectReference{Kind: "Node", Name: p.node}}
			if err := p.admin.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
				return false, "bind: " + err.Error()
			}
		}
		return false, fmt.Sprintf("%d pods", len(list.Items))
	})
}

// removeDaemonSet deletes the DaemonSet and its pod and waits until the pod is gone: nothing rewrites the
// network configuration after this.
func (p *podsRig) removeDaemonSet(ctx context.Context, ns string) {
	t := p.t
	t.Helper()
	orphan := metav1.DeletePropagationOrphan // the rig runs no garbage collector: the pod goes by hand
	if err := p.admin.AppsV1().DaemonSets(ns).Delete(ctx, "rig-cni", metav1.DeleteOptions{PropagationPolicy: &orphan}); err != nil {
		t.Fatal(err)
	}
	if err := p.admin.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=rig-cni"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the DaemonSet's pod gone", func() (bool, string) {
		list, err := p.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=rig-cni"})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d pods", len(list.Items))
	})
}

// webPod creates (once) a normal pod of the workload, waits until it is Ready with its container started at or
// after since and an address in podCIDR, and GETs it from the host.
func (p *podsRig) webPod(ctx context.Context, ns string, since time.Time, podCIDR string) *corev1.Pod {
	t := p.t
	t.Helper()
	if since.IsZero() {
		pod := p.workloadPod("web", ns)
		if _, err := p.admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	prefix, err := netip.ParsePrefix(podCIDR)
	if err != nil {
		t.Fatal(err)
	}
	floor := since.Truncate(time.Second)
	var ready *corev1.Pod
	eventually(t, 4*time.Minute, "pod web Ready with an address in "+podCIDR, func() (bool, string) {
		pod, err := p.admin.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		state := fmt.Sprintf("%s ip=%q", pod.Status.Phase, pod.Status.PodIP)
		ok := pod.Status.Phase == corev1.PodRunning && len(pod.Status.ContainerStatuses) == 1
		for _, cs := range pod.Status.ContainerStatuses {
			if !cs.Ready || cs.State.Running == nil || cs.State.Running.StartedAt.Time.Before(floor) {
				ok = false
			}
			if w := cs.State.Waiting; w != nil {
				state += " " + w.Reason + ": " + w.Message
			}
		}
		ip, err := netip.ParseAddr(pod.Status.PodIP)
		if ok && (err != nil || !prefix.Contains(ip)) {
			return false, state + ": not an address of the DaemonSet's network"
		}
		ready = pod
		return ok, state
	})
	u := "http://" + net.JoinHostPort(ready.Status.PodIP, fmt.Sprint(workload.Port)) + "/"
	eventually(t, time.Minute, "the host reaches pod web at "+u, func() (bool, string) {
		body, err := p.hostGet(ctx, u)
		return err == nil && strings.Contains(body, workload.Greeting), fmt.Sprintf("%v %s", err, body)
	})
	return ready
}
