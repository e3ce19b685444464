//go:build cgo && linux

package ibverbs

import (
	"fmt"
	"syscall"
)

// devLimits are the limits of a device that rsock's queue sizes are
// checked against, read once per device context (ibv_query_device). A
// limit the device reports as 0 or less is taken as not reported and not
// checked: the device then refuses what it cannot do itself.
//
// Depths beyond a limit are refused, not clamped. The engine above
// (internal/stream) asks for fixed depths and builds on them: the receive
// depth is the credit count the peer is told it may use, the send depth is
// how far apart it signals sends (a queue shrunk below it would fill with
// unsignaled requests that nothing retires), and the CQ is sized to hold
// both queues' completions (a smaller one overruns, which is fatal). A
// silently smaller queue breaks each of these; an error naming the limit
// says what to configure.
type devLimits struct {
	maxQPWR int // max_qp_wr: work requests per send or receive queue
	maxCQE  int // max_cqe: entries per CQ
}

func (l devLimits) String() string {
	return fmt.Sprintf("max_qp_wr %d, max_cqe %d", l.maxQPWR, l.maxCQE)
}

// checkCQ reports a CQ of depth entries that dev cannot have.
func (l devLimits) checkCQ(dev string, depth int) error {
	if l.maxCQE > 0 && depth > l.maxCQE {
		return fmt.Errorf("ibverbs: CQ of %d entries exceeds %s's max_cqe %d", depth, dev, l.maxCQE)
	}
	return nil
}

// checkQP reports send and receive depths that a QP of dev cannot have.
// (Each work request carries one scatter-gather entry, which every device
// takes.)
func (l devLimits) checkQP(dev string, send, recv int) error {
	switch {
	case l.maxQPWR > 0 && send > l.maxQPWR:
		return fmt.Errorf("ibverbs: QP send depth %d exceeds %s's max_qp_wr %d", send, dev, l.maxQPWR)
	case l.maxQPWR > 0 && recv > l.maxQPWR:
		return fmt.Errorf("ibverbs: QP receive depth %d exceeds %s's max_qp_wr %d", recv, dev, l.maxQPWR)
	}
	return nil
}

// qpCaps are the capabilities a QP was requested with.
type qpCaps struct{ send, recv, inline int }

// qpRefused is the error of a QP the device refused: the capabilities
// asked for and the errno of that request (first) and, when it was retried
// without inline data (retried) and that failed too, the retry's errno
// (second). Both errnos stay in the chain (errors.Is), so that a refusal
// for lack of memory is still recognised as a limit of this host.
func qpRefused(dev string, c qpCaps, first syscall.Errno, retried bool, second syscall.Errno) error {
	what := fmt.Sprintf("ibverbs: create RC QP on %s (send %d, recv %d, inline %d)", dev, c.send, c.recv, c.inline)
	if !retried {
		return fmt.Errorf("%s: %w", what, first)
	}
	return fmt.Errorf("%s: %w; without inline data: %w", what, first, second)
}
