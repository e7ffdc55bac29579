package integration

// Tests of kubeslot's cluster API (lib/api/v1alpha1, lib/clusterinstall, lib/machineclient) against the rig's real
// kube-apiserver. This file: the shared setup (the API is installed once per test binary, see needAPI), schema and CEL
// validation, and the status subresource. api_agents_test.go: what each agent's identity may do; api_install_test.go:
// kubectl's view, and `kubeslot cluster install|uninstall`.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/fleet"
	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
)

var apiInstall struct {
	once sync.Once
	err  error
}

// needAPI returns the shared control plane with the cluster API installed (once per binary: the apiextensions
// handler delays requests for a while after a CRD is established, so reinstalling per test would be slow).
func needAPI(t *testing.T) *kube.ControlPlane {
	t.Helper()
	cp := needCluster(t)
	apiInstall.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		t0 := time.Now()
		_, apiInstall.err = clusterinstall.Install(ctx, cp.AdminConfig(), apiLog(t))
		if apiInstall.err == nil {
			figures.Add("cluster API install", time.Since(t0))
			t1 := time.Now()
			apiInstall.err = waitTargetPolicy(ctx, cp)
			figures.Add("cluster API: operation policy in force", time.Since(t1))
		}
	})
	if apiInstall.err != nil {
		t.Fatalf("install the cluster API: %v", apiInstall.err)
	}
	return cp
}

