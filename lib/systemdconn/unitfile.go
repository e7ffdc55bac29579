package systemdconn

import (
	"context"
	"fmt"
)

// UnitFileState returns a unit's enablement as systemd reports it
// ("enabled", "disabled", "static", ...; "" for a unit it has no file
// of), read only (lib/verify: `kubeslot verify`).
func (c *Client) UnitFileState(ctx context.Context, name string) (string, error) {
	cn, err := c.get(ctx)
	if err != nil {
		return "", err
	}
	p, err := cn.sd.GetUnitPropertyContext(ctx, name, "UnitFileState")
	if err != nil {
		return "", fmt.Errorf("unit file state of %s: %w", name, err)
	}
	s, _ := p.Value.Value().(string)
	return s, nil
}
