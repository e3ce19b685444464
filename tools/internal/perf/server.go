package perf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	pool "github.com/libp2p/go-buffer-pool"
	"google.golang.org/grpc"

	"github.com/rdmanet/rdmanet/tools/examples/grpc/service"
)

// Server is the far end of every workload: the perf protocol (proto.go)
// on one listener, a stock net/http server on a second and a stock gRPC
// server (examples/grpc/service) on a third, all in one Mode.
type Server struct {
	Mode Mode

	perf, web, rpc net.Listener
	httpSrv        *http.Server
	grpcSrv        *grpc.Server

	idle, mismatches atomic.Int64
	wg               sync.WaitGroup
	closeOnce        sync.Once

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // perf connections being served
	closed bool
}

// helloBody is what GET /hello answers.
var helloBody = []byte("hello from rsockperf\n")

// StartServer listens in mode m: the perf protocol on addr, HTTP and gRPC
// on the same host, on ports httpPort and grpcPort (0: any).
func StartServer(m Mode, addr string, httpPort, grpcPort int) (*Server, error) {
	s := &Server{Mode: m, conns: map[net.Conn]struct{}{}}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if s.perf, err = m.Listen(addr); err != nil {
		return nil, err
	}
	if s.web, err = m.Listen(net.JoinHostPort(host, strconv.Itoa(httpPort))); err != nil {
		s.perf.Close()
		return nil, err
	}
	if s.rpc, err = m.Listen(net.JoinHostPort(host, strconv.Itoa(grpcPort))); err != nil {
		s.perf.Close()
		s.web.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write(helloBody)
	})
	s.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	s.grpcSrv = service.NewServer(nil, nil)

	s.wg.Add(3)
	go func() { defer s.wg.Done(); s.servePerf() }()
	go func() { defer s.wg.Done(); _ = s.httpSrv.Serve(&checkedListener{s.web, s}) }()
	go func() { defer s.wg.Done(); _ = s.grpcSrv.Serve(&checkedListener{s.rpc, s}) }()
	return s, nil
}

// Info describes the server.
func (s *Server) Info() ServerInfo {
	return ServerInfo{
		Mode:      s.Mode.Name(),
		Transport: s.Mode.Transport,
		PerfAddr:  s.perf.Addr().String(),
		HTTPAddr:  s.web.Addr().String(),
		GRPCAddr:  s.rpc.Addr().String(),
		PID:       os.Getpid(),
	}
}

// Close stops the listeners and the HTTP and gRPC servers, and closes
// the perf connections.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.perf.Close()
		s.mu.Lock()
		s.closed = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		_ = s.httpSrv.Close()
		s.grpcSrv.Stop()
		s.wg.Wait()
	})
}

// Stats is SelfStats plus the server's counters.
func (s *Server) Stats(gc bool) ProcStats {
	st := SelfStats(gc)
	st.IdleConns = s.idle.Load()
	st.Mismatches = s.mismatches.Load()
	return st
}

// checkedListener hands on only connections over the server's transport
// (rsock's Config already refuses others; this is the second check).
type checkedListener struct {
	net.Listener
	s *Server
}

func (l *checkedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if err := CheckTransport(c, l.s.Mode); err != nil {
			l.s.mismatches.Add(1)
			c.Close()
			continue
		}
		return c, nil
	}
}

func (s *Server) servePerf() {
	ln := &checkedListener{s.perf, s}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = s.handle(c)
			c.Close()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// clampBuf bounds an I/O buffer size between 64 KiB and 4 MiB.
func clampBuf(n uint64) int {
	return int(min(max(n, 64<<10), 4<<20))
}

func (s *Server) handle(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	h, err := readHeader(c)
	if err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Time{})
	switch h.Op {
	case opEcho:
		// Pooled, as a production server's buffers are: a fresh 64 KiB
		// per connection would charge the setup workload with garbage
		// collection that is the benchmark's own, not the transport's.
		buf := pool.Get(clampBuf(h.Param))
		defer pool.Put(buf)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := c.Write(buf[:n]); werr != nil {
					return werr
				}
			}
			if err != nil {
				return err
			}
		}
	case opSink:
		n, err := discard(c, clampBuf(h.Param))
		if err != nil {
			return err
		}
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(n))
		_, err = c.Write(b[:])
		return err
	case opBidir:
		var done atomic.Bool
		werr := make(chan error, 1)
		go func() {
			buf := make([]byte, max(h.Param, 1))
			for !done.Load() {
				if _, err := c.Write(buf); err != nil {
					werr <- err
					return
				}
			}
			werr <- closeWrite(c)
		}()
		_, err := discard(c, clampBuf(h.Param))
		done.Store(true)
		if err != nil {
			c.Close()
		}
		return errors.Join(err, <-werr)
	case opIdle:
		s.idle.Add(1)
		defer s.idle.Add(-1)
		// A 1-byte buffer: the connection's own cost is what is measured.
		var b [1]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				return err
			}
		}
	case opControl:
		var cmd [1]byte
		for {
			if _, err := io.ReadFull(c, cmd[:]); err != nil {
				return err
			}
			if err := writeFrame(c, s.Stats(cmd[0] == 'g')); err != nil {
				return err
			}
		}
	case opInfo:
		return writeFrame(c, s.Info())
	}
	return fmt.Errorf("unknown op %q", h.Op)
}

// discard reads r until EOF with Reads of size bytes, and returns how many
// it read. It is io.Copy(io.Discard, r) with the read size fixed: io.Copy
// would use r's WriteTo, and io.Discard's ReadFrom reads 8 KiB at a time
// whatever buffer is given, so the read size would differ by transport
// and could not follow the write size.
func discard(r io.Reader, size int) (int64, error) {
	buf := pool.Get(size)
	defer pool.Put(buf)
	var n int64
	for {
		k, err := r.Read(buf)
		n += int64(k)
		switch {
		case err == io.EOF:
			return n, nil
		case err != nil:
			return n, err
		}
	}
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("connection cannot half-close")
}
