package hostprep

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kubeslot/kubeslot/lib/hostroot"
)

// Family is how software gets onto a host, which decides what host
// preparation may do about a missing requirement.
type Family string

// Families.
const (
	// FamilyApt: Debian, Ubuntu and their derivatives; dpkg and apt-get.
	FamilyApt Family = "apt"
	// FamilyDNF: Fedora, RHEL, CentOS Stream, Rocky, Alma and their
	// derivatives; rpm and dnf.
	FamilyDNF Family = "dnf"
	// FamilyImage: the OS is an image (Fedora CoreOS, Flatcar, any ostree
	// system, any host whose /usr is read-only). kubeslot installs nothing.
	FamilyImage Family = "image"
	// FamilyUnknown: no package manager kubeslot knows. kubeslot installs
	// nothing and guesses none.
	FamilyUnknown Family = "unknown"
)

// InstallsPackages reports whether host preparation may install packages on
// a host of this family.
func (f Family) InstallsPackages() bool { return f == FamilyApt || f == FamilyDNF }

// Host paths distribution detection reads.
const (
	OSReleaseFile    = "/etc/os-release"
	OSReleaseFileUsr = "/usr/lib/os-release" // the fallback os-release(5) names
	OstreeBootedFile = "/run/ostree-booted"  // written by ostree-prepare-root on every ostree boot
)

// Distro is what host preparation found out about the host's operating
// system, and why it chose the family.
type Distro struct {
	ID        string   `json:"id"`                  // os-release ID ("" if none)
	IDLike    []string `json:"idLike,omitempty"`    // os-release ID_LIKE
	VariantID string   `json:"variantID,omitempty"` // os-release VARIANT_ID
	VersionID string   `json:"versionID,omitempty"` // os-release VERSION_ID
	Name      string   `json:"name,omitempty"`      // os-release PRETTY_NAME, else NAME
	Family    Family   `json:"family"`
	// Evidence names what decided the family, for logs, --preflight and
	// kubeslot status ("/run/ostree-booted exists", "ID_LIKE=debian").
	Evidence string `json:"evidence"`
	// Ostree: booted from an ostree deployment (rpm-ostree can layer
	// packages); only set for FamilyImage.
	Ostree bool `json:"ostree,omitempty"`
}

// String is one line for people: "Flatcar Container Linux 4081.2.0 (ID
// flatcar; image-based: /usr is read-only ...)".
func (d Distro) String() string {
	name := d.Name
	if name == "" {
		name = "unnamed distribution"
	}
	id := d.ID
	if id == "" {
		id = "none"
	}
	what := map[Family]string{
		FamilyApt:     "apt-based: missing packages are installed with apt-get",
		FamilyDNF:     "dnf-based: missing packages are installed with dnf",
		FamilyImage:   "image-based: kubeslot installs nothing here",
		FamilyUnknown: "no package manager kubeslot knows: kubeslot installs nothing here",
	}[d.Family]
	return fmt.Sprintf("%s (ID %s; %s; detected by %s)", name, id, what, d.Evidence)
}

// imageIDs are os-release IDs of image-based systems; imageVariants are
// VARIANT_IDs of image-based editions of package-based distributions
// (Fedora CoreOS is ID=fedora VARIANT_ID=coreos; the ostree desktops and IoT
// likewise). They decide even when /run/ostree-booted cannot be seen (a
// host root other than "/", read before boot).
var (
	imageIDs      = []string{"flatcar", "coreos", "fedora-coreos", "rhcos", "scos", "bottlerocket"}
	imageVariants = []string{"coreos", "iot", "silverblue", "kinoite", "sericea", "onyx"}
	aptIDs        = []string{"debian", "ubuntu"}
	dnfIDs        = []string{"fedora", "rhel", "centos", "rocky", "almalinux"}
)

// usrReadOnly reports whether the filesystem holding local is mounted
// read-only. A variable so that tests can stand in for a read-only /usr,
// which they cannot mount.
var usrReadOnly = func(local string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(local, &st); err != nil {
		return false, err
	}
	return st.Flags&unix.ST_RDONLY != 0, nil
}

// DetectDistro reads the host's os-release and the markers of image-based
// systems under root (never this process's own "/", unless that is the
// prefix). It changes nothing. A host with no os-release is FamilyUnknown,
// not an error: kubeslot then installs nothing and checks what it needs is
// there.
func DetectDistro(root *hostroot.Root) (Distro, error) {
	if root == nil {
		return Distro{}, errors.New("detect distribution: no host root")
	}
	kv, err := readOSRelease(root)
	if err != nil {
		return Distro{}, err
	}
	ostree, err := exists(root, OstreeBootedFile)
	if err != nil {
		return Distro{}, err
	}
	roUsr := false
	if local, err := root.Resolve("/usr"); err != nil {
		return Distro{}, fmt.Errorf("detect distribution: %w", err)
	} else if ok, err := usrReadOnly(local); err == nil {
		roUsr = ok
	} else if !errors.Is(err, os.ErrNotExist) {
		return Distro{}, fmt.Errorf("detect distribution: /usr (%s): %w", local, err)
	}
	tools := map[string]bool{}
	for _, c := range []string{"dpkg-query", "apt-get", "rpm", "dnf"} {
		if tools[c], err = commandPresent(root, c); err != nil {
			return Distro{}, err
		}
	}
	return classify(kv, ostree, roUsr, tools), nil
}

