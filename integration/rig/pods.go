package rig

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
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
)

const (
	PodsRegistry = "registry.kubeslot.test" // a name only: the node's containerd reaches it through its mirror
	PodsImage    = PodsRegistry + "/workload:v1"
	PodsSandbox  = PodsRegistry + "/workload:pause"
)

// NoDrain is spec.disruption.drain None in a request: the rig's pods are bound to its one node by name (there is no
// scheduler), so an evicted pod's replacement would land on the same node again, and a bare pod would be gone.
var NoDrain = &drain.Policy{Skip: true}

// edgePort is the hostPort of the probed pod on the node IP.
const edgePort = 18080

// EdgePod runs one more pod of the workload, with a hostPort, and waits until it answers there.
func (p *PodsRig) EdgePod(ctx context.Context, ns string) {
	t := p.t
	t.Helper()
	pod := p.workloadPod("edge", ns)
	pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: workload.Port, HostPort: edgePort}}
	if _, err := p.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	u := p.edgeURL()
	Eventually(t, 2*time.Minute, "the edge pod answers on its hostPort "+u, func() (bool, string) {
		body, err := p.HostGet(ctx, u)
		return err == nil && strings.Contains(body, "edge"), fmt.Sprintf("%v %s", err, body)
	})
}

// workloadPod is a pod of the workload image bound to the rig's node (the rig runs no scheduler), tolerating the
// rig's taint, with no service account token or service links, and a short grace period.
func (p *PodsRig) workloadPod(name, ns string) *corev1.Pod {
	no := false
	grace := int64(2)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName:                      p.Node,
			Tolerations:                   []corev1.Toleration{{Key: "kubeslot.dev/rig", Operator: corev1.TolerationOpExists}},
			AutomountServiceAccountToken:  &no,
			EnableServiceLinks:            &no,
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "web", Image: PodsImage, ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
}

func (p *PodsRig) edgeURL() string {
	return "http://" + net.JoinHostPort(p.H.NodeIP().String(), fmt.Sprint(edgePort)) + "/"
}

// StartProbe GETs the edge pod's hostPort every 100 ms from the host (1 s bound per GET) until the test ends.
func (p *PodsRig) StartProbe(ctx context.Context) *prober {
	u := p.edgeURL()
	pr := workload.StartProbe(func(pctx context.Context) bool {
		rctx, rcancel := context.WithTimeout(pctx, time.Second)
		defer rcancel()
		_, err := p.HostGet(rctx, u)
		return err == nil
	})
	stop := context.AfterFunc(ctx, pr.Stop)
	p.t.Cleanup(func() { stop(); pr.Stop() })
	return &prober{pr}
}

// prober is the edge pod's probe.
type prober struct{ *workload.Prober }

// Outage waits (bounded) until the probe has answered for a second past the call, and returns the longest gap
// between two answers from the last one before since on: last answer before the outage -> first after it.
func (pr *prober) Outage(t *testing.T, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	gap, _, _, err := pr.Downtime(context.Background(), since, bound)
	if err != nil {
		t.Errorf("the edge pod: %v", err)
	}
	return gap
}

type PodsRig struct {
	*RepaveRig
	Reg *workload.Registry
}

// NewPodsRig bootstraps a host whose node runs the workload (Options.Pods): the workload image built and pushed
// to a registry on loopback, forwarded into the host and configured as a mirror, the sandbox image preloaded from
// an archive, a bridge pod network; and approves the kubelet's serving certificate. o adds to that.
func NewPodsRig(t *testing.T, ctx context.Context, base string, o Options) *PodsRig {
	t.Helper()
	if err := sdhost.V1ControllersAvailable(); err != nil {
		if Required {
			t.Fatalf("hosts with writable cgroup v1 controllers: %v", err)
		}
		t.Skipf("hosts with writable cgroup v1 controllers: %v", err)
	}
	app := workload.Build(t)
	reg := workload.NewRegistry(t)
	reg.Push(t, "workload", "v1", app.Image(t))
	pauseTar := filepath.Join(t.TempDir(), "pause.tar")
	workload.WriteArchive(t, pauseTar, map[string]v1.Image{PodsSandbox: app.PauseImage(t)})
	o.Pods = true
	o.Forward = append(o.Forward, reg.Host)
	if o.Mirror == nil {
		o.Mirror = map[string]string{}
	}
	o.Mirror["pause.tar"] = pauseTar
	extra := o.Extra
	o.Extra = func(r *Rig) string {
		s := fmt.Sprintf(`
[node]
sandbox_image = %q
preload_images = [{source = %q, sha256 = %q}]

[node.cni]
mode = "bridge"

[node.registry_mirrors]
%q = [%q]
`, PodsSandbox, r.Srv.URL("pause.tar"), r.Sums["pause.tar"], PodsRegistry, reg.MirrorURL())
		if extra != nil {
			s += extra(r)
		}
		return s
	}
	p := &PodsRig{RepaveRig: NewRepaveRigWith(t, ctx, base, o), Reg: reg}
	p.approveServing(ctx)
	return p
}

