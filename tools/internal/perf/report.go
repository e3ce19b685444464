package perf

import (
	"math"
	"sort"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// ReportVersion is the version of the JSON shape.
const ReportVersion = 1

// Report is everything a run measured. Its JSON form is rsockperf's
// machine-readable output.
type Report struct {
	Tool     string       `json:"tool"` // "rsockperf"
	Version  int          `json:"version"`
	Kind     string       `json:"kind"` // "compare" or "client"
	Command  string       `json:"command"`
	Date     time.Time    `json:"date"`
	Elapsed  float64      `json:"elapsed_s"`
	Machine  Machine      `json:"machine"`
	Options  Options      `json:"options"`
	Modes    []ModeStatus `json:"modes"`
	Results  []Result     `json:"results"`
	CDFs     []CDF        `json:"cdfs,omitempty"`
	Failures []Failure    `json:"failures,omitempty"`
}

// ModeStatus says whether a mode could be measured.
type ModeStatus struct {
	Mode      string `json:"mode"`      // "plain-tcp", "rsock-shm", ...
	Transport string `json:"transport"` // "" for plain TCP
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"` // why not
}

// Result is one metric of one unit in one mode, over the repeats.
type Result struct {
	Workload string `json:"workload"`
	Param    string `json:"param,omitempty"`
	Metric   string `json:"metric"`
	Unit     string `json:"unit,omitempty"`
	Mode     string `json:"mode"`
	Values   Floats `json:"values"` // one per repeat; null where the unit failed
	Spread   Spread `json:"spread"`
	// Ratio is this mode's value over plain TCP's, paired by repeat
	// (compare only, not for plain TCP itself).
	Ratio *Spread `json:"ratio,omitempty"`
}

// CDF is the latency distribution of one unit in one mode, merged over
// the repeats.
type CDF struct {
	Workload string      `json:"workload"`
	Param    string      `json:"param,omitempty"`
	Mode     string      `json:"mode"`
	Summary  Percentiles `json:"summary"`
	Points   []CDFPoint  `json:"points"`
}

// Failure is a unit that failed in one repeat.
type Failure struct {
	Workload string `json:"workload"`
	Param    string `json:"param,omitempty"`
	Mode     string `json:"mode"`
	Repeat   int    `json:"repeat"`
	Error    string `json:"error"`
}

// sample is one unit's outcome in one mode and repeat.
type sample struct {
	unit   Unit
	mode   string
	repeat int
	m      Measurement
	err    error
}

// aggregate turns samples into results, CDFs and failures. modes is the
// display order; plain TCP, if present, is the ratios' denominator.
func aggregate(plan []Unit, modes []string, repeats int, samples []sample) (results []Result, cdfs []CDF, fails []Failure) {
	type key struct{ unit, mode string }
	vals := map[key]map[string][]float64{} // metric -> per repeat
	hists := map[key]*hdrhistogram.Histogram{}
	for _, s := range samples {
		k := key{s.unit.Key(), s.mode}
		if s.err != nil {
			fails = append(fails, Failure{Workload: s.unit.Workload, Param: s.unit.Param(), Mode: s.mode, Repeat: s.repeat, Error: s.err.Error()})
			continue
		}
		if vals[k] == nil {
			vals[k] = map[string][]float64{}
		}
		for name, v := range s.m.Metrics {
			vs := vals[k][name]
			if vs == nil {
				vs = make([]float64, repeats)
				for i := range vs {
					vs[i] = math.NaN()
				}
				vals[k][name] = vs
			}
			vs[s.repeat] = v
		}
		if s.m.Hist != nil {
			if hists[k] == nil {
				hists[k] = NewHist()
			}
			hists[k].Merge(s.m.Hist)
		}
	}
	for _, u := range plan {
		var metrics []string
		seen := map[string]bool{}
		for _, m := range modes {
			for name := range vals[key{u.Key(), m}] {
				if !seen[name] {
					seen[name] = true
					metrics = append(metrics, name)
				}
			}
		}
		sort.Slice(metrics, func(i, j int) bool { return metricOrder(metrics[i]) < metricOrder(metrics[j]) })
		base := vals[key{u.Key(), Plain.Name()}]
		for _, name := range metrics {
			for _, m := range modes {
				vs, ok := vals[key{u.Key(), m}][name]
				if !ok {
					continue
				}
				r := Result{Workload: u.Workload, Param: u.Param(), Metric: name, Unit: InfoOfMetric(name).Unit, Mode: m, Values: vs, Spread: SpreadOf(vs)}
				if bv, ok := base[name]; ok && m != Plain.Name() && !InfoOfMetric(name).NoRatio {
					sp := SpreadOf(Ratios(vs, bv))
					r.Ratio = &sp
				}
				results = append(results, r)
			}
		}
		for _, m := range modes {
			if h := hists[key{u.Key(), m}]; h != nil {
				cdfs = append(cdfs, CDF{Workload: u.Workload, Param: u.Param(), Mode: m, Summary: PercentilesOf(h), Points: CDFOf(h)})
			}
		}
	}
	return results, cdfs, fails
}

// metricOrder sorts metrics as they are shown.
func metricOrder(m string) int {
	for i, x := range []string{MetricRate, MetricGBps, MetricCPUPerGB, MetricP50, MetricP90, MetricP99, MetricP999, MetricMax,
		MetricConns, MetricRSSClient, MetricRSSServer, MetricVSZClient, MetricVSZServer, MetricFDsClient, MetricFDsServer, MetricThreadsClient, MetricThreadsServer, MetricPinnedClient} {
		if x == m {
			return i
		}
	}
	return 1000
}

// Find returns the result for a unit key's workload and param, metric and
// mode.
func (r *Report) Find(workload, param, metric, mode string) (Result, bool) {
	for _, x := range r.Results {
		if x.Workload == workload && x.Param == param && x.Metric == metric && x.Mode == mode {
			return x, true
		}
	}
	return Result{}, false
}

// AvailableModes lists the modes that were measured, in order.
func (r *Report) AvailableModes() []string {
	var out []string
	for _, m := range r.Modes {
		if m.Available {
			out = append(out, m.Mode)
		}
	}
	return out
}
