//go:build cgo && linux

package ibverbs

/*
#include <stdlib.h>
#include <sys/socket.h>
#include "shim.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// The connection manager (librdmacm) connects the QPs of devices that
// cannot be connected by hand: iWARP runs an MPA exchange over a kernel TCP
// connection, and its drivers refuse RTS without it. QPs, CQs and memory
// still come from this provider; rdma_cm only moves the QP's state, by its
// QP number.
//
// One event channel serves the process. Its descriptor is non-blocking and
// read by one goroutine parked in the Go netpoller, which copies and
// acknowledges every event at once, so no thread waits per connection and
// rdma_destroy_id (which waits for its events' acknowledgements) never
// waits long. That goroutine never destroys an identifier itself.
//
// Passive side (Connect with active false): the process's rdma_cm listener
// on the bootstrap connection's local IP (one per IP, an ephemeral port,
// kept for the life of the process) and a ticket, a number and a 16-byte
// secret, which go to the peer in this QP's Info over the bootstrap
// connection. A connect request must carry the ticket in its private
// data, come from the bootstrap peer's IP and arrive on this QP's device;
// it is then accepted with this QP. Any other request is rejected and
// counted (CMRejected), and the ticket stays for its real peer. A ticket
// is used once.
//
// Active side: an identifier resolved from the bootstrap connection's
// local IP to the peer's IP and advertised port (it must resolve to this
// QP's device), then rdma_connect with the ticket.
//
// Once connected, the identifier lives as long as the QP. A disconnect (or
// the device's removal) moves the QP to the error state with that reason,
// as the device's asynchronous QP errors do.

// cmLibName is librdmacm's soname.
const cmLibName = "librdmacm.so.1"

// cmResolveMS bounds each of rdma_cm's address and route resolutions.
const cmResolveMS = 5000

// cmState is the process's connection manager state.
type cmState struct {
	ch *C.struct_rs_cm_channel

	mu        sync.Mutex
	conns     map[*C.struct_rs_cm_id]*cmConn
	listeners map[netip.Addr]*cmListener
	dead      error // set when the event channel failed

	listenMu sync.Mutex // serialises listener creation
	tickets  cmTable
}

var cms struct {
	once sync.Once
	err  error
	s    *cmState
}

// cmLoad loads librdmacm and opens the process's event channel, once.
func cmLoad() (*cmState, error) {
	cms.once.Do(func() {
		if err := load(); err != nil {
			cms.err = err
			return
		}
		if cms.err = loadCMLib(cmLibName); cms.err == nil {
			cms.s, cms.err = startCM()
			cmLoaded.Store(cms.s)
		}
	})
	return cms.s, cms.err
}

// loadCMLib dlopens name and resolves the connection manager calls.
func loadCMLib(name string) error {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var buf [512]C.char
	if C.rs_cm_load(cname, &buf[0], C.size_t(len(buf))) != 0 {
		return fmt.Errorf("%w: ibverbs: cannot load %s, which iWARP devices need: %s", verbs.ErrUnavailable, name, C.GoString(&buf[0]))
	}
	return nil
}

// LoadCM reports whether the connection manager can be used here (librdmacm
// loads and its event channel opens), and why not.
func LoadCM() error {
	_, err := cmLoad()
	return err
}

// CMDevice names the RDMA device the connection manager binds ip to.
func CMDevice(ip netip.Addr) (string, error) { return cmDevice(ip) }

// CMRejected is the number of rdma_cm connect requests this process
// rejected: without a valid ticket, from another address or on another
// device than the connection they named.
func CMRejected() uint64 {
	if s := cmLoaded.Load(); s != nil {
		return s.tickets.rejected.Load()
	}
	return 0
}

// cmLoaded is the connection manager once loaded (read without loading it).
var cmLoaded atomic.Pointer[cmState]

func startCM() (*cmState, error) {
	var e C.int
	ch := C.rs_cm_create_channel(&e)
	if ch == nil {
		return nil, fmt.Errorf("%w: ibverbs: rdma_cm event channel: %v (is the rdma_ucm module loaded, /dev/infiniband/rdma_cm present?)", verbs.ErrUnavailable, syscall.Errno(e))
	}
	// The channel stays open for the life of the process.
	f, rc, err := pollable(ch.fd, "rdma_cm event channel")
	if err != nil {
		return nil, err
	}
	s := &cmState{ch: ch, conns: map[*C.struct_rs_cm_id]*cmConn{}, listeners: map[netip.Addr]*cmListener{}}
	go s.loop(rc, f)
	return s, nil
}

// cmEvent is what a connection's waiter learns of an rdma_cm event.
type cmEvent struct {
	typ    uint32
	status int
}

func (ev cmEvent) String() string {
	s := C.GoString(C.rs_cm_event_str(C.uint32_t(ev.typ)))
	if ev.status != 0 {
		s += fmt.Sprintf(" (status %d)", ev.status)
	}
	return s
}

// cmConn is one QP's rdma_cm identifier and the events for its connector.
type cmConn struct {
	id     *C.struct_rs_cm_id // under cmState.mu; nil until accepted (passive)
	events chan cmEvent
	qp     *QP
	ticket *cmTicket // passive side
	closed bool      // under cmState.mu
}

// cmListener is the process's rdma_cm listener on one local IP.
type cmListener struct {
	id   *C.struct_rs_cm_id
	port uint16
	dev  string
}

// loop reads and dispatches every event of the channel.
func (s *cmState) loop(rc syscall.RawConn, f *os.File) {
	var got C.struct_rs_cm_got
	for {
		var e C.int
		err := rc.Read(func(uintptr) bool {
			e = C.rs_cm_get_event(s.ch, &got)
			return e != C.int(syscall.EAGAIN)
		})
		if err == nil && e != 0 {
			err = syscall.Errno(e)
		}
		if err != nil {
			s.fail(fmt.Errorf("ibverbs: rdma_cm event channel failed: %w", err))
			f.Close()
			return
		}
		if got.event == C.RS_CM_CONNECT_REQUEST {
			s.request(&got)
			continue
		}
		s.mu.Lock()
		c := s.conns[got.id]
		s.mu.Unlock()
		if c == nil {
			continue
		}
		ev := cmEvent{typ: uint32(got.event), status: int(got.status)}
		switch got.event {
		case C.RS_CM_DISCONNECTED, C.RS_CM_DEVICE_REMOVAL:
			c.qp.cmFail("rdma_cm: " + ev.String())
		}
		select {
		case c.events <- ev:
		default: // nobody waits any more; the channel holds the first events
		}
	}
}

// alive reports the event channel's failure, if it failed.
func (s *cmState) alive() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

// fail ends every connection's wait: the channel is gone.
func (s *cmState) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = err
	for _, c := range s.conns {
		c.qp.cmFail(err.Error())
		select {
		case c.events <- cmEvent{typ: C.RS_CM_DEVICE_REMOVAL}:
		default:
		}
	}
}

// request answers a connect request: accepted with the QP whose ticket it
// proves, or rejected. It runs on the loop, so identifiers are destroyed
// on other goroutines.
func (s *cmState) request(got *C.struct_rs_cm_got) {
	child := got.id
	pdata := C.GoBytes(unsafe.Pointer(&got.pdata[0]), C.int(got.pdata_len))
	peer := sockaddrIP(&child.dst)
	dev := ""
	if child.verbs != nil {
		dev = C.GoString(C.rs_context_name(child.verbs))
	}
	t, _ := s.tickets.claim(pdata, peer, dev)
	s.mu.Lock()
	defer s.mu.Unlock()
	var c *cmConn
	if t != nil {
		c = t.owner.(*cmConn)
	}
	if c == nil || c.closed {
		C.rs_cm_reject(child)
		go destroyID(child)
		return
	}
	c.id = child
	s.conns[child] = c
	e := C.int(0)
	if !c.qp.dev.t.iwarp {
		// InfiniBand and RoCE: rdma_cm leaves a QP it did not create to
		// its owner, with the attributes the request carried.
		e = c.qp.cmReady(child)
	}
	if e == 0 {
		e = C.rs_cm_accept(child, C.uint32_t(c.qp.qpn))
	}
	if e != 0 {
		select {
		case c.events <- cmEvent{typ: C.RS_CM_CONNECT_ERROR, status: -int(e)}:
		default:
		}
	}
}

// listen returns the process's listener on ip, which must belong to dev.
func (s *cmState) listen(ip netip.Addr, dev string) (*cmListener, error) {
	s.listenMu.Lock()
	defer s.listenMu.Unlock()
	s.mu.Lock()
	l := s.listeners[ip]
	s.mu.Unlock()
	for try := 1; l == nil; try++ {
		var e C.int
		id := C.rs_cm_create_id(s.ch, &e)
		if id == nil {
			return nil, errnoErr("rdma_cm create id", e)
		}
		var sa C.struct_sockaddr_storage
		putSockaddr(&sa, ip, 0)
		if e := C.rs_cm_bind(id, (*C.struct_sockaddr)(unsafe.Pointer(&sa))); e != 0 {
			go destroyID(id)
			return nil, fmt.Errorf("%w: rdma_cm bind %v: %v", verbs.ErrPeerInfo, ip, syscall.Errno(e))
		}
		if e := C.rs_cm_listen(id, 1024); e != 0 {
			go destroyID(id)
			if syscall.Errno(e) == syscall.EADDRINUSE && try < cmPortTries {
				continue // the TCP stack has the port rdma_cm chose (cmPortTries)
			}
			return nil, errnoErr(fmt.Sprintf("rdma_cm listen on %v", ip), e)
		}
		l = &cmListener{id: id, port: uint16(C.rs_cm_src_port(id))}
		if id.verbs != nil {
			l.dev = C.GoString(C.rs_context_name(id.verbs))
		}
		s.mu.Lock()
		s.listeners[ip] = l
		s.mu.Unlock()
	}
	if l.dev != dev {
		return nil, fmt.Errorf("%w: rdma_cm listens on %v through device %q, not %s", verbs.ErrPeerInfo, ip, l.dev, dev)
	}
	return l, nil
}

// deviceFor names the RDMA device rdma_cm binds ip to.
func (s *cmState) deviceFor(ip netip.Addr) (string, error) {
	var e C.int
	id := C.rs_cm_create_id(s.ch, &e)
	if id == nil {
		return "", errnoErr("rdma_cm create id", e)
	}
	defer C.rs_cm_destroy_id(id)
	var sa C.struct_sockaddr_storage
	putSockaddr(&sa, ip, 0)
	if e := C.rs_cm_bind(id, (*C.struct_sockaddr)(unsafe.Pointer(&sa))); e != 0 {
		return "", fmt.Errorf("rdma_cm finds no device for %v: %v", ip, syscall.Errno(e))
	}
	if id.verbs == nil {
		return "", fmt.Errorf("rdma_cm finds no device for %v", ip)
	}
	return C.GoString(C.rs_context_name(id.verbs)), nil
}

// await waits for the event want on c, or fails with the event that came
// instead, or with ctx.
func (c *cmConn) await(ctx context.Context, want uint32, step string) error {
	select {
	case ev := <-c.events:
		if ev.typ == want {
			return nil
		}
		if ev.status < 0 {
			return fmt.Errorf("%w: rdma_cm %s: %v: %w", verbs.ErrPeerInfo, step, ev, syscall.Errno(-ev.status))
		}
		return fmt.Errorf("%w: rdma_cm %s: %v", verbs.ErrPeerInfo, step, ev)
	case <-ctx.Done():
		return fmt.Errorf("rdma_cm %s: %w", step, ctx.Err())
	}
}

// listenFor files a ticket for q, the passive side, and returns the
// listener the peer is to connect to.
func (s *cmState) listenFor(q *QP) (*cmConn, uint16, error) {
	if err := s.alive(); err != nil {
		return nil, 0, err
	}
	l, err := s.listen(q.dev.local, q.dev.t.dev)
	if err != nil {
		return nil, 0, err
	}
	c := &cmConn{events: make(chan cmEvent, 4), qp: q}
	c.ticket = &cmTicket{dev: q.dev.t.dev, peer: q.dev.remote, owner: c}
	if err := s.tickets.add(c.ticket); err != nil {
		return nil, 0, err
	}
	return c, l.port, nil
}

// cmPortTries bounds the tries of an identifier whose port the kernel's
// TCP stack already uses. Without a port mapper (iwpmd), an iWARP driver
// (soft-iWARP) binds its TCP socket to the port rdma_cm chose, which may
// be taken by an ordinary TCP socket: the step then fails with
// EADDRINUSE, or, on connect, with EADDRNOTAVAIL when a connection from
// that port to the same peer address and port still exists (TIME_WAIT);
// a new identifier gets another port.
const cmPortTries = 8

// testHookPath, when it returns a record, gives the active side the path
// from local to remote in place of rdma_cm's route resolution (tests: a
// path record in the SA's wire format, as ibacm supplies one).
var testHookPath = func(local, remote netip.Addr) *[64]byte { return nil }

// connect connects q, the active side, to the peer's listener port with
// its ticket.
func (s *cmState) connect(ctx context.Context, q *QP, port uint16, pdata []byte) (*cmConn, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	if !q.dev.remote.IsValid() {
		return nil, fmt.Errorf("%w: no peer address to connect to with rdma_cm", verbs.ErrPeerInfo)
	}
	for try := 1; ; try++ {
		c, err := s.connectOnce(ctx, q, port, pdata)
		if !errors.Is(err, syscall.EADDRINUSE) && !errors.Is(err, syscall.EADDRNOTAVAIL) || try == cmPortTries {
			return c, err
		}
	}
}

func (s *cmState) connectOnce(ctx context.Context, q *QP, port uint16, pdata []byte) (*cmConn, error) {
	var e C.int
	id := C.rs_cm_create_id(s.ch, &e)
	if id == nil {
		return nil, errnoErr("rdma_cm create id", e)
	}
	c := &cmConn{id: id, events: make(chan cmEvent, 4), qp: q}
	s.mu.Lock()
	s.conns[id] = c
	s.mu.Unlock()
	err := func() error {
		var src, dst C.struct_sockaddr_storage
		putSockaddr(&src, q.dev.local, 0)
		putSockaddr(&dst, q.dev.remote, port)
		if q.dev.tclass >= 0 {
			if e := C.rs_cm_set_tos(id, C.uint8_t(q.dev.tclass)); e != 0 {
				return errnoErr("rdma_cm set type of service", e)
			}
		}
		if e := C.rs_cm_resolve_addr(id, (*C.struct_sockaddr)(unsafe.Pointer(&src)), (*C.struct_sockaddr)(unsafe.Pointer(&dst)), cmResolveMS); e != 0 {
			return fmt.Errorf("%w: rdma_cm resolve %v: %v", verbs.ErrPeerInfo, q.dev.remote, syscall.Errno(e))
		}
		if err := c.await(ctx, C.RS_CM_ADDR_RESOLVED, "address resolution"); err != nil {
			return err
		}
		if id.verbs == nil || C.GoString(C.rs_context_name(id.verbs)) != q.dev.t.dev {
			return fmt.Errorf("%w: rdma_cm reaches %v through another device than %s", verbs.ErrPeerInfo, q.dev.remote, q.dev.t.dev)
		}
		if rec := testHookPath(q.dev.local, q.dev.remote); rec != nil {
			if e := C.rs_cm_set_path(id, (*C.uint8_t)(unsafe.Pointer(&rec[0]))); e != 0 {
				return errnoErr("rdma_cm set path", e)
			}
		} else if e := C.rs_cm_resolve_route(id, cmResolveMS); e != 0 {
			return errnoErr("rdma_cm resolve route", e)
		}
		if err := c.await(ctx, C.RS_CM_ROUTE_RESOLVED, "route resolution"); err != nil {
			return err
		}
		p := C.CBytes(pdata)
		defer C.free(p)
		if e := C.rs_cm_connect(id, C.uint32_t(q.qpn), p, C.uint8_t(len(pdata))); e != 0 {
			if syscall.Errno(e) == syscall.ENOENT { // the IB CM's pkey lookup
				return fmt.Errorf("%w: rdma_cm connect: the path's partition is not in %s port %d's P_Key table: %w", verbs.ErrPeerInfo, q.dev.t.dev, q.dev.t.port, syscall.Errno(e))
			}
			return errnoErr("rdma_cm connect", e)
		}
		if q.dev.t.iwarp {
			return c.await(ctx, C.RS_CM_ESTABLISHED, "connect") // the driver moved the QP
		}
		// InfiniBand and RoCE: the reply's attributes, then the RTU.
		if err := c.await(ctx, C.RS_CM_CONNECT_RESPONSE, "connect"); err != nil {
			return err
		}
		if e := q.cmReady(id); e != 0 {
			if syscall.Errno(e) == syscall.EXDEV {
				return fmt.Errorf("ibverbs: rdma_cm's path to the peer is not on %s port %d", q.dev.t.dev, q.dev.t.port)
			}
			return errnoErr("QP to INIT, RTR and RTS through rdma_cm", e)
		}
		if e := C.rs_cm_establish(id); e != 0 {
			return errnoErr("rdma_cm establish", e)
		}
		return nil
	}()
	if err != nil {
		if id := s.detach(c); id != nil {
			C.rs_cm_destroy_id(id)
		}
		return nil, err
	}
	return c, nil
}

// detach withdraws c: its ticket, its place in the dispatch table. It
// returns the identifier for the caller to disconnect and destroy.
func (s *cmState) detach(c *cmConn) *C.struct_rs_cm_id {
	if c.ticket != nil {
		s.tickets.remove(c.ticket)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c.closed = true
	id := c.id
	if id != nil {
		delete(s.conns, id)
	}
	return id
}

// sockaddrIP is the IP of a sockaddr_storage (invalid if not IPv4/IPv6).
func sockaddrIP(ss *C.struct_sockaddr_storage) netip.Addr {
	b := (*[28]byte)(unsafe.Pointer(ss))
	switch binary.NativeEndian.Uint16(b[0:]) {
	case syscall.AF_INET:
		return netip.AddrFrom4([4]byte(b[4:8]))
	case syscall.AF_INET6:
		return netip.AddrFrom16([16]byte(b[8:24])).Unmap()
	}
	return netip.Addr{}
}

// putSockaddr writes ip:port as a sockaddr_in or sockaddr_in6.
func putSockaddr(ss *C.struct_sockaddr_storage, ip netip.Addr, port uint16) {
	b := (*[28]byte)(unsafe.Pointer(ss))
	clear(b[:])
	ip = ip.Unmap()
	if ip.Is4() {
		binary.NativeEndian.PutUint16(b[0:], syscall.AF_INET)
		binary.BigEndian.PutUint16(b[2:], port)
		a := ip.As4()
		copy(b[4:8], a[:])
		return
	}
	binary.NativeEndian.PutUint16(b[0:], syscall.AF_INET6)
	binary.BigEndian.PutUint16(b[2:], port)
	a := ip.As16()
	copy(b[8:24], a[:])
}

// cmFail moves q to the error state for a connection manager event (the
// peer disconnected, the device went away), so that its work requests
// flush and its user sees why.
// It runs on a goroutine of its own: the event loop must not wait for
// the QP's lock, which Connect holds while it waits for the loop.
func (q *QP) cmFail(why string) {
	q.markDead(why)
	go func() { _ = q.ForceError() }() // a QP closed meanwhile is fine
}

// destroyID destroys an identifier; it may wait for the loop to
// acknowledge the identifier's events, so the loop never calls it.
func destroyID(id *C.struct_rs_cm_id) { C.rs_cm_destroy_id(id) }

// cmReady takes q through INIT again (the path's partition: q was made
// INIT on pkey index 0 before the path was known), RTR and RTS with the
// attributes rdma_cm derived for id (InfiniBand and RoCE; an iWARP driver
// does this itself). A path on another port of the device than q's is
// refused (EXDEV): the port's events and GID follow q's port.
func (q *QP) cmReady(id *C.struct_rs_cm_id) C.int {
	var sl C.uint8_t
	for _, state := range [...]C.uint32_t{C.RS_QPS_INIT, C.RS_QPS_RTR, C.RS_QPS_RTS} {
		if e := C.rs_cm_qp_to(id, q.qp, state, C.uint8_t(q.dev.t.port), C.int(q.dev.sl), &sl, C.uint8_t(q.dev.ackTimeout), C.uint8_t(q.dev.retries), rnrRetry); e != 0 {
			return e
		}
	}
	q.sl = uint8(sl)
	return 0
}
