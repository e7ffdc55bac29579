package rolloutview

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"
)

// TestReportHTML renders the halted fixture and reads it back with an
// HTML parser: one page with no scripts or external assets, the outcome,
// a timeline group per target with a rect per recorded step, and the
// node-written message as text, never as markup.
func TestReportHTML(t *testing.T) {
	op, ms := fixture()
	var b bytes.Buffer
	if err := Build(op, ms, t0.Add(30*time.Second)).WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var (
		machines = map[string]int{} // steps drawn per machine group
		outcome  string
		texts    strings.Builder
		svgs     int
	)
	var walk func(n *html.Node, group string)
	walk = func(n *html.Node, group string) {
		if n.Type == html.ElementNode {
			switch n.Data {
			case "script", "link", "img", "iframe", "object", "embed":
				t.Errorf("element <%s>: the page must be self-contained, without scripts", n.Data)
			case "svg":
				svgs++
			}
			for _, a := range n.Attr {
				if a.Key == "src" || a.Key == "href" || strings.HasPrefix(a.Key, "on") {
					t.Errorf("<%s %s=%q>: no external references or handlers", n.Data, a.Key, a.Val)
				}
			}
			if n.Data == "g" && attr(n, "class") == "machine" {
				group = attr(n, "data-machine")
				machines[group] += 0
			}
			if n.Data == "rect" && attr(n, "class") == "step" {
				machines[group]++
			}
			if attr(n, "id") == "outcome" {
				outcome = textOf(n)
			}
		}
		if n.Type == html.TextNode {
			texts.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c, group)
		}
	}
	walk(doc, "")
	want := map[string]int{"web-1": 5, "web-2": 5, "web-3": 0, "web-4": 0}
	for m, n := range want {
		if got, ok := machines[m]; !ok || got != n {
			t.Errorf("timeline of %s: %d steps drawn (present %v), want %d", m, got, ok, n)
		}
	}
	if len(machines) != len(want) {
		t.Errorf("timeline groups %v, want exactly the four targets (no forged entry)", machines)
	}
	if !strings.HasPrefix(outcome, "Halted: 1 of 4 machines succeeded, 1 failed") {
		t.Errorf("outcome %q", outcome)
	}
	if svgs == 0 {
		t.Error("no SVG timeline")
	}
	if !strings.Contains(texts.String(), "<script>alert(1)</script>") {
		t.Error("web-2's message is not shown as text")
	}
	if strings.Contains(b.String(), "<script>alert") || strings.Contains(b.String(), "ZgotmplZ") {
		t.Error("a node-written message reached the page unescaped, or a value was filtered out")
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func textOf(n *html.Node) string {
	var b strings.Builder
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.TextNode {
			b.WriteString(n.Data)
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(n)
	return b.String()
}
