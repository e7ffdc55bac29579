package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/lib/config"
)

// WaitReady polls the Node until it is Ready as posted by a kubelet
// that started at since or later (any Ready when since is zero), bounded by
// ctx.
//
// Node status times have whole seconds, so a status posted in the same
// second as since may be the new kubelet's or the old one's last. The
// Node's Lease (kube-node-lease/<node>) tells them apart: its renewTime has
// microseconds, and a kubelet renews it as soon as it starts. So a Ready
// condition counts when its heartbeat is in since's second or later and the
// Lease was renewed after since: the kubelet that runs now reached the
// apiserver, and the Ready status is not from before its second. (Requiring
// a heartbeat strictly after since's second, as before, missed the new
// kubelet's first status when it came within that second; the next one can
// be minutes away, nodeStatusReportFrequency.)
func (c *Client) WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error {
	node := cfg.Machine.NodeName
	last := "no node identity yet"
	t0 := time.Now()
	var cs *kubernetes.Clientset
	for {
		if cs == nil {
			rc, err := c.RESTConfig(cfg)
			if err == nil {
				cs, err = kubernetes.NewForConfig(rc)
			}
			if err != nil {
				last = err.Error()
			}
		}
		if cs != nil {
			n, err := cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
			var lease *coordinationv1.Lease
			if err == nil && !since.IsZero() {
				lease, err = cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					lease, err = nil, nil
				}
			}
			switch {
			case err == nil:
				ok, why := NodeReadySince(n, lease, since)
				if ok {
					return nil
				}
				last = why
				if msg, fatal := bridgeWithoutPodCIDR(cfg, n, why, time.Now()); msg != "" {
					if fatal {
						return errors.New(msg)
					}
					last = msg
				}
			case apierrors.IsNotFound(err):
				last = "Node " + node + " not registered yet"
			default:
				last = err.Error()
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %s", context.Cause(ctx), last)
		case <-time.After(readyPoll(time.Since(t0))):
		}
	}
}

// readyPoll is WaitReady's pause after waiting for elapsed: 100 ms at
// first (the wait is inside a node's downtime, and a healthy kubelet posts
// Ready within a second), then 500 ms (two GETs a poll for as long as
// timeouts.node_ready).
func readyPoll(elapsed time.Duration) time.Duration {
	if elapsed < 5*time.Second {
		return 100 * time.Millisecond
	}
	return 500 * time.Millisecond
}

// PodCIDRGrace is how long a Node in [node.cni] mode "bridge" may go
// without spec.podCIDR (the controller manager allocates it moments after
// the Node registers) before the wait for Ready gives up.
const PodCIDRGrace = time.Minute

// bridgeWithoutPodCIDR says, for a Node that is not Ready (why), whether
// the reason is bridge mode without a podCIDR: containerd then has no
// network to render, and the Node stays NotReady until a podCIDR comes. It
// returns the message naming the setting and what the cluster needs, and
// fatal once the Node has had no podCIDR for PodCIDRGrace since it was
// created ("" when this is not the reason).
func bridgeWithoutPodCIDR(cfg *config.Config, n *corev1.Node, why string, now time.Time) (msg string, fatal bool) {
	if cfg.Node.CNI.CNIMode() != config.CNIBridge || n.Spec.PodCIDR != "" {
		return "", false
	}
	age := now.Sub(n.CreationTimestamp.Time)
	msg = fmt.Sprintf("node.cni.mode = %q needs the Node's spec.podCIDR, and Node %s has none %s after it registered: run the controller manager with --allocate-node-cidrs and --cluster-cidr, or use mode %q with a CNI DaemonSet (%s)",
		config.CNIBridge, n.Name, age.Round(time.Second), config.CNICluster, why)
	return msg, age >= PodCIDRGrace
}

// NodeReadySince decides WaitReady for one reading of the Node and
// its Lease (nil: none): whether n is Ready as posted by a kubelet started
// at since or later, and if not, why, for the error message.
func NodeReadySince(n *corev1.Node, lease *coordinationv1.Lease, since time.Time) (bool, string) {
	var ready *corev1.NodeCondition
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			ready = &n.Status.Conditions[i]
		}
	}
	if ready == nil {
		return false, "Node " + n.Name + " has no Ready condition yet"
	}
	if ready.Status != corev1.ConditionTrue {
		return false, fmt.Sprintf("Node %s Ready=%s: %s", n.Name, ready.Status, ready.Message)
	}
	if since.IsZero() {
		return true, ""
	}
	floor := since.Truncate(time.Second)
	if hb := ready.LastHeartbeatTime.Time; hb.Before(floor) {
		return false, fmt.Sprintf("Node %s Ready, but last posted at %s, before the kubelet started (%s)", n.Name,
			hb.UTC().Format(time.RFC3339), since.UTC().Format(time.RFC3339Nano))
	}
	if lease == nil || lease.Spec.RenewTime == nil {
		return false, "Node " + n.Name + " Ready, but its Lease was not renewed yet"
	}
	if renew := lease.Spec.RenewTime.Time; !renew.After(since) {
		return false, fmt.Sprintf("Node %s Ready, but its Lease was last renewed at %s, before the kubelet started (%s)", n.Name,
			renew.UTC().Format(time.RFC3339Nano), since.UTC().Format(time.RFC3339Nano))
	}
	return true, ""
}
