package fleet

import (
	"strings"
	"testing"
)

func TestScrapeSum(t *testing.T) {
	const text = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",resource="rolloutleases",subresource="",verb="LIST"} 12
apiserver_request_total{code="409",component="apiserver",resource="machineoperations",subresource="status",verb="PATCH"} 3
apiserver_request_total{code="200",component="apiserver",resource="machineoperations",subresource="status",verb="PATCH"} 5
apiserver_request_total{code="200",component="apiserver",resource="nodes",subresource="",verb="GET"} 7
apiserver_request_totals 99
x_seconds_sum{policy="a,b \"quoted\"",le="+Inf"} 1.5
x_seconds_sum 2.5e-1
`
	s, err := parseScrape(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	got := s.Sum("apiserver_request_total", map[string]string{"resource": "machineoperations"}, "verb", "subresource", "code")
	if len(got) != 2 || got["PATCH status 409"] != 3 || got["PATCH status 200"] != 5 {
		t.Errorf("by verb, subresource and code: %v", got)
	}
	if all := Total(s.Sum("apiserver_request_total", nil)); all != 27 {
		t.Errorf("every series: %v, want 27 (not the other metric apiserver_request_totals)", all)
	}
	if p := s.Sum("x_seconds_sum", nil, "policy"); p[`a,b "quoted"`] != 1.5 || p[""] != 0.25 {
		t.Errorf("quoted label values and a sample without labels: %v", p)
	}
	g := Growth(map[string]float64{"a": 1, "b": 2}, map[string]float64{"a": 4, "b": 2, "c": 1})
	if len(g) != 2 || g["a"] != 3 || g["c"] != 1 {
		t.Errorf("Growth: %v", g)
	}
	if l := Lines(g, 2, "%.0f %s"); strings.Join(l, ";") != "6 a;2 c" {
		t.Errorf("Lines: %q", l)
	}
	for _, bad := range []string{`m{a="1"`, `m{a=1} 2`, `m{a="1"} x`, `m`} {
		if _, err := parseScrape(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed without an error", bad)
		}
	}
}
