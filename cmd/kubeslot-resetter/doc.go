// Command kubeslot-resetter removes kubeslot from this host, leaving it as it
// was before bootstrap: every kubeslot unit, node machine, nspawn setting,
// slot rootfs and host change the ownership journal records, then the host
// root and, last, the ownership record. The stage is in lib/reset
// (Command), which also reads the unit's environment; main.go only turns
// flags into its input.
//
// Entry points: by hand (asks for confirmation on stdin unless --yes;
// --dry-run lists what would be removed and changes nothing); from an
// AgentReset request: kubeslot-reset.service sets KUBESLOT_REQUEST=reset and
// the run hands the request over to kubeslot-resetting.service; and
// --resume, what that unit runs from its own copy of this binary: it claims
// the request, does the work, reports it Succeeded and stops the watcher
// last, never prompting. Killed, or cut by a power loss, it is started again
// by systemd and finishes the reset under way (lib/reset).
//
// Exit codes: 0 done, or nothing to reset (no ownership record); 1 failed
// (the record stays "resetting"; a re-run resumes); 2 usage, or no
// confirmation; 69 the installation lock stayed busy; 78 the host's layout
// version is not this release's (refused before anything, unless --force).
//
// Kept on purpose: /etc/kubeslot/config.toml, the operator's input, but
// without its join token (cluster.bootstrap_token becomes a comment, the
// rest stays byte for byte): a reset host keeps no credential that can join
// a cluster. With the first-boot unit removed, nothing bootstraps from it at
// the next boot; a fresh token and `kubeslot-bootstrap --config` (or a
// re-enabled unit) reinstall.
//
// Environment for tests only, read by a rig build only (lib/testhooks):
// KUBESLOT_TEST_PAUSE_AT=<step> stops the run before that step (lib/reset
// step names) and waits to be killed.
package main