// approveServing approves the kubelet's serving certificate request with the CLI an operator runs, and waits
// until the kubelet serves with it.
func (p *PodsRig) approveServing(ctx context.Context) {
	t := p.t
	t.Helper()
	bins := NeedBins(t)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		cmd := exec.CommandContext(wctx, filepath.Join(bins, "kubeslot"), "cluster", "approve-serving",
			"--kubeconfig", p.CP.AdminKubeconfig(), "--node", p.Node, "--node-cidrs", sdhost.NodeIPPrefix.String())
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
		if _, err := p.KubeletAnonymous(wctx); err == nil {
			return
		}
		select {
		case <-wctx.Done():
			t.Fatalf("the kubelet does not serve TLS on %s:10250 after its certificate was approved", p.H.NodeIP())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Namespace creates the test's namespace and waits for its default ServiceAccount (pods need it).
func (p *PodsRig) Namespace(ctx context.Context) string {
	t := p.t
	t.Helper()
	// One per rig host: tests of one run share the pid, and a deleted namespace lingers while it terminates.
	ns := p.Node
	if _, err := p.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Admin.CoreV1().Namespaces().Delete(cctx, ns, metav1.DeleteOptions{})
	})
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		_, err := p.Admin.CoreV1().ServiceAccounts(ns).Get(wctx, "default", metav1.GetOptions{})
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

func (p *PodsRig) Deploy(ctx context.Context, ns string) {
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
					NodeName:                      p.Node,
					Tolerations:                   []corev1.Toleration{{Key: "kubeslot.dev/rig", Operator: corev1.TolerationOpExists}},
					AutomountServiceAccountToken:  &no,
					EnableServiceLinks:            &no,
					TerminationGracePeriodSeconds: func() *int64 { v := int64(2); return &v }(),
					Containers: []corev1.Container{{
						Name: "web", Image: PodsImage, ImagePullPolicy: corev1.PullIfNotPresent,
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
	if _, err := p.Admin.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		p.t.Fatal(err)
	}
}

// WaitPods waits until the Deployment's two pods are Running and Ready with containers started at or after since
// (whole seconds), and returns them.
func (p *PodsRig) WaitPods(ctx context.Context, ns string, since time.Time, bound time.Duration) []corev1.Pod {
	p.t.Helper()
	floor := since.Truncate(time.Second)
	return p.waitPodsStarted(ctx, ns, bound, "started after "+floor.Format(time.RFC3339), func(at time.Time) bool { return !at.Before(floor) })
}

// WaitPodsKept waits until the Deployment's two pods are Running and Ready with the containers they had before
// since (a restart that kept them running), and returns them.
func (p *PodsRig) WaitPodsKept(ctx context.Context, ns string, since time.Time, bound time.Duration) []corev1.Pod {
	p.t.Helper()
	return p.waitPodsStarted(ctx, ns, bound, "containers kept from before "+since.Format(time.RFC3339), func(at time.Time) bool { return at.Before(since) })
}

// waitPodsStarted waits until the Deployment's two pods are Running and Ready with every container's start time
// accepted by started (what says so), and returns them.
func (p *PodsRig) waitPodsStarted(ctx context.Context, ns string, bound time.Duration, what string, started func(time.Time) bool) []corev1.Pod {
	t := p.t
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	last := "no pods"
	for {
		list, err := p.Admin.CoreV1().Pods(ns).List(wctx, metav1.ListOptions{LabelSelector: "app=web"})
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
			ev, _ := p.Admin.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
			var evs []string
			for _, e := range ev.Items {
				evs = append(evs, e.InvolvedObject.Name+": "+e.Reason+": "+e.Message)
			}
			t.Fatalf("pods not Ready (%s) within %s; last: %s\nevents:\n%s\n%s", what, bound,
				last, strings.Join(evs, "\n"), HostDiag(p.H))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Exec runs a command in a pod's container through the apiserver (kubectl exec).
func (p *PodsRig) Exec(ctx context.Context, ns, pod string, cmd ...string) (string, error) {
	req := p.Admin.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "web", Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	e, err := remotecommand.NewSPDYExecutor(p.CP.AdminConfig(), http.MethodPost, req.URL())
	if err != nil {
		return "", err
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	err = e.StreamWithContext(ectx, remotecommand.StreamOptions{Stdout: &out, Stderr: &errb})
	return out.String() + errb.String(), err
}

// PortForward forwards a free loopback port to the pod's 8080 through the apiserver (kubectl port-forward) and
// GETs "/" through it.
func (p *PodsRig) PortForward(ctx context.Context, ns, pod string) (string, error) {
	cfg := p.CP.AdminConfig()
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", err
	}
	u := p.Admin.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
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
func (p *PodsRig) hostClient(tlsCfg *tls.Config) (*http.Client, error) {
	ns, err := p.H.NetNS()
	if err != nil {
		return nil, err
	}
	return workload.HostClient(ns, 10*time.Second, tlsCfg), nil
}

// HostGet GETs a URL from inside the host's network namespace.
func (p *PodsRig) HostGet(ctx context.Context, u string) (string, error) {
	c, err := p.hostClient(nil)
	if err != nil {
		return "", err
	}
	return workload.Get(ctx, c, u)
}

// KubeletAnonymous sends GET /pods to the kubelet's API on the node IP without credentials, from inside the host's
// network namespace, and returns the HTTP status (an error when TLS or the connection fail).
func (p *PodsRig) KubeletAnonymous(ctx context.Context) (int, error) {
	c, err := p.hostClient(&tls.Config{InsecureSkipVerify: true}) // the test asks whether it refuses, not who it is
	if err != nil {
		return 0, err
	}
	u := url.URL{Scheme: "https", Host: net.JoinHostPort(p.H.NodeIP().String(), "10250"), Path: "/pods"}
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
