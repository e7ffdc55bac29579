package hostroot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/kubeslot/kubeslot/lib/atomicfile"
)

// StateFile is one typed JSON file kubeslot keeps under its base: where it
// is, how large it may be, what a valid value is, and how its bytes are
// kept. Every state file (the transitions' checkpoints, the applied
// configuration, the requests protocol's files, the list of parents) is
// one of these, so a file is read and written one way: bounded, never
// through a link, validated both ways, replaced atomically.
//
// It lives here rather than in lib/state because this package keeps a
// state file of its own (ParentsFile) and lib/state imports this package;
// lib/state supplies the checksummed storage (state.Checksummed).
type StateFile[T any] struct {
	// Dir and Name place the file under the base (Root.File); Dir is ""
	// for a file in the base itself.
	Dir, Name string
	// Max bounds the file's size: a larger one is damaged, and is not
	// read whole.
	Max int64
	// Perm is the mode the file is written with (0600 when it holds a
	// secret).
	Perm fs.FileMode
	// Decode, when set, decodes the bytes in place of json.Unmarshal (a
	// stricter reading); an error it returns makes the file corrupt.
	Decode func(data []byte, v *T) error
	// Validate, when set, checks a value before Save writes it and after
	// Load decodes it; a loaded value it refuses is a *CorruptError.
	Validate func(*T) error
	// Store keeps the bytes; nil keeps a plain file replaced atomically.
	Store FileStore
	// Advice ends the message of a *CorruptError about this file: what
	// a person should do about it.
	Advice string
}

// ErrNotJSON marks a state file that was read whole but does not decode.
var ErrNotJSON = errors.New("not valid JSON")

// FileStore keeps a state file's bytes. Read returns an error wrapping
// fs.ErrNotExist for a file that is absent, and a *CorruptError for one
// that is there but cannot be trusted; every error names the file. Remove
// is fine with an absent file.
type FileStore interface {
	Read(path string, limit int64) ([]byte, error)
	Write(path string, data []byte, perm fs.FileMode) error
	Remove(path string) error
}

// CorruptError reports a state file that exists but cannot be used: not a
// regular file, too large, not valid JSON, refused by its validation or
// (checksummed) failing its checksum. Err, when set, is the cause
// (ErrNotJSON, ErrTooLarge, a validation error).
type CorruptError struct {
	Path   string
	Reason string
	Advice string
	Err    error
}

func (e *CorruptError) Error() string {
	s := e.Path + ": " + e.Reason
	if e.Advice != "" {
		s += ": " + e.Advice
	}
	return s
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Path is the file's local path under r.
func (f StateFile[T]) Path(r *Root) (string, error) {
	if f.Dir == "" {
		return r.File(f.Name)
	}
	return r.File(f.Dir, f.Name)
}

func (f StateFile[T]) store() FileStore {
	if f.Store == nil {
		return plainStore{}
	}
	return f.Store
}

// Load reads, decodes and validates the file: (nil, nil) when it is
// absent, a *CorruptError naming it when it is there but unusable, and
// any other error (it could not be read) naming it too.
func (f StateFile[T]) Load(r *Root) (*T, error) {
	p, err := f.Path(r)
	if err != nil {
		return nil, err
	}
	return f.LoadPath(p)
}

// LoadPath is Load of the file at the local path p, for a file of this
// kind found elsewhere than Dir and Name say (a directory listing, a name
// made of a request's ID).
func (f StateFile[T]) LoadPath(p string) (*T, error) {
	b, err := f.store().Read(p, f.Max)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if ce := (*CorruptError)(nil); errors.As(err, &ce) {
		if ce.Advice == "" {
			ce.Advice = f.Advice
		}
		return nil, ce
	}
	if err != nil {
		return nil, err // it names the file
	}
	var v T
	if f.Decode != nil {
		if err := f.Decode(b, &v); err != nil {
			return nil, &CorruptError{Path: p, Reason: err.Error(), Advice: f.Advice, Err: err}
		}
	} else if err := json.Unmarshal(b, &v); err != nil {
		return nil, &CorruptError{Path: p, Reason: fmt.Sprintf("%v: %v", ErrNotJSON, err), Advice: f.Advice, Err: ErrNotJSON}
	}
	if f.Validate != nil {
		if err := f.Validate(&v); err != nil {
			return nil, &CorruptError{Path: p, Reason: err.Error(), Advice: f.Advice, Err: err}
		}
	}
	return &v, nil
}

// Save validates v and replaces the file with it, atomically, as indented
// JSON with a final newline. The directory must exist.
func (f StateFile[T]) Save(r *Root, v *T) error {
	p, err := f.Path(r)
	if err != nil {
		return err
	}
	return f.SavePath(p, v)
}

// SavePath is Save to the local path p (LoadPath).
func (f StateFile[T]) SavePath(p string, v *T) error {
	if f.Validate != nil {
		if err := f.Validate(v); err != nil {
			return fmt.Errorf("save %s: %w", p, err)
		}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", p, err)
	}
	return f.store().Write(p, append(b, '\n'), f.Perm)
}

// Remove removes the file, durably; absent is fine.
func (f StateFile[T]) Remove(r *Root) error {
	p, err := f.Path(r)
	if err != nil {
		return err
	}
	return f.store().Remove(p)
}

// plainStore keeps a state file as one file replaced atomically.
type plainStore struct{}

func (plainStore) Read(p string, limit int64) ([]byte, error) {
	b, err := ReadRegular(p, limit)
	if errors.Is(err, ErrNotRegular) || errors.Is(err, ErrTooLarge) {
		return nil, &CorruptError{Path: p, Reason: err.Error(), Err: err}
	}
	return b, err
}

func (plainStore) Write(p string, data []byte, perm fs.FileMode) error {
	return atomicfile.WriteFile(p, data, perm)
}

func (plainStore) Remove(p string) error { return atomicfile.Remove(p) }
