package watcher

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/fsnotify/fsnotify"
	"k8s.io/client-go/rest"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// serve runs the watch loop until ctx ends. It runs the loop again with a
// fresh client when the identity files change (certificate rotation), and
// re-executes, in this process, the binary its unit's path leads to when
// that changes (an upgrade flipped current, the host root moved). It never
// restarts its own unit: a child in the unit's cgroup would die with it.
func (c Command) serve(ctx context.Context, st *started) error {
	log := c.Log
	fol := newFollower(st.root)
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the host root: %w", err)
	}
	defer fw.Close()
	base, err := st.root.Path()
	if err != nil {
		return err
	}
	// The base holds the current link (flipped by rename); the kubeconfig's
	// directory holds the identity (rewritten by rename when the kubelet
	// rotates it).
	idDir := filepath.Dir(st.kubeconfig)
	for _, d := range append([]string{base, idDir}, fol.dirs()...) {
		if err := fw.Add(d); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
	}
	// A change between this process's exec and the watch above has no event.
	if now := fol.changed(); now != "" {
		return reexec(log, now)
	}

	var readyOnce sync.Once
	ready := func(status string) {
		readyOnce.Do(func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS="+status) })
	}
	readyTimer := time.AfterFunc(c.ReadyAfter, func() {
		log.Warn("the cluster was not reached yet; telling systemd the watcher is up, and retrying", "after", c.ReadyAfter)
		ready("waiting for the cluster")
	})
	defer readyTimer.Stop()
	var watchdog <-chan time.Time
	if d, err := daemon.SdWatchdogEnabled(false); err == nil && d > 0 {
		// At once too: systemd's watchdog clock runs across re-execs, and
		// upgrades in a row would otherwise starve it.
		_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		t := time.NewTicker(d / 3)
		defer t.Stop()
		watchdog = t.C
	}
	hooksErr := ""
	if st.hooksErr != nil {
		hooksErr = st.hooksErr.Error()
	}

	cfg, err := st.rest()
	if err != nil {
		return err
	}
	id := identityOf(cfg)
	// A kubelet rotation is several events (new file, link made, link
	// renamed): decide once they have settled.
	idSettle := time.NewTimer(time.Hour)
	idSettle.Stop()
	defer idSettle.Stop()
	for {
		loopCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		loopCfg := cfg
		go func() {
			done <- Run(loopCtx, Options{
				Root: st.root, REST: loopCfg, NodeName: st.nodeName, MachineName: st.machineName,
				AgentVersion: buildinfo.Version, Log: log, Started: c.Started, UpgradeSettle: c.UpgradeSettle, HooksErr: hooksErr,
				BetweenReads: readGate(c.getenv(EnvTestReadGate), log),
				Synced:       func() { readyTimer.Stop(); ready("watching Machine " + st.machineName) },
			})
		}()
		restart, next := false, ""
		for !restart && next == "" {
			select {
			case <-ctx.Done():
				cancel()
				<-done
				log.Info("stopping on signal")
				return nil
			case err := <-done:
				cancel()
				return err
			case <-watchdog:
				_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
			case ev := <-fw.Events:
				switch {
				case filepath.Dir(ev.Name) == base && filepath.Base(ev.Name) == hostroot.CurrentLink, fol.concerns(ev.Name):
					next = fol.changed()
				// With the kubeconfig directly in the base, only the kubeconfig
				// itself names the identity; anything else there is not ours.
				case filepath.Dir(ev.Name) == idDir && (idDir != base || ev.Name == st.kubeconfig):
					idSettle.Reset(identitySettle)
				}
			case <-idSettle.C:
				// Rebuild only for another identity; one that cannot be read
				// (mid-rotation by another writer) keeps the client that works.
				ncfg, err := st.rest()
				if err != nil {
					log.Warn("the node identity changed but cannot be read; keeping the current client", "err", err.Error())
					continue
				}
				if nid := identityOf(ncfg); nid != id {
					log.Info("node identity changed; reconnecting")
					cfg, id, restart = ncfg, nid, true
				}
			case err := <-fw.Errors:
				log.Warn("host root watch error", "err", err.Error())
			}
		}
		cancel()
		<-done
		if next != "" {
			return reexec(log, next)
		}
	}
}

