package main

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmanet/rdmanet/rsock"
)

// TestCollector: an open shm connection shows in rsock_connections_open,
// both of its ends in this process, and the metrics pass the linter.
func TestCollector(t *testing.T) {
	cfg := &rsock.Config{Transports: []string{"shm"}}
	lc := rsock.ListenConfig{Config: cfg}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	d := rsock.Dialer{Config: cfg, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-acc
	defer s.Close()
	go func() { _, _ = io.Copy(s, s) }()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	open := -1.0
	for _, mf := range mfs {
		if mf.GetName() != "rsock_connections_open" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "transport" && l.GetValue() == "shm" {
					open = m.GetGauge().GetValue()
				}
			}
		}
	}
	if open < 2 {
		t.Fatalf("rsock_connections_open{transport=\"shm\"} = %v, want at least 2", open)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %+v", err, problems)
	}
}
