package rig

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeslot/kubeslot/lib/drain"
)

// WaitFor polls cond every 200 ms for up to a minute.
func WaitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !cond() {
		select {
		case <-wctx.Done():
			t.Fatalf("%s: not within a minute", what)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func NodeState(t *testing.T, ctx context.Context, c *kubernetes.Clientset, node string) (bool, string) {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Unschedulable, n.Annotations[drain.Annotation]
}
