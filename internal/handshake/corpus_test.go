package handshake_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

var updateCorpus = flag.Bool("update-corpus", false, "rewrite the seed corpus under testdata/fuzz")

type seedFile struct {
	target, name string
	args         []any
}

// seedFiles lists the committed seed corpus: valid frames of every type and
// near misses for FuzzDecode and FuzzNext, and field sets for FuzzRoundTrip.
// Crashers found by fuzzing are added next to them under their hash names.
func seedFiles() []seedFile {
	var seeds []seedFile
	add := func(name string, frame []byte) {
		seeds = append(seeds, seedFile{"FuzzDecode", name, []any{frame}})
	}
	for _, s := range samples() {
		add(s.name, s.frame)
	}
	maxReason := strings.Repeat("r", handshake.MaxReason)
	bad := handshake.RingInfo{Size: 3, Addr: ^uint64(0), RKey: 0, Credits: 0}
	confirm := rawFrame(handshake.Version, 4, body{}.u8(0).u16(0))
	add("empty", nil)
	add("two-frames", append(bytes.Clone(confirm), samples()[0].frame...))
	add("bad-magic-http", []byte("GET / HTTP/1.1\r\nHost: example\r\n\r\n"))
	add("bad-magic-7bit", append([]byte{0x09}, confirm[1:]...))
	add("bad-magic-lf", append([]byte("\x89RSOCK\n"), confirm[8:]...))
	add("version-1", rawFrame(1, 1, body{}.u16(0).u8(1)))
	add("type-0", rawFrame(handshake.Version, 0, body{}.u8(0).u16(0)))
	add("type-12", rawFrame(handshake.Version, 12, body{}.u8(0).u16(0)))
	add("length-over-max", append(rawFrame(handshake.Version, 3, nil)[:10], 0x10, 0x01))
	add("length-beyond-data", append(rawFrame(handshake.Version, 4, nil)[:10], 0x00, 0x09, 0, 0, 0))
	add("header-only", rawFrame(handshake.Version, 1, nil))
	add("trailing-byte", rawFrame(handshake.Version, 4, body{}.u8(0).u16(0).u8(0)))
	add("reason-bad-utf8", rawFrame(handshake.Version, 3, body{}.u8(1).lstr("\xff\xfe")))
	add("reason-max", rawFrame(handshake.Version, 5, body{}.u8(1).u64(1).lstr(maxReason)))
	add("reason-over-max", rawFrame(handshake.Version, 4, body{}.u8(1).lstr(maxReason+"!")))
	add("reason-len-past-end", rawFrame(handshake.Version, 3, body{}.u8(1).u16(10).str("abc")))
	add("zero-offers", rawFrame(handshake.Version, 1, body{}.u16(0).u64(0).u8(0)))
	add("five-offers", rawFrame(handshake.Version, 1, body{}.u16(0).u64(0).u8(5).
		u8(1).ring(testRing).u16(0).u8(1).ring(testRing).u16(0).u8(1).ring(testRing).u16(0).
		u8(1).ring(testRing).u16(0).u8(1).ring(testRing).u16(0)))
	add("offer-count-past-end", rawFrame(handshake.Version, 1, body{}.u16(0).u64(0).u8(3).u8(1).ring(testRing).u16(0)))
	add("info-over-max", rawFrame(handshake.Version, 2, body{}.u8(1).ring(testRing).lraw(bytesOf(handshake.MaxInfo+1, 'i'))))
	add("info-len-huge", rawFrame(handshake.Version, 2, body{}.u8(1).ring(testRing).u16(0xffff)))
	add("bad-ring", rawFrame(handshake.Version, 2, body{}.u8(9).ring(bad).u16(0)))
	add("goodbye-all-flags", rawFrame(handshake.Version, 5, body{}.u8(0xff).u64(42).u16(0)))

	// The switching protocol (the valid frames are samples).
	dataMax := rawFrame(handshake.Version, 7, bytesOf(handshake.MaxData, 'd'))
	dataOverMax := append(rawFrame(handshake.Version, 7, nil)[:10], 0xff, 0xf5, 'd', 'd') // MaxData+1
	add("data-max", dataMax)
	add("data-empty", rawFrame(handshake.Version, 7, nil))
	add("data-length-over-max", dataOverMax)
	add("data-length-max-short", append(rawFrame(handshake.Version, 7, nil)[:10], 0xff, 0xf4, 'd'))
	add("switch-length-over-max", append(rawFrame(handshake.Version, 9, nil)[:10], 0x10, 0x01))
	add("upgrade-five-transports", rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(5).raw([]byte{1, 2, 3, 1, 2})))
	add("upgrade-count-past-end", rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(3).u8(1)))
	add("upgrade-trailing", rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(0).u8(1)))
	add("upgrade-offer-info-over-max", rawFrame(handshake.Version, 8, body{}.u8(1).ring(testRing).lraw(bytesOf(handshake.MaxInfo+1, 'i'))))
	add("upgrade-offer-info-len-huge", rawFrame(handshake.Version, 8, body{}.u8(1).ring(testRing).u16(0xffff)))
	add("switch-7-bytes", rawFrame(handshake.Version, 9, bytesOf(7, 0xff)))
	add("resume-9-bytes", rawFrame(handshake.Version, 10, bytesOf(9, 0xff)))
	add("fin-empty", rawFrame(handshake.Version, 11, nil))

	// FuzzNext: each sample followed by the next one, and Data frames whose
	// payload is short, missing or a frame itself.
	next := func(name string, data []byte) {
		seeds = append(seeds, seedFile{"FuzzNext", name, []any{data}})
	}
	ss := samples()
	for i, s := range ss {
		next(s.name, append(bytes.Clone(s.frame), ss[(i+1)%len(ss)].frame...))
	}
	fin := rawFrame(handshake.Version, 11, body{}.u64(7))
	next("empty", nil)
	next("bad-magic-http", []byte("GET / HTTP/1.1\r\nHost: example\r\n\r\n"))
	next("version-1", rawFrame(1, 7, body{}.u16(0).u8(1)))
	next("type-12", rawFrame(handshake.Version, 12, nil))
	next("header-only-confirm", rawFrame(handshake.Version, 4, nil)[:handshake.HeaderLen-1])
	next("data-max", append(bytes.Clone(dataMax), fin...))
	next("data-header-only", append(rawFrame(handshake.Version, 7, nil)[:10], 0x00, 0x05))
	next("data-short", append(rawFrame(handshake.Version, 7, nil)[:10], 0x00, 0x05, 'a', 'b'))
	next("data-empty", append(rawFrame(handshake.Version, 7, nil), fin...))
	next("data-length-over-max", dataOverMax)
	next("data-in-data", rawFrame(handshake.Version, 7, rawFrame(handshake.Version, 7, []byte("x"))))
	next("switch-length-over-max", append(rawFrame(handshake.Version, 9, nil)[:10], 0x10, 0x01))
	next("resume-cut", rawFrame(handshake.Version, 10, body{}.u64(1))[:handshake.HeaderLen+3])
	next("upgrade-five-transports", rawFrame(handshake.Version, 6, body{}.u16(0).u64(0).u8(5).raw([]byte{1, 2, 3, 1, 2})))

	rt := func(name string, args ...any) {
		seeds = append(seeds, seedFile{"FuzzRoundTrip", name, args})
	}
	// kind, flags, nOffers, transport, size, addr, rkey, credits, info, code, reason, abort, finalProd
	rt("hello", uint8(0), uint16(0), uint8(2), uint8(1), uint64(1<<20), uint64(0x7f0000000000), uint32(0xdeadbeef), uint16(64), []byte("mlx5_0:1"), uint8(0), "", false, uint64(5))
	rt("hello-zero-offers", uint8(0), uint16(1), uint8(0), uint8(1), uint64(4096), uint64(0), uint32(1), uint16(4), []byte{}, uint8(0), "", false, uint64(0))
	rt("hello-over-body", uint8(0), uint16(0), uint8(4), uint8(2), uint64(4096), uint64(0), uint32(1), uint16(4), bytesOf(handshake.MaxInfo, 'x'), uint8(0), "", false, uint64(0))
	rt("accept", uint8(1), uint16(0), uint8(0), uint8(2), uint64(1<<30), ^uint64(0)-(1<<30), uint32(7), uint16(1024), []byte("/dev/shm/rsock"), uint8(0), "", false, uint64(100))
	rt("accept-over-info", uint8(1), uint16(0), uint8(0), uint8(3), uint64(4096), uint64(0), uint32(7), uint16(4), bytesOf(handshake.MaxInfo+1, 'x'), uint8(0), "", false, uint64(0))
	rt("decline", uint8(2), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(1), "no common transport", false, uint64(3))
	rt("confirm", uint8(3), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, uint64(0))
	rt("confirm-bad-utf8", uint8(3), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(4), "a\xffb", false, uint64(0))
	rt("goodbye", uint8(4), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "Zürich ✓", true, ^uint64(0))
	rt("goodbye-over-reason", uint8(4), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), strings.Repeat("é", 129), false, uint64(9))
	// Upgrade: nOffers transports; Data: size%(MaxData+2) payload bytes from info.
	rt("upgrade-none", uint8(5), uint16(0), uint8(0), uint8(1), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, uint64(4))
	rt("upgrade-four", uint8(5), uint16(0x8001), uint8(4), uint8(254), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, uint64(14))
	rt("upgrade-five", uint8(5), uint16(0), uint8(5), uint8(1), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, uint64(0))
	rt("data-one", uint8(6), uint16(0), uint8(0), uint8(0), uint64(1), uint64(0), uint32(0), uint16(0), []byte("x"), uint8(0), "", false, uint64(12))
	rt("data", uint8(6), uint16(0), uint8(0), uint8(0), uint64(300), uint64(0), uint32(0), uint16(0), []byte("GET / HTTP/1.1\r\n"), uint8(0), "", false, uint64(200))
	rt("data-empty", uint8(6), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte("x"), uint8(0), "", false, uint64(0))
	rt("data-max", uint8(6), uint16(0), uint8(0), uint8(0), uint64(handshake.MaxData), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, uint64(65535))
	rt("data-over-max", uint8(6), uint16(0), uint8(0), uint8(0), uint64(handshake.MaxData+1), uint64(0), uint32(0), uint16(0), []byte("d"), uint8(0), "", false, uint64(0))
	rt("upgrade-offer", uint8(7), uint16(0), uint8(0), uint8(1), uint64(1<<20), uint64(0x7f0000000000), uint32(0xdeadbeef), uint16(64), []byte("mlx5_0:1"), uint8(0), "", false, uint64(30))
	rt("upgrade-offer-over-info", uint8(7), uint16(0), uint8(0), uint8(2), uint64(0), uint64(0), uint32(0), uint16(0), bytesOf(handshake.MaxInfo+1, 'x'), uint8(0), "", false, uint64(0))
	rt("switch", uint8(8), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, uint64(0))
	rt("resume", uint8(9), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, ^uint64(0))
	rt("fin", uint8(10), uint16(0), uint8(0), uint8(0), uint64(0), uint64(0), uint32(0), uint16(0), []byte{}, uint8(0), "", false, uint64(1<<40+17))
	return seeds
}

// marshalCorpus writes args in the "go test fuzz v1" format, as the go
// command does for the types used here.
func marshalCorpus(args ...any) []byte {
	var b bytes.Buffer
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch a := a.(type) {
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", a)
		case string:
			fmt.Fprintf(&b, "string(%q)\n", a)
		case byte:
			fmt.Fprintf(&b, "byte(%q)\n", a)
		case uint16, uint32, uint64, bool:
			fmt.Fprintf(&b, "%T(%v)\n", a, a)
		default:
			panic(fmt.Sprintf("unsupported corpus type %T", a))
		}
	}
	return b.Bytes()
}

// TestSeedCorpus checks that the committed seeds match seedFiles (run with
// -update-corpus to rewrite them).
func TestSeedCorpus(t *testing.T) {
	for _, s := range seedFiles() {
		path := filepath.Join("testdata", "fuzz", s.target, "seed-"+s.name)
		want := marshalCorpus(s.args...)
		if *updateCorpus {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestSeedCorpus -update-corpus)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale (run go test -run TestSeedCorpus -update-corpus)", path)
		}
	}
}
