package watcher

// Maintenance windows of a rollout: spec.rollout.windows on the operation
// and spec.maintenanceWindows on this agent's own Machine, both written by
// admins only. A target takes a slot only while both allow it; nothing any
// other node wrote is read.

import (
	"fmt"
	"time"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/window"
)

// parseWindows parses the windows of one spec field; the error names the
// field and the value.
func parseWindows(field string, in []v1alpha1.MaintenanceWindow) ([]window.Window, error) {
	out := make([]window.Window, 0, len(in))
	for i, w := range in {
		days := make([]string, len(w.Days))
		for j, d := range w.Days {
			days[j] = string(d)
		}
		p, err := window.Parse(fmt.Sprintf("%s[%d]", field, i), days, w.Start, w.Duration, w.TimeZone)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// windowGate says whether op's and Machine m's windows let a target start
// at now: closed is "" when they do, else why not, with when the next
// window opens; recheck is when that is (0: never). bad is a window that
// cannot be read.
func windowGate(op *v1alpha1.MachineOperation, m *v1alpha1.Machine, now time.Time) (closed string, recheck time.Duration, bad error) {
	sets := []struct {
		field string
		spec  []v1alpha1.MaintenanceWindow
	}{{"spec.rollout.windows", op.Spec.Rollout.Windows}, {"Machine " + m.Name + " spec.maintenanceWindows", m.Spec.MaintenanceWindows}}
	for _, s := range sets {
		if len(s.spec) == 0 {
			continue
		}
		ws, err := parseWindows(s.field, s.spec)
		if err != nil {
			return "", 0, err
		}
		open, change := window.State(ws, now)
		if open {
			continue
		}
		// The opening in the first window's zone, as the admin wrote it;
		// never a countdown, which would rewrite the entry on every pass.
		return fmt.Sprintf("outside the maintenance windows (%s): the next opens %s", s.field,
			change.In(ws[0].Loc).Format("Mon 2006-01-02 15:04 MST")), max(change.Sub(now), time.Second), nil
	}
	return "", 0, nil
}
