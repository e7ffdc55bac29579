package rig

// Main is the TestMain of every subject package: it decides whether the rig can run here, starts the one control
// plane the test binary shares, and checks afterwards that the machine is exactly as it was (leakcheck), printing
// the rig's figures at the end.
//
// Environment:
//
//	KUBESLOT_REQUIRE_RIG=1  a rig that cannot run is a failure, not a skip (CI sets it); missing kube binaries or a
//	                        missing node rootfs are then built (scripts/kube-bins.sh, scripts/node-rootfs.sh)
//	KUBESLOT_KUBE_BIN       directory of etcd, kube-apiserver, kube-controller-manager, kubelet (else the cache of
//	                        scripts/kube-bins.sh)
//	KUBESLOT_NODE_ROOTFS    node rootfs tarball (else the cache of scripts/node-rootfs.sh)
//	KUBESLOT_KEEP_KUBE_DIR=1  keep the control plane's work dir (logs, PKI) after the run

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/integration/kube"
	"github.com/kubeslot/kubeslot/integration/leakcheck"
	"github.com/kubeslot/kubeslot/integration/sdhost"
)

var (
	// Cluster is the test binary's control plane (with kube-controller-manager); nil when the rig cannot run.
	Cluster *kube.ControlPlane
	// ClusterSkip says why cluster is nil because of the machine; ClusterErr, why it is nil because it failed.
	ClusterSkip string
	ClusterErr  error
	// KubeBinDir holds the kube binaries the cluster runs (the node test serves kubelet from it).
	KubeBinDir string
	// Required: KUBESLOT_REQUIRE_RIG=1, a rig that cannot run fails the tests that need it.
	Required = os.Getenv("KUBESLOT_REQUIRE_RIG") == "1"
	// Figures collects the rig's measured durations, printed as a table at the end.
	Figures = &figureTable{}
)

// NeedCluster returns the shared control plane, or skips the test with the reason it is absent (fails instead when
// the rig is required or the control plane failed to start).
func NeedCluster(t *testing.T) *kube.ControlPlane {
	t.Helper()
	switch {
	case Cluster != nil:
		return Cluster
	case ClusterErr != nil:
		t.Fatalf("control plane failed to start: %v", ClusterErr)
	case Required:
		t.Fatalf("KUBESLOT_REQUIRE_RIG=1 but the rig cannot run here: %s", ClusterSkip)
	default:
		t.Skipf("rig unavailable: %s", ClusterSkip)
	}
	return nil
}

// Main runs the test binary's tests as the comment at the top of this file says and returns its exit code.
func Main(m *testing.M) int {
	defer removeBins()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx := context.Background()

	hostReason, binReason := rigUnavailable(ctx)
	ClusterSkip = strings.Join(nonEmpty(hostReason, binReason), "; ")
	if hostReason != "" {
		// no isolated hosts here: nothing in this test binary can change the machine, no leak check needed
		return runReporting(m, hostReason)
	}

	// Exclusive for the first snapshot: no other test binary may be half-way through its own rig work. Then only
	// Share while the tests run (others may run hosts alongside), and Exclusive again for the last snapshot, which
	// therefore waits until every other binary has cleaned up.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	releaseEx, err := leakcheck.Exclusive(lctx)
	cancel()
	if err != nil {
		fmt.Printf("rig: FAIL: machine lock: %v\n", err)
		return 1
	}
	before, err := leakcheck.Take()
	if err != nil {
		releaseEx()
		fmt.Printf("rig: FAIL: leakcheck snapshot: %v\n", err)
		return 1
	}
	releaseShare, err := leakcheck.Share(ctx) // held by this process already: never waits
	releaseEx()
	if err != nil {
		fmt.Printf("rig: FAIL: machine lock: %v\n", err)
		return 1
	}

	var code int
	if binReason != "" {
		code = runReporting(m, binReason)
	} else {
		code = runWithCluster(ctx, m, log)
	}

	lctx, cancel = context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	releaseEx, err = leakcheck.Exclusive(lctx)
	releaseShare()
	if err != nil {
		fmt.Printf("rig: FAIL: machine lock for the final leak check: %v\n", err)
		return 1
	}
	defer releaseEx()
	// Check retries for a while: the last host's processes may still be reaped by the machine's init.
	cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
	defer ccancel()
	leaks, err := leakcheck.Check(cctx, before)
	if err != nil {
		fmt.Printf("rig: FAIL: leakcheck: %v\n", err)
		return 1
	}
	if len(leaks) > 0 {
		fmt.Printf("rig: FAIL: the tests left the machine changed (%d differences):\n  %s\n", len(leaks), strings.Join(leaks, "\n  "))
		code = 1
	} else {
		fmt.Println("rig: leakcheck: machine unchanged")
	}
	Figures.print()
	return code
}

// runReporting runs the tests without a control plane, saying why; with KUBESLOT_REQUIRE_RIG=1 that is a failure.
func runReporting(m *testing.M, reason string) int {
	if Required {
		fmt.Printf("rig: FAIL: KUBESLOT_REQUIRE_RIG=1 but the rig cannot run here: %s\n", reason)
		m.Run() // the tests that need the rig fail with the reason
		return 1
	}
	fmt.Printf("rig: unavailable, rig tests skip: %s\n", reason)
	return m.Run()
}

