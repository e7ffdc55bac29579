package rig

import (
	"context"
	"fmt"
	"testing"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
)

// UnitState is the part of a unit's state the bootstrap unit's directives decide.
func UnitState(t *testing.T, ctx context.Context, c *sddbus.Conn, unit string) string {
	t.Helper()
	u, err := c.GetUnitPropertiesContext(ctx, unit)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.GetUnitTypePropertiesContext(ctx, unit, "Service")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("ActiveState=%v SubState=%v Result=%v NRestarts=%v ExecMainStatus=%v", u["ActiveState"], u["SubState"], s["Result"], s["NRestarts"], s["ExecMainStatus"])
}

func ServiceProperty(t *testing.T, ctx context.Context, c *sddbus.Conn, unit, name string) any {
	t.Helper()
	s, err := c.GetUnitTypePropertiesContext(ctx, unit, "Service")
	if err != nil {
		t.Fatal(err)
	}
	return s[name]
}
