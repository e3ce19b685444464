package rsock

import "sync/atomic"

// note is a wake-up remembered until taken, as by a channel of capacity 1,
// made only once something waits (connections are woken far more often):
// one word, nil, woken (nothing waits yet), or the channel.
type note struct {
	p atomic.Pointer[chan struct{}]
}

// woken marks a note woken before anything waited on it.
var woken = new(chan struct{})

// wake signals n without blocking: the waiter on C wakes, or the next one
// returns at once.
func (n *note) wake() {
	for {
		switch p := n.p.Load(); p {
		case nil:
			if n.p.CompareAndSwap(nil, woken) {
				return
			}
		case woken:
			return
		default:
			select {
			case *p <- struct{}{}:
			default:
			}
			return
		}
	}
}

// C returns the channel to wait on for the next wake-up (one already
// remembered is in it).
func (n *note) C() <-chan struct{} {
	for {
		p := n.p.Load()
		if p != nil && p != woken {
			return *p
		}
		ch := make(chan struct{}, 1)
		if p == woken {
			ch <- struct{}{}
		}
		if n.p.CompareAndSwap(p, &ch) {
			return ch
		}
	}
}
