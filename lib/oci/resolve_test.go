package oci

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/oci/ocitest"
)

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

func TestResolveThroughMirrorsInOrder(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	img := ocitest.Image(t, "amd64", ocitest.Layer(t, E{Name: "pause", Body: "x"}))
	hex := reg.Push(t, "workload", "pause", img)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	// The upstream is a closed loopback port: only the mirrors can answer. A dead mirror first is skipped.
	upstream := closedAddr(t)
	dead := "http://" + closedAddr(t)
	got, err := Resolve(ctx, upstream+"/workload:pause", []string{dead, "http://" + reg.Host}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Endpoint != "http://"+reg.Host || got.Digest != "sha256:"+hex {
		t.Errorf("resolved %+v, want the second mirror and sha256:%s", got, hex)
	}
	reqs := strings.Join(reg.Requests(), "\n")
	if !strings.Contains(reqs, "HEAD /v2/workload/manifests/pause") {
		t.Errorf("the mirror saw no HEAD of the manifest:\n%s", reqs)
	}
	// by digest too
	if _, err := Resolve(ctx, upstream+"/workload@sha256:"+hex, []string{"http://" + reg.Host}, nil); err != nil {
		t.Errorf("by digest: %v", err)
	}
}

func TestResolveSaysNotFoundOrUnreachable(t *testing.T) {
	reg := ocitest.NewRegistry(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	upstream := closedAddr(t)

	_, err := Resolve(ctx, upstream+"/nothing:v1", []string{"http://" + reg.Host}, nil)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "http://"+reg.Host+": not found") || !strings.Contains(err.Error(), upstream) {
		t.Errorf("unknown image: %v, want ErrNotFound naming the mirror's answer and the registry", err)
	}
	_, err = Resolve(ctx, upstream+"/workload:v1", []string{"http://" + closedAddr(t)}, nil)
	if !errors.Is(err, ErrUnreachable) || errors.Is(err, ErrNotFound) {
		t.Errorf("nothing listening: %v, want ErrUnreachable", err)
	}
	if _, err := Resolve(ctx, "not a reference", nil, nil); err == nil {
		t.Error("an invalid reference resolved")
	}
}
