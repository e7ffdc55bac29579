package main

import (
	"context"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/ownership"
)

func lockFor(t *testing.T, root *hostroot.Root) *ownership.Lock {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := ownership.Acquire(ctx, root, ownership.Holder{Stage: "kubeslot-test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Release() })
	return l
}
