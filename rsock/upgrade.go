package rsock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/stream"
	"github.com/rdmanet/rdmanet/internal/transport"
	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The switching handshake and upgrade: docs/protocol.md §2.4, §9.1, §9.4.

// switchHello is the client's Hello: one offer per transport it could set
// up, with no ring prepared.
func (s *settings) switchHello(names []string) *handshake.Hello {
	h := &handshake.Hello{Flags: handshake.FlagSwitch | handshake.FlagGrow, RingMax: uint64(s.ringSize)}
	for _, name := range localFirst(names) {
		if len(h.Offers) < handshake.MaxOffers {
			h.Offers = append(h.Offers, handshake.Offer{Transport: mustTransport(name)})
		}
	}
	return h
}

// serveSwitch answers a Hello with FlagSwitch (docs/protocol.md §2.4) and
// returns the connection, on TCP, for Accept (on an error the caller closes
// raw). arrived is an early client's first frames; the answer to an early
// hello is held (sender.hold).
func (s *settings) serveSwitch(l *Listener, raw *net.TCPConn, hello *handshake.Hello, from switchFrom, arrived []byte) (*Conn, error) {
	var ts []handshake.Transport
	for _, t := range s.order {
		if _, built := transport.Lookup(t.String()); built && offered(hello.Offers, t) {
			ts = append(ts, t)
		}
	}
	reason := "on TCP until the client upgrades"
	var answer handshake.Message = &handshake.Upgrade{Flags: handshake.UpgradeGrow | handshake.UpgradeEarly, RingMax: uint64(s.ringSize), Transports: ts}
	if len(ts) == 0 {
		reason = "no common transport: " + s.transportList()
		if !s.fallback {
			answer = &handshake.Decline{Code: handshake.DeclineNoCommonTransport, Reason: "no common transport"}
		}
	}
	frame, err := handshake.Append(nil, answer)
	if !from.withMagic && err == nil {
		frame = frame[len(handshake.Magic):]
	}
	st := switchStart{transports: ts, peer: peerRing{grows: hello.Flags&handshake.FlagGrow != 0, max: hello.RingMax}, reason: reason, arrived: arrived, untimed: !from.timed}
	// Only a connection that may upgrade has the reader timer that
	// flushes a held answer.
	if err == nil && len(ts) > 0 && hello.Flags&handshake.FlagEarly != 0 {
		st.held = frame
	} else if err == nil {
		_, err = raw.Write(frame)
	}
	if err != nil {
		return nil, fmt.Errorf("rsock: writing upgrade: %w", err)
	}
	if _, declined := answer.(*handshake.Decline); declined {
		return nil, fmt.Errorf("%w: %s", ErrNoTransport, reason)
	}
	return s.switchConn(l.network, raw, l, st), nil
}

// switchFrom is where a switching hello was read (serveSwitch).
type switchFrom struct {
	withMagic bool // the magic has not been sent: it goes with the answer
	timed     bool // raw has a deadline, which the connection clears
}

// switchStart is how a switching connection starts (switchConn).
type switchStart struct {
	transports []handshake.Transport // what the peer takes; for the client, in our order
	peer       peerRing              // what the peer said of rings (Hello, Upgrade)
	reason     string                // ConnInfo.Reason until the upgrade
	// early: the client sent its hello with FlagEarly and awaits the
	// answer, which sets transports and grow (swConn.answered).
	early  bool
	key    string            // the early client's address key (earlyServers)
	offers []handshake.Offer // the early client's hello's
	// held (shared, read only), an early hello or the answer to one, goes
	// out with the next frame (sender.hold). arrived: see serveSwitch.
	held    []byte
	arrived []byte
	untimed bool // raw has no deadline to clear
}

// switchConn makes the Conn of a switching connection on raw and starts it.
// ln is the listener of a server's connection, nil on the client.
func (s *settings) switchConn(network string, raw *net.TCPConn, ln *Listener, st switchStart) *Conn {
	if !st.untimed {
		_ = raw.SetDeadline(time.Time{})
	}
	l := label{transport: "tcp", code: CodeUpgrading, reason: st.reason}
	stays := len(st.transports) == 0 && !st.early
	if stays {
		l.code, l.fallback = CodeDeclined, true
	}
	// The Conn, its switching side and its first label live and die
	// together: one allocation.
	both := &struct {
		c Conn
		w swConn
		l label
	}{l: l}
	c := &both.c
	c.network, c.tcp = network, raw
	c.label.Store(&both.l)
	c.w = &both.w
	c.w.init(c, s, raw, ln == nil)
	c.w.ln = ln
	c.w.peer = st.peer
	if st.early {
		c.w.pending = &earlyHello{key: st.key, offers: st.offers}
		c.w.pending.due = time.AfterFunc(s.probe+helloHold, c.w.earlyDue)
	}
	if stays {
		c.w.settled.fire() // nothing waits yet: no channel
	}
	if st.held != nil {
		c.w.out.hold(st.held)
	}
	c.w.in.preload(st.arrived)
	c.register()
	c.w.start(st.transports)
	return c
}

