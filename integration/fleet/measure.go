package fleet

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
)

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ, 100 on every Linux architecture Go supports
// (the kernel converts to it for user space whatever its own HZ).
const clockTick = 10 * time.Millisecond

// Proc is one reading of a process's cost.
type Proc struct {
	CPU time.Duration // user + system time so far
	RSS int64         // resident set, bytes
	HWM int64         // peak resident set, bytes
	// The resident set's anonymous part (heap, stacks) and file part (the binary's pages), bytes.
	Anon, File int64
}

// ReadProc reads pid's CPU time (/proc/PID/stat) and resident memory (/proc/PID/status).
func ReadProc(pid int) (Proc, error) {
	var p Proc
	if pid <= 0 {
		return p, fmt.Errorf("read process: pid %d: not running", pid)
	}
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	b, err := os.ReadFile(stat)
	if err != nil {
		return p, err
	}
	// The command name (field 2) may hold spaces; the fields after its closing parenthesis start at field 3.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return p, fmt.Errorf("%s: no ')' in %q", stat, s)
	}
	fs := strings.Fields(s[i+1:])
	if len(fs) < 13 {
		return p, fmt.Errorf("%s: %d fields after the name, want at least 13", stat, len(fs))
	}
	for _, idx := range []int{11, 12} { // utime (field 14), stime (field 15)
		v, err := strconv.ParseInt(fs[idx], 10, 64)
		if err != nil {
			return p, fmt.Errorf("%s: field %d %q: %w", stat, idx+3, fs[idx], err)
		}
		p.CPU += time.Duration(v) * clockTick
	}
	status := fmt.Sprintf("/proc/%d/status", pid)
	fh, err := os.Open(status)
	if err != nil {
		return p, err
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		dst := map[string]*int64{"VmRSS": &p.RSS, "VmHWM": &p.HWM, "RssAnon": &p.Anon, "RssFile": &p.File}[k]
		if !ok || dst == nil {
			continue
		}
		f := strings.Fields(v) // "123456 kB"
		if len(f) != 2 || f[1] != "kB" {
			return p, fmt.Errorf("%s: %s: unexpected %q", status, k, v)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return p, fmt.Errorf("%s: %s: %w", status, k, err)
		}
		*dst = n << 10
	}
	if err := sc.Err(); err != nil {
		return p, fmt.Errorf("%s: %w", status, err)
	}
	if p.RSS == 0 {
		return p, fmt.Errorf("%s: no VmRSS", status)
	}
	return p, nil
}

// AgentResources are the resources a watcher reads and writes. Counting only their requests leaves out the
// apiserver's own loops (leases) and kube-controller-manager's (secrets, CSRs), which are no agent's cost.
var AgentResources = []string{"machines", "machineoperations", "nodes", "events"}

// RequestTotal is the sum of apiserver_request_total in the apiserver's /metrics over the series of the given
// resources (all series when none are given): the requests it has served (a watch is counted when it ends).
func RequestTotal(ctx context.Context, cfg *rest.Config, base string, resources ...string) (float64, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return 0, fmt.Errorf("metrics client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s/metrics: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	return sumMetric(resp.Body, "apiserver_request_total", resources)
}

// sumMetric sums the samples of the counter name in a Prometheus text exposition whose resource label is one of
// resources (every sample when resources is empty).
func sumMetric(r io.Reader, name string, resources []string) (float64, error) {
	want := map[string]bool{}
	for _, r := range resources {
		want[`resource="`+r+`"`] = true
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var sum float64
	seen := false
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, name) {
			continue
		}
		tail := l[len(name):]
		if !strings.HasPrefix(tail, "{") && !strings.HasPrefix(tail, " ") {
			continue // another metric with this prefix
		}
		if j := strings.LastIndexByte(tail, '}'); j >= 0 {
			labels := tail[:j]
			tail = tail[j+1:]
			if len(want) > 0 && !hasLabel(labels, want) {
				seen = true // the metric is there; this series is not ours
				continue
			}
		}
		f := strings.Fields(tail) // value [timestamp]
		if len(f) == 0 {
			return 0, fmt.Errorf("metric %s: no value in %q", name, l)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: value in %q: %w", name, l, err)
		}
		sum += v
		seen = true
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("metric %s: %w", name, err)
	}
	if !seen {
		return 0, fmt.Errorf("metric %s: not in the exposition", name)
	}
	return sum, nil
}

// hasLabel tells whether the label set {k="v",...} holds one of want's k="v" pairs. Label values of this metric hold
// no commas or quotes.
func hasLabel(labels string, want map[string]bool) bool {
	for _, kv := range strings.Split(strings.TrimPrefix(labels, "{"), ",") {
		if want[kv] {
			return true
		}
	}
	return false
}

// Window is what an observation window cost the control plane.
type Window struct {
	Took     time.Duration
	CPU      time.Duration // apiserver user + system time
	EtcdCPU  time.Duration
	Requests float64 // apiserver_request_total growth, AgentResources only
	RSS      int64   // apiserver resident set at the end
}

// Then is w followed by next: the two windows as one (the memory reading is next's).
func (w Window) Then(next Window) Window {
	return Window{Took: w.Took + next.Took, CPU: w.CPU + next.CPU, EtcdCPU: w.EtcdCPU + next.EtcdCPU,
		Requests: w.Requests + next.Requests, RSS: next.RSS}
}

// CPUPerMinute is the apiserver's CPU time per minute of the window, in milliseconds.
func (w Window) CPUPerMinute() float64 { return float64(w.CPU.Milliseconds()) / w.Took.Minutes() }

// PerMinute scales a count over the window to one minute.
func (w Window) PerMinute(v float64) float64 { return v / w.Took.Minutes() }

// Observe sleeps for d (or until ctx ends) and returns what the apiserver and etcd did meanwhile.
//
// The window's CPU readings bracket neither scrape of the apiserver's /metrics (the start's scrape comes before its
// reading, the end's after): a scrape costs the apiserver some 100 ms of CPU, and a scrape inside every window
// weighs twice as much per minute in a 30 s baseline as in a 60 s window, which made the baseline look busier than
// a window with one idle agent (a negative CPU per agent at N=1).
func Observe(ctx context.Context, cp Control, d time.Duration) (Window, error) {
	r0, err := RequestTotal(ctx, cp.AdminConfig(), cp.URL(), AgentResources...)
	if err != nil {
		return Window{}, err
	}
	a0, e0, err := readCosts(cp)
	if err != nil {
		return Window{}, err
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return Window{}, ctx.Err()
	case <-time.After(d):
	}
	a1, e1, err := readCosts(cp)
	if err != nil {
		return Window{}, err
	}
	took := time.Since(t0)
	r1, err := RequestTotal(ctx, cp.AdminConfig(), cp.URL(), AgentResources...)
	if err != nil {
		return Window{}, err
	}
	return Window{Took: took, CPU: a1.CPU - a0.CPU, EtcdCPU: e1.CPU - e0.CPU, Requests: r1 - r0, RSS: a1.RSS}, nil
}

// Control is what Observe needs of the control plane (kube.ControlPlane has it).
type Control interface {
	PID(name string) int
	AdminConfig() *rest.Config
	URL() string
}

// readCosts reads the apiserver's and etcd's CPU time and memory.
func readCosts(cp Control) (api, etcd Proc, err error) {
	if api, err = ReadProc(cp.PID("kube-apiserver")); err != nil {
		return
	}
	etcd, err = ReadProc(cp.PID("etcd"))
	return
}
