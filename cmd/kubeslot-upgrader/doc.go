// Command kubeslot-upgrader replaces kubeslot itself (every binary and unit
// file, as one bundle) on a running host, and `kubeslot-upgrader recover`
// falls back to the last good release. The stage is in lib/upgrade
// (Command), which also reads the unit's environment; main.go only turns
// flags into its input.
//
// Upgrade (the default command), in order: take the installation lock (busy
// → exit 69, the request stays for the path unit); defer (69) unless the
// installation is complete; finish an interrupted upgrade (the pending-
// upgrade signal, or a claimed request); else claim the pending request
// (requests/upgrade.json, from an AgentUpgrade operation), or upgrade by
// hand from --bundle FILE [--sha256 HEX]; then download → last-good →
// unpack → smoke test → signal → switch → units → restart the watcher →
// health gate, or roll back. --preflight says what would change and
// changes nothing. KUBESLOT_REQUEST=upgrade (set by kubeslot-upgrade.service)
// means a run for a request: finding none is nothing to do.
//
// Recover (kubeslot-recovery.service, the watcher's OnFailure=, runs it from
// <base>/last-good): when current is not last-good, point it back, reinstall
// the last-good release's units, record the failure, restart the watcher.
//
// Exit codes: 0 done or nothing to do; 1 failed (refused before the switch,
// or rolled back: the status or the signal says why); 2 usage; 69 deferred;
// 78 the host's layout version is not this release's (recover too: an older
// last-good must not act on a newer layout), nothing changed.
//
// Test hook, in a rig build only (lib/testhooks):
// KUBESLOT_TEST_PAUSE_AT=<phase> (preflight, download, last-good, unpack,
// smoke-test, signal, switch, units, restart, health, rollback) stops an
// upgrade before that phase (its progress status written) and waits to be
// killed, as in every stage.
package main
