package nodeclient

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/lib/config"
)

// SetLabels makes the Node carry the labels set and not those named in
// drop, with a JSON merge patch of its labels sent with the node's own
// identity: NodeRestriction lets a node label itself, except under
// node-restriction.kubernetes.io/ (lib/config refuses those). A label to
// drop that is not there is fine; other labels are left alone.
func (c *Client) SetLabels(ctx context.Context, cfg *config.Config, set map[string]string, drop []string) error {
	if len(set) == 0 && len(drop) == 0 {
		return nil
	}
	cs, err := c.clientset(cfg)
	if err != nil {
		return err
	}
	labels := map[string]*string{}
	for _, k := range drop {
		labels[k] = nil
	}
	for k, v := range set {
		labels[k] = &v
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	node := cfg.Machine.NodeName
	for {
		_, err = cs.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "kubeslot"})
		if err == nil || apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) {
			break
		}
		select { // a transient failure: the apiserver may be busy right after the node came back
		case <-ctx.Done():
			return fmt.Errorf("patch the labels of Node %s: %w; last: %v", node, context.Cause(ctx), err)
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("patch the labels of Node %s: %w", node, err)
	}
	return nil
}
