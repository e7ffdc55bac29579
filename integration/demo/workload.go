package main

// The demo's workload, as TestPodsOnRig runs it: a tiny Go HTTP server built from source (integration/workload),
// served by a counting registry on the machine's loopback that the node's containerd reaches through the mirror
// [node.registry_mirrors] names, and a Deployment of it on the node with a readiness probe and a hostPort. A client
// outside the node (in the host's network namespace) GETs the hostPort every 100 ms from the moment the pod first
// answers; the workload's downtime across the repave and the restart is the longest gap between two answers: the
// last one before the outage to the first one after it.
//
// The host needs its own network namespace and writable cgroup v1 controllers for that (sdhost.NodeNetwork,
// V1Controllers, as bsOptions.Pods gives TestPodsOnRig); where the machine cannot give them, the pod steps are
// skipped and the demo runs its node without pods, as before.

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubeslot/kubeslot/integration/netfwd"
	"github.com/kubeslot/kubeslot/integration/sdhost"
	"github.com/kubeslot/kubeslot/integration/workload"
)

const (
	demoRegistry  = "registry.kubeslot.test" // a name only: the node reaches it through its mirror
	demoImage     = demoRegistry + "/workload:v1"
	demoSandbox   = demoRegistry + "/workload:pause"
	demoNamespace = "kubeslot-demo"
	demoApp       = "web"
	demoHostPort  = 18080
)

// buildWorkload builds the workload from Go source and serves it, and the sandbox image made of the same layer,
// from a registry on the machine's loopback.
func (d *demo) buildWorkload(ctx context.Context) (string, error) {
	if err := podsUnavailable(); err != "" {
		d.podsSkip = err
		return "", skip("%s", err)
	}
	dir, err := workload.CacheDir()
	if err != nil {
		dir = filepath.Join(d.work, "workload")
	}
	app, err := workload.BuildIn(dir, runtime.GOARCH, func(format string, args ...any) { d.say(format, args...) })
	if err != nil {
		return "", err
	}
	serve, pause, err := app.Images()
	if err != nil {
		return "", err
	}
	d.reg = workload.StartRegistry()
	if _, _, err := d.reg.PushImage("workload", "v1", serve); err != nil {
		return "", fmt.Errorf("push the workload image: %w", err)
	}
	if _, _, err := d.reg.PushImage("workload", "pause", pause); err != nil {
		return "", fmt.Errorf("push the sandbox image: %w", err)
	}
	d.pods = true
	return fmt.Sprintf("%s and %s served by the registry at %s (the node pulls through its mirror)", demoImage, demoSandbox, d.reg.Host), nil
}

// podsUnavailable says why this machine cannot give the demo's host what pods need ("" when it can).
func podsUnavailable() string {
	if err := sdhost.V1ControllersAvailable(); err != nil {
		return "no pods on this machine: hosts with writable cgroup v1 controllers: " + err.Error()
	}
	return ""
}

// connectHost forwards the control plane, the mirror and the registry into the host's network namespace (the same
// loopback addresses there) and routes the apiserver's traffic for the node (logs, exec, port-forward) into it.
func (d *demo) connectHost() error {
	ns, err := d.host.NetNS()
	if err != nil {
		return err
	}
	addrs := []string{strings.TrimPrefix(d.cp.URL(), "https://"), d.mirror.Addr(), d.mirror.TLSAddr(), d.reg.Host}
	for _, a := range addrs {
		f, err := netfwd.Forward(ns, a, "", a)
		if err != nil {
			return fmt.Errorf("forward %s into the host: %w", a, err)
		}
		d.forwards = append(d.forwards, f)
	}
	remove, err := d.cp.RouteEgress(d.host.NodeIP(), d.host.NetNS, d.node)
	if err != nil {
		return err
	}
	d.unroute = remove
	return nil
}

