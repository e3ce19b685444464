//go:build cgo && linux

package ibverbs

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Provider is the ibverbs provider. It implements verbs.Provider.
//
// Device contexts (ibv_open_device) are opened on first use and kept for
// the life of the process, one per RDMA device, shared by every Provider,
// as rsocket and UCX do: opening one costs milliseconds, a file descriptor
// and a goroutine reading its asynchronous events. Each Open allocates its
// own protection domain on the shared context.
type Provider struct {
	sys sysfs
}

// New returns the ibverbs provider.
func New() *Provider {
	return &Provider{sys: sysfs{root: "/sys", cm: cmDevice}}
}

// contexts holds the process's opened device contexts, by device name.
var contexts struct {
	mu   sync.Mutex
	ctxs map[string]*devCtx
}

// cmDevice names the device the connection manager binds ip to.
func cmDevice(ip netip.Addr) (string, error) {
	s, err := cmLoad()
	if err != nil {
		return "", err
	}
	return s.deviceFor(ip)
}

// Name is "ibverbs".
func (*Provider) Name() string { return "ibverbs" }

// devCtx is one opened device context and the reader of its asynchronous
// events.
type devCtx struct {
	name  string
	ctx   *C.struct_rs_context
	async *os.File // dup of the context's async fd, non-blocking, in the netpoller

	// Lock order: a CQ's mu, a QP's smu, its rmu, then mu (QP.why is
	// called under each), then a completion channel's mu (channel). A
	// channel calls notify under its mu, and notify takes none of these.
	mu   sync.Mutex
	qps  map[*C.struct_rs_qp]*QP // for attributing asynchronous errors
	cqs  map[*C.struct_rs_cq]*CQ // for attributing overruns
	dead error                   // set on IBV_EVENT_DEVICE_FATAL
	pool pdPool                  // closed Devices kept for reuse (pool.go)

	limits devLimits // the device's limits on queue sizes (limits.go)

	chans    []*compChannel // completion channels shared by CQs (channel.go)
	nextChan int            // CQs made: picks each one's channel and vector
	vectors  int            // the context's completion vectors (num_comp_vectors, at least 1)

	pds       int           // protection domains allocated, pooled ones too (allocPD, freePD)
	ncq       int           // CQs created and not destroyed
	shut      bool          // failed and shut down (releaseIfDead)
	asyncDone chan struct{} // closed when the event reader returns

	// downPorts holds, per port that reported PORT_ERR (or was found
	// down: QP.why) and not yet PORT_ACTIVE, the timer that fails its QPs
	// after portGrace. The entry stays after the timer fired: a port is
	// failed once per outage, and the reasons of its QPs name it.
	downPorts map[int]*portTimer
}

// portTimer is a down port's pending failure (devCtx.portEvent).
type portTimer struct{ t *time.Timer }

// portGrace is how long a port may be down before its QPs are failed:
// long enough to ride out a flap (an InfiniBand subnet manager's sweep, a
// link renegotiating), short against the 3.8 s that RC retries take to
// give up on their own.
var portGrace = 250 * time.Millisecond

// openContext returns the process's opened context of dev, opening it on
// first use.
func openContext(dev string) (*devCtx, error) {
	contexts.mu.Lock()
	defer contexts.mu.Unlock()
	if dc := contexts.ctxs[dev]; dc != nil && dc.alive() == nil {
		return dc, nil
	}
	if contexts.ctxs == nil {
		contexts.ctxs = map[string]*devCtx{}
	}
	name := C.CString(dev)
	defer C.free(unsafe.Pointer(name))
	var e C.int
	ctx := C.rs_open(name, &e)
	if ctx == nil {
		return nil, fmt.Errorf("%w: ibverbs: open device %s: %v", verbs.ErrUnavailable, dev, syscall.Errno(e))
	}
	dc := &devCtx{name: dev, ctx: ctx, qps: map[*C.struct_rs_qp]*QP{}, cqs: map[*C.struct_rs_cq]*CQ{},
		vectors: max(int(ctx.num_comp_vectors), 1)}
	var da C.union_rs_device_buf
	if e := C.rs_query_device(ctx, &da); e != 0 {
		// A device that cannot say its limits is not one to trust with
		// connections.
		C.rs_close(ctx)
		return nil, fmt.Errorf("%w: ibverbs: query device %s: %v", verbs.ErrUnavailable, dev, syscall.Errno(e))
	}
	attr := (*C.struct_rs_device_attr)(unsafe.Pointer(&da))
	dc.limits = devLimits{maxQPWR: int(attr.max_qp_wr), maxCQE: int(attr.max_cqe)}
	if err := dc.startChannels(); err != nil {
		dc.stopChannels()
		C.rs_close(ctx)
		return nil, err
	}
	if err := dc.startAsync(); err != nil {
		dc.stopChannels()
		C.rs_close(ctx)
		return nil, err
	}
	contexts.ctxs[dev] = dc
	return dc, nil
}

