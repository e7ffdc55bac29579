package bootstrap

// The cluster, as the node's own identity.
//
// Every cluster request of the bootstrap uses the kubelet's client
// certificate (system:node:<nodeName>, kept in <base>/identity), never the
// bootstrap token: the token's identity (system:bootstrap:<id>, group
// system:bootstrappers) may only request a client certificate, and the
// kubeslot RBAC and admission policies (lib/api/v1alpha1/access) give it no
// rights on Machines. Widening them for bootstrappers would let anyone who
// holds a join token write any Machine, since a token does not name a node.
// So status reports start once the node identity exists (from the end of
// starting-node on, and at once on a resumed run); before that, they are
// only logged. The same identity reads the Node to see it Ready: a node may
// get its own Node object.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/machineclient"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// State of a Report.
type State int

// States.
const (
	Running State = iota + 1
	Succeeded
	Failed
)

// Report is one AgentBootstrapped update.
type Report struct {
	Phase ownership.Checkpoint
	State State
	Err   error  // Failed
	Slot  string // Succeeded
}

// Condition reasons of AgentBootstrapped besides v1alpha1's.
const (
	ReasonRunning   = "Running"
	ReasonSucceeded = "Succeeded"
)

// MaxMessage bounds a condition message.
const MaxMessage = 1024

// reportTimeout bounds one status report, all its requests together.
const reportTimeout = 10 * time.Second

// ErrNoIdentity: the kubelet has not obtained its client certificate yet.
var ErrNoIdentity = nodeidentity.ErrNoIdentity

// NodeCluster is the real Cluster over the node identity.
type NodeCluster struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Identity is the host path of the node identity directory; "" means
	// <base>/identity.
	Identity string
}

// RESTConfig is a client configuration for the node identity: the
// configuration's server and CA, and the kubelet's current client
// certificate (lib/nodeidentity). ErrNoIdentity (wrapped) when there is none
// yet.
func (c *NodeCluster) RESTConfig(cfg *config.Config) (*rest.Config, error) {
	rc, err := nodeidentity.RESTConfig(c.Root, c.Identity, cfg)
	if err != nil {
		return nil, err
	}
	rc.UserAgent = Stage + "/" + buildinfo.Version
	return rc, nil
}

// WaitNodeReady polls the Node until its Ready condition is True, bounded
// by ctx. The identity appears once the kubelet's TLS bootstrap finished.
func (c *NodeCluster) WaitNodeReady(ctx context.Context, cfg *config.Config) error {
	return c.WaitNodeReadySince(ctx, cfg, time.Time{})
}

// WaitNodeReadySince polls the Node until it is Ready as posted by a kubelet
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
func (c *NodeCluster) WaitNodeReadySince(ctx context.Context, cfg *config.Config, since time.Time) error {
	node := cfg.Machine.NodeName
	last := "no node identity yet"
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
		case <-time.After(500 * time.Millisecond):
		}
	}
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

// NodeReadySince decides WaitNodeReadySince for one reading of the Node and
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

// Report writes AgentBootstrapped on the Machine (created if missing).
// Best effort and bounded: any failure is logged, never returned.
func (c *NodeCluster) Report(ctx context.Context, cfg *config.Config, r Report) {
	log := c.Log.With("phase", r.Phase)
	rc, err := c.RESTConfig(cfg)
	if err != nil {
		log.Info("status not reported to the cluster", "reason", err.Error(), "state", stateName(r.State))
		return
	}
	ctx, cancel := context.WithTimeout(ctx, reportTimeout)
	defer cancel()
	if err := report(ctx, rc, cfg, r); err != nil {
		log.Warn("status report to the Machine failed (not fatal)", "err", err)
	}
}

func stateName(s State) string {
	switch s {
	case Running:
		return "running"
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	}
	return "unknown"
}

