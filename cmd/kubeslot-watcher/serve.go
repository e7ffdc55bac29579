package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/fsnotify/fsnotify"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/watcher"
)

// serve runs the watch loop until ctx ends. It restarts the loop with a
// fresh client when the identity files change (certificate rotation), and
// re-executes the binary behind <base>/current when that changes.
func serve(ctx context.Context, st *started, f flags, log *slog.Logger) error {
	self, _ := currentBinary(st.root)
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
	// directory holds the identity (rewritten when the kubelet rotates it).
	for _, d := range []string{base, filepath.Dir(st.kubeconfig)} {
		if err := fw.Add(d); err != nil {
			return fmt.Errorf("watch %s: %w", d, err)
		}
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
				AgentVersion: buildinfo.Version, Log: log,
				Synced: func() { readyTimer.Stop(); ready("watching Machine " + st.machineName) },
			})
		}()
		restart, reexec := false, ""
		for !restart && reexec == "" {
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
				if filepath.Dir(ev.Name) == filepath.Dir(st.kubeconfig) && filepath.Dir(st.kubeconfig) != base {
					log.Info("node identity changed; reconnecting", "file", ev.Name)
					restart = true
					continue
				}
				if filepath.Base(ev.Name) == hostroot.CurrentLink {
					if now, err := currentBinary(st.root); err == nil && now != self {
						reexec = now
					}
				} else if ev.Name == st.kubeconfig {
					restart = true
				}
			case err := <-fw.Errors:
				log.Warn("host root watch error", "err", err.Error())
			}
		}
		cancel()
		<-done
		if reexec != "" {
			log.Info("the release behind current changed; re-executing", "binary", reexec)
			_, _ = daemon.SdNotify(false, "STATUS=re-executing "+reexec)
			err := syscall.Exec(reexec, append([]string{reexec}, os.Args[1:]...), os.Environ())
			// Exec returns only on failure: exit 0 and let Restart=always start
			// the unit's binary again.
			log.Error("re-exec failed; exiting for systemd to restart the watcher", "binary", reexec, "err", err.Error())
			return nil
		}
	}
}

// currentBinary is the local path of the watcher binary behind the current
// link, with every link resolved.
func currentBinary(root *hostroot.Root) (string, error) {
	p, err := root.Path(hostroot.CurrentLink, name)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(real); err != nil {
		return "", errors.New("no watcher binary at " + real)
	}
	return real, nil
}
