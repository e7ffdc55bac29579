package cluster

// Tests of kubeslot's cluster API (lib/api/v1alpha1, lib/clusterinstall, lib/machineclient) against the rig's real
// kube-apiserver. This file: the shared setup (the API is installed once per test binary, see rig.NeedAPI), schema and CEL
// validation, and the status subresource. api_agents_test.go: what each agent's identity may do; api_install_test.go:
// kubectl's view, and `kubeslot cluster install|uninstall`.

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

func TestAPIValidObjectsAccepted(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)

	m := rig.SampleMachine("api-valid", "api-valid.example.com")
	m.Spec.Node.Devices = &v1alpha1.Devices{GPUs: v1alpha1.GPUsNVIDIA, Paths: []v1alpha1.DevicePath{"/dev/fuse", "/dev/dri/renderD128"}}
	m.Spec.Node.KubernetesRelease = &v1alpha1.KubernetesRelease{Mirror: "https://dl.example.com/release", KubeletSHA256: rig.SampleSHA}
	m.Spec.UpdateMethod = v1alpha1.UpdateRepave
	got, err := admin.CreateMachine(ctx, m)
	if err != nil {
		t.Fatalf("a valid Machine was refused: %v", err)
	}
	if a, b := mustJSON(t, got.Spec), mustJSON(t, m.Spec); a != b {
		t.Errorf("spec changed on the way:\n got %s\nwant %s", a, b)
	}
	// defaulting: no update policy means OnNodeDelete, no update method Auto, no budget preflight Warn
	m2 := rig.SampleMachine("api-valid-2", "api-valid-2")
	m2.Spec.UpdatePolicy = ""
	m2.Spec.Node.Artifacts = nil
	m2.Spec.Disruption = &v1alpha1.Disruption{DeleteEmptyDirData: true}
	if got, err := admin.CreateMachine(ctx, m2); err != nil {
		t.Fatalf("a minimal Machine was refused: %v", err)
	} else if got.Spec.UpdatePolicy != v1alpha1.UpdateOnNodeDelete || got.Spec.UpdateMethod != v1alpha1.UpdateAuto {
		t.Errorf("updatePolicy, updateMethod defaulted to %q, %q; want %q, %q", got.Spec.UpdatePolicy, got.Spec.UpdateMethod,
			v1alpha1.UpdateOnNodeDelete, v1alpha1.UpdateAuto)
	} else if d := got.Spec.Disruption; d.DrainTimeoutSeconds != 120 || d.OnDrainTimeout != v1alpha1.DrainTimeoutFail || !d.DeleteEmptyDirData ||
		d.Drain != v1alpha1.DrainEvict || d.PDBPreflight != v1alpha1.PDBPreflightWarn {
		t.Errorf("spec.disruption defaulted to %+v, want Evict, 120 s, Fail, Warn, and deleteEmptyDirData kept", *d)
	}

	ops := []*v1alpha1.MachineOperation{
		rig.SampleOperation("api-valid-restart", v1alpha1.OperationNodeRestart),
		rig.SampleOperation("api-valid-reset", v1alpha1.OperationAgentReset),
	}
	sel := rig.SampleOperation("api-valid-repave", v1alpha1.OperationRepave)
	sel.Spec.MachineRef = nil
	sel.Spec.MachineSelector = &v1alpha1.MachineSelector{
		MatchLabels: map[string]string{"pool": "api-valid"},
		MatchExpressions: []v1alpha1.SelectorRequirement{
			{Key: "zone", Operator: v1alpha1.SelectorIn, Values: []string{"a", "b"}},
			{Key: "example.com/drain", Operator: v1alpha1.SelectorDoesNotExist},
		},
	}
	up := rig.SampleOperation("api-valid-upgrade", v1alpha1.OperationAgentUpgrade)
	up.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "http://10.0.0.1:8080/kubeslot-1.2.3.tar.gz", BundleSHA256: rig.SampleSHA}
	ops = append(ops, sel, up)
	for _, op := range ops {
		got, err := admin.CreateOperation(ctx, op)
		if err != nil {
			t.Errorf("a valid MachineOperation %s was refused: %v", op.Name, err)
			continue
		}
		if a, b := mustJSON(t, got.Spec), mustJSON(t, op.Spec); a != b {
			t.Errorf("%s: spec changed on the way:\n got %s\nwant %s", op.Name, a, b)
		}
		// metadata may change (labels), the spec may not: an update that keeps the spec is admitted
		got.Labels = map[string]string{"touched": "yes"}
		if _, err := admin.UpdateOperation(ctx, got); err != nil {
			t.Errorf("%s: a metadata-only update was refused: %v", op.Name, err)
		}
	}
	// the helper agrees with the selector: pool=api-valid, zone in (a, b), no example.com/drain
	for _, tc := range []struct {
		labels map[string]string
		want   bool
	}{
		{map[string]string{"pool": "api-valid", "zone": "a", v1alpha1.LabelEnrolled: "true"}, true},
		{map[string]string{"pool": "api-valid", "zone": "a"}, false}, // not enrolled
		{map[string]string{"pool": "api-valid", v1alpha1.LabelEnrolled: "true"}, false},
		{map[string]string{"pool": "api-valid", "zone": "b", "example.com/drain": "", v1alpha1.LabelEnrolled: "true"}, false},
		{map[string]string{"pool": "other", "zone": "a", v1alpha1.LabelEnrolled: "true"}, false},
	} {
		m := &v1alpha1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: tc.labels}}
		if got, err := sel.Targets(m); err != nil || got != tc.want {
			t.Errorf("selector operation targets a Machine labelled %v: %v, %v; want %v", tc.labels, got, err, tc.want)
		}
	}
}

