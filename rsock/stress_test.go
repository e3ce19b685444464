package rsock

import (
	"io"
	"os"
	"testing"
	"time"
)

// TestRepeatedFutureTimeout repeats nettest's FutureTimeout scenario (a
// writer that fills the ring and times out, then an echo of the backlog)
// and dumps both ends' protocol state if it ever hangs. It caught the event
// loop parking with more completions queued than one poll takes.
// RSOCK_STRESS=1 runs it ten times longer.
func TestRepeatedFutureTimeout(t *testing.T) {
	iterations := 30
	if os.Getenv("RSOCK_STRESS") != "" {
		iterations = 300
	}
	registerSim(t)
	cfg := simCfg()
	ln := listen(t, cfg)
	for i := range iterations {
		c, s := pipe(t, ln, cfg)
		c1, c2 := s, c
		c1.SetDeadline(time.Now().Add(50 * time.Millisecond))
		done := make(chan struct{}, 2)
		go func() { c1.Read(make([]byte, 1024)); done <- struct{}{} }()
		go func() {
			var err error
			for err == nil {
				_, err = c1.Write(make([]byte, 1024))
			}
			done <- struct{}{}
		}()
		<-done
		<-done
		go func() { io.CopyBuffer(struct{ io.Writer }{c2}, struct{ io.Reader }{c2}, make([]byte, 1024)) }()
		c1.SetDeadline(time.Time{})
		wdone := make(chan error, 1)
		go func() { _, err := c1.Write([]byte{0xff}); wdone <- err }()
		got := make(chan struct{})
		go func() {
			buf := make([]byte, 1024)
			for {
				n, err := c1.Read(buf)
				if n > 0 && buf[n-1] == 0xff || err != nil {
					close(got)
					return
				}
			}
		}()
		select {
		case <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d hung\nc1: %s\nc2: %s", i, c1.ring().DebugState(), c2.ring().DebugState())
		}
		<-wdone
		c.Close()
		s.Close()
	}
}
