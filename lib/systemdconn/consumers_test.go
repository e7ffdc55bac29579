package systemdconn_test

import (
	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/reset"
	"github.com/kubeslot/kubeslot/lib/systemdconn"
	"github.com/kubeslot/kubeslot/lib/systemdconn/sdtest"
	"github.com/kubeslot/kubeslot/lib/upgrade"
)

// The one client, and its fake, implement every consumer's narrow
// interface.
var (
	_ hostapi.Systemd  = (*systemdconn.Client)(nil)
	_ reset.UnitLister = (*systemdconn.Client)(nil)
	_ upgrade.Systemd  = (*systemdconn.Client)(nil)

	_ hostapi.Systemd  = (*sdtest.Systemd)(nil)
	_ reset.UnitLister = (*sdtest.Systemd)(nil)
	_ upgrade.Systemd  = (*sdtest.Systemd)(nil)
)
