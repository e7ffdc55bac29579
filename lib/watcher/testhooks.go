package watcher

import (
	"fmt"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/testhooks"
)

// The watcher's test hooks, read only in a build with lib/testhooks' tag
// (the rig's): a production watcher ignores them.
const (
	// EnvTestExitAfter=<Go duration>: the watcher logs a warning and exits
	// 1 that long after it started ("0s": at once, before READY), standing
	// in for a broken release.
	EnvTestExitAfter = "KUBESLOT_TEST_WATCHER_EXIT_AFTER"
	// EnvTestReadGate=<file>: every read of the applied state is held
	// between its two files for as long as the file exists (at most 5
	// minutes each), so a rig test can land a real commit inside the read.
	EnvTestReadGate = "KUBESLOT_TEST_WATCHER_READ_GATE"
)

// armExitHook arms EnvTestExitAfter: an error (a usage error, or exit 1 at
// once) ends the run now.
func (c Command) armExitHook() error {
	if !testhooks.Enabled {
		return nil
	}
	exit, err := testExitAfter(c.Env(EnvTestExitAfter))
	if err != nil || exit == nil {
		return err
	}
	if *exit <= 0 {
		c.Log.Warn("test hook: exiting 1 at start", "env", EnvTestExitAfter)
		return exitcode.Reported(exitcode.Failure)
	}
	time.AfterFunc(time.Until(c.Started.Add(*exit)), func() {
		c.Log.Warn("test hook: exiting 1", "env", EnvTestExitAfter, "after", *exit)
		os.Exit(exitcode.Failure)
	})
	return nil
}

// testExitAfter parses the EnvTestExitAfter hook: nil when unset.
func testExitAfter(v string) (*time.Duration, error) {
	if v == "" {
		return nil, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return nil, exitcode.UsageError(fmt.Errorf("%s=%q: want a Go duration such as 0s or 5s", EnvTestExitAfter, v))
	}
	return &d, nil
}

// readGate is the EnvTestReadGate hook (Options.BetweenReads): nil when
// unset, or in a production build.
func (c Command) readGate() func() {
	if !testhooks.Enabled {
		return nil
	}
	p, log := c.Env(EnvTestReadGate), c.Log
	if p == "" {
		return nil
	}
	return func() {
		if _, err := os.Stat(p); err != nil {
			return
		}
		log.Warn("test hook: holding the applied-state read between active and the slot's configuration", "gate", p)
		for end := time.Now().Add(5 * time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
			if _, err := os.Stat(p); err != nil {
				break
			}
		}
		log.Warn("test hook: applied-state read released", "gate", p)
	}
}
