// Package repocheck holds tests of the repository's own conventions, not of
// kubeslot's behaviour; it has no code. Its tests read the source tree and
// the import graph (go list) from the module root (found by go.mod), so they
// run wherever go test runs.
package repocheck
