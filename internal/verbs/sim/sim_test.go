package sim_test

import (
	"testing"
	"time"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/sim"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

func TestConformance(t *testing.T) {
	verbstest.Run(t, sim.New(), verbs.OpenOptions{GIDIndex: -1})
}

// TestConformanceWithFaults runs the suite with completion delays,
// reordering and loss: none of them may change what the suite observes.
func TestConformanceWithFaults(t *testing.T) {
	p := sim.New()
	p.SetFaults(sim.Faults{
		Delay:           100 * time.Microsecond,
		Reorder:         true,
		LossRate:        0.02,
		RetransmitDelay: 200 * time.Microsecond,
	})
	verbstest.Run(t, p, verbs.OpenOptions{GIDIndex: -1})
}

// TestConformanceFlushPostsInError runs the suite with the other behaviour
// of posts on a QP in the error state.
func TestConformanceFlushPostsInError(t *testing.T) {
	p := sim.New()
	p.SetFaults(sim.Faults{FlushPostsInError: true})
	verbstest.Run(t, p, verbs.OpenOptions{GIDIndex: -1})
}
