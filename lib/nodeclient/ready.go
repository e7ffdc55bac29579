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
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/lib/config"
)

// WaitReady waits until the Node is Ready as posted by a kubelet that
// started at since or later (any Ready when since is zero), bounded by ctx.
// It reads the Node and its Lease, then watches the Node from what it
// read, so a new status is seen as it is posted (the wait is inside a
// node's downtime); a watch that ends or is refused falls back to reading
// again after readyPoll.
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
// be minutes away, nodeStatusReportFrequency.) A node may not watch its
// Lease (the Node authorizer), so the Lease is read again while the Node
// alone would do.
func (c *Client) WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error {
	t0 := time.Now()
	for {
		rc, err := c.RESTConfig(cfg)
		var cs *kubernetes.Clientset
		if err == nil {
			cs, err = kubernetes.NewForConfig(rc)
		}
		if err == nil {
			return waitReady(ctx, cs, cfg, since, t0)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: no node identity yet: %v", context.Cause(ctx), err)
		case <-time.After(readyPoll(time.Since(t0))):
		}
	}
}

// waitReady is WaitReady with a client, since t0.
func waitReady(ctx context.Context, cs kubernetes.Interface, cfg *config.Config, since, t0 time.Time) error {
	for {
		w := readyWait{cs: cs, cfg: cfg, node: cfg.Machine.NodeName, since: since}
		var last string
		if err := w.read(ctx); err != nil {
			last = err.Error()
		} else {
			ok, why, fatal := w.verdict()
			switch {
			case ok:
				return nil
			case fatal:
				return errors.New(why)
			}
			if ok, last = w.watch(ctx, why); ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w; last: %s", context.Cause(ctx), last)
		case <-time.After(readyPoll(time.Since(t0))):
		}
	}
}

// readyWait is one reading of WaitReady and the watch after it.
type readyWait struct {
	cs    kubernetes.Interface
	cfg   *config.Config
	node  string
	since time.Time
	n     *corev1.Node
	lease *coordinationv1.Lease
}

// read gets the Node and, with a since, its Lease.
func (w *readyWait) read(ctx context.Context) error {
	n, err := w.cs.CoreV1().Nodes().Get(ctx, w.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return errors.New("Node " + w.node + " not registered yet")
	}
	if err != nil {
		return err
	}
	w.n = n
	return w.readLease(ctx)
}

func (w *readyWait) readLease(ctx context.Context) error {
	if w.since.IsZero() {
		return nil
	}
	lease, err := w.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, w.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		lease, err = nil, nil
	}
	if err != nil {
		return err
	}
	w.lease = lease
	return nil
}

// verdict decides on the Node and Lease read last: Ready as asked, or why
// not; fatal once a bridge-mode Node has gone without a podCIDR for
// PodCIDRGrace.
func (w *readyWait) verdict() (ok bool, why string, fatal bool) {
	if ok, why = NodeReadySince(w.n, w.lease, w.since); ok {
		return true, "", false
	}
	if msg, fatal := bridgeWithoutPodCIDR(w.cfg, w.n, why, time.Now()); msg != "" {
		return false, msg, fatal
	}
	return false, why, false
}

// watchBound ends one watch; WaitReady reads again and watches anew.
const watchBound = time.Minute

// leaseRecheck is how often the Lease is read again while the Node's
// status counts but the Lease does not yet (it cannot be watched).
const leaseRecheck = 20 * time.Millisecond

// watch follows the Node from the version read until it is Ready as
// asked, the watch ends, or ctx is done; it returns the last why.
func (w *readyWait) watch(ctx context.Context, why string) (bool, string) {
	wctx, cancel := context.WithTimeout(ctx, watchBound)
	defer cancel()
	nw, err := w.cs.CoreV1().Nodes().Watch(wctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", w.node).String(), ResourceVersion: w.n.ResourceVersion})
	if err != nil {
		return false, why + " (watch: " + err.Error() + ")"
	}
	defer nw.Stop()
	var recheck <-chan time.Time
	for {
		select {
		case ev, open := <-nw.ResultChan():
			if !open {
				return false, why
			}
			n, isNode := ev.Object.(*corev1.Node)
			if !isNode || ev.Type == watch.Error || ev.Type == watch.Deleted {
				return false, why
			}
			w.n = n
		case <-recheck:
			if err := w.readLease(wctx); err != nil {
				return false, why + " (lease: " + err.Error() + ")"
			}
		case <-wctx.Done():
			return false, why
		}
		ok, v, fatal := w.verdict()
		switch {
		case ok:
			return true, ""
		case fatal:
			return false, v // read again, and give up there
		}
		why, recheck = v, nil
		// Only the Lease keeps the wait going: read it again soon.
		if ok, _ := statusSince(w.n, w.since); ok && !w.since.IsZero() {
			recheck = time.After(leaseRecheck)
		}
	}
}

// readyPoll is WaitReady's pause after waiting for elapsed, when a watch
// could not follow the Node: 100 ms at first (the wait is inside a node's
// downtime), then 500 ms (two GETs a poll for as long as
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
	if ok, why := statusSince(n, since); !ok || since.IsZero() {
		return ok, why
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

// statusSince is NodeReadySince without the Lease: n's Ready condition is
// true, with a heartbeat in since's second or later (any when since is
// zero).
func statusSince(n *corev1.Node, since time.Time) (bool, string) {
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
	if hb := ready.LastHeartbeatTime.Time; hb.Before(since.Truncate(time.Second)) {
		return false, fmt.Sprintf("Node %s Ready, but last posted at %s, before the kubelet started (%s)", n.Name,
			hb.UTC().Format(time.RFC3339), since.UTC().Format(time.RFC3339Nano))
	}
	return true, ""
}
