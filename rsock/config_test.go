package rsock

import (
	"errors"
	"net"
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

// ConnectionManager: the field, or RSOCK_VERBS_CM (a boolean; anything
// else is a ConfigError naming the variable); it reaches the verbs
// provider's options.
func TestConnectionManagerSetting(t *testing.T) {
	for _, tc := range []struct {
		field bool
		env   string
		want  bool
	}{
		{false, "", false},
		{true, "", true},
		{false, "1", true},
		{false, "false", false},
		{true, "0", true},
	} {
		t.Setenv("RSOCK_VERBS_CM", tc.env)
		s, err := (&Config{ConnectionManager: tc.field}).resolve()
		if err != nil {
			t.Fatalf("field %v, env %q: %v", tc.field, tc.env, err)
		}
		if got := s.openOptions(&net.TCPConn{}).ConnectionManager; got != tc.want {
			t.Errorf("field %v, env %q: %v, want %v", tc.field, tc.env, got, tc.want)
		}
	}
	t.Setenv("RSOCK_VERBS_CM", "maybe")
	_, err := (&Config{}).resolve()
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Env != "RSOCK_VERBS_CM" {
		t.Fatalf("RSOCK_VERBS_CM=maybe: %v, want a ConfigError naming it", err)
	}
}
