package repave

// TestKubernetesUpgradeOnRig: the version in the Machine's spec is the version that runs. A host starts
// on an earlier real kubelet release, found on the rig's release mirror by its version alone; changing
// spec.node.kubernetesVersion to the next patch release replaces the kubelet in place, the workload's containers
// kept; with spec.updateMethod Repave the same kind of change repaves onto the other slot; the Node and the Machine
// then report the version. A version the skew policy forbids is refused before anything is fetched, and a mirror
// that serves another release's binary under a version's path is caught before the node restarts and rolled back.

import (
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/units"
)

func TestKubernetesUpgradeOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	prevDir, err := kube.PrevKubeletDir(ctx, rig.Required)
	if err != nil {
		if rig.Required {
			t.Fatalf("the earlier kubelet release: %v", err)
		}
		t.Skipf("the earlier kubelet release (scripts/kube-bins.sh --prev kubelet): %v", err)
	}
	cur := kubeletRelease(t, filepath.Join(rig.KubeBinDir, "kubelet"))
	prev := kubeletRelease(t, filepath.Join(prevDir, "kubelet"))
	if prev == cur {
		t.Fatalf("the earlier kubelet reports %s, the same release as the current one", prev)
	}
	// The release tree: each version's kubelet and its published sha256. v<wrong> holds the current release's
	// binary, as a mirror that was filled wrongly would.
	const wrong = "1.37.0"
	tree := func(v string) string { return rig.ReleaseDir + "/" + kuberelease.KubeletPath(v, runtime.GOARCH) }
	mirrorFiles := map[string]string{
		tree(prev):  filepath.Join(prevDir, "kubelet"),
		tree(cur):   filepath.Join(rig.KubeBinDir, "kubelet"),
		tree(wrong): filepath.Join(rig.KubeBinDir, "kubelet"),
	}
	t0 := time.Now()
	p := rig.NewPodsRig(t, ctx, "kver", rig.Options{Release: prev, Mirror: mirrorFiles})
	r := p.RepaveRig
	rig.Timing(t, "kubernetes upgrade: host on the earlier release bootstrapped to Node Ready", time.Since(t0))
	r.CheckVersions(ctx, prev)
	// The bootstrap asked the API server for its version with the join credentials (no node identity yet).
	if j, _ := r.H.Journal(ctx, units.Bootstrap); !strings.Contains(j, "kubernetes version within the skew policy") {
		t.Errorf("the bootstrap did not check the version skew:\n%s", rig.TailLines(j, 30))
	}

	ns := p.Namespace(ctx)
	p.Deploy(ctx, ns)
	before := containerIDs(p.WaitPods(ctx, ns, time.Time{}, 4*time.Minute))
	p.EdgePod(ctx, ns)
	probe := p.StartProbe(ctx)

	// 1. A patch release (only the version changes in the spec) goes in place: the kubelet is replaced in the running
	// node on slot a, no drain, the Deployment's containers are the same ones before and after.
	t1 := time.Now()
	gen := r.UpdateMachine(ctx, func(m *v1alpha1.Machine) {
		m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate
		m.Spec.Disruption = &v1alpha1.Disruption{Drain: v1alpha1.DrainNone} // one node: see noDrain
		m.Spec.Node.KubernetesVersion = cur
	})
	s := r.WaitStatus(ctx, requests.NewID(requests.Restart, gen, ""), 6*time.Minute)
	r.LogStatus("kubernetes patch "+prev+" -> "+cur+" in place", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "a" || !strings.Contains(s.Message, "patched in place") {
		t.Fatalf("patch in place: %+v", s)
	}
	r.CheckVersions(ctx, cur)
	if after := containerIDs(p.WaitPodsKept(ctx, ns, t1, 4*time.Minute)); !slices.Equal(before, after) {
		t.Errorf("containers across the patch in place: %v, then %v: want the same ones", before, after)
	}
	r.EventuallyMachine(ctx, "Repaved=True/PatchedInPlace", func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionRepaved)
		return c != nil && c.Status == metav1.ConditionTrue && c.Reason == v1alpha1.ReasonPatchedInPlace
	})
	rig.Timing(t, "kubernetes upgrade in place: node downtime", s.Downtime)
	rig.Timing(t, "kubernetes upgrade in place: workload downtime (hostPort probe from the host)", probe.Outage(t, t1, 2*time.Minute))

	// 1b. The same kind of change with spec.updateMethod Repave: back to the earlier release on slot b, the pods
	// started again there.
	t1 = time.Now()
	gen = r.UpdateMachine(ctx, func(m *v1alpha1.Machine) {
		m.Spec.UpdateMethod = v1alpha1.UpdateRepave
		m.Spec.Node.KubernetesVersion = prev
	})
	s = r.WaitStatus(ctx, requests.NewID(requests.Repave, gen, ""), 6*time.Minute)
	r.LogStatus("kubernetes "+cur+" -> "+prev+" by repave", s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" {
		t.Fatalf("version change by repave: %+v", s)
	}
	r.CheckVersions(ctx, prev)
	p.WaitPods(ctx, ns, t1, 4*time.Minute)
	rig.Timing(t, "kubernetes upgrade by repave: spec change -> pods Ready on the other release", time.Since(t1))
	rig.Timing(t, "kubernetes upgrade by repave: workload downtime (hostPort probe from the host)", probe.Outage(t, t1, 2*time.Minute))
	r.UpdateMachine(ctx, func(m *v1alpha1.Machine) { m.Spec.UpdateMethod = v1alpha1.UpdateAuto })

	// 1c. A fleet's way: the spec change held by updatePolicy OnNodeDelete (the Node stays, so nothing happens), then
	// an Update operation applies it the least disruptive way: this patch release in place, on slot b.
	gen = r.UpdateMachine(ctx, func(m *v1alpha1.Machine) {
		m.Spec.UpdatePolicy = v1alpha1.UpdateOnNodeDelete
		m.Spec.Node.KubernetesVersion = cur
	})
	r.EventuallyMachine(ctx, "RepavePending WaitingForNodeDeletion", func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionRepavePending)
		return c != nil && c.Reason == v1alpha1.ReasonWaitingForNodeDel && c.ObservedGeneration == gen
	})
	upd := &v1alpha1.MachineOperation{Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationUpdate,
		MachineRef: &v1alpha1.MachineReference{Name: r.Node}}}
	upd.Name = r.Node + "-update"
	if _, err := r.MC.CreateOperation(ctx, upd); err != nil {
		t.Fatal(err)
	}
	s = r.WaitStatus(ctx, requests.NewID(requests.Restart, gen, upd.Name), 6*time.Minute)
	r.LogStatus("Update operation: kubernetes "+prev+" -> "+cur, s)
	if s.Phase != requests.Succeeded || s.ActiveSlot != "b" || !strings.Contains(s.Message, "patched in place") {
		t.Fatalf("Update operation: %+v", s)
	}
	r.CheckVersions(ctx, cur)
	r.UpdateMachine(ctx, func(m *v1alpha1.Machine) { m.Spec.UpdatePolicy = v1alpha1.UpdateImmediate })

	// 2. Past the skew policy: refused before anything is fetched; the node is left alone.
	const tooOld = "1.33.0"
	gen = r.UpdateMachine(ctx, func(m *v1alpha1.Machine) { m.Spec.Node.KubernetesVersion = tooOld })
	s = r.WaitStatus(ctx, requests.NewID(requests.Repave, gen, ""), 3*time.Minute)
	if s.Phase != requests.Failed || !strings.Contains(s.Message, "skew policy") || !strings.Contains(s.Message, "4 minor versions older") {
		t.Errorf("repave to %s: %s %q, want Failed naming the skew policy", tooOld, s.Phase, s.Message)
	}
	if n := r.Srv.Hits(tree(tooOld)) + r.Srv.Hits(tree(tooOld)+".sha256"); n != 0 {
		t.Errorf("the mirror was asked %d times for %s, refused by policy", n, tooOld)
	}
	r.EventuallyMachine(ctx, "Repaved=False naming the skew policy", func(m *v1alpha1.Machine) bool {
		c := meta.FindStatusCondition(m.Status.Conditions, v1alpha1.ConditionRepaved)
		return c != nil && c.Status == metav1.ConditionFalse && strings.Contains(c.Message, "skew policy")
	})
	r.CheckVersions(ctx, cur)

	// 3. The mirror serves the current release's binary as v<wrong>, a patch release of the running one: the patch in
	// place checks the binary in the node before it restarts anything, and puts the running one back: no downtime,
	// the pods keep running.
	gen = r.UpdateMachine(ctx, func(m *v1alpha1.Machine) { m.Spec.Node.KubernetesVersion = wrong })
	s = r.WaitStatus(ctx, requests.NewID(requests.Restart, gen, ""), 8*time.Minute)
	r.LogStatus("patch onto a wrong binary for "+wrong, s)
	if s.Phase != requests.Failed || s.ActiveSlot != "b" || !strings.Contains(s.Message, "rolled back") ||
		!strings.Contains(s.Message, "reports "+cur+", but kubernetes version "+wrong) {
		t.Errorf("patch to %s with the wrong binary: %s on %s %q, want Failed, rolled back, naming both versions", wrong, s.Phase, s.ActiveSlot, s.Message)
	}
	if s.Downtime != 0 || !strings.Contains(s.Message, "phase patch-kubelet") {
		t.Errorf("patch to %s with the wrong binary: downtime %s, %q: want it refused before the restart", wrong, s.Downtime, s.Message)
	}
	if r.Srv.Hits(tree(wrong)+".sha256") == 0 {
		// (The binary itself may come from the artifact cache: it is the current release's file, by digest.)
		t.Error("the mirror was never asked for the wrong version's checksum: the check proved nothing")
	}
	r.CheckVersions(ctx, cur)
	p.WaitPods(ctx, ns, time.Time{}, 4*time.Minute)
}

// containerIDs are the pods' container IDs, sorted.
func containerIDs(pods []corev1.Pod) []string {
	var ids []string
	for _, p := range pods {
		for _, c := range p.Status.ContainerStatuses {
			ids = append(ids, c.ContainerID)
		}
	}
	slices.Sort(ids)
	return ids
}

// kubeletRelease is the release a kubelet binary reports.
func kubeletRelease(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", bin, err)
	}
	v, err := kuberelease.ParseKubeletVersion(out)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
