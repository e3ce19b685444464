package rsock

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/ring"
	"github.com/rdmanet/rdmanet/internal/rsockenv"
)

// Config tunes rsock. The zero value gives good defaults, and every field
// left at its zero value is taken from its RSOCK_* environment variable if
// that is set; a field set in code wins. The variables are read once, when
// rsock first needs them (the first Dial, Listen or CheckConfig of the
// process), as the runtime reads GOGC: a later os.Setenv is not seen.
type Config struct {
	// Transports lists the transports allowed, in order of preference:
	// "verbs" (RDMA through libibverbs), "shm" (shared memory, same host)
	// and "tcp", which allows staying on the bootstrap TCP connection when no
	// other can be agreed, always as the last resort. Without "tcp", Dial
	// fails instead and a listener closes connections it cannot switch. Env
	// RSOCK_TRANSPORTS (comma-separated). Default: verbs,shm,tcp.
	Transports []string

	// RingSize is the receive ring of each connection, in bytes: a power of two
	// from 4 KiB to 1 GiB. Each side tells the other its RingSize: a ring goes
	// up to the smaller of the two, and a peer's ring larger than our own is
	// refused. Env RSOCK_RING_SIZE (accepts k, m, g suffixes). Default 1 MiB.
	RingSize int

	// RingStart is the receive ring a connection starts with when the peer
	// follows a ring move: the ring grows to RingSize, once, when the
	// peer's writer fills it (docs/protocol.md §3.11). A power of two from
	// 4 KiB; RingSize or more means rings start at RingSize. Rings a peer
	// maps (shm) start at RingSize. Env RSOCK_RING_START. Default 64 KiB.
	RingStart int

	// Credits is the number of receive work requests each connection
	// posts for the peer's state messages (message credits): 4 to 1024.
	// Env RSOCK_CREDITS. Default 64.
	Credits int

	// BusyPoll bounds how long a blocked Read or Write polls for completions
	// before it parks its goroutine; the window follows what a park costs in
	// this process, and a polling call hands its P to any goroutine that
	// waits for one (docs/protocol.md §4.1). A blocked call polls one window,
	// then parks: an idle connection soon costs no CPU, and while one
	// ping-pongs the waiting side keeps its core busy. At most half the
	// process's cores poll at once. It needs Go 1.26's count of runnable
	// goroutines; on an older runtime nothing polls. Negative (or 0 in the
	// environment) disables it; more than MaxBusyPoll is a ConfigError. Env
	// RSOCK_BUSY_POLL (a Go duration such as 50us). Default DefaultBusyPoll.
	BusyPoll time.Duration

	// HandshakeTimeout bounds the whole handshake once it has started, on
	// both sides. Env RSOCK_HANDSHAKE_TIMEOUT. Default 5s.
	HandshakeTimeout time.Duration

	// SniffTimeout is how long a listener waits for a new connection's
	// first bytes. A client that says nothing in that time (a protocol in
	// which the server speaks first) is handed to Accept as plain TCP.
	// Env RSOCK_SNIFF_TIMEOUT. Default 200ms.
	SniffTimeout time.Duration

	// ProbeTimeout is how long Dial waits for the server's answer to its hello.
	// After silence that long, or a close without an answer, Dial dials again
	// with plain TCP, saying why in ConnInfo.Reason; silence is no verdict, so
	// the next Dial probes again. Env RSOCK_PROBE_TIMEOUT. Default 1s.
	ProbeTimeout time.Duration

	// ProbeCacheTTL is how long Dial remembers that an address does not
	// speak rsock, and dials it with plain TCP without probing: once its
	// server has answered two probes in a row as a plain server does
	// (bytes other than rsock's magic, or an echo of the hello). Negative
	// disables the cache. Env RSOCK_PROBE_CACHE_TTL. Default 1m.
	ProbeCacheTTL time.Duration

	// Device, Port and GIDIndex override which RDMA device, port and GID table
	// entry the verbs transport uses. By default (zero values) it finds them
	// from the bootstrap connection's local IP, as rdma_cm does: on RoCE, the
	// port whose GID table holds that IP (RoCE v2 preferred); on InfiniBand,
	// the device under the IPoIB interface holding it. A GIDIndex of 0 in
	// Config means automatic; RSOCK_GID_INDEX=0 selects entry 0. Env
	// RSOCK_DEVICE (e.g. mlx5_0, rxe0), RSOCK_PORT, RSOCK_GID_INDEX.
	Device   string
	Port     int
	GIDIndex int
	// ConnectionManager connects verbs queue pairs through rdma_cm on RoCE
	// too (iWARP and InfiniBand always use it; on InfiniBand the path
	// record gives the partition, the SL and a GRH): addresses and paths
	// then follow the kernel's routes (VLANs, bonds) instead of the GID
	// table entry of the local IP. Set it on the dialing side; a server
	// follows its client. Env RSOCK_VERBS_CM=1.
	ConnectionManager bool
	// TrafficClass is the traffic class of the verbs transport's packets:
	// on RoCE, the IP header's DS field (DSCP << 2 | ECN, e.g. 106 for
	// DSCP 26 with ECN), 0-255. By default (0 in Config) it is the port's
	// rdma_cm default_roce_tos where the administrator set one
	// (/sys/kernel/config/rdma_cm/<device>/ports/<port>/default_roce_tos),
	// else 0; RSOCK_TRAFFIC_CLASS=0 selects 0. Each side sets its own
	// packets' class, except through rdma_cm, where the accepting side
	// takes the dialing side's. Env RSOCK_TRAFFIC_CLASS.
	TrafficClass int
	// ServiceLevel is the InfiniBand service level, 0-15 (on RoCE, the
	// priority some devices put in the VLAN tag). By default it is 0, or,
	// through rdma_cm, the path's: on InfiniBand the subnet manager's
	// choice, which its routing may depend on. A level set here or with env
	// RSOCK_SERVICE_LEVEL (RSOCK_SERVICE_LEVEL=0 selects 0) replaces it.
	ServiceLevel int
	// AckTimeout and RetryCount bound how long a verbs queue pair keeps sending
	// to a peer or path that does not acknowledge: each request is sent again
	// after AckTimeout (rounded up to the device's encoding, 4.096 us << n), up
	// to RetryCount times (1-6), and the queue pair then fails, and the
	// connection fails over to TCP. By default 537 ms and 6: about 3.8 s. Env
	// RSOCK_ACK_TIMEOUT, RSOCK_RETRY_COUNT.
	AckTimeout time.Duration
	RetryCount int

	// EndpointPool is how many closed verbs endpoints (a protection domain
	// with its registered buffers) each RDMA device keeps, so that the next
	// connection on it skips registering memory. A pooled endpoint's memory
	// stays registered (pinned) and is zeroed when reused; a ring retired by
	// growth is deregistered (its peer can no longer write to it) and
	// registered again when reused. Queue pairs are never reused. A refused
	// registration (no lockable memory) frees the pool first. Negative: no
	// pool. Env RSOCK_ENDPOINT_POOL. Default DefaultEndpointPool.
	EndpointPool int
	// EndpointPoolIdle is how long a pooled endpoint is kept unused. Env
	// RSOCK_ENDPOINT_POOL_IDLE. Default DefaultEndpointPoolIdle.
	EndpointPoolIdle time.Duration

	// UpgradeAfter is the upgrade policy of a dialed connection. A connection
	// starts on TCP, usable after one round trip, and sets up its ring in the
	// background once it has lived UpgradeAfter (up to 10 ms later:
	// docs/protocol.md §9.8) or moved UpgradeBytes bytes on TCP, whichever
	// comes first; each direction then moves to the ring without losing,
	// repeating or reordering a byte. A tiny value (1ns) upgrades at once.
	// Negative upgrades at once and makes Dial wait for the upgrade to run its
	// course (at most HandshakeTimeout): Dial returns the connection on its
	// ring, on TCP with the reason in its ConnInfo, or, without "tcp" in
	// Transports, the upgrade's error; without "tcp" that is the default. A
	// listener answers every client whatever its own setting; without "tcp" in
	// its Transports, a connection whose upgrade fails is reset. Settled tells
	// when an upgrade has run its course. Env RSOCK_UPGRADE_AFTER. Default
	// DefaultUpgradeAfter.
	UpgradeAfter time.Duration

	// UpgradeBytes is the byte count of the upgrade policy (see
	// UpgradeAfter). Env RSOCK_UPGRADE_BYTES (accepts k, m, g suffixes).
	// Default DefaultUpgradeBytes.
	UpgradeBytes int

	// NoFailover turns failover off. By default, when a ring's transport fails
	// (a queue pair in error, an error completion, a peer message that breaks
	// the ring's rules), both directions move back to TCP without losing,
	// repeating or reordering a byte, and the application sees no error (Info
	// says "failed-over" and why); the client upgrades again after a backoff
	// that doubles per failover, from 100 ms to at most a minute
	// (docs/protocol.md §9.10). With NoFailover, or without "tcp" in
	// Transports, such a failure resets the connection instead. A peer process
	// that dies is a dead connection either way. Env RSOCK_NO_FAILOVER=1.
	NoFailover bool

	// EarlyDial lets a Dial skip the handshake's round trip, as TLS 0-RTT
	// does, and is off by default for the same reason. For ProbeCacheTTL
	// after a server answered that it takes early frames, Dials to its
	// address return at once, and the hello leaves with the application's
	// first bytes (docs/protocol.md §9.11). If the address's server stops
	// speaking rsock in that time (a restart without rsock, the address
	// given to another service), those bytes reach it behind a hello it
	// does not understand, and the connection fails on its first Read or
	// Write with ErrEarlyRefused instead of at Dial; the address is then
	// forgotten. Enable it only where the first bytes are safe to replay or
	// to show to whatever listens on the address. Env RSOCK_EARLY_DIAL=1.
	EarlyDial bool

	// Deprecated: the early dial is off unless EarlyDial is set. A true
	// NoEarlyDial still turns it off.
	NoEarlyDial bool

	// Logger receives, at Info, fallbacks and remembered probe verdicts;
	// at Warn, a listener's failed handshakes (rate-limited) and
	// connections that end in a reset. Records carry the attributes code,
	// transport, reason and peer. Nil logs nothing.
	Logger *slog.Logger
}