func (dc *devCtx) alive() error {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	return dc.dead
}

// startAsync starts the goroutine that reads the context's asynchronous
// events (QP errors, device removal). It parks in the netpoller.
func (dc *devCtx) startAsync() error {
	var rc syscall.RawConn
	var err error
	if dc.async, rc, err = pollable(dc.ctx.async_fd, "async fd of "+dc.name); err != nil {
		return err
	}
	dc.asyncDone = make(chan struct{})
	go dc.asyncLoop(rc)
	return nil
}

func (dc *devCtx) asyncLoop(rc syscall.RawConn) {
	defer close(dc.asyncDone)
	var ev C.struct_rs_async_event
	for {
		var e C.int
		err := rc.Read(func(uintptr) bool {
			e = C.rs_get_async_event(dc.ctx, &ev)
			return e != C.int(syscall.EAGAIN)
		})
		if err != nil || e != 0 {
			return // the context's fd failed: nothing more will come
		}
		dc.handle(&ev)
		C.rs_ack_async_event(&ev)
	}
}

// asyncName names the asynchronous events rsock reports.
var asyncName = map[C.uint32_t]string{
	C.RS_EVENT_QP_FATAL:      "QP fatal error",
	C.RS_EVENT_QP_REQ_ERR:    "QP invalid request error",
	C.RS_EVENT_QP_ACCESS_ERR: "QP access error",
	C.RS_EVENT_CQ_ERR:        "CQ overrun",
	C.RS_EVENT_DEVICE_FATAL:  "device fatal error",
	C.RS_EVENT_PORT_ERR:      "port error",
	C.RS_EVENT_PORT_ACTIVE:   "port active",
}

// handle records an asynchronous event. On a QP error the device has
// moved the QP to the error state; the QP is marked (QP.markDead: posts
// refused from now on, outstanding work flushed, the reason in the error
// messages). A CQ overrun loses completions, so it fails the CQ
// (CQ.fail), which tells its user.
func (dc *devCtx) handle(ev *C.struct_rs_async_event) {
	name, ok := asyncName[ev.event_type]
	if !ok {
		return
	}
	switch ev.event_type {
	case C.RS_EVENT_QP_FATAL, C.RS_EVENT_QP_REQ_ERR, C.RS_EVENT_QP_ACCESS_ERR:
		qpp := *(**C.struct_rs_qp)(unsafe.Pointer(&ev.element))
		dc.mu.Lock()
		qp := dc.qps[qpp]
		dc.mu.Unlock()
		if qp != nil {
			qp.markDead(name)
		}
	case C.RS_EVENT_CQ_ERR:
		cqp := *(**C.struct_rs_cq)(unsafe.Pointer(&ev.element))
		dc.mu.Lock()
		cq := dc.cqs[cqp]
		dc.mu.Unlock()
		if cq != nil {
			cq.fail(fmt.Errorf("ibverbs: %s", name))
		}
	case C.RS_EVENT_PORT_ERR, C.RS_EVENT_PORT_ACTIVE:
		port := int(*(*C.int)(unsafe.Pointer(&ev.element)))
		dc.portEvent(port, ev.event_type == C.RS_EVENT_PORT_ACTIVE)
	case C.RS_EVENT_DEVICE_FATAL:
		dc.deviceFatal(name)
	}
}

