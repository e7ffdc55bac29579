package main

import (
	"fmt"
	"runtime"

	"github.com/kubeslot/kubeslot/lib/buildinfo"
)

// versionCmd prints the release this binary is: the version the release
// stamped (the Machine's AGENT column shows the same for a host's agent),
// its platform and the Go it was built with.
type versionCmd struct{}

func (versionCmd) Run(e *env) error {
	_, err := fmt.Fprintf(e.io.Stdout, "kubeslot %s %s/%s %s\n", buildinfo.Version, runtime.GOOS, buildinfo.Arch, runtime.Version())
	return err
}
