package rsock

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/handshake"
	"github.com/rdmanet/rdmanet/internal/rsockenv"
)

// forgetEarly drops what the dial caches know of addr: a test server on a
// port that an rsock listener had before must not get early dials.
func forgetEarly(addr string) {
	earlyServers.forget("tcp " + addr)
	plainServers.forget("tcp " + addr)
}

// handServer serves connections one at a time with serve, each after the
// client's hello, which it passes on.
func handServer(t *testing.T, serve func(i int, raw net.Conn, hello *handshake.Hello) error) (string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	forgetEarly(ln.Addr().String())
	done := make(chan error, 16)
	go func() {
		for i := 0; ; i++ {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			m, err := handshake.Read(raw)
			if err == nil {
				err = serve(i, raw, m.(*handshake.Hello))
			}
			raw.Close()
			done <- err
		}
	}()
	return ln.Addr().String(), done
}

var earlyUpgrade = &handshake.Upgrade{Flags: handshake.UpgradeGrow | handshake.UpgradeEarly, Transports: []handshake.Transport{handshake.TransportSim}}

// TestEarlyDial: after a server answered UpgradeEarly, the next Dial sends
// its hello with FlagEarly and returns at once: its first Data frame
// reaches the server before the server has answered anything, and the
// answer may come in front of the server's first frame. Without EarlyDial
// (the default), or with the deprecated NoEarlyDial, the hello waits for
// its answer as before.
func TestEarlyDial(t *testing.T) {
	registerSim(t)
	flags := make(chan uint16, 4)
	addr, served := handServer(t, func(i int, raw net.Conn, hello *handshake.Hello) error {
		flags <- hello.Flags
		if hello.Flags&handshake.FlagEarly == 0 {
			if err := handshake.Write(raw, earlyUpgrade); err != nil {
				return err
			}
		}
		_, m, err := handshake.Next(raw) // the client's Data, before any answer if early
		if err != nil {
			return err
		}
		if m != nil {
			t.Errorf("got %T, want the client's data", m)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(raw, b); err != nil {
			return err
		}
		var answer []byte
		if hello.Flags&handshake.FlagEarly != 0 {
			if answer, err = handshake.Append(nil, earlyUpgrade); err != nil {
				return err
			}
		}
		var echo [handshake.HeaderLen]byte
		handshake.PutDataHeader(&echo, 1)
		_, err = raw.Write(append(append(answer, echo[:]...), b...)) // answer and echo in one segment
		return err
	})
	roundTrip := func(cfg *Config) {
		t.Helper()
		c, err := (&Dialer{Config: cfg}).Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte("x"))
		require.NoError(t, err)
		b := make([]byte, 1)
		_, err = io.ReadFull(c, b)
		require.NoError(t, err)
		assert.Equal(t, "x", string(b))
		require.NoError(t, <-served)
	}
	cfg := earlyCfg("sim", time.Hour)
	roundTrip(cfg)
	assert.Zero(t, <-flags&handshake.FlagEarly, "the first dial waits for the answer")
	roundTrip(cfg)
	assert.NotZero(t, <-flags&handshake.FlagEarly, "a server that answered UpgradeEarly gets early dials")
	roundTrip(swCfg("sim", time.Hour))
	assert.Zero(t, <-flags&handshake.FlagEarly, "without EarlyDial (the default) a dial waits for the answer")
	noEarly := earlyCfg("sim", time.Hour)
	noEarly.NoEarlyDial = true
	roundTrip(noEarly)
	assert.Zero(t, <-flags&handshake.FlagEarly, "the deprecated NoEarlyDial still turns it off")
	rsockenv.Setenv(t, "RSOCK_EARLY_DIAL", "1")
	roundTrip(swCfg("sim", time.Hour))
	assert.NotZero(t, <-flags&handshake.FlagEarly, "RSOCK_EARLY_DIAL=1 turns it on")
}

// earlyCfg is swCfg with the early dial on (Config.EarlyDial).
func earlyCfg(tr string, after time.Duration) *Config {
	cfg := swCfg(tr, after)
	cfg.EarlyDial = true
	return cfg
}

