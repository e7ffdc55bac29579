package integration

// TestPodsOnRig: a kubeslot node is a node pods run on. A host with its own network namespace and
// writable cgroup v1 controllers (the rig's; bsOptions.Pods) bootstraps with the production node profile but for
// the sandbox settings the machine forces, a bridge pod network over the Node's podCIDR, a workload image built from
// Go source and pulled through a configured mirror of a registry on loopback, and the sandbox image preloaded from
// an archive. Then a Deployment with a readiness probe runs on it, and kubectl's logs, exec and port-forward answer
// through the apiserver, an unauthenticated kubelet request is refused, pods reach each other and the host reaches
// a pod; then the node restarts and repaves (three times, a -> b -> a -> b: the workload's downtime across a repave
// is measured three times, and make bench prints the median), and the pods come back without a second pull.

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"

	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/integration/workload"
	"github.com/kubeslot/kubeslot/lib/drain"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/requests"
)

const (
	podsRegistry = "registry.kubeslot.test" // a name only: the node's containerd reaches it through its mirror
	podsImage    = podsRegistry + "/workload:v1"
	podsSandbox  = podsRegistry + "/workload:pause"
)

func TestPodsOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()

	t0 := time.Now()
	p := newPodsRig(t, ctx, "pods", bsOptions{})
	r, reg := p.rpRig, p.reg
	rigTiming(t, "pods: host with its own network bootstrapped to Node Ready", time.Since(t0))

	// A Deployment with a readiness probe, bound to the node (the rig runs no scheduler).
	ns := p.namespace(ctx)
	t1 := time.Now()
	p.deploy(ctx, ns)
	pods := p.waitPods(ctx, ns, time.Time{}, 4*time.Minute)
	rigTiming(t, "pods: Deployment created -> 2 pods Ready", time.Since(t1))
	blobs := reg.BlobGETs("workload")
	// A pod with a hostPort, probed from the host (outside the node) every 100 ms through the restart and the
	// repave: the workload's downtime, whatever pod IPs the new sandboxes get (portmap, bridge mode).
	p.edgePod(ctx, ns)
	probe := p.startProbe(ctx)
	if blobs == 0 {
		t.Errorf("the workload image was not pulled through the mirror: registry requests %q", reg.Requests())
	}

	// kubectl logs, exec and port-forward, through the apiserver.
	logs, err := r.admin.CoreV1().Pods(ns).GetLogs(pods[0].Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || !strings.Contains(string(logs), "serving on") {
		t.Errorf("logs of %s: %v\n%s", pods[0].Name, err, logs)
	}
	// exec in one pod, reaching the other over the bridge network
	out, err := p.exec(ctx, ns, pods[0].Name, "/app", "get", "http://"+net.JoinHostPort(pods[1].Status.PodIP, "8080")+"/")
	if err != nil || !strings.Contains(out, workload.Greeting) || !strings.Contains(out, pods[1].Name) {
		t.Errorf("exec in %s, GET the other pod %s: %v\n%s", pods[0].Name, pods[1].Status.PodIP, err, out)
	}
	if body, err := p.portForward(ctx, ns, pods[1].Name); err != nil || !strings.Contains(body, pods[1].Name) {
		t.Errorf("port-forward to %s: %v\n%s", pods[1].Name, err, body)
	}
	// the host reaches a pod
	if body, err := p.hostGet(ctx, "http://"+net.JoinHostPort(pods[0].Status.PodIP, "8080")+"/"); err != nil || !strings.Contains(body, pods[0].Name) {
		t.Errorf("from the host to pod %s at %s: %v\n%s", pods[0].Name, pods[0].Status.PodIP, err, body)
	}
	// the kubelet API refuses a request without credentials
	if code, err := p.kubeletAnonymous(ctx); err != nil || code != http.StatusUnauthorized {
		t.Errorf("unauthenticated GET /pods on the kubelet: %d %v, want 401", code, err)
	}
	checkCISOnRig(t, ctx, r.bsRig, "a") // README's CIS table on the running node

	// Restart in place, then repave onto slot b: the pods come back, and nothing is pulled again.
	// A one-node cluster: evicted pods would have nowhere to go, so they stay (spec.disruption.drain None); what
	// is measured here is the node's own downtime as the workload sees it. The restart keeps the machine (its host
	// did not change): containerd and the kubelet restart, and the pods' containers keep running through it.
	restart := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 2, "pods-restart"), MachineGeneration: 2,
		Operation: "pods-restart", Reason: "rig", Disruption: noDrain}
	t2 := time.Now()
	r.drop(ctx, restart)
	s := r.waitStatus(ctx, restart.ID, 4*time.Minute)
	r.logStatus("pods: restart in place", s)
	if s.Phase != requests.Succeeded {
		t.Fatalf("restart: %+v", s)
	}
	p.waitPodsKept(ctx, ns, t2, 4*time.Minute)
	rigTiming(t, "pods: restart request -> pods Ready again", time.Since(t2))
	if j, err := r.h.Journal(ctx, "kubeslot-restart.service"); err != nil || !regexp.MustCompile(`node restarted .*how="services"`).MatchString(j) {
		t.Errorf("the restart did not keep the machine (nspawn.Backend.restartServices): %v\n%s", err, tailLines(j, 30))
	}
	rigTiming(t, "pods: workload downtime across a restart (hostPort probe from the host)", probe.downtime(t, t2, 2*time.Minute))
	if got := reg.BlobGETs("workload"); got != blobs {
		t.Errorf("after the restart the registry served %d blob GETs, before %d: the image was pulled again", got, blobs)
	}

	_, applied := r.active()
	desired := applied.Config
	desired.Kubernetes.Labels["kubeslot.dev/round"] = "pods"
	repave := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, 3, ""), MachineGeneration: 3,
		Reason: "rig: pods survive a repave", Desired: desired, Disruption: noDrain}
	t3 := time.Now()
	r.drop(ctx, repave)
	s = r.waitStatus(ctx, repave.ID, 6*time.Minute)
	r.logStatus("pods: repave a -> b", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("repave: %+v", s)
	}
	p.waitPods(ctx, ns, t3, 4*time.Minute)
	rigTiming(t, "pods: repave request -> pods Ready again on slot b", time.Since(t3))
	rigTiming(t, "pods: repave status written (after commit and clean) -> pods Ready", time.Since(s.UpdatedAt))
	rigTiming(t, "pods: workload downtime across a repave (hostPort probe from the host)", probe.downtime(t, t3, 2*time.Minute))
	// The old node's dead sandboxes went from the host while the new kubelet started (lib/cri), not one by one in its
	// pods' path: one per pod at least.
	if j, err := r.h.Journal(ctx, "kubeslot-repave@next.service"); err != nil || deadSandboxesRemoved(j) < 3 {
		t.Errorf("the repaver removed %d dead pod sandboxes of the old node, want at least 3 (one per pod): %v\n%s",
			deadSandboxesRemoved(j), err, tailLines(j, 30))
	} else if strings.Contains(j, "could not reach the node's systemd directly") { // nspawn.Backend.nodeSystemd
		t.Errorf("the repaver ran systemctl in a node instead of asking its systemd over the node's bus:\n%s", tailLines(j, 30))
	} else if !strings.Contains(j, "container runtime handed over") { // repave.handRuntime
		t.Errorf("the repave did not hand containerd over to the warm target before the switch:\n%s", tailLines(j, 30))
	}
	// The sandbox image's archive was imported by the first start, which left the list's marker in containerd's
	// state (both slots share it): slot b's preload before the kubelet was skipped, and the check beside the
	// kubelet found the image there and did not import it again.
	if out, err := r.h.Run(ctx, "journalctl", "-M", "b", "-u", nodeconfig.PreloadUnit, "-u", nodeconfig.PreloadVerifyUnit,
		"--no-pager", "-q", "-o", "cat"); err != nil || !strings.Contains(string(out), "unmet condition check (ConditionPathExists=!") ||
		!strings.Contains(string(out), "already imported: ") || strings.Contains(string(out), "importing ") {
		t.Errorf("slot b's preload was not skipped for the check beside the kubelet, or imported again what the first start imported: %v\n%s", err, out)
	}
	// The sandbox record's oom score: the kubelet sets 0, which needs no CAP_SYS_RESOURCE; its default -999 fails
	// here after two tries 100 ms apart, inside every start.
	if out, err := r.h.Run(ctx, "journalctl", "-M", "b", "-u", nodeconfig.KubeletUnit, "--no-pager", "-q", "-o", "cat"); err != nil ||
		!strings.Contains(string(out), "Started kubelet") || strings.Contains(string(out), "Failed to ApplyOOMScoreAdj") {
		t.Errorf("slot b's kubelet did not start, or failed to set its oom score (the sandbox's oomScoreAdj: 0): %v\n%s", err, tailLines(string(out), 30))
	}
	if os.Getenv("KUBESLOT_PODS_DIAG") == "1" { // the repaver's and the new node's journals once its pods are back, to see where the time went
		j, _ := r.h.Journal(ctx, "kubeslot-repave@next.service")
		t.Logf("repaver:\n%s", tailLines(j, 40))
		jr, _ := r.h.Journal(ctx, "kubeslot-restart.service")
		t.Logf("restart:\n%s", tailLines(jr, 20))
		ja, _ := r.h.Run(ctx, "journalctl", "-u", "systemd-nspawn@a.service", "--no-pager", "-q", "-o", "short-precise", "-n", "120")
		t.Logf("old machine a (host journal):\n%s", ja)
		out, _ := r.h.Run(ctx, "journalctl", "-M", "b", "--no-pager", "-q", "-o", "short-precise")
		var keep []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "kubelet[") || strings.Contains(l, "containerd") || strings.Contains(l, "systemd[1]") {
				keep = append(keep, l)
			}
		}
		t.Logf("node b:\n%s", strings.Join(keep, "\n"))
	}
	if got := reg.BlobGETs("workload"); got != blobs {
		t.Errorf("after the repave the registry served %d blob GETs, before %d: the image was pulled again", got, blobs)
	}

	// Two more repaves (b -> a -> b), measured the same way: the workload's downtime moves by a few tenths of a
	// second from one repave to the next on this machine, so make bench prints the median of the three
	// (scripts/benchtable takes the median of a figure's samples) rather than one draw against its 3 s target.
	for i, to := range []string{"a", "b"} {
		gen := int64(4 + i)
		_, applied := r.active()
		desired := applied.Config
		desired.Kubernetes.Labels["kubeslot.dev/round"] = fmt.Sprintf("pods-%d", gen)
		again := &requests.Request{Kind: requests.Repave, ID: requests.NewID(requests.Repave, gen, ""), MachineGeneration: gen,
			Reason: "rig: pods survive another repave", Desired: desired, Disruption: noDrain}
		at := time.Now()
		r.drop(ctx, again)
		s := r.waitStatus(ctx, again.ID, 6*time.Minute)
		if s.Phase != requests.Succeeded || s.ActiveSlot != to {
			t.Fatalf("repave %d onto slot %s: %+v", gen, to, s)
		}
		p.waitPods(ctx, ns, at, 4*time.Minute)
		rigTiming(t, "pods: workload downtime across a repave (hostPort probe from the host)", probe.downtime(t, at, 2*time.Minute))
	}
	if got := reg.BlobGETs("workload"); got != blobs {
		t.Errorf("after three repaves the registry served %d blob GETs, before %d: the image was pulled again", got, blobs)
	}

	// Reset removes what the node added to the host's network (the bridge and the CNI plugins' firewall chains,
	// journalled by the bridge mode) and kubeslot's tree with the images.
	podNet := func() string {
		out, _ := r.h.Run(ctx, "sh", "-c", "ip -o link show cni0 2>/dev/null; iptables -w 5 -t nat -S 2>/dev/null | grep -e '-j CNI-' -e '-N CNI-'; true")
		return strings.TrimSpace(string(out))
	}
	if podNet() == "" {
		t.Error("no cni0 link or CNI chains in the host before the reset: the check after it would prove nothing")
	}
	if code, out := r.resetByHand(ctx, r.env...); code != 0 {
		t.Fatalf("reset: exit %d\n%s", code, out)
	}
	if left := podNet(); left != "" {
		t.Errorf("left in the host's network after the reset:\n%s", left)
	}
	if out, err := r.h.Run(ctx, "test", "-e", "/opt/kubeslot"); err == nil {
		t.Errorf("/opt/kubeslot still there after the reset %s", out)
	}
}

