// Package drain takes a node's workload off it before kubeslot stops the
// node (a repave's switch, a restart in place) and gives the node back to
// the scheduler once it is healthy again, acting as the node itself:
//
//   - Cordon marks the Node unschedulable and records that kubeslot did it
//     (annotation kubeslot.dev/cordoned, its value the request that asked),
//     so that Uncordon never undoes a person's cordon: a Node already
//     unschedulable without the annotation is left as it is, and stays so.
//   - Drain lists the node's pods (field selector spec.nodeName), leaves
//     DaemonSet pods, mirror pods and finished pods, evicts the rest through
//     the Eviction API (policy/v1), so that PodDisruptionBudgets hold: a 429
//     is a budget that blocks, retried with backoff and named in the
//     progress. Pods with emptyDir volumes are evicted only when the policy
//     allows losing that data. It waits until the evicted pods are gone.
//   - Everything, the cordon included, is bounded by the policy's timeout;
//     when it runs out, OnTimeout decides: Fail (an error, the caller does
//     not stop the node) or Force (go on: the pods left stop with the node).
//
// The cluster is reached through Cluster (lib/drain/drainkube is the
// real one, over client-go); the node identity may do exactly this through the Node
// authorizer and NodeRestriction (DESIGN.md, "Drain"). Imported only by
// lib/repave, and for its
// Policy and Progress (carried in request and status files) by lib/requests.
package drain

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Annotation marks a Node that kubeslot cordoned; its value is the request
// that did.
const Annotation = "kubeslot.dev/cordoned"

// Action is what a drain does when its timeout runs out.
type Action string

// Actions when a drain's timeout runs out.
const (
	// Fail: the drain is an error; the node is not stopped.
	Fail Action = "Fail"
	// Force: go on; the pods left stop with the node.
	Force Action = "Force"
)

// Bounds of a policy's timeout (the Machine's spec.disruption.drainTimeoutSeconds).
const (
	DefaultTimeout = 2 * time.Minute
	MaxTimeout     = 20 * time.Minute
)

// Policy is how a node is drained.
type Policy struct {
	// Skip: no cordon and no evictions; the pods stop with the node
	// (spec.disruption.drain None).
	Skip bool `json:"skip,omitempty"`
	// Timeout bounds the cordon, the evictions and the wait for the pods
	// to go (0: DefaultTimeout).
	Timeout time.Duration `json:"timeout,omitempty"`
	// OnTimeout is what happens when Timeout runs out ("": Fail).
	OnTimeout Action `json:"onTimeout,omitempty"`
	// DeleteEmptyDirData lets pods with emptyDir volumes be evicted (their
	// data is lost); without it such a pod is never evicted, and the drain
	// fails at once under Fail, or leaves it to stop with the node under
	// Force.
	DeleteEmptyDirData bool `json:"deleteEmptyDirData,omitempty"`
	// PDBPreflight is what a budget that would hold the drain up does
	// before anything is cordoned (preflight.go): Warn ("") or Refuse.
	PDBPreflight PreflightAction `json:"pdbPreflight,omitempty"`
}

// Check refuses a policy out of its bounds, naming the field.
func (p Policy) Check() error {
	if p.Timeout < 0 || p.Timeout > MaxTimeout {
		return fmt.Errorf("disruption.drainTimeout %s: want 0 (the default, %s) up to %s", p.Timeout, DefaultTimeout, MaxTimeout)
	}
	if p.OnTimeout != "" && p.OnTimeout != Fail && p.OnTimeout != Force {
		return fmt.Errorf("disruption.onDrainTimeout %q: want %s or %s", p.OnTimeout, Fail, Force)
	}
	if p.PDBPreflight != "" && p.PDBPreflight != Warn && p.PDBPreflight != Refuse {
		return fmt.Errorf("disruption.pdbPreflight %q: want %s or %s", p.PDBPreflight, Warn, Refuse)
	}
	return nil
}

func (p Policy) timeout() time.Duration {
	if p.Timeout <= 0 {
		return DefaultTimeout
	}
	return p.Timeout
}

// Node is what a drain reads of the Node.
type Node struct {
	Unschedulable bool
	// CordonedBy is the Annotation's value, "" without it.
	CordonedBy string
	// ResourceVersion makes a patch conditional on what was read, so that
	// a person's cordon in between is not taken for kubeslot's.
	ResourceVersion string
}

