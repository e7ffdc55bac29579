package main

import (
	"testing"

	"github.com/kubeslot/kubeslot/lib/cli/clitest"
)

func TestCommandLine(t *testing.T) {
	clitest.CommonFlags(t, name, run)
	clitest.NotImplemented(t, name, run)
}
