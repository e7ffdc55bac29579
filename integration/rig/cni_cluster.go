package rig

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/workload"
)

const (
	CNIBridge = "rigcni0"             // the test CNI's bridge: not kubeslot's cni0
	CNIFile   = "10-rig-cni.conflist" // what the DaemonSet writes
)

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
`, CNIBridge, podCIDR)
}

// CNIDaemonSet creates the DaemonSet and binds its pod to the node, as the scheduler would.
func (p *PodsRig) CNIDaemonSet(ctx context.Context, ns, podCIDR string) {
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
						Name: "install", Image: PodsImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Args:         []string{"install", "/host/cni/net.d/" + CNIFile, rigConflist(podCIDR)},
						VolumeMounts: []corev1.VolumeMount{{Name: "net-d", MountPath: "/host/cni/net.d"}},
					}},
					Volumes: []corev1.Volume{{Name: "net-d", VolumeSource: corev1.VolumeSource{
						HostPath: &corev1.HostPathVolumeSource{Path: "/etc/cni/net.d", Type: &dir}}}},
				},
			},
		},
	}
	if _, err := p.Admin.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 2*time.Minute, "the DaemonSet's pod created and bound to "+p.Node, func() (bool, string) {
		list, err := p.Admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=rig-cni"})
		if err != nil {
			return false, err.Error()
		}
		for _, pod := range list.Items {
			if pod.Spec.NodeName != "" {
				return pod.Spec.NodeName == p.Node, "bound to " + pod.Spec.NodeName
			}
			b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns},
				Target: corev1.ObjectReference{Kind: "Node", Name: p.Node}}
			if err := p.Admin.CoreV1().Pods(ns).Bind(ctx, b, metav1.CreateOptions{}); err != nil {
				return false, "bind: " + err.Error()
			}
		}
		return false, fmt.Sprintf("%d pods", len(list.Items))
	})
}

// RemoveDaemonSet deletes the DaemonSet and its pod and waits until the pod is gone: nothing rewrites the
// network configuration after this.
func (p *PodsRig) RemoveDaemonSet(ctx context.Context, ns string) {
	t := p.t
	t.Helper()
	orphan := metav1.DeletePropagationOrphan // the rig runs no garbage collector: the pod goes by hand
	if err := p.Admin.AppsV1().DaemonSets(ns).Delete(ctx, "rig-cni", metav1.DeleteOptions{PropagationPolicy: &orphan}); err != nil {
		t.Fatal(err)
	}
	if err := p.Admin.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "app=rig-cni"}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 2*time.Minute, "the DaemonSet's pod gone", func() (bool, string) {
		list, err := p.Admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=rig-cni"})
		if err != nil {
			return false, err.Error()
		}
		return len(list.Items) == 0, fmt.Sprintf("%d pods", len(list.Items))
	})
}

// WebPod creates (once) a normal pod of the workload, waits until it is Ready with its container started at or
// after since and an address in podCIDR, and GETs it from the host.
func (p *PodsRig) WebPod(ctx context.Context, ns string, since time.Time, podCIDR string) *corev1.Pod {
	t := p.t
	t.Helper()
	if since.IsZero() {
		pod := p.workloadPod("web", ns)
		if _, err := p.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	prefix, err := netip.ParsePrefix(podCIDR)
	if err != nil {
		t.Fatal(err)
	}
	floor := since.Truncate(time.Second)
	var ready *corev1.Pod
	Eventually(t, 4*time.Minute, "pod web Ready with an address in "+podCIDR, func() (bool, string) {
		pod, err := p.Admin.CoreV1().Pods(ns).Get(ctx, "web", metav1.GetOptions{})
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
	Eventually(t, time.Minute, "the host reaches pod web at "+u, func() (bool, string) {
		body, err := p.HostGet(ctx, u)
		return err == nil && strings.Contains(body, workload.Greeting), fmt.Sprintf("%v %s", err, body)
	})
	return ready
}
