package machineclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// fakeAPI serves one Machine the way the apiserver does for what the client
// uses: GET, and a JSON patch of the status subresource that must name the
// current resourceVersion. Before each of the first `conflicts` patches,
// someone else writes the object, so that patch conflicts.
type fakeAPI struct {
	mu        sync.Mutex
	machine   v1alpha1.Machine
	rv        int
	conflicts int
	gets      int
	patches   []string // resourceVersion each patch named
	otherErr  int      // status code to answer every patch with, when set
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	const base = "/apis/kubeslot.dev/v1alpha1/machines/m1"
	switch {
	case r.Method == http.MethodGet && r.URL.Path == base:
		f.gets++
		f.machine.ResourceVersion = strconv.Itoa(f.rv)
		writeJSON(w, http.StatusOK, &f.machine)
	case r.Method == http.MethodPatch && r.URL.Path == base+"/status":
		if ct := r.Header.Get("Content-Type"); ct != "application/json-patch+json" {
			writeStatus(w, http.StatusUnsupportedMediaType, "BadRequest", "content type "+ct)
			return
		}
		var ops []struct {
			Op    string          `json:"op"`
			Path  string          `json:"path"`
			Value json.RawMessage `json:"value"`
		}
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &ops); err != nil || len(ops) != 2 || ops[0].Path != "/metadata/resourceVersion" || ops[1].Path != "/status" {
			writeStatus(w, http.StatusBadRequest, "BadRequest", "unexpected patch "+string(body))
			return
		}
		var rv string
		_ = json.Unmarshal(ops[0].Value, &rv)
		f.patches = append(f.patches, rv)
		if f.otherErr != 0 {
			writeStatus(w, f.otherErr, "InternalError", "broken")
			return
		}
		if f.conflicts > 0 {
			f.conflicts--
			f.rv++ // someone else wrote in between
		}
		if rv != strconv.Itoa(f.rv) {
			writeStatus(w, http.StatusConflict, "Conflict", `Operation cannot be fulfilled on machines.kubeslot.dev "m1": the object has been modified`)
			return
		}
		var st v1alpha1.MachineStatus
		if err := json.Unmarshal(ops[1].Value, &st); err != nil {
			writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
			return
		}
		f.machine.Status = st
		f.rv++
		f.machine.ResourceVersion = strconv.Itoa(f.rv)
		writeJSON(w, http.StatusOK, &f.machine)
	default:
		writeStatus(w, http.StatusNotFound, "NotFound", r.Method+" "+r.URL.Path)
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status: metav1.StatusFailure, Reason: metav1.StatusReason(reason), Code: int32(code), Message: msg})
}

func newFake(t *testing.T, conflicts int) (*fakeAPI, *Client) {
	t.Helper()
	f := &fakeAPI{rv: 10, conflicts: conflicts}
	f.machine.APIVersion, f.machine.Kind = v1alpha1.SchemeGroupVersion.String(), "Machine"
	f.machine.Name = "m1"
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	c.Retry = RetryPolicy{Attempts: 4, Backoff: time.Millisecond}
	return f, c
}

