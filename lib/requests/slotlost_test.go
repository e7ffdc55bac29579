package requests

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

func TestSlotLost(t *testing.T) {
	d, _ := newDir(t)
	const id = "repave-3-roll"
	if err := d.CheckSlot(id); err != nil {
		t.Fatalf("no marker: %v, want nil", err)
	}
	if err := d.MarkSlotLost(id, "lease roll-0 is held by x now"); err != nil {
		t.Fatal(err)
	}
	err := d.CheckSlot(id)
	if !errors.Is(err, ErrSlotLost) || err == nil || !strings.Contains(err.Error(), "held by x") {
		t.Errorf("after the mark: %v, want ErrSlotLost with the reason", err)
	}
	// An unreadable marker counts as lost.
	p, _ := d.slotLostPath(id)
	if err := os.WriteFile(p, []byte("not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckSlot(id); !errors.Is(err, ErrSlotLost) {
		t.Errorf("damaged marker: %v, want ErrSlotLost", err)
	}
	// Pruned with its status.
	if err := d.WriteStatus(&Status{RequestID: id, Kind: Repave, Phase: Succeeded}); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteStatus(&Status{RequestID: "repave-4-later", Kind: Repave, Phase: Succeeded}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prune(Published{id: Succeeded, "repave-4-later": Succeeded}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("the marker outlived its pruned status: %v", err)
	}
	if err := d.MarkSlotLost("../x", "r"); err == nil {
		t.Error("a marker for a bad request id was written")
	}
}
