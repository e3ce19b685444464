package rsock

import (
	"testing"
	"time"
)

// BusyPoll: the default when unset, the environment when the field is
// zero, the field when set; negative, or 0 in the environment, turns it off.
func TestBusyPollSetting(t *testing.T) {
	for _, tc := range []struct {
		field time.Duration
		env   string
		want  time.Duration
	}{
		{0, "", DefaultBusyPoll},
		{0, "0", 0},
		{0, "5us", 5 * time.Microsecond},
		{-1, "5us", 0},
		{50 * time.Microsecond, "0", 50 * time.Microsecond},
	} {
		t.Setenv("RSOCK_BUSY_POLL", tc.env)
		s, err := (&Config{BusyPoll: tc.field}).resolve()
		if err != nil {
			t.Fatalf("field %v, env %q: %v", tc.field, tc.env, err)
		}
		if s.busyPoll != tc.want {
			t.Errorf("field %v, env %q: busy-poll %v, want %v", tc.field, tc.env, s.busyPoll, tc.want)
		}
	}
}
