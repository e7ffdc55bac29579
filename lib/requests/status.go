package requests

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// WriteStatus writes s (UpdatedAt stamped, Message bounded).
func (d *Dir) WriteStatus(s *Status) error {
	p, err := d.statusPath(s.RequestID)
	if err != nil {
		return err
	}
	if len(s.Message) > MaxMessage {
		s.Message = s.Message[:MaxMessage]
	}
	s.UpdatedAt = time.Now().UTC()
	return writeJSON(p, s)
}

// ReadStatus reads the status of request id; it wraps os.ErrNotExist when
// there is none.
func (d *Dir) ReadStatus(id string) (*Status, error) {
	p, err := d.statusPath(id)
	if err != nil {
		return nil, err
	}
	s, err := readJSONOrAbsent[Status](p)
	if err != nil {
		return nil, err
	}
	if s.RequestID != id {
		return nil, fmt.Errorf("%s: names request %q, expected %q", p, s.RequestID, id)
	}
	return s, nil
}

// ListStatus reads every status file, sorted by request ID. Files that do
// not parse are returned as errors alongside the good ones, so one damaged
// file does not hide the others.
func (d *Dir) ListStatus() ([]*Status, []error, error) {
	dir, err := d.StatusDir()
	if err != nil {
		return nil, nil, err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []*Status
	var bad []error
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue // temporary files of atomic writes
		}
		s, err := d.ReadStatus(strings.TrimSuffix(name, ".json"))
		if err != nil {
			bad = append(bad, err)
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].RequestID < out[j].RequestID })
	return out, bad, nil
}

// Known returns the IDs the watcher must not dispatch again: pending,
// claimed, or with a status file.
func (d *Dir) Known() (map[string]bool, error) {
	known := map[string]bool{}
	for _, k := range Kinds() {
		for _, get := range []func(Kind) (*Request, error){d.Pending, d.Claimed} {
			r, err := get(k)
			if errors.Is(err, ErrInvalid) {
				continue // a worker moves it aside; its ID, if any, is not trusted
			}
			if err != nil {
				return nil, err
			}
			if r != nil {
				known[r.ID] = true
			}
		}
	}
	st, _, err := d.ListStatus()
	if err != nil {
		return nil, err
	}
	for _, s := range st {
		known[s.RequestID] = true
	}
	return known, nil
}

// Published maps request IDs to the last phase the watcher published.
type Published map[string]Phase

func (d *Dir) publishedPath() (string, error) {
	dir, err := d.dir(hostroot.StateDir)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "published.json"), nil
}

// LoadPublished reads the published marker (empty when absent).
func (d *Dir) LoadPublished() (Published, error) {
	p, err := d.publishedPath()
	if err != nil {
		return nil, err
	}
	out, err := readJSON[Published](p)
	if err != nil {
		return nil, err
	}
	if out == nil || *out == nil {
		return Published{}, nil
	}
	return *out, nil
}

// SavePublished writes the published marker.
func (d *Dir) SavePublished(p Published) error {
	path, err := d.publishedPath()
	if err != nil {
		return err
	}
	return writeJSON(path, &p)
}

// Prune removes status files of finished requests that were published as
// finished and last updated before cutoff, except the newest status of each
// kind (a failed spec-driven repave stays remembered for as long as it is the
// latest), and drops marker entries whose status file is gone. It returns
// the IDs removed. The watcher calls it now and then, so status/ stays
// bounded on a host that runs for years.
func (d *Dir) Prune(p Published, cutoff time.Time) ([]string, error) {
	st, _, err := d.ListStatus()
	if err != nil {
		return nil, err
	}
	newest := map[Kind]*Status{}
	for _, s := range st {
		if n := newest[s.Kind]; n == nil || s.UpdatedAt.After(n.UpdatedAt) {
			newest[s.Kind] = s
		}
	}
	var removed []string
	present := map[string]bool{}
	for _, s := range st {
		present[s.RequestID] = true
		if newest[s.Kind] == s || !s.Phase.Finished() || p[s.RequestID] != s.Phase || !s.UpdatedAt.Before(cutoff) {
			continue
		}
		path, err := d.statusPath(s.RequestID)
		if err != nil {
			return removed, err
		}
		if err := atomicfile.Remove(path); err != nil {
			return removed, fmt.Errorf("prune %s: %w", path, err)
		}
		if err := d.removeSlotLost(s.RequestID); err != nil {
			return removed, fmt.Errorf("prune the slot marker of %s: %w", s.RequestID, err)
		}
		removed = append(removed, s.RequestID)
		delete(present, s.RequestID)
	}
	changed := len(removed) > 0
	for id := range p {
		if !present[id] {
			delete(p, id)
			changed = true
		}
	}
	if changed {
		return removed, d.SavePublished(p)
	}
	return removed, nil
}
