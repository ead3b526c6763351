package main

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
)

// jfloat is a float64 that is null in JSON when it is NaN (not known).
type jfloat float64

func (f jfloat) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', 6, 64), nil
}

func (f *jfloat) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*f = jfloat(math.NaN())
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = jfloat(v)
	return nil
}

// stat sums up one metric of one workload on one target over the rounds:
// its spread (in JSON its fields stand beside Ratio's), and the ratios.
type stat struct {
	spread
	// Ratio is this target's median over the baseline's (pass-through);
	// null for the baseline itself or when either is unknown.
	Ratio jfloat `json:"ratio_vs_baseline"`
	// RoundRatio sums up, over the rounds that have both, the ratio of
	// this target's figure to the baseline's in the same round: a round
	// runs every target back to back, so the machine's drift from round
	// to round cancels out of it. Nil for the baseline itself.
	RoundRatio *spread `json:"round_ratio_vs_baseline,omitempty"`
}

// spread is the median, min and max of n figures (NaN when n is 0).
type spread struct {
	Median jfloat `json:"median"`
	Min    jfloat `json:"min"`
	Max    jfloat `json:"max"`
	N      int    `json:"n"` // rounds that had the figure
}

// median of xs (NaNs dropped); NaN when none are left.
func median(xs []float64) float64 {
	v := finite(xs)
	if len(v) == 0 {
		return math.NaN()
	}
	slices.Sort(v)
	m := len(v) / 2
	if len(v)%2 == 1 {
		return v[m]
	}
	return (v[m-1] + v[m]) / 2
}

func finite(xs []float64) []float64 {
	v := make([]float64, 0, len(xs))
	for _, x := range xs {
		if !math.IsNaN(x) && !math.IsInf(x, 0) {
			v = append(v, x)
		}
	}
	return v
}

// summarize gives median, min, max and count of xs, NaN-free, and no
// ratio yet.
func summarize(xs []float64) stat {
	return stat{spread: spreadOf(xs), Ratio: jfloat(math.NaN())}
}

// spreadOf gives median, min, max and count of xs, NaN-free.
func spreadOf(xs []float64) spread {
	v := finite(xs)
	s := spread{Median: jfloat(math.NaN()), Min: jfloat(math.NaN()), Max: jfloat(math.NaN()), N: len(v)}
	if len(v) == 0 {
		return s
	}
	s.Median = jfloat(median(v))
	s.Min, s.Max = jfloat(slices.Min(v)), jfloat(slices.Max(v))
	return s
}

// ratio is a/b, NaN when either is unknown or b is 0.
func ratio(a, b float64) float64 {
	if math.IsNaN(a) || math.IsNaN(b) || b == 0 {
		return math.NaN()
	}
	return a / b
}

// cell is one workload on one target, over every round.
type cell struct {
	Workload string          `json:"workload"`
	Target   string          `json:"target"`
	Metrics  map[string]stat `json:"metrics"`
}

func (c *cell) get(key string) stat {
	if s, ok := c.Metrics[key]; ok {
		return s
	}
	return summarize(nil)
}

// aggregate turns runs into cells, workload-major in the given orders,
// with ratios against baseline. Pairs with no run are left out.
func aggregate(runs []runResult, workloads, targets []string, baseline string) []cell {
	var cells []cell
	index := map[[2]string]int{}
	byCell := map[[2]string][]*runResult{}
	for _, w := range workloads {
		for _, t := range targets {
			var rs []*runResult
			for i := range runs {
				if runs[i].Workload == w && runs[i].Target == t {
					rs = append(rs, &runs[i])
				}
			}
			if len(rs) == 0 {
				continue
			}
			byCell[[2]string{w, t}] = rs
			c := cell{Workload: w, Target: t, Metrics: map[string]stat{}}
			for _, m := range metrics {
				xs := make([]float64, len(rs))
				for i, r := range rs {
					xs[i] = m.get(r)
				}
				c.Metrics[m.Key] = summarize(xs)
			}
			index[[2]string{w, t}] = len(cells)
			cells = append(cells, c)
		}
	}
	for i := range cells {
		c := &cells[i]
		if c.Target == baseline {
			continue
		}
		bi, ok := index[[2]string{c.Workload, baseline}]
		if !ok {
			continue
		}
		base := byCell[[2]string{c.Workload, baseline}]
		for _, m := range metrics {
			s := c.Metrics[m.Key]
			s.Ratio = jfloat(ratio(float64(s.Median), float64(cells[bi].Metrics[m.Key].Median)))
			s.RoundRatio = roundRatios(m, byCell[[2]string{c.Workload, c.Target}], base)
			c.Metrics[m.Key] = s
		}
	}
	return cells
}

// roundRatios sums up m's ratio of each run of rs to the run of base in
// the same round.
func roundRatios(m metricDef, rs, base []*runResult) *spread {
	var xs []float64
	for _, r := range rs {
		for _, b := range base {
			if b.Round == r.Round {
				xs = append(xs, ratio(m.get(r), m.get(b)))
			}
		}
	}
	s := spreadOf(xs)
	return &s
}
