package watcher

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/requests"
)

func TestGated(t *testing.T) {
	gatedOp := pacedOp(v1alpha1.Rollout{Health: &v1alpha1.RolloutHealth{}})
	plain := pacedOp(v1alpha1.Rollout{})
	plain.Name = "plain"
	ops := []v1alpha1.MachineOperation{gatedOp, plain}
	ok := requests.Status{RequestID: "repave-4-roll", Kind: requests.Repave, Operation: "roll", Phase: requests.Succeeded}
	if op := gated(&ok, ops); op == nil || op.Name != "roll" {
		t.Errorf("a Succeeded repave of a gated rollout: %v, want held for the gate", op)
	}
	for what, mut := range map[string]func(*requests.Status){
		"in progress":          func(s *requests.Status) { s.Phase = requests.InProgress },
		"failed":               func(s *requests.Status) { s.Phase = requests.Failed },
		"passed already":       func(s *requests.Status) { s.Health = requests.HealthPassed },
		"an agent upgrade":     func(s *requests.Status) { s.Kind = requests.Upgrade },
		"no gate":              func(s *requests.Status) { s.Operation = "plain" },
		"the operation gone":   func(s *requests.Status) { s.Operation = "gone" },
		"a spec-driven repave": func(s *requests.Status) { s.Operation = "" },
	} {
		s := ok
		mut(&s)
		if op := gated(&s, ops); op != nil {
			t.Errorf("%s: held for the gate of %s, want published as is", what, op.Name)
		}
	}
	if got := healthTimeout(&v1alpha1.RolloutHealth{}); got.Seconds() != v1alpha1.DefaultHealthTimeout {
		t.Errorf("default timeout %v", got)
	}
}

func TestHealthChecks(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			w.WriteHeader(http.StatusOK)
		case "/api/v1/pods":
			if got := r.URL.Query().Get("fieldSelector"); got != "spec.nodeName=n1" {
				t.Errorf("pods listed with field selector %q", got)
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","items":[
				{"metadata":{"namespace":"a","name":"ready"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}},
				{"metadata":{"namespace":"a","name":"done"},"status":{"phase":"Succeeded"}},
				{"metadata":{"namespace":"b","name":"starting"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"False"}]}}]}`))
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	if msg := httpCheck(ctx, srv.URL+"/ok"); msg != "" {
		t.Errorf("a 200: %q", msg)
	}
	msg := httpCheck(ctx, srv.URL+"/alerts?token=secret")
	if !strings.Contains(msg, "503") || !strings.Contains(msg, srv.URL+"/alerts") || strings.Contains(msg, "secret") {
		t.Errorf("a 503: %q, want the URL without its query and the status", msg)
	}
	core, err := newCoreClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	l := &loop{Options: Options{NodeName: "n1"}, core: core}
	if got, want := l.podsNotReady(ctx), "pods on node n1 not Ready: b/starting"; got != want {
		t.Errorf("pods: %q, want %q", got, want)
	}
	h := &v1alpha1.RolloutHealth{HTTPChecks: []v1alpha1.HTTPCheck{{URL: v1alpha1.URL(srv.URL + "/ok")}, {URL: v1alpha1.URL(srv.URL + "/down")}}}
	if got := l.unhealthy(ctx, h); !strings.Contains(got, "b/starting") || !strings.Contains(got, "/down answered 503") || strings.Contains(got, "/ok") {
		t.Errorf("unhealthy: %q", got)
	}
}
