package rig

import (
	"context"
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

var APIInstall struct {
	Once sync.Once
	Err  error
}

// NeedAPI returns the shared control plane with the cluster API installed (once per binary: the apiextensions
// handler delays requests for a while after a CRD is established, so reinstalling per test would be slow).
func NeedAPI(t *testing.T) *kube.ControlPlane {
	t.Helper()
	cp := NeedCluster(t)
	APIInstall.Once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		t0 := time.Now()
		_, APIInstall.Err = clusterinstall.Install(ctx, cp.AdminConfig(), APILog(t))
		if APIInstall.Err == nil {
			Figures.Add("cluster API install", time.Since(t0))
			t1 := time.Now()
			APIInstall.Err = WaitTargetPolicy(ctx, cp)
			Figures.Add("cluster API: operation policy in force", time.Since(t1))
		}
	})
	if APIInstall.Err != nil {
		t.Fatalf("install the cluster API: %v", APIInstall.Err)
	}
	return cp
}

func APILog(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func APICtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func AdminAPI(t *testing.T, cp *kube.ControlPlane) *machineapi.Client {
	t.Helper()
	c, err := machineapi.New(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// NodeAPI is a client with the identity an agent of an enrolled node has: the node's kubelet client certificate,
// the node bound to kubeslot:fleet-member (EnrollNode).
func NodeAPI(t testing.TB, cp *kube.ControlPlane, node string) *machineapi.Client {
	t.Helper()
	EnrollNode(t, cp, node)
	return OutsiderAPI(t, cp, node)
}

// EnrollNode enrolls node as an administrator does before its host joins (kubeslot cluster enroll with no Machine
// yet), once the apiserver's authorizer lets it register its Machine.
func EnrollNode(t testing.TB, cp *kube.ControlPlane, node string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := fleet.Enroll(ctx, cp, node); err != nil {
		t.Fatal(err)
	}
}

// OutsiderAPI is a client with the identity of a node no administrator enrolled: its kubelet client certificate
// alone.
func OutsiderAPI(t testing.TB, cp *kube.ControlPlane, node string) *machineapi.Client {
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

// WaitTargetPolicy waits until the policy with Machines as parameters is in force. The apiserver starts an informer
// for its parameter kind only once it resolves the new CRD's kind, a little after the policy appears, and
// clusterinstall probes only the other policy. The probe is a dry-run delete (nothing is deleted) by a node of a
// finished operation for another node's Machine, through an entry of its own: only that policy refuses it.
func WaitTargetPolicy(ctx context.Context, cp *kube.ControlPlane) error {
	admin, err := machineapi.New(cp.AdminConfig())
	if err != nil {
		return err
	}
	const node, prober = "api-probe", "api-probe-other"
	if _, err := admin.CreateMachine(ctx, SampleMachine(node, node)); err != nil {
		return err
	}
	op := SampleOperation("api-probe-op", v1alpha1.OperationNodeRestart)
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
	SampleSHA v1alpha1.SHA256 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	testSHA2  v1alpha1.SHA256 = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
)

// NodeMachine is SampleMachine as a node may create it for itself: no labels (only a cluster admin sets them).
func NodeMachine(name, node string) *v1alpha1.Machine {
	m := SampleMachine(name, node)
	m.Labels = nil
	return m
}

// SampleMachine is a valid Machine with every spec field set, as a cluster admin makes it: enrolled in the fleet.
func SampleMachine(name, node string) *v1alpha1.Machine {
	art := func(n string) *v1alpha1.Artifact {
		return &v1alpha1.Artifact{URL: v1alpha1.URL("https://dl.example.com/" + n + "?sig=abc"), SHA256: testSHA2}
	}
	return &v1alpha1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": name, v1alpha1.LabelEnrolled: "true"}},
		Spec: v1alpha1.MachineSpec{
			NodeName: node,
			Node: v1alpha1.NodeConfig{
				KubernetesVersion: "1.37.2",
				RootFS:            v1alpha1.RootFS{Source: "https://dl.example.com/rootfs.tar.zst", SHA256: SampleSHA},
				Artifacts:         &v1alpha1.Artifacts{Kubelet: art("kubelet"), Containerd: art("containerd"), Runc: art("runc"), CNIPlugins: art("cni")},
				Labels:            map[string]v1alpha1.LabelValue{"example.com/rack": "r1", "tier": ""},
				Taints:            []v1alpha1.Taint{"dedicated=gpu:NoSchedule", "example.com/maint:NoExecute", "k=:PreferNoSchedule"},
			},
			Paused:       true,
			UpdatePolicy: v1alpha1.UpdateImmediate,
		},
	}
}

func SampleOperation(name string, typ v1alpha1.OperationType) *v1alpha1.MachineOperation {
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

func WantRejected(t *testing.T, what string, err error, kind func(error) bool, want ...string) {
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
