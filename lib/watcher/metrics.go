package watcher

import (
	"errors"
	"os"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
	"github.com/kubeslot/kubeslot/lib/config"
	"github.com/kubeslot/kubeslot/lib/metrics"
)

// startMetrics reads [metrics] from the operator's configuration file and,
// when it names an address, serves the watcher's metrics there until Run
// returns. Nothing here stops the watcher: it is the host's only ear for
// its Machine, and an unreadable file, an invalid value or a port in use
// cost the metrics only, said in one warning naming the file, the field and
// the value (or the address). The file is read at each start, never
// watched: a change takes effect with the next start of the unit (a re-exec
// after an upgrade is one).
func (c Command) startMetrics() (*metrics.Watcher, *metrics.Server) {
	if c.Config == "" {
		return nil, nil
	}
	local, err := c.root.Resolve(c.Config)
	if err == nil {
		_, err = os.Stat(local)
	}
	if errors.Is(err, os.ErrNotExist) {
		// A host set up without the file (by hand, another --config): no
		// metrics asked for.
		c.Log.Debug("no configuration file; metrics off", "file", c.Config)
		return nil, nil
	}
	var cfg *config.Config
	if err == nil {
		cfg, err = config.Load(local)
	}
	if err != nil {
		c.Log.Warn("cannot read the configuration for [metrics]; serving no metrics", "file", c.Config, "err", err.Error())
		return nil, nil
	}
	if cfg.Metrics.Listen == "" {
		return nil, nil
	}
	m := metrics.New(buildinfo.Version)
	srv, err := metrics.Listen(cfg.Metrics.Listen, m, c.Log)
	if err != nil {
		c.Log.Warn("serving no metrics (metrics.listen)", "file", c.Config, "err", err.Error())
		return nil, nil
	}
	return m, srv
}
