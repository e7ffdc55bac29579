package artifact

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubeslot/kubeslot/lib/hostroot"
	"github.com/kubeslot/kubeslot/lib/testkit"
)

// syncBuffer is a log sink safe for the server and client goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newFetcher(t *testing.T) (*Fetcher, *syncBuffer) {
	t.Helper()
	root := testkit.Root(t)
	logs := &syncBuffer{}
	return &Fetcher{
		Root:    root,
		Log:     slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Backoff: func(int) time.Duration { return time.Millisecond },
		Timeout: 20 * time.Second,
	}, logs
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8)
	}
	return b
}

// server counts requests and answers the i-th (from 1) with handle(i, w, r).
func server(t *testing.T, handle func(i int, w http.ResponseWriter, r *http.Request)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handle(int(n.Add(1)), w, r)
	}))
	t.Cleanup(s.Close)
	return s, &n
}

func serveBytes(b []byte) func(int, http.ResponseWriter, *http.Request) {
	return func(_ int, w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b)
	}
}

// cacheFiles lists every name in the cache directory, temporary files too.
func cacheFiles(t *testing.T, f *Fetcher) []string {
	t.Helper()
	dir, err := f.Root.Path(hostroot.CacheDir, CacheSubdir)
	if err != nil {
		t.Fatal(err)
	}
	es, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestMissDownloadsThenHitUsesNoNetwork(t *testing.T) {
	f, logs := newFetcher(t)
	body := payload(3<<20 + 17)
	s, n := server(t, serveBytes(body))
	sum := digest(body)

	p, err := f.Ensure(context.Background(), s.URL+"/rootfs.tar.gz", sum)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(f.Root.Prefix(), "opt/kubeslot/cache/sha256", sum)
	if p != want {
		t.Errorf("path %s, want %s", p, want)
	}
	got, err := os.ReadFile(p)
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("cached content differs (err %v)", err)
	}
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
		t.Errorf("cache entry mode %v", fi.Mode().Perm())
	}
	if n.Load() != 1 {
		t.Fatalf("%d requests for a miss", n.Load())
	}
	// Upper-case digests name the same entry.
	for _, d := range []string{sum, strings.ToUpper(sum)} {
		p2, err := f.Ensure(context.Background(), s.URL+"/rootfs.tar.gz", d)
		if err != nil || p2 != p {
			t.Fatalf("hit: %s %v", p2, err)
		}
	}
	if n.Load() != 1 {
		t.Errorf("cache hit made a request: %d in all", n.Load())
	}
	if !strings.Contains(logs.String(), "artifact cache hit") {
		t.Errorf("no cache hit logged:\n%s", logs)
	}
	if got := cacheFiles(t, f); len(got) != 1 {
		t.Errorf("cache holds %v", got)
	}
}

