package rolloutview

import (
	"embed"
	"fmt"
	"html/template"
	"io"
	"time"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

//go:embed report.html.tmpl
var reportFS embed.FS

// reportTmpl renders the page; html/template escapes every node-written
// string (machine names, messages, step names) for where it lands.
var reportTmpl = template.Must(template.ParseFS(reportFS, "report.html.tmpl"))

// Geometry of the timeline, in SVG user units.
const (
	labelWidth = 180
	plotWidth  = 760
	rowHeight  = 26
	axisHeight = 28
)

// palette colours the steps by first appearance; phaseColour the bar
// under them.
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f", "#bab0ac", "#e15759"}

var phaseColour = map[v1alpha1.OperationPhase]string{
	v1alpha1.OperationSucceeded:  "#d5ecd4",
	v1alpha1.OperationFailed:     "#f6d0d0",
	v1alpha1.OperationInProgress: "#dde7f3",
	v1alpha1.OperationPending:    "#eeeeee",
}

type reportPage struct {
	Name, Type, Rollout, Summary, Generated string
	// Class is succeeded, failed or running: the outcome's colour.
	Class                 string
	Width, Height         int
	LabelWidth, PlotWidth int
	Ticks                 []tick
	Rows                  []timelineRow
	Legend                []legendItem
	Halted                string
	Ignored               int
}

type tick struct {
	X     float64
	Label string
}

type timelineRow struct {
	Y, TextY             int
	Machine, Phase, Note string
	Message              string
	Bar                  *segment
	Steps                []segment
	Details              []stepDetail
}

type segment struct {
	X, W        float64
	Colour, Tip string
}

type stepDetail struct{ Name, Start, Took string }

type legendItem struct{ Name, Colour string }

// WriteHTML writes the report: one page, no external assets or scripts,
// with the outcome, the counts and a timeline per machine drawn as SVG.
func (v View) WriteHTML(w io.Writer) error {
	return reportTmpl.Execute(w, v.page())
}

func (v View) page() reportPage {
	p := reportPage{Name: v.Name, Type: string(v.Type), Rollout: v.Rollout, Summary: v.Summary(),
		Generated: v.Now.UTC().Format(time.RFC3339), Ignored: v.Ignored,
		LabelWidth: labelWidth, PlotWidth: plotWidth}
	switch v.Outcome() {
	case Succeeded:
		p.Class = "succeeded"
	case Failed:
		p.Class = "failed"
	default:
		p.Class = "running"
	}
	for _, c := range v.Status.Conditions {
		if c.Type == v1alpha1.OpConditionHalted && c.Status == "True" {
			p.Halted = c.Message
		}
	}
	t0, t1 := v.span()
	scale := float64(plotWidth) / float64(t1.Sub(t0))
	x := func(t time.Time) float64 { return float64(labelWidth) + float64(t.Sub(t0))*scale }
	for i := 0; i <= 4; i++ {
		at := t0.Add(t1.Sub(t0) * time.Duration(i) / 4)
		p.Ticks = append(p.Ticks, tick{X: round(x(at)), Label: "+" + Duration(at.Sub(t0))})
	}
	colours := map[string]string{}
	for i, r := range v.Rows {
		y := axisHeight + i*rowHeight
		step, _ := r.Step()
		tr := timelineRow{Y: y + 4, TextY: y + rowHeight/2 + 4, Machine: r.Machine, Phase: string(r.Phase), Note: step, Message: plain(r.Message, 4096)}
		if tr.Phase == "" {
			tr.Phase = "no entry"
		}
		if !r.Start.IsZero() {
			end := r.End
			if end.IsZero() {
				end = v.Now
			}
			tr.Bar = &segment{X: round(x(r.Start)), W: round(max(x(end)-x(r.Start), 1)), Colour: phaseColour[r.Phase],
				Tip: fmt.Sprintf("%s: %s, %s", r.Machine, r.Phase, Duration(end.Sub(r.Start)))}
			if tr.Bar.Colour == "" {
				tr.Bar.Colour = "#eeeeee"
			}
		}
		for _, s := range r.Steps {
			s.Name = plain(s.Name, 63)
			c, ok := colours[s.Name]
			if !ok {
				c = palette[len(colours)%len(palette)]
				colours[s.Name] = c
				p.Legend = append(p.Legend, legendItem{Name: s.Name, Colour: c})
			}
			took := time.Duration(s.DurationMilliseconds) * time.Millisecond
			tr.Steps = append(tr.Steps, segment{X: round(x(s.StartTime.Time)), W: round(max(float64(took)*scale, 2)), Colour: c,
				Tip: fmt.Sprintf("%s: %s, %s", r.Machine, s.Name, Duration(took))})
			tr.Details = append(tr.Details, stepDetail{Name: s.Name, Start: s.StartTime.UTC().Format("15:04:05.000"), Took: Duration(took)})
		}
		p.Rows = append(p.Rows, tr)
	}
	p.Width = labelWidth + plotWidth + 20
	p.Height = axisHeight + len(v.Rows)*rowHeight + 8
	return p
}

// span is the time the timeline covers: from the first start to the last
// end, or to now while a target is under way.
func (v View) span() (time.Time, time.Time) {
	var t0, t1 time.Time
	see := func(t time.Time) {
		if t.IsZero() {
			return
		}
		if t0.IsZero() || t.Before(t0) {
			t0 = t
		}
		if t.After(t1) {
			t1 = t
		}
	}
	for _, r := range v.Rows {
		see(r.Start)
		see(r.End)
		if !r.Start.IsZero() && r.End.IsZero() {
			see(v.Now)
		}
		for _, s := range r.Steps {
			see(s.StartTime.Time)
			see(s.StartTime.Add(time.Duration(s.DurationMilliseconds) * time.Millisecond))
		}
	}
	if t0.IsZero() {
		t0 = v.Now
	}
	if !t1.After(t0) {
		t1 = t0.Add(time.Second)
	}
	return t0, t1
}

func round(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }
