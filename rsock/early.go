package rsock

import (
	"errors"
	"fmt"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/stream"
)

// The early dial (Config.EarlyDial): docs/protocol.md §9.11.

// ErrEarlyRefused is wrapped by the errors of a connection dialed without
// waiting for the server's answer (Config.EarlyDial) whose server did not
// answer as a switching rsock server: a server that no longer speaks rsock
// at that address, or that declined the hello. Bytes written to such a
// connection may have reached that server behind a hello it did not
// understand. The next Dial to the address waits for the answer again.
var ErrEarlyRefused = errors.New("rsock: the server did not take an early dial")

// earlyServers remembers addresses whose servers answered UpgradeEarly.
var earlyServers = &probeCache{entries: map[string]probeEntry{}, need: 1}

// earlyHello is an early dial's state until the server's answer.
type earlyHello struct {
	key    string            // the address (earlyServers)
	offers []handshake.Offer // the hello's
	kicked bool              // the upgrade policy fired before the answer (kick)
	due    *time.Timer       // earlyDue: ProbeTimeout after the hello went (at most helloHold after the dial)
}

// answered handles the early dial p's first server frame: an Upgrade sets the
// transports (and starts the upgrade if kicked); anything else refuses.
func (w *swConn) answered(p *earlyHello, msg handshake.Message) error {
	up, ok := msg.(*handshake.Upgrade)
	switch d, declined := msg.(*handshake.Decline); {
	case declined:
		return p.refused(fmt.Sprintf("it declined: %v: %s", d.Code, d.Reason))
	case !ok:
		return p.refused(fmt.Sprintf("it answered with %v", msg.Type()))
	case up.Flags&handshake.UpgradeEarly == 0:
		return p.refused("its answer does not say it takes early frames")
	}
	ts := taken(p.offers, up.Transports)
	w.mu.Lock()
	w.transports, w.peer = ts, peerRing{grows: up.Flags&handshake.UpgradeGrow != 0, max: up.RingMax}
	w.mu.Unlock()
	switch {
	case len(ts) == 0:
		w.stayOnTCP(CodeDeclined, "the server takes none of the transports offered here")
	case p.kicked:
		w.kick()
	}
	return nil
}

// takePending ends the wait for an early hello's answer, and returns the
// early dial's state, or nil if there was none.
func (w *swConn) takePending() *earlyHello {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := w.pending
	w.pending = nil
	if p != nil {
		p.due.Stop()
	}
	return p
}

// earlyDue refuses an early dial unanswered ProbeTimeout after its hello: a
// switching server answers within serverReaderAfter, reading or not.
func (w *swConn) earlyDue() {
	if w.isClosed() {
		return
	}
	if p := w.takePending(); p != nil {
		w.fail(p.refused(fmt.Sprintf("no answer within %v", w.set.probe)))
	}
}

// refused forgets the address and returns the connection's error.
func (p *earlyHello) refused(why string) error {
	earlyServers.forget(p.key)
	return &stream.ResetError{Reason: "the server did not answer the early hello as a switching rsock server: " + why, Err: ErrEarlyRefused}
}