func TestChecksumMismatchLeavesNothing(t *testing.T) {
	f, _ := newFetcher(t)
	body := payload(1 << 20)
	s, n := server(t, serveBytes(body))
	wrong := digest([]byte("something else"))

	_, err := f.Ensure(context.Background(), s.URL+"/kubelet", wrong)
	if !errors.Is(err, ErrChecksum) {
		t.Fatalf("got %v, want ErrChecksum", err)
	}
	for _, w := range []string{"expected sha256 " + wrong, "got " + digest(body), s.URL + "/kubelet", "not retried"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if n.Load() != 1 {
		t.Errorf("mismatch retried: %d requests", n.Load())
	}
	if got := cacheFiles(t, f); len(got) != 0 {
		t.Errorf("cache holds %v after a mismatch", got)
	}
}

func TestDamagedCacheEntryFetchedAgain(t *testing.T) {
	f, logs := newFetcher(t)
	body := payload(1000)
	s, n := server(t, serveBytes(body))
	p, err := f.Ensure(context.Background(), s.URL+"/x", digest(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("bit rot"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Ensure(context.Background(), s.URL+"/x", digest(body)); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 2 {
		t.Errorf("damaged entry not fetched again: %d requests", n.Load())
	}
	if err := Verify(p, digest(body)); err != nil {
		t.Error(err)
	}
	if !strings.Contains(logs.String(), "damaged") {
		t.Errorf("damage not logged:\n%s", logs)
	}
}

// truncate answers with the full Content-Length but only half the body, so
// the client sees an unexpected EOF.
func truncate(body []byte, w http.ResponseWriter) {
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body[:len(body)/2])
}

func TestTruncatedBodyRetriedThenFails(t *testing.T) {
	f, _ := newFetcher(t)
	f.Retries = 2
	body := payload(200 << 10)
	s, n := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) { truncate(body, w) })

	_, err := f.Ensure(context.Background(), s.URL+"/a", digest(body))
	if err == nil {
		t.Fatal("truncated body accepted")
	}
	if n.Load() != 3 {
		t.Errorf("%d attempts, want 3", n.Load())
	}
	if !strings.Contains(err.Error(), "attempt 3 of 3") || errors.Is(err, ErrChecksum) {
		t.Errorf("error: %v", err)
	}
	t.Logf("error: %v", err)
	if got := cacheFiles(t, f); len(got) != 0 {
		t.Errorf("cache holds %v", got)
	}
}

func TestTruncatedBodyThenSuccess(t *testing.T) {
	f, logs := newFetcher(t)
	body := payload(200 << 10)
	s, n := server(t, func(i int, w http.ResponseWriter, r *http.Request) {
		if i <= 2 {
			truncate(body, w)
			return
		}
		serveBytes(body)(i, w, r)
	})
	if _, err := f.Ensure(context.Background(), s.URL+"/a", digest(body)); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 3 {
		t.Errorf("%d attempts, want 3", n.Load())
	}
	if c := strings.Count(logs.String(), "retrying"); c != 2 {
		t.Errorf("%d retries logged, want 2", c)
	}
}

func TestNotFoundNotRetried(t *testing.T) {
	f, _ := newFetcher(t)
	s, n := server(t, func(_ int, w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })
	_, err := f.Ensure(context.Background(), s.URL+"/missing", digest(nil))
	if err == nil || !strings.Contains(err.Error(), "404 Not Found") || !strings.Contains(err.Error(), "/missing") {
		t.Fatalf("error: %v", err)
	}
	if n.Load() != 1 {
		t.Errorf("404 retried: %d requests", n.Load())
	}
}

func TestServiceUnavailableTwiceThenOK(t *testing.T) {
	f, _ := newFetcher(t)
	body := payload(4096)
	var backoffs []int
	f.Backoff = func(a int) time.Duration { backoffs = append(backoffs, a); return time.Millisecond }
	s, n := server(t, func(i int, w http.ResponseWriter, r *http.Request) {
		switch i {
		case 1:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case 2:
			http.Error(w, "slow down", http.StatusTooManyRequests)
		default:
			serveBytes(body)(i, w, r)
		}
	})
	if _, err := f.Ensure(context.Background(), s.URL+"/a", digest(body)); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 3 || fmt.Sprint(backoffs) != "[1 2]" {
		t.Errorf("requests %d, backoffs %v", n.Load(), backoffs)
	}
}

func TestSizeBound(t *testing.T) {
	body := payload(10_000)
	t.Run("content-length", func(t *testing.T) {
		f, _ := newFetcher(t)
		f.MaxSize = 9_999
		s, n := server(t, serveBytes(body))
		_, err := f.Ensure(context.Background(), s.URL+"/big", digest(body))
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "Content-Length 10000") {
			t.Fatalf("error: %v", err)
		}
		if n.Load() != 1 {
			t.Errorf("%d requests", n.Load())
		}
	})
	t.Run("streamed", func(t *testing.T) {
		f, _ := newFetcher(t)
		f.MaxSize = 9_999
		s, n := server(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.(http.Flusher).Flush() // headers without a length: chunked
			w.Write(body)
		})
		_, err := f.Ensure(context.Background(), s.URL+"/big", digest(body))
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("error: %v", err)
		}
		if n.Load() != 1 {
			t.Errorf("%d requests", n.Load())
		}
		if got := cacheFiles(t, f); len(got) != 0 {
			t.Errorf("cache holds %v", got)
		}
	})
	t.Run("exactly the bound", func(t *testing.T) {
		f, _ := newFetcher(t)
		f.MaxSize = 10_000
		s, _ := server(t, serveBytes(body))
		if _, err := f.Ensure(context.Background(), s.URL+"/big", digest(body)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDeadlineBoundsDownload(t *testing.T) {
	f, _ := newFetcher(t)
	f.Timeout = 300 * time.Millisecond
	release := make(chan struct{})
	defer close(release)
	s, _ := server(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		select { // hang until the client gives up
		case <-r.Context().Done():
		case <-release:
		}
	})
	start := time.Now()
	_, err := f.Ensure(context.Background(), s.URL+"/slow", digest(nil))
	t.Logf("gave up after %s: %v", time.Since(start), err)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "not finished within 300ms") {
		t.Fatalf("error: %v", err)
	}
	if got := cacheFiles(t, f); len(got) != 0 {
		t.Errorf("cache holds %v", got)
	}
}

func TestStalledBodyRetried(t *testing.T) {
	f, _ := newFetcher(t)
	f.StallTimeout = 100 * time.Millisecond
	body := payload(5000)
	s, n := server(t, func(i int, w http.ResponseWriter, r *http.Request) {
		if i == 1 {
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.Write(body[:100])
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		serveBytes(body)(i, w, r)
	})
	if _, err := f.Ensure(context.Background(), s.URL+"/a", digest(body)); err != nil {
		t.Fatal(err)
	}
	if n.Load() != 2 {
		t.Errorf("%d requests, want 2", n.Load())
	}
}

func TestLocalSource(t *testing.T) {
	f, _ := newFetcher(t)
	body := payload(70_000)
	dir := filepath.Join(f.Root.Prefix(), "srv/images")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rootfs.tar"), body, 0o600); err != nil {
		t.Fatal(err)
	}
	// A host path: resolved under the prefix, through a host-style link.
	if err := os.Symlink("/srv/images/rootfs.tar", filepath.Join(dir, "current.tar")); err != nil {
		t.Fatal(err)
	}
	p, err := f.Ensure(context.Background(), "/srv/images/current.tar", digest(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(p, digest(body)); err != nil {
		t.Error(err)
	}

	wrong := digest([]byte("other"))
	_, err = f.Ensure(context.Background(), "/srv/images/rootfs.tar", wrong)
	if !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), "/srv/images/rootfs.tar") {
		t.Fatalf("local mismatch: %v", err)
	}
	if got := cacheFiles(t, f); len(got) != 1 {
		t.Errorf("cache holds %v", got)
	}

	f.MaxSize = 1000
	if _, err := f.Ensure(context.Background(), "/srv/images/rootfs.tar", digest(payload(5))); !errors.Is(err, ErrTooLarge) {
		t.Errorf("local size bound: %v", err)
	}
	if _, err := f.Ensure(context.Background(), "/srv/images/missing.tar", digest(body[:1])); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing local source: %v", err)
	}
	if err := os.Symlink("../../../../../etc/passwd", filepath.Join(dir, "evil.tar")); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Ensure(context.Background(), "/srv/images/evil.tar", digest(body[:2])); !errors.Is(err, hostroot.ErrEscape) {
		t.Errorf("escaping local source: %v", err)
	}
}