func TestAPIInvalidObjectsRejected(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)

	machineCases := []struct {
		name   string
		mutate func(*v1alpha1.Machine)
		want   []string // substrings of the error: the field, and what is wrong
	}{
		{"short sha256", func(m *v1alpha1.Machine) { m.Spec.Node.RootFS.SHA256 = rig.SampleSHA[:63] },
			[]string{"spec.node.rootfs.sha256", "64 lowercase hexadecimal"}},
		{"uppercase sha256", func(m *v1alpha1.Machine) {
			m.Spec.Node.RootFS.SHA256 = v1alpha1.SHA256(strings.ToUpper(string(rig.SampleSHA)))
		},
			[]string{"spec.node.rootfs.sha256", "64 lowercase hexadecimal"}},
		{"artifact sha256", func(m *v1alpha1.Machine) { m.Spec.Node.Artifacts.Runc.SHA256 = "xyz" },
			[]string{"spec.node.artifacts.runc.sha256", "sha256 digest"}},
		{"ftp rootfs", func(m *v1alpha1.Machine) { m.Spec.Node.RootFS.Source = "ftp://dl.example.com/rootfs.tar" },
			[]string{"spec.node.rootfs.source", "http or https URL"}},
		{"path as URL", func(m *v1alpha1.Machine) { m.Spec.Node.Artifacts.Kubelet.URL = "/srv/kubelet" },
			[]string{"spec.node.artifacts.kubelet.url", "http or https URL"}},
		{"URL with credentials", func(m *v1alpha1.Machine) { m.Spec.Node.Artifacts.Containerd.URL = "https://u:p@dl.example.com/c" },
			[]string{"spec.node.artifacts.containerd.url", "credentials"}},
		{"taint without effect", func(m *v1alpha1.Machine) { m.Spec.Node.Taints[1] = "dedicated=gpu" },
			[]string{"spec.node.taints[1]", "key=value:Effect"}},
		{"taint bad effect", func(m *v1alpha1.Machine) { m.Spec.Node.Taints[0] = "a=b:Sometimes" },
			[]string{"spec.node.taints[0]", "NoSchedule, PreferNoSchedule, NoExecute"}},
		{"taint bad key", func(m *v1alpha1.Machine) { m.Spec.Node.Taints[0] = "-bad:NoSchedule" },
			[]string{"spec.node.taints[0]", "key=value:Effect"}},
		{"http release mirror", func(m *v1alpha1.Machine) {
			m.Spec.Node.KubernetesRelease = &v1alpha1.KubernetesRelease{Mirror: "http://dl.example.com/release"}
		},
			[]string{"spec.node.kubernetesRelease.mirror", "https URL"}},
		{"kubelet pin not a digest", func(m *v1alpha1.Machine) {
			m.Spec.Node.KubernetesRelease = &v1alpha1.KubernetesRelease{Mirror: "https://dl.example.com/release", KubeletSHA256: "xyz"}
		},
			[]string{"spec.node.kubernetesRelease.kubeletSHA256", "sha256 digest"}},
		{"version with v", func(m *v1alpha1.Machine) { m.Spec.Node.KubernetesVersion = "v1.37.2" },
			[]string{"spec.node.kubernetesVersion", "MAJOR.MINOR.PATCH"}},
		{"node name", func(m *v1alpha1.Machine) { m.Spec.NodeName = "Node_1" },
			[]string{"spec.nodeName", "DNS-1123 subdomain"}},
		{"label key", func(m *v1alpha1.Machine) { m.Spec.Node.Labels["bad key"] = "x" },
			[]string{"spec.node.labels", "keys must be [prefix/]name"}},
		{"label value", func(m *v1alpha1.Machine) { m.Spec.Node.Labels["ok"] = "not ok" },
			[]string{"spec.node.labels[ok]", "at most 63 letters"}},
		{"update policy", func(m *v1alpha1.Machine) { m.Spec.UpdatePolicy = "Sometimes" },
			[]string{"spec.updatePolicy", "OnNodeDelete", "Immediate"}},
		{"drain timeout too long", func(m *v1alpha1.Machine) {
			m.Spec.Disruption = &v1alpha1.Disruption{DrainTimeoutSeconds: 3600}
		}, []string{"spec.disruption.drainTimeoutSeconds", "less than or equal to 1200"}},
		{"drain timeout negative", func(m *v1alpha1.Machine) {
			m.Spec.Disruption = &v1alpha1.Disruption{DrainTimeoutSeconds: -1}
		}, []string{"spec.disruption.drainTimeoutSeconds", "greater than or equal to 1"}},
		{"drain mode", func(m *v1alpha1.Machine) {
			m.Spec.Disruption = &v1alpha1.Disruption{Drain: "Sometimes"}
		}, []string{"spec.disruption.drain", "Evict", "None"}},
		{"drain timeout action", func(m *v1alpha1.Machine) {
			m.Spec.Disruption = &v1alpha1.Disruption{OnDrainTimeout: "Later"}
		}, []string{"spec.disruption.onDrainTimeout", "Fail", "Force"}},
		// spec.node.devices: the kind, paths under /dev, no repeats, a bounded list.
		{"devices gpus", func(m *v1alpha1.Machine) { m.Spec.Node.Devices = &v1alpha1.Devices{GPUs: "AMD"} },
			[]string{"spec.node.devices.gpus", "None", "NVIDIA"}},
		{"device outside /dev", func(m *v1alpha1.Machine) {
			m.Spec.Node.Devices = &v1alpha1.Devices{Paths: []v1alpha1.DevicePath{"/etc/shadow"}}
		}, []string{"spec.node.devices.paths[0]", "must be a device node under /dev"}},
		{"device path with ..", func(m *v1alpha1.Machine) {
			m.Spec.Node.Devices = &v1alpha1.Devices{Paths: []v1alpha1.DevicePath{"/dev/fuse", "/dev/../etc/shadow"}}
		}, []string{"spec.node.devices.paths[1]", "no '.' or '..' parts"}},
		{"device twice", func(m *v1alpha1.Machine) {
			m.Spec.Node.Devices = &v1alpha1.Devices{Paths: []v1alpha1.DevicePath{"/dev/fuse", "/dev/fuse"}}
		}, []string{"spec.node.devices.paths[1]", "Duplicate value"}},
		{"too many devices", func(m *v1alpha1.Machine) {
			m.Spec.Node.Devices = &v1alpha1.Devices{}
			for i := range 33 {
				m.Spec.Node.Devices.Paths = append(m.Spec.Node.Devices.Paths, v1alpha1.DevicePath(fmt.Sprintf("/dev/d%d", i)))
			}
		}, []string{"spec.node.devices.paths", "must have at most 32 items"}},
		{"machine name", func(m *v1alpha1.Machine) { m.Name = "api.bad.name" },
			[]string{"metadata.name must be the host's machine name"}},
	}
	for _, tc := range machineCases {
		m := rig.SampleMachine("api-invalid", "api-invalid")
		tc.mutate(m)
		_, err := admin.CreateMachine(ctx, m)
		rig.WantRejected(t, "Machine: "+tc.name, err, apierrors.IsInvalid, tc.want...)
	}

	sel := &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": "x"}}
	opCases := []struct {
		name   string
		mutate func(*v1alpha1.MachineOperation)
		want   []string
	}{
		{"both targets", func(op *v1alpha1.MachineOperation) { op.Spec.MachineSelector = sel },
			[]string{"spec.machineRef and spec.machineSelector", "exactly one"}},
		{"no target", func(op *v1alpha1.MachineOperation) { op.Spec.MachineRef = nil },
			[]string{"spec.machineRef and spec.machineSelector", "exactly one"}},
		{"empty selector", func(op *v1alpha1.MachineOperation) {
			op.Spec.MachineRef, op.Spec.MachineSelector = nil, &v1alpha1.MachineSelector{}
		}, []string{"spec.machineSelector", "at least one label"}},
		{"In without values", func(op *v1alpha1.MachineOperation) {
			op.Spec.MachineRef = nil
			op.Spec.MachineSelector = &v1alpha1.MachineSelector{MatchExpressions: []v1alpha1.SelectorRequirement{{Key: "k", Operator: v1alpha1.SelectorIn}}}
		}, []string{"spec.machineSelector.matchExpressions[0]", "values must be non-empty"}},
		{"AgentUpgrade without parameters", func(op *v1alpha1.MachineOperation) { op.Spec.Type = v1alpha1.OperationAgentUpgrade },
			[]string{"spec.parameters.bundleURL and spec.parameters.bundleSHA256 are required"}},
		{"AgentUpgrade without sha256", func(op *v1alpha1.MachineOperation) {
			op.Spec.Type = v1alpha1.OperationAgentUpgrade
			op.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "https://dl.example.com/b.tgz"}
		}, []string{"spec.parameters.bundleURL and spec.parameters.bundleSHA256 are required"}},
		{"AgentUpgrade bad sha256", func(op *v1alpha1.MachineOperation) {
			op.Spec.Type = v1alpha1.OperationAgentUpgrade
			op.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "https://dl.example.com/b.tgz", BundleSHA256: "abc"}
		}, []string{"spec.parameters.bundleSHA256", "sha256 digest"}},
		{"AgentUpgrade ftp URL", func(op *v1alpha1.MachineOperation) {
			op.Spec.Type = v1alpha1.OperationAgentUpgrade
			op.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "ftp://dl.example.com/b.tgz", BundleSHA256: rig.SampleSHA}
		}, []string{"spec.parameters.bundleURL", "http or https URL"}},
		{"parameters on a restart", func(op *v1alpha1.MachineOperation) {
			op.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "https://dl.example.com/b.tgz", BundleSHA256: rig.SampleSHA}
		}, []string{"spec.parameters is only for spec.type AgentUpgrade"}},
		{"unknown type", func(op *v1alpha1.MachineOperation) { op.Spec.Type = "Reboot" },
			[]string{"spec.type", "NodeRestart"}},
		{"negative ttl", func(op *v1alpha1.MachineOperation) { v := int32(-1); op.Spec.TTLSecondsAfterFinished = &v },
			[]string{"spec.ttlSecondsAfterFinished"}},
	}
	for _, tc := range opCases {
		op := rig.SampleOperation("api-invalid-op", v1alpha1.OperationNodeRestart)
		tc.mutate(op)
		_, err := admin.CreateOperation(ctx, op)
		rig.WantRejected(t, "MachineOperation: "+tc.name, err, apierrors.IsInvalid, tc.want...)
	}

	// immutability, on update: an operation's spec, a Machine's node name
	op, err := admin.CreateOperation(ctx, rig.SampleOperation("api-immutable", v1alpha1.OperationNodeRestart))
	if err != nil {
		t.Fatal(err)
	}
	op.Spec.Type = v1alpha1.OperationRepave
	_, err = admin.UpdateOperation(ctx, op)
	rig.WantRejected(t, "operation spec change", err, apierrors.IsInvalid, "spec.type is immutable")

	m, err := admin.CreateMachine(ctx, rig.SampleMachine("api-immutable", "api-immutable"))
	if err != nil {
		t.Fatal(err)
	}
	m.Spec.NodeName = "someone-else"
	_, err = admin.UpdateMachine(ctx, m)
	rig.WantRejected(t, "Machine nodeName change", err, apierrors.IsInvalid, "spec.nodeName", "is immutable")
}

