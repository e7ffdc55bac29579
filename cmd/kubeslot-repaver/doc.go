// Command kubeslot-repaver moves the node onto the other slot (repave), or
// restarts it in place. The stage is in lib/repave (Command), which also reads the
// unit's environment; main.go only turns flags into its input.
//
// What it does, in order: take the installation lock (busy → exit 69, the
// request stays for the path unit); defer (69) unless the installation is
// complete; resume an interrupted repave from <base>/state/repave.json; else
// claim the pending request of its kind by rename (requests/repave.json or
// restart.json); else work by hand. A repave by hand (`systemctl start
// kubeslot-repave@b`, or `kubeslot-repaver b`) rebuilds the ACTIVE applied
// configuration onto the target slot, or the configuration of --config.
//
// Kind and slot: --restart or KUBESLOT_REQUEST=restart restart in place;
// otherwise a repave onto the slot argument, else KUBESLOT_SLOT, else "next"
// (the slot that is not active). A run started by a path unit (systemd sets
// TRIGGER_PATH) that finds no request to claim does nothing. Before it stops
// the node, the repaver cordons it and evicts its pods (lib/drain) with the
// request's policy, or the defaults by hand; --no-drain skips that by hand.
//
// Exit codes: 0 done; 1 failed (a rolled-back repave included: the status
// file says why); 2 usage; 69 deferred (lock busy, bootstrap unfinished);
// 78 the host's layout version is not this release's, nothing changed.
//
// Environment for tests and sandboxes only: those of kubeslot-bootstrap
// (KUBESLOT_NODE_KUBELET_PORT, KUBESLOT_NODE_HEALTHZ_PORT, KUBESLOT_NODE_IP,
// KUBESLOT_NODE_READONLY_NET_SYSCTL=1), and, in a rig build only
// (lib/testhooks), the test hook KUBESLOT_TEST_PAUSE_AT=<phase> (prepare,
// standby, drain, switch, start, verify, commit, uncordon, clean, rollback,
// rollback-verify, restart-node): the run stops before that phase, its
// state written, and waits to be killed.
package main