// disconnectHost undoes connectHost.
func (d *demo) disconnectHost() error {
	var errs []string
	for _, f := range d.forwards {
		if err := f.Close(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	d.forwards = nil
	if d.unroute != nil {
		d.unroute()
		d.unroute = nil
	}
	if d.reg != nil {
		d.reg.Close()
		d.reg = nil
	}
	if len(errs) > 0 {
		return fmt.Errorf("forwarders: %s", strings.Join(errs, "; "))
	}
	return nil
}

// nodeTOML is the [node] section of a host that runs pods: the sandbox image from the registry's name, a bridge
// pod network over the Node's podCIDR, and the mirror of that registry name.
func (d *demo) nodeTOML() string {
	if !d.pods {
		return ""
	}
	return fmt.Sprintf(`
[node]
sandbox_image = %q

[node.cni]
mode = "bridge"

[node.registry_mirrors]
%q = [%q]
`, demoSandbox, demoRegistry, d.reg.MirrorURL())
}

// runWorkload approves the kubelet's serving certificate as an operator would (kubeslot cluster approve-serving),
// runs the Deployment on the node, waits until its pod is Ready and answers on its hostPort, and starts the probe.
func (d *demo) runWorkload(ctx context.Context) (string, error) {
	if !d.pods {
		return "", skip("%s", d.podsSkip)
	}
	approved, err := d.approveServing(ctx)
	if err != nil {
		return "", err
	}
	d.say("$ kubeslot cluster approve-serving --node %s --node-cidrs %s\n%s", d.node, sdhost.NodeIPPrefix, indent(approved, "    "))
	if err := d.createNamespace(ctx); err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := d.deploy(ctx); err != nil {
		return "", err
	}
	pod, err := d.waitPod(ctx, time.Time{}, 4*time.Minute)
	if err != nil {
		return "", err
	}
	ready := time.Since(t0)
	u := d.edgeURL()
	err = d.waitFor(ctx, time.Minute, "the pod answers on its hostPort "+u, func(ctx context.Context) (bool, string, error) {
		body, err := d.hostGet(ctx, u)
		if err != nil {
			return false, err.Error(), nil
		}
		return strings.Contains(body, workload.Greeting), strings.TrimSpace(body), nil
	})
	if err != nil {
		return "", err
	}
	d.probe = d.startProbe()
	// kubectl logs, through the apiserver and the kubelet's secured API
	var logs []byte
	_ = d.waitFor(ctx, time.Minute, "kubectl logs answers", func(ctx context.Context) (bool, string, error) {
		var err error
		logs, err = d.admin.CoreV1().Pods(demoNamespace).GetLogs(pod.Name, &corev1.PodLogOptions{TailLines: ptr(int64(2))}).DoRaw(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
	if len(logs) > 0 {
		d.say("$ kubectl logs -n %s %s --tail 2\n%s", demoNamespace, pod.Name, indent(strings.TrimSpace(string(logs)), "    "))
	}
	return fmt.Sprintf("pod %s Ready %s after the Deployment was created (image pulled through the mirror: %d blob GETs), IP %s, answering on %s; probing it every 100 ms from the host",
		pod.Name, secs(ready), d.reg.BlobGETs("workload"), pod.Status.PodIP, u), nil
}

// workloadBack waits until the pod runs and answers after the repave or restart that began at since, and returns
// the workload's downtime line: the longest gap between two answers of the probe since since. A repave moves the
// pod to a new node, so its containers must have started after since; a restart in place keeps the machine, and
// with it, normally, the containers (keep): then the pod must stay (or come back) Ready, with the containers it had
// or new ones, and the line says which.
func (d *demo) workloadBack(ctx context.Context, since time.Time, what string, keep bool) (string, error) {
	if !d.pods || d.probe == nil {
		return "", skip("%s", firstNonEmpty(d.podsSkip, "no workload is running"))
	}
	blobs := d.reg.BlobGETs("workload")
	after := since
	if keep {
		after = time.Time{}
	}
	pod, err := d.waitPod(ctx, after, 4*time.Minute)
	if err != nil {
		return "", err
	}
	gap, last, first, err := d.probe.Downtime(ctx, since, 2*time.Minute)
	if err != nil {
		return "", err
	}
	pulled := "image not pulled again"
	if n := d.reg.BlobGETs("workload"); n != blobs {
		pulled = fmt.Sprintf("image pulled again (%d more blob GETs)", n-blobs)
	}
	state := "Ready again"
	if keep {
		state = "stayed Ready, its container kept running"
		if containersStartedSince(pod, since) {
			state = "Ready again, its container started anew"
		}
	}
	return fmt.Sprintf("workload downtime across the %s %s (last answer %s -> first answer %s, from the host), pod %s %s, IP %s, %s",
		what, secs(gap), last.Format("15:04:05.0"), first.Format("15:04:05.0"), pod.Name, state, pod.Status.PodIP, pulled), nil
}

// containersStartedSince reports whether any of the pod's running containers started at or after since (whole
// seconds: the API keeps start times to the second).
func containersStartedSince(p *corev1.Pod, since time.Time) bool {
	floor := since.Truncate(time.Second)
	for _, cs := range p.Status.ContainerStatuses {
		if r := cs.State.Running; r != nil && !r.StartedAt.Time.Before(floor) {
			return true
		}
	}
	return false
}

// approveServing runs the CLI until it approved the node's serving certificate request, then waits until the
// kubelet serves TLS with it; it returns what the CLI printed.
func (d *demo) approveServing(ctx context.Context) (string, error) {
	var out string
	err := d.waitFor(ctx, 2*time.Minute, "kubeslot cluster approve-serving approves the node's serving certificate", func(ctx context.Context) (bool, string, error) {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(cctx, filepath.Join(d.flags.bins, "kubeslot"), "cluster", "approve-serving",
			"--kubeconfig", d.cp.AdminKubeconfig(), "--node", d.node, "--node-cidrs", sdhost.NodeIPPrefix.String())
		var stderr strings.Builder
		cmd.Stderr = &stderr // its log; what it approved goes to stdout
		b, err := cmd.Output()
		out = strings.TrimSpace(string(b))
		return err == nil && strings.Contains(out, "approved "), fmt.Sprintf("%v: %s %s", err, firstLine(out), firstLine(stderr.String())), nil
	})
	return out, err
}

func (d *demo) createNamespace(ctx context.Context) error {
	_, err := d.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	d.ns = demoNamespace
	// pods need the namespace's default ServiceAccount, made by the controller manager
	return d.waitFor(ctx, time.Minute, "ServiceAccount default in namespace "+demoNamespace, func(ctx context.Context) (bool, string, error) {
		_, err := d.admin.CoreV1().ServiceAccounts(demoNamespace).Get(ctx, "default", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		return true, "", nil
	})
}

// deploy creates the Deployment: one pod bound to the node (the demo runs no scheduler), a readiness probe, and a
// hostPort the probe reaches from the host.
func (d *demo) deploy(ctx context.Context) error {
	labels := map[string]string{"app": demoApp}
	no := false
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: demoApp, Namespace: demoNamespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeName:                      d.node,
					AutomountServiceAccountToken:  &no,
					EnableServiceLinks:            &no,
					TerminationGracePeriodSeconds: ptr(int64(2)),
					Containers: []corev1.Container{{
						Name: demoApp, Image: demoImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Ports: []corev1.ContainerPort{{ContainerPort: workload.Port, HostPort: demoHostPort}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(workload.Port)}},
							PeriodSeconds: 1,
						},
					}},
				},
			},
		},
	}
	if _, err := d.admin.AppsV1().Deployments(demoNamespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Deployment %s/%s: %w", demoNamespace, demoApp, err)
	}
	d.say("created Deployment %s/%s: image %s, readiness probe GET /healthz, hostPort %d", demoNamespace, demoApp, demoImage, demoHostPort)
	return nil
}

