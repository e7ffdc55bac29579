// Package drainkube is lib/drain's Cluster over client-go, with the node's
// own identity. A package of its own so that lib/drain's policy and
// progress types, which the request files carry, do not link the typed
// API (the watcher must stay without it). Imported only by lib/repave.
package drainkube

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/lib/drain"
)

// Kube is the real drain.Cluster: client-go with the node's own identity. What
// it asks is exactly what the Node authorizer and NodeRestriction allow a
// node for itself (DESIGN.md, "Drain"): get and patch its own Node (not
// its taints), list pods with the field selector spec.nodeName=<itself>,
// and create evictions of pods bound to it.
type Kube struct {
	Client kubernetes.Interface
}

// mirrorAnnotation marks a static pod's mirror (kubelet's
// kubetypes.ConfigMirrorAnnotationKey).
const mirrorAnnotation = "kubernetes.io/config.mirror"

// GetNode implements drain.Cluster.
func (k Kube) GetNode(ctx context.Context, name string) (*drain.Node, error) {
	n, err := k.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("node %s: %w", name, drain.ErrNodeNotFound)
	}
	if err != nil {
		return nil, err
	}
	return &drain.Node{Unschedulable: n.Spec.Unschedulable, CordonedBy: n.Annotations[drain.Annotation], ResourceVersion: n.ResourceVersion}, nil
}

// PatchNode implements drain.Cluster with a JSON merge patch that carries the
// resourceVersion read (a conflict when the Node changed since) and
// touches nothing but spec.unschedulable and the annotation:
// NodeRestriction refuses a node's change of its own taints, which a whole
// update with a stale copy would be.
func (k Kube) PatchNode(ctx context.Context, name, rv string, unschedulable bool, cordonedBy string) error {
	var ann any // nil removes it
	if cordonedBy != "" {
		ann = cordonedBy
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv, "annotations": map[string]any{drain.Annotation: ann}},
		"spec":     map[string]any{"unschedulable": unschedulable},
	})
	if err != nil {
		return err
	}
	_, err = k.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubeslot"})
	return err
}

// ListPods implements drain.Cluster, a page at a time.
func (k Kube) ListPods(ctx context.Context, node string) ([]drain.Pod, error) {
	var out []drain.Pod
	opts := metav1.ListOptions{FieldSelector: "spec.nodeName=" + node, Limit: 500}
	for {
		l, err := k.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range l.Items {
			out = append(out, podOf(&l.Items[i]))
		}
		if l.Continue == "" {
			return out, nil
		}
		opts.Continue = l.Continue
	}
}

func podOf(p *corev1.Pod) drain.Pod {
	out := drain.Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Labels: p.Labels,
		Terminating: p.DeletionTimestamp != nil,
		Finished:    p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed}
	_, out.Mirror = p.Annotations[mirrorAnnotation]
	if c := metav1.GetControllerOf(p); c != nil && c.Kind == "DaemonSet" && c.APIVersion == "apps/v1" {
		out.DaemonSet = true
	}
	for _, v := range p.Spec.Volumes {
		if v.EmptyDir != nil {
			out.EmptyDir = true
		}
	}
	return out
}

// ListPDBs implements drain.Cluster (RBAC: kubeslot:agent's read of
// poddisruptionbudgets).
func (k Kube) ListPDBs(ctx context.Context, namespace string) ([]drain.PDB, error) {
	l, err := k.Client.PolicyV1().PodDisruptionBudgets(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []drain.PDB
	for _, b := range l.Items {
		// A budget without a selector covers no pod; an empty one, all of
		// the namespace's (policy/v1).
		sel, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
		if err != nil {
			return nil, fmt.Errorf("PodDisruptionBudget %s/%s: selector: %w", b.Namespace, b.Name, err)
		}
		out = append(out, drain.PDB{Namespace: b.Namespace, Name: b.Name,
			Selects:            func(l map[string]string) bool { return sel.Matches(labels.Set(l)) },
			DisruptionsAllowed: b.Status.DisruptionsAllowed, ExpectedPods: b.Status.ExpectedPods, DesiredHealthy: b.Status.DesiredHealthy})
	}
	return out, nil
}

// pdbRE finds the budget's name in the 429's cause ("The disruption budget
// <name> needs …", "… is still being processed …").
var pdbRE = regexp.MustCompile(`disruption budget (\S+)`)

// Evict implements drain.Cluster: a policy/v1 Eviction with the pod's UID as a
// precondition (a pod of the same name created since is another pod).
func (k Kube) Evict(ctx context.Context, p drain.Pod) error {
	uid := types.UID(p.UID)
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}}
	err := k.Client.CoreV1().Pods(p.Namespace).EvictV1(ctx, ev)
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err) && p.UID != "":
		return nil // the UID precondition: that pod is gone
	case apierrors.IsTooManyRequests(err):
		b := &drain.BlockedError{Message: err.Error()}
		if se, ok := err.(apierrors.APIStatus); ok && se.Status().Details != nil {
			for _, c := range se.Status().Details.Causes {
				if c.Type != policyv1.DisruptionBudgetCause {
					continue
				}
				b.Message = c.Message
				if m := pdbRE.FindStringSubmatch(c.Message); m != nil {
					b.PDB = p.Namespace + "/" + m[1]
				}
			}
		}
		return b
	}
	return err
}
