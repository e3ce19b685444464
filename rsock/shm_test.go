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
			ln := listen(t, shmCfg())
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				c, s := pipe(t, ln, shmCfg())
				if TransportOf(c) != "shm" || TransportOf(s) != "shm" {
					return nil, nil, nil, fmt.Errorf("not on shm: %s", c.Info().Reason)
				}
				if swapped {
					return s, c, func() { c.Close(); s.Close() }, nil
				}
				return c, s, func() { c.Close(); s.Close() }, nil
			})
		})
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
			ln := listen(t, cfg)
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				c, s := pipe(t, ln, cfg)
				if TransportOf(c) != tr {
					return nil, nil, nil, fmt.Errorf("not on %s: %s", tr, c.Info().Reason)
				}
				return c, s, func() { c.Close(); s.Close() }, nil
			})
		})
	}
}
