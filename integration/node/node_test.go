package node

// The rig's proof: a real kubelet 1.37 in a systemd-nspawn node machine, inside an isolated systemd host, joins the
// package's control plane by TLS bootstrap (bootstrap token -> CSR -> kube-controller-manager approves and signs)
// and its Node goes Ready. The node's rootfs and the kubelet come from the rig's mirror over HTTP with SHA-256
// checks, as the agent will fetch them.
//
// KUBESLOT_NODE_CGROUP_MODES (default "unified") lists the host cgroup layouts to run it in, e.g. "unified hybrid"
// (hybrid needs a machine with the v1 hybrid layout).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certsv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/nodeimage"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/integration/sdhost"
)

func TestNodeKubeletJoinsByTLSBootstrap(t *testing.T) {
	modes := strings.Fields(os.Getenv("KUBESLOT_NODE_CGROUP_MODES"))
	if len(modes) == 0 {
		modes = []string{"unified"}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) { runKubeletNode(t, ctx, mode) })
	}
}

func runKubeletNode(t *testing.T, ctx context.Context, mode string) {
	figure := func(what string, d time.Duration) {
		t.Logf("timing: %s %.2fs", what, d.Seconds())
		rig.Figures.Add(fmt.Sprintf("node (%s): %s", mode, what), d)
	}

	// 1. The isolated host, in the machine's network namespace so the node reaches the apiserver on 127.0.0.1,
	// with the mirror serving the node rootfs and the kubelet, a fresh bootstrap token and two free ports.
	r := rig.NewWith(t, ctx, "kn-"+mode[:1], rig.Options{Bare: true, CgroupMode: mode, Figure: figure})
	cp, srv, h, node, admin, token, ports := r.CP, r.Srv, r.H, r.Node, r.Admin, r.Token, r.Ports

	// 2. The node's rootfs and kubelet, fetched from the mirror like the agent does.
	t1 := time.Now()
	dl := filepath.Join(t.TempDir(), "node-rootfs.tar.gz")
	if _, err := nodeimage.Download(ctx, nil, srv.URL("node-rootfs.tar.gz"), dl, 0o644); err != nil {
		t.Fatal(err)
	}
	figure("fetch rootfs tarball", time.Since(t1))
	t1 = time.Now()
	rootfs := filepath.Join(h.Root(), "var/lib/machines", node)
	st, err := nodeimage.Unpack(ctx, dl, rootfs)
	if err != nil {
		t.Fatal(err)
	}
	figure(fmt.Sprintf("unpack rootfs (%d files, %d MB)", st.Files, st.Bytes>>20), time.Since(t1))
	t1 = time.Now()
	if _, err := nodeimage.Download(ctx, nil, srv.URL("kubelet"), filepath.Join(rootfs, nodeimage.KubeletBinary), 0o755); err != nil {
		t.Fatal(err)
	}
	figure("fetch kubelet", time.Since(t1))

	// 3. Credentials and settings: the rig's bootstrap token, nothing else; the kubelet gets its client
	// certificate through a CSR.
	err = nodeimage.WriteFiles(rootfs, nodeimage.Node{Name: node, CAPEM: cp.CAPEM(),
		BootstrapKubeconfig: cp.Kubeconfig("kubelet-bootstrap", token), KubeletPort: ports[0], HealthzPort: ports[1]})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.WriteFile("/etc/systemd/nspawn/"+node+".nspawn", nodeimage.Nspawn(), 0o644); err != nil {
		t.Fatal(err)
	}

	// 4. Boot the node machine; machinectl returns before the node's systemd is up.
	t2 := time.Now()
	if _, err := h.Run(ctx, "machinectl", "start", node); err != nil {
		t.Fatalf("machinectl start: %v\n%s", err, nspawnJournal(h, node))
	}
	defer func() {
		t3 := time.Now()
		if err := powerOffNode(h, node); err != nil {
			t.Errorf("node poweroff: %v", err)
		}
		figure("node poweroff", time.Since(t3))
	}()
	state := waitNodeSystem(t, ctx, h, node, 90*time.Second)
	figure("node boot to "+state, time.Since(t2))
	if state != "running" {
		failed, _ := h.Run(ctx, "systemctl", "-M", node, "list-units", "--failed", "--no-legend", "--plain")
		t.Errorf("node %s is %q, want running; failed units:\n%s", node, state, failed)
	}

	// 5. containerd + kubelet as units of the node; wait for the Node to register and go Ready.
	if out, err := h.Run(ctx, "systemctl", "-M", node, "start", nodeimage.KubeletUnit); err != nil {
		t.Fatalf("start kubelet: %v\n%s\n%s", err, out, nodeJournal(h, node))
	}
	defer func() {
		_ = admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	}()
	registered, ready := waitNodeReady(t, ctx, h, admin, node, 90*time.Second)
	if registered > 0 {
		figure("kubelet start to Node registered", registered)
	}
	if ready == 0 {
		t.Fatalf("Node %s not Ready after 90s\n%s\nkube-controller-manager:\n%s\nCSRs: %s",
			node, nodeJournal(h, node), cp.ComponentLog("kube-controller-manager", 20), csrSummary(ctx, admin))
	}
	figure("kubelet start to Node Ready", ready)

	// 6. Proof that it was TLS bootstrap: an approved, issued kubelet client CSR from the bootstrap identity for
	// this node, and the kubelet's own kubeconfig written from it.
	checkBootstrapCSR(t, ctx, admin, node, "system:bootstrap:"+token[:6])
	if _, err := os.Stat(filepath.Join(rootfs, nodeimage.KubeletKubeconfig)); err != nil {
		t.Errorf("kubelet wrote no kubeconfig after bootstrap: %v", err)
	}
	n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Node %s: kubelet %s, runtime %s, OS %s, kernel %s", node, n.Status.NodeInfo.KubeletVersion,
		n.Status.NodeInfo.ContainerRuntimeVersion, n.Status.NodeInfo.OSImage, n.Status.NodeInfo.KernelVersion)
	if n.Status.NodeInfo.KubeletVersion != "v1.37.2" {
		t.Errorf("kubelet version %q, want v1.37.2", n.Status.NodeInfo.KubeletVersion)
	}
}

