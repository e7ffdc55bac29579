package cri

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime serves the CRI runtime service's list and remove calls over a
// real gRPC server on a unix socket.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	mu       sync.Mutex
	items    []*runtimeapi.PodSandbox
	failures map[string]error // id -> error of its RemovePodSandbox
	removed  []string
}

func (f *fakeRuntime) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*runtimeapi.PodSandbox
	for _, s := range f.items {
		if st := req.GetFilter().GetState(); st != nil && st.GetState() != s.GetState() {
			continue
		}
		out = append(out, s)
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

func (f *fakeRuntime) RemovePodSandbox(_ context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failures[req.GetPodSandboxId()]; err != nil {
		return nil, err
	}
	f.removed = append(f.removed, req.GetPodSandboxId())
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func serve(t *testing.T, f *fakeRuntime) string {
	t.Helper()
	socket := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return socket
}

func sandbox(id string, state runtimeapi.PodSandboxState, created time.Time) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{Id: id, State: state, CreatedAt: created.UnixNano(),
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod-" + id, Namespace: "ns"}}
}

func TestRemoveDead(t *testing.T) {
	cut := time.Now()
	old, fresh := cut.Add(-time.Minute), cut.Add(time.Second)
	f := &fakeRuntime{
		items: []*runtimeapi.PodSandbox{
			sandbox("dead-1", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, old),
			sandbox("dead-2", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, old),
			sandbox("gone", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, old),
			sandbox("broken", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, old),
			sandbox("new-failed", runtimeapi.PodSandboxState_SANDBOX_NOTREADY, fresh), // the new kubelet's to retry
			sandbox("running", runtimeapi.PodSandboxState_SANDBOX_READY, old),
		},
		failures: map[string]error{
			"gone":   status.Error(codes.NotFound, "no such sandbox"),
			"broken": status.Error(codes.Internal, "CNI DEL failed"),
		},
	}
	rt, conn, err := Dial(serve(t, f))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	res, err := RemoveDead(t.Context(), rt, cut, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "broken of ns/pod-broken") || !strings.Contains(err.Error(), "CNI DEL failed") {
		t.Errorf("error %v, want the broken sandbox's, named", err)
	}
	if res != (Removed{Found: 4, Removed: 3}) {
		t.Errorf("result %+v, want 4 found, 3 removed (one already gone)", res)
	}
	slices.Sort(f.removed)
	if want := []string{"dead-1", "dead-2"}; !slices.Equal(f.removed, want) {
		t.Errorf("removed %q, want %q", f.removed, want)
	}
}

func TestRemoveDeadNoRuntime(t *testing.T) {
	rt, conn, err := Dial(filepath.Join(t.TempDir(), "absent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := RemoveDead(ctx, rt, time.Now(), slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "list pod sandboxes") {
		t.Errorf("no runtime on the socket: %v", err)
	}
}
