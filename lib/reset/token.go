package reset

import (
	"context"
	"fmt"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/units"
)

// The join token and the reset (DESIGN.md, "Reset and the join token"): the
// operator's configuration stays, so the host can be bootstrapped again by
// setting a fresh token, but the token goes. A reset host is handed back,
// decommissioned or reused, and a bootstrap token still valid in its /etc
// would let anyone with that file join a node to the cluster. This is the
// one change outside the journal that a reset makes to a file kubeslot did
// not write: the file is the operator's, the secret in it is the cluster's.

// tokenNote is the comment that takes the token's place: the same on every
// host (the journal of the reset, with its time, is in the system log).
const tokenNote = "bootstrap_token removed by kubeslot-resetter: a reset host keeps no join credential; set a fresh token (or cluster.kubeconfig) here to bootstrap again"

// configFile resolves the operator's configuration, following links as a
// person would (it may be a link to a file the operator manages elsewhere;
// that file is what holds the token).
func (r *runner) configFile() (string, error) { return r.d.Root.Resolve(units.ConfigPath) }

// removeJoinToken takes cluster.bootstrap_token out of the configuration
// (config.RemoveJoinToken: a comment in its place, every other byte kept)
// and writes it back atomically (lib/atomicfile) with its mode and owner,
// so a crash leaves the old file or the new one. Idempotent: a file without
// a token, or none at all, is left alone. A file that is not TOML stops the
// reset, naming it: the token may be in it, and only its owner can say
// what the file should be. The token's value is never read into a message.
func (r *runner) removeJoinToken(context.Context) error {
	local, err := r.configFile()
	if err != nil {
		return err
	}
	removed, exists, err := config.RemoveJoinTokenFile(local, tokenNote)
	switch {
	case err != nil && exists:
		return fmt.Errorf("%s: %w; fix the file or remove it, then run kubeslot-resetter again (until then it may still hold the join token)", units.ConfigPath, err)
	case err != nil:
		return err
	case !exists:
		r.log.Info("no configuration file, no join token to remove", "path", units.ConfigPath)
	case !removed:
		r.log.Info("no join token in the configuration", "path", units.ConfigPath)
	default:
		r.log.Info("join token removed from the configuration; the rest of it is kept", "path", units.ConfigPath)
	}
	return nil
}

// planJoinToken says what removeJoinToken would do, for the dry run.
func (r *runner) planJoinToken() string {
	local, err := r.configFile()
	if err != nil {
		return "BLOCKED: " + err.Error()
	}
	data, err := hostroot.ReadRegular(local, config.MaxFileSize)
	if isNotExist(err) {
		return "no " + units.ConfigPath + ": nothing to do"
	}
	if err != nil {
		return "BLOCKED: " + err.Error()
	}
	has, err := config.HasJoinToken(data)
	switch {
	case err != nil:
		return fmt.Sprintf("BLOCKED: %s: %v", units.ConfigPath, err)
	case has:
		return "remove cluster.bootstrap_token from " + units.ConfigPath + " (a comment in its place; the rest of the file stays)"
	}
	return "no join token in " + units.ConfigPath + ": nothing to do"
}