// reexec replaces this process with binary, same PID and arguments, so
// systemd sees the same service (no restart, no new invocation). The watch
// loop has stopped and every result is on disk, so nothing is lost. Exec
// returns only on failure: then exit 0 and let Restart=always start the
// unit's binary again.
func reexec(log *slog.Logger, binary string) error {
	log.Info("the release behind current changed; re-executing", "binary", binary)
	// The new process starts its watchdog pings only after its start-up
	// phases (the lock wait included): ping now.
	_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog+"\nSTATUS=re-executing "+binary)
	// argv[0] stays the path through current, so the new process follows
	// the link too.
	err := syscall.Exec(binary, os.Args, os.Environ())
	log.Error("re-exec failed; exiting for systemd to start the watcher again", "binary", binary, "err", err.Error())
	return nil
}

// follower knows the binary the unit runs, <base>/current/kubeslot-watcher
// as the unit names it, and tells when that path leads to another binary
// than this process runs: an upgrade flipped current, or the host root
// moved (the base re-pointed or replaced).
type follower struct {
	argv0 string // "" when not started through current: never follow
	self  string // the binary this process runs, links resolved
}

// newFollower follows only a watcher started as <base>/current/kubeslot-watcher,
// as the unit does: one run by hand from elsewhere stays what it is.
func newFollower(root *hostroot.Root) *follower {
	f := &follower{self: ownBinary()}
	// Not root.Path: that resolves the links this is about.
	unitPath := filepath.Join(root.Prefix(), root.HostPath(hostroot.CurrentLink, Stage))
	if len(os.Args) > 0 && filepath.Clean(os.Args[0]) == unitPath && f.self != "" {
		f.argv0 = unitPath
	}
	return f
}

// base is the host root as the unit's path names it (links not resolved).
func (f *follower) base() string { return filepath.Dir(filepath.Dir(f.argv0)) }

// dirs are the extra directories to watch: the one holding the base, whose
// entry changes when the host root is moved or re-pointed. (The base itself,
// holding current, is watched anyway.)
func (f *follower) dirs() []string {
	if f.argv0 == "" {
		return nil
	}
	return []string{filepath.Dir(f.base())}
}

// concerns reports whether an event on name may have changed the binary.
func (f *follower) concerns(name string) bool {
	return f.argv0 != "" && (name == f.base() || name == filepath.Join(f.base(), hostroot.CurrentLink))
}

// changed is the binary the unit's path leads to now when it differs from
// this process's, else "" (also when not following or nothing is there).
func (f *follower) changed() string {
	if f.argv0 == "" {
		return ""
	}
	real, err := filepath.EvalSymlinks(f.argv0)
	if err != nil {
		return ""
	}
	if fi, err := os.Stat(real); err != nil || !fi.Mode().IsRegular() || real == f.self {
		return ""
	}
	return real
}

// ownBinary is the binary this process runs, every link resolved.
func ownBinary() string {
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return real
	}
	return p
}

// identitySettle is how long identity events must be quiet before the
// identity is read again.
const identitySettle = 250 * time.Millisecond

// identityOf is a digest of everything that makes cfg's identity: server,
// CA, client pair or token, the files they name included.
func identityOf(cfg *rest.Config) string {
	h := sha256.New()
	put := func(b []byte) { fmt.Fprintf(h, "%d:", len(b)); h.Write(b) }
	file := func(p string) {
		if p == "" {
			put(nil)
			return
		}
		b, err := hostroot.ReadInput(p, 1<<20)
		if err != nil {
			b = []byte("unreadable: " + err.Error())
		}
		put([]byte(p))
		put(b)
	}
	t := cfg.TLSClientConfig
	for _, b := range [][]byte{[]byte(cfg.Host), t.CAData, t.CertData, t.KeyData, []byte(cfg.BearerToken)} {
		put(b)
	}
	for _, p := range []string{t.CAFile, t.CertFile, t.KeyFile, cfg.BearerTokenFile} {
		file(p)
	}
	return hex.EncodeToString(h.Sum(nil))
}
