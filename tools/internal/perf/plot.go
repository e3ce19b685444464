package perf

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Plot files, by what they show (without the extension).
const (
	plotThroughput = "throughput-oneway"
	plotBidir      = "throughput-bidir"
)

// latencyPlotName is the file of a workload's latency CDF.
func latencyPlotName(workload, param string) string {
	if param == "" {
		return "latency-cdf-" + workload
	}
	return fmt.Sprintf("latency-cdf-%s-%s", workload, param)
}

// WritePlots writes plots of rep into dir, as format "svg" or "png": the
// ping-pong latency CDF of each size with a line per mode, and throughput
// against write size (one-way and bidirectional) with a line per mode. It
// returns the files written.
func WritePlots(rep *Report, dir, format string) ([]string, error) {
	if format != "svg" && format != "png" {
		return nil, fmt.Errorf("plot format %q (want svg or png)", format)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	save := func(p *plot.Plot, name string) error {
		path := filepath.Join(dir, name+"."+format)
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
			return err
		}
		files = append(files, path)
		return nil
	}
	modes := rep.AvailableModes()
	for _, u := range rep.Options.Plan() {
		if u.Workload != WPingPong {
			continue
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("Ping-pong round trip, %s messages: latency CDF", u.Param())
		p.X.Label.Text = "round-trip latency (us, log scale)"
		p.Y.Label.Text = "fraction of round trips at or below"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.TickerFunc(ticks125)
		p.Y.Min, p.Y.Max = 0, 1
		p.Legend.Top, p.Legend.Left = false, false // the tail's corner: empty
		p.Legend.YOffs = vg.Points(12)
		p.Add(plotter.NewGrid())
		n := 0
		// Show the body: up to twice the largest p99.9 (the line goes
		// on to the maximum, beyond the frame; the tables have it).
		xmax := 0.0
		for i, m := range modes {
			for _, c := range rep.CDFs {
				if c.Workload != u.Workload || c.Param != u.Param() || c.Mode != m || len(c.Points) == 0 {
					continue
				}
				xys := make(plotter.XYs, 0, len(c.Points))
				for _, pt := range c.Points {
					xys = append(xys, plotter.XY{X: math.Max(pt.LatencyUS, 0.01), Y: pt.Fraction})
				}
				l, err := plotter.NewLine(xys)
				if err != nil {
					return files, err
				}
				l.Color = plotutil.Color(i)
				l.Width = vg.Points(1.5)
				p.Add(l)
				p.Legend.Add(fmt.Sprintf("%s (p50 %s us, p99 %s us)", m, FormatNum(c.Summary.P50), FormatNum(c.Summary.P99)), l)
				n++
				xmax = math.Max(xmax, 2*c.Summary.P999)
			}
		}
		if n == 0 {
			continue
		}
		if xmax > 0 {
			p.X.Max = xmax
		}
		if err := save(p, latencyPlotName(u.Workload, u.Param())); err != nil {
			return files, err
		}
	}
	for _, tp := range []struct {
		workload, name, title string
	}{
		{WThroughput, plotThroughput, "One-way throughput against write size"},
		{WBidir, plotBidir, "Bidirectional throughput (both directions) against write size"},
	} {
		p, ok, err := throughputPlot(rep, modes, tp.workload, tp.title)
		if err != nil {
			return files, err
		}
		if ok {
			if err := save(p, tp.name); err != nil {
				return files, err
			}
		}
	}
	return files, nil
}

func throughputPlot(rep *Report, modes []string, workload, title string) (*plot.Plot, bool, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "write size (log scale)"
	p.Y.Label.Text = "GB/s (median of repeats; bars: min-max)"
	p.X.Scale = plot.LogScale{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	var ticks []plot.Tick
	for _, u := range rep.Options.Plan() {
		if u.Workload == workload {
			ticks = append(ticks, plot.Tick{Value: float64(u.Size), Label: FormatSize(u.Size)})
		}
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Min = 0
	any := false
	for i, m := range modes {
		var pts plotter.XYs
		var errs plotter.YErrors
		for _, u := range rep.Options.Plan() {
			if u.Workload != workload {
				continue
			}
			r, ok := rep.Find(u.Workload, u.Param(), MetricGBps, m)
			if !ok || r.Spread.N == 0 {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(u.Size), Y: r.Spread.Median})
			errs = append(errs, struct{ Low, High float64 }{r.Spread.Median - r.Spread.Min, r.Spread.Max - r.Spread.Median})
		}
		if len(pts) == 0 {
			continue
		}
		l, s, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, false, err
		}
		l.Color, s.Color = plotutil.Color(i), plotutil.Color(i)
		l.Width = vg.Points(1.5)
		eb, err := plotter.NewYErrorBars(struct {
			plotter.XYer
			plotter.YErrorer
		}{pts, errs})
		if err != nil {
			return nil, false, err
		}
		eb.Color = plotutil.Color(i)
		p.Add(l, s, eb)
		p.Legend.Add(m, l, s)
		any = true
	}
	return p, any, nil
}

// ticks125 labels a log axis at 1, 2 and 5 times the powers of ten, with
// unlabelled minor ticks between.
func ticks125(lo, hi float64) []plot.Tick {
	if lo <= 0 || hi <= lo {
		return nil
	}
	var out []plot.Tick
	for dec := math.Pow(10, math.Floor(math.Log10(lo))); dec <= hi; dec *= 10 {
		for k := 1; k <= 9; k++ {
			v := float64(k) * dec
			if v < lo || v > hi {
				continue
			}
			t := plot.Tick{Value: v}
			if k == 1 || k == 2 || k == 5 {
				t.Label = strconv.FormatFloat(v, 'g', -1, 64)
			}
			out = append(out, t)
		}
	}
	return out
}
