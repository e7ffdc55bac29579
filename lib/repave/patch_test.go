package repave

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/requests"
)

// patchRequest drops the in-place request the watcher writes for a patch
// release of the active configuration: kubernetes 1.37.2 -> to.
func patchRequest(t *testing.T, r *rig, gen int64, to string) *config.Config {
	t.Helper()
	desired := testConfig(t, "old")
	desired.Kubernetes.Version = to
	req := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, gen, ""), MachineGeneration: gen,
		Reason: "patch release", Desired: desired, CreatedAt: time.Now()}
	if _, err := r.d.Requests.Write(req); err != nil {
		t.Fatal(err)
	}
	return desired
}

// TestPatchInPlace: a patch request replaces the kubelet of the running
// slot, restarts its node in place (no drain, no other slot), checks the
// release and commits the same slot with the new version. A claim run
// again after the commit only waits for the node.
func TestPatchInPlace(t *testing.T) {
	r := newRig(t)
	r.h.serverVersion = "v1.37.3"
	desired := patchRequest(t, r, 5, "1.37.3")
	s, err := execute(t, r, Job{Kind: requests.Restart, Triggered: true})
	if err != nil || s.Phase != requests.Succeeded || s.ActiveSlot != "a" || s.Downtime <= 0 {
		t.Fatalf("patch: %+v %v", s, err)
	}
	var names []string
	for _, p := range s.Phases {
		names = append(names, p.Name)
	}
	if want := []string{"prepare", "patch-kubelet", "restart-node", "verify", "commit"}; !slices.Equal(names, want) {
		t.Errorf("phases %v, want %v", names, want)
	}
	calls := r.h.callList()
	if !strings.Contains(calls, "patch:a") || strings.Contains(calls, ":b") || strings.Contains(calls, "cordon") || strings.Contains(calls, "evict") {
		t.Errorf("calls %s: want a patch of slot a, nothing of b, no drain", calls)
	}
	a := r.active(t)
	if a.Slot != "a" || a.Config.Fingerprint() != desired.Fingerprint() || a.Config.Kubernetes.Version != "1.37.3" {
		t.Errorf("committed %s %s", a.Slot, a.Config.Kubernetes.Version)
	}
	if r.h.pins != 1 {
		t.Errorf("pinned %d times, want 1", r.h.pins)
	}
}

// TestPatchRollsBack: a kubelet that reports another release after the
// patch is put back (the committed one patched in again, the node
// restarted), the commit untouched, the status Failed saying so; a request
// that is not a patch of what runs is refused with nothing done.
func TestPatchRollsBack(t *testing.T) {
	t.Run("wrong release", func(t *testing.T) {
		r := newRig(t)
		r.h.serverVersion = "v1.37.3"
		patchRequest(t, r, 5, "1.37.3")
		r.h.mirror = map[string]string{"1.37.3": "1.37.9"} // what the mirror really serves under 1.37.3
		s, err := execute(t, r, Job{Kind: requests.Restart, Triggered: true})
		if err == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "rolled back") || !strings.Contains(s.Message, "1.37.9") {
			t.Fatalf("patch: %+v %v", s, err)
		}
		if n := r.h.count("patch:a"); n != 2 {
			t.Errorf("patched %d times, want 2 (the patch and the way back): %s", n, r.h.callList())
		}
		if r.h.count("stop:a") != 0 || s.Downtime != 0 || !strings.Contains(s.Message, "patch-kubelet") {
			t.Errorf("a wrong binary was caught after a restart: %s; %+v", r.h.callList(), s)
		}
		if a := r.active(t); a.Config.Kubernetes.Version != "1.37.2" {
			t.Errorf("committed %s after a failed patch", a.Config.Kubernetes.Version)
		}
	})
	t.Run("not a patch", func(t *testing.T) {
		r := newRig(t)
		patchRequest(t, r, 5, "1.38.0")
		s, err := execute(t, r, Job{Kind: requests.Restart, Triggered: true})
		if err == nil || s.Phase != requests.Failed || !strings.Contains(s.Message, "nothing changed") || !strings.Contains(s.Message, "minor") {
			t.Fatalf("patch: %+v %v", s, err)
		}
		if calls := r.h.callList(); calls != "" {
			t.Errorf("calls %s, want none", calls)
		}
	})
}

// A claim run again after its commit (killed before its status) finds the
// change committed: it only waits for the node, nothing is restarted.
func TestPatchAfterCommit(t *testing.T) {
	r := newRig(t)
	a := r.active(t)
	req := &requests.Request{Kind: requests.Restart, ID: requests.NewID(requests.Restart, 5, ""), MachineGeneration: 5, Desired: a.Config}
	s, err := Patch(t.Context(), r.d, req, a)
	if err != nil || s.Phase != requests.Succeeded {
		t.Fatalf("patch: %+v %v", s, err)
	}
	if calls := r.h.callList(); strings.Contains(calls, "patch") || strings.Contains(calls, "stop") {
		t.Errorf("calls %s: want nothing patched or restarted", calls)
	}
}
