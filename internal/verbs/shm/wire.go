//go:build linux

package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// Info wire format (all integers little-endian):
//
//	0   magic "rshm"
//	4   version (5: the rendezvous messages below, at wireVersion 6)
//	5   length of the rendezvous name
//	6   reserved (2 bytes)
//	8   boot id (16 bytes)
//	24  network namespace: device, inode (8 bytes each)
//	40  secret (32 bytes)
//	72  rendezvous name: an abstract Unix socket name, "@rsock-shm-..."
const (
	infoMagic   = "rshm"
	infoVersion = 5
	infoFixed   = 72
	secretLen   = 32
	// namePrefix is the prefix of every rendezvous name: a peer's Info
	// can only make us dial one of these abstract sockets.
	namePrefix = "@rsock-shm-"
)

// peerInfo is a decoded Info.
type peerInfo struct {
	host   hostID
	secret [secretLen]byte
	name   string // empty when the peer had no rendezvous listener
}

func encodeInfo(h hostID, secret *[secretLen]byte, name string) []byte {
	b := make([]byte, infoFixed, infoFixed+len(name))
	copy(b, infoMagic)
	b[4] = infoVersion
	b[5] = byte(len(name))
	copy(b[8:24], h.boot[:])
	binary.LittleEndian.PutUint64(b[24:], h.nsDev)
	binary.LittleEndian.PutUint64(b[32:], h.nsIno)
	copy(b[40:72], secret[:])
	return append(b, name...)
}

// decodeInfo parses a peer's Info. Errors wrap verbs.ErrPeerInfo.
func decodeInfo(b []byte) (peerInfo, error) {
	var p peerInfo
	bad := func(format string, args ...any) (peerInfo, error) {
		return peerInfo{}, fmt.Errorf("%w: shm: "+format, append([]any{verbs.ErrPeerInfo}, args...)...)
	}
	switch {
	case len(b) < infoFixed:
		return bad("%d bytes, want at least %d", len(b), infoFixed)
	case string(b[:4]) != infoMagic:
		return bad("bad magic")
	case b[4] != infoVersion:
		return bad("version %d, want %d", b[4], infoVersion)
	case len(b) != infoFixed+int(b[5]):
		return bad("%d bytes, want %d", len(b), infoFixed+int(b[5]))
	}
	copy(p.host.boot[:], b[8:24])
	p.host.nsDev = binary.LittleEndian.Uint64(b[24:])
	p.host.nsIno = binary.LittleEndian.Uint64(b[32:])
	copy(p.secret[:], b[40:72])
	p.name = string(b[infoFixed:])
	if p.name != "" && (!strings.HasPrefix(p.name, namePrefix) || strings.ContainsRune(p.name, 0)) {
		return bad("rendezvous name %q", p.name)
	}
	return p, nil
}

// checkSameHost returns an error wrapping verbs.ErrUnavailable unless the
// peer runs on this kernel instance and in this network namespace (abstract
// Unix sockets are per network namespace).
func checkSameHost(local, peer hostID) error {
	switch {
	case local.boot != peer.boot:
		return fmt.Errorf("%w: shm: peer is on another host", verbs.ErrUnavailable)
	case local.nsDev != peer.nsDev || local.nsIno != peer.nsIno:
		return fmt.Errorf("%w: shm: peer is in another network namespace", verbs.ErrUnavailable)
	}
	return nil
}

// Rendezvous and control messages travel on a link's SOCK_SEQPACKET Unix
// connection (link.go), one message per packet, file descriptors attached
// with SCM_RIGHTS. dst is the receiver's link id of a QP, src the
// sender's:
//
//	header  magic "rsrv", version, kind, 2 reserved bytes
//	connect secret (32)                   fds: eventfd, bell page, lane
//	                                      (a link's first message)
//	linked  (empty)                       fds: eventfd, bell page, lane
//	attach  secret (32), src, exchange    fds: inbox, regions
//	accept  dst, src, exchange            fds: inbox, regions
//	refuse  dst, why (text, at most 200 bytes)   (an attach, or with
//	                                      dst 0 a connect, refused)
//	gone    dst                           (the sender's QP is closed)
//
// exchange: inbox capacity u32, region count u16, 2 reserved bytes, then
// per region: rkey u32, addr u64, size u64.
const (
	wireMagic     = "rsrv"
	wireVersion   = 6
	wireHeaderLen = 8
	recordLen     = 20

	msgConnect = 1
	msgLinked  = 2
	msgAttach  = 3
	msgAccept  = 4
	msgRefuse  = 5
	msgGone    = 6

	// maxExportMRs bounds the regions sent in an exchange (SCM_RIGHTS
	// carries at most 253 fds).
	maxExportMRs = 128
	maxMsgFDs    = 1 + maxExportMRs
	maxMsgLen    = wireHeaderLen + secretLen + 8 + 8 + maxExportMRs*recordLen
)

// mrRecord describes a remote-writable region.
type mrRecord struct {
	rkey       uint32
	addr, size uint64
}

// exchange is the body of an attach or accept message.
type exchange struct {
	secret   [secretLen]byte // attach
	src, dst uint32          // link ids: the sender's QP, the receiver's (accept)
	inboxCap uint64
	mrs      []mrRecord
}

// maxRefusal bounds a refusal's reason.
const maxRefusal = 200