// transportList names the configured accelerated transports, with why
// each one this binary lacks is absent ("not available on darwin").
func (s *settings) transportList() string {
	names := slices.Clone(s.transports)
	for i, n := range names {
		if _, ok := transport.Lookup(n); !ok {
			names[i] += " (" + transport.Absent(n).Error() + ")"
		}
	}
	return "this side allows " + strings.Join(names, "; ")
}

// stayOnTCP records an upgrade that did not happen: the connection goes on
// on TCP, visibly, or, where TCP is not allowed, is reset.
func (w *swConn) stayOnTCP(code, reason string) {
	if !w.set.fallback {
		w.fail(&stream.ResetError{Reason: "no transport could be agreed and TCP fallback is not allowed: " + reason, Err: ErrNoTransport})
		return
	}
	w.c.relabel(&label{transport: "tcp", code: code, fallback: true, reason: reason})
	w.mu.Lock()
	w.noteLocked("", "tcp", "tcp", reason)
	w.settled.fire() // the upgrade ended without a ring
	w.mu.Unlock()
}

// clientUpgrade offers the first transport the server takes, in our order
// (host-local first), and on an Accept starts the ring and switches.
func (w *swConn) clientUpgrade() {
	w.mu.Lock()
	over, gone := w.closed || w.err != nil, w.gone.set
	w.mu.Unlock()
	switch {
	case over:
		return
	case gone:
		// The server ended before the policy's time: no one to offer to.
		w.stayOnTCP(CodeDeclined, "the server closed the connection before the upgrade began")
		testHookUpgradeOver.run(w)
		return
	}
	// A place for an endpoint setup, held until this upgrade ends: an
	// endpoint holds descriptors a running ring does not (§9.4 step 1).
	select {
	case clientSetups <- struct{}{}:
	case <-w.done:
		return
	}
	release := sync.OnceFunc(func() { <-clientSetups })
	defer release()
	if w.isClosed() {
		return // while it waited
	}
	s := w.set
	var why reasons
	var ep *stream.Endpoint
	var name string
	for _, t := range s.order {
		// (The hello offered only what raw's peer may take: offerable.)
		if !slices.Contains(w.transports, t) {
			continue
		}
		var err error
		name = t.String()
		if ep, err = s.newEndpoint(name, w.raw, w.peer); err == nil {
			break
		}
		why.add(name, err)
	}
	if ep == nil {
		w.stayOnTCP(CodeNothingHere, "no transport available here: "+why.String())
		return
	}
	w.mu.Lock()
	if w.closed || w.err != nil {
		w.mu.Unlock()
		ep.Close()
		return
	}
	mine := w.upgradingLocked()
	w.mu.Unlock()
	again := false // the server was busy: offer again after the backoff
	defer func() {
		_ = w.out.confirmed(nil) // however the upgrade ended, Data goes on
		w.upgradeEnded(mine)
		if again { // a setback, and a new upgrade after the backoff
			w.mu.Lock()
			w.setbacks++
			w.reupgradeLocked()
			w.mu.Unlock()
		}
		testHookUpgradeOver.run(w)
	}()
	offer := &handshake.UpgradeOffer{Offer: handshake.Offer{Transport: mustTransport(name), Ring: ringOf(ep.Ring()), Info: ep.Info()}}
	if err := w.out.offer(offer); err != nil {
		ep.Close()
		return
	}
	// The answer may wait behind Data the server's application has not
	// read: past HandshakeTimeout the setup place is given back.
	slow := time.AfterFunc(w.set.handshake, release)
	answer, gone := w.answer(nil)
	slow.Stop()
	switch m := answer.(type) {
	case nil:
		ep.Close()
		if gone {
			w.stayOnTCP(CodeDeclined, "the server closed the connection before it answered the offer")
		}
		return
	case *handshake.Decline:
		ep.Close()
		w.stayOnTCP(CodeDeclined, fmt.Sprintf("server declined: %v: %s", m.Code, m.Reason))
		// Only a busy server says its reason will pass; one that could
		// not prepare its side may fail the same way every time.
		again = m.Code == handshake.DeclineResources
		return
	case *handshake.Accept:
		ctx, cancel := w.stepContext()
		defer cancel()
		r, err := w.clientStart(ctx, ep, name, m)
		if err != nil {
			ep.Close()
			reason := fmt.Sprintf("%s: %v", name, err)
			if w.out.confirmed(&handshake.Confirm{Code: handshake.DeclineFailed, Reason: handshake.SanitizeReason(reason)}) == nil {
				code := CodeConnectFail
				if verbs.LocalLimit(err) {
					code = CodeLocalLimit
				}
				w.stayOnTCP(code, "could not connect "+reason)
			}
			return
		}
		w.mu.Lock()
		w.up = upAgreed
		w.mu.Unlock()
		// Confirm goes out before a Write can see the ring and queue its
		// Switch behind it.
		if err := w.out.confirmed(&handshake.Confirm{}); err != nil {
			dropRing(r)
			return
		}
		w.setRing(r, name)
	}
}

