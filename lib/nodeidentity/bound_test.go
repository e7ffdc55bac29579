package nodeidentity

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// fakeAPI answers GET /api/v1/nodes/slow after 2 s and streams one watch
// event for /api/v1/nodes?watch=true after 600 ms, then holds the stream.
func fakeAPI(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Query().Get("watch") == "true":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-time.After(600 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
			fmt.Fprintln(w, `{"type":"ADDED","object":{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1","resourceVersion":"2"}}}`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case r.URL.Path == "/api/v1/nodes/slow":
			select {
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
				return
			}
			fmt.Fprintln(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"slow"}}`)
		default:
			fmt.Fprintln(w, `{"kind":"Node","apiVersion":"v1","metadata":{"name":"fast"}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestBoundRequestsSparesWatches: a single request is cut at the bound, a
// watch is not (rest.Config.Timeout would cut every watch
// of an idle agent after 5 s); with Timeout, the same watch is cut.
func TestBoundRequestsSparesWatches(t *testing.T) {
	srv := fakeAPI(t)
	bound := 200 * time.Millisecond
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, WrapTransport: boundRequests(bound)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if n, err := cs.CoreV1().Nodes().Get(ctx, "fast", metav1.GetOptions{}); err != nil || n.Name != "fast" {
		t.Fatalf("fast GET: %v %v", n, err)
	}
	t0 := time.Now()
	if _, err := cs.CoreV1().Nodes().Get(ctx, "slow", metav1.GetOptions{}); err == nil || time.Since(t0) > time.Second {
		t.Errorf("slow GET: %v after %s, want cut at %s", err, time.Since(t0), bound)
	}
	if !watchSeesEvent(t, cs) {
		t.Error("the watch was cut by the request bound")
	}

	// What the bound replaces: rest.Config.Timeout also ends the watch.
	cut, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, Timeout: bound})
	if err != nil {
		t.Fatal(err)
	}
	if watchSeesEvent(t, cut) {
		t.Error("with rest.Config.Timeout the watch survived: this test no longer shows the difference")
	}
}

func watchSeesEvent(t *testing.T, cs *kubernetes.Clientset) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	w, err := cs.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == "ADDED" {
			return true
		}
	}
	return false
}