// Defaults. BENCHMARKS.md ("Defaults and what they were chosen from")
// says what each was chosen from.
const (
	DefaultRingSize         = 1 << 20
	DefaultRingStart        = 64 << 10
	DefaultCredits          = 64
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultSniffTimeout     = 200 * time.Millisecond
	DefaultProbeTimeout     = time.Second
	DefaultProbeCacheTTL    = time.Minute
	// MaxBusyPoll is the largest BusyPoll.
	MaxBusyPoll = 10 * time.Millisecond
	// DefaultBusyPoll is BusyPoll's default bound.
	DefaultBusyPoll = 100 * time.Microsecond
	// DefaultUpgradeAfter and DefaultUpgradeBytes are the upgrade
	// policy's defaults (UpgradeAfter).
	DefaultUpgradeAfter = time.Millisecond
	DefaultUpgradeBytes = 64 << 10
	// DefaultEndpointPool and DefaultEndpointPoolIdle bound the verbs
	// endpoint pool (EndpointPool): at the default ring a pooled
	// endpoint holds about 2 MiB of pinned memory.
	DefaultEndpointPool     = 16
	DefaultEndpointPoolIdle = 10 * time.Second
)

// DefaultTransports is the transport order when none is configured.
var DefaultTransports = []string{"verbs", "shm", "tcp"}