func TestBadInputRefused(t *testing.T) {
	f, _ := newFetcher(t)
	good := digest(nil)
	cases := []struct{ source, sum, want string }{
		{"https://example.com/x", "abc", "want 64 hex digits"},
		{"https://example.com/x", strings.Repeat("g", 64), "want 64 hex digits"},
		{"ftp://example.com/x", good, "http(s) URL or an absolute local path"},
		{"relative/path", good, "http(s) URL or an absolute local path"},
		{"https://user:pw@example.com/x", good, "credentials"},
	}
	for _, c := range cases {
		_, err := f.Ensure(context.Background(), c.source, c.sum)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v", c.source, c.sum, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("credentials in error: %v", err)
		}
	}
}

func TestQueryNeverLogged(t *testing.T) {
	f, logs := newFetcher(t)
	f.ProgressInterval = time.Nanosecond // log on every chunk
	const secret = "X-Amz-Signature=s3cr3t"
	body := payload(2 << 20)
	s, _ := server(t, func(i int, w http.ResponseWriter, r *http.Request) {
		if i == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		serveBytes(body)(i, w, r)
	})
	if _, err := f.Ensure(context.Background(), s.URL+"/rootfs.tar?"+secret, digest(body)); err != nil {
		t.Fatal(err)
	}
	// Failures: a mismatch, and a network error (url.Error carries the URL).
	_, err1 := f.Ensure(context.Background(), s.URL+"/rootfs.tar?"+secret, digest(nil))
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	f.Retries = 1
	_, err2 := f.Ensure(context.Background(), dead.URL+"/x?"+secret+"#frag", digest(nil))
	if err1 == nil || err2 == nil {
		t.Fatalf("errors expected: %v, %v", err1, err2)
	}
	out := logs.String()
	for _, leak := range []string{out, err1.Error(), err2.Error()} {
		if strings.Contains(leak, "s3cr3t") || strings.Contains(leak, "frag") {
			t.Errorf("query leaked:\n%s", leak)
		}
	}
	for _, w := range []string{"artifact transfer progress", "percent=", "total=", s.URL + "/rootfs.tar", "retrying", "artifact downloaded and verified"} {
		if !strings.Contains(out, w) {
			t.Errorf("log lacks %q:\n%s", w, out)
		}
	}
	t.Logf("network error: %v", err2)
}

