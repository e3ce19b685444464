package rsock

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/rsockenv"
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
		rsockenv.Setenv(t, "RSOCK_BUSY_POLL", tc.env)
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
		rsockenv.Setenv(t, "RSOCK_VERBS_CM", tc.env)
		s, err := (&Config{ConnectionManager: tc.field}).resolve()
		if err != nil {
			t.Fatalf("field %v, env %q: %v", tc.field, tc.env, err)
		}
		if got := s.openOptions(&net.TCPConn{}).ConnectionManager; got != tc.want {
			t.Errorf("field %v, env %q: %v, want %v", tc.field, tc.env, got, tc.want)
		}
	}
	rsockenv.Setenv(t, "RSOCK_VERBS_CM", "maybe")
	_, err := (&Config{}).resolve()
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Env != "RSOCK_VERBS_CM" {
		t.Fatalf("RSOCK_VERBS_CM=maybe: %v, want a ConfigError naming it", err)
	}
}

// EndpointPool and EndpointPoolIdle: the defaults, the environment, the
// fields; a negative pool is none; they reach the verbs provider's
// options; a pool idle time that is not positive, or a pool size that is
// not a number, is a ConfigError.
func TestEndpointPoolSetting(t *testing.T) {
	for _, tc := range []struct {
		envSize, envIdle string
		size             int
		idle             time.Duration
		wantSize         int
		wantIdle         time.Duration
	}{
		{"", "", 0, 0, DefaultEndpointPool, DefaultEndpointPoolIdle},
		{"4", "1s", 0, 0, 4, time.Second},
		{"-1", "", 0, 0, 0, DefaultEndpointPoolIdle},
		{"4", "1s", -1, time.Minute, 0, time.Minute},
		{"", "", 2, time.Millisecond, 2, time.Millisecond},
	} {
		rsockenv.Setenv(t, "RSOCK_ENDPOINT_POOL", tc.envSize)
		rsockenv.Setenv(t, "RSOCK_ENDPOINT_POOL_IDLE", tc.envIdle)
		s, err := (&Config{EndpointPool: tc.size, EndpointPoolIdle: tc.idle}).resolve()
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		o := s.openOptions(&net.TCPConn{})
		if o.Pool != tc.wantSize || o.PoolIdle != tc.wantIdle {
			t.Errorf("%+v: pool %d for %v, want %d for %v", tc, o.Pool, o.PoolIdle, tc.wantSize, tc.wantIdle)
		}
	}
	for _, bad := range [][2]string{{"RSOCK_ENDPOINT_POOL", "many"}, {"RSOCK_ENDPOINT_POOL_IDLE", "0"}, {"RSOCK_ENDPOINT_POOL_IDLE", "soon"}} {
		rsockenv.Setenv(t, "RSOCK_ENDPOINT_POOL", "")
		rsockenv.Setenv(t, "RSOCK_ENDPOINT_POOL_IDLE", "")
		rsockenv.Setenv(t, bad[0], bad[1])
		_, err := (&Config{}).resolve()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field == "" {
			t.Errorf("%s=%s: %v, want a ConfigError", bad[0], bad[1], err)
		}
	}
}

// A dial sees the environment as read once (rsockenv): a change is seen
// after a reload, not before.
func TestSettingsFollowEnv(t *testing.T) {
	rsockenv.Setenv(t, "RSOCK_UPGRADE_BYTES", "")
	s1, err := (*Config)(nil).resolve()
	require.NoError(t, err)
	t.Setenv("RSOCK_UPGRADE_BYTES", "1k")
	s2, err := (*Config)(nil).resolve()
	require.NoError(t, err)
	require.Equal(t, s1.upgradeBytes, s2.upgradeBytes, "the environment is read once")
	rsockenv.Reload()
	s2, err = (*Config)(nil).resolve()
	require.NoError(t, err)
	require.Equal(t, 1024, s2.upgradeBytes)
	rsockenv.Setenv(t, "RSOCK_UPGRADE_BYTES", "nonsense")
	_, err = (*Config)(nil).resolve()
	require.Error(t, err)
}