// waitNodeSystem polls the node's `systemctl is-system-running` until it settles (running, degraded, ...) or
// bound passes, and returns the last state.
func waitNodeSystem(t *testing.T, ctx context.Context, h *sdhost.Host, node string, bound time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(bound)
	state := ""
	for time.Now().Before(deadline) && ctx.Err() == nil {
		out, _ := h.Run(ctx, "systemctl", "-M", node, "is-system-running")
		state = strings.TrimSpace(string(out))
		if i := strings.LastIndex(state, "\n"); i >= 0 {
			state = state[i+1:]
		}
		switch state {
		case "running", "degraded", "maintenance", "stopping":
			return state
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("node %s not up after %v (last state %q)\n%s", node, bound, state, nspawnJournal(h, node))
	return ""
}

// waitNodeReady polls the Node until Ready, bounded; it returns the time to registration and to Ready (0: not
// reached). It stops early when the kubelet unit has failed.
func waitNodeReady(t *testing.T, ctx context.Context, h *sdhost.Host, cs *kubernetes.Clientset, node string, bound time.Duration) (registered, ready time.Duration) {
	t.Helper()
	t0 := time.Now()
	for time.Since(t0) < bound && ctx.Err() == nil {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		switch {
		case err == nil:
			if registered == 0 {
				registered = time.Since(t0)
			}
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return registered, time.Since(t0)
				}
			}
		case !apierrors.IsNotFound(err):
			t.Logf("get Node %s: %v", node, err)
		}
		if out, _ := h.Run(ctx, "systemctl", "-M", node, "is-failed", nodeimage.KubeletUnit); strings.TrimSpace(string(out)) == "failed" {
			t.Logf("kubelet unit failed")
			return registered, 0
		}
		time.Sleep(200 * time.Millisecond)
	}
	return registered, 0
}

func checkBootstrapCSR(t *testing.T, ctx context.Context, cs *kubernetes.Clientset, node, requester string) {
	t.Helper()
	csrs, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range csrs.Items {
		if c.Spec.Username != requester || c.Spec.SignerName != certsv1.KubeAPIServerClientKubeletSignerName {
			continue
		}
		approved := false
		for _, cond := range c.Status.Conditions {
			approved = approved || (cond.Type == certsv1.CertificateApproved && cond.Status == corev1.ConditionTrue)
		}
		if !approved || len(c.Status.Certificate) == 0 {
			t.Errorf("CSR %s of %s: approved=%v, certificate %d bytes", c.Name, requester, approved, len(c.Status.Certificate))
		}
		return
	}
	t.Errorf("no kubelet client CSR from %s for node %s; CSRs: %s", requester, node, csrSummary(ctx, cs))
}

func csrSummary(ctx context.Context, cs *kubernetes.Clientset) string {
	csrs, err := cs.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, c := range csrs.Items {
		var conds []string
		for _, cond := range c.Status.Conditions {
			conds = append(conds, string(cond.Type))
		}
		fmt.Fprintf(&b, "\n  %s user=%s signer=%s conditions=%v issued=%v", c.Name, c.Spec.Username, c.Spec.SignerName,
			conds, len(c.Status.Certificate) > 0)
	}
	return b.String()
}

// powerOffNode shuts the node machine down and waits until machined has forgotten it.
func powerOffNode(h *sdhost.Host, node string) error {
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
	if _, err := h.Run(context.Background(), "machinectl", "terminate", node); err != nil {
		return fmt.Errorf("still running after 45s, and terminate failed: %w", err)
	}
	return fmt.Errorf("still running after 45s; terminated")
}

// nodeJournal is the tail of the node's kubelet and containerd logs, for failure messages.
func nodeJournal(h *sdhost.Host, node string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := h.Run(ctx, "journalctl", "-M", node, "-u", nodeimage.KubeletUnit, "-u", nodeimage.ContainerdUnit,
		"--no-pager", "-q", "-n", "60")
	if err != nil {
		return fmt.Sprintf("(node journal: %v)", err)
	}
	return string(out)
}

// nspawnJournal is the host's log of the node's nspawn unit.
func nspawnJournal(h *sdhost.Host, node string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := h.Journal(ctx, "systemd-nspawn@"+node+".service")
	if err != nil {
		return fmt.Sprintf("(nspawn journal: %v)", err)
	}
	return out
}
