// Package config decodes and validates kubeslot's bootstrap configuration
// (TOML). Imported by cmd/ binaries and by lib/ packages that persist or
// compare applied configuration.
//
// Parse decodes strictly (unknown keys are errors), fills defaults, and
// reports every problem it finds as an *Error naming the file, line, key
// path and offending value, because the people reading these errors are
// operators fixing a node, not Go programmers. Secrets (the bootstrap token)
// never appear in errors, fmt output or slog records; they do appear in JSON,
// which is what the applied copy on disk is made of (written 0600).
package config
