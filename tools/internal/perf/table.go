package perf

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Table is a titled table of strings, printed as aligned text or as
// Markdown.
type Table struct {
	Title  string
	Note   string
	Header []string
	Rows   [][]string
}

// WriteText prints t with aligned columns.
func (t Table) WriteText(w io.Writer) {
	width := make([]int, len(t.Header))
	for _, row := range append([][]string{t.Header}, t.Rows...) {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(row []string) {
		var b strings.Builder
		for i, c := range row {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := width[i] - len([]rune(c))
			if i == 0 {
				b.WriteString(c + strings.Repeat(" ", pad))
			} else {
				b.WriteString(strings.Repeat(" ", pad) + c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	fmt.Fprintln(w, t.Title)
	if t.Note != "" {
		fmt.Fprintln(w, "("+t.Note+")")
	}
	line(t.Header)
	for _, row := range t.Rows {
		line(row)
	}
	fmt.Fprintln(w)
}

// WriteMarkdown prints t as a Markdown table under a bold title.
func (t Table) WriteMarkdown(w io.Writer) {
	fmt.Fprintf(w, "**%s**", t.Title)
	if t.Note != "" {
		fmt.Fprintf(w, " (%s)", t.Note)
	}
	fmt.Fprint(w, "\n\n")
	esc := func(row []string) string {
		out := make([]string, len(row))
		for i, c := range row {
			out[i] = strings.ReplaceAll(c, "|", `\|`)
		}
		return "| " + strings.Join(out, " | ") + " |"
	}
	fmt.Fprintln(w, esc(t.Header))
	sep := make([]string, len(t.Header))
	for i := range sep {
		sep[i] = "---"
		if i > 0 {
			sep[i] = "---:"
		}
	}
	fmt.Fprintln(w, "|"+strings.Join(sep, "|")+"|")
	for _, row := range t.Rows {
		fmt.Fprintln(w, esc(row))
	}
	fmt.Fprintln(w)
}

// FormatNum prints v with three significant digits (more for large
// integers), or "-" for NaN.
func FormatNum(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "-"
	case a == 0:
		return "0"
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	case a >= 0.01:
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

// FormatRatio prints a ratio spread: "0.85x (0.80-0.90)".
func FormatRatio(s Spread) string {
	if s.N == 0 || math.IsNaN(s.Median) {
		return "-"
	}
	r := func(v float64) string { return fmt.Sprintf("%.2f", v) }
	if s.N == 1 {
		return r(s.Median) + "x"
	}
	return fmt.Sprintf("%sx (%s-%s)", r(s.Median), r(s.Min), r(s.Max))
}

// section is a group of workloads shown in one table, with the metrics
// shown for them.
type section struct {
	title    string
	workload string
	metrics  []string
}

var sections = []section{
	{"Ping-pong latency, one round trip", WPingPong, []string{MetricP50, MetricP99}},
	{"One-way throughput", WThroughput, []string{MetricGBps, MetricCPUPerGB}},
	{"Bidirectional throughput (both directions counted)", WBidir, []string{MetricGBps, MetricCPUPerGB}},
	{"Connection setup (dial, handshake, 1-byte round trip, close; one at a time)", WSetup, []string{MetricRate, MetricP50, MetricP99, MetricOneMoreRTT}},
	{"Many connections doing 64-byte ping-pong at once", WConns, []string{MetricRate, MetricP50, MetricP99}},
	{"net/http GET, c connections and callers", WHTTP, []string{MetricRate, MetricP50, MetricP99}},
	{"gRPC unary EmptyCall, c connections and callers", WGRPC, []string{MetricRate, MetricP50, MetricP99}},
	{"Idle connections", WIdle, []string{MetricRSSClient, MetricRSSServer, MetricVSZClient, MetricVSZServer, MetricFDsClient, MetricFDsServer, MetricThreadsClient, MetricThreadsServer, MetricPinnedClient}},
}

// Tables lays the report out: per section, one row per unit and metric,
// a column per mode (median over repeats) and, in a compare, a column per
// rsock mode with its ratio to plain TCP; then the latency percentiles.
func (r *Report) Tables() []Table {
	modes := r.AvailableModes()
	var out []Table
	for _, sec := range sections {
		t := Table{Title: sec.title, Header: append([]string{"unit", "metric"}, modes...)}
		ratioModes := []string{}
		if r.Kind == "compare" {
			for _, m := range modes {
				if m != Plain.Name() {
					ratioModes = append(ratioModes, m)
					t.Header = append(t.Header, strings.TrimPrefix(m, "rsock-")+" / plain")
				}
			}
		}
		for _, u := range r.Options.Plan() {
			if u.Workload != sec.workload {
				continue
			}
			for _, metric := range sec.metrics {
				mi := InfoOfMetric(metric)
				label := mi.Label
				if mi.Unit != "" {
					label += " (" + mi.Unit + ")"
				}
				if metric == MetricRate {
					label = rateLabel(u.Workload)
				}
				row := []string{u.Key(), label}
				any := false
				for _, m := range modes {
					res, ok := r.Find(u.Workload, u.Param(), metric, m)
					switch {
					case ok:
						any = true
						row = append(row, FormatNum(res.Spread.Median))
					case mi.PlainOnly && m != Plain.Name():
						row = append(row, "-")
					default:
						row = append(row, "failed")
					}
				}
				for _, m := range ratioModes {
					res, ok := r.Find(u.Workload, u.Param(), metric, m)
					if ok && res.Ratio != nil {
						row = append(row, FormatRatio(*res.Ratio))
					} else {
						row = append(row, "-")
					}
				}
				if any {
					t.Rows = append(t.Rows, row)
				}
			}
		}
		if len(t.Rows) > 0 {
			out = append(out, t)
		}
	}
	if lt := r.percentileTable(); len(lt.Rows) > 0 {
		out = append(out, lt)
	}
	return out
}

func rateLabel(workload string) string {
	switch workload {
	case WSetup:
		return "connections/s"
	case WHTTP:
		return "requests/s"
	case WGRPC:
		return "calls/s"
	}
	return "round trips/s"
}

func (r *Report) percentileTable() Table {
	t := Table{
		Title:  "Latency percentiles (us)",
		Note:   "all samples of all repeats, HDR histogram",
		Header: []string{"unit", "mode", "p50", "p90", "p99", "p99.9", "max", "samples"},
	}
	for _, c := range r.CDFs {
		key := c.Workload
		if c.Param != "" {
			key += "/" + c.Param
		}
		s := c.Summary
		t.Rows = append(t.Rows, []string{key, c.Mode, FormatNum(s.P50), FormatNum(s.P90), FormatNum(s.P99), FormatNum(s.P999), FormatNum(s.Max), fmt.Sprint(s.Count)})
	}
	return t
}

// WriteText prints the report for people.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "rsockperf %s, %s\n", r.Kind, r.Date.Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "machine: %s\n", r.Machine.Describe())
	for _, m := range r.Modes {
		if !m.Available {
			fmt.Fprintf(w, "%s: UNAVAILABLE: %s\n", m.Mode, m.Reason)
		}
	}
	fmt.Fprintf(w, "%s\n\n", r.Method())
	if h := r.Headline(); len(h.Rows) > 0 {
		h.WriteText(w)
	}
	for _, t := range r.Tables() {
		t.WriteText(w)
	}
	r.writeFailures(w, "")
}

func (r *Report) writeFailures(w io.Writer, bullet string) {
	if len(r.Failures) == 0 {
		return
	}
	fmt.Fprintf(w, "%d unit runs FAILED:\n\n", len(r.Failures))
	for _, f := range r.Failures {
		key := f.Workload
		if f.Param != "" {
			key += "/" + f.Param
		}
		fmt.Fprintf(w, "%s%s %s repeat %d: %s\n", bullet, f.Mode, key, f.Repeat+1, f.Error)
	}
	fmt.Fprintln(w)
}

// Describe is a one-line description of the machine.
func (m Machine) Describe() string {
	return fmt.Sprintf("%s, %d cores, Linux %s, %s, load average %s at start", m.CPU, m.Cores, m.Kernel, m.GoVersion, m.LoadAvg)
}

// Method says in a sentence how the figures were taken.
func (r *Report) Method() string {
	o := r.Options
	s := fmt.Sprintf("%d repeats, %s per timed unit, modes interleaved in each repeat; cells are medians over the repeats", o.Repeats, o.Duration)
	if r.Kind == "compare" {
		s += "; ratios are rsock / plain TCP per repeat, median (min-max): below 1 is better for latency, CPU and memory, above 1 for rates and throughput"
	}
	return s + "."
}
