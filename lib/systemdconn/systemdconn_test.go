package systemdconn

import (
	"context"
	"errors"
	"testing"
)

func TestOnce(t *testing.T) {
	ctx := t.Context()
	dials := 0
	ok := func(context.Context) (int, error) { dials++; return 7, nil }
	var o Once[int]
	if _, made := o.Made(); made {
		t.Fatal("made before any call")
	}
	for range 3 {
		if c, err := o.Get(ctx, nil, ok); c != 7 || err != nil {
			t.Fatalf("Get = %d, %v", c, err)
		}
	}
	if c, made := o.Made(); dials != 1 || !made || c != 7 {
		t.Errorf("dials %d, Made %d %v: want one dial, remembered", dials, c, made)
	}

	// A failed dial is remembered.
	var f Once[int]
	boom := errors.New("boom")
	bad := func(context.Context) (int, error) { dials++; return 0, boom }
	dials = 0
	for range 2 {
		if _, err := f.Get(ctx, nil, bad); !errors.Is(err, boom) {
			t.Fatalf("Get = %v, want boom", err)
		}
	}
	if _, made := f.Made(); dials != 1 || made {
		t.Errorf("dials %d, made %v: want one failed dial, nothing made", dials, made)
	}

	// A caller that gives up first is not remembered: the next call dials.
	var c Once[int]
	release := make(chan struct{})
	slow := func(context.Context) (int, error) { <-release; return 1, nil }
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.Get(cctx, nil, slow); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Get = %v, want context.Canceled", err)
	}
	close(release)
	if v, err := c.Get(ctx, nil, ok); v != 7 || err != nil {
		t.Errorf("Get after a cancelled one = %d, %v; want a new dial", v, err)
	}
	// The life context reaches the dial.
	type key struct{}
	life := context.WithValue(ctx, key{}, "life")
	var l Once[string]
	got, _ := l.Get(ctx, life, func(c context.Context) (string, error) { v, _ := c.Value(key{}).(string); return v, nil })
	if got != "life" {
		t.Errorf("dial got context value %q, want the life context", got)
	}
}
