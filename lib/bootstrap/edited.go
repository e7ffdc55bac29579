package bootstrap

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/ownership"
	"github.com/kubeslot/kubeslot/lib/state"
	"github.com/kubeslot/kubeslot/lib/verify"
)

// editedConfig decides a run whose configuration differs from the one the
// complete installation was made with (ownership.ErrDifferentInstallation
// from admission): an operator edited the file on an installed host. It is
// compared with the applied configuration, setting by setting
// (verify.ConfigDiff, as `kubeslot verify`'s config check does):
//
//   - settings a Machine's spec.node carries (version, rootfs, artifacts,
//     labels, taints, sandbox image, release mirror) are the Machine's after
//     installation: the file's value is not applied (a repave from the file
//     would be undone by the watcher, which repaves to the spec), each is
//     logged with the spec field to change, and the run goes on as a
//     complete host's (the repair still runs at every boot);
//   - any other setting (the machine name, the API server, the isolation
//     mode, timeouts, ...) cannot change on an installed host: the run is
//     refused, nothing changed, naming the file, each field with its value
//     and the installed one, and the way forward (put it back, or reset and
//     bootstrap again).
//
// An unfinished installation, or one without a readable applied
// configuration, keeps admission's refusal (err).
func editedConfig(d Deps, cfg *config.Config, rec *ownership.Record, err error) (ownership.Decision, error) {
	if rec == nil || rec.Checkpoint != ownership.CheckpointComplete {
		return 0, err
	}
	applied, aerr := state.NewStore(d.Root).ActiveApplied()
	if aerr != nil || applied == nil {
		return 0, err
	}
	diffs, derr := verify.ConfigDiff(cfg, applied.Config)
	if derr != nil {
		return 0, errors.Join(err, derr)
	}
	file := d.ConfigFile
	if file == "" {
		file = "the configuration"
	}
	var fixed []string
	for _, df := range diffs {
		if df.Spec == "" {
			fixed = append(fixed, fmt.Sprintf("%s = %s (installed %s)", df.Field, df.File, df.Applied))
		}
	}
	if len(fixed) > 0 {
		return 0, fmt.Errorf("%s differs from installation %s in settings an installed host cannot take: %s; "+
			"put the installed values back, or reset the host (kubeslot-resetter) and bootstrap it again with this file: %w",
			file, rec.InstallID, strings.Join(fixed, "; "), err)
	}
	for _, df := range diffs {
		d.Log.Warn("configuration setting not applied: the Machine spec governs it after installation",
			"file", file, "field", df.Field, "value", df.File, "applied", df.Applied, "way_forward", verify.MachineWay(df, rec.Machine))
	}
	return ownership.Complete, nil
}