// settings is a Config resolved against the environment and the defaults.
type settings struct {
	transports    []string              // accelerated transports, in order ("tcp" removed)
	order         []handshake.Transport // transports by number, host-local first (localFirst)
	fallback      bool                  // "tcp" was listed
	ringSize      int
	ringStart     int
	credits       int
	busyPoll      time.Duration
	handshake     time.Duration
	sniff         time.Duration
	probe         time.Duration
	probeCacheTTL time.Duration
	upgradeAfter  time.Duration // negative: at once, and Dial waits for the upgrade (dialWaits)
	upgradeBytes  int
	upgradeReason string // ConnInfo.Reason of a connection on TCP until its upgrade
	earlyDial     bool   // dials to a server that answered UpgradeEarly do not wait for its answer
	failover      bool   // a ring failure moves a switching connection to TCP
	device        string
	port          int
	gidIndex      int // -1: automatic
	tclass, sl    int // -1: automatic
	ackTimeout    time.Duration
	retries       int
	viaCM         bool
	pool          int // 0: no endpoint pool
	poolIdle      time.Duration
	log           *slog.Logger
}

// dialWaits reports whether a Dial upgrades at once and returns only once
// the upgrade has run its course (UpgradeAfter negative).
func (s *settings) dialWaits() bool { return s.upgradeAfter < 0 }

