package hostapi

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// maxOutput bounds what ExecRunner keeps of a command's output: callers
// parse short answers (is-system-running) and quote tails in errors.
const maxOutput = 256 << 10

// errTail is how much of the output an error quotes.
const errTail = 2 << 10

// ExecRunner is the real Runner: os/exec with a fixed environment, so
// nothing of the caller's own environment (proxies, locale, a pager) leaks
// into host tools.
type ExecRunner struct {
	// Env is the whole environment of every command; nil means
	// DefaultEnv.
	Env []string
}

var _ Runner = ExecRunner{}

// DefaultEnv is the environment ExecRunner gives commands by default.
var DefaultEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LANG=C.UTF-8", "SYSTEMD_PAGER=", "SYSTEMD_COLORS=0", "TERM=dumb",
}

// Run implements Runner.
func (r ExecRunner) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = r.Env
	if cmd.Env == nil {
		cmd.Env = DefaultEnv
	}
	out := &capped{max: maxOutput}
	cmd.Stdout = out
	cmd.Stderr = out
	// A command killed at the deadline may leave children holding the
	// pipe; do not wait for them forever.
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	b := out.Bytes()
	if err == nil {
		return b, nil
	}
	if cerr := context.Cause(ctx); cerr != nil {
		err = fmt.Errorf("%w (%v)", cerr, err)
	}
	return b, fmt.Errorf("%s: %w; output: %s", strings.Join(append([]string{name}, args...), " "), err, Tail(b, errTail))
}

// Tail is the end of out (at most n bytes), trimmed, for error messages;
// "(none)" when empty.
func Tail(out []byte, n int) string {
	s := strings.TrimSpace(string(out))
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	if s == "" {
		return "(none)"
	}
	return s
}

// capped keeps the first max bytes written and counts nothing else; the
// mutex is cheap insurance should Stdout and Stderr ever differ.
type capped struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (c *capped) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := c.max - c.buf.Len(); room > 0 {
		c.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (c *capped) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}
