package clients

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tidwall/redcon"
	"golang.org/x/sync/errgroup"

	"github.com/rdmanet/rdmanet/rsock"
)

// connList keeps connections, for checks after the workload.
type connList struct {
	mu sync.Mutex
	cs []net.Conn
}

func (l *connList) add(c net.Conn) {
	l.mu.Lock()
	l.cs = append(l.cs, c)
	l.mu.Unlock()
}

func (l *connList) conns() []net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]net.Conn(nil), l.cs...)
}

// recordingListener keeps every connection it accepts.
type recordingListener struct {
	net.Listener
	connList
}

func (l *recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.add(c)
	}
	return c, err
}

// redisServer serves SET, GET, PING and DEL from memory on an rsock
// listener with cfg, until the test ends.
func redisServer(t *testing.T, cfg *rsock.Config) *recordingListener {
	t.Helper()
	lc := rsock.ListenConfig{Config: cfg}
	inner, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &recordingListener{Listener: inner}
	var store sync.Map
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = redcon.Serve(ln, func(conn redcon.Conn, cmd redcon.Command) {
			switch strings.ToUpper(string(cmd.Args[0])) {
			case "PING":
				conn.WriteString("PONG")
			case "SET":
				if len(cmd.Args) < 3 {
					conn.WriteError("ERR wrong number of arguments for 'set'")
					return
				}
				store.Store(string(cmd.Args[1]), bytes.Clone(cmd.Args[2]))
				conn.WriteString("OK")
			case "GET":
				if len(cmd.Args) != 2 {
					conn.WriteError("ERR wrong number of arguments for 'get'")
					return
				}
				v, ok := store.Load(string(cmd.Args[1]))
				if !ok {
					conn.WriteNull()
					return
				}
				conn.WriteBulk(v.([]byte))
			case "DEL":
				n := 0
				for _, k := range cmd.Args[1:] {
					if _, ok := store.LoadAndDelete(string(k)); ok {
						n++
					}
				}
				conn.WriteInt(n)
			default:
				conn.WriteError(fmt.Sprintf("ERR unknown command '%s'", cmd.Args[0]))
			}
		}, nil, nil)
	}()
	t.Cleanup(func() {
		ln.Close()
		<-served
		for _, c := range ln.conns() {
			c.Close()
		}
	})
	return ln
}

// dialRecorder dials with d and keeps every connection it made.
type dialRecorder struct {
	d rsock.Dialer
	connList
}

func (r *dialRecorder) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := r.d.DialContext(ctx, network, addr)
	if err == nil {
		r.add(c)
	}
	return c, err
}

// waitGroup waits for g, failing the test if it takes longer than d: a
// call that hangs fails the test instead of holding it to its timeout.
func waitGroup(t *testing.T, g *errgroup.Group, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(d):
		t.Fatalf("the workload did not finish in %v: a call hangs", d)
	}
}

// redisClient is a go-redis client whose connections come from d.
func redisClient(t *testing.T, addr string, d *dialRecorder, poolSize int) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Dialer:          d.DialContext,
		PoolSize:        poolSize,
		MinIdleConns:    0,
		Protocol:        2,
		DisableIdentity: true,
		ReadTimeout:     10 * time.Second,
		WriteTimeout:    10 * time.Second,
		MaxRetries:      -1, // a failure must show, not be retried away
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// TestGoRedis runs go-redis's pooled client against a redcon server, both
// on rsock: 8 workers share a pool of 4 connections for 40 SET/GET pairs
// each, with values of 1 B to 256 KiB. go-redis checks a pooled
// connection's health through SyscallConn before reusing it, which hung
// every upgraded connection (issue 39). Every value must come back byte
// for byte, no call may hang, and on shm every connection must end up on
// shm at both ends.
func TestGoRedis(t *testing.T) {
	for _, tr := range []string{"shm", "tcp"} {
		t.Run(tr, func(t *testing.T) {
			cfg := suiteConfig(tr)
			ln := redisServer(t, cfg)
			dialed := &dialRecorder{d: rsock.Dialer{Config: cfg, Timeout: 10 * time.Second}}
			client := redisClient(t, ln.Addr().String(), dialed, 4)

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const workers, rounds = 8, 40
			var g errgroup.Group
			for w := range workers {
				g.Go(func() error {
					rng := rand.New(rand.NewPCG(uint64(w), 39))
					for i := range rounds {
						size := 1 << rng.IntN(19) // 1 B to 256 KiB
						val := make([]byte, size)
						for j := range val {
							val[j] = byte(rng.Uint32())
						}
						key := fmt.Sprintf("k%d.%d", w, i)
						if err := client.Set(ctx, key, val, 0).Err(); err != nil {
							return fmt.Errorf("SET %s (%d B): %w", key, size, err)
						}
						got, err := client.Get(ctx, key).Bytes()
						if err != nil {
							return fmt.Errorf("GET %s (%d B): %w", key, size, err)
						}
						if !bytes.Equal(got, val) {
							return fmt.Errorf("GET %s: %d bytes back for %d, or different bytes", key, len(got), size)
						}
					}
					return nil
				})
			}
			waitGroup(t, &g, 2*time.Minute)

			stats := client.PoolStats()
			assert.LessOrEqual(t, int(stats.TotalConns), 4, "a pool of 4")
			requireSettledOn(t, tr, "server side", ln.conns())
			requireSettledOn(t, tr, "client side", dialed.conns())
		})
	}
}

// suiteConfig is the config of a suite's subtest on transport tr: the
// default policy for "shm" (TCP first, then the upgrade), TCP fallback
// only for "tcp".
func suiteConfig(tr string) *rsock.Config {
	if tr == "tcp" {
		return &rsock.Config{Transports: []string{"tcp"}}
	}
	return nil
}

func mustInfo(c net.Conn) rsock.ConnInfo {
	ci, _ := rsock.InfoOf(c)
	return ci
}