// waitPod waits until the Deployment's pod is Running and Ready with its container started at or after since
// (whole seconds; any when zero).
func (d *demo) waitPod(ctx context.Context, since time.Time, bound time.Duration) (*corev1.Pod, error) {
	floor := since.Truncate(time.Second)
	var ready *corev1.Pod
	err := d.waitFor(ctx, bound, "the workload's pod Running and Ready", func(ctx context.Context) (bool, string, error) {
		list, err := d.admin.CoreV1().Pods(demoNamespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + demoApp})
		if err != nil {
			return false, err.Error(), nil
		}
		var states []string
		for i := range list.Items {
			p := &list.Items[i]
			ok := p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
					ok = false
				}
			}
			if len(p.Status.ContainerStatuses) == 0 {
				ok = false
			}
			state := fmt.Sprintf("%s %s", p.Name, p.Status.Phase)
			for _, cs := range p.Status.ContainerStatuses {
				if !cs.Ready || cs.State.Running == nil || cs.State.Running.StartedAt.Time.Before(floor) {
					ok = false
				}
				if w := cs.State.Waiting; w != nil {
					state += " (" + w.Reason + ": " + w.Message + ")"
				}
			}
			if ok {
				ready = p
				return true, "", nil
			}
			states = append(states, state)
		}
		if len(states) == 0 {
			return false, "no pod yet", nil
		}
		return false, strings.Join(states, "; "), nil
	})
	return ready, err
}

// edgeURL is the workload's hostPort on the node IP.
func (d *demo) edgeURL() string {
	return "http://" + net.JoinHostPort(d.host.NodeIP().String(), fmt.Sprint(demoHostPort)) + "/"
}

// hostGet GETs a URL from inside the host's network namespace (outside the node machine), 1 s bound per try.
func (d *demo) hostGet(ctx context.Context, u string) (string, error) {
	ns, err := d.host.NetNS()
	if err != nil {
		return "", err
	}
	return workload.Get(ctx, workload.HostClient(ns, time.Second, nil), u)
}

// startProbe GETs the workload's hostPort every 100 ms from the host; an answer is one with its greeting.
func (d *demo) startProbe() *workload.Prober {
	u := d.edgeURL()
	return workload.StartProbe(func(ctx context.Context) bool {
		body, err := d.hostGet(ctx, u)
		return err == nil && strings.Contains(body, workload.Greeting)
	})
}

func ptr[T any](v T) *T { return &v }

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}