// Pod is what a drain needs of a pod.
type Pod struct {
	Namespace, Name, UID string
	// DaemonSet: controlled by a DaemonSet (its controller would put it
	// back; it tolerates unschedulable anyway).
	DaemonSet bool
	// Mirror: a static pod's mirror (the kubelet owns it; the API cannot
	// evict it).
	Mirror bool
	// EmptyDir: has an emptyDir volume, whose data an eviction loses.
	EmptyDir bool
	// Terminating: deletion under way (an eviction went through).
	Terminating bool
	// Finished: phase Succeeded or Failed; nothing runs.
	Finished bool
	// Labels select the pod's PodDisruptionBudgets.
	Labels map[string]string
}

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// ErrNodeNotFound is returned by Cluster.GetNode when the Node does not exist.
var ErrNodeNotFound = errors.New("node not found")

// BlockedError is an eviction refused by a PodDisruptionBudget (HTTP 429).
type BlockedError struct {
	// PDB is the budget's namespace/name ("" when the server did not say).
	PDB     string
	Message string
}

func (e *BlockedError) Error() string {
	if e.PDB == "" {
		return "eviction blocked by a PodDisruptionBudget: " + e.Message
	}
	return "eviction blocked by PodDisruptionBudget " + e.PDB + ": " + e.Message
}

// Cluster is what a drain asks of the API server, as the node itself.
type Cluster interface {
	// GetNode reads the Node (ErrNodeNotFound, wrapped, when absent).
	GetNode(ctx context.Context, name string) (*Node, error)
	// PatchNode sets spec.unschedulable and the Annotation (cordonedBy ""
	// removes it), only while the Node is at resourceVersion rv.
	PatchNode(ctx context.Context, name, rv string, unschedulable bool, cordonedBy string) error
	// ListPods lists the pods bound to node.
	ListPods(ctx context.Context, node string) ([]Pod, error)
	// Evict asks for p's eviction: nil when accepted or when the pod is
	// gone; a *BlockedError when a PodDisruptionBudget refuses it.
	Evict(ctx context.Context, p Pod) error
	// ListPDBs lists the PodDisruptionBudgets of namespace.
	ListPDBs(ctx context.Context, namespace string) ([]PDB, error)
}

// Progress is a drain's state, reported each time it changes.
type Progress struct {
	// PodsLeft are the pods still to go (evicted ones not yet gone
	// included; DaemonSet, mirror and finished pods not counted).
	PodsLeft int `json:"podsLeft"`
	// BlockingPDB names the budget that last refused an eviction.
	BlockingPDB string `json:"blockingPDB,omitempty"`
	// Message says it in one line for a person.
	Message string `json:"message,omitempty"`
	// Done: the drain is over (the pods are gone, or it gave up or forced).
	Done bool `json:"done,omitempty"`
	// Outcome of a finished drain.
	Outcome Outcome `json:"outcome,omitempty"`
}

// Outcome is how a drain ended.
type Outcome string

// Outcomes of a drain.
const (
	Drained Outcome = "Drained" // the pods went (or there was no Node)
	Failed  Outcome = "Failed"  // an error: time out under Fail, pods it may not evict
	Forced  Outcome = "Forced"  // went on with pods left (Force)
)

// Result is how a drain ended without an error.
type Result struct {
	// NoNode: the Node does not exist, there was nothing to cordon or drain.
	NoNode bool
	// Forced: the timeout ran out under Force; Left are the pods left.
	Forced bool
	Left   []string
	// Evicted counts the evictions the API accepted.
	Evicted int
	Message string
}

// TimeoutError is a drain that ran out of time under Fail.
type TimeoutError struct {
	Node    string
	Timeout time.Duration
	Left    []string
	PDB     string
	Last    string
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("drain of node %s not done within %s (spec.disruption.drainTimeoutSeconds, onDrainTimeout Fail): %s",
		e.Node, e.Timeout, leftMessage(e.Left, e.PDB, e.Last))
}

func leftMessage(left []string, pdb, last string) string {
	msg := fmt.Sprintf("%d pods left", len(left))
	if len(left) > 0 {
		shown := left
		if len(shown) > 5 {
			shown = shown[:5]
		}
		msg += " (" + strings.Join(shown, ", ")
		if len(left) > len(shown) {
			msg += ", …"
		}
		msg += ")"
	}
	if pdb != "" {
		msg += "; blocked by PodDisruptionBudget " + pdb
	}
	if last != "" {
		msg += "; last error: " + last
	}
	return msg
}

// Drainer drains one node.
type Drainer struct {
	Cluster Cluster
	Node    string
	Log     *slog.Logger
	// Progress is called with each change of the drain's state (nil: not).
	Progress func(Progress)
	// Poll is the pause between passes (0: 1 s); evictions a budget
	// refused are retried with a backoff from Poll up to 8 × Poll.
	Poll time.Duration
}

