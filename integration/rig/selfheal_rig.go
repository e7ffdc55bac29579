package rig

import (
	"context"

	"github.com/kubeslot/kubeslot/units"
)

// WatcherTail is the end of the watcher's journal, for failure messages.
func (r *RepaveRig) WatcherTail(ctx context.Context) string {
	j, _ := r.H.Journal(ctx, units.Watcher)
	return TailLines(j, 20)
}
