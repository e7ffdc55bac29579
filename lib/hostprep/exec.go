package hostprep

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Bounds of what run keeps of a tool's output.
const (
	maxStdout  = 64 << 10 // what a caller parses (dpkg-query status)
	outputTail = 2 << 10  // the end of stdout+stderr, quoted in errors
)

// run executes a tool bounded by ctx, or by timeout when ctx has no
// deadline, with env added to this process's environment. It returns stdout
// (bounded); an error names the command line, the exit status or the
// deadline, and quotes the tail of the combined output, where tools put the
// reason they failed.
func run(ctx context.Context, timeout time.Duration, env []string, name string, args ...string) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok && timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = nil
	tail := &tailBuffer{max: outputTail}
	stdout := &limitBuffer{max: maxStdout}
	cmd.Stdout = io.MultiWriter(stdout, tail)
	cmd.Stderr = tail
	// A tool killed at the deadline may leave children holding the pipes;
	// do not wait for them forever.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	line := strings.Join(append([]string{name}, args...), " ")
	if ctxErr := ctx.Err(); ctxErr != nil {
		err = fmt.Errorf("%w (%v)", ctxErr, err)
	}
	out := strings.TrimSpace(tail.String())
	if out == "" {
		return nil, fmt.Errorf("%s: %w (no output)", line, err)
	}
	return nil, fmt.Errorf("%s: %w; output: %s", line, err, out)
}

// tailBuffer keeps the last max bytes written to it. Safe for the two
// goroutines exec uses for stdout and stderr.
type tailBuffer struct {
	mu        sync.Mutex
	max       int
	buf       []byte
	truncated bool
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.truncated = true
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.truncated {
		return "…" + string(t.buf)
	}
	return string(t.buf)
}

// limitBuffer keeps the first max bytes and drops the rest, so a chatty
// tool (apt-get) cannot fill memory; only short outputs are parsed.
type limitBuffer struct {
	max int
	buf bytes.Buffer
}

func (l *limitBuffer) Write(p []byte) (int, error) {
	if room := l.max - l.buf.Len(); room > 0 {
		l.buf.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

func (l *limitBuffer) Bytes() []byte { return l.buf.Bytes() }