func TestRedact(t *testing.T) {
	cases := map[string]string{
		"https://h.example:8443/a/b.tar?sig=x#f": "https://h.example:8443/a/b.tar",
		"http://u:p@h/a":                         "http://h/a",
		"/srv/x.tar":                             "/srv/x.tar",
		"::bad?sig=x":                            "::bad",
	}
	for in, want := range cases {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDefaultBackoffBounded(t *testing.T) {
	for a := 0; a < 40; a++ {
		d := DefaultBackoff(a)
		hi := MaxBackoff
		if a >= 1 && a <= 5 {
			hi = time.Second << (a - 1)
		}
		if d < time.Second/2 || d > hi {
			t.Errorf("attempt %d: %s outside [0.5s, %s]", a, d, hi)
		}
	}
}

func TestVerifyAndPrune(t *testing.T) {
	f, _ := newFetcher(t)
	a, b := payload(10), payload(20)
	s, _ := server(t, func(_ int, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/a" {
			w.Write(a)
		} else {
			w.Write(b)
		}
	})
	pa, err := f.Ensure(context.Background(), s.URL+"/a", digest(a))
	if err != nil {
		t.Fatal(err)
	}
	pb, err := f.Ensure(context.Background(), s.URL+"/b", digest(b))
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(pa, digest(b)); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), pa) {
		t.Errorf("Verify mismatch: %v", err)
	}
	// A leftover from an interrupted transfer.
	stale := filepath.Join(filepath.Dir(pa), "."+digest(a)+".tmp-123")
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.Prune([]string{"nonsense"}); err == nil {
		t.Error("bad keep accepted")
	}
	if got := cacheFiles(t, f); len(got) != 3 {
		t.Fatalf("a refused prune removed something: %v", got)
	}
	if err := f.Prune([]string{strings.ToUpper(digest(b))}); err != nil {
		t.Fatal(err)
	}
	if got := cacheFiles(t, f); len(got) != 1 || got[0] != filepath.Base(pb) {
		t.Errorf("after prune: %v", got)
	}
	empty, _ := newFetcher(t)
	if err := empty.Prune(nil); err != nil {
		t.Errorf("prune of a missing cache: %v", err)
	}
}