// awaitUpgrade (dialWaits) waits until the connection settled or ctx ends:
// nil on the ring or, where allowed, on TCP; else the upgrade's or ctx's error.
func (w *swConn) awaitUpgrade(ctx context.Context) error {
	select {
	case <-w.settledChan():
	case <-ctx.Done():
		return ctx.Err()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.err != nil:
		return w.err
	case !w.set.fallback && !(w.send == sendRing && w.recv == recvRing):
		l := w.c.label.Load()
		return noTransport(fmt.Errorf("the upgrade ended on TCP: %s", l.reason))
	}
	return nil
}

// clientSetups holds the places of the process's clients' endpoint setups.
var clientSetups = make(chan struct{}, maxClientSetups)

// upgradeEnded ends the upgrade whose channel is mine, once: no upgrade
// is in progress any more, and a peer's Switch waiting for it goes on.
func (w *swConn) upgradeEnded(mine chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-mine:
	default:
		w.up = upIdle
		close(mine)
	}
	w.settleLocked() // the peer's end may have come meanwhile
}

// The backoff of a new upgrade after a setback (reupgradeDelay).
const (
	reupgradeBase = 100 * time.Millisecond
	reupgradeMax  = time.Minute
)

// reupgradeScale divides the backoff, for tests (1 otherwise); negative:
// no new upgrade.
var reupgradeScale atomic.Int64

// reupgradeDelay is the client's backoff before it offers a ring again after
// a connection's n-th setback: reupgradeBase << (n-1), at most reupgradeMax.
func reupgradeDelay(n int) time.Duration {
	d := reupgradeMax
	if n = max(n, 1); n <= 30 && reupgradeBase<<(n-1) < reupgradeMax {
		d = reupgradeBase << (n - 1)
	}
	return d / time.Duration(max(reupgradeScale.Load(), 1))
}

// reupgradeLocked arms the client's next upgrade once a setback is over
// (the peer's Resume came, or a busy server's decline), at random between half the
// backoff and all of it, so that connections set back together spread.
func (w *swConn) reupgradeLocked() {
	if !w.client || len(w.transports) == 0 || w.closed || w.err != nil || w.gone.set || reupgradeScale.Load() < 0 {
		return
	}
	if w.upTimer != nil {
		w.upTimer.Stop()
	}
	d := reupgradeDelay(w.setbacks)
	w.upTimer = time.AfterFunc(d/2+rand.N(d/2+1), func() {
		w.upStarted.Store(false)
		w.kick()
	})
}

// testHookUpgradeOver runs when a client's upgrade has ended, and a new
// one is armed if it is to follow (tests).
var testHookUpgradeOver hook

// declineOffer ends the server's upgrade, then declines the offer (the
// client may offer again once it reads it), with this side's code ours.
func (w *swConn) declineOffer(mine chan struct{}, code handshake.DeclineCode, ours, reason string) {
	reason = handshake.SanitizeReason(reason)
	w.upgradeEnded(mine)
	if w.out.send(&handshake.Decline{Code: code, Reason: reason}) == nil {
		w.stayOnTCP(ours, "declined the client's offer: "+reason)
	}
}

// clientStart connects and starts the ring the server accepted: it checks
// the server's ring, registers the staging for it (before switching, as the
// server does) and connects ep actively. On an error the caller closes ep.
func (w *swConn) clientStart(ctx context.Context, ep *stream.Endpoint, name string, m *handshake.Accept) (*stream.Conn, error) {
	if m.Transport != mustTransport(name) {
		return nil, fmt.Errorf("the server accepted %v, which was not offered", m.Transport)
	}
	if err := w.set.checkPeerRing(m.Ring); err != nil {
		return nil, err
	}
	if err := ep.Prepare(streamRing(m.Ring)); err != nil {
		return nil, err
	}
	if err := ep.Connect(ctx, m.Info, true); err != nil {
		return nil, err
	}
	return ep.Start(streamRing(m.Ring), w, &w.rdl, &w.wdl)
}

