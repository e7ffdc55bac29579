//go:build pin

// Package kubeslot pins, until code imports them, the modules the design names
// (DESIGN.md, "Dependencies"), so go mod tidy keeps them while stages are built.
package kubeslot

import (
	_ "github.com/alecthomas/kong"
	_ "github.com/coreos/go-systemd/v22/daemon"
	_ "github.com/coreos/go-systemd/v22/dbus"
	_ "github.com/coreos/go-systemd/v22/journal"
	_ "github.com/coreos/go-systemd/v22/machine1"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/godbus/dbus/v5"
	_ "github.com/pelletier/go-toml/v2"
	_ "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	_ "k8s.io/client-go/kubernetes"
)
