package hostprep

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

// Handles reports whether Undo reverses journal entries of kind: the kinds
// Apply records.
func Handles(kind ownership.Kind) bool {
	switch kind {
	case ownership.KindPackage, ownership.KindDir, ownership.KindModuleFile, ownership.KindSysctlFile, ownership.KindSwapOff,
		ownership.KindPodNetwork:
		return true
	}
	return false
}

// Undo reverses one journal entry Apply recorded; the resetter calls it for
// each entry, newest first. It is idempotent: what is already undone, or
// gone (an absent file, a swap file since deleted, a package since removed),
// is success. A sysctl value or a directory that someone else changed since
// is left as it is and logged.
func Undo(ctx context.Context, root *hostroot.Root, sys System, c ownership.Change, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch c.Kind {
	case ownership.KindModuleFile:
		return restoreFile(root, c, log)
	case ownership.KindSysctlFile:
		if err := restoreFile(root, c, log); err != nil {
			return err
		}
		return restoreSysctls(sys, c, log)
	case ownership.KindDir:
		return removeDir(root, c, log)
	case ownership.KindSwapOff:
		return swapOn(ctx, root, sys, c, log)
	case ownership.KindPackage:
		return removePackage(ctx, sys, c, log)
	case ownership.KindPodNetwork:
		if err := sys.RemovePodNetwork(ctx, c.Name); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Name, err)
		}
		log.Info("host change undone", "kind", c.Kind, "target", c.Name, "action", "link and CNI firewall chains removed")
		return nil
	}
	return fmt.Errorf("undo %s %s%s: not a kind of change host preparation makes", c.Kind, c.Path, c.Name)
}

// restoreFile puts back the prior file, or removes kubeslot's.
func restoreFile(root *hostroot.Root, c ownership.Change, log *slog.Logger) error {
	local, err := localPath(root, c.Path)
	if err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	switch c.Prior.State {
	case ownership.PriorAbsent:
		if _, err := os.Lstat(local); errors.Is(err, os.ErrNotExist) {
			return nil // already gone (so may its directory be)
		}
		if err := atomicfile.Remove(local); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "removed")
		return nil
	case ownership.PriorFile:
		if err := atomicfile.WriteFile(local, c.Prior.Content, c.Prior.Mode.Perm()); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		if err := os.Lchown(local, c.Prior.UID, c.Prior.GID); err != nil {
			return fmt.Errorf("undo %s %s: restore owner %d:%d: %w", c.Kind, c.Path, c.Prior.UID, c.Prior.GID, err)
		}
		log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "restored prior content", "bytes", len(c.Prior.Content))
		return nil
	}
	// Apply never replaces a link (and a sysctl entry's Value holds its
	// own data, not a link target).
	return fmt.Errorf("undo %s %s: prior state %q: host preparation never journals that; restore it by hand", c.Kind, c.Path, c.Prior.State)
}

// restoreSysctls writes back the runtime values kubeslot changed, where the
// key still holds kubeslot's value.
func restoreSysctls(sys System, c ownership.Change, log *slog.Logger) error {
	if c.Prior.Value == "" {
		return nil // kubeslot changed no runtime value
	}
	var changes map[string]sysctlChange
	if err := json.Unmarshal([]byte(c.Prior.Value), &changes); err != nil {
		return fmt.Errorf("undo %s %s: prior sysctl values %q: %w", c.Kind, c.Path, c.Prior.Value, err)
	}
	for _, k := range slices.Sorted(maps.Keys(changes)) {
		ch := changes[k]
		if err := checkSysctlValue(k, ch.Prior); err != nil {
			return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
		}
		cur, err := sys.ReadSysctl(k)
		switch {
		case isNotExist(err):
			log.Info("sysctl not restored: the key is gone (module unloaded?)", "key", k)
			continue
		case err != nil:
			return fmt.Errorf("undo sysctl %s: %w", k, err)
		case normValue(cur) != normValue(ch.Set):
			log.Info("sysctl not restored: changed since kubeslot set it", "key", k, "value", cur, "kubeslot_set", ch.Set, "prior", ch.Prior)
			continue
		}
		if err := sys.WriteSysctl(k, ch.Prior); err != nil {
			return fmt.Errorf("undo sysctl %s: %w", k, err)
		}
		log.Info("host change undone", "kind", KindSysctlValue, "target", k, "action", "restored", "value", ch.Prior)
	}
	return nil
}

// removeDir removes a directory kubeslot created, if it is empty: anything
// left in it is not kubeslot's (its own files are undone before, being
// journalled after the directory).
func removeDir(root *hostroot.Root, c ownership.Change, log *slog.Logger) error {
	if c.Prior.State != ownership.PriorAbsent {
		return nil
	}
	local, err := localPath(root, c.Path)
	if err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	fi, err := os.Lstat(local)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	case !fi.IsDir():
		log.Warn("not removed: no longer a directory kubeslot made", "kind", c.Kind, "target", c.Path)
		return nil
	}
	if err := os.Remove(local); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			log.Warn("directory kubeslot created not removed: it holds files kubeslot did not make", "kind", c.Kind, "target", c.Path)
			return nil
		}
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(local)); err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "removed")
	return nil
}

// swapOn turns a swap area kubeslot turned off back on.
func swapOn(ctx context.Context, root *hostroot.Root, sys System, c ownership.Change, log *slog.Logger) error {
	info := swapInfo{Priority: -1}
	if c.Prior.Value != "" {
		if err := json.Unmarshal([]byte(c.Prior.Value), &info); err != nil {
			return fmt.Errorf("undo %s %s: prior %q: %w", c.Kind, c.Path, c.Prior.Value, err)
		}
	}
	active, err := sys.ActiveSwaps()
	if err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	for _, sw := range active {
		if sw.Path == c.Path {
			return nil // on already (say, from fstab after a reboot)
		}
	}
	local, err := root.Resolve(c.Path)
	if err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	if _, err := os.Stat(local); errors.Is(err, os.ErrNotExist) {
		log.Info("swap not turned on: the device or file is gone", "target", c.Path)
		return nil
	}
	if err := sys.SwapOn(ctx, c.Path, info.Priority); err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Path, err)
	}
	log.Info("host change undone", "kind", c.Kind, "target", c.Path, "action", "swapon", "priority", info.Priority)
	return nil
}

// removePackage removes a package kubeslot installed (prior absent) and
// nothing else.
func removePackage(ctx context.Context, sys System, c ownership.Change, log *slog.Logger) error {
	if c.Prior.State != ownership.PriorAbsent {
		return nil // installed before kubeslot: never removed
	}
	ok, err := sys.PackageInstalled(ctx, c.Name)
	if err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Name, err)
	}
	if !ok {
		return nil
	}
	if err := sys.RemovePackages(ctx, c.Name); err != nil {
		return fmt.Errorf("undo %s %s: %w", c.Kind, c.Name, err)
	}
	log.Info("host change undone", "kind", c.Kind, "target", c.Name, "action", "apt-get remove")
	return nil
}
