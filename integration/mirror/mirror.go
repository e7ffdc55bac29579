// Package mirror is the test rig's artifact server: an HTTP server on
// 127.0.0.1, plain and (on a second port, with a CA of its own) https, that
// serves the files of one directory, each with a
// "<name>.sha256" companion in sha256sum format, the way kubeslot's agent
// expects a real artifact mirror to. Faults can be injected per file to test
// the agent's download checks.
//
// Only test code under integration/ imports it.
package mirror

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault changes how one file is served.
type Fault int

const (
	// None serves the file as it is.
	None Fault = iota
	// Truncate sends the full Content-Length but only half the bytes, then
	// closes the connection: the client sees an unexpected EOF.
	Truncate
	// Corrupt flips one byte in the middle: length right, checksum wrong.
	Corrupt
	// Slow sends the file in 64 KiB chunks 100 ms apart (~640 KiB/s), for
	// timeouts and cancellation.
	Slow
)

// Server serves a directory. Safe for concurrent use.
type Server struct {
	dir   string
	root  *os.Root
	ln    net.Listener
	tlsLn net.Listener
	caPEM []byte
	srv   *http.Server
	done  chan struct{}

	mu     sync.Mutex
	faults map[string]Fault
	hits   map[string]int
}

// Start serves dir (created if missing) on two free ports of 127.0.0.1 in
// 20000–32767: plain http, and https with a certificate of its own (TLSURL,
// CAPEM).
func Start(dir string) (*Server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("mirror: %w", err)
	}
	cert, caPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("mirror: %w", err)
	}
	ln, err := listen()
	if err != nil {
		root.Close()
		return nil, err
	}
	tlsLn, err := listen()
	if err != nil {
		ln.Close()
		root.Close()
		return nil, err
	}
	s := &Server{dir: dir, root: root, ln: ln, tlsLn: tlsLn, caPEM: caPEM, done: make(chan struct{}),
		faults: map[string]Fault{}, hits: map[string]int{}}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	tlsLn = tls.NewListener(tlsLn, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	var wg sync.WaitGroup
	for _, l := range []net.Listener{ln, tlsLn} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.srv.Serve(l) // returns http.ErrServerClosed on Close
		}()
	}
	go func() {
		wg.Wait()
		close(s.done)
	}()
	return s, nil
}

// listen takes a free port below the ephemeral range, like every rig port
// (see kube.FreePorts).
func listen() (net.Listener, error) {
	for tries := 0; ; tries++ {
		p := 20000 + rand.IntN(12768)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			return ln, nil
		}
		if tries > 1000 {
			return nil, fmt.Errorf("mirror: no free port: %w", err)
		}
	}
}

// URL is the address of a file (or of its checksum, with ".sha256").
func (s *Server) URL(name string) string {
	return "http://" + s.ln.Addr().String() + "/" + strings.TrimPrefix(path.Clean("/"+name), "/")
}

// Add places srcPath in the served directory under name (a hard link when
// possible, else a copy) and writes name.sha256; it returns the checksum.
func (s *Server) Add(name, srcPath string) (string, error) {
	name, err := cleanName(name)
	if err != nil {
		return "", err
	}
	dst := filepath.Join(s.dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", fmt.Errorf("mirror: %w", err)
	}
	tmp := dst + ".part"
	_ = os.Remove(tmp)
	if err := os.Link(srcPath, tmp); err != nil {
		if err := copyFile(srcPath, tmp); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("mirror: %w", err)
	}
	sum, err := fileSHA256(dst)
	if err != nil {
		return "", err
	}
	line := sum + "  " + path.Base(name) + "\n"
	if err := os.WriteFile(dst+".sha256", []byte(line), 0o644); err != nil {
		return "", fmt.Errorf("mirror: %w", err)
	}
	return sum, nil
}

// SetFault makes later requests for name (not its .sha256) misbehave; None
// restores normal service.
func (s *Server) SetFault(name string, f Fault) {
	name, _ = cleanName(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == None {
		delete(s.faults, name)
	} else {
		s.faults[name] = f
	}
}

// Hits is how many GET requests name has had.
func (s *Server) Hits(name string) int {
	name, _ = cleanName(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hits[name]
}

// Close stops the server and waits for it. Files stay in the directory.
func (s *Server) Close() error {
	err := s.srv.Close()
	<-s.done
	return errors.Join(err, s.root.Close())
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	name, err := cleanName(r.URL.Path)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	f, err := s.root.Open(filepath.FromSlash(name))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		http.NotFound(w, r)
		return
	}
	s.mu.Lock()
	fault := s.faults[name]
	if r.Method == http.MethodGet {
		s.hits[name]++
	}
	s.mu.Unlock()

	switch fault {
	case None:
		http.ServeContent(w, r, name, fi.ModTime(), f)
	case Truncate:
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		w.WriteHeader(http.StatusOK)
		_, _ = io.CopyN(w, f, fi.Size()/2)
		// returning with fewer bytes than announced makes net/http close
		// the connection: the client's body read ends in ErrUnexpectedEOF
	case Corrupt:
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		w.WriteHeader(http.StatusOK)
		_, _ = io.Copy(w, &flipReader{r: f, at: fi.Size() / 2})
	case Slow:
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		w.WriteHeader(http.StatusOK)
		buf := make([]byte, 64<<10)
		rc := http.NewResponseController(w)
		for {
			n, rerr := f.Read(buf)
			if n > 0 {
				if _, err := w.Write(buf[:n]); err != nil {
					return
				}
				_ = rc.Flush()
			}
			if rerr != nil {
				return
			}
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

// flipReader inverts the byte at offset at.
type flipReader struct {
	r   io.Reader
	off int64
	at  int64
}

func (f *flipReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if f.at >= f.off && f.at < f.off+int64(n) {
		p[f.at-f.off] ^= 0xff
	}
	f.off += int64(n)
	return n, err
}

// cleanName turns a URL path or file name into a relative slash path, or
// refuses it.
func cleanName(name string) (string, error) {
	c := strings.TrimPrefix(path.Clean("/"+name), "/")
	if c == "" || c == "." {
		return "", fmt.Errorf("mirror: bad file name %q", name)
	}
	return c, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		os.Remove(dst)
		return fmt.Errorf("mirror: copy %s: %w", src, err)
	}
	if err := out.Close(); err != nil {
		os.Remove(dst)
		return fmt.Errorf("mirror: copy %s: %w", src, err)
	}
	return nil
}

func fileSHA256(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", fmt.Errorf("mirror: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("mirror: read %s: %w", p, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
