package nodeclient

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/config"
)

// TestBridgeWithoutPodCIDR: bridge mode and a Node without spec.podCIDR is named as the reason it is not Ready, and
// ends the wait once the Node has gone PodCIDRGrace without one; other modes, or a podCIDR, are not this reason.
func TestBridgeWithoutPodCIDR(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	node := func(age time.Duration, cidr string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", CreationTimestamp: metav1.NewTime(now.Add(-age))},
			Spec: corev1.NodeSpec{PodCIDR: cidr}}
	}
	bridge := &config.Config{}
	bridge.Node.CNI.Mode = config.CNIBridge
	cluster := &config.Config{} // the default mode, cluster
	for _, tc := range []struct {
		name  string
		cfg   *config.Config
		n     *corev1.Node
		msg   bool
		fatal bool
	}{
		{"bridge, just registered", bridge, node(5*time.Second, ""), true, false},
		{"bridge, none for the grace", bridge, node(PodCIDRGrace, ""), true, true},
		{"bridge with a podCIDR", bridge, node(time.Hour, "10.244.1.0/24"), false, false},
		{"cluster mode", cluster, node(time.Hour, ""), false, false},
	} {
		msg, fatal := bridgeWithoutPodCIDR(tc.cfg, tc.n, "Ready=False: network not ready", now)
		if (msg != "") != tc.msg || fatal != tc.fatal {
			t.Errorf("%s: %q fatal %v, want message %v fatal %v", tc.name, msg, fatal, tc.msg, tc.fatal)
		}
		if msg != "" && (!strings.Contains(msg, `node.cni.mode = "bridge"`) || !strings.Contains(msg, "spec.podCIDR") ||
			!strings.Contains(msg, "--allocate-node-cidrs") || !strings.Contains(msg, "network not ready")) {
			t.Errorf("%s: the message does not name the setting, the field and the fix: %s", tc.name, msg)
		}
	}
}