func TestUpdateMachineStatusRetriesConflicts(t *testing.T) {
	f, c := newFake(t, 2)
	calls := 0
	got, err := c.UpdateMachineStatus(context.Background(), "m1", func(m *v1alpha1.Machine) error {
		calls++
		if m.Status.AgentVersion != "" {
			return fmt.Errorf("mutate got a stale copy: %+v", m.Status)
		}
		m.Status.AgentVersion = "v" + strconv.Itoa(calls)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 || f.gets != 3 || len(f.patches) != 3 {
		t.Errorf("mutate ran %d times, %d reads, %d patches; want 3 each", calls, f.gets, len(f.patches))
	}
	// each patch named the version its read returned: 10, then 11 and 12 after the other writers
	if strings.Join(f.patches, ",") != "10,11,12" {
		t.Errorf("patches guarded by resourceVersions %v, want 10,11,12", f.patches)
	}
	if got.Status.AgentVersion != "v3" || f.machine.Status.AgentVersion != "v3" || got.ResourceVersion != "13" {
		t.Errorf("result %+v (rv %s), stored %+v", got.Status, got.ResourceVersion, f.machine.Status)
	}
}

func TestUpdateMachineStatusGivesUp(t *testing.T) {
	f, c := newFake(t, 100)
	_, err := c.UpdateMachineStatus(context.Background(), "m1", func(m *v1alpha1.Machine) error {
		m.Status.Phase = v1alpha1.MachineReady
		return nil
	})
	if !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "gave up after 4 conflicting writes") ||
		!strings.Contains(err.Error(), "Machine m1") {
		t.Errorf("err = %v, want a conflict, naming the Machine and the attempts", err)
	}
	if len(f.patches) != 4 {
		t.Errorf("%d patches, want 4 (RetryPolicy.Attempts)", len(f.patches))
	}
}

func TestUpdateMachineStatusOtherOutcomes(t *testing.T) {
	boom := errors.New("boom")
	f, c := newFake(t, 0)
	if _, err := c.UpdateMachineStatus(context.Background(), "m1", func(*v1alpha1.Machine) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("mutate error: %v, want it returned", err)
	}
	got, err := c.UpdateMachineStatus(context.Background(), "m1", func(*v1alpha1.Machine) error { return ErrNoChange })
	if err != nil || got == nil || got.Name != "m1" {
		t.Errorf("ErrNoChange: %v, %v; want the Machine as read and no error", got, err)
	}
	if len(f.patches) != 0 {
		t.Errorf("%d patches after mutate refused to write", len(f.patches))
	}
	// errors other than conflicts are not retried
	f.otherErr = http.StatusInternalServerError
	if _, err := c.UpdateMachineStatus(context.Background(), "m1", func(*v1alpha1.Machine) error { return nil }); err == nil || len(f.patches) != 1 {
		t.Errorf("a 500: %v after %d patches, want an error after one", err, len(f.patches))
	}
	// a cancelled context ends the retries
	f.otherErr, f.conflicts = 0, 100
	c.Retry = RetryPolicy{Attempts: 100, Backoff: 20 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.UpdateMachineStatus(ctx, "m1", func(*v1alpha1.Machine) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled: %v, want the context's error", err)
	}
}

// DeleteFinishedOperation sends the UID and resourceVersion it was given as
// delete preconditions; the fake refuses a mismatch with 409, as the
// apiserver does, and answers 404 once the object is gone.
func TestDeleteFinishedOperationPreconditions(t *testing.T) {
	var mu sync.Mutex
	stored := true
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodDelete || r.URL.Path != "/apis/kubeslot.dev/v1alpha1/machineoperations/op1" {
			writeStatus(w, http.StatusNotFound, "NotFound", r.Method+" "+r.URL.Path)
			return
		}
		body, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(body))
		var opts metav1.DeleteOptions
		if err := json.Unmarshal(body, &opts); err != nil || opts.Preconditions == nil ||
			opts.Preconditions.UID == nil || opts.Preconditions.ResourceVersion == nil {
			writeStatus(w, http.StatusBadRequest, "BadRequest", "no preconditions in "+string(body))
			return
		}
		switch {
		case !stored:
			writeStatus(w, http.StatusNotFound, "NotFound", `machineoperations.kubeslot.dev "op1" not found`)
		case *opts.Preconditions.UID != "uid-1" || *opts.Preconditions.ResourceVersion != "5":
			writeStatus(w, http.StatusConflict, "Conflict", "Precondition failed")
		default:
			stored = false
			writeJSON(w, http.StatusOK, &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess})
		}
	}))
	defer srv.Close()
	c, err := New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.DeleteFinishedOperation(ctx, "op1", "uid-other", "5"); !apierrors.IsConflict(err) || !strings.Contains(err.Error(), "op1") {
		t.Errorf("another UID: %v, want a conflict naming op1", err)
	}
	if err := c.DeleteFinishedOperation(ctx, "op1", "uid-1", "4"); !apierrors.IsConflict(err) {
		t.Errorf("an older resourceVersion: %v, want a conflict", err)
	}
	if err := c.DeleteFinishedOperation(ctx, "op1", "uid-1", "5"); err != nil {
		t.Errorf("the version read: %v, want it deleted", err)
	}
	if err := c.DeleteFinishedOperation(ctx, "op1", "uid-1", "5"); !apierrors.IsNotFound(err) {
		t.Errorf("deleted already: %v, want not found", err)
	}
	if err := c.DeleteFinishedOperation(ctx, "op1", "", "5"); err == nil || len(bodies) != 4 {
		t.Errorf("no UID: %v after %d requests; want an error and no request", err, len(bodies))
	}
	if stored || !strings.Contains(bodies[2], `"preconditions":{"uid":"uid-1","resourceVersion":"5"}`) {
		t.Errorf("stored=%v; request bodies %q", stored, bodies)
	}
}
