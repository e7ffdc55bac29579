package state

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// activeName is the file in the applied directory that names the active
// slot. Writing it is the commit point of a bootstrap or repave: a slot is
// named there only after its node passed verification (DESIGN.md).
const activeName = "active"

// Applied is the configuration a slot was provisioned with. It holds the
// join secret, so it is written 0600.
type Applied struct {
	Slot         string         `json:"slot"`
	Mode         string         `json:"mode"` // isolation mode the slot was applied with
	Fingerprint  string         `json:"fingerprint"`
	AgentVersion string         `json:"agentVersion"`
	AppliedAt    time.Time      `json:"appliedAt"`
	Config       *config.Config `json:"config"`
}

// Store reads and writes the applied state of one host root.
type Store struct {
	root *hostroot.Root
	// betweenReads, in tests, runs between ActiveApplied's reads: a
	// commit landing there.
	betweenReads func()
}

// NewStore returns a Store over root.
func NewStore(root *hostroot.Root) *Store { return &Store{root: root} }

// SetBetweenReads makes ActiveApplied run f between its reads of active and
// of the slot's configuration. Test hook only: a rig test holds the
// watcher's read there (KUBESLOT_TEST_WATCHER_READ_GATE) while a real
// commit lands.
func (s *Store) SetBetweenReads(f func()) { s.betweenReads = f }

func (s *Store) appliedPath(slot string) (string, error) {
	f, err := appliedFile(slot)
	if err != nil {
		return "", err
	}
	return f.Path(s.root)
}

// appliedFile is applied/<slot>.json, checksummed and 0600 (the join
// secret); a file naming another slot, or without a config, is refused.
func appliedFile(slot string) (hostroot.StateFile[Applied], error) {
	if slot == "" || slot == activeName || strings.ContainsAny(slot, "/.") {
		return hostroot.StateFile[Applied]{}, fmt.Errorf("slot name %q is not valid", slot)
	}
	return hostroot.StateFile[Applied]{
		Dir: hostroot.AppliedDir, Name: slot + ".json", Max: MaxChecksummed, Perm: 0o600,
		Store: Checksummed, Advice: Advice,
		Validate: func(a *Applied) error {
			if a.Slot != slot {
				return fmt.Errorf("names slot %q, expected %q", a.Slot, slot)
			}
			if a.Config == nil {
				return errors.New("has no config")
			}
			return nil
		},
	}, nil
}

// SaveApplied persists a's configuration for its slot.
func (s *Store) SaveApplied(a *Applied) error {
	f, err := appliedFile(a.Slot)
	if err != nil {
		return err
	}
	if a.Config == nil {
		return fmt.Errorf("applied configuration for slot %q has no config", a.Slot)
	}
	return f.Save(s.root, a)
}

// LoadApplied reads and verifies the applied configuration of slot. It
// wraps ErrNotFound when the slot has none.
func (s *Store) LoadApplied(slot string) (*Applied, error) {
	f, err := appliedFile(slot)
	if err != nil {
		return nil, err
	}
	a, err := f.Load(s.root)
	if a == nil && err == nil {
		p, _ := f.Path(s.root)
		return nil, fmt.Errorf("%s: %w", p, ErrNotFound)
	}
	return a, err
}

// RemoveApplied deletes a slot's applied configuration; absent is fine.
func (s *Store) RemoveApplied(slot string) error {
	f, err := appliedFile(slot)
	if err != nil {
		return err
	}
	return f.Remove(s.root)
}

// SetActive records slot as the active one. Call it only after the slot's
// applied configuration is saved and its node passed verification.
func (s *Store) SetActive(slot string) error {
	if _, err := s.LoadApplied(slot); err != nil {
		return fmt.Errorf("refusing to activate slot %q: %w", slot, err)
	}
	p, err := s.root.File(hostroot.AppliedDir, activeName)
	if err != nil {
		return err
	}
	return WriteChecksummed(p, []byte(slot+"\n"), 0o600)
}

// Active returns the active slot; found is false when no slot was ever
// committed.
func (s *Store) Active() (slot string, found bool, err error) {
	p, err := s.root.File(hostroot.AppliedDir, activeName)
	if err != nil {
		return "", false, err
	}
	b, err := ReadChecksummed(p)
	if errors.Is(err, ErrNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, err
	}
	slot = strings.TrimSpace(string(b))
	if _, err := s.appliedPath(slot); err != nil {
		return "", false, corrupt(p, fmt.Sprintf("names %q, not a slot", slot))
	}
	return slot, true, nil
}

// ActiveApplied returns the active slot's verified applied configuration,
// or (nil, nil) when nothing was committed yet.
//
// The pair is two files that a commit changes one after the other (the
// target's configuration, then active, then the old slot's configuration
// goes), and readers such as the watcher do not take the installation
// lock. So a read checks that active still names the slot it read the
// configuration of, and reads again when a commit moved it in between: a
// failure is reported only for a pair that stays inconsistent.
func (s *Store) ActiveApplied() (*Applied, error) {
	for attempt := 1; ; attempt++ {
		slot, found, err := s.Active()
		if err != nil || !found {
			return nil, err
		}
		if s.betweenReads != nil {
			s.betweenReads()
		}
		a, err := s.LoadApplied(slot)
		if err != nil && attempt < 5 {
			if now, found, aerr := s.Active(); aerr == nil && found && now != slot {
				continue // a commit moved active meanwhile
			}
		}
		if errors.Is(err, ErrNotFound) {
			p, _ := s.appliedPath(slot)
			return nil, corrupt(p, "the active slot "+slot+" has no applied configuration")
		}
		return a, err
	}
}
