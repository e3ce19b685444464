package perf

import (
	"math"
	"slices"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Spread summarises repeated measurements of one quantity: the median and
// the range. N counts the values it was made of.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// SpreadOf returns the median, minimum and maximum of vs, ignoring NaNs.
// The median of an even count is the mean of the middle two. With no
// values, N is 0 and the others are NaN.
func SpreadOf(vs []float64) Spread {
	xs := make([]float64, 0, len(vs))
	for _, v := range vs {
		if !math.IsNaN(v) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return Spread{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return Spread{Median: med, Min: xs[0], Max: xs[n-1], N: n}
}

// Ratios pairs num and den by index (by repeat) and returns num[i]/den[i]
// for each pair where both are finite and den is not zero; other pairs give
// NaN, which SpreadOf ignores.
func Ratios(num, den []float64) []float64 {
	n := min(len(num), len(den))
	out := make([]float64, n)
	for i := range n {
		a, b := num[i], den[i]
		if math.IsNaN(a) || math.IsNaN(b) || math.IsInf(a, 0) || math.IsInf(b, 0) || b == 0 {
			out[i] = math.NaN()
			continue
		}
		out[i] = a / b
	}
	return out
}

// Histogram bounds: 100 ns to 100 s, three significant digits.
const (
	histMin = 1
	histMax = int64(100 * time.Second)
	histSig = 3
)

// NewHist returns an empty latency histogram in nanoseconds.
func NewHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(histMin, histMax, histSig)
}

// Record adds d to h, clamped to the histogram's range.
func Record(h *hdrhistogram.Histogram, d time.Duration) {
	v := int64(d)
	if v < histMin {
		v = histMin
	}
	if v > histMax {
		v = histMax
	}
	_ = h.RecordValue(v)
}

// Percentiles is the latency summary every workload reports, in
// microseconds.
type Percentiles struct {
	P50   float64 `json:"p50_us"`
	P90   float64 `json:"p90_us"`
	P99   float64 `json:"p99_us"`
	P999  float64 `json:"p999_us"`
	Max   float64 `json:"max_us"`
	Count int64   `json:"count"`
}

// PercentilesOf summarises h.
func PercentilesOf(h *hdrhistogram.Histogram) Percentiles {
	us := func(v int64) float64 { return float64(v) / 1e3 }
	return Percentiles{
		P50:   us(h.ValueAtQuantile(50)),
		P90:   us(h.ValueAtQuantile(90)),
		P99:   us(h.ValueAtQuantile(99)),
		P999:  us(h.ValueAtQuantile(99.9)),
		Max:   us(h.Max()),
		Count: h.TotalCount(),
	}
}

// latencyMetrics adds the percentiles of h to m, as p50_us and so on.
func latencyMetrics(m map[string]float64, h *hdrhistogram.Histogram) {
	p := PercentilesOf(h)
	m[MetricP50] = p.P50
	m[MetricP90] = p.P90
	m[MetricP99] = p.P99
	m[MetricP999] = p.P999
	m[MetricMax] = p.Max
}

// CDFPoint is one point of a latency distribution: the fraction of samples
// at or below LatencyUS.
type CDFPoint struct {
	LatencyUS float64 `json:"latency_us"`
	Fraction  float64 `json:"fraction"`
}

// CDFOf returns h's cumulative distribution: the fraction of samples at
// or below each recorded value, thinned to points at least 2% apart in
// latency (a point dropped gives its samples to the point before, so
// latencies are read to within 2%; the maximum is always kept).
func CDFOf(h *hdrhistogram.Histogram) []CDFPoint {
	total := h.TotalCount()
	if total == 0 {
		return nil
	}
	var out []CDFPoint
	var cum int64
	lastKept := -1.0
	for _, b := range h.Distribution() {
		if b.Count == 0 {
			continue
		}
		cum += b.Count
		p := CDFPoint{LatencyUS: float64(b.To) / 1e3, Fraction: float64(cum) / float64(total)}
		if p.LatencyUS >= lastKept*1.02 || cum == total {
			if n := len(out); n > 0 && out[n-1].LatencyUS == p.LatencyUS {
				out[n-1] = p
			} else {
				out = append(out, p)
			}
			lastKept = p.LatencyUS
		} else {
			out[len(out)-1].Fraction = p.Fraction // the kept point takes the mass
		}
		if cum == total {
			break
		}
	}
	return out
}
