// Package cachekeep decides what kubeslot's artifact cache (lib/artifact:
// <base>/cache/sha256, oci and trees) must keep, and prunes the rest. An entry stays while one of these names its digest:
//
//   - a slot's applied configuration (<base>/applied/<slot>.json): its
//     rootfs, kubelet (pinned or explicit), containerd, runc, CNI plugins and
//     preload images (config.Digests);
//   - a pending or claimed repave request's desired configuration, and the
//     repave transition's (<base>/state/repave.json: a repave by hand or one
//     resumed after a kill);
//   - a pending or claimed upgrade request's bundle (an interrupted upgrade
//     resumes from it).
//
// Installed releases (<base>/releases) are unpacked bundles and use nothing
// in the cache; a finished upgrade's bundle goes once its claimed request
// is gone. Restart and reset requests name no artifacts.
//
// Every caller holds the installation lock, which every writer of the cache
// holds too: nothing is being written while the cache is pruned. Imported by
// the stages that download into the cache: lib/bootstrap, lib/repave and
// lib/upgrade only.
package cachekeep

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"github.com/kubeslot/kubeslot/lib/artifact"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/repave/repavestate"
	"github.com/kubeslot/kubeslot/lib/requests"
	"github.com/kubeslot/kubeslot/lib/state"
)

// InUse lists the digests the host still needs (see the package comment).
// An error means something that could name a digest cannot be read: the
// caller must not prune then.
func InUse(root *hostroot.Root) ([]string, error) {
	var keep []string
	store := state.NewStore(root)
	slots, err := appliedSlots(root)
	if err != nil {
		return nil, err
	}
	for _, slot := range slots {
		a, err := store.LoadApplied(slot)
		if errors.Is(err, state.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("applied configuration of slot %s: %w", slot, err)
		}
		keep = append(keep, a.Config.Digests()...)
	}
	reqs := requests.New(root)
	for _, kind := range []requests.Kind{requests.Repave, requests.Upgrade} {
		for _, read := range []func(requests.Kind) (*requests.Request, error){reqs.Pending, reqs.Claimed} {
			r, err := read(kind)
			if err != nil {
				return nil, fmt.Errorf("%s request: %w", kind, err)
			}
			switch {
			case r == nil:
			case r.Desired != nil:
				keep = append(keep, r.Desired.Digests()...)
			case r.Upgrade != nil:
				keep = append(keep, r.Upgrade.SHA256)
			}
		}
	}
	desired, err := repaveDesired(root)
	if err != nil {
		return nil, err
	}
	if desired != nil {
		keep = append(keep, desired.Digests()...)
	}
	// Optional artifacts leave empty digests behind in some callers' lists.
	out := keep[:0]
	for _, d := range keep {
		if d != "" {
			out = append(out, d)
		}
	}
	return out, nil
}

// Prune removes what killed writers left in the cache, then every entry
// InUse does not name. When InUse fails only the former happens, and the
// error says why the rest was kept. The caller holds the installation lock.
func Prune(root *hostroot.Root, log *slog.Logger) error {
	if err := artifact.RemoveStale(root, log); err != nil {
		return err
	}
	keep, err := InUse(root)
	if err != nil {
		return fmt.Errorf("artifact cache not pruned: %w", err)
	}
	return (&artifact.Fetcher{Root: root, Log: log}).Prune(keep)
}

// appliedSlots lists the slots with an applied configuration file.
func appliedSlots(root *hostroot.Root) ([]string, error) {
	dir, err := root.Path(hostroot.AppliedDir)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if name, ok := strings.CutSuffix(e.Name(), ".json"); ok && e.Type().IsRegular() {
			out = append(out, name)
		}
	}
	return out, nil
}

// repaveDesired is the desired configuration of the repave transition in
// progress, or nil when there is none (lib/repave writes the file).
func repaveDesired(root *hostroot.Root) (*config.Config, error) {
	st, err := repavestate.File.Load(root)
	if st == nil || err != nil {
		return nil, err
	}
	return st.Desired, nil
}
