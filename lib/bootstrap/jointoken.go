package bootstrap

// The join token after the first join. Once the node has its identity (the kubelet's client certificate in
// <base>/identity, bound into every slot), the token is only a standing credential to join nodes to the cluster:
// the bootstrap takes it out of the configuration file (the reset's text scrub, every other byte kept), out of the
// applied configuration it commits, and out of the slot it configured; every later slot is configured without it
// (nodeidentity.SlotCredentials). It runs at the commit, after the Node was Ready, and again on every run over a
// complete host; each step is idempotent and an atomic rename, so a crash leaves the token or its absence, and the
// next run finishes the job.

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
	"github.com/kubeslot/kubeslot/lib/nodeidentity"
	"github.com/kubeslot/kubeslot/lib/state"
)

// joinTokenNote takes the token's place in the configuration file.
const joinTokenNote = "bootstrap_token removed by kubeslot-bootstrap: the node joined and keeps its identity; a re-join after the identity is lost needs a fresh token here"

// dropJoinToken removes the join token once the node identity is usable:
// from the configuration file (d.ConfigFile, "" none), from cfg (so the
// applied configuration does not keep it) and from slot's bootstrap
// kubeconfig ("" no slot). dropped says the identity is there and the
// token gone; without an identity nothing changes. The token never reaches
// a log line or an error.
func dropJoinToken(d Deps, cfg *config.Config, slot string, log *slog.Logger) (dropped bool, err error) {
	ok, err := nodeidentity.Usable(d.Root, d.now())
	if err != nil {
		return false, fmt.Errorf("join token: %w", err)
	}
	if !ok {
		if cfg.Cluster.BootstrapToken != "" {
			log.Info("join token kept: the node has no usable identity yet")
		}
		return false, nil
	}
	if d.ConfigFile != "" {
		// Through the host root, as the reset finds it: with a prefix,
		// a file given outside it is not the host's and is left alone.
		local, err := d.Root.Resolve(d.ConfigFile)
		if err != nil {
			return false, fmt.Errorf("%s: %w", d.ConfigFile, err)
		}
		removed, exists, err := config.RemoveJoinTokenFile(local, joinTokenNote)
		switch {
		case err != nil:
			return false, fmt.Errorf("%s: removing the join token: %w", d.ConfigFile, err)
		case !exists:
			log.Warn("the configuration file is not on the host (under the root prefix): the join token is not removed from it",
				"path", d.ConfigFile)
		case removed:
			log.Info("join token removed from the configuration: the node joined and authenticates with its identity; "+
				"the rest of the file is kept", "path", d.ConfigFile)
		}
	}
	cfg.Cluster.BootstrapToken = ""
	if slot != "" {
		if err := scrubSlotKubeconfig(d, cfg, slot, log); err != nil {
			return false, err
		}
	}
	return true, nil
}

// scrubSlotKubeconfig is rewriteSlotKubeconfig, logged when it changed the
// file.
func scrubSlotKubeconfig(d Deps, cfg *config.Config, slot string, log *slog.Logger) error {
	changed, err := rewriteSlotKubeconfig(d, cfg, slot)
	if err == nil && changed {
		log.Info("slot's bootstrap kubeconfig rewritten without the join token", "slot", slot, "path", nodeconfig.BootstrapKubeconfig)
	}
	return err
}

// rewriteSlotKubeconfig writes slot's bootstrap kubeconfig as a slot
// configured now gets it (no token): the running kubelet has read it
// already, and uses its certificate. A slot without the file is left
// alone (another isolation layout, or not configured).
func rewriteSlotKubeconfig(d Deps, cfg *config.Config, slot string) (bool, error) {
	p, err := d.Root.Machine(slot, nodeconfig.BootstrapKubeconfig)
	if err != nil {
		return false, err
	}
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	creds, err := nodeconfig.IdentityKubeconfig(d.Root, cfg)
	if err != nil {
		return false, err
	}
	rootfs, err := d.Root.Machine(slot)
	if err != nil {
		return false, err
	}
	changed, err := nodeconfig.WriteFiles(rootfs, []nodeconfig.File{{Path: nodeconfig.BootstrapKubeconfig,
		Data: creds.BootstrapKubeconfig, Mode: 0o600}})
	return len(changed) > 0, err
}

// dropCompleteJoinToken is dropJoinToken on a complete host, for every
// slot: the inactive one may be a slot configured with the token before
// the node had its identity (or by a release that kept it), and a
// rollback would boot it. Each slot's bootstrap kubeconfig is rewritten
// and its applied configuration re-saved without the token when it has one
// (its fingerprint leaves secrets out, so nothing looks reconfigured). A
// host with no active slot only has its file scrubbed.
func dropCompleteJoinToken(d Deps, cfg *config.Config) error {
	store := state.NewStore(d.Root)
	_, found, err := store.Active()
	if err != nil {
		return err
	}
	dropped, err := dropJoinToken(d, cfg, "", d.Log)
	if err != nil || !dropped || !found {
		return err
	}
	for _, slot := range cfg.Isolation.Slots {
		if err := scrubSlotKubeconfig(d, cfg, slot, d.Log); err != nil {
			return err
		}
		a, err := store.LoadApplied(slot)
		if errors.Is(err, state.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if a.Config.Cluster.BootstrapToken == "" {
			continue
		}
		a.Config.Cluster.BootstrapToken = ""
		if err := store.SaveApplied(a); err != nil {
			return err
		}
		d.Log.Info("join token removed from the applied configuration", "slot", slot)
	}
	return nil
}
