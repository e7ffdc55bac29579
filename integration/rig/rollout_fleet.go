package rig

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/clusterinstall"
)

// Enroll enrolls the Machines in the fleet as a cluster admin does (kubeslot cluster enroll).
func Enroll(t testing.TB, ctx context.Context, cp *kube.ControlPlane, machines ...string) {
	t.Helper()
	if _, err := clusterinstall.Enroll(ctx, cp.AdminConfig(), machines, true, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("enroll %v: %v", machines, err)
	}
}

func DescribeOp(op *v1alpha1.MachineOperation) string {
	if op == nil {
		return "none"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s done=%d inProgress=%d waiting=%d failed=%d %q", op.Status.Phase, op.Status.Done, op.Status.InProgress,
		op.Status.Waiting, op.Status.Failed, op.Status.Message)
	for _, e := range op.Status.Machines {
		fmt.Fprintf(&b, "\n  %s %s %q", e.Name, e.Phase, e.Message)
	}
	return b.String()
}