func report(ctx context.Context, rc *rest.Config, cfg *config.Config, r Report) error {
	mc, err := machineclient.New(rc)
	if err != nil {
		return err
	}
	name := cfg.Machine.Name
	// The status errors of client-go are found through wrapping (errors.As).
	if _, err := mc.GetMachine(ctx, name); apierrors.IsNotFound(err) {
		if _, err := mc.CreateMachine(ctx, MachineFor(cfg)); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	} else if err != nil {
		return err
	}
	cond := Condition(r)
	_, err = mc.UpdateMachineStatus(ctx, name, func(m *v1alpha1.Machine) error {
		cond.ObservedGeneration = m.Generation
		meta.SetStatusCondition(&m.Status.Conditions, cond)
		m.Status.AgentVersion = buildinfo.Version
		switch r.State {
		case Succeeded:
			m.Status.Phase = v1alpha1.MachineReady
			m.Status.ActiveSlot = r.Slot
			now := metav1.Now()
			m.Status.Applied = &v1alpha1.AppliedConfig{
				KubernetesVersion: cfg.Kubernetes.Version,
				RootFSSHA256:      v1alpha1.SHA256(cfg.RootFS.SHA256),
				Summary:           truncate(cfg.Summary(), MaxMessage),
				Fingerprint:       v1alpha1.SHA256(cfg.Fingerprint()),
				AppliedAt:         &now,
			}
		default:
			m.Status.Phase = v1alpha1.MachineBootstrapping
		}
		return nil
	})
	return err
}

// Condition is the AgentBootstrapped condition for r: False/Running with
// the phase, True/Succeeded, or False with a reason naming the failed
// phase (e.g. StartingNodeFailed) and a message of at most MaxMessage bytes.
func Condition(r Report) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionAgentBootstrapped, Status: metav1.ConditionFalse}
	switch r.State {
	case Running:
		c.Reason, c.Message = ReasonRunning, "bootstrap phase "+string(r.Phase)
	case Succeeded:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, ReasonSucceeded, "slot "+r.Slot+" committed; its node is Ready"
	default:
		msg := "failed"
		if r.Err != nil {
			msg = r.Err.Error()
		}
		c.Reason, c.Message = camel(string(r.Phase))+"Failed", truncate(msg, MaxMessage)
	}
	return c
}

// camel turns "starting-node" into "StartingNode".
func camel(s string) string {
	var b strings.Builder
	for _, part := range strings.Split(s, "-") {
		if part != "" {
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	return b.String()
}

// truncate cuts s to at most n bytes on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-3]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// MachineFor is the Machine a bootstrap creates when there is none: named
// after the machine, for its node, with the node configuration of cfg.
func MachineFor(cfg *config.Config) *v1alpha1.Machine {
	nc := v1alpha1.NodeConfig{
		KubernetesVersion: cfg.Kubernetes.Version,
		RootFS:            v1alpha1.RootFS{Source: v1alpha1.URL(cfg.RootFS.Source), SHA256: v1alpha1.SHA256(cfg.RootFS.SHA256)},
	}
	art := func(a *config.Artifact) *v1alpha1.Artifact {
		if a == nil {
			return nil
		}
		return &v1alpha1.Artifact{URL: v1alpha1.URL(a.URL), SHA256: v1alpha1.SHA256(a.SHA256)}
	}
	nc.Artifacts = &v1alpha1.Artifacts{Containerd: art(cfg.Artifacts.Containerd),
		Runc: art(cfg.Artifacts.Runc), CNIPlugins: art(cfg.Artifacts.CNIPlugins)}
	if k := cfg.Artifacts.Kubelet; k.URL != "" {
		// One from the release mirror is left out: the version picks it.
		nc.Artifacts.Kubelet = art(&k)
	}
	if len(cfg.Kubernetes.Labels) > 0 {
		nc.Labels = map[string]v1alpha1.LabelValue{}
		for k, v := range cfg.Kubernetes.Labels {
			nc.Labels[k] = v1alpha1.LabelValue(v)
		}
	}
	for _, t := range cfg.Kubernetes.Taints {
		nc.Taints = append(nc.Taints, v1alpha1.Taint(t))
	}
	return &v1alpha1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Machine.Name},
		Spec:       v1alpha1.MachineSpec{NodeName: cfg.Machine.NodeName, Node: nc},
	}
}
