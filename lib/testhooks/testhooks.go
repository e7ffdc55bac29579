// Package testhooks says whether this binary carries the rig's test hooks:
// the environment variables KUBESLOT_TEST_* that pause a stage before a
// phase (lib/transition) or make the watcher fail or hold a read
// (lib/watcher). The rig builds its binaries with the build tag
// kubeslot_testhooks; `make build` and `make bundle` do not, so a shipped
// binary ignores those variables and the code behind them is compiled out
// (Enabled is a constant).
//
// Imported by the packages that read a hook (lib/transition, lib/watcher)
// and by tests that must know which build they run in.
package testhooks

// Tag is the build tag that turns the hooks on.
const Tag = "kubeslot_testhooks"
