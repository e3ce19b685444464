//go:build cgo && linux

package ibverbs

import "github.com/rdmanet/rdmanet/internal/verbs"

// FailChannel makes the completion channel that q's events come through
// fail, as a failed read of it does: q and the channel's other CQs fail,
// and new CQs get another channel (tests).
func FailChannel(q verbs.CQ, err error) { q.(*CQ).cc.fail(err) }

// OpenFDs counts the process's open descriptors (tests).
var OpenFDs = openFDs

// Spare finds the spare region of d at addr (closed, kept by the pool, not
// handed out again): its memory, and whether it is still registered
// (tests).
func Spare(d verbs.Device, addr uint64) (mem []byte, registered, ok bool) {
	dev := d.(*Device)
	dev.mu.Lock()
	defer dev.mu.Unlock()
	for _, list := range [][]*MR{dev.spare, dev.inherited} {
		for _, m := range list {
			if m.Addr() == addr {
				return m.buf, m.mr != nil, true
			}
		}
	}
	return nil, false, false
}
