package v1alpha1

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// DefaultFailureBudget is spec.rollout.failureBudget when unset: halt at the
// first failure.
const DefaultFailureBudget = 1

// Budget is the failure budget (DefaultFailureBudget when unset).
func (r *Rollout) Budget() int {
	if r == nil || r.FailureBudget == nil {
		return DefaultFailureBudget
	}
	return int(*r.FailureBudget)
}

// BudgetSpent reports whether failed failures halt the rollout: a budget of
// 0 never does.
func (r *Rollout) BudgetSpent(failed int) bool {
	b := r.Budget()
	return b > 0 && failed >= b
}

// Percent reports whether maxUnavailable is a percentage, which needs the
// number of targets (status.targets).
func (r *Rollout) Percent() bool {
	return r != nil && r.MaxUnavailable != nil && r.MaxUnavailable.Type == intstr.String
}

// Slots is how many targets may act at once: maxUnavailable (default 1),
// a percentage of targets rounded down, never below 1. A value the schema
// would refuse is an error naming the field.
func (r *Rollout) Slots(targets int) (int, error) {
	if r == nil || r.MaxUnavailable == nil {
		return 1, nil
	}
	mu := r.MaxUnavailable
	if mu.Type == intstr.Int {
		if mu.IntVal < 1 {
			return 0, fmt.Errorf("spec.rollout.maxUnavailable %d: must be at least 1", mu.IntVal)
		}
		return int(mu.IntVal), nil
	}
	p, err := strconv.Atoi(strings.TrimSuffix(mu.StrVal, "%"))
	if err != nil || !strings.HasSuffix(mu.StrVal, "%") || p < 1 || p > 100 {
		return 0, fmt.Errorf("spec.rollout.maxUnavailable %q: must be a number or a percentage from 1%% to 100%%", mu.StrVal)
	}
	return max(1, targets*p/100), nil
}

// SoakEnd is when target entry e of a rollout has soaked: spec.rollout.soakSeconds
// after its completion when it succeeded; zero when it has no soak (not
// succeeded, no completion time, or no soak asked).
func (r *Rollout) SoakEnd(e MachineOperationTarget) time.Time {
	if r == nil || r.SoakSeconds <= 0 || e.Phase != OperationSucceeded || e.CompletionTime == nil {
		return time.Time{}
	}
	return e.CompletionTime.Add(time.Duration(r.SoakSeconds) * time.Second)
}
