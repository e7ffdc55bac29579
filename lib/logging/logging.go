// Package logging builds the structured (log/slog) logger every kubeslot
// binary uses. Under systemd, records go to the journal with their attributes
// as journal fields (journalctl KUBESLOT_SLOT=b works); elsewhere they go to
// stderr as text or JSON. Imported by lib/cli only; other packages receive a
// *slog.Logger.
package logging

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/coreos/go-systemd/v22/journal"
)

// Options choose the output.
type Options struct {
	Format string // "text" or "json"
	Level  string // "debug", "info", "warn" or "error"
	// Journal sends records to the journal natively. Callers set it when
	// stderr is connected to the journal (journal.StderrIsJournalStream).
	Journal bool
	// Stage names the binary; it becomes an attribute of every record.
	Stage string
}

// ParseLevel maps a level name to a slog.Level.
func ParseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// New returns a logger writing to w (or the journal, see Options.Journal).
func New(w io.Writer, o Options) (*slog.Logger, error) {
	level, err := ParseLevel(o.Level)
	if err != nil {
		return nil, err
	}
	var h slog.Handler
	ho := &slog.HandlerOptions{Level: level}
	switch {
	case o.Journal:
		h = &journalHandler{level: level, unit: ownUnit()}
	case o.Format == "json":
		h = slog.NewJSONHandler(w, ho)
	case o.Format == "text" || o.Format == "":
		h = slog.NewTextHandler(w, ho)
	default:
		return nil, fmt.Errorf("log format %q: want text or json", o.Format)
	}
	l := slog.New(h)
	if o.Stage != "" {
		l = l.With("stage", o.Stage)
	}
	return l, nil
}

// UnderJournal reports whether stderr is the journal's stream, i.e. the
// process runs as a systemd service with default output.
func UnderJournal() bool {
	ok, err := journal.StderrIsJournalStream()
	return err == nil && ok && journal.Enabled()
}

// journalHandler sends each record with journal.Send. Attribute keys become
// upper-case fields prefixed with KUBESLOT_, since journal field names allow
// only A–Z, 0–9 and '_'; MESSAGE keeps the attributes as key=value too, so a
// plain `journalctl -u` shows everything.
type journalHandler struct {
	level slog.Leveler
	// unit is the service this process runs in, sent as
	// OBJECT_SYSTEMD_UNIT: journald reads _SYSTEMD_UNIT from the sender's
	// cgroup when it processes the record, so a run that exits within
	// milliseconds can lose it, and `journalctl -u` also matches
	// OBJECT_SYSTEMD_UNIT= of root senders.
	unit   string
	attrs  []slog.Attr
	groups []string
}

func (h *journalHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

func (h *journalHandler) Handle(_ context.Context, r slog.Record) error {
	vars := map[string]string{}
	var msg strings.Builder
	msg.WriteString(r.Message)
	var walk func(prefix []string, a slog.Attr)
	walk = func(prefix []string, a slog.Attr) {
		v := a.Value.Resolve()
		if v.Kind() == slog.KindGroup {
			p := prefix
			if a.Key != "" {
				p = append(append([]string(nil), prefix...), a.Key)
			}
			for _, g := range v.Group() {
				walk(p, g)
			}
			return
		}
		key := strings.Join(append(append([]string(nil), prefix...), a.Key), ".")
		vars["KUBESLOT_"+fieldName(key)] = v.String()
		fmt.Fprintf(&msg, " %s=%q", key, v.String())
	}
	for _, a := range h.attrs {
		walk(nil, a)
	}
	r.Attrs(func(a slog.Attr) bool { walk(h.groups, a); return true })
	if h.unit != "" {
		vars["OBJECT_SYSTEMD_UNIT"] = h.unit
	}
	return journal.Send(msg.String(), priority(r.Level), vars)
}

func (h *journalHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append([]slog.Attr(nil), h.attrs...)
	for _, a := range as {
		if len(h.groups) > 0 {
			a = slog.Attr{Key: strings.Join(h.groups, "."), Value: slog.GroupValue(a)}
		}
		c.attrs = append(c.attrs, a)
	}
	return &c
}

func (h *journalHandler) WithGroup(name string) slog.Handler {
	c := *h
	c.groups = append(append([]string(nil), h.groups...), name)
	return &c
}

func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	default:
		return journal.PriDebug
	}
}

// fieldName maps an attribute key to a valid journal field name.
func fieldName(key string) string {
	b := []byte(strings.ToUpper(key))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// ownUnit names the systemd service or scope this process runs in, read
// from /proc/self/cgroup; "" when there is none.
func ownUnit() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	return unitFromCgroup(string(b))
}

// unitFromCgroup finds the unit in /proc/self/cgroup content: the last
// .service or .scope component of the systemd hierarchy, the "name=systemd"
// line of a v1 or hybrid layout first, else the unified "0::" line. (In a
// container on a hybrid host the name=systemd line can be a bare "/" while
// the unified one names the unit.) Units nested in a delegated subtree end
// at the innermost one.
func unitFromCgroup(content string) string {
	var named, unified string
	for _, line := range strings.Split(content, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[1] == "name=systemd":
			named = parts[2]
		case parts[0] == "0" && parts[1] == "":
			unified = parts[2]
		}
	}
	for _, path := range []string{named, unified} {
		comps := strings.Split(path, "/")
		for i := len(comps) - 1; i >= 0; i-- {
			c := comps[i]
			if strings.HasSuffix(c, ".service") || strings.HasSuffix(c, ".scope") {
				return c
			}
		}
	}
	return ""
}
