package stream

import (
	"sync"
	"time"
)

// Sticky direct notification. When a call that waited on the completion
// queue itself (waitDirect) or busy-polled returns, the next message is
// most likely the answer to what the application writes next, and its call
// will wait again within microseconds. Arming the event loop's
// notification in between would make a message that lands in that gap take
// the slow doorbell (shm: a control message and a goroutine hand-off, and
// the sender pays for it), which under load is a large part of all
// messages (measured: 10-20%, and p50 1.4x TCP's in event-only mode
// against 0.8x without). So the direct notification stays armed (sticky);
// a message in the gap is latched (shm: in the eventfd) and found by the
// next call's poll. A queue that can be disarmed (verbs.Disarmer, shm) is
// disarmed instead while sticky: the next call polls before it waits
// anyway, so the latch only cost the sender a system call per message in
// the gap (shm: an eventfd write). In a bulk stream that is every credit
// update, since the writer is copying between its waits, and the reader
// that pays for it is the side that limits throughput (measured: 4% of its
// time). Should no call come, the sweeper hands the queue back
// to the event loop after stickyHold: background progress (reposts, credit
// updates while the application is busy elsewhere) is delayed by at most
// about stickyHold plus a tick, never lost. The sweeper runs only while a
// connection is sticky; its tick is coarse so that a connection with a
// message every few milliseconds does not wake it for each one (a 1 ms
// tick measured about 10 us of CPU per message there).
const (
	stickyHold = 5 * time.Millisecond
	sweepTick  = 5 * time.Millisecond
)

// stickLocked marks the direct notification sticky and makes sure the
// sweeper watches c.
func (c *Conn) stickLocked() {
	if c.dw == nil || c.closed {
		return
	}
	c.sticky = true
	c.stuckAt = nanotime()
	if !c.inSweep.Load() {
		c.inSweep.Store(true)
		sweeper.add(c)
	}
}

// unstickLocked hands the queue back to the event loop if c has been
// sticky for stickyHold with no call waiting; it reports whether c needs
// watching still.
func (c *Conn) unstickLocked(now int64) bool {
	if c.closed {
		c.sticky = false
	}
	if !c.sticky {
		c.inSweep.Store(false)
		return false
	}
	if now-c.stuckAt < int64(stickyHold) || c.dirOwner.Load() != 0 {
		return true
	}
	c.sticky = false
	c.inSweep.Store(false)
	if c.armLocked() == nil {
		c.progressLocked()
	}
	return false
}

// sweeper is the one goroutine per process that unsticks connections; it
// runs only while some connection is sticky, so an idle process costs no
// CPU. Lock order: a Conn's mu, then sweeper.mu (add); the sweeper never
// holds its mu while it takes a Conn's. A Conn's inSweep is set under its
// mu before add, and cleared under its mu by the sweeper, which removes
// the Conn from the set only if it is still clear.
var sweeper = &sweepSet{conns: map[*Conn]struct{}{}}

type sweepSet struct {
	mu      sync.Mutex
	conns   map[*Conn]struct{}
	running bool
}

// add puts c in the set and starts the sweeper if it is not running.
func (s *sweepSet) add(c *Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns[c] = struct{}{}
	if !s.running {
		s.running = true
		go s.run()
	}
}

func (s *sweepSet) run() {
	t := time.NewTicker(sweepTick)
	defer t.Stop()
	var batch []*Conn
	for range t.C {
		s.mu.Lock()
		batch = batch[:0]
		for c := range s.conns {
			batch = append(batch, c)
		}
		s.mu.Unlock()
		now := nanotime()
		var done []*Conn
		for _, c := range batch {
			c.mu.Lock()
			if !c.unstickLocked(now) {
				done = append(done, c)
			}
			c.mu.Unlock()
		}
		s.mu.Lock()
		for _, c := range done {
			// c may have been marked sticky again since (and, finding
			// itself still in the set, not added itself): keep it then.
			if !c.inSweep.Load() {
				delete(s.conns, c)
			}
		}
		if len(s.conns) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
	}
}

// nanotime is a monotonic clock in nanoseconds.
func nanotime() int64 { return int64(time.Since(epoch)) }

var epoch = time.Now()
