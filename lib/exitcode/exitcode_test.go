package exitcode

import (
	"errors"
	"fmt"
	"testing"
)

func TestOf(t *testing.T) {
	base := errors.New("lock held")
	cases := []struct {
		err  error
		want int
	}{
		{nil, OK},
		{base, Failure},
		{Defer(base), Deferred},
		{fmt.Errorf("watcher: %w", Defer(base)), Deferred},
		{UsageError(base), Usage},
	}
	for _, c := range cases {
		if got := Of(c.err); got != c.want {
			t.Errorf("Of(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	if !errors.Is(Defer(base), base) {
		t.Error("Defer hides the cause from errors.Is")
	}
	if Deferred != 69 {
		t.Error("Deferred must be EX_UNAVAILABLE (69): unit files list it")
	}
}