func TestAPIStatusSubresource(t *testing.T) {
	cp := rig.NeedAPI(t)
	ctx := rig.APICtx(t)
	admin := rig.AdminAPI(t, cp)

	m, err := admin.CreateMachine(ctx, rig.SampleMachine("api-status", "api-status"))
	if err != nil {
		t.Fatal(err)
	}
	gen := m.Generation

	// A status write carrying a changed spec changes only the status.
	m.Spec.Paused = false
	m.Status = v1alpha1.MachineStatus{Phase: v1alpha1.MachineReady, ActiveSlot: "a", AgentVersion: "v1.2.3", ObservedGeneration: gen}
	got := &v1alpha1.Machine{}
	if err := admin.REST().Put().Resource(v1alpha1.MachinesResource).Name(m.Name).SubResource("status").Body(m).Do(ctx).Into(got); err != nil {
		t.Fatalf("status update: %v", err)
	}
	if !got.Spec.Paused || got.Generation != gen {
		t.Errorf("a status write changed the spec: paused=%v generation %d -> %d", got.Spec.Paused, gen, got.Generation)
	}
	if got.Status.Phase != v1alpha1.MachineReady || got.Status.ActiveSlot != "a" {
		t.Errorf("status not written: %+v", got.Status)
	}

	// A spec write carrying a changed status changes only the spec.
	got.Spec.Paused = false
	got.Status.Phase = v1alpha1.MachineDegraded
	upd, err := admin.UpdateMachine(ctx, got)
	if err != nil {
		t.Fatalf("spec update: %v", err)
	}
	if upd.Spec.Paused || upd.Generation != gen+1 {
		t.Errorf("spec not written: paused=%v generation %d -> %d", upd.Spec.Paused, gen, upd.Generation)
	}
	if upd.Status.Phase != v1alpha1.MachineReady {
		t.Errorf("a spec write changed the status: phase %q", upd.Status.Phase)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
