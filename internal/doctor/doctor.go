// Package doctor checks what rsock can do on this host, in the manner of
// smc_chk and ibv_devinfo: whether libibverbs loads, the RDMA devices and
// their RoCE addresses, the locked-memory limit against what verbs
// connections pin, whether shm and verbs work (each by a connection to
// this process itself), the RSOCK_* variables in effect, and optionally
// the transport a connection to a given server gets. Off Linux, where
// rsock has TCP only, it says so and why. rsockperf doctor runs it.
package doctor

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"time"

	"github.com/rdmanet/rdmanet/internal/rsockenv"
	"github.com/rdmanet/rdmanet/rsock"
)

// Options are the doctor's inputs.
type Options struct {
	Connect string        // host:port of an rsock server to dial, or ""
	Timeout time.Duration // bound of each connection it makes
}

// Run writes the report to w. It returns 0 when rsock can run here (TCP
// always can), 1 when the configuration is invalid or the connection to
// Options.Connect failed.
func Run(w io.Writer, o Options) int {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Second
	}
	status := 0
	fmt.Fprintf(w, "rsock doctor: %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)

	fmt.Fprintln(w, "\nconfiguration")
	env := rsockenv.Load().Environ() // what CheckConfig below reads
	if len(env) == 0 {
		fmt.Fprintln(w, "  RSOCK_* variables: none (defaults)")
	}
	for _, kv := range env {
		fmt.Fprintf(w, "  %s\n", kv)
	}
	if err := rsock.CheckConfig(nil); err != nil {
		fmt.Fprintf(w, "  INVALID: %v\n", err)
		status = 1
	} else {
		fmt.Fprintln(w, "  valid")
	}

	platform(w, o)

	if o.Connect != "" {
		fmt.Fprintf(w, "\nconnection to %s\n", o.Connect)
		d := rsock.Dialer{Timeout: o.Timeout}
		c, err := d.Dial("tcp", o.Connect)
		if err != nil {
			fmt.Fprintf(w, "  FAILED: %v\n", err)
			status = 1
		} else {
			// A switching connection starts on TCP and takes its ring in
			// the background: report where it settles.
			at := rsock.TransportOf(c)
			ctx, cancel := context.WithTimeout(context.Background(), o.Timeout)
			if _, err := rsock.WaitSettled(ctx, c); err != nil {
				fmt.Fprintf(w, "  still upgrading after %v\n", o.Timeout)
			}
			cancel()
			info, _ := rsock.InfoOf(c)
			if at != info.Transport {
				fmt.Fprintf(w, "  transport %s at Dial, upgraded\n", at)
			}
			fmt.Fprintf(w, "  transport %s (code %s): %s\n", info.Transport, info.Code, info.Reason)
			c.Close()
		}
	}
	return status
}

// selfTest connects to a listener of this process over transport alone
// ("": the default transports) and reports what it got.
func selfTest(w io.Writer, transport, ip string, timeout time.Duration) {
	cfg := &rsock.Config{}
	if transport != "" {
		cfg.Transports = []string{transport}
	} else {
		transport = "default transports"
	}
	lc := rsock.ListenConfig{Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		fmt.Fprintf(w, "  %s: cannot listen on %s: %v\n", transport, ip, err)
		return
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = io.Copy(c, c)
			c.Close()
		}
	}()
	d := rsock.Dialer{Config: cfg, Timeout: timeout}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		fmt.Fprintf(w, "  %s on %s: does not work: %v\n", transport, ip, err)
		return
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	b := []byte("rsock doctor")
	if _, err = c.Write(b); err == nil {
		_, err = io.ReadFull(c, b)
	}
	info, _ := rsock.InfoOf(c)
	if err != nil {
		fmt.Fprintf(w, "  %s on %s: connected (%s) but the echo failed: %v\n", transport, ip, info.Reason, err)
		return
	}
	fmt.Fprintf(w, "  %s on %s: works (%s)\n", transport, ip, info.Reason)
}
