// Package buildinfo holds the release version stamped into every binary at
// build time (the Makefile passes -X with `git describe`). Imported by
// lib/cli and by anything that reports the agent version.
package buildinfo

import "runtime"

// Version is set with -ldflags "-X github.com/kubeslot/kubeslot/lib/buildinfo.Version=...".
// An unstamped build (plain `go build`, tests) reports "devel".
var Version = "devel"

// Arch is the architecture the binary was built for, as bundles name it.
const Arch = runtime.GOARCH