// deviceFatal handles the device's failure: new Opens get a new context
// (or fail, if the device is gone), every QP is marked dead (its
// connection fails over), the pool is drained, and the context shuts down
// once the last of its protection domains and CQs is freed.
func (dc *devCtx) deviceFatal(why string) {
	dc.mu.Lock()
	dc.dead = fmt.Errorf("%w: ibverbs: device %s: %s", verbs.ErrUnavailable, dc.name, why)
	qps := slices.Collect(maps.Values(dc.qps))
	dc.mu.Unlock()
	for _, qp := range qps {
		qp.markDead(why)
	}
	dc.drainPool()
	dc.releaseIfDead()
}

// releaseIfDead shuts a failed context down once nothing uses it: no
// protection domain (pooled ones included) and no CQ. Called where those
// are freed.
func (dc *devCtx) releaseIfDead() {
	dc.mu.Lock()
	last := dc.dead != nil && !dc.shut && dc.pds == 0 && dc.ncq == 0
	dc.shut = dc.shut || last
	dc.mu.Unlock()
	if last {
		// Not on the caller's goroutine: it may be the event reader,
		// which shutdown waits for.
		go dc.shutdown()
	}
}

// shutdown closes a failed, unused context: its completion channels, its
// event reader and the device context, whose descriptors go with it.
func (dc *devCtx) shutdown() {
	contexts.mu.Lock()
	if contexts.ctxs[dc.name] == dc {
		delete(contexts.ctxs, dc.name)
	}
	contexts.mu.Unlock()
	dc.stopChannels()
	_ = dc.async.Close() // the reader's next wait fails: it returns
	<-dc.asyncDone
	C.rs_close(dc.ctx)
}

// portEvent handles a port's state change. A port that went down fails
// every QP on it after portGrace, unless it is active again by then: each
// is marked dead with the reason, so that its work completes as flushed
// (CQ.flushDead) and its connection fails over at once, instead of when
// its retries run out. The QP itself goes to the error state when its
// connection closes it. New connections need the port ACTIVE (Open), so
// they use it again once it is.
func (dc *devCtx) portEvent(port int, active bool) {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	pt := dc.downPorts[port]
	switch {
	case active && pt != nil:
		pt.t.Stop()
		delete(dc.downPorts, port)
	case !active && pt == nil:
		if dc.downPorts == nil {
			dc.downPorts = map[int]*portTimer{}
		}
		pt = &portTimer{}
		pt.t = time.AfterFunc(portGrace, func() { dc.portDown(port, pt) })
		dc.downPorts[port] = pt
	}
}

// portWhy is the reason a QP on port fails while the port is down, or ""
// while it is up.
func (dc *devCtx) portWhy(port int) string {
	dc.mu.Lock()
	defer dc.mu.Unlock()
	if dc.downPorts[port] == nil {
		return ""
	}
	return portDownWhy(dc.name, port)
}

func portDownWhy(dev string, port int) string {
	return fmt.Sprintf("%s port %d down", dev, port)
}

// portDown fails the QPs on port if t is still its pending failure.
func (dc *devCtx) portDown(port int, t *portTimer) {
	dc.mu.Lock()
	if dc.downPorts[port] != t {
		dc.mu.Unlock()
		return // active again meanwhile
	}
	var qps []*QP
	for _, q := range dc.qps {
		if q.dev.t.port == port {
			qps = append(qps, q)
		}
	}
	dc.mu.Unlock()
	why := portDownWhy(dc.name, port)
	// Not moved to the error state here: a modify_qp takes tens of
	// milliseconds in the emulated guest, and flushDead would wait for
	// each QP's in turn (it holds the send queue's lock).
	for _, q := range qps {
		q.markDead(why)
	}
}

