package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// RemoveJoinTokenFile takes cluster.bootstrap_token out of the
// configuration file at the local path local (RemoveJoinToken: "# "+note in
// its place, every other byte kept) and writes it back atomically
// (lib/atomicfile) with its mode and owner, so a crash leaves the old file
// or the new one. Idempotent: a file without a token is left alone
// (removed false), and a missing file is reported by exists false. What an
// interrupted earlier run left (the temporary file, holding the new text)
// is removed first. The token's value is never put into an error. Shared by
// the bootstrap (after the first join) and the reset.
func RemoveJoinTokenFile(local, note string) (removed, exists bool, err error) {
	if err := removeWriteTemps(local); err != nil {
		return false, true, err
	}
	data, err := hostroot.ReadRegular(local, MaxFileSize)
	if errors.Is(err, fs.ErrNotExist) {
		return false, false, nil
	}
	if err != nil {
		return false, true, err
	}
	out, removed, err := RemoveJoinToken(data, note)
	if err != nil || !removed {
		return false, true, err
	}
	fi, err := os.Stat(local)
	if err != nil {
		return false, true, err
	}
	if err := atomicfile.WriteFile(local, out, fi.Mode().Perm()); err != nil {
		return false, true, err
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && (int(st.Uid) != os.Geteuid() || int(st.Gid) != os.Getegid()) {
		if err := os.Chown(local, int(st.Uid), int(st.Gid)); err != nil {
			return true, true, fmt.Errorf("%s: restore its owner: %w", local, err)
		}
	}
	return true, true, nil
}

// removeWriteTemps removes what an interrupted atomicfile.WriteFile of
// local leaves: files named after it the way WriteFile names its temporary
// file.
func removeWriteTemps(local string) error {
	temps, err := filepath.Glob(filepath.Join(filepath.Dir(local), "."+filepath.Base(local)+".tmp-*"))
	if err != nil {
		return err
	}
	for _, tmp := range temps {
		if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