func (d *Drainer) poll() time.Duration {
	if d.Poll > 0 {
		return d.Poll
	}
	return time.Second
}

func (d *Drainer) report(last *Progress, p Progress) {
	if p == *last {
		return
	}
	*last = p
	d.Log.Info("drain", "node", d.Node, "podsLeft", p.PodsLeft, "blockingPDB", p.BlockingPDB, "done", p.Done, "message", p.Message)
	if d.Progress != nil {
		d.Progress(p)
	}
}

// errTimeout is the cause of a drain's context running out.
var errTimeout = errors.New("drain timeout")

// Drain cordons the node for owner (the request) and evicts its pods, as
// the package comment says. It is idempotent: a drain resumed after a kill
// finds its cordon (the annotation) and the pods already gone.
func (d *Drainer) Drain(ctx context.Context, p Policy, owner string) (Result, error) {
	if err := p.Check(); err != nil {
		return Result{}, err
	}
	if p.Skip {
		d.Log.Info("not drained: the policy says None; the pods stop with the node", "node", d.Node)
		return Result{Message: "not drained (spec.disruption.drain None)"}, nil
	}
	tctx, cancel := context.WithTimeoutCause(ctx, p.timeout(), errTimeout)
	defer cancel()
	var prog Progress
	var last string
	if err := d.preflight(tctx, p, &prog); err != nil {
		return Result{}, err
	}
	// The cordon, retried: the Node may be written by its kubelet between
	// the read and the patch.
	for {
		err := d.Cordon(tctx, owner)
		if errors.Is(err, ErrNodeNotFound) {
			res := Result{NoNode: true, Message: "Node " + d.Node + " does not exist: nothing to drain"}
			d.report(&prog, Progress{Message: res.Message, Done: true, Outcome: Drained})
			return res, nil
		}
		if err == nil {
			break
		}
		last = err.Error()
		if !sleep(tctx, d.poll()) {
			return d.timedOut(ctx, p, &prog, nil, "", "cordon: "+last)
		}
	}
	type try struct {
		n    int
		next time.Time
	}
	tries := map[string]*try{}
	evicted := 0
	for {
		pods, err := d.Cluster.ListPods(tctx, d.Node)
		if err != nil {
			last = "list pods: " + err.Error()
		} else {
			var left, kept []string
			var evict []Pod
			pdb := prog.BlockingPDB
			for _, pod := range pods {
				switch {
				case pod.DaemonSet, pod.Mirror, pod.Finished:
				case pod.EmptyDir && !p.DeleteEmptyDirData && !pod.Terminating:
					kept = append(kept, pod.String())
				case pod.Terminating:
					left = append(left, pod.String())
				default:
					left = append(left, pod.String())
					evict = append(evict, pod)
				}
			}
			// Checked before any eviction: under Fail, nothing is evicted
			// for a drain that cannot finish.
			slices.Sort(kept)
			if len(kept) > 0 && p.OnTimeout != Force {
				err := fmt.Errorf("drain of node %s: pods with emptyDir data, not evicted while spec.disruption.deleteEmptyDirData is false: %s",
					d.Node, strings.Join(kept, ", "))
				d.report(&prog, Progress{PodsLeft: len(left) + len(kept), BlockingPDB: pdb, Message: err.Error(), Done: true, Outcome: Failed})
				return Result{Evicted: evicted}, err
			}
			for _, pod := range evict {
				t := tries[pod.UID]
				if t == nil {
					t = &try{}
					tries[pod.UID] = t
				}
				if time.Now().Before(t.next) {
					continue
				}
				err := d.Cluster.Evict(tctx, pod)
				var blocked *BlockedError
				switch {
				case err == nil:
					evicted++
					t.next = time.Now().Add(d.poll()) // evicted: wait for it to go
					continue
				case errors.As(err, &blocked):
					if blocked.PDB != "" {
						pdb = blocked.PDB
					}
					last = err.Error()
				default:
					last = fmt.Sprintf("evict %s: %v", pod, err)
				}
				t.n++
				t.next = time.Now().Add(min(d.poll()<<min(t.n, 3), 8*d.poll()))
			}
			if len(left) == 0 {
				res := Result{Evicted: evicted, Message: fmt.Sprintf("drained node %s: %d pods evicted", d.Node, evicted)}
				if len(kept) > 0 {
					res.Forced, res.Left = true, kept
					res.Message += "; left to stop with the node (emptyDir data, not allowed to evict): " + strings.Join(kept, ", ")
				}
				out := Drained
				if res.Forced {
					out = Forced
				}
				d.report(&prog, Progress{PodsLeft: len(kept), Message: res.Message, Done: true, Outcome: out})
				return res, nil
			}
			if pdb != "" && pdb != prog.BlockingPDB {
				d.Log.Warn("eviction blocked by a PodDisruptionBudget; retrying", "node", d.Node, "pdb", pdb)
			}
			d.report(&prog, Progress{PodsLeft: len(left), BlockingPDB: pdb,
				Message: fmt.Sprintf("draining node %s: %s", d.Node, leftMessage(left, pdb, ""))})
		}
		if !sleep(tctx, d.poll()) {
			// One more list (bounded: the drain's own time is over) names
			// the pods left for the message.
			lctx, lcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer lcancel()
			var left []string
			if pods, err := d.Cluster.ListPods(lctx, d.Node); err == nil {
				for _, pod := range pods {
					if !pod.DaemonSet && !pod.Mirror && !pod.Finished {
						left = append(left, pod.String())
					}
				}
			}
			return d.timedOut(ctx, p, &prog, left, prog.BlockingPDB, last)
		}
	}
}

