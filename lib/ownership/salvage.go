package ownership

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// Salvage builds the record a forced reset works from when the one on disk
// is damaged (Load returns a *DamagedError): what its JSON still says is
// kept (install ID, machine, fingerprint, every journal entry that is valid
// on its own), and what could not be kept is listed in lost, for the plan.
// The record returned is valid, marked resetting and not persisted. Salvage
// never follows a link in place of the record nor reads a FIFO.
func Salvage(root *hostroot.Root) (rec *Record, lost []string, err error) {
	p, err := RecordPath(root)
	if err != nil {
		return nil, nil, err
	}
	var raw struct {
		InstallID    string            `json:"installID"`
		Machine      string            `json:"machine"`
		Fingerprint  string            `json:"fingerprint"`
		AgentVersion string            `json:"agentVersion"`
		Journal      []json.RawMessage `json:"journal"`
	}
	data, rerr := hostroot.ReadRegular(p, maxRecordSize)
	switch {
	case rerr != nil:
		lost = append(lost, fmt.Sprintf("the whole record (%v): no journalled host change can be undone", rerr))
	case json.Unmarshal(data, &raw) != nil:
		lost = append(lost, "the whole journal (the record is not JSON): no journalled host change can be undone")
		raw.Journal = nil
	}
	machine, fp := raw.Machine, raw.Fingerprint
	if checkIdentity(machine, fp) != nil {
		machine, fp = "unknown", strings.Repeat("0", 64)
	}
	rec, err = New(machine, fp, raw.AgentVersion)
	if err != nil {
		return nil, nil, err
	}
	if isHex(raw.InstallID) && len(raw.InstallID) == 32 {
		rec.InstallID = raw.InstallID
	}
	seen := map[string]bool{}
	for i, m := range raw.Journal {
		var c Change
		if err := json.Unmarshal(m, &c); err != nil {
			lost = append(lost, fmt.Sprintf("journal entry %d: %v", i, err))
			continue
		}
		if err := c.validate(); err != nil {
			lost = append(lost, fmt.Sprintf("journal entry %d: %v", i, err))
			continue
		}
		if seen[c.key()] {
			lost = append(lost, fmt.Sprintf("journal entry %d: a duplicate of %s %s", i, c.Kind, c.target()))
			continue
		}
		seen[c.key()] = true
		rec.Journal = append(rec.Journal, c)
	}
	if err := rec.SetCheckpoint(CheckpointResetting); err != nil {
		return nil, nil, err
	}
	if err := rec.validate(); err != nil {
		return nil, nil, fmt.Errorf("salvage the ownership record: %w", err)
	}
	return rec, lost, nil
}
