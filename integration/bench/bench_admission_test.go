package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeslot/kubeslot/integration/machineapi"
	"github.com/kubeslot/kubeslot/integration/rig"
	"github.com/kubeslot/kubeslot/lib/api/v1alpha1"
)

// BenchmarkAgentAdmission measures what an agent's writes cost in admission as the cluster's Machines grow: a node
// identity creating its own Machine (what every agent does once, at registration) and writing its entry in a selector
// operation's status (what every targeted agent does several times per operation), each with K other Machines in the
// cluster (KUBESLOT_ADMISSION_K, default 0,500,1000,2000). Both requests pass the ValidatingAdmissionPolicies of
// lib/api/v1alpha1/access, which check both from the request alone (none runs once per Machine): both should be
// flat in K. The figures are medians of 15 requests, sent one at a time by one client, so they are
// the apiserver's own latency without queueing. The Machines are the fleet benchmark's kind of object (rig.SampleMachine).
func BenchmarkAgentAdmission(b *testing.B) {
	cp := benchAPI(b)
	admin := benchAdmin(b, cp)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	ks := []int{0, 500, 1000, 2000}
	if v := os.Getenv("KUBESLOT_ADMISSION_K"); v != "" {
		ks = nil
		for _, f := range strings.Split(v, ",") {
			k, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || k < 0 {
				b.Fatalf("KUBESLOT_ADMISSION_K=%q: want numbers ≥ 0 separated by commas", v)
			}
			ks = append(ks, k)
		}
		slices.Sort(ks)
	}
	prefix := fmt.Sprintf("adm%d", os.Getpid())
	defer func() {
		dctx, dcancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer dcancel()
		if err := admin.REST().Delete().Resource(v1alpha1.MachinesResource).Param("labelSelector", "bench="+prefix).Do(dctx).Error(); err != nil {
			b.Errorf("clean up the Machines: %v", err)
		}
		_ = admin.DeleteOperation(dctx, prefix+"-op")
	}()

	// The operation an agent reports on, and the Machine of that agent (the admin's, as a cluster admin adds one).
	reporter := prefix + "-reporter"
	m := rig.SampleMachine(reporter, reporter)
	m.Labels = map[string]string{"bench": prefix, "pool": prefix + "-target"}
	if _, err := admin.CreateMachine(ctx, m); err != nil {
		b.Fatal(err)
	}
	op := rig.SampleOperation(prefix+"-op", v1alpha1.OperationNodeRestart)
	op.Spec.MachineRef = nil
	op.Spec.MachineSelector = &v1alpha1.MachineSelector{MatchLabels: map[string]string{"pool": prefix + "-target"}}
	if _, err := admin.CreateOperation(ctx, op); err != nil {
		b.Fatal(err)
	}
	reporterAPI := rig.NodeAPI(b, cp, reporter)
	entry, _ := json.Marshal([]map[string]any{{"op": "add", "path": "/status", "value": map[string]any{
		"machines": []any{map[string]any{"name": reporter, "nodeName": reporter, "phase": "InProgress"}},
	}}})

	have := 0
	for _, k := range ks {
		if err := benchBackgroundMachines(ctx, admin, prefix, have, k); err != nil {
			b.Fatal(err)
		}
		have = k
		// Let the apiserver's parameter informer catch up with the creates.
		time.Sleep(3 * time.Second)
		creates, writes := make([]time.Duration, 0, 15), make([]time.Duration, 0, 15)
		for i := range 15 {
			node := fmt.Sprintf("%s-k%d-%d", prefix, k, i)
			agent := rig.NodeAPI(b, cp, node)
			am := rig.SampleMachine(node, node)
			am.Labels, am.Spec.Paused, am.Spec.UpdatePolicy = nil, false, ""
			// A warm connection first (the TLS handshake is not admission's).
			if _, err := agent.GetMachine(ctx, node); err == nil {
				b.Fatalf("Machine %s exists before its agent created it", node)
			}
			t0 := time.Now()
			if _, err := agent.CreateMachine(ctx, am); err != nil {
				b.Fatalf("K=%d: agent %s creates its Machine: %v", k, node, err)
			}
			creates = append(creates, time.Since(t0))
			if err := admin.DeleteMachine(ctx, node); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			err := reporterAPI.REST().Patch(types.JSONPatchType).Resource(v1alpha1.MachineOperationsResource).Name(op.Name).
				SubResource("status").Param("dryRun", "All").Body(entry).Do(ctx).Error()
			if err != nil {
				b.Fatalf("K=%d: agent %s reports on %s: %v", k, reporter, op.Name, err)
			}
			writes = append(writes, time.Since(t1))
		}
		label := fmt.Sprintf("admission with %d Machines: ", k)
		benchFigure(b, label+"an agent creates its Machine (median)", median(creates).Seconds()*1000, "ms", fmt.Sprintf("create-ms@K=%d", k))
		benchFigure(b, label+"an agent writes its entry in a selector operation (median)", median(writes).Seconds()*1000, "ms", fmt.Sprintf("opstatus-ms@K=%d", k))
	}
}

// benchBackgroundMachines brings the benchmark's background Machines from have to want, eight creates at a time.
func benchBackgroundMachines(ctx context.Context, admin *machineapi.Client, prefix string, have, want int) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
		slots = make(chan struct{}, 8)
	)
	for i := have; i < want; i++ {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			name := fmt.Sprintf("%s-bg-%d", prefix, i)
			m := rig.SampleMachine(name, name)
			m.ObjectMeta = metav1.ObjectMeta{Name: name, Labels: map[string]string{"bench": prefix, "pool": name}}
			if _, err := admin.CreateMachine(ctx, m); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("background Machine %s: %w", name, err))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
