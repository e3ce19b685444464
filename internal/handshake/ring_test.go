package handshake_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/rdmanet/rdmanet/internal/handshake"
)

func TestRingInfoValidate(t *testing.T) {
	ok := func(size, addr uint64, credits uint16) handshake.RingInfo {
		return handshake.RingInfo{Size: size, Addr: addr, RKey: 7, Credits: credits}
	}
	tests := []struct {
		name string
		r    handshake.RingInfo
		ok   bool
	}{
		{"typical", testRing, true},
		{"min", ok(handshake.MinRing, 0, handshake.MinCredits), true},
		{"max", ok(handshake.MaxRing, 0, handshake.MaxCredits), true},
		{"zero", handshake.RingInfo{}, false},
		{"size-below-min", ok(handshake.MinRing/2, 0, 16), false},
		{"size-above-max", ok(handshake.MaxRing*2, 0, 16), false},
		{"size-not-pow2", ok(handshake.MinRing*3, 0, 16), false},
		{"size-pow2-minus-1", ok(1<<20-1, 0, 16), false},
		{"size-huge", ok(1<<63, 0, 16), false},
		{"size-max-uint64", ok(math.MaxUint64, 0, 16), false},
		{"credits-below-min", ok(handshake.MinRing, 0, handshake.MinCredits-1), false},
		{"credits-zero", ok(handshake.MinRing, 0, 0), false},
		{"credits-above-max", ok(handshake.MinRing, 0, handshake.MaxCredits+1), false},
		{"credits-max-uint16", ok(handshake.MinRing, 0, math.MaxUint16), false},
		{"addr-end-at-top", ok(handshake.MinRing, math.MaxUint64-handshake.MinRing, 16), true},
		{"addr-wraps-to-zero", ok(handshake.MinRing, math.MaxUint64-handshake.MinRing+1, 16), false},
		{"addr-overflow", ok(handshake.MaxRing, math.MaxUint64-handshake.MaxRing+4096, 16), false},
		{"addr-max", ok(handshake.MinRing, math.MaxUint64, 16), false},
		{"rkey-anything", handshake.RingInfo{Size: 1 << 16, Addr: 1 << 40, RKey: math.MaxUint32, Credits: 128}, true},
	}
	for _, tt := range tests {
		err := tt.r.Validate()
		if tt.ok {
			assert.NoError(t, err, tt.name)
		} else {
			assert.ErrorIs(t, err, handshake.ErrMalformed, tt.name)
		}
	}
}

// The decoder does not apply Validate: a bad ring decodes and the caller
// decides.
func TestDecodeDoesNotValidateRing(t *testing.T) {
	bad := handshake.RingInfo{Size: 3, Addr: math.MaxUint64, Credits: 0}
	m, err := handshake.Read(bytesReader(rawFrame(handshake.Version, 2, body{}.u8(1).ring(bad).u16(0))))
	assert.NoError(t, err)
	assert.Equal(t, &handshake.Accept{Transport: handshake.TransportVerbs, Ring: bad}, m)
	assert.Error(t, m.(*handshake.Accept).Ring.Validate())
}
