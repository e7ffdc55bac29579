// Command app is the workload of kubeslot's whole-system tests: a tiny static
// program that is built at test time by package integration/workload (which
// embeds this file) and packed into an image served from a registry on
// 127.0.0.1. It is not part of kubeslot.
//
// Modes, chosen by the first argument or, failing that, by the name it runs
// under (argv[0]):
//
//	app [serve] [-addr ADDR]  serve HTTP on ADDR (default ":8080"): "/" answers the
//	                          hostname and a fixed line, "/healthz" answers 200;
//	                          one line per request on stdout
//	app pause, or run as      the pod sandbox ("pause") process: block until
//	.../pause                 SIGTERM or SIGINT, reaping orphaned children
//	app get URL               GET URL (5 s bound), print the body, exit 0 on
//	                          200 (what a test execs: pod to pod, host to pod)
//	app install FILE CONTENT  write CONTENT to FILE (a temporary file renamed
//	                          into place), then pause: what a cluster CNI
//	                          DaemonSet's pod does with a hostPath
//
// It exits 0 on SIGTERM or SIGINT in either mode, so pods stop at once.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// greeting is the fixed line "/" answers after the hostname; package
// workload's Greeting must match it.
const greeting = "kubeslot workload app"

func main() {
	args := os.Args[1:]
	mode := filepath.Base(os.Args[0])
	if len(args) > 0 && (args[0] == "serve" || args[0] == "pause" || args[0] == "get" || args[0] == "install") {
		mode, args = args[0], args[1:]
	}
	switch mode {
	case "install":
		if err := install(args); err != nil {
			fmt.Fprintln(os.Stderr, "app:", err)
			os.Exit(1)
		}
		pause()
	case "pause":
		pause()
	case "get":
		if err := get(args); err != nil {
			fmt.Fprintln(os.Stderr, "app:", err)
			os.Exit(1)
		}
	default:
		if err := serve(args); err != nil {
			fmt.Fprintln(os.Stderr, "app:", err)
			os.Exit(1)
		}
	}
}

// pause blocks like the Kubernetes pause container: it holds the pod's
// namespaces, reaps the orphans that a shared PID namespace hands it, and
// exits on SIGTERM or SIGINT.
func pause() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	fmt.Println("app: pausing")
	for s := range sigs {
		if s != syscall.SIGCHLD {
			fmt.Println("app: pause got", s)
			return
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// install writes a file atomically, as a CNI DaemonSet writes its network
// configuration into the node's /etc/cni/net.d.
func install(args []string) error {
	if len(args) != 2 {
		return errors.New("usage: app install FILE CONTENT")
	}
	tmp := filepath.Join(filepath.Dir(args[0]), "."+filepath.Base(args[0])+".tmp")
	if err := os.WriteFile(tmp, []byte(args[1]), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, args[0]); err != nil {
		return err
	}
	fmt.Println("app: installed", args[0])
	return nil
}

// get fetches one URL and prints its body.
func get(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: app get URL")
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(args[0])
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(os.Stdout, io.LimitReader(resp.Body, 1<<20)); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", args[0], resp.Status)
	}
	return nil
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	addr := fs.String("addr", ":8080", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	host, err := os.Hostname()
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "%s\n%s\n", host, greeting)
	})
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		mux.ServeHTTP(sw, r)
		// one write per line: os.Stdout is unbuffered
		fmt.Printf("%s request %s %s from %s: %d\n",
			time.Now().UTC().Format(time.RFC3339Nano), r.Method, r.URL.Path, r.RemoteAddr, sw.code)
	})

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	// the test reading this line learns the port when ADDR ends in ":0"
	fmt.Printf("app: %s serving on %s\n", host, ln.Addr())
	srv := &http.Server{Handler: logged, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	fmt.Println("app: stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}