// Device is a protection domain on an opened RDMA device. It implements
// verbs.Device.
type Device struct {
	dc     *devCtx
	local  netip.Addr // the bootstrap connection's IPs (rdma_cm connects by IP)
	remote netip.Addr
	pd     *C.struct_rs_pd
	t      target
	sys    sysfs
	ndev   string // a RoCE GID's netdev, or ""
	gid    [16]byte
	lid    uint16
	mtu    uint8 // the port's active MTU (enum ibv_mtu)
	closed atomic.Bool
	// tclass and sl go into the address vector of QPs connected by GID or
	// LID (-1 means 0 there); through rdma_cm, -1 leaves them to rdma_cm
	// and the path (OpenOptions.TrafficClass, ServiceLevel).
	tclass int
	sl     int
	// ackTimeout and retries are the QPs' local ACK timeout (encoded) and
	// retry count (OpenOptions.AckTimeout, RetryCount).
	ackTimeout, retries uint8

	pool      int           // OpenOptions.Pool (pool.go)
	poolIdle  time.Duration // OpenOptions.PoolIdle
	mu        sync.Mutex
	spare     []*MR // regions closed in this Device's life, kept for reuse (MR.Close)
	inherited []*MR // spares of the pooled PD's earlier life, not (yet) reused
	live      int   // open regions and QPs: the PD is pooled only at 0
	qps       int   // QPs made, or being made, and not destroyed: a peer may write
	orphan    bool  // closed with live > 0: the last dropLive frees the PD
}

// Open picks the device, port and GID for the connection (see
// verbs.OpenOptions: on RoCE, those holding the bootstrap connection's
// local IP), checks that the port is active, and allocates a protection
// domain. Errors that mean "not usable on this host or for this address"
// wrap verbs.ErrUnavailable.
func (p *Provider) Open(o verbs.OpenOptions) (verbs.Device, error) {
	if err := load(); err != nil {
		return nil, err
	}
	t, err := p.sys.cachedTarget(o.LocalAddr, o.Device, o.Port, o.GIDIndex)
	if err != nil {
		return nil, fmt.Errorf("%w: ibverbs: %v", verbs.ErrUnavailable, err)
	}
	if o.TrafficClass > 255 || o.ServiceLevel > 15 || o.RetryCount < 0 || o.RetryCount > 6 {
		return nil, fmt.Errorf("ibverbs: traffic class %d (0-255), service level %d (0-15) or retry count %d (0-6) out of range", o.TrafficClass, o.ServiceLevel, o.RetryCount)
	}
	ack, err := ackTimeoutCode(o.AckTimeout)
	if err != nil {
		return nil, err
	}
	dc, err := openContext(t.dev)
	if err != nil {
		return nil, err
	}
	attr, e := dc.queryPort(t.port)
	if e != 0 {
		return nil, fmt.Errorf("%w: ibverbs: %s port %d: %v", verbs.ErrUnavailable, t.dev, t.port, syscall.Errno(e))
	}
	if attr.state != C.RS_PORT_ACTIVE {
		return nil, fmt.Errorf("%w: ibverbs: %s port %d is not active (state %d)", verbs.ErrUnavailable, t.dev, t.port, attr.state)
	}
	d := &Device{dc: dc, t: t, lid: uint16(attr.lid), mtu: uint8(attr.active_mtu), local: addrIP(o.LocalAddr), remote: addrIP(o.RemoteAddr),
		tclass: o.TrafficClass, sl: o.ServiceLevel, ackTimeout: ack, retries: uint8(cmp.Or(o.RetryCount, defaultRetries))}
	if d.mtu < mtu256 || d.mtu > mtu4096 {
		return nil, fmt.Errorf("%w: ibverbs: %s port %d reports MTU code %d", verbs.ErrUnavailable, t.dev, t.port, d.mtu)
	}
	ib := false
	switch uint8(attr.link_layer) {
	case C.RS_LINK_LAYER_ETHERNET:
		d.t.roce = !t.iwarp
	case C.RS_LINK_LAYER_INFINIBAND:
		d.t.roce, ib = false, true
	}
	// rdma_cm connects iWARP (nothing else can), InfiniBand (its path
	// record gives the partition, the SL and a GRH where routers need
	// one), and RoCE when asked.
	d.t.cm = t.iwarp || ib || o.ConnectionManager
	if d.t.cm {
		if _, err := cmLoad(); err != nil {
			return nil, err
		}
	}
	if d.tclass < 0 && !d.t.cm {
		d.tclass = 0
		if d.t.roce {
			d.tclass = int(p.sys.defaultTOS(t.dev, t.port))
		}
	}
	if e := C.rs_query_gid(dc.ctx, C.uint8_t(t.port), C.int(t.gidIndex), (*C.uint8_t)(unsafe.Pointer(&d.gid[0]))); e != 0 {
		return nil, fmt.Errorf("%w: ibverbs: %s port %d GID %d: %v", verbs.ErrUnavailable, t.dev, t.port, t.gidIndex, syscall.Errno(e))
	}
	if d.t.roce && d.gid == [16]byte{} {
		return nil, fmt.Errorf("%w: ibverbs: %s port %d GID %d is empty", verbs.ErrUnavailable, t.dev, t.port, t.gidIndex)
	}
	if d.t.roce {
		d.sys, d.ndev = p.sys, p.sys.gidNetdev(t.dev, t.port, t.gidIndex)
	}
	d.pool, d.poolIdle = o.Pool, o.PoolIdle
	if d.pd, d.inherited = dc.takePD(); d.pd != nil {
		return d, nil
	}
	if d.pd, err = dc.allocPD(); err != nil {
		return nil, err
	}
	return d, nil
}

