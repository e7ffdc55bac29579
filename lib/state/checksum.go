// Package state persists kubeslot's durable state in the host root: the
// configuration applied to each slot, which slot is active, and the
// checksummed files that guard them against torn writes and hand edits.
//
// Its JSON files are hostroot.StateFile values kept by Checksummed: they
// are replaced atomically (lib/atomicfile) and carry a sha256 sidecar in
// sha256sum format, so `sha256sum -c` checks them by hand too. A file whose
// sidecar is missing or disagrees is an error that names the file and says
// what to do; it is never trusted silently. Imported by any package that
// reads or writes the applied configuration or the active slot: the stage
// packages, lib/isolation, lib/sandbox, lib/cachekeep and the kubeslot CLI.
package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// SidecarSuffix is appended to a file's name to name its checksum file.
const SidecarSuffix = ".sha256"

// ErrNotFound is returned (wrapped) when a checksummed file does not exist.
var ErrNotFound = errors.New("not found")

// Advice ends the message of a *hostroot.CorruptError about a checksummed
// file.
const Advice = "not trusted; if a stage was interrupted, re-run it; otherwise reset the host (kubeslot-resetter)"

// corrupt reports a checksummed file that cannot be trusted.
func corrupt(path, reason string) *hostroot.CorruptError {
	return &hostroot.CorruptError{Path: path, Reason: reason, Advice: Advice}
}

// Checksummed keeps a hostroot.StateFile's bytes with a sha256 sidecar
// (WriteChecksummed, ReadChecksummed, RemoveChecksummed).
var Checksummed hostroot.FileStore = checksummed{}

type checksummed struct{}

func (checksummed) Read(path string, limit int64) ([]byte, error) {
	b, err := readChecksummed(path, limit)
	if errors.Is(err, ErrNotFound) {
		return nil, fmt.Errorf("%s: %w", path, fs.ErrNotExist)
	}
	return b, err
}

func (checksummed) Write(path string, data []byte, perm fs.FileMode) error {
	return WriteChecksummed(path, data, perm)
}

func (checksummed) Remove(path string) error { return RemoveChecksummed(path) }

// MaxChecksummed bounds a checksummed state file (an applied configuration
// is a few KiB): a larger one is damaged, and is not read whole.
const MaxChecksummed = 16 << 20

// pendingSuffix names the sidecar of a write in progress (WriteChecksummed).
const pendingSuffix = SidecarSuffix + ".new"

// WriteChecksummed writes data to path with its sha256 sidecar so that a
// crash at any point leaves a pair ReadChecksummed accepts, old or new, and
// never a wrong one: the new sidecar goes to <path>.sha256.new first, then
// the data replaces path, then the new sidecar replaces the old one, each
// step atomic. Killed after the data, the old sidecar disagrees, but the
// pending one vouches for the new data (a crash between two writes
// or removals must not wedge every later stage).
func WriteChecksummed(path string, data []byte, perm fs.FileMode) error {
	sum := sha256.Sum256(data)
	line := hex.EncodeToString(sum[:]) + "  " + filepath.Base(path) + "\n"
	if err := atomicfile.WriteFile(path+pendingSuffix, []byte(line), perm); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, data, perm); err != nil {
		return err
	}
	return atomicfile.Rename(path+pendingSuffix, path+SidecarSuffix)
}

// ReadChecksummed reads path and verifies it against its sidecar. An
// absent file wraps ErrNotFound; one that cannot be trusted is a
// *hostroot.CorruptError.
func ReadChecksummed(path string) ([]byte, error) { return readChecksummed(path, MaxChecksummed) }

func readChecksummed(path string, limit int64) ([]byte, error) {
	data, err := hostroot.ReadRegular(path, limit)
	if errors.Is(err, fs.ErrNotExist) {
		// A sidecar left alone is a removal that was interrupted after the
		// data went (RemoveChecksummed): the file is gone.
		return nil, fmt.Errorf("%s: %w", path, ErrNotFound)
	}
	if errors.Is(err, hostroot.ErrNotRegular) || errors.Is(err, hostroot.ErrTooLarge) {
		return nil, corrupt(path, err.Error())
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	reason := verify(path, path+SidecarSuffix, data)
	if reason == "" {
		return data, nil
	}
	// An interrupted write: the new data is in place, its sidecar pending.
	if _, err := os.Stat(path + pendingSuffix); err == nil && verify(path, path+pendingSuffix, data) == "" {
		return data, nil
	}
	return nil, corrupt(path, reason)
}

// verify checks data against the sidecar file side; "" when it matches,
// else why not.
func verify(path, side string, data []byte) string {
	name := filepath.Base(side)
	b, err := hostroot.ReadRegular(side, 4<<10)
	if errors.Is(err, fs.ErrNotExist) {
		return "checksum file " + name + " is missing"
	}
	if err != nil {
		return fmt.Sprintf("read %s: %v", name, err)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 || len(fields[0]) != sha256.Size*2 {
		return "checksum file " + name + " is malformed"
	}
	want, err := hex.DecodeString(fields[0])
	if err != nil {
		return "checksum file " + name + " is malformed"
	}
	got := sha256.Sum256(data)
	if !bytes.Equal(want, got[:]) {
		return fmt.Sprintf("checksum mismatch (file has sha256 %x…, %s says %x…; torn write or edited by hand)", got[:6], name, want[:6])
	}
	return ""
}

// RemoveChecksummed removes a file and its sidecars, the data first: killed
// between, the sidecar left alone reads as "not found" (ReadChecksummed),
// and a later removal or write finishes the job. Absent files are fine.
func RemoveChecksummed(path string) error {
	for _, p := range []string{path, path + pendingSuffix, path + SidecarSuffix} {
		if err := atomicfile.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
