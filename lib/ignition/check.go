package ignition

import (
	"fmt"
	"strings"

	"github.com/coreos/ignition/v2/config/v3_3"
	"github.com/coreos/vcontext/report"
)

// Check parses and validates an Ignition config with Ignition's own config
// package for spec 3.3.0 (github.com/coreos/ignition/v2/config/v3_3), the
// code Ignition itself runs at boot before it changes anything. It fails on
// every error of the report and on every warning too: Ignition goes on past
// a warning, but each one means part of the config will not happen (a key
// it does not know and ignores, setuid bits it drops, a unit enabled
// without an [Install] section), and a setting silently lost on a host
// nobody watches is worse than a refusal here.
//
// What Ignition's validation does not look at, and would only fail on at
// boot, the Builder refuses as each node is added: a path below a file of
// the config (upstream checks only paths below links), a unit name holding
// a '/', an http(s) source without a host, a digest that is not hex
// (upstream checks only its length).
func Check(data []byte) error {
	_, rpt, err := v3_3.Parse(data)
	var problems []string
	for _, e := range rpt.Entries {
		if e.Kind == report.Error || e.Kind == report.Warn {
			problems = append(problems, e.String())
		}
	}
	switch {
	case len(problems) > 0:
		return fmt.Errorf("ignition config (spec %s): %s", SpecVersion, strings.Join(problems, "; "))
	case err != nil:
		// Errors without report entries: an empty config, another version.
		return fmt.Errorf("ignition config (spec %s): %w", SpecVersion, err)
	}
	return nil
}
