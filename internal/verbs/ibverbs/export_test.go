//go:build cgo && linux

package ibverbs

import (
	"net/netip"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// FailChannel makes the completion channel that q's events come through
// fail, as a failed read of it does: q and the channel's other CQs fail,
// and new CQs get another channel (tests).
func FailChannel(q verbs.CQ, err error) { q.(*CQ).cc.fail(err) }

// OpenFDs counts the process's open descriptors (tests).
var OpenFDs = openFDs

// CompVector is the completion vector q was created on (tests).
func CompVector(q verbs.CQ) int { return q.(*CQ).vector }

// CompVectors is the number of completion vectors of d's device context
// (its num_comp_vectors; tests).
func CompVectors(d verbs.Device) int { return d.(*Device).dc.vectors }

// DeviceLimits are the limits of d's device as its context read them
// (tests).
func DeviceLimits(d verbs.Device) string { return d.(*Device).dc.limits.String() }

// MaxQPWR and MaxCQE are d's device's max_qp_wr and max_cqe (tests).
func MaxQPWR(d verbs.Device) int { return d.(*Device).dc.limits.maxQPWR }
func MaxCQE(d verbs.Device) int  { return d.(*Device).dc.limits.maxCQE }

// NewQPUnchecked creates a QP as NewQP does, without checking its depths
// against the device's limits first, so that the device's own refusal
// shows (tests).
func NewQPUnchecked(d verbs.Device, attr verbs.QPAttr) (verbs.QP, error) {
	q, err := d.(*Device).createQP(attr.CQ.(*CQ), attr)
	if err != nil {
		return nil, err
	}
	return q, nil
}

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

// DeviceFatal acts on d's device context as IBV_EVENT_DEVICE_FATAL does
// (tests: the soft devices never raise it).
func DeviceFatal(d verbs.Device) { d.(*Device).dc.deviceFatal("device fatal error") }

// QPAttrs are the attributes rsock sets on a QP, as the device reports
// them (tests).
type QPAttrs = qpAttrs

// QueryQP asks the device for q's attributes (tests).
func QueryQP(q verbs.QP) (QPAttrs, error) { return q.(*QP).attrs() }

// AckTimeoutCode is the encoded local ACK timeout for d (tests).
var AckTimeoutCode = ackTimeoutCode

// ViaCM says whether q connects through rdma_cm, and IWARP whether its
// device is iWARP (tests).
func ViaCM(q verbs.QP) bool     { return q.(*QP).viaCM }
func IWARP(d verbs.Device) bool { return d.(*Device).t.iwarp }

// SetPathHook makes the active side of rdma_cm connections connect on the
// path record f returns (SA wire format) instead of resolving the route,
// until the test ends.
func SetPathHook(t interface{ Cleanup(func()) }, f func(local, remote netip.Addr) *[64]byte) {
	old := testHookPath
	testHookPath = f
	t.Cleanup(func() { testHookPath = old })
}
