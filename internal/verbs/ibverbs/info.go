package ibverbs

import (
	"encoding/binary"
	"fmt"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// info is what one end tells the other about its queue pair (QP.Info),
// carried in the handshake. Wire form, big-endian, infoLen bytes:
//
//	0      version (1)
//	1      active MTU of the port (enum ibv_mtu, 1..5)
//	2..4   LID (InfiniBand; 0 on RoCE)
//	4..8   QP number (24 bits)
//	8..12  initial packet sequence number (24 bits)
//	12..28 GID (RoCE: the GID holding the bootstrap connection's IP)
type info struct {
	mtu uint8
	lid uint16
	qpn uint32
	psn uint32
	gid [16]byte
}

const (
	infoVersion = 1
	infoLen     = 28
)

func (in info) marshal() []byte {
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
	if len(b) != infoLen {
		return in, fmt.Errorf("%w: %d bytes, want %d", verbs.ErrPeerInfo, len(b), infoLen)
	}
	if b[0] != infoVersion {
		return in, fmt.Errorf("%w: version %d, want %d", verbs.ErrPeerInfo, b[0], infoVersion)
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

// MTU codes (enum ibv_mtu).
const (
	mtu256  = 1
	mtu4096 = 5
)

// mtuBytes is the size an MTU code stands for.
func mtuBytes(code uint8) int { return 128 << code }