// deadSandboxesRemoved is the count the repaver's journal j last logged for the old node's dead pod sandboxes it
// removed (0 when it logged none).
func deadSandboxesRemoved(j string) int {
	n := 0
	for _, l := range strings.Split(j, "\n") {
		if m := deadSandboxesLine.FindStringSubmatch(l); m != nil {
			n, _ = strconv.Atoi(m[1])
		}
	}
	return n
}

var deadSandboxesLine = regexp.MustCompile(`dead pod sandboxes of the stopped node removed .*removed="?(\d+)`)

// noDrain is spec.disruption.drain None in a request: the rig's pods are bound to its one node by name (there is no
// scheduler), so an evicted pod's replacement would land on the same node again, and a bare pod would be gone.
var noDrain = &drain.Policy{Skip: true}

// edgePort is the hostPort of the probed pod on the node IP.
const edgePort = 18080

// edgePod runs one more pod of the workload, with a hostPort, and waits until it answers there.
func (p *podsRig) edgePod(ctx context.Context, ns string) {
	t := p.t
	t.Helper()
	pod := p.workloadPod("edge", ns)
	pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: workload.Port, HostPort: edgePort}}
	if _, err := p.admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u := p.edgeURL()
	eventually(t, 2*time.Minute, "the edge pod answers on its hostPort "+u, func() (bool, string) {
		body, err := p.hostGet(ctx, u)
		return err == nil && strings.Contains(body, "edge"), fmt.Sprintf("%v %s", err, body)
	})
}

