// Package rig is what the whole-system tests share: the TestMain every subject package runs (Main: the machine
// lock, the leak check, one control plane per test binary, the figures table), the builder of a rig host
// (New, NewWith and Options: mirror, isolated host, bootstrap token, ports, and unless Bare the release laid down
// for the first boot), and the helpers more than one subject package uses. Only test code under integration/
// imports it.
package rig