// ConfigError reports a bad Config field or RSOCK_* variable.
type ConfigError struct {
	Field string // the Config field
	Env   string // the variable, if the value came from the environment
	Value string
	Err   error
}

func (e *ConfigError) Error() string {
	src := "Config." + e.Field
	if e.Env != "" {
		src = e.Env
	}
	return fmt.Sprintf("rsock: bad %s %q: %v", src, e.Value, e.Err)
}

func (e *ConfigError) Unwrap() error { return e.Err }

// CheckConfig reports whether cfg (nil: the defaults), with the RSOCK_*
// variables of the environment, is valid: nil, or the *ConfigError that
// Dial and Listen would return.
func CheckConfig(cfg *Config) error {
	_, err := cfg.resolve()
	return err
}

func (c *Config) resolve() (*settings, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	s := &settings{log: cfg.Logger}
	if s.log == nil {
		s.log = discard
	}
	list := cfg.Transports
	env := ""
	if len(list) == 0 {
		if v := rsockenv.Get("RSOCK_TRANSPORTS"); v != "" {
			env = "RSOCK_TRANSPORTS"
			list = strings.Split(v, ",")
		} else {
			list = DefaultTransports
		}
	}
	for _, name := range list {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "tcp" {
			s.fallback = true
			continue
		}
		if _, ok := handshake.TransportByName(name); !ok {
			return nil, &ConfigError{Field: "Transports", Env: env, Value: strings.Join(list, ","), Err: fmt.Errorf("unknown transport %q (want verbs, shm or tcp)", name)}
		}
		if !slices.Contains(s.transports, name) {
			s.transports = append(s.transports, name)
		}
	}
	for _, name := range localFirst(s.transports) {
		s.order = append(s.order, mustTransport(name))
	}
	if len(s.transports) == 0 && !s.fallback {
		return nil, &ConfigError{Field: "Transports", Env: env, Value: strings.Join(list, ","), Err: fmt.Errorf("no transport")}
	}
	// Each integer and duration with its bounds [lo, hi]; why says them.
	ints := []struct {
		field, env string
		v, def     int
		dst        *int
		parse      func(string) (int, error)
		lo, hi     int
		why        string
		pow2       bool // a ring size: a power of two
	}{
		{"RingSize", "RSOCK_RING_SIZE", cfg.RingSize, DefaultRingSize, &s.ringSize, parseSize, ring.MinRingSize, ring.MaxRingSize, ringWhy, true},
		{"RingStart", "RSOCK_RING_START", cfg.RingStart, DefaultRingStart, &s.ringStart, parseSize, ring.MinRingSize, ring.MaxRingSize, ringWhy, true},
		{"Credits", "RSOCK_CREDITS", cfg.Credits, DefaultCredits, &s.credits, strconv.Atoi, ring.MinCredits, ring.MaxCredits, fmt.Sprintf("not in [%d, %d]", ring.MinCredits, ring.MaxCredits), false},
		{"UpgradeBytes", "RSOCK_UPGRADE_BYTES", cfg.UpgradeBytes, DefaultUpgradeBytes, &s.upgradeBytes, parseSize, 1, math.MaxInt, "must be positive", false},
		{"EndpointPool", "RSOCK_ENDPOINT_POOL", cfg.EndpointPool, DefaultEndpointPool, &s.pool, strconv.Atoi, math.MinInt, math.MaxInt, "", false},
		{"Port", "RSOCK_PORT", cfg.Port, 0, &s.port, strconv.Atoi, 0, 255, "not in [1, 255]", false},
		{"GIDIndex", "RSOCK_GID_INDEX", cfg.GIDIndex, -1, &s.gidIndex, strconv.Atoi, -1, 255, "not in [0, 255]", false},
		{"TrafficClass", "RSOCK_TRAFFIC_CLASS", cfg.TrafficClass, -1, &s.tclass, strconv.Atoi, -1, 255, "not in [0, 255]", false},
		{"ServiceLevel", "RSOCK_SERVICE_LEVEL", cfg.ServiceLevel, -1, &s.sl, strconv.Atoi, -1, 15, "not in [0, 15]", false},
		{"RetryCount", "RSOCK_RETRY_COUNT", cfg.RetryCount, 0, &s.retries, strconv.Atoi, 0, 6, "not in [1, 6]", false},
	}
	for _, f := range ints {
		n, from, err := field(f.field, f.v, f.env, f.def, f.parse)
		bad := n < f.lo || n > f.hi || f.pow2 && n&(n-1) != 0 || f.field == "RetryCount" && from != "" && n == 0
		if err == nil && bad {
			err = &ConfigError{Field: f.field, Env: from, Value: strconv.Itoa(n), Err: errors.New(f.why)}
		}
		if err != nil {
			return nil, err
		}
		*f.dst = n
	}
	upgradeAfter := time.Duration(-1) // where TCP is not allowed, Dial waits for the upgrade
	if s.fallback {
		upgradeAfter = DefaultUpgradeAfter
	}
	durs := []struct {
		field, env string
		v, def     time.Duration
		dst        *time.Duration
		lo, hi     time.Duration
		why        string
	}{
		{"BusyPoll", "RSOCK_BUSY_POLL", cfg.BusyPoll, DefaultBusyPoll, &s.busyPoll, math.MinInt64, MaxBusyPoll, "more than " + MaxBusyPoll.String()},
		{"HandshakeTimeout", "RSOCK_HANDSHAKE_TIMEOUT", cfg.HandshakeTimeout, DefaultHandshakeTimeout, &s.handshake, 1, math.MaxInt64, "must be positive"},
		{"SniffTimeout", "RSOCK_SNIFF_TIMEOUT", cfg.SniffTimeout, DefaultSniffTimeout, &s.sniff, 1, math.MaxInt64, "must be positive"},
		{"ProbeTimeout", "RSOCK_PROBE_TIMEOUT", cfg.ProbeTimeout, DefaultProbeTimeout, &s.probe, 1, math.MaxInt64, "must be positive"},
		{"ProbeCacheTTL", "RSOCK_PROBE_CACHE_TTL", cfg.ProbeCacheTTL, DefaultProbeCacheTTL, &s.probeCacheTTL, math.MinInt64, math.MaxInt64, ""},
		{"UpgradeAfter", "RSOCK_UPGRADE_AFTER", cfg.UpgradeAfter, upgradeAfter, &s.upgradeAfter, math.MinInt64, math.MaxInt64, ""},
		{"EndpointPoolIdle", "RSOCK_ENDPOINT_POOL_IDLE", cfg.EndpointPoolIdle, DefaultEndpointPoolIdle, &s.poolIdle, 1, math.MaxInt64, "must be positive"},
		{"AckTimeout", "RSOCK_ACK_TIMEOUT", cfg.AckTimeout, 0, &s.ackTimeout, 0, time.Hour, "not in (0, 1h]"},
	}
	for _, d := range durs {
		v, from, err := field(d.field, d.v, d.env, d.def, time.ParseDuration)
		if err == nil && (v < d.lo || v > d.hi) {
			err = &ConfigError{Field: d.field, Env: from, Value: v.String(), Err: errors.New(d.why)}
		}
		if err != nil {
			return nil, err
		}
		*d.dst = v
	}
	s.pool, s.busyPoll = max(s.pool, 0), max(s.busyPoll, 0)
	if !s.fallback {
		s.sniff = s.handshake // a listener that allows no TCP waits the whole handshake for the magic
	}
	noFailover, err := boolField("NoFailover", cfg.NoFailover, "RSOCK_NO_FAILOVER")
	if err != nil {
		return nil, err
	}
	s.failover = !noFailover && s.fallback
	early, err := boolField("EarlyDial", cfg.EarlyDial, "RSOCK_EARLY_DIAL")
	if err != nil {
		return nil, err
	}
	s.earlyDial = early && !cfg.NoEarlyDial
	if s.viaCM, err = boolField("ConnectionManager", cfg.ConnectionManager, "RSOCK_VERBS_CM"); err != nil {
		return nil, err
	}
	s.upgradeReason = fmt.Sprintf("on TCP until the upgrade (after %v or %d bytes)", s.upgradeAfter, s.upgradeBytes)
	if s.device = cfg.Device; s.device == "" {
		s.device = strings.TrimSpace(rsockenv.Get("RSOCK_DEVICE"))
	}
	return s, nil
}

