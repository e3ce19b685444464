package perf

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rdmanet/rdmanet/internal/doctor"
)

const usage = `rsockperf: rsock against plain kernel TCP.

  rsockperf compare [flags]   start a server per mode (this program re-executed), run every
                              workload over plain TCP and each transport, interleaved with
                              repeats, and print rsock / TCP ratios with their spread
  rsockperf server [flags]    serve the workloads (perf protocol, net/http, gRPC) in one mode
  rsockperf client [flags]    run the workloads against a running server; absolute figures
  rsockperf report [flags] FILE
                              print a saved JSON report again (tables, plots, Markdown)
  rsockperf doctor [--connect HOST:PORT]
                              check what rsock can do on this host (devices, limits, shm and
                              verbs by a connection to itself, RSOCK_* variables), and the
                              transport a connection to a server gets

Run 'rsockperf COMMAND -h' for a command's flags.
`

// Main is rsockperf's command line; it returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch args[0] {
	case "compare":
		err = mainCompare(ctx, args[1:], stdout, stderr)
	case "client":
		err = mainClient(ctx, args[1:], stdout, stderr)
	case "server":
		err = mainServer(ctx, args[1:], stdout, stderr)
	case "report":
		err = mainReport(args[1:], stdout, stderr)
	case "doctor":
		fs := flag.NewFlagSet("rsockperf doctor", flag.ContinueOnError)
		fs.SetOutput(stderr)
		connect := fs.String("connect", "", "also dial this rsock server and report the transport it gets")
		timeout := fs.Duration("timeout", 10*time.Second, "bound of each connection the doctor makes")
		if err := fs.Parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		return doctor.Run(stdout, doctor.Options{Connect: *connect, Timeout: *timeout})
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "rsockperf: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(stderr, "rsockperf %s: %v\n", args[0], err)
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "rsockperf %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// usageError is a bad command line.
type usageError struct{ error }

// optionFlags are the flags that shape a run (compare and client).
type optionFlags struct {
	quick                                bool
	repeats                              int
	duration                             time.Duration
	workloads, pingSizes, writeSizes     string
	bidirSizes, concurrency              string
	conns, idleConns                     int
	busyPoll                             time.Duration
	jsonOut                              bool
	jsonFile, plotDir, markdown, command string
	plotFormat                           string
	quiet                                bool
}

func (f *optionFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.quick, "quick", false, "a short run (fewer sizes and repeats, 50 ms units): under 20 s")
	fs.IntVar(&f.repeats, "repeats", 0, "repeats (default 5, quick 2)")
	fs.DurationVar(&f.duration, "duration", 0, "time per timed unit (default 150ms, quick 50ms)")
	fs.StringVar(&f.workloads, "workloads", "all", "comma-separated: "+strings.Join(AllWorkloads, ","))
	fs.StringVar(&f.pingSizes, "ping-sizes", "", "ping-pong sizes, e.g. 1,64,1k or a range 1-64k (powers of 4); default 1,64,1k,4k,16k,64k")
	fs.StringVar(&f.writeSizes, "write-sizes", "", "one-way write sizes; default 4k,16k,64k,256k,1m,4m")
	fs.StringVar(&f.bidirSizes, "bidir-sizes", "", "bidirectional write sizes; default 4k,64k,1m,4m")
	fs.StringVar(&f.concurrency, "concurrency", "", "connections and callers for http and grpc; default 1,16")
	fs.IntVar(&f.conns, "conns", 0, "connections of the conns workload (default 64, quick 16)")
	fs.IntVar(&f.idleConns, "idle-conns", 0, "connections of the idle workload (default 1000, quick 200)")
	fs.DurationVar(&f.busyPoll, "busy-poll", 0, "rsock Config.BusyPoll for the rsock modes (0: rsock's default)")
	fs.BoolVar(&f.jsonOut, "json", false, "print the report as JSON on stdout instead of tables")
	fs.StringVar(&f.jsonFile, "json-file", "", "also write the JSON report to this file")
	fs.StringVar(&f.plotDir, "plot", "", "write SVG plots (latency CDFs, throughput against write size) to this directory")
	fs.StringVar(&f.plotFormat, "plot-format", "svg", "svg or png")
	fs.StringVar(&f.markdown, "markdown", "", "rewrite the generated region of this Markdown file (BENCHMARKS.md)")
	fs.StringVar(&f.command, "command", "", "the command to record in the report (default: this command line)")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress on stderr")
}

