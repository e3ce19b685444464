package rsock

import (
	"fmt"
	"net"
	"testing"
	"time"

	"golang.org/x/net/nettest"
)

func shmCfg() *Config { return &Config{Transports: []string{"shm"}} }

func TestNettestShm(t *testing.T) {
	for _, swapped := range []bool{false, true} {
		t.Run(fmt.Sprintf("swapped=%v", swapped), func(t *testing.T) {
			mk := pipeOn(t, listen(t, shmCfg()), shmCfg(), "shm")
			if swapped {
				mk = swap(mk)
			}
			nettest.TestConn(t, mk)
		})
	}
}

// pipeOn is a nettest.MakePipe of client and server connections through
// ln that fails unless both ends agreed on transport tr.
func pipeOn(t *testing.T, ln *Listener, cfg *Config, tr string) nettest.MakePipe {
	return func() (net.Conn, net.Conn, func(), error) {
		c, s := pipe(t, ln, cfg)
		if TransportOf(c) != tr || TransportOf(s) != tr {
			c.Close()
			s.Close()
			return nil, nil, nil, fmt.Errorf("not on %s: %s", tr, c.Info().Reason)
		}
		return c, s, func() { c.Close(); s.Close() }, nil
	}
}

// swap makes mk's server end the first.
func swap(mk nettest.MakePipe) nettest.MakePipe {
	return func() (net.Conn, net.Conn, func(), error) {
		c, s, stop, err := mk()
		return s, c, stop, err
	}
}

func TestShmStreamIntegritySmallRing(t *testing.T) {
	cfg := &Config{Transports: []string{"shm"}, RingSize: 4096, Credits: 4}
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	streamCheck(t, c, s, 4<<20, 11)
}

func TestNettestBusyPoll(t *testing.T) {
	// The spin path: callers poll, disarm the queue, re-arm when they stop.
	registerSim(t)
	for _, tr := range []string{"shm", "sim"} {
		t.Run(tr, func(t *testing.T) {
			cfg := &Config{Transports: []string{tr}, BusyPoll: 20 * time.Microsecond}
			nettest.TestConn(t, pipeOn(t, listen(t, cfg), cfg, tr))
		})
	}
}
