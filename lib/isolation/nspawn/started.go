package nspawn

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/isolation/hostapi"
	"github.com/kubeslot/kubeslot/lib/kuberelease"
	"github.com/kubeslot/kubeslot/lib/nodeconfig"
)

// KubeletStartedAt asks the node's systemd when the running kubelet's main
// process started. systemd gives wall-clock timestamps in whole seconds
// only through `show`, too coarse to tell the old kubelet's last Node
// status from the new one's, so it reads the monotonic timestamp (µs) and
// converts it with the host's monotonic clock: a node shares the host's
// kernel, and nspawn sets up no time namespace.
func (b *Backend) KubeletStartedAt(ctx context.Context, slot string) (time.Time, error) {
	out, err := b.Exec(ctx, slot, "systemctl", "show", "--property=ExecMainPID,ExecMainStartTimestampMonotonic", nodeconfig.KubeletUnit)
	if err != nil {
		return time.Time{}, fmt.Errorf("kubelet start time in slot %s: %w", slot, err)
	}
	var nowMono unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &nowMono); err != nil {
		return time.Time{}, fmt.Errorf("kubelet start time in slot %s: monotonic clock: %w", slot, err)
	}
	return startedFromShow(out, time.Now(), time.Duration(nowMono.Nano()))
}

// startedFromShow converts `systemctl show` output (ExecMainPID and
// ExecMainStartTimestampMonotonic, µs) into a wall-clock time, given the
// wall and monotonic clocks read together.
func startedFromShow(out []byte, now time.Time, nowMono time.Duration) (time.Time, error) {
	props := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			props[k] = v
		}
	}
	if pid, err := strconv.Atoi(props["ExecMainPID"]); err != nil || pid <= 0 {
		return time.Time{}, fmt.Errorf("%s is not running (ExecMainPID=%q)", nodeconfig.KubeletUnit, props["ExecMainPID"])
	}
	us, err := strconv.ParseInt(props["ExecMainStartTimestampMonotonic"], 10, 64)
	if err != nil || us <= 0 {
		return time.Time{}, fmt.Errorf("%s: no start timestamp in %q", nodeconfig.KubeletUnit, hostapi.Tail(out, 256))
	}
	started := time.Duration(us) * time.Microsecond
	if started > nowMono {
		return time.Time{}, fmt.Errorf("%s: start timestamp %s is after the monotonic clock's %s", nodeconfig.KubeletUnit, started, nowMono)
	}
	return now.Add(started - nowMono), nil
}

// KubeletVersion runs the slot's kubelet binary with --version inside the
// node: the file the kubelet unit starts, in the node's own environment.
func (b *Backend) KubeletVersion(ctx context.Context, slot string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := b.Exec(ctx, slot, nodeconfig.KubeletBinary, "--version")
	if err != nil {
		return "", fmt.Errorf("kubelet version in slot %s: %w", slot, err)
	}
	v, err := kuberelease.ParseKubeletVersion(out)
	if err != nil {
		return "", fmt.Errorf("kubelet version in slot %s: %w", slot, err)
	}
	return v, nil
}
