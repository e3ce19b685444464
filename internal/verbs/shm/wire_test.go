//go:build linux

package shm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// FuzzDecodeInfo: a peer's Info either parses into a description that
// encodes back to the same bytes, or fails with ErrPeerInfo; never a
// panic, and never a rendezvous name outside namePrefix.
func FuzzDecodeInfo(f *testing.F) {
	var secret [secretLen]byte
	copy(secret[:], "a secret of thirty-two bytes....")
	f.Add(encodeInfo(hostID{nsDev: 3, nsIno: 4}, &secret, namePrefix+"1-00ff"))
	f.Add(encodeInfo(hostID{}, &secret, ""))
	f.Add([]byte{})
	f.Add(make([]byte, infoFixed))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodeInfo(b)
		if err != nil {
			if !errors.Is(err, verbs.ErrPeerInfo) {
				t.Fatalf("error %v does not wrap ErrPeerInfo", err)
			}
			return
		}
		if p.name != "" && (len(p.name) < len(namePrefix) || p.name[:len(namePrefix)] != namePrefix) {
			t.Fatalf("accepted rendezvous name %q", p.name)
		}
		// Reserved bytes 6..7 are not kept: compare without them.
		want := bytes.Clone(b)
		want[6], want[7] = 0, 0
		if got := encodeInfo(p.host, &p.secret, p.name); !bytes.Equal(got, want) {
			t.Fatalf("decoded %x, encodes back as %x", b, got)
		}
	})
}

// FuzzDecodeMessage: any rendezvous message from a peer is refused with
// errMsgFormat (or read as a refusal) or decodes into an exchange that
// encodes back to the same bytes; never a panic, never more regions than
// maxExportMRs.
func FuzzDecodeMessage(f *testing.F) {
	x := &exchange{src: 0x10002, dst: 7, inboxCap: 64, mrs: []mrRecord{{rkey: 9, addr: 1 << 36, size: 1 << 20}}}
	copy(x.secret[:], "a secret of thirty-two bytes....")
	f.Add(encodeExchange(msgAttach, x))
	f.Add(encodeExchange(msgAccept, x))
	f.Add(append(appendHeader(nil, msgConnect), x.secret[:]...))
	f.Add(appendHeader(nil, msgLinked))
	f.Add(appendRefuse(0, "shm: no"))
	f.Add([]byte("rsrv"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := decodeLinked(b); err != nil && !errors.Is(err, errMsgFormat) && !bytes.Contains([]byte(err.Error()), []byte("refused")) {
			t.Fatalf("decodeLinked: %v is neither a format error nor a refusal", err)
		}
		kind, body, err := decodeHeader(b)
		if err != nil {
			return
		}
		if kind != msgAttach && kind != msgAccept {
			return
		}
		x, err := decodeExchange(kind, body)
		if err != nil {
			if !errors.Is(err, errMsgFormat) {
				t.Fatalf("decodeExchange: %v does not wrap errMsgFormat", err)
			}
			return
		}
		if len(x.mrs) > maxExportMRs {
			t.Fatalf("%d regions accepted", len(x.mrs))
		}
		// The reserved header and exchange bytes are not kept, and the
		// capacity travels as 32 bits.
		got := encodeExchange(kind, x)
		want := bytes.Clone(b)
		want[6], want[7] = 0, 0
		idLen := secretLen
		if kind == msgAccept {
			idLen = 4
		}
		off := wireHeaderLen + idLen + 4 + 6
		want[off], want[off+1] = 0, 0
		if !bytes.Equal(got, want) {
			t.Fatalf("decoded %x, encodes back as %x", b, got)
		}
	})
}
