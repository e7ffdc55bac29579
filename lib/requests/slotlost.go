package requests

// A paced rollout's slot is held by the watcher while a worker runs the
// request it was taken for. When the watcher loses the slot (another agent
// took it over because it looked expired, or a node took it by force), the
// worker must not go on to disrupt the node: the slot is what bounds how
// many targets are down at once. The watcher says so in a marker beside the
// request's status; the worker reads it before each step that disrupts the
// node (drain, switch, restart) and stops there, and a worker already past
// its point of no return finishes and records that it ran without a slot.

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
)

// SlotLost is the marker's content.
type SlotLost struct {
	// Reason is what the watcher saw (the lease gone, or held by another).
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// ErrSlotLost is the failure of a request whose rollout slot was lost
// before the node was disrupted.
var ErrSlotLost = errors.New("the rollout slot was lost before the node was disrupted")

func (d *Dir) slotLostPath(id string) (string, error) {
	p, err := d.statusPath(id)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(p, ".json") + ".slot-lost", nil
}

// MarkSlotLost records that request id's rollout slot is lost.
func (d *Dir) MarkSlotLost(id, reason string) error {
	p, err := d.slotLostPath(id)
	if err != nil {
		return err
	}
	return writeJSON(p, &SlotLost{Reason: reason, At: time.Now().UTC()})
}

// ReadSlotLost returns the marker of request id, nil when its slot was
// not lost. A marker that cannot be read counts as lost: a worker that
// cannot tell must not disrupt the node.
func (d *Dir) ReadSlotLost(id string) (*SlotLost, error) {
	p, err := d.slotLostPath(id)
	if err != nil {
		return nil, err
	}
	s, err := readJSON[SlotLost](p)
	switch {
	case err == nil:
		return s, nil
	case errors.Is(err, errContent):
		return &SlotLost{Reason: fmt.Sprintf("%s is unreadable: %v", p, err)}, nil
	}
	return nil, err
}

// CheckSlot returns an error wrapping ErrSlotLost when request id's slot is
// lost (or its marker cannot be read), nil otherwise.
func (d *Dir) CheckSlot(id string) error {
	s, err := d.ReadSlotLost(id)
	if err != nil {
		return fmt.Errorf("%w: its marker cannot be read: %v", ErrSlotLost, err)
	}
	if s != nil {
		return fmt.Errorf("%w: %s", ErrSlotLost, s.Reason)
	}
	return nil
}

// removeSlotLost removes request id's marker, if any.
func (d *Dir) removeSlotLost(id string) error {
	p, err := d.slotLostPath(id)
	if err != nil {
		return err
	}
	return atomicfile.Remove(p)
}
