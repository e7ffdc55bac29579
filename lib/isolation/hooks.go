package isolation

import (
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/isolation/nspawn"
)

// HookRecord is what the last pre-start hook gave the node: the kubelet's
// node address at that start, whether it was pinned, the host's kernel and
// resolver file (lib/isolation/nspawn/hooks.go). The watcher's post-start
// check compares the Node with it.
type HookRecord = nspawn.HookRecord

// LoadHookRecord reads the last pre-start hook's record; found is false
// when no hook ran yet (or the mode has none).
func LoadHookRecord(root *hostroot.Root) (HookRecord, bool, error) {
	return nspawn.LoadHookRecord(root)
}
