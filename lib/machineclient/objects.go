package machineclient

import (
	"context"
	"fmt"

	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// REST is the underlying REST client, for requests the helpers do not cover.
func (c *Client) REST() rest.Interface { return c.rest }

// UpdateMachine replaces the Machine m (spec and metadata; the status in m
// is ignored by the apiserver), guarded by m's resourceVersion. It is for
// cluster admins and their tools (lib/clusterinstall): an agent's identity
// may not use it.
func (c *Client) UpdateMachine(ctx context.Context, m *v1alpha1.Machine) (*v1alpha1.Machine, error) {
	out := &v1alpha1.Machine{}
	err := c.rest.Put().Resource(v1alpha1.MachinesResource).Name(m.Name).Body(m).Do(ctx).Into(out)
	if err != nil {
		return nil, fmt.Errorf("update Machine %s: %w", m.Name, err)
	}
	return out, nil
}

// GetOperation reads the MachineOperation name.
func (c *Client) GetOperation(ctx context.Context, name string) (*v1alpha1.MachineOperation, error) {
	op := &v1alpha1.MachineOperation{}
	if err := c.rest.Get().Resource(v1alpha1.MachineOperationsResource).Name(name).Do(ctx).Into(op); err != nil {
		return nil, fmt.Errorf("get MachineOperation %s: %w", name, err)
	}
	return op, nil
}