// workloadPod is a pod of the workload image bound to the rig's node (the rig runs no scheduler), tolerating the
// rig's taint, with no service account token or service links, and a short grace period.
func (p *podsRig) workloadPod(name, ns string) *corev1.Pod {
	no := false
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      p.node,
			Tolerations:                   []corev1.Toleration{{Key: "kubeslot.dev/rig", Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "web", Image: podsImage, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
}

func (p *podsRig) edgeURL() string {
	return "http://" + net.JoinHostPort(p.h.NodeIP().String(), fmt.Sprint(edgePort)) + "/"
}

// startProbe GETs the edge pod's hostPort every 100 ms from the host (1 s bound per GET) until the test ends.
func (p *podsRig) startProbe(ctx context.Context) *prober {
	u := p.edgeURL()
	pr := workload.StartProbe(func(pctx context.Context) bool {
		rctx, rcancel := context.WithTimeout(pctx, time.Second)
		defer rcancel()
		_, err := p.hostGet(rctx, u)
		return err == nil
	})
	stop := context.AfterFunc(ctx, pr.Stop)
	p.t.Cleanup(func() { stop(); pr.Stop() })
	return &prober{pr}
}

// prober is the edge pod's probe.
type prober struct{ *workload.Prober }

// downtime waits (bounded) until the probe has answered for a second past the call, and returns the longest gap
// between two answers from the last one before since on: last answer before the outage -> first after it.
func (pr *prober) downtime(t *testing.T, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	gap, _, _, err := pr.Downtime(context.Background(), since, bound)
	if err != nil {
		t.Errorf("the edge pod: %v", err)
	}
	return gap
}

type podsRig struct {
	*rpRig
	reg *workload.Registry
}

// newPodsRig bootstraps a host whose node runs the workload (bsOptions.Pods): the workload image built and pushed
// to a registry on loopback, forwarded into the host and configured as a mirror, the sandbox image preloaded from
// an archive, a bridge pod network; and approves the kubelet's serving certificate. o adds to that.
func newPodsRig(t *testing.T, ctx context.Context, base string, o bsOptions) *podsRig {
	t.Helper()
	if err := sdhost.V1ControllersAvailable(); err != nil {
		if rigRequired {
			t.Fatalf("hosts with writable cgroup v1 controllers: %v", err)
		}
		t.Skipf("hosts with writable cgroup v1 controllers: %v", err)
	}
	app := workload.Build(t)
	reg := workload.NewRegistry(t)
	reg.Push(t, "workload", "v1", app.Image(t))
	pauseTar := filepath.Join(t.TempDir(), "pause.tar")
	workload.WriteArchive(t, pauseTar, map[string]v1.Image{podsSandbox: app.PauseImage(t)})
	o.Pods = true
	o.Forward = append(o.Forward, reg.Host)
	if o.Mirror == nil {
		o.Mirror = map[string]string{}
	}
	o.Mirror["pause.tar"] = pauseTar
	extra := o.Extra
	o.Extra = func(r *bsRig) string {
		s := fmt.Sprintf(`
[node]
sandbox_image = %q
preload_images = [{source = %q, sha256 = %q}]

[node.cni]
mode = "bridge"

[node.registry_mirrors]
%q = [%q]
`, podsSandbox, r.srv.URL("pause.tar"), r.sums["pause.tar"], podsRegistry, reg.MirrorURL())
		if extra != nil {
			s += extra(r)
		}
		return s
	}
	p := &podsRig{rpRig: newRepaveRigWith(t, ctx, base, o), reg: reg}
	p.approveServing(ctx)
	return p
}

// approveServing approves the kubelet's serving certificate request with the CLI an operator runs, and waits
// until the kubelet serves with it.
func (p *podsRig) approveServing(ctx context.Context) {
	t := p.t
	t.Helper()
	bins := needBins(t)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		cmd := exec.CommandContext(wctx, filepath.Join(bins, "kubeslot"), "cluster", "approve-serving",
			"--kubeconfig", p.cp.AdminKubeconfig(), "--node", p.node, "--node-cidrs", sdhost.NodeIPPrefix.String())
		out, err := cmd.CombinedOutput()
		last = fmt.Sprintf("%v\n%s", err, out)
		if err == nil && strings.Contains(string(out), "approved ") {
			break
		}
		select {
		case <-wctx.Done():
			t.Fatalf("kubeslot cluster approve-serving approved nothing within 2m; last:\n%s", last)
		case <-time.After(time.Second):
		}
	}
	t.Logf("kubelet serving certificate: %s", strings.TrimSpace(last))
	for {
		if _, err := p.kubeletAnonymous(wctx); err == nil {
			return
		}
		select {
		case <-wctx.Done():
			t.Fatalf("the kubelet does not serve TLS on %s:10250 after its certificate was approved", p.h.NodeIP())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// namespace creates the test's namespace and waits for its default ServiceAccount (pods need it).
func (p *podsRig) namespace(ctx context.Context) string {
	t := p.t
	t.Helper()
	// One per rig host: tests of one run share the pid, and a deleted namespace lingers while it terminates.
	ns := p.node
	if _, err := p.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.admin.CoreV1().Namespaces().Delete(cctx, ns, metav1.DeleteOptions{})
	})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := p.admin.CoreV1().ServiceAccounts(ns).Get(wctx, "default", metav1.GetOptions{})
		if err == nil {
			return ns
		}
		if !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		select {
		case <-wctx.Done():
			t.Fatalf("namespace %s: no default ServiceAccount within 1m (is the serviceaccount controller running?)", ns)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (p *podsRig) deploy(ctx context.Context, ns string) {
	p.t.Helper()
	two, no := int32(2), false
	labels := map[string]string{"app": "web"}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &two,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:                      p.node,
					Tolerations:                   []corev1.Toleration{{Key: "kubeslot.dev/rig", Operator: corev1.TolerationOpExists}},
					AutomountServiceAccountToken:  &no,
					EnableServiceLinks:            &no,
					TerminationGracePeriodSeconds: func() *int64 { v := int64(2); return &v }(),
					Containers: []corev1.Container{{
						Name: "web", Image: podsImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Ports: []corev1.ContainerPort{{ContainerPort: workload.Port}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(workload.Port)}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := p.admin.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
}

// waitPods waits until the Deployment's two pods are Running and Ready with containers started at or after since
// (whole seconds), and returns them.
func (p *podsRig) waitPods(ctx context.Context, ns string, since time.Time, bound time.Duration) []corev1.Pod {
	p.t.Helper()
	floor := since.Truncate(time.Second)
	return p.waitPodsStarted(ctx, ns, bound, "started after "+floor.Format(time.RFC3339), func(at time.Time) bool { return !at.Before(floor) })
}

// waitPodsKept waits until the Deployment's two pods are Running and Ready with the containers they had before
// since (a restart that kept them running), and returns them.
func (p *podsRig) waitPodsKept(ctx context.Context, ns string, since time.Time, bound time.Duration) []corev1.Pod {
	p.t.Helper()
	return p.waitPodsStarted(ctx, ns, bound, "containers kept from before "+since.Format(time.RFC3339), func(at time.Time) bool { return at.Before(since) })
}

// waitPodsStarted waits until the Deployment's two pods are Running and Ready with every container's start time
// accepted by started (what says so), and returns them.
func (p *podsRig) waitPodsStarted(ctx context.Context, ns string, bound time.Duration, what string, started func(time.Time) bool) []corev1.Pod {
	t := p.t
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	last := "no pods"
	for {
		list, err := p.admin.CoreV1().Pods(ns).List(wctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err == nil {
			var ready []corev1.Pod
			var states []string
			for _, pod := range list.Items {
				ok := pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" && pod.DeletionTimestamp == nil
				for _, c := range pod.Status.Conditions {
					if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
						ok = false
					}
				}
				for _, cs := range pod.Status.ContainerStatuses {
					if !cs.Ready || cs.State.Running == nil || !started(cs.State.Running.StartedAt.Time) {
						ok = false
					}
					if w := cs.State.Waiting; w != nil {
						states = append(states, pod.Name+": "+w.Reason+": "+w.Message)
					}
				}
				if ok {
					ready = append(ready, pod)
				}
				states = append(states, fmt.Sprintf("%s %s ip=%s", pod.Name, pod.Status.Phase, pod.Status.PodIP))
			}
			if len(ready) == 2 && len(list.Items) == 2 {
				return ready
			}
			last = strings.Join(states, "; ")
		} else {
			last = err.Error()
		}
		select {
		case <-wctx.Done():
			ev, _ := p.admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
			var evs []string
			for _, e := range ev.Items {
				evs = append(evs, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
			}
			t.Fatalf("pods not Ready (%s) within %s; last: %s\nevents:\n%s\n%s", what, bound,
				last, strings.Join(evs, "\n"), hostDiag(p.h))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// exec runs a command in a pod's container through the apiserver (kubectl exec).
func (p *podsRig) exec(ctx context.Context, ns, pod string, cmd ...string) (string, error) {
	req := p.admin.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "web", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	e, err := remotecommand.NewSPDYExecutor(p.cp.AdminConfig(), http.MethodPost, req.URL())
	if err != nil {
		return "", err
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	err = e.StreamWithContext(ectx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	return out.String() + errb.String(), err
}

// portForward forwards a free loopback port to the pod's 8080 through the apiserver (kubectl port-forward) and
// GETs "/" through it.
func (p *podsRig) portForward(ctx context.Context, ns, pod string) (string, error) {
	cfg := p.cp.AdminConfig()
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", err
	}
	u := p.admin.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	var errb bytes.Buffer
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:8080"}, stop, ready, io.Discard, &errb)
	if err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	defer func() {
		close(stop)
		<-done
	}()
	select {
	case <-ready:
	case err := <-done:
		return "", fmt.Errorf("port-forward: %v %s", err, errb.String())
	case <-time.After(30 * time.Second):
		return "", fmt.Errorf("port-forward not ready within 30s: %s", errb.String())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		return "", fmt.Errorf("port-forward ports %v: %v", ports, err)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/", ports[0].Local))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return string(b), err
}

// hostClient is an HTTP client whose connections start inside the host's network namespace (10 s bound, no
// connection reuse).
func (p *podsRig) hostClient(tlsCfg *tls.Config) (*http.Client, error) {
	ns, err := p.h.NetNS()
	if err != nil {
		return nil, err
	}
	return workload.HostClient(ns, 10*time.Second, tlsCfg), nil
}

// hostGet GETs a URL from inside the host's network namespace.
func (p *podsRig) hostGet(ctx context.Context, u string) (string, error) {
	c, err := p.hostClient(nil)
	if err != nil {
		return "", err
	}
	return workload.Get(ctx, c, u)
}

// kubeletAnonymous sends GET /pods to the kubelet's API on the node IP without credentials, from inside the host's
// network namespace, and returns the HTTP status (an error when TLS or the connection fail).
func (p *podsRig) kubeletAnonymous(ctx context.Context) (int, error) {
	c, err := p.hostClient(&tls.Config{InsecureSkipVerify: true}) // the test asks whether it refuses, not who it is
	if err != nil {
		return 0, err
	}
	u := url.URL{Scheme: "https", Host: net.JoinHostPort(p.h.NodeIP().String(), "10250"), Path: "/pods"}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