// allocPD allocates a protection domain, counted until freePD.
func (dc *devCtx) allocPD() (*C.struct_rs_pd, error) {
	var e C.int
	pd := C.rs_alloc_pd(dc.ctx, &e)
	if pd == nil {
		return nil, errnoErr("alloc PD on "+dc.name, e)
	}
	dc.mu.Lock()
	dc.pds++
	dc.mu.Unlock()
	return pd, nil
}

// Provider is "ibverbs".
func (*Device) Provider() string { return "ibverbs" }

// queryPort reads port's attributes (ibv_query_port); e is the errno of
// a failed query.
func (dc *devCtx) queryPort(port int) (attr *C.struct_rs_port_attr, e C.int) {
	pa := new(C.union_rs_port_buf)
	e = C.rs_query_port(dc.ctx, C.uint8_t(port), pa)
	return (*C.struct_rs_port_attr)(unsafe.Pointer(pa)), e
}

// portActive reports whether d's port is ACTIVE now and, on RoCE, its
// GID's netdev has its carrier: a netdev that is closing fails the port's
// sends before the driver marks the port down.
func (d *Device) portActive() bool {
	attr, e := d.dc.queryPort(d.t.port)
	return e == 0 && attr.state == C.RS_PORT_ACTIVE && (d.ndev == "" || d.sys.carrierUp(d.ndev))
}

// String names the device, port and GID index.
func (d *Device) String() string {
	return fmt.Sprintf("%s port %d GID %d", d.t.dev, d.t.port, d.t.gidIndex)
}

// Close deallocates the protection domain, or pools it with its spare
// regions (pool.go) when the Device pools and nothing of it is left open.
// Close QPs, CQs and MRs first.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.mu.Lock()
	spare, unused, live := d.spare, d.inherited, d.live
	d.inherited = nil
	if live > 0 {
		// Against the contract: the last of them frees the domain
		// (dropLive), with the regions spare by then. Decided under the
		// same lock as dropLive's count, so that it cannot be missed.
		d.orphan = true
	} else {
		d.spare = nil
	}
	d.mu.Unlock()
	// Only the regions of this life go back to the pool: a region a
	// connection of another ring size left is not kept forever.
	for _, m := range unused {
		_ = m.free()
	}
	if live > 0 {
		return fmt.Errorf("ibverbs: device closed with %d queue pairs and regions open; freed when they close", live)
	}
	if d.dc.putPD(d.pd, spare, d.pool, d.poolIdle) {
		return nil
	}
	return d.dc.freePD(d.pd, spare)
}

// freeSpares frees d's spare regions.
func (d *Device) freeSpares() {
	d.mu.Lock()
	spare := append(d.spare, d.inherited...)
	d.spare, d.inherited = nil, nil
	d.mu.Unlock()
	for _, m := range spare {
		_ = m.free()
	}
}

func (d *Device) check() error {
	if d.closed.Load() {
		return verbs.ErrClosed
	}
	return nil
}

// errForeign is returned for an MR or CQ of another provider or device.
var errForeign = errors.New("ibverbs: object of another device")
