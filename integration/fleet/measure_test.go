package fleet

import (
	"os"
	"strings"
	"testing"
)

func TestSumMetric(t *testing.T) {
	const text = `# HELP apiserver_request_total Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",group="kubeslot.dev",resource="machines",scope="cluster",subresource="",verb="LIST",version="v1alpha1"} 7
apiserver_request_total{code="201",component="apiserver",group="",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 2.5
apiserver_request_total{code="200",component="apiserver",group="coordination.k8s.io",resource="leases",scope="namespace",subresource="",verb="PUT",version="v1"} 100
apiserver_request_total_other{resource="machines"} 1000
apiserver_request_duration_seconds_count{resource="machines"} 1000
`
	for _, tc := range []struct {
		resources []string
		want      float64
	}{
		{nil, 109.5},
		{AgentResources, 9.5},
		{[]string{"nodes"}, 0},
	} {
		got, err := sumMetric(strings.NewReader(text), "apiserver_request_total", tc.resources)
		if err != nil || got != tc.want {
			t.Errorf("sumMetric(%v) = %v, %v; want %v", tc.resources, got, err, tc.want)
		}
	}
	if _, err := sumMetric(strings.NewReader("other_metric 1\n"), "apiserver_request_total", nil); err == nil {
		t.Error("a missing metric gave no error")
	}
	if _, err := sumMetric(strings.NewReader("apiserver_request_total{resource=\"machines\"} x\n"), "apiserver_request_total", nil); err == nil {
		t.Error("a bad value gave no error")
	}
}

func TestReadProcSelf(t *testing.T) {
	p, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.RSS <= 0 || p.HWM < p.RSS || p.CPU < 0 {
		t.Errorf("ReadProc(self) = %+v", p)
	}
	if _, err := ReadProc(0); err == nil {
		t.Error("pid 0 gave no error")
	}
}
