// Package cri asks a node's container runtime, over its CRI socket, for the
// one thing kubeslot needs from the host side: removing the pod sandboxes a
// node's previous run left dead. The slots share containerd's state, so a
// new node starts with every old pod's sandbox listed as not ready, and its
// kubelet tears each one down (a CNI DEL) in the path of that pod's restart.
// Removed here while the kubelet waits for its first sync, they cost the
// workload nothing (DESIGN.md, "Warm standby").
//
// lib/repave (the repaver) imports it; nothing else should: gRPC must stay
// out of the watcher (cmd/kubeslot-watcher/deps_test.go).
package cri

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// callTimeout bounds each CRI call: a RemovePodSandbox runs the CNI DEL of
// the pod's network, which the plugins bound themselves.
const callTimeout = 30 * time.Second

// parallel is how many sandboxes are removed at once: enough for the pods
// of a busy node to go in a few rounds, few enough not to starve the
// kubelet that starts beside them.
const parallel = 4

// Runtime is the part of the CRI runtime service kubeslot calls.
type Runtime interface {
	ListPodSandbox(ctx context.Context, in *runtimeapi.ListPodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.ListPodSandboxResponse, error)
	RemovePodSandbox(ctx context.Context, in *runtimeapi.RemovePodSandboxRequest, opts ...grpc.CallOption) (*runtimeapi.RemovePodSandboxResponse, error)
}

// Dial connects to the CRI socket at the local path socket (nothing is sent
// until the first call). Close the connection when done.
func Dial(socket string) (Runtime, io.Closer, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("CRI socket %s: %w", socket, err)
	}
	return runtimeapi.NewRuntimeServiceClient(conn), conn, nil
}

// Removed is what RemoveDead did.
type Removed struct {
	Found   int // dead sandboxes created before the cut-off
	Removed int // of those, removed here or already gone
}

// RemoveDead removes every pod sandbox that is not ready and was created
// before before: what a stopped node left, never one the new kubelet has
// just made (its sandboxes are created after before, and a failed one is
// its to retry). A sandbox that is already gone (the kubelet's own garbage
// collection got there first) counts as removed. RemovePodSandbox alone
// does the teardown: a StopPodSandbox first would run the CNI DEL twice.
func RemoveDead(ctx context.Context, rt Runtime, before time.Time, log *slog.Logger) (Removed, error) {
	lctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := rt.ListPodSandbox(lctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State: &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_NOTREADY},
	}})
	if err != nil {
		return Removed{}, fmt.Errorf("list pod sandboxes: %w", err)
	}
	var dead []*runtimeapi.PodSandbox
	for _, s := range resp.GetItems() {
		if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_NOTREADY && s.GetCreatedAt() < before.UnixNano() {
			dead = append(dead, s)
		}
	}
	var (
		mu   sync.Mutex
		res  = Removed{Found: len(dead)}
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, parallel)
	)
	for _, s := range dead {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			err := remove(ctx, rt, s.GetId())
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("pod sandbox %s of %s/%s: %w", s.GetId(), s.GetMetadata().GetNamespace(), s.GetMetadata().GetName(), err))
				return
			}
			res.Removed++
			log.Debug("dead pod sandbox removed", "id", s.GetId(), "namespace", s.GetMetadata().GetNamespace(), "pod", s.GetMetadata().GetName())
		})
	}
	wg.Wait()
	return res, errors.Join(errs...)
}

func remove(ctx context.Context, rt Runtime, id string) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, err := rt.RemovePodSandbox(cctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	return err
}