// timedOut ends a drain whose time ran out (or whose caller stopped it):
// an error under Fail, a forced Result under Force.
func (d *Drainer) timedOut(ctx context.Context, p Policy, prog *Progress, left []string, pdb, last string) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("drain of node %s stopped: %w", d.Node, context.Cause(ctx))
	}
	if p.OnTimeout == Force {
		msg := fmt.Sprintf("drain of node %s not done within %s; forced (onDrainTimeout Force): %s", d.Node, p.timeout(), leftMessage(left, pdb, last))
		d.Log.Warn("drain timed out; going on", "node", d.Node, "left", len(left), "pdb", pdb)
		d.report(prog, Progress{PodsLeft: len(left), BlockingPDB: pdb, Message: msg, Done: true, Outcome: Forced})
		return Result{Forced: true, Left: left, Message: msg}, nil
	}
	err := &TimeoutError{Node: d.Node, Timeout: p.timeout(), Left: left, PDB: pdb, Last: last}
	d.report(prog, Progress{PodsLeft: len(left), BlockingPDB: pdb, Message: err.Error(), Done: true, Outcome: Failed})
	return Result{}, err
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// Cordon marks the Node unschedulable for owner, once: a Node kubeslot
// cordoned already (the annotation) is made unschedulable again if someone
// cleared it, one a person cordoned is left alone (and not annotated, so
// that Uncordon leaves it cordoned). ErrNodeNotFound when there is no Node.
func (d *Drainer) Cordon(ctx context.Context, owner string) error {
	n, err := d.Cluster.GetNode(ctx, d.Node)
	if err != nil {
		return err
	}
	switch {
	case n.CordonedBy != "" && n.Unschedulable:
		return nil
	case n.CordonedBy == "" && n.Unschedulable:
		d.Log.Info("Node already cordoned by someone else; it stays cordoned after the operation", "node", d.Node)
		return nil
	}
	if n.CordonedBy != "" {
		owner = n.CordonedBy
	}
	if err := d.Cluster.PatchNode(ctx, d.Node, n.ResourceVersion, true, owner); err != nil {
		return fmt.Errorf("cordon Node %s: %w", d.Node, err)
	}
	d.Log.Info("Node cordoned", "node", d.Node, "by", owner)
	return nil
}

// Uncordon makes the Node schedulable again if kubeslot cordoned it (the
// annotation), and removes the annotation; a Node without it, or no Node,
// is left alone. Conflicts (the kubelet writing the Node in between) are
// retried until ctx ends.
func (d *Drainer) Uncordon(ctx context.Context) error {
	for {
		n, err := d.Cluster.GetNode(ctx, d.Node)
		if errors.Is(err, ErrNodeNotFound) {
			return nil
		}
		if err == nil && n.CordonedBy == "" {
			return nil
		}
		if err == nil {
			err = d.Cluster.PatchNode(ctx, d.Node, n.ResourceVersion, false, "")
			if err == nil {
				d.Log.Info("Node uncordoned", "node", d.Node, "cordonedBy", n.CordonedBy)
				return nil
			}
		}
		if !sleep(ctx, d.poll()) {
			return fmt.Errorf("uncordon Node %s: %w; last: %v", d.Node, context.Cause(ctx), err)
		}
	}
}
