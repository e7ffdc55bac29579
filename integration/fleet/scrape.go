package fleet

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
)

// Scrape is one reading of the apiserver's /metrics, kept whole so that a benchmark can sum any counter by any of
// its labels afterwards (RequestTotal sums one counter over a fixed set of resources only).
type Scrape struct {
	At      time.Time
	samples map[string][]sampleLine // by metric name
}

type sampleLine struct {
	labels map[string]string
	value  float64
}

// ScrapeMetrics reads the apiserver's /metrics at base with cfg's credentials, bounded by 20 s.
func ScrapeMetrics(ctx context.Context, cfg *rest.Config, base string) (Scrape, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return Scrape{}, fmt.Errorf("metrics client: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return Scrape{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Scrape{}, fmt.Errorf("GET %s/metrics: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Scrape{}, fmt.Errorf("GET %s/metrics: %s", base, resp.Status)
	}
	s, err := parseScrape(resp.Body)
	if err != nil {
		return Scrape{}, fmt.Errorf("GET %s/metrics: %w", base, err)
	}
	s.At = time.Now()
	return s, nil
}

// parseScrape reads a Prometheus text exposition: comments are skipped, every sample line kept.
func parseScrape(r io.Reader) (Scrape, error) {
	s := Scrape{samples: map[string][]sampleLine{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' {
			continue
		}
		name, labels, rest, err := splitSample(l)
		if err != nil {
			return Scrape{}, fmt.Errorf("line %d: %w", n, err)
		}
		f := strings.Fields(rest) // value [timestamp]
		if len(f) == 0 {
			return Scrape{}, fmt.Errorf("line %d: no value in %q", n, l)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return Scrape{}, fmt.Errorf("line %d: value in %q: %w", n, l, err)
		}
		s.samples[name] = append(s.samples[name], sampleLine{labels, v})
	}
	if err := sc.Err(); err != nil {
		return Scrape{}, err
	}
	return s, nil
}

// splitSample splits `name{k="v",...} rest` (the label set optional), unquoting the label values.
func splitSample(l string) (name string, labels map[string]string, rest string, err error) {
	i := strings.IndexAny(l, "{ ")
	if i < 0 {
		return "", nil, "", fmt.Errorf("no value in %q", l)
	}
	name, rest = l[:i], l[i:]
	labels = map[string]string{}
	if rest[0] != '{' {
		return name, labels, rest, nil
	}
	rest = rest[1:]
	for {
		rest = strings.TrimLeft(rest, " ,")
		if strings.HasPrefix(rest, "}") {
			return name, labels, rest[1:], nil
		}
		eq := strings.IndexByte(rest, '=')
		if eq < 0 || len(rest) < eq+2 || rest[eq+1] != '"' {
			return "", nil, "", fmt.Errorf("bad label set in %q", l)
		}
		key := rest[:eq]
		// The quoted value ends at the first quote not escaped by a backslash.
		j := eq + 2
		for ; j < len(rest) && rest[j] != '"'; j++ {
			if rest[j] == '\\' {
				j++
			}
		}
		if j >= len(rest) {
			return "", nil, "", fmt.Errorf("unterminated label value in %q", l)
		}
		v, uerr := strconv.Unquote(rest[eq+1 : j+1])
		if uerr != nil {
			return "", nil, "", fmt.Errorf("label %s in %q: %w", key, l, uerr)
		}
		labels[key] = v
		rest = rest[j+1:]
	}
}

// Sum sums metric name's samples whose labels match every pair of where, grouped by the values of the labels by
// (joined by spaces; an absent label counts as ""). With no by, the one group is "".
func (s Scrape) Sum(name string, where map[string]string, by ...string) map[string]float64 {
	out := map[string]float64{}
next:
	for _, sl := range s.samples[name] {
		for k, v := range where {
			if sl.labels[k] != v {
				continue next
			}
		}
		key := make([]string, len(by))
		for i, b := range by {
			key[i] = sl.labels[b]
		}
		out[strings.Join(key, " ")] += sl.value
	}
	return out
}

// Growth is after's sums less before's, by group; groups that did not grow are left out.
func Growth(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// Total is the sum over every group.
func Total(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

// Lines renders groups as "<value scaled by scale> <group>" lines, largest first, for a benchmark's log.
func Lines(m map[string]float64, scale float64, format string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = fmt.Sprintf(format, m[k]*scale, k)
	}
	return out
}
