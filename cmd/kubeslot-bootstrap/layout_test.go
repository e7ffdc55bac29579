package main

import (
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
)

// TestNewerLayoutRefused: a host laid out by a newer release is refused
// with exit 78 before anything on it changes (hostroot.CheckLayout).
func TestNewerLayoutRefused(t *testing.T) {
	clitest.NewerLayout(t, name, run, "--config", "/nonexistent/config.toml")
	clitest.NewerLayout(t, name, run, "--preflight", "--config", "/nonexistent/config.toml")
}