func apiLog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func apiCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func adminAPI(t *testing.T, cp *kube.ControlPlane) *machineapi.Client {
	t.Helper()
	c, err := machineapi.New(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// nodeAPI is a client with the identity an agent of an enrolled node has: the node's kubelet client certificate,
// the node bound to kubeslot:fleet-member (enrollNode).
func nodeAPI(t testing.TB, cp *kube.ControlPlane, node string) *machineapi.Client {
	t.Helper()
	enrollNode(t, cp, node)
	return outsiderAPI(t, cp, node)
}

// enrollNode enrolls node as an administrator does before its host joins (kubeslot cluster enroll with no Machine
// yet), once the apiserver's authorizer lets it register its Machine.
func enrollNode(t testing.TB, cp *kube.ControlPlane, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fleet.Enroll(ctx, cp, node); err != nil {
		t.Fatal(err)
	}
}

// outsiderAPI is a client with the identity of a node no administrator enrolled: its kubelet client certificate
// alone.
func outsiderAPI(t testing.TB, cp *kube.ControlPlane, node string) *machineapi.Client {
	t.Helper()
	cert, key, err := cp.NodeClientCert(node)
	if err != nil {
		t.Fatal(err)
	}
	c, err := machineapi.New(cp.CertConfig(cert, key))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// waitTargetPolicy waits until the policy with Machines as parameters is in force. The apiserver starts an informer
// for its parameter kind only once it resolves the new CRD's kind, a little after the policy appears, and
// clusterinstall probes only the other policy. The probe is a dry-run delete (nothing is deleted) by a node of a
// finished operation for another node's Machine, through an entry of its own: only that policy refuses it.
func waitTargetPolicy(ctx context.Context, cp *kube.ControlPlane) error {
	admin, err := machineapi.New(cp.AdminConfig())
	if err != nil {
		return err
	}
	const node, prober = "api-probe", "api-probe-other"
	if _, err := admin.CreateMachine(ctx, testMachine(node, node)); err != nil {
		return err
	}
	op := testOperation("api-probe-op", v1alpha1.OperationNodeRestart)
	op.Spec.MachineRef = &v1alpha1.MachineReference{Name: node}
	ttl := int32(3600)
	op.Spec.TTLSecondsAfterFinished = &ttl
	if _, err := admin.CreateOperation(ctx, op); err != nil {
		return err
	}
	defer func() {
		_ = admin.DeleteOperation(context.WithoutCancel(ctx), op.Name)
		_ = admin.DeleteMachine(context.WithoutCancel(ctx), node)
	}()
	if _, err := admin.UpdateOperationStatus(ctx, op.Name, func(o *v1alpha1.MachineOperation) error {
		now := metav1.NewTime(time.Now())
		v1alpha1.SetMachineResult(o, v1alpha1.MachineOperationTarget{Name: node, NodeName: prober,
			Phase: v1alpha1.OperationSucceeded, StartTime: &now, CompletionTime: &now}, nil)
		return nil
	}); err != nil {
		return err
	}
	// Enrolled, or RBAC refuses the delete before the policy sees it.
	if err := fleet.Enroll(ctx, cp, prober); err != nil {
		return err
	}
	cert, key, err := cp.NodeClientCert(prober)
	if err != nil {
		return err
	}
	agent, err := machineapi.New(cp.CertConfig(cert, key))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var last error
	for {
		last = agent.REST().Delete().Resource(v1alpha1.MachineOperationsResource).Name(op.Name).
			Param("dryRun", "All").Do(ctx).Error()
		if last != nil && strings.Contains(last.Error(), "which belongs to node") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("policy kubeslot-agent-operation-targets not in force after 1m (last probe: %v)", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

const (
	testSHA  v1alpha1.SHA256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testSHA2 v1alpha1.SHA256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
)

// nodeMachine is testMachine as a node may create it for itself: no labels (only a cluster admin sets them).
func nodeMachine(name, node string) *v1alpha1.Machine {
	m := testMachine(name, node)
	m.Labels = nil
	return m
}

// testMachine is a valid Machine with every spec field set, as a cluster admin makes it: enrolled in the fleet.
func testMachine(name, node string) *v1alpha1.Machine {
	art := func(n string) *v1alpha1.Artifact {
		return &v1alpha1.Artifact{URL: v1alpha1.URL("https://dl.example.com/" + n + "?sig=abc"), SHA256: testSHA2}
	}
	return &v1alpha1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": name, v1alpha1.LabelEnrolled: "true"}},
		Spec: v1alpha1.MachineSpec{
			NodeName: node,
			Node: v1alpha1.NodeConfig{
				KubernetesVersion: "1.37.2",
				RootFS:            v1alpha1.RootFS{Source: "https://dl.example.com/rootfs.tar.zst", SHA256: testSHA},
				Artifacts:         &v1alpha1.Artifacts{Kubelet: art("kubelet"), Containerd: art("containerd"), Runc: art("runc"), CNIPlugins: art("cni")},
				Labels:            map[string]v1alpha1.LabelValue{"example.com/rack": "r1", "tier": ""},
				Taints:            []v1alpha1.Taint{"dedicated=gpu:NoSchedule", "example.com/maint:NoExecute", "k=:PreferNoSchedule"},
			},
			Paused:       true,
			UpdatePolicy: v1alpha1.UpdateImmediate,
		},
	}
}

func testOperation(name string, typ v1alpha1.OperationType) *v1alpha1.MachineOperation {
	ttl := int32(600)
	return &v1alpha1.MachineOperation{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.MachineOperationSpec{
			MachineRef:              &v1alpha1.MachineReference{Name: "api-valid"},
			Type:                    typ,
			TTLSecondsAfterFinished: &ttl,
		},
	}
}

func TestAPIValidObjectsAccepted(t *testing.T) {
	cp := needAPI(t)
	ctx := apiCtx(t)
	admin := adminAPI(t, cp)

	m := testMachine("api-valid", "api-valid.example.com")
	m.Spec.Node.Devices = &v1alpha1.Devices{GPUs: v1alpha1.GPUsNVIDIA, Paths: []v1alpha1.DevicePath{"/dev/fuse", "/dev/dri/renderD128"}}
	m.Spec.Node.KubernetesRelease = &v1alpha1.KubernetesRelease{Mirror: "https://dl.example.com/release", KubeletSHA256: testSHA}
	got, err := admin.CreateMachine(ctx, m)
	if err != nil {
		t.Fatalf("a valid Machine was refused: %v", err)
	}
	if a, b := mustJSON(t, got.Spec), mustJSON(t, m.Spec); a != b {
		t.Errorf("spec changed on the way:\n got %s\nwant %s", a, b)
	}
	// defaulting: no update policy means OnNodeDelete
	m2 := testMachine("api-valid-2", "api-valid-2")
	m2.Spec.UpdatePolicy = ""
	m2.Spec.Node.Artifacts = nil
	m2.Spec.Disruption = &v1alpha1.Disruption{DeleteEmptyDirData: true}
	if got, err := admin.CreateMachine(ctx, m2); err != nil {
		t.Fatalf("a minimal Machine was refused: %v", err)
	} else if got.Spec.UpdatePolicy != v1alpha1.UpdateOnNodeDelete {
		t.Errorf("updatePolicy defaulted to %q, want %q", got.Spec.UpdatePolicy, v1alpha1.UpdateOnNodeDelete)
	} else if d := got.Spec.Disruption; d.DrainTimeoutSeconds != 120 || d.OnDrainTimeout != v1alpha1.DrainTimeoutFail || !d.DeleteEmptyDirData ||
		d.Drain != v1alpha1.DrainEvict {
		t.Errorf("spec.disruption defaulted to %+v, want Evict, 120 s, Fail, and deleteEmptyDirData kept", *d)
	}

	ops := []*v1alpha1.MachineOperation{
		testOperation("api-valid-restart", v1alpha1.OperationNodeRestart),
		testOperation("api-valid-reset", v1alpha1.OperationAgentReset),
	}
	sel := testOperation("api-valid-repave", v1alpha1.OperationRepave)
	sel.Spec.MachineRef = nil
	sel.Spec.MachineSelector = &v1alpha1.MachineSelector{
		MatchLabels: map[string]string{"pool": "api-valid"},
		MatchExpressions: []v1alpha1.SelectorRequirement{
			{Key: "zone", Operator: v1alpha1.SelectorIn, Values: []string{"a", "b"}},
			{Key: "example.com/drain", Operator: v1alpha1.SelectorDoesNotExist},
		},
	}
	up := testOperation("api-valid-upgrade", v1alpha1.OperationAgentUpgrade)
	up.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "http://10.0.0.1:8080/kubeslot-1.2.3.tar.gz", BundleSHA256: testSHA}
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
	cp := needAPI(t)
	ctx := apiCtx(t)
	admin := adminAPI(t, cp)

	machineCases := []struct {
		name   string
		mutate func(*v1alpha1.Machine)
		want   []string // substrings of the error: the field, and what is wrong
	}{
		{"short sha256", func(m *v1alpha1.Machine) { m.Spec.Node.RootFS.SHA256 = testSHA[:63] },
			[]string{"spec.node.rootfs.sha256", "64 lowercase hexadecimal"}},
		{"uppercase sha256", func(m *v1alpha1.Machine) {
			m.Spec.Node.RootFS.SHA256 = v1alpha1.SHA256(strings.ToUpper(string(testSHA)))
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
		m := testMachine("api-invalid", "api-invalid")
		tc.mutate(m)
		_, err := admin.CreateMachine(ctx, m)
		wantRejected(t, "Machine: "+tc.name, err, apierrors.IsInvalid, tc.want...)
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
			op.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "ftp://dl.example.com/b.tgz", BundleSHA256: testSHA}
		}, []string{"spec.parameters.bundleURL", "http or https URL"}},
		{"parameters on a restart", func(op *v1alpha1.MachineOperation) {
			op.Spec.Parameters = &v1alpha1.OperationParameters{BundleURL: "https://dl.example.com/b.tgz", BundleSHA256: testSHA}
		}, []string{"spec.parameters is only for spec.type AgentUpgrade"}},
		{"unknown type", func(op *v1alpha1.MachineOperation) { op.Spec.Type = "Reboot" },
			[]string{"spec.type", "NodeRestart"}},
		{"negative ttl", func(op *v1alpha1.MachineOperation) { v := int32(-1); op.Spec.TTLSecondsAfterFinished = &v },
			[]string{"spec.ttlSecondsAfterFinished"}},
	}
	for _, tc := range opCases {
		op := testOperation("api-invalid-op", v1alpha1.OperationNodeRestart)
		tc.mutate(op)
		_, err := admin.CreateOperation(ctx, op)
		wantRejected(t, "MachineOperation: "+tc.name, err, apierrors.IsInvalid, tc.want...)
	}

	// immutability, on update: an operation's spec, a Machine's node name
	op, err := admin.CreateOperation(ctx, testOperation("api-immutable", v1alpha1.OperationNodeRestart))
	if err != nil {
		t.Fatal(err)
	}
	op.Spec.Type = v1alpha1.OperationRepave
	_, err = admin.UpdateOperation(ctx, op)
	wantRejected(t, "operation spec change", err, apierrors.IsInvalid, "spec.type is immutable")

	m, err := admin.CreateMachine(ctx, testMachine("api-immutable", "api-immutable"))
	if err != nil {
		t.Fatal(err)
	}
	m.Spec.NodeName = "someone-else"
	_, err = admin.UpdateMachine(ctx, m)
	wantRejected(t, "Machine nodeName change", err, apierrors.IsInvalid, "spec.nodeName", "is immutable")
}

func TestAPIStatusSubresource(t *testing.T) {
	cp := needAPI(t)
	ctx := apiCtx(t)
	admin := adminAPI(t, cp)

	m, err := admin.CreateMachine(ctx, testMachine("api-status", "api-status"))
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

func wantRejected(t *testing.T, what string, err error, kind func(error) bool, want ...string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: accepted, want it refused", what)
		return
	}
	if !kind(err) {
		t.Errorf("%s: wrong kind of error (%s): %v", what, apierrors.ReasonForError(err), err)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%s: message does not contain %q:\n%v", what, w, err)
			return
		}
	}
	t.Logf("%s: refused: %v", what, err)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
