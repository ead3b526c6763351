package main

import (
	"fmt"
	"math"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
)

func TestMedian(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{nan, 7, 1}, 4},
		{[]float64{nan}, nan},
		{nil, nan},
	} {
		got := median(tc.in)
		if !(got == tc.want || math.IsNaN(got) && math.IsNaN(tc.want)) {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	s := summarize([]float64{10, math.NaN(), 30, 20})
	if s.Median != 20 || s.Min != 10 || s.Max != 30 || s.N != 3 || !math.IsNaN(float64(s.Ratio)) {
		t.Errorf("summarize = %+v", s)
	}
	s = summarize([]float64{math.NaN()})
	if s.N != 0 || !math.IsNaN(float64(s.Median)) || !math.IsNaN(float64(s.Min)) {
		t.Errorf("summarize(NaN) = %+v", s)
	}
}

func TestRatio(t *testing.T) {
	if ratio(3, 2) != 1.5 {
		t.Error("3/2")
	}
	for _, c := range [][2]float64{{1, 0}, {math.NaN(), 1}, {1, math.NaN()}} {
		if !math.IsNaN(ratio(c[0], c[1])) {
			t.Errorf("ratio(%v) not NaN", c)
		}
	}
}

// fakeRun makes a run with the figures the metrics read.
func fakeRun(w, tg string, round int, mbps float64, req, be *ioCount) runResult {
	cpu := 0.5
	return runResult{
		Workload: w, Target: tg, Round: round, WallSec: 2,
		MBps: mbps, IOPS: mbps, P50us: jfloat(100 * float64(round)), P99us: jfloat(math.NaN()),
		FioBytes: 2e9, FioCPUSec: 0.2,
		Req: req, Backend: be,
		Device:    &ioCount{Writes: 4000, WriteBytes: 4000 * 512 * 1024},
		ServerCPU: &cpu,
	}
}

func TestAggregate(t *testing.T) {
	mib := uint64(1 << 20)
	req := &ioCount{Writes: 2000, WriteBytes: 2000 * mib}
	be := &ioCount{Writes: 1000, WriteBytes: 2000 * mib}
	runs := []runResult{
		fakeRun("w", "vdiskfs", 1, 900, req, be),
		fakeRun("w", "passthrough", 1, 1000, req, req),
		fakeRun("w", "passthrough", 2, 1200, req, req),
		fakeRun("w", "vdiskfs", 2, 1100, req, be),
		fakeRun("w", "vdiskfs", 3, 1000, req, be),
		fakeRun("w", "passthrough", 3, 800, req, req),
		fakeRun("w", "raw", 1, 3000, nil, nil),
	}
	cells := aggregate(runs, []string{"w", "absent"}, []string{"vdiskfs", "passthrough", "raw", "qsd-qcow2"}, "passthrough")
	if len(cells) != 3 {
		t.Fatalf("%d cells, want 3 (pairs without runs left out)", len(cells))
	}
	v, p, r := &cells[0], &cells[1], &cells[2]
	if v.Target != "vdiskfs" || p.Target != "passthrough" || r.Target != "raw" {
		t.Fatalf("cell order %s %s %s", v.Target, p.Target, r.Target)
	}
	mb := v.get("mb_per_s")
	if mb.Median != 1000 || mb.Min != 900 || mb.Max != 1100 || mb.N != 3 {
		t.Errorf("vdiskfs MB/s %+v", mb)
	}
	if got := float64(mb.Ratio); got != 1 {
		t.Errorf("vdiskfs ratio %v, want 1000/1000", got)
	}
	if got := float64(r.get("mb_per_s").Ratio); got != 3 {
		t.Errorf("raw ratio %v, want 3", got)
	}
	if !math.IsNaN(float64(p.get("mb_per_s").Ratio)) || p.get("mb_per_s").RoundRatio != nil {
		t.Error("the baseline has a ratio to itself")
	}
	// Round by round: 900/1000, 1100/1200, 1000/800; raw has round 1 only.
	if rr := mb.RoundRatio; rr == nil || rr.N != 3 || math.Abs(float64(rr.Median)-1100.0/1200) > 1e-12 || rr.Min != 0.9 || rr.Max != 1.25 {
		t.Errorf("vdiskfs round ratios %+v, want median 0.917 (0.9–1.25) of 3", rr)
	}
	if rr := r.get("mb_per_s").RoundRatio; rr == nil || rr.N != 1 || rr.Median != 3 {
		t.Errorf("raw round ratios %+v, want 3 of 1", rr)
	}
	// Per-I/O sizes: 1 MiB requests, 2 MiB backend I/Os, 512 KiB device I/Os.
	if got := v.get("fuse_request_kib").Median; got != 1024 {
		t.Errorf("request KiB %v", got)
	}
	if got := v.get("backend_io_kib").Median; got != 2048 {
		t.Errorf("backend KiB %v", got)
	}
	if got := v.get("backend_io_per_s").Median; got != 500 {
		t.Errorf("backend I/O/s %v, want 1000 over 2 s", got)
	}
	if got := v.get("device_io_kib").Median; got != 512 {
		t.Errorf("device KiB %v", got)
	}
	// 0.5 s of CPU for 2000 MiB served.
	if got, want := float64(v.get("server_cpu_s_per_gb").Median), 0.5/(2000*float64(mib)/1e9); math.Abs(got-want) > 1e-12 {
		t.Errorf("server CPU/GB %v, want %v", got, want)
	}
	if got := float64(v.get("fio_cpu_s_per_gb").Median); math.Abs(got-0.1) > 1e-12 {
		t.Errorf("fio CPU/GB %v", got)
	}
	// raw has no server: requests and backend are n/a, the CPU per GB too
	// (no server CPU), the device columns are there.
	for _, k := range []string{"fuse_request_kib", "backend_io_kib", "backend_io_per_s"} {
		if s := r.get(k); s.N != 0 || !math.IsNaN(float64(s.Median)) {
			t.Errorf("raw %s = %+v, want n/a", k, s)
		}
	}
	if s := r.get("device_io_kib"); s.N != 1 {
		t.Errorf("raw device KiB %+v", s)
	}
	// A metric no round had (p99 NaN) is n/a, and so is its ratio.
	if s := v.get("p99_us"); s.N != 0 || !math.IsNaN(float64(s.Ratio)) {
		t.Errorf("p99 %+v", s)
	}
	if s := v.get("p50_us"); s.Median != 200 || s.Min != 100 || s.Max != 300 {
		t.Errorf("p50 %+v", s)
	}
}

// Without request counters, the server's bytes are fio's, scaled from
// fio's runtime to the whole window its CPU was measured over.
func TestServerCPUWithoutRequestCounters(t *testing.T) {
	cpu := 1.0
	r := runResult{ServerCPU: &cpu, Device: &ioCount{ReadBytes: 8e9}, FioBytes: 1.5e9, FioRuntime: 15, WallSec: 20}
	if got := metricByKey("server_cpu_s_per_gb").get(&r); got != 0.5 {
		t.Errorf("server CPU/GB %v, want 1 s / (1.5 GB × 20/15)", got)
	}
	r.ServerCPU = nil
	if got := metricByKey("server_cpu_s_per_gb").get(&r); !math.IsNaN(got) {
		t.Errorf("without CPU: %v", got)
	}
}

func TestOrderAlternates(t *testing.T) {
	ts := []target{&rawTarget{path: "a"}, &passthroughTarget{}}
	names := func(o []target) string {
		s := ""
		for _, t := range o {
			s += t.Name() + ","
		}
		return s
	}
	a, b := names(orderFor(ts, 1)), names(orderFor(ts, 2))
	if a != "raw,passthrough," || b != "passthrough,raw," {
		t.Errorf("orders %q, %q", a, b)
	}
	if names(orderFor(ts, 3)) != a {
		t.Error("round 3 differs from round 1")
	}
	// With three targets every target takes every position once in any
	// three consecutive rounds.
	ts = append(ts, &vhostTarget{name: "vhost"})
	for start := 0; start < 4; start++ {
		seen := map[string]bool{}
		for r := start; r < start+3; r++ {
			for pos, tg := range orderFor(ts, r) {
				seen[fmt.Sprint(pos, tg.Name())] = true
			}
		}
		if len(seen) != 9 {
			t.Errorf("rounds %d..%d: %d of 9 (position, target) pairs: %v", start, start+2, len(seen), seen)
		}
	}
}

func TestLatencyDelta(t *testing.T) {
	a := &image.HistogramSnapshot{Bounds: []float64{0.001, 0.01}, Counts: []uint64{10, 0, 0}, Count: 10, Sum: 0.005}
	b := &image.HistogramSnapshot{Bounds: []float64{0.001, 0.01}, Counts: []uint64{10, 99, 1}, Count: 110, Sum: 0.505}
	l := latencyDelta(a, b)
	if l == nil || l.N != 100 || math.Abs(float64(l.MeanUs)-5000) > 1e-6 || l.P99Us != 10000 {
		t.Errorf("delta %+v", l)
	}
	if latencyDelta(b, b) != nil || latencyDelta(nil, b) != nil {
		t.Error("an empty or unknown delta is not nil")
	}
}
