//go:build !kubeslot_testhooks

package testhooks

// Enabled: a production build, without the test hooks.
const Enabled = false
