package watcher

import "k8s.io/client-go/rest"

// UserAgent names the watcher's requests at the apiserver (its audit log
// tells them from the kubelet's, which acts as the same node).
const UserAgent = "kubeslot-watcher"

// TuneREST sets the watcher's user agent and rate limits on cfg and returns
// it. The binary applies it to its node identity (or kubeconfig); the fleet
// benchmark's in-process watchers do too, so they ask what the binary asks.
func TuneREST(cfg *rest.Config) *rest.Config {
	cfg.UserAgent = UserAgent
	// client-go's default (5 QPS, burst 10) makes a burst of spec changes
	// queue behind the status writes of the previous ones (each decision
	// reads and writes the Machine's status), delaying the next request file
	// by ~0.4 s. The watcher touches one Machine and is idle otherwise.
	cfg.QPS, cfg.Burst = 20, 40
	return cfg
}
