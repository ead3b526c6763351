package fio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
)

// Output is the part of fio's JSON output (fio 3.x, --output-format=json)
// the compare tool reads.
type Output struct {
	Version string      `json:"fio version"`
	Jobs    []JobResult `json:"jobs"`
}

// JobResult is one entry of "jobs" (one job, or one group with
// group_reporting).
type JobResult struct {
	Name       string  `json:"jobname"`
	Error      int     `json:"error"`
	Read       DirStat `json:"read"`
	Write      DirStat `json:"write"`
	Trim       DirStat `json:"trim"`
	JobRuntime int64   `json:"job_runtime"` // ms
	UsrCPU     float64 `json:"usr_cpu"`     // percent of JobRuntime
	SysCPU     float64 `json:"sys_cpu"`
}

// DirStat is one direction (read, write, trim) of a job.
type DirStat struct {
	IOBytes  uint64  `json:"io_bytes"`
	BWBytes  float64 `json:"bw_bytes"` // bytes per second
	IOPS     float64 `json:"iops"`
	Runtime  int64   `json:"runtime"` // ms
	TotalIOs uint64  `json:"total_ios"`
	ClatNs   LatStat `json:"clat_ns"`
	LatNs    LatStat `json:"lat_ns"`
}

// LatStat is a latency distribution in nanoseconds.
type LatStat struct {
	Min        float64            `json:"min"`
	Max        float64            `json:"max"`
	Mean       float64            `json:"mean"`
	N          uint64             `json:"N"`
	Percentile map[string]float64 `json:"percentile"`
}

// ErrNoJSON: fio's output holds no JSON object.
var ErrNoJSON = errors.New("fio: no JSON in output")

// Parse reads fio's JSON output. Text before the first line that starts
// with '{' (warnings fio printed to the same stream) is skipped.
func Parse(out []byte) (*Output, error) {
	start := -1
	if len(out) > 0 && out[0] == '{' {
		start = 0
	} else if i := bytes.Index(out, []byte("\n{")); i >= 0 {
		start = i + 1
	}
	if start < 0 {
		return nil, ErrNoJSON
	}
	var o Output
	dec := json.NewDecoder(bytes.NewReader(out[start:]))
	if err := dec.Decode(&o); err != nil {
		return nil, fmt.Errorf("fio: reading JSON output: %w", err)
	}
	if len(o.Jobs) == 0 {
		return nil, fmt.Errorf("fio: JSON output has no jobs")
	}
	return &o, nil
}

// Percentile returns the p-th percentile (p in 0..100) of the total
// latency (submission to completion) when fio reported it
// (lat_percentiles=1), else of the completion latency; NaN when neither
// has percentiles.
func (d DirStat) Percentile(p float64) float64 {
	for _, ls := range []LatStat{d.LatNs, d.ClatNs} {
		if v, ok := ls.percentile(p); ok {
			return v
		}
	}
	return math.NaN()
}

func (l LatStat) percentile(p float64) (float64, bool) {
	if len(l.Percentile) == 0 || l.N == 0 {
		return 0, false
	}
	keys := make([]string, 0, len(l.Percentile))
	for k := range l.Percentile {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	best, bestDist := 0.0, math.Inf(1)
	for _, k := range keys {
		q, err := strconv.ParseFloat(k, 64)
		if err != nil {
			continue
		}
		if d := math.Abs(q - p); d < bestDist {
			best, bestDist = l.Percentile[k], d
		}
	}
	return best, bestDist < 0.5
}

// Summary is one run in a few figures: every job and direction added up.
type Summary struct {
	Bytes      uint64  // bytes moved (after ramp)
	IOs        uint64  // I/Os completed (after ramp)
	BWBytes    float64 // bytes per second, summed over jobs and directions
	IOPS       float64
	P50Ns      float64 // latency percentiles of the dominant direction (most I/Os)
	P99Ns      float64
	MeanLatNs  float64
	Dominant   string  // "read", "write" or "trim"
	CPUSeconds float64 // fio's own user+system CPU
	RuntimeMs  int64   // the longest job's runtime
	Errors     int     // jobs that reported an error
}

// Summary adds up the output's jobs.
func (o *Output) Summary() Summary {
	var s Summary
	var domIOs uint64
	for _, j := range o.Jobs {
		if j.Error != 0 {
			s.Errors++
		}
		for _, d := range []struct {
			name string
			st   DirStat
		}{{"read", j.Read}, {"write", j.Write}, {"trim", j.Trim}} {
			s.Bytes += d.st.IOBytes
			s.IOs += d.st.TotalIOs
			s.BWBytes += d.st.BWBytes
			s.IOPS += d.st.IOPS
			if d.st.TotalIOs > domIOs {
				domIOs = d.st.TotalIOs
				s.Dominant = d.name
				s.P50Ns = d.st.Percentile(50)
				s.P99Ns = d.st.Percentile(99)
				s.MeanLatNs = d.st.LatNs.Mean
				if s.MeanLatNs == 0 {
					s.MeanLatNs = d.st.ClatNs.Mean
				}
			}
		}
		s.CPUSeconds += (j.UsrCPU + j.SysCPU) / 100 * float64(j.JobRuntime) / 1000
		s.RuntimeMs = max(s.RuntimeMs, j.JobRuntime)
	}
	if domIOs == 0 {
		s.P50Ns, s.P99Ns = math.NaN(), math.NaN()
	}
	return s
}
