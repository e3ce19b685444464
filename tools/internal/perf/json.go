package perf

import (
	"encoding/json"
	"math"
)

// JSON cannot carry NaN, which stands for "not measured" here (a failed
// repeat, a spread of nothing): such values are written as null and read
// back as NaN.

// Floats is a list of values that may hold NaN.
type Floats []float64

func fptr(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func fval(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// MarshalJSON writes NaN as null.
func (fs Floats) MarshalJSON() ([]byte, error) {
	ps := make([]*float64, len(fs))
	for i, v := range fs {
		ps[i] = fptr(v)
	}
	return json.Marshal(ps)
}

// UnmarshalJSON reads null as NaN.
func (fs *Floats) UnmarshalJSON(b []byte) error {
	var ps []*float64
	if err := json.Unmarshal(b, &ps); err != nil {
		return err
	}
	*fs = make(Floats, len(ps))
	for i, p := range ps {
		(*fs)[i] = fval(p)
	}
	return nil
}

type spreadJSON struct {
	Median *float64 `json:"median"`
	Min    *float64 `json:"min"`
	Max    *float64 `json:"max"`
	N      int      `json:"n"`
}

// MarshalJSON writes NaN as null.
func (s Spread) MarshalJSON() ([]byte, error) {
	return json.Marshal(spreadJSON{fptr(s.Median), fptr(s.Min), fptr(s.Max), s.N})
}

// UnmarshalJSON reads null as NaN.
func (s *Spread) UnmarshalJSON(b []byte) error {
	var j spreadJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = Spread{Median: fval(j.Median), Min: fval(j.Min), Max: fval(j.Max), N: j.N}
	return nil
}