// classify decides the family from what DetectDistro read. Image markers
// win over the os-release family (Fedora CoreOS says ID=fedora), and a
// package family needs its tools on the host: kubeslot never guesses a
// package manager that is not there.
func classify(kv map[string]string, ostree, roUsr bool, tools map[string]bool) Distro {
	d := Distro{ID: kv["ID"], IDLike: strings.Fields(kv["ID_LIKE"]), VariantID: kv["VARIANT_ID"], VersionID: kv["VERSION_ID"],
		Name: kv["PRETTY_NAME"]}
	if d.Name == "" {
		d.Name = kv["NAME"]
	}
	switch {
	case ostree:
		d.Family, d.Evidence, d.Ostree = FamilyImage, OstreeBootedFile+" exists (an ostree system)", true
		return d
	case slices.Contains(imageIDs, d.ID):
		d.Family, d.Evidence = FamilyImage, "os-release ID="+d.ID
		d.Ostree = d.ID != "flatcar" && d.ID != "bottlerocket" && d.ID != "coreos"
		return d
	case d.VariantID != "" && slices.Contains(imageVariants, d.VariantID):
		d.Family, d.Evidence, d.Ostree = FamilyImage, "os-release VARIANT_ID="+d.VariantID, true
		return d
	case roUsr:
		d.Family, d.Evidence = FamilyImage, "/usr is mounted read-only"
		return d
	}
	// ID first, then ID_LIKE in its own order (closest first, as
	// os-release(5) says).
	for i, id := range append([]string{d.ID}, d.IDLike...) {
		key := "ID_LIKE"
		if i == 0 {
			key = "ID"
		}
		var fam Family
		var need []string
		switch {
		case slices.Contains(aptIDs, id):
			fam, need = FamilyApt, []string{"dpkg-query", "apt-get"}
		case slices.Contains(dnfIDs, id):
			fam, need = FamilyDNF, []string{"rpm", "dnf"}
		default:
			continue
		}
		var missing []string
		for _, c := range need {
			if !tools[c] {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			d.Family = FamilyUnknown
			d.Evidence = fmt.Sprintf("os-release %s=%s, but %s not found", key, id, strings.Join(missing, ", "))
			return d
		}
		d.Family, d.Evidence = fam, "os-release "+key+"="+id
		return d
	}
	d.Family = FamilyUnknown
	if d.ID == "" {
		d.Evidence = "no os-release ID"
	} else {
		d.Evidence = "os-release ID=" + d.ID + " is not a distribution kubeslot knows"
	}
	return d
}

// maxOSRelease bounds what is read of os-release: real ones are ~1 KiB.
const maxOSRelease = 64 << 10

// readOSRelease reads /etc/os-release, else /usr/lib/os-release, under
// root (both are often links: resolved inside root). Neither: an empty map.
func readOSRelease(root *hostroot.Root) (map[string]string, error) {
	for _, p := range []string{OSReleaseFile, OSReleaseFileUsr} {
		local, err := root.Resolve(p)
		if err != nil {
			return nil, fmt.Errorf("detect distribution: %w", err)
		}
		f, err := os.Open(local)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("detect distribution: %w", err)
		}
		fi, err := f.Stat()
		if err == nil && !fi.Mode().IsRegular() {
			err = fmt.Errorf("%s is a %v, not a regular file", local, fi.Mode().Type())
		}
		var b []byte
		if err == nil {
			b, err = io.ReadAll(io.LimitReader(f, maxOSRelease))
		}
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("detect distribution: %s: %w", p, err)
		}
		return parseOSRelease(b), nil
	}
	return map[string]string{}, nil
}

// parseOSRelease reads os-release(5): KEY=value lines, values optionally
// in shell quotes; comments and malformed lines are skipped.
func parseOSRelease(b []byte) map[string]string {
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			continue
		}
		switch {
		case len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"':
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			} else {
				v = v[1 : len(v)-1]
			}
		case len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'':
			v = v[1 : len(v)-1]
		}
		kv[k] = v
	}
	return kv
}

// commandDirs are where a command the host provides is looked for: the
// default PATH of systemd's services (/usr/local is the administrator's own,
// and a sysext merges into /usr).
var commandDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// commandPresent reports whether an executable regular file named name is
// in one of commandDirs under root.
func commandPresent(root *hostroot.Root, name string) (bool, error) {
	_, ok, err := findCommand(root, name)
	return ok, err
}

// findCommand returns the host path of the command, searched like
// commandPresent.
func findCommand(root *hostroot.Root, name string) (string, bool, error) {
	for _, dir := range commandDirs {
		hostPath := dir + "/" + name
		local, err := root.Resolve(hostPath)
		if err != nil {
			return "", false, fmt.Errorf("look for command %s: %w", name, err)
		}
		fi, err := os.Stat(local)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
			continue
		}
		if err != nil {
			return "", false, fmt.Errorf("look for command %s: %w", name, err)
		}
		if fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0 {
			return hostPath, true, nil
		}
	}
	return "", false, nil
}

// exists reports whether hostPath exists under root.
func exists(root *hostroot.Root, hostPath string) (bool, error) {
	local, err := root.Resolve(hostPath)
	if err != nil {
		return false, err
	}
	_, err = os.Lstat(local)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, os.ErrNotExist):
		return false, nil
	}
	return false, fmt.Errorf("%s: %w", filepath.Clean(local), err)
}
