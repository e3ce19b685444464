package ibverbs

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
)

// The private data of rsock's rdma_cm connect request: the passive QP's
// ticket number and its secret, both from the passive side's Info, which
// only the bootstrap connection carries.
const (
	cmSecretLen = 16
	cmPrivLen   = 4 + cmSecretLen
)

// cmTicket is a passive QP waiting for its peer's connect request.
type cmTicket struct {
	num    uint32
	secret [cmSecretLen]byte
	dev    string     // the device the QP is on
	peer   netip.Addr // the bootstrap peer's IP; invalid: any
	owner  any        // the QP's connection state (cm.go)
}

// cmTable holds the process's waiting tickets. A connect request must name
// one by number and prove its secret (compared in constant time), come
// from the bootstrap peer's IP and reach the QP's device; a ticket is used
// at most once, so a replayed request finds nothing. Anything else is
// rejected and counted, and leaves the ticket to its real peer.
type cmTable struct {
	mu       sync.Mutex
	next     uint32
	waiting  map[uint32]*cmTicket
	rejected atomic.Uint64
}

// add files t under a fresh number and secret.
func (tb *cmTable) add(t *cmTicket) error {
	if _, err := rand.Read(t.secret[:]); err != nil {
		return err
	}
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.waiting == nil {
		tb.waiting = map[uint32]*cmTicket{}
	}
	for {
		tb.next++
		if _, used := tb.waiting[tb.next]; !used && tb.next != 0 {
			break
		}
	}
	t.num = tb.next
	tb.waiting[t.num] = t
	return nil
}

// remove withdraws t if it is still waiting.
func (tb *cmTable) remove(t *cmTicket) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if tb.waiting[t.num] == t {
		delete(tb.waiting, t.num)
	}
}

// claim takes the ticket a connect request from peer, arriving on device
// dev with private data pdata, proves, or returns nil with the reason.
func (tb *cmTable) claim(pdata []byte, peer netip.Addr, dev string) (*cmTicket, string) {
	if len(pdata) < cmPrivLen {
		tb.rejected.Add(1)
		return nil, "private data too short"
	}
	num := binary.BigEndian.Uint32(pdata)
	tb.mu.Lock()
	defer tb.mu.Unlock()
	t := tb.waiting[num]
	var why string
	switch {
	case t == nil:
		why = "no connection waits under that number"
	case subtle.ConstantTimeCompare(t.secret[:], pdata[4:cmPrivLen]) != 1:
		why = "wrong secret"
	case t.peer.IsValid() && t.peer != peer.Unmap():
		why = "not from the bootstrap connection's peer"
	case t.dev != dev:
		why = "arrived on another device"
	}
	if why != "" {
		tb.rejected.Add(1)
		return nil, why
	}
	delete(tb.waiting, num)
	return t, ""
}

// pdata is the private data that claims t.
func (t *cmTicket) pdata() []byte {
	b := make([]byte, cmPrivLen)
	binary.BigEndian.PutUint32(b, t.num)
	copy(b[4:], t.secret[:])
	return b
}
