package rig

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// UpdateMachine changes the host's Machine spec (retrying on conflicts) and returns its new generation.
func (r *RepaveRig) UpdateMachine(ctx context.Context, change func(*v1alpha1.Machine)) int64 {
	r.t.Helper()
	var m *v1alpha1.Machine
	var err error
	for range 10 {
		if m, err = r.MC.GetMachine(ctx, r.Node); err != nil {
			continue
		}
		change(m)
		if m, err = r.MC.UpdateMachine(ctx, m); err == nil {
			return m.Generation
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.t.Fatalf("update Machine %s: %v", r.Node, err)
	return 0
}

// EventuallyMachine waits up to a minute for the Machine to satisfy ok.
func (r *RepaveRig) EventuallyMachine(ctx context.Context, what string, ok func(*v1alpha1.Machine) bool) {
	r.t.Helper()
	Eventually(r.t, time.Minute, what, func() (bool, string) {
		m, err := r.MC.GetMachine(ctx, r.Node)
		if err != nil {
			return false, err.Error()
		}
		return ok(m), fmt.Sprintf("phase %s, applied %+v, conditions %+v", m.Status.Phase, m.Status.Applied, m.Status.Conditions)
	})
}

// CheckVersions: the Node's kubelet reports release v, and so does the Machine's status (read from the Node).
func (r *RepaveRig) CheckVersions(ctx context.Context, v string) {
	r.t.Helper()
	n, err := r.Admin.CoreV1().Nodes().Get(ctx, r.Node, metav1.GetOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	if got := n.Status.NodeInfo.KubeletVersion; got != "v"+v {
		r.t.Errorf("Node %s reports kubelet %s, want v%s", r.Node, got, v)
	}
	r.EventuallyMachine(ctx, "Machine status.applied.kubernetesVersion "+v, func(m *v1alpha1.Machine) bool {
		return m.Status.Applied != nil && m.Status.Applied.KubernetesVersion == v
	})
}
