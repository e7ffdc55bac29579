package main

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/kubeslot/kubeslot/lib/isolation/nspawn"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/sandbox"
)

// nodeHookCmd is run by systemd, not by people: the nspawn node machine's
// drop-in runs `kubeslot node-hook pre-start <slot>` before every start of the
// node (lib/isolation/nspawn/hooks.go). It is the one command of this binary
// that changes the host: the node's host-dependent settings, files that are
// kubeslot's and journalled already.
type nodeHookCmd struct {
	PreStart nodeHookPreStartCmd `cmd:"" name:"pre-start" help:"Re-render what the slot's node takes from the host, before its machine starts."`
}

type nodeHookPreStartCmd struct {
	Slot string `arg:"" help:"The slot whose node is starting."`
}

// preStartBound keeps the hook well inside the node unit's start timeout.
const preStartBound = 45 * time.Second

// Run exits 1 only when the node's settings are known stale and could not
// be rewritten (systemd then does not start the node); when the hook cannot
// run (no record yet, a file it cannot read) it says so and exits 0, so the
// node starts with the settings written last.
func (c nodeHookPreStartCmd) Run(e *env) error {
	log := e.log
	root, err := e.globals.Root()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), preStartBound)
	defer cancel()
	d := nspawn.HookDeps{Root: root, Log: log}
	if d.Record, err = ownership.Load(root); err != nil {
		log.Warn("pre-start hook: no ownership record: host files are not rewritten", "err", err)
		d.Record = nil
	}
	sb, err := sandbox.Load(root, os.Getenv)
	if err != nil {
		log.Warn("pre-start hook: cannot run: the node starts with the settings written last", "err", err)
		return nil
	}
	d.Settings = sandbox.BackendSettings(sb)
	if _, err := nspawn.PreStart(ctx, d, c.Slot); err != nil {
		if errors.Is(err, nspawn.ErrHookStale) {
			return err
		}
		log.Warn("pre-start hook: cannot run: the node starts with the settings written last", "err", err)
	}
	return nil
}
