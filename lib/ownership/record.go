// Package ownership records which installation owns this host, how far it
// got, and every change it made outside the host root, and serialises the
// stages that mutate the host. Imported by every package that changes the
// host or waits for the lock: the stage packages (lib/bootstrap, lib/repave,
// lib/upgrade, lib/reset, lib/watcher), the packages that change the host
// for them (lib/hostprep, lib/unitinstall, the isolation backends),
// lib/requests, and the kubeslot CLI (status).
//
// The record lives at <base>/ownership.json and is only ever replaced
// atomically. Writers must hold the installation lock (Acquire) from before
// they read the record until after their last write; the stages take both
// through Begin (prologue.go), the one prologue they share. Readers that only
// report (kubeslot status) may read without it, because every write is a
// whole-file atomic replacement.
package ownership

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// SchemaVersion is the record layout this release reads and writes. A record
// with any other version is refused rather than half-understood.
const SchemaVersion = 1

// recordMode keeps the record private to root: it lists what reset will
// undo, and prior file contents may be sensitive.
const recordMode = 0o600

// maxRecordSize bounds what Load reads. A record holds small metadata and a
// journal of bounded entries; anything near this size is damage, not data.
const maxRecordSize = 16 << 20

// ErrDamagedRecord is returned (wrapped, as *DamagedError) when the record
// exists but cannot be trusted: torn, not JSON, unknown schema version,
// unknown checkpoint or journal kind, missing fields.
var ErrDamagedRecord = errors.New("ownership record damaged")

// DamagedError says which record file is damaged and how.
type DamagedError struct {
	Path    string // local path of the record
	Problem string // what is wrong, for a human
	Err     error  // underlying cause, if any
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("ownership record %s: %s: inspect it; kubeslot-resetter --force removes the installation (what the damaged journal no longer says is not undone)", e.Path, e.Problem)
}

// Is makes errors.Is(err, ErrDamagedRecord) true.
func (e *DamagedError) Is(target error) bool { return target == ErrDamagedRecord }

func (e *DamagedError) Unwrap() error { return e.Err }

// Checkpoint says how far an installation got. The install checkpoints name
// the step in progress (or last started): a resumed bootstrap redoes that
// step, which is idempotent, and skips the ones before it.
type Checkpoint string

// Checkpoints, in installation order, then the reset marker.
const (
	CheckpointPreparingHost   Checkpoint = "preparing-host"
	CheckpointPreparingSlot   Checkpoint = "preparing-slot"
	CheckpointStartingNode    Checkpoint = "starting-node"
	CheckpointInstallingUnits Checkpoint = "installing-units"
	CheckpointComplete        Checkpoint = "complete"
	// CheckpointResetting is not an installation step: the resetter sets it
	// before it starts undoing, so nothing else resumes a half-reset host.
	CheckpointResetting Checkpoint = "resetting"
)

// InstallCheckpoints returns the installation checkpoints in order (without
// CheckpointResetting). A fresh slice each call: callers may keep it.
func InstallCheckpoints() []Checkpoint {
	return []Checkpoint{
		CheckpointPreparingHost,
		CheckpointPreparingSlot,
		CheckpointStartingNode,
		CheckpointInstallingUnits,
		CheckpointComplete,
	}
}

// Order is the 1-based position of c in installation order; 0 for
// CheckpointResetting and for anything invalid.
func (c Checkpoint) Order() int {
	for i, s := range InstallCheckpoints() {
		if c == s {
			return i + 1
		}
	}
	return 0
}

// Valid reports whether c is a checkpoint this release knows.
func (c Checkpoint) Valid() bool { return c == CheckpointResetting || c.Order() > 0 }

// Passed reports whether an installation at checkpoint c has finished step,
// so a resumed bootstrap may skip step. It is false for the step in
// progress itself (that one is redone), and always false while resetting.
func (c Checkpoint) Passed(step Checkpoint) bool {
	return step.Order() > 0 && c.Order() > step.Order()
}

func checkpointList() string {
	var names []string
	for _, c := range InstallCheckpoints() {
		names = append(names, string(c))
	}
	return strings.Join(append(names, string(CheckpointResetting)), ", ")
}