// A value out of range is reported under where it came from: the
// variable's name when the environment gave it, the Config field's
// otherwise. BusyPoll has an upper bound (MaxBusyPoll).
func TestConfigErrorOrigin(t *testing.T) {
	for _, tc := range []struct {
		env, value string
		cfg        Config
		want       string
	}{
		{"RSOCK_CREDITS", "0", Config{}, `rsock: bad RSOCK_CREDITS "0": not in`},
		{"RSOCK_CREDITS", "", Config{Credits: 100000}, `rsock: bad Config.Credits "100000"`},
		{"RSOCK_RING_SIZE", "1000", Config{}, `rsock: bad RSOCK_RING_SIZE "1000": not a power of two`},
		{"RSOCK_HANDSHAKE_TIMEOUT", "-1s", Config{}, `rsock: bad RSOCK_HANDSHAKE_TIMEOUT "-1s": must be positive`},
		{"RSOCK_BUSY_POLL", "1h", Config{}, `rsock: bad RSOCK_BUSY_POLL "1h0m0s": more than 10ms`},
		{"RSOCK_BUSY_POLL", "", Config{BusyPoll: time.Second}, `rsock: bad Config.BusyPoll "1s": more than 10ms`},
		{"RSOCK_UPGRADE_BYTES", "-5", Config{}, `rsock: bad RSOCK_UPGRADE_BYTES "-5"`},
		{"RSOCK_GID_INDEX", "300", Config{}, `rsock: bad RSOCK_GID_INDEX "300": not in`},
		{"RSOCK_PORT", "", Config{Port: 256}, `rsock: bad Config.Port "256"`},
		{"RSOCK_TRAFFIC_CLASS", "256", Config{}, `rsock: bad RSOCK_TRAFFIC_CLASS "256": not in [0, 255]`},
		{"RSOCK_TRAFFIC_CLASS", "", Config{TrafficClass: -2}, `rsock: bad Config.TrafficClass "-2"`},
		{"RSOCK_SERVICE_LEVEL", "16", Config{}, `rsock: bad RSOCK_SERVICE_LEVEL "16": not in [0, 15]`},
		{"RSOCK_SERVICE_LEVEL", "", Config{ServiceLevel: 99}, `rsock: bad Config.ServiceLevel "99"`},
		{"RSOCK_ACK_TIMEOUT", "2h", Config{}, `rsock: bad RSOCK_ACK_TIMEOUT "2h0m0s": not in (0, 1h]`},
		{"RSOCK_ACK_TIMEOUT", "", Config{AckTimeout: -time.Second}, `rsock: bad Config.AckTimeout "-1s"`},
		{"RSOCK_RETRY_COUNT", "0", Config{}, `rsock: bad RSOCK_RETRY_COUNT "0": not in [1, 6]`},
		{"RSOCK_RETRY_COUNT", "", Config{RetryCount: 7}, `rsock: bad Config.RetryCount "7"`},
	} {
		rsockenv.Setenv(t, tc.env, tc.value)
		err := CheckConfig(&tc.cfg)
		var ce *ConfigError
		require.True(t, errors.As(err, &ce), "%s=%q %+v: %v", tc.env, tc.value, tc.cfg, err)
		require.Contains(t, err.Error(), tc.want)
		rsockenv.Setenv(t, tc.env, "")
	}
}

// TrafficClass, ServiceLevel, AckTimeout and RetryCount reach the verbs
// provider's options; the class and level are -1
// (the port's default) unless Config or the environment names one, and
// RSOCK_TRAFFIC_CLASS=0 selects 0 where Config's zero means the default.
func TestVerbsOptionsFromConfig(t *testing.T) {
	raw, peer := net.Pipe()
	defer raw.Close()
	defer peer.Close()
	for _, tc := range []struct {
		env        string
		cfg        Config
		tclass, sl int
	}{
		{"", Config{}, -1, -1},
		{"0", Config{}, 0, -1},
		{"72", Config{}, 72, -1},
		{"72", Config{TrafficClass: 106, ServiceLevel: 3}, 106, 3},
	} {
		rsockenv.Setenv(t, "RSOCK_TRAFFIC_CLASS", tc.env)
		s, err := tc.cfg.resolve()
		require.NoError(t, err)
		o := s.openOptions(raw)
		assert.Equal(t, tc.tclass, o.TrafficClass, "env %q, %+v", tc.env, tc.cfg)
		assert.Equal(t, tc.sl, o.ServiceLevel, "env %q, %+v", tc.env, tc.cfg)
	}
	rsockenv.Setenv(t, "RSOCK_TRAFFIC_CLASS", "")
	rsockenv.Setenv(t, "RSOCK_ACK_TIMEOUT", "100ms")
	s, err := (&Config{RetryCount: 3}).resolve()
	require.NoError(t, err)
	o := s.openOptions(raw)
	assert.Equal(t, 100*time.Millisecond, o.AckTimeout)
	assert.Equal(t, 3, o.RetryCount)
}