var ringWhy = fmt.Sprintf("not a power of two from %d to %d", ring.MinRingSize, ring.MaxRingSize)

// field is the value of a Config field: v if set, else the variable env's
// (parsed), else def. from is env when the value came from it ("" else),
// for the errors of later checks (ConfigError.Env).
func field[T comparable](name string, v T, env string, def T, parse func(string) (T, error)) (_ T, from string, _ error) {
	var zero T
	if v != zero {
		return v, "", nil
	}
	if e := rsockenv.Get(env); e != "" {
		n, err := parse(strings.TrimSpace(e))
		if err != nil {
			return zero, env, &ConfigError{Field: name, Env: env, Value: e, Err: err}
		}
		return n, env, nil
	}
	return def, "", nil
}

// parseSize parses a byte count with an optional k, m or g suffix (powers
// of 1024).
func parseSize(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("empty")
	}
	mult := 1
	switch strings.ToLower(s[len(s)-1:]) {
	case "k":
		mult = 1 << 10
	case "m":
		mult = 1 << 20
	case "g":
		mult = 1 << 30
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, err
	}
	if n < 0 || n > min(1<<40, math.MaxInt)/mult {
		return 0, fmt.Errorf("out of range")
	}
	return n * mult, nil
}

// boolField resolves a boolean Config field that the environment can set
// but not clear: true in Config wins.
func boolField(field string, v bool, env string) (bool, error) {
	e := strings.TrimSpace(rsockenv.Get(env))
	if v || e == "" {
		return v, nil
	}
	b, err := strconv.ParseBool(e)
	if err != nil {
		return false, &ConfigError{Field: field, Env: env, Value: e, Err: err}
	}
	return b, nil
}
