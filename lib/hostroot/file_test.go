package hostroot

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadJSON: a state file decodes; a missing one wraps fs.ErrNotExist,
// a damaged one ErrNotJSON naming the file, and a link or an oversized
// file is refused before it is decoded.
func TestReadJSON(t *testing.T) {
	dir := t.TempDir()
	put := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var v struct{ Phase string }
	if err := ReadJSON(put("ok.json", `{"Phase":"start"}`), 1024, &v); err != nil || v.Phase != "start" {
		t.Errorf("good file: %v %+v", err, v)
	}
	if err := ReadJSON(filepath.Join(dir, "none.json"), 1024, &v); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	bad := put("bad.json", `{"Phase":`)
	if err := ReadJSON(bad, 1024, &v); !errors.Is(err, ErrNotJSON) || !strings.Contains(err.Error(), bad) {
		t.Errorf("damaged file: %v", err)
	}
	if err := ReadJSON(put("big.json", `{"Phase":"`+string(make([]byte, 64))+`"}`), 16, &v); !errors.Is(err, ErrTooLarge) {
		t.Errorf("oversized file: %v", err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(filepath.Join(dir, "ok.json"), link); err != nil {
		t.Fatal(err)
	}
	if err := ReadJSON(link, 1024, &v); !errors.Is(err, ErrNotRegular) {
		t.Errorf("symbolic link: %v", err)
	}
}
