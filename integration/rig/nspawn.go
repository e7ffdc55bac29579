package rig

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/integration/sdhost"
)

const (
	// NspawnDriverArg as os.Args[1] makes a test binary the backend driver (integration/node's init).
	NspawnDriverArg = "kubeslot-nspawn-driver"
	// NspawnDriverPath is where the test binary is bound inside the host.
	NspawnDriverPath = "/usr/local/libexec/kubeslot-nspawn-driver"
	NspawnConfigPath = "/etc/kubeslot/nspawn-rig.toml"
)

// NspawnRigConfig is the TOML configuration the nspawn backend's rig tests drive the backend with.
func NspawnRigConfig(node, server, caPEM, token, rootfsURL, rootfsSum, kubeletURL, kubeletSum string) string {
	return fmt.Sprintf(`[machine]
name = %q

[cluster]
server = %q
ca_pem = %q
bootstrap_token = %q

[kubernetes]
version = "1.37.2"
cluster_dns = ["10.96.0.10"]
cluster_domain = "rig.local"
taints = ["kubeslot.dev/rig=nspawn:NoSchedule"]

[kubernetes.labels]
"kubeslot.dev/rig" = "nspawn"
"node.kubernetes.io/pool" = "rig"

[rootfs]
source = %q
sha256 = %q

[artifacts.kubelet]
url = %q
sha256 = %q

[timeouts]
node_ready = "3m"
stop = "30s"
`, node, server, caPEM, token, rootfsURL, rootfsSum, kubeletURL, kubeletSum)
}

// CheckNodeSettings: the configured labels, taint and identity reached the Node.
func CheckNodeSettings(t *testing.T, n *corev1.Node) {
	t.Helper()
	for k, v := range map[string]string{"kubeslot.dev/rig": "nspawn", "node.kubernetes.io/pool": "rig"} {
		if got, ok := n.Labels[k]; !ok || got != v {
			t.Errorf("Node label %s = %q (present %v), want %q", k, got, ok, v)
		}
	}
	found := false
	for _, tn := range n.Spec.Taints {
		found = found || (tn.Key == "kubeslot.dev/rig" && tn.Value == "nspawn" && tn.Effect == corev1.TaintEffectNoSchedule)
	}
	if !found {
		t.Errorf("Node taints %v lack kubeslot.dev/rig=nspawn:NoSchedule", n.Spec.Taints)
	}
	if n.Status.NodeInfo.KubeletVersion != "v1.37.2" {
		t.Errorf("kubelet version %q, want v1.37.2", n.Status.NodeInfo.KubeletVersion)
	}
}

// WaitNodeHeartbeat waits until the Node is Ready with a heartbeat after since (any heartbeat when since is zero).
// The apiserver keeps heartbeats to the second: one in since's own second counts, or a restart done within that
// second would wait for the kubelet's next report (5 min when nothing changes).
func WaitNodeHeartbeat(t *testing.T, ctx context.Context, cs *kubernetes.Clientset, node string, since time.Time, bound time.Duration, h *sdhost.Host) *corev1.Node {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	last := "not registered"
	for {
		n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		switch {
		case err == nil:
			for _, c := range n.Status.Conditions {
				if c.Type != corev1.NodeReady {
					continue
				}
				last = fmt.Sprintf("Ready=%s heartbeat %s", c.Status, c.LastHeartbeatTime.Format(time.RFC3339))
				if c.Status == corev1.ConditionTrue && !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second)) {
					return n
				}
			}
		case !apierrors.IsNotFound(err):
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Node %s not Ready with a heartbeat after %s within %s (last: %s)\n%s", node, since.Format(time.RFC3339), bound, last, HostDiag(h))
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// HostDiag is the host's nspawn unit logs and the nodes' kubelet logs, for failure messages.
func HostDiag(h *sdhost.Host) string {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var b strings.Builder
	for _, slot := range []string{"a", "b"} {
		if out, err := h.Journal(ctx, "systemd-nspawn@"+slot+".service"); err == nil && strings.TrimSpace(out) != "" {
			b.WriteString("systemd-nspawn@" + slot + ".service:\n" + TailLines(out, 30))
		}
		if out, err := h.Run(ctx, "journalctl", "-M", slot, "-u", "kubelet.service", "-u", "containerd.service", "--no-pager", "-q", "-n", "30"); err == nil {
			b.WriteString("\nnode " + slot + " kubelet/containerd:\n" + string(out))
		}
	}
	return b.String()
}

func TailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + "\n"
}
