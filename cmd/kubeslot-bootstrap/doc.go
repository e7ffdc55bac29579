// Command kubeslot-bootstrap turns this host into a Kubernetes worker node on
// slot a. It is safe to run on every boot: the ownership record decides
// whether to install, resume from a checkpoint, or (on a complete host) only
// verify and repair the units from the applied configuration. The phases
// are in lib/bootstrap (Command); main.go only turns flags into its
// input.
//
// Exit codes: 0 done or nothing to do; 1 failed (invalid configuration, a
// different installation owns the host, a phase failed); 2 usage; 69 the
// installation lock stayed busy (another stage owns the host); 78 the host
// lacks what kubeslot will not install there (lib/hostprep names it, and
// how to provide it), or the host's layout version is not this release's
// (hostroot.CheckLayout), nothing changed.
//
// Environment for tests and sandboxes only (see lib/sandbox, lib/bootstrap):
// KUBESLOT_NODE_KUBELET_PORT, KUBESLOT_NODE_HEALTHZ_PORT, KUBESLOT_NODE_IP,
// KUBESLOT_NODE_READONLY_NET_SYSCTL=1, KUBESLOT_HOSTPREP=packages-only and,
// in a rig build only (lib/testhooks), the test hook
// KUBESLOT_TEST_PAUSE_AT=<checkpoint>. The first five are recorded in
// <base>/state/sandbox.json; later runs and stages use the record, the
// environment overriding it (lib/sandbox.Load).
package main
