package machineclient

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// The writes below are for cluster admins and their tools (and tests): an
// agent's identity may not use them, except CreateMachine for its own.

// REST is the underlying REST client, for requests the helpers do not cover.
func (c *Client) REST() rest.Interface { return c.rest }

// UpdateMachine replaces the Machine m (spec and metadata; the status in m
// is ignored by the apiserver), guarded by m's resourceVersion.
func (c *Client) UpdateMachine(ctx context.Context, m *v1alpha1.Machine) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Put().Resource(v1alpha1.MachinesResource).Name(m.Name).Body(m).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("update Machine %s: %w", m.Name, err)
	}
	return out, nil
}

// DeleteMachine deletes the Machine name.
func (c *Client) DeleteMachine(ctx context.Context, name string) error {
	err := c.rest.Delete().Resource(v1alpha1.MachinesResource).Name(name).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("delete Machine %s: %w", name, err)
	}
	return nil
}

// GetOperation reads the MachineOperation name.
func (c *Client) GetOperation(ctx context.Context, name string) (*v1alpha1.MachineOperation, error) {
	op := &v1alpha1.MachineOperation{}
	if err := c.rest.Get().Resource(v1alpha1.MachineOperationsResource).Name(name).Do(ctx).Into(op); err != nil {
		return nil, fmt.Errorf("get MachineOperation %s: %w", name, err)
	}
	return op, nil
}

// CreateOperation creates op.
func (c *Client) CreateOperation(ctx context.Context, op *v1alpha1.MachineOperation) (*v1alpha1.MachineOperation, error) {
	out := &v1alpha1.MachineOperation{}
	err := c.rest.Post().Resource(v1alpha1.MachineOperationsResource).Body(op).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("create MachineOperation %s: %w", op.Name, err)
	}
	return out, nil
}

// UpdateOperation replaces op (only its metadata may change: the spec is
// immutable), guarded by op's resourceVersion.
func (c *Client) UpdateOperation(ctx context.Context, op *v1alpha1.MachineOperation) (*v1alpha1.MachineOperation, error) {
	out := &v1alpha1.MachineOperation{}
	err := c.rest.Put().Resource(v1alpha1.MachineOperationsResource).Name(op.Name).Body(op).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("update MachineOperation %s: %w", op.Name, err)
	}
	return out, nil
}

// DeleteOperation deletes the MachineOperation name.
func (c *Client) DeleteOperation(ctx context.Context, name string) error {
	err := c.rest.Delete().Resource(v1alpha1.MachineOperationsResource).Name(name).Do(ctx).Error()
	if err != nil {
		return fmt.Errorf("delete MachineOperation %s: %w", name, err)
	}
	return nil
}
