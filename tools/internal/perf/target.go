package perf

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// Target is a running server as a client sees it: its addresses, a dialer
// in its mode, and a control connection for the server's resource use.
type Target struct {
	Mode Mode
	Info ServerInfo
	Dial Dialer

	mu  sync.Mutex
	ctl net.Conn
}

// Connect asks the server at perfAddr for its addresses, checking that it
// runs in mode m and that a connection in that mode can be had (the
// availability probe), and opens the control connection.
func Connect(ctx context.Context, m Mode, perfAddr string) (*Target, error) {
	t := &Target{Mode: m, Dial: Dialer{Mode: m}}
	c, err := t.Dial.DialContext(ctx, perfAddr)
	if err != nil {
		return nil, err
	}
	// Available means a connection gets the mode's transport, not just
	// that the server would try it.
	if err := AwaitTransport(ctx, c, m, time.Now().Add(30*time.Second)); err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(header{Op: opInfo}.marshal()); err != nil {
		c.Close()
		return nil, err
	}
	err = readFrame(c, &t.Info)
	c.Close()
	if err != nil {
		return nil, fmt.Errorf("server info: %w", err)
	}
	if t.Info.Transport != m.Transport {
		return nil, fmt.Errorf("server at %s runs %s, not %s", perfAddr, t.Info.Mode, m.Name())
	}
	if t.ctl, err = t.Dial.DialContext(ctx, perfAddr); err != nil {
		return nil, err
	}
	if _, err := t.ctl.Write(header{Op: opControl}.marshal()); err != nil {
		t.ctl.Close()
		return nil, err
	}
	return t, nil
}

// ServerStats returns the server's resource use; with gc, after the
// server collected garbage.
func (t *Target) ServerStats(gc bool) (ProcStats, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cmd := []byte{'s'}
	if gc {
		cmd[0] = 'g'
	}
	_ = t.ctl.SetDeadline(time.Now().Add(30 * time.Second))
	var st ProcStats
	if _, err := t.ctl.Write(cmd); err != nil {
		return st, fmt.Errorf("server stats: %w", err)
	}
	if err := readFrame(t.ctl, &st); err != nil {
		return st, fmt.Errorf("server stats: %w", err)
	}
	return st, nil
}

// Close closes the control connection.
func (t *Target) Close() {
	if t.ctl != nil {
		t.ctl.Close()
	}
}

// open dials the perf listener and sends the header of op, with a
// deadline that bounds the whole workload on this connection, and returns
// the connection once it runs on the mode's transport.
func (t *Target) open(ctx context.Context, op byte, param uint64, deadline time.Time) (net.Conn, error) {
	c, err := t.Dial.DialContext(ctx, t.Info.PerfAddr)
	if err != nil {
		return nil, err
	}
	if !deadline.IsZero() {
		_ = c.SetDeadline(deadline)
	}
	// The workloads that open connections this way measure them long
	// after setup: on the ring, once a switching connection has it. The
	// wait comes before the header, which starts the server's side of the
	// workload: a server that writes at once would otherwise fill the
	// connection while it waits, and hold the upgrade's frames behind
	// that data.
	if err := AwaitTransport(ctx, c, t.Mode, deadline); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := c.Write(header{Op: op, Param: param}.marshal()); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}
