package ibverbs

import (
	"encoding/binary"
	"fmt"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// info is what one end tells the other about its queue pair (QP.Info),
// carried in the handshake. Two forms, big-endian.
//
// Version 1, for devices whose QPs rsock connects itself (InfiniBand,
// RoCE), infoLen bytes:
//
//	0      version (1)
//	1      active MTU of the port (enum ibv_mtu, 1..5)
//	2..4   LID (InfiniBand; 0 on RoCE)
//	4..8   QP number (24 bits)
//	8..12  initial packet sequence number (24 bits)
//	12..28 GID (RoCE: the GID holding the bootstrap connection's IP)
//
// Version 2, for devices whose QPs only the connection manager can connect
// (iWARP), cmInfoLen bytes. The active side sends zeros after the version;
// the passive side says where and how to connect (cm.go): its rdma_cm
// listener's port on the bootstrap connection's local IP, and the ticket
// (number and secret) the active side's connect request must carry.
//
//	0      version (2)
//	1      reserved (0)
//	2..4   rdma_cm listener port
//	4..8   ticket number
//	8..24  ticket secret
type info struct {
	mtu uint8
	lid uint16
	qpn uint32
	psn uint32
	gid [16]byte

	cm     bool // version 2
	port   uint16
	ticket uint32
	secret [cmSecretLen]byte
}

const (
	infoVersion   = 1
	infoLen       = 28
	cmInfoVersion = 2
	cmInfoLen     = 8 + cmSecretLen
)

func (in info) marshal() []byte {
	if in.cm {
		b := make([]byte, cmInfoLen)
		b[0] = cmInfoVersion
		binary.BigEndian.PutUint16(b[2:], in.port)
		binary.BigEndian.PutUint32(b[4:], in.ticket)
		copy(b[8:], in.secret[:])
		return b
	}
	b := make([]byte, infoLen)
	b[0] = infoVersion
	b[1] = in.mtu
	binary.BigEndian.PutUint16(b[2:], in.lid)
	binary.BigEndian.PutUint32(b[4:], in.qpn)
	binary.BigEndian.PutUint32(b[8:], in.psn)
	copy(b[12:], in.gid[:])
	return b
}

// parseInfo validates a peer's description. Everything in it is untrusted.
func parseInfo(b []byte) (info, error) {
	var in info
	if len(b) > 0 && b[0] == cmInfoVersion {
		return parseCMInfo(b)
	}
	if len(b) != infoLen {
		return in, fmt.Errorf("%w: %d bytes, want %d", verbs.ErrPeerInfo, len(b), infoLen)
	}
	if b[0] != infoVersion {
		return in, fmt.Errorf("%w: version %d, want %d or %d", verbs.ErrPeerInfo, b[0], infoVersion, cmInfoVersion)
	}
	in.mtu = b[1]
	in.lid = binary.BigEndian.Uint16(b[2:])
	in.qpn = binary.BigEndian.Uint32(b[4:])
	in.psn = binary.BigEndian.Uint32(b[8:])
	copy(in.gid[:], b[12:])
	switch {
	case in.mtu < mtu256 || in.mtu > mtu4096:
		return in, fmt.Errorf("%w: MTU code %d", verbs.ErrPeerInfo, in.mtu)
	case in.qpn == 0 || in.qpn >= 1<<24:
		return in, fmt.Errorf("%w: QP number %#x", verbs.ErrPeerInfo, in.qpn)
	case in.psn >= 1<<24:
		return in, fmt.Errorf("%w: PSN %#x", verbs.ErrPeerInfo, in.psn)
	case in.lid == 0 && in.gid == [16]byte{}:
		return in, fmt.Errorf("%w: neither LID nor GID", verbs.ErrPeerInfo)
	}
	return in, nil
}

func parseCMInfo(b []byte) (info, error) {
	in := info{cm: true}
	if len(b) != cmInfoLen {
		return in, fmt.Errorf("%w: %d bytes of rdma_cm description, want %d", verbs.ErrPeerInfo, len(b), cmInfoLen)
	}
	in.port = binary.BigEndian.Uint16(b[2:])
	in.ticket = binary.BigEndian.Uint32(b[4:])
	copy(in.secret[:], b[8:])
	switch {
	case b[1] != 0:
		return in, fmt.Errorf("%w: reserved byte %#x", verbs.ErrPeerInfo, b[1])
	case in.port == 0 && (in.ticket != 0 || in.secret != [cmSecretLen]byte{}):
		return in, fmt.Errorf("%w: a ticket without a listener port", verbs.ErrPeerInfo)
	case in.port != 0 && in.ticket == 0:
		return in, fmt.Errorf("%w: a listener port without a ticket", verbs.ErrPeerInfo)
	}
	return in, nil
}

// MTU codes (enum ibv_mtu).
const (
	mtu256  = 1
	mtu4096 = 5
)

// mtuBytes is the size an MTU code stands for.
func mtuBytes(code uint8) int { return 128 << code }
