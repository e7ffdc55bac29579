// Package hostile holds the hostile-input corpus: configurations,
// request and state files, release directories and command lines an
// attacker or an accident could hand kubeslot's binaries, each run against
// the real binaries in a root prefix of its own. Every case must end within
// its time, with the expected exit code, and no output of any binary may
// carry a planted secret. It has test files only; `make test-integration` runs it (it needs no rig).
package hostile
