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
	w, err := watchFiles(st)
	if err != nil {
		return err
	}
	defer w.fw.Close()
	// A change between this process's exec and the watch above has no event.
	if now := w.fol.changed(); now != "" {
		return reexec(ctx, log, now)
	}
	sd := c.tellSystemd()
	defer sd.stop()
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
		// API errors are counted at the transport (lib/metrics).
		loopCfg := rest.CopyConfig(cfg)
		if c.metrics != nil {
			loopCfg.Wrap(c.metrics.WrapTransport)
		}
		go func() {
			done <- Run(loopCtx, Options{
				Root: st.root, REST: loopCfg, NodeName: st.nodeName, MachineName: st.machineName,
				AgentVersion: buildinfo.Version, Log: log, Started: c.Started, UpgradeProbation: c.UpgradeProbation, HooksErr: hooksErr,
				RolloutLease: c.RolloutLease, RolloutPoll: c.RolloutPoll,
				BetweenReads: c.readGate(),
				Synced:       func() { sd.synced("watching Machine " + st.machineName) },
				// The binary's start-up code leaves memory once it has run (pages.go).
				ReleaseStartup: true,
				Metrics:        c.metrics,
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
			case <-sd.watchdog:
				_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
			case ev := <-w.fw.Events:
				switch {
				case w.isRelease(ev.Name):
					next = w.fol.changed()
				case w.isIdentity(ev.Name):
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
			case err := <-w.fw.Errors:
				log.Warn("host root watch error", "err", err.Error())
			}
		}
		cancel()
		<-done
		if next != "" {
			return reexec(ctx, log, next)
		}
	}
}

// fileWatch is what serve watches on the host: the base, which holds the
// current link (flipped by rename); the kubeconfig's directory, which holds
// the identity (rewritten by rename when the kubelet rotates it); and the
// directories the follower needs.
type fileWatch struct {
	fw                    *fsnotify.Watcher
	fol                   *follower
	base, idDir, kubeconf string
}

func watchFiles(st *started) (*fileWatch, error) {
	base, err := st.root.Path()
	if err != nil {
		return nil, err
	}
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch the host root: %w", err)
	}
	w := &fileWatch{fw: fw, fol: newFollower(st.root), base: base, idDir: filepath.Dir(st.kubeconfig), kubeconf: st.kubeconfig}
	for _, d := range append([]string{base, w.idDir}, w.fol.dirs()...) {
		if err := fw.Add(d); err != nil {
			fw.Close()
			return nil, fmt.Errorf("watch %s: %w", d, err)
		}
	}
	return w, nil
}

// isRelease: name may lead the unit's path to another binary.
func (w *fileWatch) isRelease(name string) bool {
	return filepath.Dir(name) == w.base && filepath.Base(name) == hostroot.CurrentLink || w.fol.concerns(name)
}

// isIdentity: name may be the node identity. With the kubeconfig directly
// in the base, only the kubeconfig itself names it; anything else there is
// not ours.
func (w *fileWatch) isIdentity(name string) bool {
	return filepath.Dir(name) == w.idDir && (w.idDir != w.base || name == w.kubeconf)
}

// notifier tells systemd the watcher is up (READY, once: after the first
// sync, or after ReadyAfter without the cluster) and alive (watchdog ticks).
type notifier struct {
	once     sync.Once
	timer    *time.Timer
	ticker   *time.Ticker
	watchdog <-chan time.Time // nil without a watchdog
}

func (c Command) tellSystemd() *notifier {
	n := &notifier{}
	n.timer = time.AfterFunc(c.ReadyAfter, func() {
		c.Log.Warn("the cluster was not reached yet; telling systemd the watcher is up, and retrying", "after", c.ReadyAfter)
		n.ready("waiting for the cluster")
	})
	if d, err := daemon.SdWatchdogEnabled(false); err == nil && d > 0 {
		// At once too: systemd's watchdog clock runs across re-execs, and
		// upgrades in a row would otherwise starve it.
		_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
		n.ticker = time.NewTicker(d / 3)
		n.watchdog = n.ticker.C
	}
	return n
}

func (n *notifier) ready(status string) {
	n.once.Do(func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS="+status) })
}

// synced is the first sync with the cluster: READY now.
func (n *notifier) synced(status string) {
	n.timer.Stop()
	n.ready(status)
}

func (n *notifier) stop() {
	n.timer.Stop()
	if n.ticker != nil {
		n.ticker.Stop()
	}
}

// reexec replaces this process with binary, same PID and arguments, so
// systemd sees the same service (no restart, no new invocation). The watch
// loop has stopped and every result is on disk, so nothing is lost. Exec
// returns only on failure: then exit 0 and let Restart=always start the
// unit's binary again.
//
// A stop signal that came first (ctx ended) wins: an upgrader flips current
// and then restarts the unit, so the flip and systemd's SIGTERM can reach
// the watcher together; the signal, taken by this process's handler, would
// not survive the exec, and the new image would run on until systemd's stop
// timeout killed it (30 s, and a failed unit that the recovery unit takes
// for a crash).
func reexec(ctx context.Context, log *slog.Logger, binary string) error {
	if ctx.Err() != nil {
		log.Info("stopping on signal; not re-executing the new release", "binary", binary)
		return nil
	}
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
