// Package migrate carries a kubeslot installation from one host layout to
// another: ordered, named steps, each idempotent, with a durable checkpoint
// (state/migration.json inside the tree being migrated) written before each
// step, so that a run killed anywhere is resumed by the next one and ends
// in the same place. The one migration there is today moves an
// installation to another base (RootMove); there is no layout 2 yet (see
// DESIGN.md, "Layout version and migration"). Imported by lib/bootstrap
// only: the bootstrap is the one stage that migrates, under the
// installation lock, before admission.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// StateFile is the checkpoint, in hostroot.StateDir of the tree migrated.
const StateFile = "migration.json"

// maxState bounds the checkpoint's size when read.
const maxState = 64 << 10

// Step is one named, idempotent piece of a migration: run again after a
// kill, at any point inside it, it finishes the job or finds it done.
type Step struct {
	Name string
	Run  func(ctx context.Context) error
}

// State is the checkpoint: which migration, between which bases, and the
// step to run next (written before that step starts).
type State struct {
	Kind    string    `json:"kind"`
	From    string    `json:"from"`
	To      string    `json:"to"`
	Next    string    `json:"next"`
	Started time.Time `json:"started"`
}

// Checkpoint says where the state is kept; the tree holding it may move
// during the run (RootMove), so each save asks again.
type Checkpoint interface {
	Save(st State) error
	Remove() error
}

// run runs steps from st.Next (the first when empty), saving the state
// before each, then removes it. after, when set, is called after each step
// (tests use it to stop the run there, as a kill would).
func run(ctx context.Context, st State, steps []Step, cp Checkpoint, log *slog.Logger, after func(step string) error) error {
	start := 0
	if st.Next != "" {
		start = slices.IndexFunc(steps, func(s Step) bool { return s.Name == st.Next })
		if start < 0 {
			return fmt.Errorf("migration checkpoint names step %q, which %s migrations do not have: the file is damaged or from another release", st.Next, st.Kind)
		}
		log.Info("resuming migration", "kind", st.Kind, "from", st.From, "to", st.To, "step", st.Next)
	}
	for _, s := range steps[start:] {
		if err := ctx.Err(); err != nil {
			return err
		}
		st.Next = s.Name
		if err := cp.Save(st); err != nil {
			return fmt.Errorf("save the migration checkpoint before %s: %w", s.Name, err)
		}
		t0 := time.Now()
		if err := s.Run(ctx); err != nil {
			return fmt.Errorf("migration step %s: %w", s.Name, err)
		}
		log.Info("migration step done", "kind", st.Kind, "step", s.Name, "took", time.Since(t0).Round(time.Millisecond))
		if after != nil {
			if err := after(s.Name); err != nil {
				return err
			}
		}
	}
	return cp.Remove()
}

// stateFile is the checkpoint in a root's state directory.
var stateFile = hostroot.StateFile[State]{
	Dir: hostroot.StateDir, Name: StateFile, Max: maxState, Perm: 0o600,
	Validate: func(st *State) error {
		if st.Kind == "" || st.From == "" || st.To == "" {
			return errors.New("kind, from and to must be set")
		}
		return nil
	},
	Advice: "the migration checkpoint is damaged",
}

// loadState reads the checkpoint in root's state directory; nil when there
// is none.
func loadState(root *hostroot.Root) (*State, error) { return stateFile.Load(root) }

// saveState writes the checkpoint atomically into root's state directory.
func saveState(root *hostroot.Root, st State) error { return stateFile.Save(root, &st) }

func removeState(root *hostroot.Root) error { return stateFile.Remove(root) }
