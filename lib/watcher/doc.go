// Package watcher is the logic of the kubeslot-watcher stage: Decide, a pure
// function from what the watcher sees (the Machine, its Node, the applied
// configuration, the operations that target it, the request files and
// statuses on disk) to what it must do (write a request, publish a status,
// report conditions, register the Machine); Run, the loop that feeds it
// from client-go watches and fsnotify and carries out its actions; and
// Command, the binary's start-up under the installation lock (start.go) and
// its supervision of the loop (serve.go). Imported by cmd/kubeslot-watcher,
// and by the integration tests (the watcher tests and the fleet
// benchmark's in-process watchers).
//
// The watcher also applies spec.ttlSecondsAfterFinished: it deletes a
// finished operation its Machine took part in once the TTL has passed
// (ttl.go; Expiries decides, purely). The admission policy cannot compare
// completionTime with the clock (CEL in admission has no now()), so the TTL
// is kept by the watcher, not enforced by the cluster.
//
// A selector operation with spec.rollout is paced (rollout.go): its request
// is written only while this agent holds one of the rollout's slots
// (lib/rollout), and the slot goes back once the result is published.
// Waiting for a slot is the one time the watcher polls: one List of the
// operation's RolloutLeases per poll interval while the gate lets it try.
// It counts only the status entries of real targets (targets.go): it Lists
// the Machines the operation selects when an entry appears that its last
// List did not account for, at most once per poll interval. Its other
// gates: the emergency stop (RolloutStops, watched), the maintenance
// windows (windows.go), the health gate that holds a success back
// (health.go) and the soak that keeps the slot after it (rollout.go).
//
// The watcher, in more detail (moved here from DESIGN.md):
//
//   - Start-up (Command, start.go): the installation lock, waited for in
//     rounds of --lock-wait (30 s) for as long as another stage holds it,
//     telling systemd READY, WATCHDOG and who holds it after each (nothing
//     would restart a watcher that deferred); defer (69) unless the
//     installation is complete or being reset; the active applied
//     configuration (a corrupt one is reported Degraded and nothing is
//     dispatched); the lifecycle hooks of the active slot (a failure is
//     reported Degraded/LifecycleHooksFailed); a client from the node
//     identity, rebuilt when the kubelet rotates it; then serve until
//     SIGTERM. READY (Type=notify) after the first sync, or after
//     --ready-after (60 s) when the cluster cannot be reached.
//   - Watches: its Machine and its Node by field selector; operations (a
//     selector-targeted operation cannot be filtered by the server) and
//     RolloutStops (the emergency stop, a few objects only admins write)
//     cluster-wide. No polling (but for a rollout slot, above): idle, it makes no request besides its open
//     watches, each kept for the server-side timeout client-go asks; single
//     requests are bounded (lib/nodeidentity), watches are not. Each event
//     makes it decide again; a decision whose Machine status is already
//     current writes nothing (compared on the informer's copy, times in whole
//     seconds as the API keeps them).
//   - Decide: desired (the Machine spec) against applied, pending operations
//     and the files on disk. OnNodeDelete requests a repave only after the
//     Node was deleted, Immediate as soon as the spec differs; paused holds
//     everything but reset; a spec that fails the agent's own validation is
//     reported Degraded with the field and value.
//   - Reports: the Machine's status, the operation's status.machines entry
//     for this Machine, and an Event per transition. It registers its Machine
//     when missing. Repave and restart requests carry the Machine's
//     spec.disruption (the drain policy, not part of the desired
//     configuration); the drain's progress in a status becomes the Draining
//     condition, and an Event each time that condition changes (drain.go).
//     A cordon kubeslot left on the Node (its annotation names a request
//     whose final status is on disk, and no repave or restart is pending
//     or running) is undone, with a Warning Event (drain.go).
//   - Releases (serve.go): started as <base>/current/kubeslot-watcher, it
//     follows that link: when an upgrade flips it, it stops its loop (every
//     result is on disk) and re-executes the new binary in the same process.
//     It never
//     restarts its own unit. It turns the pending-upgrade signal into the
//     upgrade's final status (the verdict), keeps the release on probation
//     for --upgrade-probation before it advances last-good, and publishes
//     a rollback on probation (probation.go).
//   - Errors: an action that fails is retried with capped, jittered backoff
//     (2 s to 5 min), each error logged once.
//   - Metrics (metrics.go, lib/metrics): with [metrics] listen set in the
//     operator's config.toml, Prometheus metrics on that address (loopback
//     unless allow_remote); off by default. A metrics server that cannot
//     listen is logged and left off: the watcher never stops for it.
//   - Test hooks, in a rig build only (testhooks.go, lib/testhooks):
//     KUBESLOT_TEST_WATCHER_EXIT_AFTER=<duration> (exit 1 that
//     long after start, as a broken release would) and
//     KUBESLOT_TEST_WATCHER_READ_GATE=<file> (hold each read of the applied
//     state between its two files while the file exists).
package watcher
