package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/fsnotify/fsnotify"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/watcher"
)

// serve runs the watch loop until ctx ends, and runs it again with a fresh
// client when the identity files change (certificate rotation). It never
// re-executes or restarts itself: a new release's watcher is started by
// the upgrader's unit restarting kubeslot-watcher.service (DESIGN.md, "The
// watcher").
func serve(ctx context.Context, st *started, f flags, log *slog.Logger, t0 time.Time) error {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the node identity: %w", err)
	}
	defer fw.Close()
	base, err := st.root.Path()
	if err != nil {
		return err
	}
	// The kubeconfig's directory holds the identity, rewritten (by rename)
	// when the kubelet rotates it.
	idDir := filepath.Dir(st.kubeconfig)
	if err := fw.Add(idDir); err != nil {
		return fmt.Errorf("watch %s: %w", idDir, err)
	}

	var readyOnce sync.Once
	ready := func(status string) {
		readyOnce.Do(func() { _, _ = daemon.SdNotify(false, daemon.SdNotifyReady+"\nSTATUS="+status) })
	}
	readyTimer := time.AfterFunc(f.ReadyAfter, func() {
		log.Warn("the cluster was not reached yet; telling systemd the watcher is up, and retrying", "after", f.ReadyAfter)
		ready("waiting for the cluster")
	})
	defer readyTimer.Stop()
	var watchdog <-chan time.Time
	if d, err := daemon.SdWatchdogEnabled(false); err == nil && d > 0 {
		t := time.NewTicker(d / 3)
		defer t.Stop()
		watchdog = t.C
	}
	hooksErr := ""
	if st.hooksErr != nil {
		hooksErr = st.hooksErr.Error()
	}

	for {
		loopCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		cfg, err := st.rest()
		if err != nil {
			cancel()
			return err
		}
		go func() {
			done <- watcher.Run(loopCtx, watcher.Options{
				Root: st.root, REST: cfg, NodeName: st.nodeName, MachineName: st.machineName,
				AgentVersion: buildinfo.Version, Log: log, Started: t0, UpgradeSettle: f.UpgradeSettle, HooksErr: hooksErr,
				Synced: func() { readyTimer.Stop(); ready("watching Machine " + st.machineName) },
			})
		}()
		for restart := false; !restart; {
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
				// With the kubeconfig directly in the base, only the kubeconfig
				// itself names the identity; anything else there is not ours.
				if idDir != base || ev.Name == st.kubeconfig {
					log.Info("node identity changed; reconnecting", "file", ev.Name)
					restart = true
				}
			case err := <-fw.Errors:
				log.Warn("identity watch error", "err", err.Error())
			}
		}
		cancel()
		<-done
	}
}
