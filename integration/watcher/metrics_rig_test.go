package watcher

// TestWatcherMetricsOnRig: a bootstrapped rig host whose config.toml turns the watcher's metrics
// on (a free loopback port: the rig host shares the machine's network namespace), a real NodeRestart operation
// carried out by the real watcher and restart worker, then a scrape of the endpoint, parsed with expfmt: the
// operation counted, the build info, and the node downtime the worker measured. The watcher is then restarted: the
// downtime and the last success come back from the status files, the counter starts again at zero.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/metrics"
)

func TestWatcherMetricsOnRig(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Minute)
	defer cancel()
	addr := freeLoopback(t)
	r := rig.NewRepaveRigWith(t, ctx, "met", rig.Options{Extra: func(*rig.Rig) string {
		return fmt.Sprintf("\n[metrics]\nlisten = %q\n", addr)
	}})
	scrape := func() (map[string]*dto.MetricFamily, string) {
		c := &http.Client{Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + addr + metrics.Path)
		if err != nil {
			return nil, err.Error()
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		fs, err := p.TextToMetricFamilies(resp.Body)
		if err != nil {
			t.Fatalf("parse the scrape of %s: %v", addr, err)
		}
		return fs, ""
	}
	value := func(fs map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	next:
		for _, m := range fs[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				return m.GetCounter().GetValue(), true
			}
			return m.GetGauge().GetValue(), true
		}
		return 0, false
	}
	restarts := map[string]string{"kind": "restart", "result": "succeeded"}
	rig.Eventually(t, 2*time.Minute, "the watcher serves its metrics", func() (bool, string) {
		fs, err := scrape()
		if fs == nil {
			return false, err
		}
		v, ok := value(fs, metrics.NameOperations, restarts)
		return ok && v == 0, fmt.Sprintf("restarts succeeded %v (%v)", v, ok)
	})

	name := "met-restart"
	op := &v1alpha1.MachineOperation{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.MachineOperationSpec{Type: v1alpha1.OperationNodeRestart, MachineRef: &v1alpha1.MachineReference{Name: r.Node}}}
	if _, err := r.MC.CreateOperation(ctx, op); err != nil {
		t.Fatalf("create the NodeRestart operation: %v", err)
	}
	t.Cleanup(func() { _ = r.MC.DeleteOperation(context.Background(), name) })
	rig.Eventually(t, 8*time.Minute, "the NodeRestart operation Succeeded", func() (bool, string) {
		got, err := r.MC.GetOperation(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		e := got.Status.Target(r.Node, r.Node)
		return e != nil && e.Phase == v1alpha1.OperationSucceeded, fmt.Sprintf("%+v", e)
	})
	check := func(when string, wantCount float64) {
		t.Helper()
		fs, err := scrape()
		if fs == nil {
			t.Fatalf("%s: scrape %s: %s", when, addr, err)
		}
		if v, _ := value(fs, metrics.NameOperations, restarts); v != wantCount {
			t.Errorf("%s: %s%v = %v, want %v", when, metrics.NameOperations, restarts, v, wantCount)
		}
		if v, ok := value(fs, metrics.NameBuildInfo, nil); !ok || v != 1 {
			t.Errorf("%s: %s = %v (%v), want 1", when, metrics.NameBuildInfo, v, ok)
		}
		down, ok := value(fs, metrics.NameDowntime, map[string]string{"kind": "restart"})
		if !ok || down <= 0 || down > 600 {
			t.Errorf("%s: %s{kind=restart} = %v (%v), want the restart's measured downtime", when, metrics.NameDowntime, down, ok)
		}
		if v, ok := value(fs, metrics.NameLastSuccess, map[string]string{"kind": "restart"}); !ok || time.Since(time.Unix(int64(v), 0)) > 15*time.Minute {
			t.Errorf("%s: %s{kind=restart} = %v (%v), want the restart's end", when, metrics.NameLastSuccess, v, ok)
		}
		t.Logf("%s: node downtime of the restart %.2f s", when, down)
	}
	// Published, then scraped: the counter is set when the operation's entry is written, just before.
	rig.Eventually(t, 30*time.Second, "the restart counted", func() (bool, string) {
		fs, err := scrape()
		v, _ := value(fs, metrics.NameOperations, restarts)
		return v == 1, fmt.Sprintf("%v %s", v, err)
	})
	check("after the restart", 1)
	rss := unitRSS(t, ctx, r)
	t.Logf("watcher in its unit with metrics on, after scrapes: RSS %d kB (anonymous %d kB)", rss["VmRSS"], rss["RssAnon"])

	if out, err := r.H.Run(ctx, "systemctl", "restart", "kubeslot-watcher.service"); err != nil {
		t.Fatalf("restart the watcher: %v\n%s", err, out)
	}
	rig.Eventually(t, 2*time.Minute, "the restarted watcher serves its metrics", func() (bool, string) {
		fs, err := scrape()
		if fs == nil {
			return false, err
		}
		_, ok := value(fs, metrics.NameDowntime, map[string]string{"kind": "restart"})
		return ok, "no downtime series yet"
	})
	check("after a watcher restart", 0)
}

// freeLoopback is a loopback address whose port was free a moment ago.
func freeLoopback(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
