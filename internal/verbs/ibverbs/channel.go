//go:build cgo && linux

package ibverbs

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"sync"
	"syscall"
)

// compChannel is a completion channel shared by CQs of one device
// context. Its fd is non-blocking and its duplicate sits in the Go
// netpoller: one goroutine per channel parks there (not an OS thread),
// reads the events, each naming its CQ, and calls the CQ's notify if an
// Arm is in effect. A context has maxChannels of them, made when it is
// opened and handed to CQs round-robin, so that a connection costs no
// descriptor or goroutine for its completions, while the events of many
// connections are not all read by one goroutine.
type compChannel struct {
	ch         *C.struct_rs_comp_channel
	file       *os.File // duplicate of the channel fd
	rc         syscall.RawConn
	readerDone chan struct{} // closed when the reader (events) has returned

	mu      sync.Mutex
	cqs     map[*C.struct_rs_cq]*CQ
	err     error // the channel failed: it takes no more CQs
	live    int   // CQs made, or being made, on it and not destroyed yet
	retired bool  // failed and replaced: destroyed once live is 0
	gone    bool  // destroyed
}

// maxChannels is the number of a device context's completion channels.
var maxChannels = min(runtime.GOMAXPROCS(0), 8)

// startChannels makes the context's completion channels, when it is
// opened: they live, as it does, for the life of the process.
func (dc *devCtx) startChannels() error {
	for range maxChannels {
		cc, err := dc.newChannel()
		if err != nil {
			return err
		}
		dc.chans = append(dc.chans, cc)
	}
	return nil
}

// stopChannels ends the channels of a context that failed to open (no CQ
// uses them).
func (dc *devCtx) stopChannels() {
	for _, cc := range dc.chans {
		cc.destroy()
	}
	dc.chans = nil
}

// channel returns a completion channel of the context for a new CQ, held
// for it, and the completion vector (the interrupt, and so the CPU, that
// signals it) to create the CQ on: the caller calls done once the CQ is
// destroyed, or was not made. One rule spreads both: the context's i-th CQ
// gets channel i mod len(chans) and vector i mod vectors, so that one CPU
// does not take every completion interrupt of the device. A channel that
// failed is replaced (in its place in the rotation), and destroyed once
// the last CQ that holds it is.
func (dc *devCtx) channel() (*compChannel, int, error) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	n := dc.nextChan
	dc.nextChan++
	i := n % len(dc.chans)
	vector := n % max(dc.vectors, 1)
	cc := dc.chans[i]
	cc.mu.Lock()
	failed := cc.err != nil
	if !failed {
		cc.live++
	}
	cc.mu.Unlock()
	if !failed {
		return cc, vector, nil
	}
	nc, err := dc.newChannel()
	if err != nil {
		return nil, 0, err
	}
	dc.chans[i] = nc
	nc.live++ // not shared yet
	cc.mu.Lock()
	cc.retired = true
	cc.mu.Unlock()
	cc.release()
	return nc, vector, nil
}

// done gives back a hold that channel took, once its CQ is destroyed or
// was not made.
func (cc *compChannel) done() {
	cc.mu.Lock()
	cc.live--
	cc.mu.Unlock()
	cc.release()
}

// release destroys a retired channel that no CQ holds any more.
func (cc *compChannel) release() {
	cc.mu.Lock()
	last := cc.retired && cc.live == 0 && !cc.gone
	cc.gone = cc.gone || last
	cc.mu.Unlock()
	if last {
		cc.destroy()
	}
}

// destroy closes the channel: its duplicate first, which ends a reader
// still parked on it, then, once the reader has returned, the channel.
func (cc *compChannel) destroy() {
	cc.file.Close()
	<-cc.readerDone
	C.rs_destroy_channel(cc.ch)
}

// newChannel makes a completion channel and starts its reader.
func (dc *devCtx) newChannel() (*compChannel, error) {
	var e C.int
	ch := C.rs_create_channel(dc.ctx, &e)
	if ch == nil {
		return nil, errnoErr("create completion channel", e)
	}
	cc := &compChannel{ch: ch, cqs: map[*C.struct_rs_cq]*CQ{}, readerDone: make(chan struct{})}
	var err error
	if cc.file, cc.rc, err = pollable(ch.fd, "completion channel"); err != nil {
		C.rs_destroy_channel(ch)
		return nil, err
	}
	go func() {
		defer close(cc.readerDone)
		cc.events()
	}()
	return cc, nil
}

// add makes the channel deliver q's events.
func (cc *compChannel) add(q *CQ) error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.err != nil {
		return cc.err
	}
	cc.cqs[q.cq] = q
	return nil
}

// remove stops the channel delivering q's events and returns how many it
// read and did not acknowledge. Once it returns, q's notify is not called
// from here again.
func (cc *compChannel) remove(q *CQ) C.uint {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	delete(cc.cqs, q.cq)
	n := q.unacked
	q.unacked = 0
	return n
}

// events reads the channel, parked in the Go netpoller, for the life of
// the process or until the channel fails. Each event calls its CQ's notify
// if an Arm is in effect, under cc.mu, so that CQ.Close, which takes cc.mu,
// waits out a notify in progress. Every event read is acknowledged, in
// batches per CQ and at its Close, before ibv_destroy_cq, which otherwise
// waits forever; one of a CQ already removed is acknowledged at once.
func (cc *compChannel) events() {
	_ = cc.rc.Read(func(uintptr) bool {
		for {
			var cqp *C.struct_rs_cq
			switch e := C.rs_get_cq_event(cc.ch, &cqp); {
			case e == C.int(syscall.EAGAIN):
				return false // park until the channel is readable again
			case e == C.int(syscall.EINTR):
				continue
			case e != 0:
				cc.fail(errnoErr("read completion channel", e))
				return true
			}
			cc.mu.Lock()
			q := cc.cqs[cqp]
			if q == nil {
				cc.mu.Unlock()
				C.rs_ack_cq_events(cqp, 1) // its Close is waiting for it
				continue
			}
			q.unacked++
			if q.unacked >= ackBatch {
				C.rs_ack_cq_events(cqp, q.unacked)
				q.unacked = 0
			}
			if q.armed.Swap(false) && !q.closed.Load() {
				q.notify()
			}
			cc.mu.Unlock()
		}
	})
}

// fail records that no event can come any more: every CQ of the channel
// fails (Poll and Arm report it), and new CQs get another channel.
func (cc *compChannel) fail(err error) {
	cc.mu.Lock()
	cc.err = fmt.Errorf("ibverbs: completion channel: %w", err)
	qs := slices.Collect(maps.Values(cc.cqs))
	cc.mu.Unlock()
	for _, q := range qs {
		q.fail(err)
	}
}
