package perf

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Options says what a run measures.
type Options struct {
	Transports  []string      `json:"transports"`  // rsock transports to compare with plain TCP
	Workloads   []string      `json:"workloads"`   // which workloads (AllWorkloads order)
	Repeats     int           `json:"repeats"`     // every unit runs once per repeat, modes interleaved
	Duration    time.Duration `json:"duration_ns"` // each timed unit
	PingSizes   []int         `json:"ping_sizes"`  // pingpong message sizes
	WriteSizes  []int         `json:"write_sizes"` // one-way throughput write sizes
	BidirSizes  []int         `json:"bidir_sizes"` // bidirectional throughput write sizes
	Conns       int           `json:"conns"`       // connections of the conns workload
	IdleConns   int           `json:"idle_conns"`  // connections of the idle workload
	Concurrency []int         `json:"concurrency"` // connections and callers of http and grpc
	BusyPoll    time.Duration `json:"busy_poll_ns"`
	Quick       bool          `json:"quick"`
	// Control adds plain-tcp-control to a compare: plain TCP again, with
	// a server of its own, interleaved like the other modes. Its ratios to
	// plain-tcp show how far two identical modes drift apart in this run;
	// a transport's ratio that differs from 1 by no more tells nothing.
	Control bool `json:"control,omitempty"`
}

// DefaultOptions are compare's defaults: about 90 s on a 2-core machine
// for shm and tcp against plain TCP, or about 15 s with quick.
func DefaultOptions(quick bool) Options {
	o := Options{
		Transports:  []string{"shm", "tcp"},
		Workloads:   append([]string(nil), AllWorkloads...),
		Repeats:     5,
		Duration:    150 * time.Millisecond,
		PingSizes:   []int{1, 64, 1 << 10, 4 << 10, 16 << 10, 64 << 10},
		WriteSizes:  []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20},
		BidirSizes:  []int{4 << 10, 64 << 10, 1 << 20, 4 << 20},
		Conns:       64,
		IdleConns:   1000,
		Concurrency: []int{1, 16},
	}
	if quick {
		o.Quick = true
		o.Repeats = 2
		o.Duration = 50 * time.Millisecond
		o.PingSizes = []int{64, 4 << 10, 64 << 10}
		o.WriteSizes = []int{4 << 10, 64 << 10, 1 << 20, 4 << 20}
		o.BidirSizes = []int{64 << 10, 1 << 20}
		o.Conns = 16
		o.IdleConns = 200
	}
	return o
}

// Plan lists the units of one repeat, in order.
func (o Options) Plan() []Unit {
	var out []Unit
	for _, w := range o.Workloads {
		switch w {
		case WPingPong:
			for _, s := range o.PingSizes {
				out = append(out, Unit{Workload: w, Size: s})
			}
		case WThroughput:
			for _, s := range o.WriteSizes {
				out = append(out, Unit{Workload: w, Size: s})
			}
		case WBidir:
			for _, s := range o.BidirSizes {
				out = append(out, Unit{Workload: w, Size: s})
			}
		case WSetup:
			out = append(out, Unit{Workload: w})
		case WConns:
			out = append(out, Unit{Workload: w, N: o.Conns})
		case WHTTP, WGRPC:
			for _, c := range o.Concurrency {
				out = append(out, Unit{Workload: w, N: c})
			}
		case WIdle:
			out = append(out, Unit{Workload: w, N: o.IdleConns})
		}
	}
	return out
}

// Validate checks the options.
func (o Options) Validate() error {
	switch {
	case o.Repeats < 1:
		return fmt.Errorf("repeats must be at least 1")
	case o.Duration <= 0:
		return fmt.Errorf("duration must be positive")
	case o.Conns < 1 || o.IdleConns < 1:
		return fmt.Errorf("connection counts must be at least 1")
	}
	for _, s := range append(append(append([]int(nil), o.PingSizes...), o.WriteSizes...), o.BidirSizes...) {
		if s < 1 || s > 64<<20 {
			return fmt.Errorf("size %d out of range (1 B to 64 MiB)", s)
		}
	}
	for _, c := range o.Concurrency {
		if c < 1 {
			return fmt.Errorf("concurrency must be at least 1")
		}
	}
	return nil
}

// ParseSizes parses a comma-separated list of byte counts with optional
// k, m suffixes (powers of 1024), or a range "A-B" meaning every power of
// four from A up to B (and B itself).
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if lo, hi, ok := strings.Cut(f, "-"); ok {
			a, err := parseSize(lo)
			if err != nil {
				return nil, err
			}
			b, err := parseSize(hi)
			if err != nil {
				return nil, err
			}
			if a > b {
				return nil, fmt.Errorf("empty range %q", f)
			}
			for v := a; v < b; v *= 4 {
				out = append(out, v)
			}
			out = append(out, b)
			continue
		}
		v, err := parseSize(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sizes in %q", s)
	}
	return out, nil
}

func parseSize(s string) (int, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := 1
	switch {
	case strings.HasSuffix(t, "k"):
		mult, t = 1<<10, t[:len(t)-1]
	case strings.HasSuffix(t, "m"):
		mult, t = 1<<20, t[:len(t)-1]
	}
	n, err := strconv.Atoi(t)
	if err != nil || n < 1 || n > (64<<20)/mult {
		return 0, fmt.Errorf("bad size %q (want e.g. 64, 4k, 1m; 1 B to 64 MiB)", s)
	}
	return n * mult, nil
}

// ParseInts parses a comma-separated list of positive integers.
func ParseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no counts in %q", s)
	}
	return out, nil
}
