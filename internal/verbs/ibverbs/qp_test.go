//go:build cgo && linux

package ibverbs

import (
	"testing"
	"time"
)

// The ACK timeout is encoded as 4.096 us << n, rounded up, within 1..31.
func TestAckTimeoutCode(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want uint8
	}{
		{0, defaultAckTimeout},
		{-time.Second, defaultAckTimeout},
		{time.Nanosecond, 1},
		{8192 * time.Nanosecond, 1},
		{8193 * time.Nanosecond, 2},
		{536 * time.Millisecond, 17},
		{time.Second, 18},
		{4096 * time.Nanosecond << 31, 31},
	} {
		got, err := ackTimeoutCode(tc.d)
		if err != nil || got != tc.want {
			t.Errorf("ackTimeoutCode(%v) = %d, %v; want %d", tc.d, got, err, tc.want)
		}
	}
	if _, err := ackTimeoutCode(3 * time.Hour); err == nil {
		t.Error("an ACK timeout of 3 h was taken")
	}
}