// appendRefuse builds a refusal of the peer's QP dst, saying why.
func appendRefuse(dst uint32, why string) []byte {
	if len(why) > maxRefusal {
		why = why[:maxRefusal]
	}
	return append(appendID(appendHeader(nil, msgRefuse), dst), why...)
}

// refusal is the error for a refusal whose reason is why: text from the
// peer, shown with Go's quoting of anything unprintable.
func refusal(why []byte) error {
	return fmt.Errorf("the peer refused the exchange: %s", strings.Trim(strconv.Quote(string(why)), `"`))
}

func appendHeader(b []byte, kind byte) []byte {
	return append(append(b, wireMagic...), wireVersion, kind, 0, 0)
}

func appendID(b []byte, id uint32) []byte { return binary.LittleEndian.AppendUint32(b, id) }

func appendRecord(b []byte, r mrRecord) []byte {
	b = binary.LittleEndian.AppendUint32(b, r.rkey)
	b = binary.LittleEndian.AppendUint64(b, r.addr)
	return binary.LittleEndian.AppendUint64(b, r.size)
}

func readRecord(b []byte) mrRecord {
	return mrRecord{
		rkey: binary.LittleEndian.Uint32(b),
		addr: binary.LittleEndian.Uint64(b[4:]),
		size: binary.LittleEndian.Uint64(b[12:]),
	}
}

func encodeExchange(kind byte, x *exchange) []byte {
	b := appendHeader(make([]byte, 0, wireHeaderLen+secretLen+16+len(x.mrs)*recordLen), kind)
	if kind == msgAccept {
		b = appendID(b, x.dst)
	} else {
		b = append(b, x.secret[:]...)
	}
	b = appendID(b, x.src)
	b = binary.LittleEndian.AppendUint32(b, uint32(x.inboxCap))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(x.mrs)))
	b = append(b, 0, 0)
	for _, r := range x.mrs {
		b = appendRecord(b, r)
	}
	return b
}

var errMsgFormat = errors.New("shm: malformed rendezvous message")

// decodeHeader checks a message's header and returns its kind and body.
func decodeHeader(b []byte) (byte, []byte, error) {
	if len(b) < wireHeaderLen || string(b[:4]) != wireMagic || b[4] != wireVersion {
		return 0, nil, errMsgFormat
	}
	return b[5], b[wireHeaderLen:], nil
}

// decodeExchange parses the body of an attach or accept message.
func decodeExchange(kind byte, body []byte) (*exchange, error) {
	x := &exchange{}
	switch {
	case kind == msgAccept && len(body) >= 4+12:
		x.dst = binary.LittleEndian.Uint32(body)
		body = body[4:]
	case kind != msgAccept && len(body) >= secretLen+12:
		copy(x.secret[:], body)
		body = body[secretLen:]
	default:
		return nil, fmt.Errorf("%w: %d bytes", errMsgFormat, len(body))
	}
	x.src = binary.LittleEndian.Uint32(body)
	x.inboxCap = uint64(binary.LittleEndian.Uint32(body[4:]))
	n := int(binary.LittleEndian.Uint16(body[8:]))
	body = body[12:]
	if n > maxExportMRs || len(body) != n*recordLen {
		return nil, fmt.Errorf("%w: %d regions in %d bytes", errMsgFormat, n, len(body))
	}
	x.mrs = make([]mrRecord, n)
	for i := range x.mrs {
		x.mrs[i] = readRecord(body[i*recordLen:])
	}
	return x, nil
}

// readMsg reads one message and the fds attached to it, which the caller
// then owns. A truncated message (data or fds) is an error, after which no
// fd is left open. io.EOF means the peer closed the connection.
func readMsg(c *net.UnixConn, buf, oob []byte) ([]byte, []int, error) {
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	fds := parseRights(oob[:oobn])
	switch {
	case err != nil:
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		err = fmt.Errorf("%w: truncated (flags %#x)", errMsgFormat, flags)
	case n == 0:
		// A SOCK_SEQPACKET read of 0 bytes is the end of the connection
		// (no message of ours is empty).
		err = io.EOF
	}
	if err != nil {
		closeFDs(fds)
		return nil, nil, err
	}
	return buf[:n], fds, nil
}

// parseRights returns every fd passed in oob.
func parseRights(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil // the kernel wrote oob: it parses
	}
	var fds []int
	for i := range msgs {
		// ParseUnixRights fails on anything but SOL_SOCKET, SCM_RIGHTS.
		if got, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// writeMsg sends b with fds attached (the caller keeps ownership of fds).
func writeMsg(c *net.UnixConn, b []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, oobn, err := c.WriteMsgUnix(b, oob, nil)
	if err == nil && (n != len(b) || oobn != len(oob)) {
		err = fmt.Errorf("shm: short write (%d of %d bytes, %d of %d control bytes)", n, len(b), oobn, len(oob))
	}
	return err
}

// peerCred returns the credentials of the process at the other end of c, as
// the kernel recorded them when the connection was made.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("shm: SO_PEERCRED: %w", cerr)
	}
	return cred, nil
}

// decodeLinked checks the answer to a link's connect message: linked, or
// a refusal.
func decodeLinked(b []byte) error {
	kind, body, err := decodeHeader(b)
	switch {
	case err != nil:
		return err
	case kind == msgRefuse && len(body) >= 4 && len(body)-4 <= maxRefusal:
		return refusal(body[4:])
	case kind != msgLinked || len(body) != 0:
		return fmt.Errorf("%w: kind %d, %d bytes", errMsgFormat, kind, len(body))
	}
	return nil
}