func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// runWithCluster starts the control plane, runs the tests and stops it.
func runWithCluster(ctx context.Context, m *testing.M, log *slog.Logger) int {
	sctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	t0 := time.Now()
	Cluster, ClusterErr = kube.Start(sctx, kube.Options{BinDir: KubeBinDir, Log: log, ControllerManager: true,
		// pods on a kubeslot node (TestPodsOnRig): the controllers a Deployment needs, node CIDRs, and the
		// apiserver's way to kubelets inside rig network namespaces
		Workloads: true, ClusterEgress: true})
	cancel()
	if ClusterErr != nil {
		Cluster = nil
		fmt.Printf("rig: FAIL: control plane: %v\n", ClusterErr)
		m.Run() // tests that need it fail with the error; the others still run
		return 1
	}
	Figures.Add("control plane ready", time.Since(t0))

	code := m.Run()

	t1 := time.Now()
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := Cluster.Stop(stopCtx); err != nil {
		fmt.Printf("rig: FAIL: stop control plane: %v\n", err)
		code = 1
	}
	Figures.Add("control plane stop", time.Since(t1))
	return code
}

// rigUnavailable returns why isolated hosts cannot run here and why the control plane cannot ("" when they can),
// and sets KubeBinDir. Without KUBESLOT_REQUIRE_RIG nothing is built: binaries missing from the cache are a reason
// to skip; with it, scripts/kube-bins.sh builds them (~16 minutes on a cold machine).
func rigUnavailable(ctx context.Context) (host, bins string) {
	if err := sdhost.Available(); err != nil { // includes "needs root"
		host = "isolated systemd host: " + strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	var err error
	if Required {
		KubeBinDir, err = kube.BinDir(ctx)
	} else {
		KubeBinDir, err = kube.CachedBinDir()
	}
	if err != nil {
		bins = "kube binaries: " + err.Error()
	}
	return host, bins
}

// figureTable records the rig's named measurements (boot times, readiness, benchmark figures) for the summary at the
// end. Figures are printed, never asserted. With KUBESLOT_FIGURES_FILE set, each figure is also appended to that file
// as one JSON line ({"name", "value", "unit", "at", "pid"}), so several test binaries and runs feed one table
// (scripts/bench.sh, scripts/benchtable).
type figureTable struct {
	mu      sync.Mutex
	rows    []figure
	fileErr error // the first failure to append to KUBESLOT_FIGURES_FILE, reported once
}

type figure struct {
	name  string
	value float64
	unit  string
}

// Units of figures; the table printer (scripts/benchtable) knows these.
const (
	UnitSeconds   = "s"
	UnitMiB       = "MiB"
	UnitKiB       = "KiB"
	UnitPerMinute = "requests/min"
	unitRatio     = "ratio"
	UnitCPUPct    = "CPU %"
	UnitCPUms     = "CPU ms/min"
)

// figureLine is one line of KUBESLOT_FIGURES_FILE.
type figureLine struct {
	Name  string    `json:"name"`
	Value float64   `json:"value"`
	Unit  string    `json:"unit"`
	At    time.Time `json:"at"`
	PID   int       `json:"pid"`
}

// Add records one duration (in seconds); a name may be added several times (one row each).
func (f *figureTable) Add(name string, d time.Duration) { f.AddValue(name, d.Seconds(), UnitSeconds) }

// AddValue records one measurement with its unit (see the unit constants; any short string works).
func (f *figureTable) AddValue(name string, value float64, unit string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rows = append(f.rows, figure{name, value, unit})
	path := os.Getenv("KUBESLOT_FIGURES_FILE")
	if path == "" || f.fileErr != nil {
		return
	}
	line, err := json.Marshal(figureLine{Name: name, Value: value, Unit: unit, At: time.Now().UTC(), PID: os.Getpid()})
	if err == nil {
		err = appendLine(path, append(line, '\n'))
	}
	if err != nil {
		f.fileErr = err
		fmt.Fprintf(os.Stderr, "rig: figures file KUBESLOT_FIGURES_FILE=%s: %v (figures only printed from now on)\n", path, err)
	}
}

// appendLine appends one line in a single write: O_APPEND keeps concurrent writers' lines whole.
func appendLine(path string, line []byte) error {
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := fh.Write(line); err != nil {
		fh.Close()
		return err
	}
	return fh.Close()
}

func (f *figureTable) print() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.rows) == 0 {
		return
	}
	w := 0
	for _, r := range f.rows {
		w = max(w, len(r.name))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "rig figures:\n")
	for _, r := range f.rows {
		if r.unit == UnitSeconds {
			fmt.Fprintf(&b, "  %-*s  %7.2fs\n", w, r.name, r.value)
		} else {
			fmt.Fprintf(&b, "  %-*s  %7.2f %s\n", w, r.name, r.value, r.unit)
		}
	}
	fmt.Print(b.String())
}
