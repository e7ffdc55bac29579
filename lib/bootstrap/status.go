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
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/machineclient"
	"github.com/kubeslot/kubeslot/lib/nodeclient"
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

// NodeCluster is the real Cluster over the node identity: lib/nodeclient
// for the Node and the API server's version, and the Machine reports.
type NodeCluster struct {
	Root *hostroot.Root
	Log  *slog.Logger
	// Identity is the host path of the node identity directory; "" means
	// <base>/identity.
	Identity string
}

// node is the node's own client, its requests named after this stage.
func (c *NodeCluster) node() *nodeclient.Client {
	return &nodeclient.Client{Root: c.Root, Log: c.Log, Identity: c.Identity, Stage: Stage}
}

// RESTConfig is nodeclient.Client.RESTConfig: a client configuration for
// the node identity, ErrNoIdentity (wrapped) when there is none yet.
func (c *NodeCluster) RESTConfig(cfg *config.Config) (*rest.Config, error) {
	return c.node().RESTConfig(cfg)
}

// WaitReady waits until the Node is Ready as posted by a kubelet started
// at since or later, bounded by ctx (nodeclient.Client.WaitReady). The
// identity appears once the kubelet's TLS bootstrap finished.
func (c *NodeCluster) WaitReady(ctx context.Context, cfg *config.Config, since time.Time) error {
	return c.node().WaitReady(ctx, cfg, since)
}

// KubeletVersion is nodeclient.Client.KubeletVersion: the kubelet version
// the Node reports.
func (c *NodeCluster) KubeletVersion(ctx context.Context, cfg *config.Config) (string, error) {
	return c.node().KubeletVersion(ctx, cfg)
}

// ServerVersion is nodeclient.Client.ServerVersion: with the node's
// identity once it has one, else with the join credentials.
func (c *NodeCluster) ServerVersion(ctx context.Context, cfg *config.Config) (string, error) {
	return c.node().ServerVersion(ctx, cfg)
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
		if _, err := mc.CreateMachine(ctx, MachineFor(cfg)); apierrors.IsForbidden(err) {
			return v1alpha1.NotEnrolled(name, err)
		} else if err != nil && !apierrors.IsAlreadyExists(err) {
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
// after the machine, for its node, with the node configuration of cfg and
// the enrolled label (only an enrolled node may create it).
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
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Machine.Name, Labels: v1alpha1.EnrolledLabels()},
		Spec:       v1alpha1.MachineSpec{NodeName: cfg.Machine.NodeName, Node: nc},
	}
}
