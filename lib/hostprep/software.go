package hostprep

import (
	"fmt"
	"strings"
)

// Software is one thing the node needs installed on the host, named per
// family: the commands that prove it is there, and the package that
// provides it where kubeslot may install packages.
type Software struct {
	Name     string   // what plans and errors call it
	Commands []string // looked for in commandDirs under the host root
	Apt      string   // the Debian/Ubuntu package
	DNF      string   // the Fedora/RHEL package
}

// SystemdContainer is systemd-nspawn and machinectl (with
// systemd-nspawn@.service and systemd-machined): the node machine runs on
// them. Both families split them out of systemd under the same name
// (Debian's and Fedora's package lists, and RHEL 8 and later).
var SystemdContainer = Software{
	Name:     "systemd-container",
	Commands: []string{"systemd-nspawn", "machinectl"},
	Apt:      "systemd-container",
	DNF:      "systemd-container",
}

// Package is the package providing s on family f ("" where kubeslot
// installs no packages).
func (s Software) Package(f Family) string {
	switch f {
	case FamilyApt:
		return s.Apt
	case FamilyDNF:
		return s.DNF
	}
	return ""
}

func (s Software) validate() error {
	if strings.TrimSpace(s.Name) == "" || len(s.Commands) == 0 {
		return fmt.Errorf("software %q: want a name and the commands that prove it present", s.Name)
	}
	for _, c := range s.Commands {
		if c == "" || strings.ContainsAny(c, "/ \t\n") || c == "." || c == ".." {
			return fmt.Errorf("software %s: command %q: want a plain command name", s.Name, c)
		}
	}
	if s.Apt == "" || s.DNF == "" {
		return fmt.Errorf("software %s: want its package on each family (apt and dnf)", s.Name)
	}
	if err := checkPackageName(s.Apt); err != nil {
		return fmt.Errorf("software %s: %w", s.Name, err)
	}
	if err := checkRPMName(s.DNF); err != nil {
		return fmt.Errorf("software %s: %w", s.Name, err)
	}
	return nil
}

// howToProvide says how an operator provides missing commands of s on a
// host of distro d, where kubeslot installs nothing. It names what it
// detected, so a wrong detection shows.
func howToProvide(d Distro, s Software, missing []string) string {
	cmds := strings.Join(missing, ", ")
	switch {
	case d.Family == FamilyImage && d.ID == "flatcar":
		return fmt.Sprintf("Flatcar (ID %s) has no package manager and kubeslot installs nothing on it: provide %s with a "+
			"systemd-sysext image (a .raw file under /etc/extensions/, written by the host's Ignition/Butane config "+
			"storage.files, then reboot or systemctl restart systemd-sysext), or run a Flatcar release whose image ships them", d.ID, cmds)
	case d.Family == FamilyImage && d.Ostree:
		return fmt.Sprintf("%s (ID %s) is an ostree image and kubeslot installs nothing on it: layer the package, "+
			"rpm-ostree install --apply-live %s (at first boot, from a oneshot unit in the Butane config ordered "+
			"Before=kubeslot-bootstrap.service), or boot a derived image that includes it", nameOr(d), idOr(d), s.DNF)
	case d.Family == FamilyImage:
		return fmt.Sprintf("%s (ID %s) is image-based (%s) and kubeslot installs nothing on it: add %s (%s) to the host's "+
			"image, or provide them with a systemd-sysext image under /etc/extensions/", nameOr(d), idOr(d), d.Evidence, s.Name, cmds)
	}
	return fmt.Sprintf("kubeslot knows no package manager on %s (ID %s; %s) and installs nothing: install %s so that %s "+
		"are found in /usr/bin or /usr/sbin (Debian and Fedora call the package %s)", nameOr(d), idOr(d), d.Evidence, s.Name, cmds, s.Apt)
}

func nameOr(d Distro) string {
	if d.Name != "" {
		return d.Name
	}
	return "this host"
}

func idOr(d Distro) string {
	if d.ID != "" {
		return d.ID
	}
	return "none"
}