// options builds Options from the defaults and the flags given.
func (f *optionFlags) options() (Options, error) {
	o := DefaultOptions(f.quick)
	var err error
	if f.repeats != 0 {
		o.Repeats = f.repeats
	}
	if f.duration != 0 {
		o.Duration = f.duration
	}
	if o.Workloads, err = ParseWorkloads(f.workloads); err != nil {
		return o, err
	}
	for _, s := range []struct {
		v   string
		dst *[]int
	}{{f.pingSizes, &o.PingSizes}, {f.writeSizes, &o.WriteSizes}, {f.bidirSizes, &o.BidirSizes}} {
		if s.v != "" {
			if *s.dst, err = ParseSizes(s.v); err != nil {
				return o, err
			}
		}
	}
	if f.concurrency != "" {
		if o.Concurrency, err = ParseInts(f.concurrency); err != nil {
			return o, err
		}
	}
	if f.conns != 0 {
		o.Conns = f.conns
	}
	if f.idleConns != 0 {
		o.IdleConns = f.idleConns
	}
	o.BusyPoll = f.busyPoll
	return o, o.Validate()
}

// CompareArgs is a parsed compare command line.
type CompareArgs struct {
	Options Options
	Host    string // the servers' listening address
	flags   optionFlags
}

// ParseCompare parses compare's flags.
func ParseCompare(args []string, stderr io.Writer) (CompareArgs, error) {
	var ca CompareArgs
	fs := flag.NewFlagSet("rsockperf compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ca.flags.register(fs)
	fs.StringVar(&ca.Host, "host", "127.0.0.1", "address the servers listen on and the client dials (verbs needs an RDMA-capable interface's)")
	transports := fs.String("transports", "shm,tcp", "rsock transports to compare with plain TCP, comma-separated, or all (verbs,shm,tcp); one that cannot be had is reported unavailable")
	control := fs.Bool("control", false, "also measure plain TCP again against a server of its own (plain-tcp-control): its ratios are the run's noise")
	if err := fs.Parse(args); err != nil {
		return ca, err
	}
	if fs.NArg() > 0 {
		return ca, usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	o, err := ca.flags.options()
	if err != nil {
		return ca, usageError{err}
	}
	if o.Transports, err = ParseTransports(*transports); err != nil {
		return ca, usageError{err}
	}
	o.Control = *control
	ca.Options = o
	return ca, nil
}

func mainCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	ca, err := ParseCompare(args, stderr)
	if err != nil {
		return err
	}
	progress := stderr
	if ca.flags.quiet {
		progress = io.Discard
	}
	rep, err := Compare(ctx, ca.Options, ChildSpec{Host: ca.Host}, progress)
	if rep == nil {
		return err
	}
	rep.Command = commandLine(ca.flags.command, "compare", args)
	if werr := emit(rep, &ca.flags, stdout); werr != nil {
		return werr
	}
	return err
}

// ClientArgs is a parsed client command line.
type ClientArgs struct {
	Options Options
	Mode    Mode
	Addr    string
	flags   optionFlags
	prof    profileFlags
}

// ParseClient parses client's flags.
func ParseClient(args []string, stderr io.Writer) (ClientArgs, error) {
	var ca ClientArgs
	fs := flag.NewFlagSet("rsockperf client", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ca.flags.register(fs)
	fs.StringVar(&ca.Addr, "connect", "127.0.0.1:7470", "the server's perf address (host:port)")
	tr := fs.String("transport", "", "rsock transport: verbs, shm or tcp (rsock's fallback path)")
	plain := fs.Bool("plain", false, "plain kernel TCP (net.Dial), the baseline")
	ca.prof.register(fs)
	if err := fs.Parse(args); err != nil {
		return ca, err
	}
	if fs.NArg() > 0 {
		return ca, usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	m, err := modeFlags(*tr, *plain, ca.flags.busyPoll)
	if err != nil {
		return ca, usageError{err}
	}
	ca.Mode = m
	if ca.Options, err = ca.flags.options(); err != nil {
		return ca, usageError{err}
	}
	if ca.flags.markdown != "" {
		return ca, usageError{errors.New("--markdown is for compare")}
	}
	ca.Options.Transports = nil
	if !m.IsPlain() {
		ca.Options.Transports = []string{m.Transport}
	}
	return ca, nil
}

// modeFlags turns --transport and --plain into a Mode: exactly one of
// them.
func modeFlags(tr string, plain bool, busyPoll time.Duration) (Mode, error) {
	switch {
	case plain && tr != "":
		return Mode{}, errors.New("--plain and --transport exclude each other")
	case plain:
		return Plain, nil
	case tr == "":
		return Mode{}, errors.New("need --transport verbs|shm|tcp or --plain")
	case !isKnownTransport(tr):
		return Mode{}, fmt.Errorf("unknown transport %q (want verbs, shm or tcp)", tr)
	}
	return Mode{Transport: tr, BusyPoll: busyPoll}, nil
}

func mainClient(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	ca, err := ParseClient(args, stderr)
	if err != nil {
		return err
	}
	progress := stderr
	if ca.flags.quiet {
		progress = io.Discard
	}
	stopProf, err := ca.prof.start()
	if err != nil {
		return err
	}
	rep, err := Client(ctx, ca.Options, ca.Mode, ca.Addr, progress)
	err = errors.Join(err, stopProf())
	if rep == nil {
		return err
	}
	rep.Command = commandLine(ca.flags.command, "client", args)
	if werr := emit(rep, &ca.flags, stdout); werr != nil {
		return werr
	}
	return err
}

// emit writes the report: tables or JSON on stdout, and the files asked
// for.
func emit(rep *Report, f *optionFlags, stdout io.Writer) error {
	if f.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.WriteText(stdout)
	}
	if f.jsonFile != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(f.jsonFile), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(f.jsonFile, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	var plots []string
	if f.plotDir != "" {
		var err error
		if plots, err = WritePlots(rep, f.plotDir, f.plotFormat); err != nil {
			return err
		}
	}
	if f.markdown != "" {
		return UpdateMarkdownFile(f.markdown, rep, plots)
	}
	return nil
}

func commandLine(given, cmd string, args []string) string {
	if given != "" {
		return given
	}
	return strings.Join(append([]string{"rsockperf", cmd}, args...), " ")
}

// ServerArgs is a parsed server command line.
type ServerArgs struct {
	Mode               Mode
	Listen             string
	HTTPPort, GRPCPort int
	ExitOnEOF          bool
	prof               profileFlags
}

// ParseServer parses server's flags.
func ParseServer(args []string, stderr io.Writer) (ServerArgs, error) {
	var sa ServerArgs
	fs := flag.NewFlagSet("rsockperf server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&sa.Listen, "listen", "127.0.0.1:7470", "perf protocol address")
	fs.IntVar(&sa.HTTPPort, "http-port", 0, "net/http server port on the same host (0: any; the client asks the server)")
	fs.IntVar(&sa.GRPCPort, "grpc-port", 0, "gRPC server port on the same host (0: any)")
	tr := fs.String("transport", "", "rsock transport: verbs, shm or tcp (rsock's fallback path)")
	plain := fs.Bool("plain", false, "plain kernel TCP (net.Listen), the baseline")
	bp := fs.Duration("busy-poll", 0, "rsock Config.BusyPoll (0: rsock's default)")
	fs.BoolVar(&sa.ExitOnEOF, "exit-on-eof", false, "exit when standard input closes (compare starts its servers so)")
	sa.prof.register(fs)
	if err := fs.Parse(args); err != nil {
		return sa, err
	}
	if fs.NArg() > 0 {
		return sa, usageError{fmt.Errorf("unexpected arguments %q", fs.Args())}
	}
	m, err := modeFlags(*tr, *plain, *bp)
	if err != nil {
		return sa, usageError{err}
	}
	sa.Mode = m
	return sa, nil
}

func mainServer(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	sa, err := ParseServer(args, stderr)
	if err != nil {
		return err
	}
	RaiseNoFile()
	stopProf, err := sa.prof.start()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopProf()) }()
	s, err := StartServer(sa.Mode, sa.Listen, sa.HTTPPort, sa.GRPCPort)
	if err != nil {
		return err
	}
	defer s.Close()
	info, err := json.Marshal(s.Info())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s%s\n", readyPrefix, info)
	if !sa.ExitOnEOF {
		fmt.Fprintf(stderr, "rsockperf server: %s on %s (http %s, grpc %s); Ctrl-C stops\n", sa.Mode.Name(), s.Info().PerfAddr, s.Info().HTTPAddr, s.Info().GRPCAddr)
		<-ctx.Done()
		return nil
	}
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(eof) }()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	return nil
}

// plotRel is the path of a plot relative to the Markdown file's folder.
func plotRel(mdPath, plot string) string {
	if rel, err := filepath.Rel(filepath.Dir(mdPath), plot); err == nil {
		return filepath.ToSlash(rel)
	}
	return filepath.ToSlash(plot)
}

// mainReport prints a JSON report saved with --json-file again, and
// writes its plots and Markdown: the output can change without measuring
// again.
func mainReport(args []string, stdout, stderr io.Writer) error {
	var f optionFlags
	fs := flag.NewFlagSet("rsockperf report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&f.jsonOut, "json", false, "print the report as JSON on stdout instead of tables")
	fs.StringVar(&f.plotDir, "plot", "", "write plots to this directory")
	fs.StringVar(&f.plotFormat, "plot-format", "svg", "svg or png")
	fs.StringVar(&f.markdown, "markdown", "", "rewrite the generated region of this Markdown file")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{errors.New("want one JSON report file")}
	}
	b, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	if rep.Tool != "rsockperf" || rep.Version != ReportVersion {
		return fmt.Errorf("%s: not an rsockperf report of version %d", fs.Arg(0), ReportVersion)
	}
	return emit(&rep, &f, stdout)
}
