package clusterinstall

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// ProbeNode is the node name the enforcement probe impersonates. No real
// node should carry it; the probe only ever makes dry-run requests.
const ProbeNode = "kubeslot-install-probe"

// WritesPolicy is the name of the admission policy without parameters.
const WritesPolicy = "kubeslot-agent-writes"

// waitEnforced waits until the admission policy refuses what it must. The
// apiserver reads policies through caches that lag the writes by a second
// or more, so Install would otherwise return while an enrolled node could
// still create another node's Machine. The probe is a dry-run create
// (admission runs, nothing is stored) of a Machine for another node, made
// as the node ProbeNode through impersonation. ProbeNode is enrolled
// nowhere, so RBAC would refuse it before admission looks: the probe also
// takes the group system:masters, which authorization lets through and
// admission does not exempt (the policy matches node user names). A caller
// who may not impersonate gets a warning instead of the wait.
func waitEnforced(ctx context.Context, cfg *rest.Config, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, EnforceTimeout)
	defer cancel()
	pcfg := rest.CopyConfig(cfg)
	pcfg.Impersonate = rest.ImpersonationConfig{UserName: v1alpha1.AgentUsername(ProbeNode), Groups: []string{v1alpha1.NodesGroup, "system:masters"}}
	dc, err := dynamic.NewForConfig(pcfg)
	if err != nil {
		return fmt.Errorf("cluster client: %w", err)
	}
	ri := dc.Resource(v1alpha1.SchemeGroupVersion.WithResource(v1alpha1.MachinesResource))
	probe := probeMachine()
	t0 := time.Now()
	last := "no answer yet"
	for {
		_, err := ri.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case err == nil:
			last = "the probe was admitted: the policy is not in force yet"
		case strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+WritesPolicy+"'") &&
			strings.Contains(err.Error(), "may create only its own Machine"):
			log.Debug("admission policy in force", "took", time.Since(t0).Round(time.Millisecond))
			return nil
		case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "cannot impersonate"):
			log.Warn("cannot check that the admission policy is in force: this identity may not impersonate a node; "+
				"the apiserver usually enforces a new policy within seconds", "err", err.Error())
			return nil
		case strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+WritesPolicy+"'"):
			// the policy answers, but not as it should: a broken policy
			// does not heal by waiting
			return fmt.Errorf("admission policy %s is in force but failed its probe: %w", WritesPolicy, err)
		default:
			last = err.Error() // e.g. the CRD not served yet
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("admission policy %s not in force after %v: a node could still write another node's Machine (last probe: %s)",
				WritesPolicy, EnforceTimeout, last)
		case <-time.After(pollInterval):
		}
	}
}

// probeMachine is a valid Machine of another node than ProbeNode.
func probeMachine() *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       "Machine",
		"metadata":   map[string]any{"name": ProbeNode},
		"spec": map[string]any{
			"nodeName": ProbeNode + "-other",
			"node": map[string]any{
				"kubernetesVersion": "1.0.0",
				"rootfs": map[string]any{
					"source": "https://probe.invalid/rootfs",
					"sha256": strings.Repeat("0", 64),
				},
			},
		},
	}}
}