// Record is the ownership record of one installation. It is not safe for
// concurrent use; between processes the installation lock serialises it.
type Record struct {
	SchemaVersion int        `json:"schemaVersion"`
	InstallID     string     `json:"installID"`
	Machine       string     `json:"machine"`
	Fingerprint   string     `json:"fingerprint"`
	Checkpoint    Checkpoint `json:"checkpoint"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	AgentVersion  string     `json:"agentVersion"`
	// Journal lists host changes in the order they were recorded; see
	// (*Record).Record and Changes.
	Journal []Change `json:"journal"`

	// Clock stamps updatedAt and journal entries; nil means time.Now.
	// Tests set it for fixed times.
	Clock func() time.Time `json:"-"`
}

// New returns the record of a new installation at CheckpointPreparingHost
// with a fresh random install ID. It is not persisted: call Save (holding
// the lock). fingerprint is the configuration fingerprint as lower-case hex.
func New(machine, fingerprint, agentVersion string) (*Record, error) {
	if err := checkIdentity(machine, fingerprint); err != nil {
		return nil, err
	}
	var id [16]byte
	rand.Read(id[:]) // never fails (crypto/rand crashes the process instead)
	r := &Record{
		SchemaVersion: SchemaVersion,
		InstallID:     hex.EncodeToString(id[:]),
		Machine:       machine,
		Fingerprint:   fingerprint,
		Checkpoint:    CheckpointPreparingHost,
		AgentVersion:  agentVersion,
		Journal:       []Change{},
	}
	r.CreatedAt = r.now()
	r.UpdatedAt = r.CreatedAt
	return r, nil
}

func (r *Record) now() time.Time {
	if r.Clock != nil {
		return r.Clock().UTC().Round(0)
	}
	return time.Now().UTC().Round(0)
}

// SetCheckpoint moves the record to cp and stamps updatedAt. It does not
// persist; call Save.
func (r *Record) SetCheckpoint(cp Checkpoint) error {
	if !cp.Valid() {
		return fmt.Errorf("checkpoint %q: not one of %s", cp, checkpointList())
	}
	r.Checkpoint = cp
	r.UpdatedAt = r.now()
	return nil
}

// ShortFingerprint is the fingerprint cut to 12 characters, for messages.
func ShortFingerprint(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

// RecordPath resolves the local path of the ownership record.
func RecordPath(root *hostroot.Root) (string, error) { return recordFile.Path(root) }

// Load reads the ownership record. A missing record returns (nil, nil):
// nothing owns this host. A record that exists but cannot be trusted returns
// a *DamagedError naming the file.
func Load(root *hostroot.Root) (*Record, error) {
	r, err := recordFile.Load(root)
	if ce := (*hostroot.CorruptError)(nil); errors.As(err, &ce) {
		return nil, &DamagedError{Path: ce.Path, Problem: ce.Reason, Err: ce.Err}
	}
	if err != nil {
		return nil, fmt.Errorf("ownership record: %w", err)
	}
	return r, nil
}

// recordFile is the record, <base>/ownership.json.
var recordFile = hostroot.StateFile[Record]{
	Name: hostroot.OwnershipFile, Max: maxRecordSize, Perm: recordMode,
	Decode: decode,
	Validate: func(r *Record) error {
		if r.SchemaVersion != SchemaVersion {
			return fmt.Errorf("schemaVersion %d: this release understands only %d", r.SchemaVersion, SchemaVersion)
		}
		return r.validate()
	},
}

// decode parses a record strictly: a field this release does not know may
// be undo information it would silently drop.
func decode(data []byte, r *Record) error {
	if len(bytes.TrimSpace(data)) == 0 {
		return errors.New("empty (truncated write?)")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(r); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return fmt.Errorf("not valid JSON (truncated write?): %w", err)
		}
		return fmt.Errorf("unexpected content: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("not valid JSON: data after the record")
	}
	if r.Journal == nil {
		r.Journal = []Change{}
	}
	return nil
}

// validate checks everything but the schema version.
func (r *Record) validate() error {
	if !isHex(r.InstallID) || len(r.InstallID) != 32 {
		return fmt.Errorf("installID %q: want 32 lower-case hex digits", r.InstallID)
	}
	if err := checkIdentity(r.Machine, r.Fingerprint); err != nil {
		return err
	}
	if !r.Checkpoint.Valid() {
		return fmt.Errorf("checkpoint %q: not one of %s", r.Checkpoint, checkpointList())
	}
	if r.CreatedAt.IsZero() || r.UpdatedAt.IsZero() {
		return errors.New("createdAt and updatedAt must be set")
	}
	seen := make(map[string]int, len(r.Journal))
	for i, c := range r.Journal {
		if err := c.validate(); err != nil {
			return fmt.Errorf("journal entry %d: %w", i, err)
		}
		if j, dup := seen[c.key()]; dup {
			return fmt.Errorf("journal entry %d: duplicates entry %d (%s %s)", i, j, c.Kind, c.target())
		}
		seen[c.key()] = i
	}
	return nil
}

func checkIdentity(machine, fingerprint string) error {
	if machine == "" || strings.ContainsFunc(machine, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fmt.Errorf("machine %q: want a non-empty name without spaces or control characters", machine)
	}
	if !isHex(fingerprint) {
		return fmt.Errorf("fingerprint %q: want non-empty lower-case hex", fingerprint)
	}
	return nil
}

func isHex(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Save validates r and atomically replaces the record with it (mode 0600).
// The base directory must exist (hostroot.EnsureLayout). The caller must
// hold the installation lock.
func Save(root *hostroot.Root, r *Record) error {
	if r == nil {
		return errors.New("save ownership record: no record")
	}
	if r.Journal == nil {
		r.Journal = []Change{}
	}
	if err := recordFile.Save(root, r); err != nil {
		return fmt.Errorf("ownership record: %w", err)
	}
	return nil
}

// Remove deletes the record durably; the host is then owned by no
// installation. Only the resetter calls it, last, holding the lock.
func Remove(root *hostroot.Root) error {
	p, err := RecordPath(root)
	if err != nil {
		return err
	}
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil // nothing to remove, and the directory may be gone too
	}
	if err := atomicfile.Remove(p); err != nil {
		return fmt.Errorf("remove ownership record %s: %w", p, err)
	}
	return nil
}
