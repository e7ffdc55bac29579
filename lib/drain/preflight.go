package drain

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// PreflightAction is what a drain does, before it cordons anything, about
// PodDisruptionBudgets that would hold it up.
type PreflightAction string

// Preflight actions.
const (
	// Warn: say which budgets would hold the drain up (log and progress),
	// then drain; the timeout and OnTimeout decide, as before.
	Warn PreflightAction = "Warn"
	// Refuse: fail the drain before the cordon, naming the budgets and
	// pods, so a rollout neither waits out a drain timeout nor leaves a
	// node cordoned for a budget that was never going to let it go.
	Refuse PreflightAction = "Refuse"
)

// PDB is what the preflight reads of a PodDisruptionBudget.
type PDB struct {
	Namespace, Name string
	// Selects reports whether the budget covers a pod with these labels.
	Selects func(labels map[string]string) bool
	// DisruptionsAllowed, ExpectedPods and DesiredHealthy are the budget's
	// status.
	DisruptionsAllowed, ExpectedPods, DesiredHealthy int32
}

func (b PDB) String() string { return b.Namespace + "/" + b.Name }

// PreflightError is a drain refused before its cordon (Refuse).
type PreflightError struct {
	Node string
	// Holds says, per budget, why it would hold the drain up.
	Holds []string
	// Unknown is why the budgets could not be read ("" when they were).
	Unknown string
}

func (e *PreflightError) Error() string {
	if e.Unknown != "" {
		return fmt.Sprintf("drain of node %s refused, nothing cordoned: the PodDisruptionBudgets could not be checked (spec.disruption.pdbPreflight Refuse): %s",
			e.Node, e.Unknown)
	}
	return fmt.Sprintf("drain of node %s refused, nothing cordoned (spec.disruption.pdbPreflight Refuse): %s", e.Node, strings.Join(e.Holds, "; "))
}

// preflight reads the node's pods and the budgets of their namespaces and
// finds the budgets that would hold the drain up: one that never allows a
// disruption (its desired healthy pods are all its pods: maxUnavailable 0,
// minAvailable 100 %), and one that allows fewer disruptions now than it
// has pods on this node. The check is the node's own: it knows its pods,
// not the rest of a rollout's batch. Under Refuse a budget found, or
// budgets that could not be read, fail the drain; under Warn they are
// said and the drain goes on.
func (d *Drainer) preflight(ctx context.Context, p Policy, prog *Progress) error {
	holds, unknown := d.holds(ctx)
	if len(holds) == 0 && unknown == "" {
		return nil
	}
	if p.PDBPreflight == Refuse {
		err := &PreflightError{Node: d.Node, Holds: holds, Unknown: unknown}
		d.report(prog, Progress{Message: err.Error(), Done: true, Outcome: Failed})
		return err
	}
	if unknown != "" {
		d.Log.Warn("PodDisruptionBudgets not checked before the drain", "node", d.Node, "err", unknown)
		return nil
	}
	msg := "PodDisruptionBudgets that will hold the drain up: " + strings.Join(holds, "; ")
	d.Log.Warn("drain preflight", "node", d.Node, "message", msg)
	d.report(prog, Progress{Message: msg})
	return nil
}

// holds lists, per budget that would hold the drain up, why and the pods;
// unknown says why the budgets could not be read.
func (d *Drainer) holds(ctx context.Context) (holds []string, unknown string) {
	pods, err := d.Cluster.ListPods(ctx, d.Node)
	if err != nil {
		return nil, "list pods: " + err.Error()
	}
	byNS := map[string][]Pod{}
	for _, pod := range pods {
		if pod.DaemonSet || pod.Mirror || pod.Finished || pod.Terminating {
			continue
		}
		byNS[pod.Namespace] = append(byNS[pod.Namespace], pod)
	}
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		pdbs, err := d.Cluster.ListPDBs(ctx, ns)
		if err != nil {
			return holds, fmt.Sprintf("list PodDisruptionBudgets of %s: %v", ns, err)
		}
		for _, b := range pdbs {
			var covered []string
			for _, pod := range byNS[ns] {
				if b.Selects != nil && b.Selects(pod.Labels) {
					covered = append(covered, pod.String())
				}
			}
			if len(covered) == 0 {
				continue
			}
			slices.Sort(covered)
			switch {
			case b.ExpectedPods > 0 && b.DesiredHealthy >= b.ExpectedPods:
				holds = append(holds, fmt.Sprintf("PodDisruptionBudget %s never allows a disruption (%d of its %d pods must stay healthy), covering %s",
					b, b.DesiredHealthy, b.ExpectedPods, strings.Join(covered, ", ")))
			case int(b.DisruptionsAllowed) < len(covered):
				holds = append(holds, fmt.Sprintf("PodDisruptionBudget %s allows %d disruptions now, and this node has %d of its pods: %s",
					b, b.DisruptionsAllowed, len(covered), strings.Join(covered, ", ")))
			}
		}
	}
	return holds, ""
}
