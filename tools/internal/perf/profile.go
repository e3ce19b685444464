package perf

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"runtime/trace"
)

// profileFlags ask a client or server to profile itself: a CPU profile
// and a profile of allocations (go tool pprof), and an execution trace (go
// tool trace), written when the command ends. They explain where a
// figure's time goes.
type profileFlags struct {
	cpu, mem, trace string
}

func (p *profileFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&p.cpu, "cpuprofile", "", "write a CPU profile of this process to this file")
	fs.StringVar(&p.mem, "memprofile", "", "write a profile of this process's allocations (all of them, sampled) to this file")
	fs.StringVar(&p.trace, "trace", "", "write an execution trace of this process to this file")
}

// start starts what the flags ask for; stop ends it and closes the files.
func (p *profileFlags) start() (stop func() error, err error) {
	var files []*os.File
	var stops []func()
	stop = func() error {
		for _, s := range stops {
			s()
		}
		var errs []error
		for _, f := range files {
			errs = append(errs, f.Close())
		}
		return errors.Join(errs...)
	}
	open := func(name string) (*os.File, error) {
		f, err := os.Create(name)
		if err == nil {
			files = append(files, f)
		}
		return f, err
	}
	if p.cpu != "" {
		f, err := open(p.cpu)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, errors.Join(fmt.Errorf("cpu profile: %w", err), stop())
		}
		stops = append(stops, pprof.StopCPUProfile)
	}
	if p.trace != "" {
		f, err := open(p.trace)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		if err := trace.Start(f); err != nil {
			return nil, errors.Join(fmt.Errorf("execution trace: %w", err), stop())
		}
		stops = append(stops, trace.Stop)
	}
	if p.mem != "" {
		f, err := open(p.mem)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		stops = append(stops, func() { _ = pprof.Lookup("allocs").WriteTo(f, 0) })
	}
	return stop, nil
}
