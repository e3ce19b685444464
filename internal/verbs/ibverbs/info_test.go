package ibverbs

import (
	"errors"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

func TestInfoRoundTrip(t *testing.T) {
	in := info{mtu: 3, lid: 0, qpn: 0x11, psn: 0xabcdef, gid: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}}
	b := in.marshal()
	if len(b) != infoLen {
		t.Fatalf("marshal: %d bytes, want %d", len(b), infoLen)
	}
	out, err := parseInfo(b)
	if err != nil {
		t.Fatalf("parseInfo: %v", err)
	}
	if out != in {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

func TestInfoRejects(t *testing.T) {
	good := info{mtu: 5, lid: 7, qpn: 1, psn: 0, gid: [16]byte{1}}
	mutate := func(f func(b []byte)) []byte {
		b := good.marshal()
		f(b)
		return b
	}
	for name, b := range map[string][]byte{
		"nil":         nil,
		"short":       good.marshal()[:infoLen-1],
		"long":        append(good.marshal(), 0),
		"version":     mutate(func(b []byte) { b[0] = 2 }),
		"mtu 0":       mutate(func(b []byte) { b[1] = 0 }),
		"mtu 6":       mutate(func(b []byte) { b[1] = 6 }),
		"qpn 0":       mutate(func(b []byte) { copy(b[4:8], []byte{0, 0, 0, 0}) }),
		"qpn 25 bits": mutate(func(b []byte) { copy(b[4:8], []byte{1, 0, 0, 0}) }),
		"psn 25 bits": mutate(func(b []byte) { copy(b[8:12], []byte{1, 0, 0, 0}) }),
		"no lid, gid": mutate(func(b []byte) { clear(b[2:4]); clear(b[12:]) }),
		"all zero":    make([]byte, infoLen),
		"all ones": mutate(func(b []byte) {
			for i := range b {
				b[i] = 0xff
			}
		}),
	} {
		if _, err := parseInfo(b); !errors.Is(err, verbs.ErrPeerInfo) {
			t.Errorf("%s: parseInfo = %v, want ErrPeerInfo", name, err)
		}
	}
}

// FuzzParseInfo: any input either parses into a description that
// marshals back to the same bytes, or fails with ErrPeerInfo; never a
// panic.
func FuzzParseInfo(f *testing.F) {
	f.Add(info{mtu: 3, qpn: 0x11, psn: 5, gid: [16]byte{10: 0xff, 11: 0xff, 12: 10, 15: 1}}.marshal())
	f.Add(info{mtu: 5, lid: 9, qpn: 0xffffff, psn: 0xffffff}.marshal())
	f.Add([]byte{})
	f.Add(make([]byte, infoLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := parseInfo(b)
		if err != nil {
			if !errors.Is(err, verbs.ErrPeerInfo) {
				t.Fatalf("error %v does not wrap ErrPeerInfo", err)
			}
			return
		}
		if got := in.marshal(); string(got) != string(b) {
			t.Fatalf("parsed %x, marshals back as %x", b, got)
		}
	})
}
