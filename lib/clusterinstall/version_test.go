package clusterinstall

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	apiversion "k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
)

type fakeVersion apiversion.Info

func (f fakeVersion) ServerVersion(context.Context) (*apiversion.Info, error) {
	i := apiversion.Info(f)
	return &i, nil
}

func TestCheckVersion(t *testing.T) {
	for _, c := range []struct {
		info apiversion.Info
		ok   bool
	}{
		{apiversion.Info{GitVersion: "v1.37.2", Major: "1", Minor: "37"}, true},
		{apiversion.Info{GitVersion: "v1.32.0", Major: "1", Minor: "32"}, true},
		{apiversion.Info{GitVersion: "v1.33.1-eks-1234abc", Major: "1", Minor: "33+"}, true},
		{apiversion.Info{GitVersion: "weird", Major: "1", Minor: "34+"}, true},
		{apiversion.Info{GitVersion: "v1.31.9", Major: "1", Minor: "31"}, false},
		{apiversion.Info{GitVersion: "v1.30.0-gke.100", Major: "1", Minor: "30+"}, false},
		{apiversion.Info{GitVersion: "", Major: "", Minor: ""}, false},
	} {
		err := checkVersion(context.Background(), fakeVersion(c.info))
		if c.ok != (err == nil) {
			t.Errorf("%+v: %v, want ok=%v", c.info, err, c.ok)
		}
		if err != nil && c.info.GitVersion != "" &&
			(!strings.Contains(err.Error(), c.info.GitVersion) || !strings.Contains(err.Error(), MinKubernetesVersion)) {
			t.Errorf("%+v: %v, want both versions named", c.info, err)
		}
	}
}

// An old apiserver is refused before anything is applied: the fake answers /version and records every other
// request.
func TestInstallRefusesOldAPIServer(t *testing.T) {
	var mu sync.Mutex
	var others []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/version" {
			_ = json.NewEncoder(w).Encode(apiversion.Info{GitVersion: "v1.31.4", Major: "1", Minor: "31"})
			return
		}
		mu.Lock()
		others = append(others, r.Method+" "+r.URL.Path)
		mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer srv.Close()
	rep, err := Install(context.Background(), &rest.Config{Host: srv.URL}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "v1.31.4") || !strings.Contains(err.Error(), MinKubernetesVersion) {
		t.Errorf("Install on 1.31: %v, want a refusal naming v1.31.4 and %s", err, MinKubernetesVersion)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rep.Changes) > 0 || len(others) > 0 {
		t.Errorf("Install on 1.31 did %+v, requests %q; want nothing but GET /version", rep.Changes, others)
	}
}
