package main

import (
	"bytes"
	"context"
	"fmt"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
	"github.com/kubeslot/kubeslot/lib/atomicfile"
	"github.com/kubeslot/kubeslot/lib/exitcode"
	"github.com/kubeslot/kubeslot/lib/machineclient"
	"github.com/kubeslot/kubeslot/lib/rolloutview"
)

type rolloutCmd struct {
	Status rolloutStatusCmd `cmd:"" help:"Show a MachineOperation per machine (phase, step, time in step), a progress bar and the outcome; exit 0 when it succeeded or is still going, 1 when it failed or halted. With --watch, follow it until it has an outcome."`
	Report rolloutReportCmd `cmd:"" help:"Write a MachineOperation as one self-contained HTML page: the outcome, the counts and a timeline per machine."`
}

type rolloutStatusCmd struct {
	clusterFlags
	Operation string `arg:"" name:"operation" help:"The MachineOperation's name."`
	Watch     bool   `help:"Follow the operation until it succeeds, fails or halts (at most --timeout; Ctrl-C stops)."`
}

func (c *rolloutStatusCmd) Run(e *env) error {
	cfg, _, err := c.setup(e)
	if err != nil {
		return err
	}
	mc, err := machineclient.New(cfg)
	if err != nil {
		return err
	}
	cl := viewCluster{expireCluster{mc}}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	var v rolloutview.View
	if c.Watch {
		first := true
		v, err = rolloutview.Follow(ctx, cl, c.Operation, rolloutview.FollowOptions{}, func(v rolloutview.View) error {
			if !first {
				fmt.Fprintln(e.io.Stdout)
			}
			first = false
			return v.WriteStatus(e.io.Stdout)
		})
		if err != nil {
			return err
		}
	} else {
		if v, err = rolloutview.Load(ctx, cl, c.Operation, time.Now()); err != nil {
			return err
		}
		if err := v.WriteStatus(e.io.Stdout); err != nil {
			return err
		}
	}
	return outcomeErr(v)
}

// outcomeErr is the exit status of an outcome: the output said it.
func outcomeErr(v rolloutview.View) error {
	if v.Outcome() == rolloutview.Failed {
		return exitcode.Reported(exitcode.Failure)
	}
	return nil
}

type rolloutReportCmd struct {
	clusterFlags
	Operation string `arg:"" name:"operation" help:"The MachineOperation's name."`
	HTML      string `name:"html" required:"" placeholder:"FILE" type:"path" help:"Write the page here ('-' for stdout)."`
}

func (c *rolloutReportCmd) Run(e *env) error {
	cfg, _, err := c.setup(e)
	if err != nil {
		return err
	}
	mc, err := machineclient.New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := c.context()
	defer cancel()
	v, err := rolloutview.Load(ctx, viewCluster{expireCluster{mc}}, c.Operation, time.Now())
	if err != nil {
		return err
	}
	if c.HTML == "-" {
		return v.WriteHTML(e.io.Stdout)
	}
	var b bytes.Buffer
	if err := v.WriteHTML(&b); err != nil {
		return err
	}
	// A person's output file, not a host path: no host root applies.
	if err := atomicfile.WriteFile(c.HTML, b.Bytes(), 0o644); err != nil {
		return err
	}
	abs, _ := filepath.Abs(c.HTML)
	fmt.Fprintf(e.io.Stdout, "wrote %s: %s\n", abs, v.Summary())
	return nil
}

// viewCluster is rolloutview.Cluster over machineclient.
type viewCluster struct{ expireCluster }

func (c viewCluster) GetOperation(ctx context.Context, name string) (*v1alpha1.MachineOperation, error) {
	return c.mc.GetOperation(ctx, name)
}

var viewCodec = runtime.NewParameterCodec(machineclient.Scheme)

func (c viewCluster) WatchOperation(ctx context.Context, name, resourceVersion string) (watch.Interface, error) {
	opts := &metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String(),
		ResourceVersion: resourceVersion, Watch: true}
	w, err := c.mc.REST().Get().Resource(v1alpha1.MachineOperationsResource).VersionedParams(opts, viewCodec).Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch MachineOperation %s: %w", name, err)
	}
	return w, nil
}
