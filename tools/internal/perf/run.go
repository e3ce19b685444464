package perf

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Compare runs every unit of o's plan over plain TCP and over each of o's
// transports, each mode against its own server process, interleaved: in
// every repeat each unit runs once in every mode before the next unit
// starts, in an order that rotates. A transport that cannot be had is
// reported as unavailable; the run goes on with the others.
func Compare(ctx context.Context, o Options, spec ChildSpec, progress io.Writer) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	rep := &Report{Tool: "rsockperf", Version: ReportVersion, Kind: "compare", Date: time.Now().UTC(), Machine: ThisMachine(), Options: o}
	start := time.Now()
	modes := o.modes()
	var (
		targets  []*Target
		children []*child
	)
	defer func() {
		for _, t := range targets {
			t.Close()
		}
		var wg sync.WaitGroup
		for _, ch := range children {
			wg.Add(1)
			go func() { defer wg.Done(); ch.stop() }()
		}
		wg.Wait()
	}()
	for _, m := range modes {
		st := ModeStatus{Mode: m.Name(), Transport: m.Transport}
		ch, err := startChild(spec, m)
		if err == nil {
			children = append(children, ch)
			var t *Target
			if t, err = Connect(ctx, m, ch.info.PerfAddr); err == nil {
				targets = append(targets, t)
				st.Available = true
			}
		}
		if err != nil {
			st.Reason = strings.Join(strings.Fields(err.Error()), " ") // one line
			fmt.Fprintf(progress, "rsockperf: %s unavailable: %v\n", m.Name(), err)
			if m == Plain {
				return nil, fmt.Errorf("plain TCP baseline: %w", err)
			}
		}
		rep.Modes = append(rep.Modes, st)
	}
	samples, err := runPlan(ctx, o, targets, progress)
	rep.Results, rep.CDFs, rep.Failures = aggregate(o.Plan(), rep.AvailableModes(), o.Repeats, samples)
	rep.Elapsed = time.Since(start).Seconds()
	return rep, err
}

// modes lists what a compare measures: plain TCP, its control if asked
// for, and each transport.
func (o Options) modes() []Mode {
	modes := []Mode{Plain}
	if o.Control {
		modes = append(modes, Control)
	}
	for _, tr := range o.Transports {
		modes = append(modes, Mode{Transport: tr, BusyPoll: o.BusyPoll})
	}
	return modes
}

// Client runs o's plan against one server that is already running, in
// mode m, and reports absolute figures (no ratios: there is no baseline).
func Client(ctx context.Context, o Options, m Mode, addr string, progress io.Writer) (*Report, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = io.Discard
	}
	rep := &Report{Tool: "rsockperf", Version: ReportVersion, Kind: "client", Date: time.Now().UTC(), Machine: ThisMachine(), Options: o}
	start := time.Now()
	t, err := Connect(ctx, m, addr)
	if err != nil {
		return nil, fmt.Errorf("%s to %s: %w", m.Name(), addr, err)
	}
	defer t.Close()
	rep.Modes = []ModeStatus{{Mode: m.Name(), Transport: m.Transport, Available: true}}
	samples, err := runPlan(ctx, o, []*Target{t}, progress)
	rep.Results, rep.CDFs, rep.Failures = aggregate(o.Plan(), rep.AvailableModes(), o.Repeats, samples)
	rep.Elapsed = time.Since(start).Seconds()
	return rep, err
}

// runPlan runs every unit once per repeat on every target, rotating the
// order of the targets from one unit to the next.
func runPlan(ctx context.Context, o Options, targets []*Target, progress io.Writer) ([]sample, error) {
	plan := o.Plan()
	total := o.Repeats * len(plan) * len(targets)
	var samples []sample
	done := 0
	start := time.Now()
	for r := range o.Repeats {
		for ui, u := range plan {
			for k := range targets {
				if err := ctx.Err(); err != nil {
					return samples, err
				}
				t := targets[(k+r+ui)%len(targets)]
				done++
				eta := ""
				if done > 1 {
					left := time.Duration(float64(time.Since(start)) / float64(done-1) * float64(total-done+1))
					eta = fmt.Sprintf(", about %s left", left.Round(time.Second))
				}
				fmt.Fprintf(progress, "rsockperf: [%d/%d] repeat %d/%d %s %s%s\n", done, total, r+1, o.Repeats, t.Mode.Name(), u.Key(), eta)
				m, err := u.Run(ctx, t, o.Duration)
				if err != nil {
					var mm *MismatchError
					if errors.As(err, &mm) {
						err = fmt.Errorf("wrong transport: %w", err)
					}
					fmt.Fprintf(progress, "rsockperf:   %s %s FAILED: %v\n", t.Mode.Name(), u.Key(), err)
				}
				samples = append(samples, sample{unit: u, mode: t.Mode.Name(), repeat: r, m: m, err: err})
			}
		}
	}
	return samples, nil
}