// TestEarlyDialRefused: an early dial whose server answers with anything
// but an Upgrade that takes early frames fails on its Read with
// ErrEarlyRefused, and the address is forgotten: the next dial waits for
// the answer.
func TestEarlyDialRefused(t *testing.T) {
	registerSim(t)
	data := func() []byte {
		var h [handshake.HeaderLen]byte
		handshake.PutDataHeader(&h, 1)
		return append(h[:], 'x')
	}
	frame := func(m handshake.Message) []byte {
		b, err := handshake.Append(nil, m)
		require.NoError(t, err)
		return b
	}
	for _, tc := range []struct {
		name   string
		answer []byte // nil: the server closes
	}{
		{"plain server", []byte("HTTP/1.1 400 Bad Request\r\n\r\n")},
		{"short plain reply", []byte("+OK\r\n")},
		{"silent", []byte{}},
		{"data first", data()},
		{"decline", frame(&handshake.Decline{Code: handshake.DeclinePolicy, Reason: "no"})},
		{"no early flag", frame(&handshake.Upgrade{Flags: handshake.UpgradeGrow, Transports: []handshake.Transport{handshake.TransportSim}})},
		{"closed", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, served := handServer(t, func(i int, raw net.Conn, hello *handshake.Hello) error {
				if i == 0 {
					return handshake.Write(raw, earlyUpgrade) // and close
				}
				if hello.Flags&handshake.FlagEarly == 0 {
					t.Errorf("dial %d: the hello has no FlagEarly", i)
				}
				if tc.answer == nil {
					return nil
				}
				_, err := raw.Write(tc.answer)
				if err != nil {
					return err
				}
				rest, err := io.ReadAll(raw) // until the client's end
				goodbye := handshake.Magic + string([]byte{handshake.Version, byte(handshake.TypeGoodbye)})
				if strings.Contains(string(rest), goodbye) {
					t.Errorf("a goodbye frame reached a server that did not answer as rsock: %q", rest)
				}
				return err
			})
			d := &Dialer{Config: earlyCfg("sim", time.Hour)}
			c, err := d.Dial("tcp", addr)
			require.NoError(t, err)
			c.Close()
			require.NoError(t, <-served)
			require.True(t, earlyServers.known("tcp "+addr))

			c, err = d.Dial("tcp", addr)
			require.NoError(t, err, "an early dial returns before the answer")
			_, err = c.Read(make([]byte, 1))
			require.ErrorIs(t, err, ErrEarlyRefused)
			_, err = c.Write([]byte("y"))
			assert.ErrorIs(t, err, ErrEarlyRefused)
			assert.False(t, earlyServers.known("tcp "+addr), "the address is forgotten")
			c.Close()
			require.NoError(t, <-served) // what reached the server is checked
		})
	}
}

// TestEarlyDialServerThatNeverWrites: a server whose application never
// writes still sends its held answer (at serverReaderAfter), so an early
// client whose policy fired before it still upgrades.
func TestEarlyDialServerThatNeverWrites(t *testing.T) {
	registerSim(t)
	cfg := earlyCfg("sim", time.Nanosecond)
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg)
	awaitSettled(t, c, s)
	c.Close()
	s.Close()
	require.True(t, earlyServers.known("tcp "+ln.Addr().String()))

	c, s = pipe(t, ln, cfg)
	defer c.Close()
	defer s.Close()
	awaitSettled(t, c, s)
	assert.Equal(t, "sim", c.Info().Transport, c.Info().Reason)
	assert.Equal(t, "sim", s.Info().Transport, s.Info().Reason)
}

// TestLateEarlyHello: an early hello that reaches the listener after its
// sniff timeout, when the connection went to Accept as plain TCP, is
// declined, and the server's Read fails rather than hand the frames after
// it to the application as data; the client fails with ErrEarlyRefused.
func TestLateEarlyHello(t *testing.T) {
	registerSim(t)
	cfg := earlyCfg("sim", time.Nanosecond)
	cfg.SniffTimeout = time.Millisecond
	ln := listen(t, cfg)
	c, s := pipe(t, ln, cfg) // learns that the server takes early dials
	c.Close()
	s.Close()
	raw, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer raw.Close()
	acc, err := ln.Accept() // silent past the sniff timeout: plain
	require.NoError(t, err)
	defer acc.Close()
	require.Equal(t, CodePlainClient, acc.(*Conn).Info().Code)

	hello := switchHello([]string{"sim"})
	hello.Flags |= handshake.FlagEarly
	frame, err := handshake.Append(nil, hello)
	require.NoError(t, err)
	var data [handshake.HeaderLen]byte
	handshake.PutDataHeader(&data, 1)
	_, err = raw.Write(append(append(frame, data[:]...), 'x'))
	require.NoError(t, err)
	n, err := acc.Read(make([]byte, 64))
	assert.Zero(t, n, "no frame bytes reach the application")
	require.Error(t, err)
	m, err := handshake.Read(raw)
	require.NoError(t, err)
	assert.IsType(t, &handshake.Decline{}, m)
}

