package mountinfo

import (
	"reflect"
	"strings"
	"testing"
)

const sample = `22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:35 / /var/lib/machines/a rw shared:20 - overlay overlay rw
41 40 0:36 / /var/lib/machines/a/run rw - tmpfs tmpfs rw
42 22 0:37 / /var/lib/machines/ab rw - tmpfs tmpfs rw
43 22 0:38 / /srv/with\040space rw - tmpfs tmpfs rw
`

func TestUnder(t *testing.T) {
	got, err := under(strings.NewReader(sample), "/var/lib/machines/a")
	if err != nil {
		t.Fatal(err)
	}
	// a sibling that merely shares the prefix ("ab") is not inside
	if want := []string{"/var/lib/machines/a", "/var/lib/machines/a/run"}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	got, _ = under(strings.NewReader(sample), "/srv/with space")
	if len(got) != 1 {
		t.Errorf("escaped mount point not found: %v", got)
	}
}

func TestUnderThisProcess(t *testing.T) {
	got, err := Under("/")
	if err != nil || len(got) == 0 {
		t.Fatalf("the root mount is always there: %v %v", got, err)
	}
}

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{`a\040b`: "a b", `tab\011x`: "tab\tx", `back\134slash`: `back\slash`, `plain`: "plain", `trail\04`: `trail\04`} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
