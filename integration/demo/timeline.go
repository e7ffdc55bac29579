package main

// The demo's output: one timeline line per step as it ends (elapsed since the start, the step's own duration, its
// result), the cluster's view after it, and a table of every step at the end.

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Results of a step.
const (
	resultOK      = "ok"
	resultSkipped = "skipped"
	resultFailed  = "FAILED"
)

// skipError marks a step that could not run for a reason outside the demo (a stage not built yet); the demo goes
// on and says so.
type skipError struct{ reason string }

func (e *skipError) Error() string { return "skipped: " + e.reason }

func skip(format string, args ...any) error { return &skipError{fmt.Sprintf(format, args...)} }

// row is one finished step.
type row struct {
	name   string
	took   time.Duration
	result string
	detail string // what the step measured or why it skipped or failed (first line only in the table)
}

// timeline prints the steps as they finish and keeps them for the final table.
type timeline struct {
	w     io.Writer
	start time.Time
	rows  []row
}

func newTimeline(w io.Writer) *timeline { return &timeline{w: w, start: time.Now()} }

// begin announces a step.
func (t *timeline) begin(n int, name string) {
	fmt.Fprintf(t.w, "\n[%s] step %d: %s ...\n", clock(time.Since(t.start)), n, name)
}

// end records how a step ended: err nil (ok, with detail), a skipError, or a failure.
func (t *timeline) end(n int, name string, took time.Duration, detail string, err error) row {
	r := row{name: name, took: took, result: resultOK, detail: detail}
	var se *skipError
	switch {
	case errors.As(err, &se):
		r.result, r.detail = resultSkipped, se.reason
	case err != nil:
		r.result, r.detail = resultFailed, err.Error()
	}
	t.rows = append(t.rows, r)
	line := fmt.Sprintf("[%s] step %d: %s: %s in %s", clock(time.Since(t.start)), n, name, r.result, secs(took))
	if r.detail != "" {
		line += " (" + firstLine(r.detail) + ")"
	}
	fmt.Fprintln(t.w, line)
	if i := strings.IndexByte(r.detail, '\n'); r.result == resultFailed && i >= 0 && strings.TrimSpace(r.detail[i:]) != "" {
		fmt.Fprintln(t.w, indent(strings.TrimSpace(r.detail[i:]), "    "))
	}
	return r
}

// failed reports whether any step failed.
func (t *timeline) failed() bool {
	for _, r := range t.rows {
		if r.result == resultFailed {
			return true
		}
	}
	return false
}

// table prints every step with its duration and result.
func (t *timeline) table() {
	wName := len("step")
	for _, r := range t.rows {
		wName = max(wName, len(r.name))
	}
	fmt.Fprintf(t.w, "\nkubeslot demo timeline (total %s)\n", secs(time.Since(t.start)))
	fmt.Fprintf(t.w, "  %-3s %-*s  %9s  %-7s  %s\n", "#", wName, "step", "duration", "result", "detail")
	fmt.Fprintf(t.w, "  %s\n", strings.Repeat("-", wName+40))
	for i, r := range t.rows {
		d := firstLine(r.detail)
		if len(d) > 90 {
			d = d[:87] + "..."
		}
		fmt.Fprintf(t.w, "  %-3d %-*s  %9s  %-7s  %s\n", i+1, wName, r.name, secs(r.took), r.result, d)
	}
}

// clock formats elapsed time as mm:ss.
func clock(d time.Duration) string {
	s := int(d.Round(time.Second).Seconds())
	return fmt.Sprintf("%02d:%02d", s/60, s%60)
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n")
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
