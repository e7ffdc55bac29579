// Command kubeslot-watcher is the long-running stage: it follows this host's
// Machine, its MachineOperations and its Node in the cluster, drops request
// files for the worker stages, and publishes their results. The stage, its
// start-up and its supervision included, is lib/watcher's Command; main.go
// only turns flags into its input.
//
// Phases, top-down: parse flags → logger → host root → layout version
// (another one: exit 78, nothing done) → installation lock
// (bounded) → defer (exit 69, no error line) unless the installation is
// complete or being reset (a boot in the middle of an AgentReset: the
// watcher publishes its result) → load the active applied configuration (a
// damaged one is reported as Degraded, never acted on) → ask the active
// slot's node operator to ensure its lifecycle hooks (a failure is reported,
// not fatal; not while resetting)
// → cluster client from the node identity → release the lock → run (READY
// after the first sync, watchdog pings) until SIGTERM, rebuilding the client
// when the identity changes.
//
// Started as <base>/current/kubeslot-watcher (the unit), it follows that
// path: when an upgrade flips current or the host root is moved, so that
// the path leads to another binary, the watcher stops its loop and
// re-executes that binary in the same process (same PID, same
// unit invocation), and the new release's watcher reports the upgrade (the
// pending-upgrade signal, lib/requests). It never restarts its own unit.
//
// Test hooks, in a rig build only (lib/testhooks):
// KUBESLOT_TEST_WATCHER_EXIT_AFTER=<Go duration> makes the watcher log a
// warning and exit 1 that long after it started ("0s": at once, before
// READY), as a broken release would. KUBESLOT_TEST_WATCHER_READ_GATE=<file>
// holds every read of the applied state between its two files (active, then
// the slot's configuration) for as long as that file exists (at most 5
// minutes each), so that a rig test can land a real commit inside the read.
package main
