package perf

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/rdmanet/rdmanet/rsock"
)

// Transports rsockperf knows, in rsock's order of preference.
var knownTransports = []string{"verbs", "shm", "tcp"}

// Mode is what carries the connections of a run: plain kernel TCP (the
// baseline), or rsock restricted to one transport.
type Mode struct {
	// Transport is "verbs", "shm" or "tcp" (rsock's fallback path), or
	// "" for plain kernel TCP (net.Dial and net.Listen).
	Transport string
	// BusyPoll is rsock's Config.BusyPoll (0: rsock's default).
	BusyPoll time.Duration
	// Control marks a second plain TCP mode, with a server of its own,
	// measured beside the baseline: its ratios to plain-tcp are what the
	// run cannot tell from noise (Options.Control).
	Control bool
}

// Plain is the baseline mode.
var Plain = Mode{}

// Control is the plain TCP mode that a compare with Options.Control
// measures as if it were one more transport.
var Control = Mode{Control: true}

// Name is "plain-tcp", "plain-tcp-control" or "rsock-<transport>".
func (m Mode) Name() string {
	if m.Control {
		return "plain-tcp-control"
	}
	if m.Transport == "" {
		return "plain-tcp"
	}
	return "rsock-" + m.Transport
}

// IsPlain reports whether m is plain kernel TCP.
func (m Mode) IsPlain() bool { return m.Transport == "" }

func (m Mode) config() *rsock.Config {
	// Only the one transport: rsock fails the connection rather than fall
	// back to TCP, so a transport that cannot be had is never silently
	// replaced by another.
	return &rsock.Config{Transports: []string{m.Transport}, BusyPoll: m.BusyPoll}
}

// dialConfig is the client's Config: the mode's transport with TCP beside
// it, so that the client runs rsock's default policy (the switching
// protocol: on TCP until the upgrade; RSOCK_UPGRADE_AFTER=-1ns makes Dial
// wait for the ring). A connection that ends up on TCP all the same is
// caught by CheckTransport and AwaitTransport, never measured as the mode.
func (m Mode) dialConfig() *rsock.Config {
	cfg := m.config()
	if m.Transport != "tcp" {
		cfg.Transports = append(cfg.Transports, "tcp")
	}
	return cfg
}

// ParseTransports parses a comma-separated transport list ("all" means
// every known transport).
func ParseTransports(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return append([]string(nil), knownTransports...), nil
	}
	var out []string
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" || seen[f] {
			continue
		}
		if !isKnownTransport(f) {
			return nil, fmt.Errorf("unknown transport %q (want verbs, shm or tcp)", f)
		}
		seen[f] = true
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no transport in %q", s)
	}
	return out, nil
}

func isKnownTransport(s string) bool {
	for _, k := range knownTransports {
		if s == k {
			return true
		}
	}
	return false
}

// Listen listens on addr in mode m.
func (m Mode) Listen(addr string) (net.Listener, error) {
	if m.IsPlain() {
		return net.Listen("tcp", addr)
	}
	lc := rsock.ListenConfig{Config: m.config()}
	return lc.Listen(context.Background(), "tcp", addr)
}

// Dialer dials in one mode and checks that every connection it returns is
// carried by the mode's transport.
type Dialer struct {
	Mode    Mode
	Timeout time.Duration
}

// MismatchError is a connection carried by another transport than the one
// asked for.
type MismatchError struct{ Want, Got, Reason string }

func (e *MismatchError) Error() string {
	got := e.Got
	if got == "" {
		got = "plain TCP"
	}
	s := fmt.Sprintf("connection is over %s, not %s", got, e.Want)
	if e.Reason != "" {
		s += " (" + e.Reason + ")"
	}
	return s
}

// DialContext dials addr, and fails unless the connection's transport is
// the mode's.
func (d Dialer) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	to := d.Timeout
	if to == 0 {
		to = 10 * time.Second
	}
	var (
		c   net.Conn
		err error
	)
	if d.Mode.IsPlain() {
		nd := net.Dialer{Timeout: to}
		c, err = nd.DialContext(ctx, "tcp", addr)
	} else {
		rd := rsock.Dialer{Timeout: to, Config: d.Mode.dialConfig()}
		c, err = rd.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	if err := CheckTransport(c, d.Mode); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Dial is DialContext without a context.
func (d Dialer) Dial(addr string) (net.Conn, error) {
	return d.DialContext(context.Background(), addr)
}

// AwaitTransport waits until c's transport has settled (rsock.Settled: a
// switching connection starts on TCP and takes its ring in the
// background), for at most until deadline (none if zero) or ctx's end, and
// then returns a *MismatchError unless c is carried by m's transport.
func AwaitTransport(ctx context.Context, c net.Conn, m Mode, deadline time.Time) error {
	wctx := ctx
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	if _, err := rsock.WaitSettled(wctx, c); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("the connection's transport did not settle by its deadline: %w", os.ErrDeadlineExceeded)
	}
	return checkTransport(c, m, false)
}

// CheckTransport returns a *MismatchError unless c is carried by m's
// transport (plain: a connection rsock did not make), or is on its way to
// it (rsock's switching protocol, before the upgrade: CodeUpgrading).
func CheckTransport(c net.Conn, m Mode) error {
	return checkTransport(c, m, true)
}

// checkTransport returns a *MismatchError unless c is carried by m's
// transport, or, with upgrading, is on its way to it.
func checkTransport(c net.Conn, m Mode, upgrading bool) error {
	got := rsock.TransportOf(c)
	if got == m.Transport {
		return nil
	}
	var reason string
	if info, ok := rsock.InfoOf(c); ok {
		reason = info.Reason
		if upgrading && info.Code == rsock.CodeUpgrading && m.Transport != "" && m.Transport != "tcp" {
			return nil
		}
	}
	want := m.Transport
	if want == "" {
		want = "plain TCP"
	}
	return &MismatchError{Want: want, Got: got, Reason: reason}
}
