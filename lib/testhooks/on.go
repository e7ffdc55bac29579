//go:build kubeslot_testhooks

package testhooks

// Enabled: a rig build, with the test hooks.
const Enabled = true