// TestEarlyHelloHeld: an early dial holds its hello for its first frame,
// so that the two share a segment. The hello goes out with the first
// Write; at once when the application reads first (a server that speaks
// first waits for it); helloHold after the dial when the application does
// neither; and at Close.
func TestEarlyHelloHeld(t *testing.T) {
	registerSim(t)
	defer func(d time.Duration) { helloHold = d }(helloHold)
	early := make(chan struct{}, 4)
	got := make(chan string, 4)
	addr, served := handServer(t, func(i int, raw net.Conn, hello *handshake.Hello) error {
		if hello.Flags&handshake.FlagEarly == 0 {
			if err := handshake.Write(raw, earlyUpgrade); err != nil {
				return err
			}
		} else {
			early <- struct{}{}
			// Speak first: the answer and one byte of Data.
			answer, err := handshake.Append(nil, earlyUpgrade)
			if err != nil {
				return err
			}
			var h [handshake.HeaderLen]byte
			handshake.PutDataHeader(&h, 1)
			if _, err := raw.Write(append(append(answer, h[:]...), 's')); err != nil {
				return err
			}
		}
		var data []byte
		for {
			hd, m, err := handshake.Next(raw)
			if err == io.EOF {
				got <- string(data)
				return nil
			}
			if err != nil {
				return err
			}
			if m == nil {
				b := make([]byte, hd.Length)
				if _, err := io.ReadFull(raw, b); err != nil {
					return err
				}
				data = append(data, b...)
			}
		}
	})
	cfg := earlyCfg("sim", time.Hour)
	prime, err := (&Dialer{Config: cfg}).Dial("tcp", addr)
	require.NoError(t, err)
	require.NoError(t, prime.Close())
	require.NoError(t, <-served)
	<-got

	// The helpers take the subtest's t: a failure ends that case only.
	dial := func(t *testing.T, hold time.Duration) *Conn {
		t.Helper()
		helloHold = hold
		c, err := (&Dialer{Config: cfg}).Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() }) // a failed case frees the server for the next
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c.(*Conn)
	}
	wait := func(t *testing.T, ch <-chan struct{}) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("the server never got the early hello")
		}
	}
	// end closes c, and checks what the server got before the client's end
	// (served first: without the hello the server reads nothing, and says
	// so there).
	end := func(t *testing.T, c *Conn, want string) {
		t.Helper()
		require.NoError(t, c.Close())
		require.NoError(t, <-served)
		assert.Equal(t, want, <-got)
	}
	// readS reads the server's 's'. A client that closed with it unread
	// would reset the connection, as TCP does, and the server could read
	// that reset instead of the end it checks for.
	readS := func(t *testing.T, c *Conn) {
		t.Helper()
		b := make([]byte, 1)
		_, err := io.ReadFull(c, b)
		require.NoError(t, err)
		assert.Equal(t, "s", string(b))
	}
	held := func(c *Conn) bool {
		c.w.out.mu.Lock()
		defer c.w.out.mu.Unlock()
		return c.w.out.held != nil
	}

	t.Run("with the first write", func(t *testing.T) {
		c := dial(t, time.Hour)
		assert.True(t, held(c), "nothing sent before the first frame")
		_, err := c.Write([]byte("x"))
		require.NoError(t, err)
		assert.False(t, held(c))
		wait(t, early)
		readS(t, c)
		end(t, c, "x")
	})
	t.Run("when the application reads first", func(t *testing.T) {
		c := dial(t, time.Hour)
		b := make([]byte, 1)
		_, err := io.ReadFull(c, b) // the server answers only once the hello came
		require.NoError(t, err)
		assert.Equal(t, "s", string(b))
		wait(t, early)
		end(t, c, "")
	})
	t.Run("after helloHold", func(t *testing.T) {
		c := dial(t, time.Millisecond)
		wait(t, early)
		readS(t, c)
		end(t, c, "")
	})
	t.Run("at close", func(t *testing.T) {
		c := dial(t, time.Hour)
		end(t, c, "") // io.EOF from served had the hello not come
		wait(t, early)
	})
}