// serveUpgrade answers the client's offer with Accept or Decline, and
// after Confirm{0} starts the ring and switches.
func (w *swConn) serveUpgrade(o handshake.Offer, mine chan struct{}) {
	ctx, cancel := w.stepContext()
	defer cancel()
	defer w.upgradeEnded(mine)
	name := o.Transport.String()
	w.mu.Lock()
	w.offers++
	n := w.offers
	w.mu.Unlock()
	if n > maxOffers {
		w.declineOffer(mine, handshake.DeclinePolicy, CodeDeclined, fmt.Sprintf("too many upgrade offers on this connection (%d)", maxOffers))
		return
	}
	// Endpoint setups count against the listener's bound.
	select {
	case w.ln.setups <- struct{}{}:
	default:
		w.ln.busy.Add(1)
		w.declineOffer(mine, handshake.DeclineResources, CodeDeclined, fmt.Sprintf("server busy: %d handshakes preparing an endpoint", maxSetups))
		return
	}
	ep, err := w.servePrepare(ctx, o)
	<-w.ln.setups // prepared (or not): the place's work is done
	if err != nil {
		code, ours := handshake.DeclineUnavailable, CodeDeclined
		if verbs.LocalLimit(err) {
			// A limit of this host may pass: the client may offer again.
			code, ours = handshake.DeclineResources, CodeLocalLimit
		}
		w.declineOffer(mine, code, ours, fmt.Sprintf("%s: %v", name, err))
		return
	}
	accept := &handshake.Accept{Transport: o.Transport, Ring: ringOf(ep.Ring()), Info: ep.Info()}
	if err := w.out.send(accept); err != nil {
		ep.Close()
		return
	}
	// The client confirms within its HandshakeTimeout: a Confirm not here
	// within twice that will not come (§9.4 step 4).
	m, gone := w.answer(time.After(2 * w.set.handshake))
	confirm, _ := m.(*handshake.Confirm)
	if confirm == nil {
		ep.Close()
		if gone {
			w.stayOnTCP(CodeClientGaveUp, "the client closed the connection before it confirmed")
		} else { // the time is up, or Close came (fail then does nothing)
			w.fail(&stream.ResetError{Reason: fmt.Sprintf("the client did not confirm %s within %v", name, 2*w.set.handshake)})
		}
		return
	}
	if confirm.Code != handshake.DeclineNone {
		ep.Close()
		w.stayOnTCP(CodeClientGaveUp, fmt.Sprintf("client gave up on %s: %v: %s", name, confirm.Code, confirm.Reason))
		return
	}
	// The client has switched, or will: a failure from here is the
	// ring's failure (startFailed).
	ctx, cancel = w.stepContext()
	defer cancel()
	err = ep.Established(ctx)
	if e := testServeExchangeErr.Load(); err == nil && e != nil {
		err = *e
	}
	if err != nil {
		ep.Close()
		w.startFailed(name+" side exchange", err)
		return
	}
	testHookServeStart.run(w)
	r, err := ep.Start(streamRing(o.Ring), w, &w.rdl, &w.wdl)
	if err != nil {
		ep.Close()
		w.startFailed("starting "+name, err)
		return
	}
	w.setRing(r, name)
}

// answer waits for the peer's answer to our Offer (Accept or Decline) or
// Accept (Confirm) until timeout, Close or the peer's end: nil without one.
// gone says the peer ended first (an answer it sent was read before its end).
func (w *swConn) answer(timeout <-chan time.Time) (m handshake.Message, gone bool) {
	select {
	case m = <-w.answers:
	case <-timeout:
	case <-w.done:
	case <-w.gone.ch:
		select {
		case m = <-w.answers:
		default:
			gone = true
		}
	}
	return m, gone
}

// stepContext bounds an upgrade's step by HandshakeTimeout and Close.
func (w *swConn) stepContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), w.set.handshake)
	go func() {
		select {
		case <-w.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// servePrepare makes the server's endpoint for the client's offer, if its
// transport is allowed, registering all it needs before the client
// switches, so a refused registration declines, not aborts.
func (w *swConn) servePrepare(ctx context.Context, o handshake.Offer) (*stream.Endpoint, error) {
	s, name := w.set, o.Transport.String()
	if !slices.Contains(s.transports, name) {
		return nil, fmt.Errorf("not allowed here (%s)", s.transportList())
	}
	if err := s.checkPeerRing(o.Ring); err != nil {
		return nil, fmt.Errorf("client's ring: %w", err)
	}
	e, err := s.newEndpoint(name, w.raw, w.peer)
	if err != nil {
		return nil, err
	}
	if err = e.Connect(ctx, o.Info, false); err == nil {
		err = e.Prepare(streamRing(o.Ring))
	}
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}
