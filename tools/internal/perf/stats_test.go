package perf

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSpreadOf(t *testing.T) {
	s := SpreadOf([]float64{3, 1, 2})
	assert.Equal(t, Spread{Median: 2, Min: 1, Max: 3, N: 3}, s)

	s = SpreadOf([]float64{4, 1, 2, 3})
	assert.Equal(t, Spread{Median: 2.5, Min: 1, Max: 4, N: 4}, s)

	s = SpreadOf([]float64{math.NaN(), 5, math.NaN()})
	assert.Equal(t, Spread{Median: 5, Min: 5, Max: 5, N: 1}, s, "NaNs (failed repeats) are left out")

	s = SpreadOf(nil)
	assert.Equal(t, 0, s.N)
	assert.True(t, math.IsNaN(s.Median) && math.IsNaN(s.Min) && math.IsNaN(s.Max))
}

func TestRatiosPairByRepeat(t *testing.T) {
	r := Ratios([]float64{2, 9, 6, 1}, []float64{1, 3, 0, math.NaN()})
	require.Len(t, r, 4)
	assert.Equal(t, 2.0, r[0])
	assert.Equal(t, 3.0, r[1])
	assert.True(t, math.IsNaN(r[2]), "zero denominator")
	assert.True(t, math.IsNaN(r[3]), "missing baseline")
	// The spread of ratios is not the ratio of spreads: pairing matters.
	assert.Equal(t, Spread{Median: 2.5, Min: 2, Max: 3, N: 2}, SpreadOf(r))
	assert.Len(t, Ratios([]float64{1, 2, 3}, []float64{1}), 1)
}

func TestPercentilesAndCDF(t *testing.T) {
	h := NewHist()
	for i := 1; i <= 1000; i++ {
		Record(h, time.Duration(i)*time.Microsecond)
	}
	Record(h, -5) // clamped, not lost
	Record(h, 1000*time.Second)
	p := PercentilesOf(h)
	assert.EqualValues(t, 1002, p.Count)
	assert.InDelta(t, 500, p.P50, 5)
	assert.InDelta(t, 900, p.P90, 5)
	assert.InDelta(t, 990, p.P99, 5)
	assert.InDelta(t, 999, p.P999, 5)
	assert.InDelta(t, 100e6, p.Max, 100e6*0.001, "max clamped to the histogram's 100 s")
	assert.True(t, p.P50 <= p.P90 && p.P90 <= p.P99 && p.P99 <= p.P999 && p.P999 <= p.Max)

	cdf := CDFOf(h)
	require.NotEmpty(t, cdf)
	assert.Less(t, len(cdf), 400, "thinned")
	for i := 1; i < len(cdf); i++ {
		assert.Greater(t, cdf[i].LatencyUS, cdf[i-1].LatencyUS)
		assert.GreaterOrEqual(t, cdf[i].Fraction, cdf[i-1].Fraction)
	}
	assert.Equal(t, 1.0, cdf[len(cdf)-1].Fraction)
	assert.Nil(t, CDFOf(NewHist()))
}

func TestFormat(t *testing.T) {
	assert.Equal(t, "1B", FormatSize(1))
	assert.Equal(t, "64KiB", FormatSize(64<<10))
	assert.Equal(t, "4MiB", FormatSize(4<<20))
	assert.Equal(t, "1536B", FormatSize(1536))
	assert.Equal(t, "0.85x (0.80-0.90)", FormatRatio(Spread{Median: 0.85, Min: 0.8, Max: 0.9, N: 3}))
	assert.Equal(t, "1.50x", FormatRatio(Spread{Median: 1.5, Min: 1.5, Max: 1.5, N: 1}))
	assert.Equal(t, "-", FormatRatio(SpreadOf(nil)))
	assert.Equal(t, "-", FormatNum(math.NaN()))
	assert.Equal(t, "12.3", FormatNum(12.34))
	assert.Equal(t, "8060", FormatNum(8060.4))
}
