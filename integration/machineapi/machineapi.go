// Package machineapi is the rig's client for Machines and MachineOperations:
// lib/machineclient (what the agent and the CLI use) plus what only tests
// and the demo do — a cluster admin's writes (delete a Machine; create,
// update and delete an operation) and the reads by node and by watch that
// agent-access tests play with an agent's identity. Imported by
// integration/ and its helper packages only.
package machineapi

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/machineclient"
)

// Client is a machineclient.Client with the test-only requests.
type Client struct{ *machineclient.Client }

// New returns a Client for the cluster cfg points at (machineclient.New).
func New(cfg *rest.Config) (*Client, error) {
	c, err := machineclient.New(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{c}, nil
}

var parameterCodec = runtime.NewParameterCodec(machineclient.Scheme)

// MachineForNode finds the Machine whose spec.nodeName is nodeName (a field
// selector the CRD declares selectable). It returns a NotFound error when
// there is none, and an error naming them when there are several (only a
// cluster admin can make that happen).
func (c *Client) MachineForNode(ctx context.Context, nodeName string) (*v1alpha1.Machine, error) {
	l := &v1alpha1.MachineList{}
	opts := &metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String()}
	err := c.REST().Get().Resource(v1alpha1.MachinesResource).VersionedParams(opts, parameterCodec).Do(ctx).Into(l)
	if err != nil {
		return nil, fmt.Errorf("find the Machine of node %s: %w", nodeName, err)
	}
	switch len(l.Items) {
	case 0:
		return nil, fmt.Errorf("find the Machine of node %s: %w", nodeName,
			apierrors.NewNotFound(v1alpha1.Resource(v1alpha1.MachinesResource), "spec.nodeName="+nodeName))
	case 1:
		return &l.Items[0], nil
	}
	names := make([]string, len(l.Items))
	for i := range l.Items {
		names[i] = l.Items[i].Name
	}
	return nil, fmt.Errorf("find the Machine of node %s: several Machines name it (%s); a cluster admin must delete all but one",
		nodeName, strings.Join(names, ", "))
}

// WatchMachine watches the one Machine name (field selector metadata.name),
// from resourceVersion on ("" for the current state first). The caller
// stops the watch; it also ends with ctx.
func (c *Client) WatchMachine(ctx context.Context, name, resourceVersion string) (watch.Interface, error) {
	opts := &metav1.ListOptions{
		FieldSelector:       fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion:     resourceVersion,
		Watch:               true,
		AllowWatchBookmarks: true,
	}
	w, err := c.REST().Get().Resource(v1alpha1.MachinesResource).VersionedParams(opts, parameterCodec).Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch Machine %s: %w", name, err)
	}
	return w, nil
}

// OperationsFor lists the operations that target m (by machineRef or by a
// selector matching its labels), and the resourceVersion of the list. The
// server cannot filter selectors, so this filters here.
func (c *Client) OperationsFor(ctx context.Context, m *v1alpha1.Machine) ([]v1alpha1.MachineOperation, string, error) {
	l, err := c.ListOperations(ctx)
	if err != nil {
		return nil, "", err
	}
	var out []v1alpha1.MachineOperation
	for i := range l.Items {
		if ok, _ := l.Items[i].Targets(m); ok {
			out = append(out, l.Items[i])
		}
	}
	return out, l.ResourceVersion, nil
}

// WatchOperationsFor watches the operations from resourceVersion on and
// passes on the events of those that target m (as m is now: a relabelled
// Machine needs a new watch). Bookmarks and errors pass through. Deleted
// operations pass too, so the caller can forget them.
func (c *Client) WatchOperationsFor(ctx context.Context, m *v1alpha1.Machine, resourceVersion string) (watch.Interface, error) {
	opts := &metav1.ListOptions{ResourceVersion: resourceVersion, Watch: true, AllowWatchBookmarks: true}
	w, err := c.REST().Get().Resource(v1alpha1.MachineOperationsResource).VersionedParams(opts, parameterCodec).Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch MachineOperations: %w", err)
	}
	machine := m.DeepCopy()
	return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
		op, ok := ev.Object.(*v1alpha1.MachineOperation)
		if !ok || ev.Type == watch.Deleted {
			return ev, true
		}
		t, _ := op.Targets(machine)
		return ev, t
	}), nil
}

// DeleteMachine deletes the Machine name.
func (c *Client) DeleteMachine(ctx context.Context, name string) error {
	err := c.REST().Delete().Resource(v1alpha1.MachinesResource).Name(name).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("delete Machine %s: %w", name, err)
	}
	return nil
}

// CreateOperation creates op.
func (c *Client) CreateOperation(ctx context.Context, op *v1alpha1.MachineOperation) (*v1alpha1.MachineOperation, error) {
	out := &v1alpha1.MachineOperation{}
	err := c.REST().Post().Resource(v1alpha1.MachineOperationsResource).Body(op).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("create MachineOperation %s: %w", op.Name, err)
	}
	return out, nil
}

// UpdateOperation replaces op (only its metadata may change: the spec is
// immutable), guarded by op's resourceVersion.
func (c *Client) UpdateOperation(ctx context.Context, op *v1alpha1.MachineOperation) (*v1alpha1.MachineOperation, error) {
	out := &v1alpha1.MachineOperation{}
	err := c.REST().Put().Resource(v1alpha1.MachineOperationsResource).Name(op.Name).Body(op).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("update MachineOperation %s: %w", op.Name, err)
	}
	return out, nil
}

// DeleteOperation deletes the MachineOperation name.
func (c *Client) DeleteOperation(ctx context.Context, name string) error {
	err := c.REST().Delete().Resource(v1alpha1.MachineOperationsResource).Name(name).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("delete MachineOperation %s: %w", name, err)
	}
	return nil
}
